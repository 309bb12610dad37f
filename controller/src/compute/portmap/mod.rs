//! The port-map capability: PortMaps published on accepting nodes and delivered to one pod,
//! over kuport's VXLAN links when the pod is elsewhere.
//!
//! The stages follow the questions a mapping raises, in order (docs/portmap/modes.md):
//!
//! 1. [`admission`]: may it publish these ports here? (Accepted)
//! 2. [`placement`]: which pod, and which nodes program it? (Programmed)
//! 3. [`links`]: which node pairs need a link, and their slots and numbers.
//! 4. [`datapath`]: the nftables elements, links, routes and rules of every node.
//!
//! [`status`] names every condition and reason they give.

pub mod admission;
pub mod datapath;
#[cfg(test)]
mod golden;
pub mod links;
mod patch;
pub mod placement;
pub mod status;
pub mod steer;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kuport_proto::v1::NetnsState;

use admission::Admitted;
pub use admission::MapKey;
use datapath::LinkEnd;
use links::{ClassVxlans, LinkKey, LinkNumbers, VXLAN_OVERHEAD};
use placement::{Endpoint, Placement};
use status::{Refusal, reason};

use super::conditions::condition;
use super::{ObjectKey, Outputs, Shared, Tracked};
use crate::api::{
    ClassNodeStatus, EndpointStatus, InterfaceAddress, PortMap, PortMapClass, PortMapClassStatus, PortMapStatus,
    Protocol, PublishedAddress, ReturnPathMode,
};
use crate::observe::Cluster;
use crate::observe::index::{KnownNode, RouteTo, View};

/// Judges, places and builds every mapping: fills `out`'s PortMap and class statuses, the
/// programming nodes and what each programmed mapping waits for, and returns every node's
/// host namespace. Link slots are drawn from the node-scoped allocator ([`links::allocate`]). What `since`'s compute built is taken
/// where it would be built the same, if it saw the same nodes ([`Built::saw`]); its
/// placements where nothing they read changed ([`Since`]); and the whole of it, with the few
/// mappings a change reaches made again, where nothing else changed ([`patch`]).
pub fn compute<'a>(view: &View<'a>, cluster: &'a Cluster, out: &mut Outputs, since: Option<Since>) -> Built {
    let now = cluster.now;
    // Rendering reads a node's addresses, a link end its node's underlay and MTU.
    let since = since.filter(|s| s.built.saw_same(&view.nodes));
    let vxlan: ClassVxlans = view.classes.iter().map(|(n, c)| (n.clone(), links::class_vxlan(c, view))).collect();
    if let Some(built) = since.as_ref().and_then(|s| patch::patch(view, cluster, s, &vxlan, out)) {
        return built;
    }
    let last = since.as_ref().map(|s| s.built);
    let mut placed_anew = 0;

    // 1 and 2: judge and place every mapping, oldest first.
    let mut verdicts: Vec<(MapKey, Result<Placement, Refusal>)> = Vec::new();
    // Each mapping's placement, and what the compute before linked of it if it kept it.
    let mut judged_and_linked = Vec::new();
    // Programmed mappings by pod address and protocol, for the one-way-return check.
    let mut by_pod: HashMap<PodPort, Vec<usize>> = HashMap::new();
    // Admission reads every mapping older than one: taken whole while none of its reads changed.
    let readmitted = since.as_ref().filter(|s| !s.admission).and_then(|s| {
        let verdicts = admission::readmit(view, &cluster.port_maps, &s.built.admitted)?;
        Some((verdicts, s.built.admitted.clone()))
    });
    let readmitted_now = readmitted.is_some();
    // Else judged from the first mapping in age order a changed PortMap reaches.
    let readmitted = readmitted.or_else(|| {
        let s = since.as_ref()?;
        let r = admission::readmit_changed(view, &cluster.port_maps, &s.built.admitted, s.judged.as_ref()?)?;
        Some((r.verdicts, Arc::new(r.owned)))
    });
    let (admitted, admitted_now) = readmitted.unwrap_or_else(|| {
        let (verdicts, owned) = admission::admit(view, &cluster.port_maps);
        (verdicts, Arc::new(owned))
    });
    let mut port_maps = Vec::with_capacity(admitted.len());
    let mut every_pod = imbl::OrdSet::new();
    // How many placements answer from each pod port, cleared or not, for the next compute.
    let mut pod_ports: Shared<PodPort, u32> = Shared::new();
    for (key, pm, admitted) in admitted {
        port_maps.push(pm);
        let (mut judged, mut linked) = (None, None);
        let placed = admitted.and_then(|a| {
            let kept = since.as_ref().and_then(|s| s.kept(&key));
            placed_anew += usize::from(kept.is_none());
            linked = kept.as_ref().and(last).and_then(|l| l.kept.get(&key)?.linked.clone());
            let (placed, kept) = place(view, a, kept);
            if kept.reads_every_pod {
                every_pod.insert(key.clone());
            }
            judged = Some(kept);
            placed
        });
        if let Ok(p) = &placed {
            *pod_ports.entry(pod_port(p)).or_default() += 1;
        }
        let placed = placed.and_then(|p| {
            let older = by_pod.get(&pod_port(&p)).into_iter().flatten().filter_map(|i| match &verdicts[*i] {
                (k, Ok(q)) => Some((k, q)),
                _ => None,
            });
            cleared(p, older)
        });
        if let Ok(p) = &placed {
            by_pod.entry(pod_port(p)).or_default().push(verdicts.len());
        }
        verdicts.push((key, placed));
        judged_and_linked.push((judged, linked));
    }

    // 3: links for every programming node that lacks the pod.
    let mut needed = Vec::new();
    for ((_, v), (_, linked)) in verdicts.iter().zip(&judged_and_linked) {
        // A kept placement may be refused now (an older mapping took its pod port's return).
        let Ok(p) = v else { continue };
        match linked {
            Some(l) => needed.extend(l.links.iter().map(|(k, _)| k.clone())),
            None => needed.extend(needs(view, &vxlan, p)),
        }
    }
    // Counted, sorted and built at once: most links serve many mappings.
    needed.sort_unstable();
    let mut counted: Vec<(LinkKey, u32)> = Vec::new();
    for key in needed {
        match counted.last_mut().filter(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => counted.push((key, 1)),
        }
    }
    let wanted: BTreeSet<LinkKey> = counted.iter().map(|(k, _)| k.clone()).collect();
    let users: Shared<LinkKey, u32> = counted.into_iter().collect();
    let alloc = Arc::new(links::allocate(&|n| view.node(n).exists, &view.classes, &vxlan, &wanted, now));

    // 4: build the nodes, refusing mappings whose links cannot be built.
    let mut ends_made = HashMap::new();
    let mut digests: Shared<String, Digest> = seeded(view).map(|n| (n.clone(), Digest::default())).collect();
    let mut built = Vec::with_capacity(verdicts.len());
    for (((key, verdict), (judged, before)), pm) in verdicts.into_iter().zip(judged_and_linked).zip(&port_maps) {
        let cleared = verdict.is_ok();
        let verdict = verdict.and_then(|p| link(view, &vxlan, &alloc, p, before, last, &mut ends_made));
        if let Ok((p, l, route)) = &verdict {
            let take = contribution(pm, l.fingerprint, route);
            for node in p.nodes_built() {
                match digests.get_mut(node) {
                    Some(d) => d.add(take),
                    None => digests.entry(node.clone()).or_default().add(take),
                }
            }
        }
        built.push((key, judged, cleared, verdict));
    }

    // Only the nodes whose mappings give them something else than before are rendered again.
    let kept = |n: &String| {
        let l = last.filter(|l| l.digests.get(n) == digests.get(n))?;
        Some((l.hosts.get(n)?, l.parts.get(n)?))
    };
    let again: BTreeSet<String> = digests.keys().filter(|n| kept(n).is_none()).cloned().collect();
    let mut builder = datapath::Builder::only(again.iter().cloned());
    for (_, _, _, verdict) in &built {
        if let Ok((p, l, route)) = verdict
            && p.nodes_built().any(|n| again.contains(n))
        {
            builder.add(p, &l.ends, device(route));
        }
    }
    let rendered = again.len();
    let (mut hosts, mut parts) = (BTreeMap::new(), BTreeMap::new());
    for (n, (ns, p)) in builder.finish(view) {
        hosts.insert(n.clone(), Arc::new(ns));
        parts.insert(n, p);
    }
    for n in digests.keys() {
        if let Some((h, p)) = kept(n) {
            hosts.insert(n.clone(), h.clone());
            parts.insert(n.clone(), p.clone());
        }
    }

    let (mut kept_now, mut statuses_anew) = (imbl::HashMap::new(), 0);
    // Gathered in age order, each map then filled at once.
    let (mut programming, mut tracked, mut statuses) = (Vec::new(), Vec::new(), Vec::with_capacity(built.len()));
    for ((key, judged, cleared, verdict), pm) in built.into_iter().zip(port_maps) {
        let s = stated(view, pm, &key, (judged, cleared), verdict, last, now);
        statuses_anew += usize::from(s.made);
        if let Some((nodes, t)) = s.programmed {
            programming.push((key.clone(), nodes));
            tracked.push((ObjectKey::port_map(&key.0, &key.1), t));
        }
        statuses.push((key.clone(), s.status));
        kept_now.insert(key, s.kept);
    }
    out.programming.extend(programming);
    out.tracked.extend(tracked);
    out.port_maps.extend(statuses);
    for (name, class) in &view.classes {
        let rows = alloc.rows.get(name).map(|r| r.to_vec()).unwrap_or_default();
        Arc::make_mut(&mut out.classes)
            .insert(name.clone(), class_status(view, class, &vxlan[name], &alloc, rows, now));
    }
    Built {
        admitted: admitted_now,
        readmitted: readmitted_now,
        patched: false,
        hosts,
        parts,
        digests,
        ends: Arc::new(ends_made),
        kept: kept_now,
        made: Made::of(out),
        across: Across { alloc, users, pod_ports, every_pod },
        placed: placed_anew,
        statuses_made: statuses_anew,
        rendered,
        nodes: Arc::default(),
    }
}

/// A pod's address and protocol: replies from one pod port return one way only.
type PodPort = (Ipv4Addr, Protocol);

fn pod_port(p: &Placement) -> PodPort {
    (p.endpoint.address, p.admitted.protocol)
}

/// The placement, unless an older one answers from the same pod port through another node:
/// replies from one pod port can return one way only, by one serving node's link or (Multi)
/// by whichever link each request came in on.
fn cleared<'a, 'o>(
    p: Placement<'a>,
    older: impl IntoIterator<Item = (&'o MapKey, &'o Placement<'o>)>,
) -> Result<Placement<'a>, Refusal> {
    let clash = older
        .into_iter()
        .find(|(_, q)| placement::same_pod_port(&p, q) && p.return_route() != q.return_route())
        .map(|(k, _)| k);
    match clash {
        None => Ok(p),
        Some((ns, name)) => Err(Refusal::programmed(
            reason::RETURN_PATH_UNAVAILABLE,
            format!(
                "pod {} port {} already answers the older PortMap {ns}/{name} through another node",
                p.endpoint.pod, p.endpoint.port
            ),
        )),
    }
}

/// The links a cleared placement needs: one from each programming node that lacks the pod,
/// but where an end's node uses the class's VXLAN port for its CNI.
fn needs<'p>(view: &'p View, vxlan: &'p ClassVxlans, p: &'p Placement) -> impl Iterator<Item = LinkKey> + 'p {
    needs_of(view, vxlan, &p.admitted.class_name, &p.endpoint, &p.nodes)
}

/// [`needs`] of a placement's parts.
fn needs_of<'p>(
    view: &'p View,
    vxlan: &'p ClassVxlans,
    class: &'p str,
    endpoint: &'p Endpoint,
    nodes: &'p BTreeMap<String, Vec<String>>,
) -> impl Iterator<Item = LinkKey> + 'p {
    nodes
        .keys()
        .filter(move |n| **n != endpoint.node)
        .map(move |node| LinkKey::new(class, node, &endpoint.node))
        .filter(|key| vxlan_port_clash(view, vxlan, key).is_none())
}

/// The nodes a compute gives a host namespace whatever the mappings: every node, and every
/// node a class names.
fn seeded<'v>(view: &'v View) -> impl Iterator<Item = &'v String> {
    view.nodes.keys().chain(view.classes.values().flat_map(|c| c.spec.nodes.keys()))
}

/// A cleared placement's links (taken from `before` where it has the numbers `alloc` gives),
/// and the route to its pod on the pod's node; or why its links cannot be built.
fn link<'a>(
    view: &View,
    vxlan: &ClassVxlans,
    alloc: &links::Allocation,
    p: Placement<'a>,
    before: Option<Arc<Linked>>,
    last: Option<&Built>,
    ends_made: &mut EndsMade,
) -> Result<(Placement<'a>, Arc<Linked>, RouteTo), Refusal> {
    let same_numbers =
        |l: &Arc<Linked>| l.links.iter().all(|(k, n)| matches!(alloc.needed.get(k), Some(Ok(now)) if now == n));
    let l = match before.filter(same_numbers) {
        Some(l) => l,
        None => {
            let (ends, links) = link_ends(view, vxlan, alloc, &p, last, ends_made)?;
            let fingerprint = datapath::Builder::fingerprint(&p, &ends);
            let over_v6 = datapath::Builder::over_v6(&p, &ends);
            Arc::new(Linked { links, ends: Arc::new(ends), fingerprint, over_v6 })
        }
    };
    let route = view.node(&p.endpoint.node).route_to(p.endpoint.address);
    Ok((p, l, route))
}

/// The pod node's claim device for a route to the pod.
fn device(route: &RouteTo) -> Option<&str> {
    match route {
        RouteTo::Device(d) => Some(d),
        RouteTo::Local | RouteTo::Unknown => None,
    }
}

/// One mapping's status and outputs, and what the next compute keeps of it.
struct Stated {
    status: PortMapStatus,
    /// Whether the status was made, not taken from the compute before.
    made: bool,
    /// Its programming nodes and what it waits for, if programmed.
    programmed: Option<(Vec<String>, Tracked)>,
    kept: Kept,
}

/// The status of a mapping from its verdict, taken from `last` where it was made from the same
/// and written back as made.
fn stated(
    view: &View,
    pm: &PortMap,
    key: &MapKey,
    (judged, cleared): (Option<Arc<Judged>>, bool),
    verdict: Result<(Placement, Arc<Linked>, RouteTo), Refusal>,
    last: Option<&Built>,
    now: Timestamp,
) -> Stated {
    let linked = verdict.as_ref().ok().map(|(_, l, _)| l.clone());
    let added = verdict.as_ref().ok().map(|(_, l, route)| contribution(pm, l.fingerprint, route));
    let verdict = verdict.and_then(|(p, l, route)| {
        // Built without the pod node's request claim, which needs the route: the rest keeps
        // carrying traffic. A node that reported routes, none for the pod, is named in the
        // status; one that has not reported yet is waited for like any node that must apply
        // the mapping (Pending), and its report brings the claim.
        if route == RouteTo::Unknown && view.node(&p.endpoint.node).routes.is_some() {
            return Err(pod_route_unknown(&p));
        }
        Ok((p, l))
    });
    let from = match &verdict {
        Ok((_, l)) => judged.clone().map(|j| StatedFrom::Built(j, l.clone())),
        Err(r) => Some(StatedFrom::Refused(r.clone())),
    };
    let mut over_v6 = BTreeSet::new();
    let mut programmed = None;
    let verdict = verdict.map(|(p, l)| {
        let tracked = Tracked { nodes: must_ack(&p), fingerprint: l.fingerprint };
        programmed = Some((p.nodes.keys().cloned().collect(), tracked));
        over_v6 = l.over_v6.clone();
        p
    });
    let was = last.and_then(|l| Some((l.kept.get(key)?, l.made.statuses.get(key)?)));
    let kept_status = was.filter(|(k, status)| {
        k.status_from.as_ref().zip(from.as_ref()).is_some_and(|(a, b)| a.same(b))
            && pm.metadata.generation == status.observed_generation
            && pm.status.as_ref() == Some(*status)
    });
    let (status, made) = match kept_status {
        Some((_, status)) => (status.clone(), false),
        None => (port_map_status(view, pm, &verdict, &over_v6, now), true),
    };
    Stated { status, made, programmed, kept: Kept { judged, linked, status_from: from, cleared, added } }
}

/// The compute before, and what changed since as the port maps read it.
pub struct Since<'a> {
    pub built: &'a Built,
    /// The namespaces whose PortMaps, Services, EndpointSlices or Pods (as port maps read
    /// them) changed; None when that is not known (every mapping is placed again).
    pub namespaces: Option<BTreeSet<String>>,
    /// Some Pod changed as port maps read it: the addresses an external endpoint may not hold.
    pub pods: bool,
    /// Some PortMapClass's spec changed, or a class came or went: every mapping's admission
    /// reads its class. (The link rows in their statuses are read through the nodes.)
    pub classes: bool,
    /// Something admission reads changed: a PortMap's spec or age, a PortMap that came or went,
    /// a class's spec, a Namespace.
    pub admission: bool,
    /// The PortMaps whose spec or age changed, or that came or went, where admission read no
    /// other change; None where it did, or a change has no name.
    pub judged: Option<BTreeSet<MapKey>>,
    /// The namespaces of the PortMaps that changed in any way, their statuses too; None as for
    /// `namespaces`.
    pub restated: Option<BTreeSet<String>>,
    /// The compute before holds by the clock: no unused link is due for release.
    pub clock_holds: bool,
}

impl Since<'_> {
    /// The placement of `key` the compute before made, where nothing it read changed: the
    /// mapping (its PortMap, hence its admission with the same class and nodes), its
    /// namespace's Services, EndpointSlices and Pods, and for one that read them every Pod's
    /// addresses.
    fn kept(&self, key: &MapKey) -> Option<Arc<Judged>> {
        if self.classes || self.namespaces.as_ref()?.contains(&key.0) {
            return None;
        }
        self.built.kept.get(key)?.judged.clone().filter(|j| !(j.reads_every_pod && self.pods))
    }
}

/// One mapping's placement, owned, for the next compute ([`Since::kept`]).
#[derive(Debug)]
struct Judged {
    placed: Result<(Endpoint, BTreeMap<String, Vec<String>>), Refusal>,
    /// It read beyond its namespace: whether a Pod anywhere holds an endpoint's address (an
    /// external endpoint is one that none holds, and a refusal names which one does).
    reads_every_pod: bool,
}

/// Each programming node that lacks the pod: its end and the pod node's end of their link.
type Ends = BTreeMap<String, (LinkEnd, LinkEnd)>;

/// Every link end made, by link and end (true: the pair's first node), with the numbers it was
/// made with; None where the node's underlay is unknown.
type EndsMade = HashMap<(LinkKey, bool), (LinkNumbers, Option<LinkEnd>)>;

/// A placed mapping's links and what they give it: the same while its placement, the nodes and
/// its links' numbers are.
#[derive(Debug)]
struct Linked {
    /// The links it needs, with the numbers its ends were made with.
    links: Vec<(LinkKey, LinkNumbers)>,
    ends: Arc<Ends>,
    /// [`datapath::Builder::fingerprint`].
    fingerprint: u64,
    /// [`datapath::Builder::over_v6`].
    over_v6: BTreeSet<String>,
}

/// One mapping's parts, for the next compute.
#[derive(Clone)]
struct Kept {
    /// Its placement, if it was admitted.
    judged: Option<Arc<Judged>>,
    /// Its links, if it was built (rendered).
    linked: Option<Arc<Linked>>,
    status_from: Option<StatedFrom>,
    /// Its placement passed the one-way-return check: the links it needs were counted.
    cleared: bool,
    /// What it added to its nodes' digests, if it was built ([`contribution`]).
    added: Option<u64>,
}

/// What a PortMap's status was made from. Made from the same, and written back as it was
/// made, it is made the same: its conditions keep their times, and what else it says comes
/// from the placement, the links and the nodes (the same while the placement is kept).
#[derive(Clone)]
enum StatedFrom {
    Built(Arc<Judged>, Arc<Linked>),
    Refused(Refusal),
}

impl StatedFrom {
    fn same(&self, other: &StatedFrom) -> bool {
        match (self, other) {
            (StatedFrom::Built(j, l), StatedFrom::Built(k, m)) => Arc::ptr_eq(j, k) && Arc::ptr_eq(l, m),
            (StatedFrom::Refused(a), StatedFrom::Refused(b)) => a == b,
            _ => false,
        }
    }
}

/// Places an admitted mapping, or takes the placement `kept`; either way, what to keep of it.
fn place<'a>(
    view: &View<'a>,
    admitted: Admitted<'a>,
    kept: Option<Arc<Judged>>,
) -> (Result<Placement<'a>, Refusal>, Arc<Judged>) {
    if let Some(j) = kept {
        let placed = match &j.placed {
            Ok((endpoint, nodes)) => Ok(Placement { admitted, endpoint: endpoint.clone(), nodes: nodes.clone() }),
            Err(r) => Err(r.clone()),
        };
        return (placed, j);
    }
    let reads_every_pod = !admitted.class.spec.external_endpoints.is_empty();
    let placed = placement::place(view, admitted);
    let judged = Judged {
        placed: match &placed {
            Ok(p) => Ok((p.endpoint.clone(), p.nodes.clone())),
            Err(r) => Err(r.clone()),
        },
        reads_every_pod: reads_every_pod || placed.is_err(),
    };
    (placed, Arc::new(judged))
}

/// What a compute of the port maps built, for the next (`last` of [`compute`]), which takes
/// from it only if it sees every node the same (docs/design.md, "Compute by change").
#[derive(Default)]
pub struct Built {
    /// Every mapping's verdict, for the next compute while nothing admission reads changes.
    admitted: Arc<admission::Verdicts>,
    /// Whether this compute took its verdicts from the one before.
    pub readmitted: bool,
    /// Whether this compute took the whole of the one before, with the mappings a change
    /// reached made again ([`patch`]).
    pub patched: bool,
    /// Every node's host namespace as the port maps need it (empty for a node without any).
    pub hosts: BTreeMap<String, Arc<NetnsState>>,
    /// What each host namespace was rendered from: a patch edits a node's by the mappings it
    /// reached.
    parts: BTreeMap<String, Arc<datapath::NodeParts>>,
    /// Each node's digest of what every mapping gave it: the same digest, the same namespace.
    digests: Shared<String, Digest>,
    /// Every link end made, by link and end: the node's view and the link's numbers make it.
    ends: Arc<EndsMade>,
    /// What each mapping was placed, linked and given its status from, for the next compute.
    kept: imbl::HashMap<MapKey, Kept>,
    made: Made,
    across: Across,
    /// How many admitted mappings this compute placed; it took the others' from `since`.
    pub placed: usize,
    /// How many PortMap statuses this compute made; it took the others' from `since`.
    pub statuses_made: usize,
    /// How many host namespaces this compute rendered; it took the others from `last`.
    pub rendered: usize,
    /// The nodes as the compute saw them (`view.nodes`): the next takes what this one built
    /// only if it sees them the same.
    nodes: Arc<BTreeMap<String, KnownNode>>,
}

impl Built {
    /// Keeps the nodes the compute saw, shared with its view.
    pub fn saw(&mut self, nodes: Arc<BTreeMap<String, KnownNode>>) {
        self.nodes = nodes;
    }

    /// Whether the compute saw `nodes` as they are.
    pub fn saw_same(&self, nodes: &Arc<BTreeMap<String, KnownNode>>) -> bool {
        Arc::ptr_eq(&self.nodes, nodes) || self.nodes == *nodes
    }

    /// The nodes the compute saw.
    pub fn nodes(&self) -> Arc<BTreeMap<String, KnownNode>> {
        self.nodes.clone()
    }
}

/// The port maps' outputs as a compute made them (`out`'s): the next takes them whole, or
/// with the entries of the mappings a change reached replaced ([`patch`]).
#[derive(Default)]
struct Made {
    statuses: Shared<MapKey, PortMapStatus>,
    programming: Shared<MapKey, Vec<String>>,
    tracked: Shared<ObjectKey, Tracked>,
    classes: Arc<BTreeMap<String, PortMapClassStatus>>,
}

impl Made {
    fn of(out: &Outputs) -> Made {
        Made {
            statuses: out.port_maps.clone(),
            programming: out.programming.clone(),
            tracked: out.tracked.clone(),
            classes: out.classes.clone(),
        }
    }
}

/// What a compute reads across mappings, counted, so a patch can tell it stayed the same.
#[derive(Default)]
struct Across {
    /// The link allocation, and how many cleared mappings need each link.
    alloc: Arc<links::Allocation>,
    users: Shared<LinkKey, u32>,
    /// How many placements answer from each pod port (before the one-way-return check).
    pod_ports: Shared<PodPort, u32>,
    /// The mappings whose placement read every Pod ([`Judged::reads_every_pod`]).
    every_pod: imbl::OrdSet<MapKey>,
}

/// A node's digest of the mappings that give it something: the sum of their
/// [`contribution`]s, so a change adds and takes away only its own, and how many there are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Digest {
    sum: u64,
    mappings: u32,
}

impl Digest {
    fn add(&mut self, contribution: u64) {
        self.sum = self.sum.wrapping_add(contribution);
        self.mappings += 1;
    }

    fn take_away(&mut self, contribution: u64) {
        self.sum = self.sum.wrapping_sub(contribution);
        self.mappings = self.mappings.saturating_sub(1);
    }
}

/// What one built mapping gives each of its nodes, hashed with a key this process draws (a
/// tenant cannot aim two sums at each other). A mapping's [`datapath::Builder::fingerprint`]
/// covers all it builds but the pod node's claim device; its age and name fix its place in
/// the order the nodes are built in.
fn contribution(pm: &PortMap, fingerprint: u64, route: &RouteTo) -> u64 {
    use std::hash::BuildHasher;
    static KEY: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    let m = &pm.metadata;
    let age = (m.creation_timestamp.as_ref().map(|t| t.0), m.namespace.as_deref(), m.name.as_deref());
    KEY.get_or_init(std::hash::RandomState::new).hash_one((age, fingerprint, device(route)))
}

/// The interfaces of `node` the port maps read: those any class names on it.
pub fn interfaces_read<'a>(inputs: Option<&'a Cluster>, node: &str) -> BTreeSet<&'a str> {
    inputs
        .iter()
        .flat_map(|c| &c.classes)
        .filter_map(|c| c.spec.nodes.get(node))
        .flat_map(|n| n.interfaces.iter().map(String::as_str))
        .collect()
}

/// The nodes whose executors must apply a programmed mapping: its accepting nodes, and the
/// pod's node when any of them lacks the pod (it holds the link's far end and the return path).
fn must_ack(p: &Placement) -> Vec<String> {
    let mut nodes: Vec<String> = p.nodes.keys().cloned().collect();
    let pod = &p.endpoint.node;
    if nodes.iter().any(|n| n != pod) && !nodes.contains(pod) {
        nodes.push(pod.clone());
    }
    nodes.sort();
    nodes
}

/// Why a placed mapping is not wholly programmed: its pod's node reported no route that contains
/// the pod's address, so its request claim is left out (docs/portmap/datapath.md, "Which device
/// reaches the pod").
fn pod_route_unknown(p: &Placement) -> Refusal {
    let (node, address) = (&p.endpoint.node, p.endpoint.address);
    Refusal::programmed(
        reason::POD_ROUTE_UNKNOWN,
        format!(
            "no route of node {node} contains pod address {address}: the device that reaches the pod is unknown, so the request claim there is left out"
        ),
    )
}

/// The end of link `key` that reports its class's VXLAN port for its CNI's VXLAN device, with
/// the port: that node's CNI socket would take the link's packets, so no link of the class ends
/// there. What a node reports bounds only its own links (docs/portmap/datapath.md).
fn vxlan_port_clash<'k>(view: &View, vxlan: &ClassVxlans, key: &'k LinkKey) -> Option<(&'k str, u16)> {
    let port = vxlan.get(&key.class)?.as_ref().ok()?.port;
    [key.pair.0.as_str(), key.pair.1.as_str()]
        .into_iter()
        .find(|n| view.node(n).vxlan_ports.contains(&port))
        .map(|n| (n, port))
}

/// Both ends of every link a placement needs, with the links and their numbers, or why one
/// cannot be built.
fn link_ends(
    view: &View,
    vxlan: &ClassVxlans,
    alloc: &links::Allocation,
    p: &Placement,
    last: Option<&Built>,
    made: &mut EndsMade,
) -> Result<(Ends, Vec<(LinkKey, LinkNumbers)>), Refusal> {
    // An end is made once per link, here or by the last compute, and cloned for each mapping.
    let mut end = |key: &LinkKey, numbers: &LinkNumbers, node: &str| {
        let at = (key.clone(), key.pair.0 == node);
        if let Some((_, e)) = made.get(&at).filter(|(n, _)| n == numbers) {
            return e.clone();
        }
        let e = match last.and_then(|l| l.ends.get(&at)).filter(|(n, _)| n == numbers) {
            Some((_, e)) => e.clone(),
            None => LinkEnd::new(view, key, numbers, node),
        };
        made.insert(at, (numbers.clone(), e.clone()));
        e
    };
    let (mut ends, mut links) = (BTreeMap::new(), Vec::new());
    for node in p.remote_nodes() {
        let key = LinkKey::new(&p.admitted.class_name, node, &p.endpoint.node);
        if let Some((n, port)) = vxlan_port_clash(view, vxlan, &key) {
            return Err(Refusal::programmed(
                reason::VXLAN_PORT_CONFLICT,
                format!(
                    "node {n} reports UDP {port}, PortMapClass {:?}'s spec.returnPath.vxlan.port, for a VXLAN device of its CNI: no link of the class ends on node {n}",
                    key.class
                ),
            ));
        }
        let numbers = match alloc.needed.get(&key) {
            Some(Ok(n)) => n,
            Some(Err((_, message))) => {
                return Err(Refusal::programmed(reason::RETURN_PATH_UNAVAILABLE, message.clone()));
            }
            None => return Err(Refusal::programmed(reason::RETURN_PATH_UNAVAILABLE, "no link was planned".into())),
        };
        let near = end(&key, numbers, node);
        let far = end(&key, numbers, &p.endpoint.node);
        let (Some(near), Some(far)) = (near, far) else {
            let missing: Vec<&str> = [node.as_str(), p.endpoint.node.as_str()]
                .into_iter()
                .filter(|n| view.node(n).underlay.is_none())
                .collect();
            // A refused underlay says why (docs/security.md); else it is not reported yet.
            let refused: Vec<String> = missing
                .iter()
                .flat_map(|n| &view.node(n).refused)
                .filter(|r| r.field == "underlayAddress")
                .map(|r| format!("node {}'s underlayAddress {}", r.node, r.message))
                .collect();
            let message = if refused.is_empty() {
                format!("no underlay address is known for node {} yet", missing.join(", "))
            } else {
                format!("no underlay address is usable: {}", refused.join("; "))
            };
            return Err(Refusal::programmed(reason::RETURN_PATH_UNAVAILABLE, message));
        };
        ends.insert(node.clone(), (near, far));
        links.push((key, numbers.clone()));
    }
    Ok((ends, links))
}

/// `over_v6`: the programming nodes that publish the mapping over IPv6 too; the others list
/// only their IPv4 addresses.
fn port_map_status(
    view: &View,
    pm: &PortMap,
    verdict: &Result<Placement, Refusal>,
    over_v6: &BTreeSet<String>,
    now: Timestamp,
) -> PortMapStatus {
    let generation = pm.metadata.generation;
    let prev = pm.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    let cond = |t: &str, ok: bool, r: &str, m: String| condition(prev, t, ok, r, m, generation, now);
    let mut st = PortMapStatus { observed_generation: generation, ..Default::default() };
    match verdict {
        Ok(p) => {
            st.endpoint = Some(EndpointStatus {
                node: p.endpoint.node.clone(),
                address: p.endpoint.address.to_string(),
                address6: p.endpoint.address6.map(|a| a.to_string()).unwrap_or_default(),
            });
            for (node, ifaces) in &p.nodes {
                let v = view.node(node);
                let v6 = over_v6.contains(node);
                for iface in ifaces {
                    let addrs: Vec<&String> = v.addresses_of(iface).iter().filter(|a| v6 || !a.contains(':')).collect();
                    if addrs.is_empty() {
                        st.published.push(PublishedAddress {
                            node: node.clone(),
                            interface: iface.clone(),
                            address: String::new(),
                        });
                    }
                    for a in addrs {
                        st.published.push(PublishedAddress {
                            node: node.clone(),
                            interface: iface.clone(),
                            address: a.clone(),
                        });
                    }
                }
            }
            st.published.sort();
            let nodes: Vec<&str> = p.nodes.keys().map(String::as_str).collect();
            st.conditions = vec![
                cond(status::ACCEPTED, true, reason::ACCEPTED, String::new()),
                cond(status::PROGRAMMED, true, reason::PROGRAMMED, format!("programmed on {}", nodes.join(", "))),
            ];
        }
        Err(r) if r.condition == status::ACCEPTED => {
            st.conditions = vec![
                cond(status::ACCEPTED, false, r.reason, r.message.clone()),
                cond(status::PROGRAMMED, false, reason::NOT_ACCEPTED, "the mapping is not accepted".into()),
            ];
        }
        Err(r) => {
            st.conditions = vec![
                cond(status::ACCEPTED, true, reason::ACCEPTED, String::new()),
                cond(status::PROGRAMMED, false, r.reason, r.message.clone()),
            ];
        }
    }
    st
}

fn class_status(
    view: &View,
    class: &PortMapClass,
    vxlan: &Result<links::ClassVxlan, (&'static str, String)>,
    alloc: &links::Allocation,
    rows: Vec<crate::api::LinkSlot>,
    now: Timestamp,
) -> PortMapClassStatus {
    let name = class.metadata.name.clone().unwrap_or_default();
    let mut nodes: BTreeSet<String> = class.spec.nodes.keys().cloned().collect();
    for r in &rows {
        nodes.extend(r.pair.iter().cloned());
    }
    let node_rows = nodes
        .into_iter()
        .map(|n| {
            let v = view.node(&n);
            let mut addresses: Vec<InterfaceAddress> = class
                .spec
                .nodes
                .get(&n)
                .map(|cn| {
                    cn.interfaces
                        .iter()
                        .flat_map(|i| {
                            v.addresses_of(i)
                                .iter()
                                .map(|a| InterfaceAddress { interface: i.clone(), address: a.clone() })
                        })
                        .collect()
                })
                .unwrap_or_default();
            addresses.sort();
            let mut message: Vec<String> = match (v.exists, v.ready) {
                (false, _) => vec!["no Node object".to_string()],
                (true, false) => vec!["Node is not Ready".to_string()],
                _ => Vec::new(),
            };
            // What of the executor's reports is refused: reason, field and why.
            message.extend(v.refused.iter().map(|r| format!("{}: {}: {}", r.reason, r.field, r.message)));
            if let Ok(x) = vxlan
                && v.vxlan_ports.contains(&x.port)
            {
                message.push(format!(
                    "{}: vxlanPorts: the node reports UDP {} for a VXLAN device of its CNI; no link of the class ends here",
                    reason::VXLAN_PORT_CONFLICT,
                    x.port
                ));
            }
            let message = message.join("; ");
            let interfaces = class.spec.nodes.get(&n).and_then(|cn| v.known_interfaces(&cn.interfaces));
            ClassNodeStatus {
                name: n,
                ready: v.ready,
                message,
                underlay_address: v.underlay.map(|a| a.to_string()),
                underlay_mtu: v.underlay_mtu,
                link_mtu: Some(v.mtu().saturating_sub(VXLAN_OVERHEAD)),
                addresses,
                interfaces,
            }
        })
        .collect();
    let exhausted = alloc.needed.iter().find_map(|(k, r)| match r {
        Err((rsn, m)) if k.class == name && *rsn == reason::SUBNET_EXHAUSTED => Some(m.clone()),
        _ => None,
    });
    let prev = class.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    let generation = class.metadata.generation;
    let ready = match (class.spec.return_path.mode, vxlan, exhausted) {
        (ReturnPathMode::Vxlan, Err((rsn, m)), _) => {
            condition(prev, status::READY, false, rsn, m.clone(), generation, now)
        }
        (ReturnPathMode::Vxlan, Ok(_), Some(m)) => {
            condition(prev, status::READY, false, reason::SUBNET_EXHAUSTED, m, generation, now)
        }
        _ => condition(prev, status::READY, true, reason::READY, String::new(), generation, now),
    };
    PortMapClassStatus { links: rows, nodes: node_rows, conditions: vec![ready] }
}
