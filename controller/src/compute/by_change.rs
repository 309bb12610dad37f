//! Compute by change: the next compute redoes only the capabilities a change reaches, and
//! assembles only the node states whose parts changed (docs/design.md, "Compute by change").
//!
//! Each capability names what it reads ([`Reads`]) and until when its result holds with
//! nothing else changed (its horizon: the mesh's clock, the port maps' link release). A change
//! is found by comparing the new inputs with the last ones, object by object: the watch caches
//! share unchanged objects, so most comparisons are one pointer. [`super::compute`] is the
//! same with nothing kept, and stays the reference: `tests.rs` drives random changes through a
//! long-lived [`Computer`] and a fresh compute and requires the same outputs after every step.

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kuport_proto::v1::{NetnsState, NodeState};
use kuport_proto::wireguard::Peers;

use super::intercept::pods::Decided;
use super::{ObjectKey, Outputs, Settings, Shared, Tracked, merge, overlay, portmap};
use crate::api::{PortMap, PortMapClass};
use crate::observe::index::{self, KnownNode, View, same_for_port_maps};
use crate::observe::{Change, Cluster, KnownFacts, Objects};

/// What the last compute redid: which capabilities ran and how many node states were
/// assembled anew (the others kept from the compute before).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Redone {
    pub mesh: bool,
    /// The mesh members whose part was made anew.
    pub mesh_members: usize,
    /// The mesh members whose part is their last with some peers' key or endpoint replaced.
    pub mesh_patched: usize,
    pub port_maps: bool,
    /// The port maps took every mapping's admission verdict from the compute before.
    pub port_maps_readmitted: bool,
    /// The port maps took the whole of the compute before, with the mappings the change
    /// reached made again.
    pub port_maps_patched: bool,
    /// The admitted mappings placed anew: those whose namespace, or every Pod they read, changed.
    pub port_maps_placed: usize,
    /// The PortMap statuses made anew: those of mappings placed or linked anew, refused
    /// otherwise, or whose status was not written back as made.
    pub port_map_statuses: usize,
    /// The host namespaces the port maps rendered anew: those a mapping gave something else.
    pub port_map_hosts: usize,
    pub intercepts: bool,
    /// The node states made anew.
    pub node_states: usize,
    /// Of those, the states that are their last with some peers' key or endpoint replaced.
    pub node_states_patched: usize,
}

/// A compute that keeps what it computed, for the next.
#[derive(Default)]
pub struct Computer {
    settings: Settings,
    last: Option<Last>,
    redone: Redone,
}

impl std::fmt::Debug for Computer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Computer").field("kept", &self.last.is_some()).field("redone", &self.redone).finish()
    }
}

/// The overlay's result, with what port maps read of it.
struct Meshed {
    plan: overlay::Plan,
    /// Every member's peer entry that members' devices share ([`overlay::base_peers`]).
    base: Peers,
    members: BTreeMap<String, MemberPart>,
    places: Arc<overlay::Places>,
    /// Every node's underlay MTU, as the mesh read it.
    mtus: Arc<BTreeMap<String, u32>>,
    /// Each member's overlay address and device MTU: port maps' links ride on them.
    addresses: BTreeMap<String, (Ipv4Addr, u32)>,
    horizon: Horizon,
    /// How many members' parts this compute made anew.
    remade: usize,
    /// How many it made from their last by taking changed peers ([`overlay::repeer`]).
    patched: usize,
    /// The members whose peer entries those took ([`overlay::repeered`]).
    repeered: BTreeSet<String>,
}

/// One member's part of its host namespace and its place, with what only it read: its node's
/// MTU, and the horizon of its own report.
#[derive(Clone)]
struct MemberPart {
    netns: Arc<NetnsState>,
    place: Arc<overlay::NodeOverlay>,
    node_mtu: u32,
    horizon: Horizon,
    /// Made by the compute that made it from the part before, taking changed peers.
    patched: bool,
}

/// The port maps' result: every node's host namespace and their part of the outputs.
struct PortMapped {
    built: portmap::Built,
    out: Outputs,
    horizon: Horizon,
}

/// When a result computed at `at` stops holding by the clock alone: at `until`, or before `at`
/// (a clock set back).
#[derive(Clone, Copy, Debug)]
struct Horizon {
    at: Timestamp,
    until: Option<Timestamp>,
}

impl Horizon {
    fn holds(&self, now: Timestamp) -> bool {
        now >= self.at && self.until.is_none_or(|u| now < u)
    }
}

struct Last {
    inputs: Cluster,
    mesh: Option<Arc<Meshed>>,
    port_maps: Arc<PortMapped>,
    intercepts: Arc<Decided>,
    states: BTreeMap<String, Arc<NodeState>>,
    /// The port maps' and the Intercepts' tracked objects, in one map.
    tracked: Shared<ObjectKey, Tracked>,
    /// The Services, slices and Pods of `inputs`, indexed for the port maps' `View`.
    indexes: index::Indexes,
}

/// Which inputs changed, kind by kind, as each capability reads them.
#[derive(Debug, Default)]
struct Reads {
    mesh: bool,
    /// What judges the mesh's members: Nodes, facts, refused facts.
    members: bool,
    /// What a node's [`KnownNode`] reads: Nodes, facts, refused facts, classes (their rows).
    known_nodes: bool,
    port_maps: bool,
    /// The namespaces of the PortMaps, Services, EndpointSlices and Pods (as port maps read
    /// them) that changed; None as for `intercept_namespaces`.
    port_map_namespaces: Option<BTreeSet<String>>,
    /// Some Pod changed as port maps read it.
    pods_for_port_maps: bool,
    /// Some PortMapClass's spec changed, or a class came or went.
    classes_respecified: bool,
    /// Some input admission reads changed: a PortMap's spec or age, a PortMap that came or
    /// went, a class's spec, a Namespace.
    admission: bool,
    /// The PortMaps whose spec or age changed, or that came or went, where admission read no
    /// other change; None where it did, or a change has no name.
    port_maps_judged: Option<BTreeSet<(String, String)>>,
    /// The namespaces of the PortMaps that changed in any way; None as for `intercept_namespaces`.
    port_maps_restated: Option<BTreeSet<String>>,
    /// What changed for port maps is only statuses written back as they made them: their
    /// result holds if the nodes they see are the same (the class rows are read through them).
    written_back: bool,
    intercepts: bool,
    /// The namespaces of the Intercepts and pods that changed; none when one has no namespace
    /// or a folder's two objects share a name (then every namespace is redone).
    intercept_namespaces: Option<BTreeSet<String>>,
}

impl Reads {
    /// `made`: the port maps' outputs from `old`, whose statuses a status writer writes back.
    /// `changed`: what the indexes read that changed between `old` and `new`.
    fn between(old: &Cluster, new: &Cluster, made: &Outputs, changed: &index::Changed) -> Reads {
        let nodes = !diff(&old.nodes, &new.nodes).is_empty();
        let class_changes = diff(&old.classes, &new.classes);
        let classes = !class_changes.is_empty();
        let facts = !same_facts(&old.facts, &new.facts) || old.refused_facts != new.refused_facts;
        let pods = refs(&changed.pods);
        let pod_changes: Vec<_> = pods
            .iter()
            .filter(|(a, b)| match (a, b) {
                (Some(a), Some(b)) => !same_for_port_maps(a, b),
                _ => true,
            })
            .copied()
            .collect();
        let pods_for_port_maps = !pod_changes.is_empty();
        let mesh = nodes || classes || facts || old.overlay_observed != new.overlay_observed;
        let (services, slices) = (refs(&changed.services), refs(&changed.slices));
        let port_map_changes = diff(&old.port_maps, &new.port_maps);
        // A status written back changes no placement.
        let port_map_specs: Vec<_> = port_map_changes.iter().filter(|c| respecified(c)).copied().collect();
        let port_map_namespaces = namespaces_of(&pod_changes)
            .chain(namespaces_of(&services))
            .chain(namespaces_of(&slices))
            .chain(namespaces_of(&port_map_specs))
            .collect();
        let namespaces = !diff(&old.namespaces, &new.namespaces).is_empty();
        // The age orders the claims: a PortMap made again with the same spec is younger.
        let aged = |(a, b): &&(Option<&PortMap>, Option<&PortMap>)| {
            a.zip(*b).is_none_or(|(a, b)| a.metadata.creation_timestamp != b.metadata.creation_timestamp)
        };
        let classes_respecified = class_changes.iter().any(respecified);
        let judged: Vec<_> = port_map_changes.iter().filter(|c| respecified(c) || aged(c)).collect();
        let admission = classes_respecified || namespaces || !judged.is_empty();
        let port_maps_judged = (!classes_respecified && !namespaces)
            .then(|| {
                judged
                    .iter()
                    .flat_map(|(a, b)| match (a, b) {
                        (None, None) => vec![None],
                        _ => [a, b]
                            .into_iter()
                            .flatten()
                            .map(|o| Some((o.meta().namespace.clone()?, o.meta().name.clone()?)))
                            .collect(),
                    })
                    .collect()
            })
            .flatten();
        let port_maps = nodes
            || classes
            || facts
            || pods_for_port_maps
            || namespaces
            || !services.is_empty()
            || !slices.is_empty()
            || !port_map_changes.is_empty();
        // Statuses written back as the port maps made them, and nothing else they read.
        let written_back = port_maps
            && !(nodes || facts || pods_for_port_maps || namespaces || !services.is_empty() || !slices.is_empty())
            && port_map_changes.iter().all(|c| port_map_as_made(c, made))
            && class_changes.iter().all(|c| class_as_made(c, made));
        let port_maps_restated = namespaces_of(&port_map_changes).collect();
        let intercept_changes = diff(&old.intercepts, &new.intercepts);
        let intercepts = !pods.is_empty() || !intercept_changes.is_empty();
        let intercept_namespaces = namespaces_of(&pods).chain(namespaces_of(&intercept_changes)).collect();
        Reads {
            mesh,
            members: nodes || facts,
            known_nodes: nodes || facts || classes,
            port_maps,
            port_map_namespaces,
            pods_for_port_maps,
            // The link rows written back are read through the nodes ([`KnownNode`]).
            classes_respecified,
            admission,
            port_maps_judged,
            port_maps_restated,
            written_back,
            intercepts,
            intercept_namespaces,
        }
    }
}

impl Computer {
    pub fn new(settings: Settings) -> Self {
        Computer { settings, last: None, redone: Redone::default() }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// What the last [`Computer::compute`] redid.
    pub fn redone(&self) -> &Redone {
        &self.redone
    }

    /// Everything the computation decides for `cluster`, equal to [`super::compute`]'s.
    pub fn compute(&mut self, cluster: &Cluster) -> Outputs {
        if cluster.teardown {
            self.last = None;
            self.redone = Redone::default();
            return super::torn_down(cluster);
        }
        let last = self.last.take();
        // Found once: both the reads and the indexes follow them.
        let changed = last.as_ref().map(|l| index::Changed::between(&l.inputs, cluster));
        let reads = match last.as_ref().zip(changed.as_ref()) {
            Some((l, changed)) => Reads::between(&l.inputs, cluster, &l.port_maps.out, changed),
            None => Reads {
                mesh: true,
                members: true,
                known_nodes: true,
                port_maps: true,
                port_map_namespaces: None,
                pods_for_port_maps: true,
                classes_respecified: true,
                admission: true,
                port_maps_judged: None,
                port_maps_restated: None,
                written_back: false,
                intercepts: true,
                intercept_namespaces: None,
            },
        };
        let now = cluster.now;
        let indexes = match last.as_ref().zip(changed.as_ref()) {
            Some((l, changed)) => l.indexes.edited(cluster, changed),
            None => index::Indexes::of(cluster),
        };
        // The nodes as the computation knows them: made once, and only when read.
        let mut known: Option<BTreeMap<String, KnownNode>> = None;

        // The mesh first: port maps' links between members ride on it.
        let last_mesh = last.as_ref().and_then(|l| l.mesh.clone());
        let mesh = match &self.settings.overlay {
            None => None,
            Some(settings) => match last_mesh.clone().filter(|m| !reads.mesh && m.horizon.holds(now)) {
                Some(kept) => Some(kept),
                None => {
                    let mtus = match last_mesh.as_ref().filter(|_| !reads.known_nodes) {
                        Some(m) => m.mtus.clone(),
                        None => {
                            let nodes = known.get_or_insert_with(|| index::known_nodes(cluster));
                            Arc::new(nodes.iter().map(|(n, k)| (n.clone(), k.mtu())).collect())
                        }
                    };
                    let old = last.as_ref().and_then(|l| Some((l.mesh.as_deref()?, &l.inputs)));
                    Some(Arc::new(mesh_by_member(mtus, cluster, settings, old, !reads.members)))
                }
            },
        };
        let mesh_redone = mesh.is_some() && !same_arc(&mesh, &last_mesh);
        let addresses_moved = match (&mesh, &last_mesh) {
            (Some(a), Some(b)) => a.addresses != b.addresses,
            (None, None) => false,
            _ => true,
        };

        let last_pm = last.as_ref().map(|l| l.port_maps.clone());
        let holds = |p: &Arc<PortMapped>| !addresses_moved && p.horizon.holds(now);
        let port_maps = match last_pm.clone().filter(|p| !reads.port_maps && holds(p)) {
            Some(kept) => kept,
            None => {
                // What the nodes read did not change: the last compute's, shared.
                let nodes = match last_pm.as_ref().filter(|_| !reads.known_nodes && !addresses_moved) {
                    Some(p) => p.built.nodes(),
                    None => {
                        let mut nodes = known.take().unwrap_or_else(|| index::known_nodes(cluster));
                        for (name, (address, mtu)) in mesh.iter().flat_map(|m| &m.addresses) {
                            if let Some(node) = nodes.get_mut(name) {
                                node.overlay = Some((*address, *mtu));
                            }
                        }
                        Arc::new(nodes)
                    }
                };
                match last_pm.clone().filter(|p| reads.written_back && holds(p) && p.built.saw_same(&nodes)) {
                    Some(kept) => kept,
                    None => {
                        let wireguard_port = self.settings.overlay.as_ref().map(|o| o.listen_port);
                        let v = &mut View::with_nodes(cluster, nodes, &indexes);
                        v.wireguard_port = wireguard_port;
                        let mut out = Outputs::default();
                        let since = last_pm.as_ref().map(|p| portmap::Since {
                            built: &p.built,
                            namespaces: reads.port_map_namespaces.clone(),
                            pods: reads.pods_for_port_maps,
                            classes: reads.classes_respecified,
                            admission: reads.admission,
                            judged: reads.port_maps_judged.clone(),
                            restated: reads.port_maps_restated.clone(),
                            clock_holds: p.horizon.holds(now),
                        });
                        let mut built = portmap::compute(v, cluster, &mut out, since);
                        built.saw(v.nodes.clone());
                        let horizon = Horizon { at: now, until: portmap::links::horizon(&out.classes) };
                        Arc::new(PortMapped { built, out, horizon })
                    }
                }
            }
        };
        let pm_redone = !last_pm.as_ref().is_some_and(|p| Arc::ptr_eq(p, &port_maps));

        let last_ic = last.as_ref().map(|l| l.intercepts.clone());
        let intercepts = match (last_ic.clone(), &reads.intercept_namespaces) {
            (Some(kept), _) if !reads.intercepts => kept,
            // An Intercept reads only its own namespace: the namespaces that changed are redone.
            (Some(kept), Some(namespaces)) => {
                let namespaces: BTreeSet<&str> = namespaces.iter().map(String::as_str).collect();
                let inside = |m: &ObjectMeta| m.namespace.as_deref().is_some_and(|n| namespaces.contains(n));
                let redone = super::intercept::pods::compute(
                    cluster.intercepts.iter().filter(|i| inside(&i.metadata)),
                    cluster.pods.iter().filter(|p| inside(&p.metadata)),
                    now,
                );
                Arc::new(kept.with_namespaces_redone(&namespaces, redone))
            }
            _ => Arc::new(super::intercept::pods::compute(cluster.intercepts.iter(), cluster.pods.iter(), now)),
        };
        let ic_redone = !last_ic.as_ref().is_some_and(|i| Arc::ptr_eq(i, &intercepts));

        // Node states: kept where no part changed, assembled anew where one did.
        let (mut assembled, mut patched_states) = (0, 0);
        let states = match &last {
            Some(l) if !mesh_redone && !pm_redone && !ic_redone => l.states.clone(),
            _ => {
                let mut names: BTreeSet<&String> = port_maps.built.hosts.keys().collect();
                names.extend(intercepts.netns.keys());
                names.extend(mesh.iter().flat_map(|m| m.members.keys()));
                let mut states = BTreeMap::new();
                for name in names {
                    let host = port_maps.built.hosts.get(name);
                    let meshed = mesh.as_ref().and_then(|m| m.members.get(name)).map(|p| &p.netns);
                    let pods = intercepts.netns.get(name);
                    let kept = last.as_ref().and_then(|l| {
                        let others_same = (!pm_redone || same_or_equal(l.port_maps.built.hosts.get(name), host))
                            && (!ic_redone || same_or_equal(l.intercepts.netns.get(name), pods));
                        let was = l.states.get(name)?;
                        if !others_same {
                            return None;
                        }
                        let last_mesh = l.mesh.as_ref();
                        let last_part = last_mesh.and_then(|m| m.members.get(name)).map(|p| &p.netns);
                        if !mesh_redone || same_part(last_part, meshed) {
                            return Some(was.clone());
                        }
                        // A part that only took changed peers: so does the state.
                        let (m, part) = mesh
                            .as_ref()
                            .zip(meshed)
                            .filter(|(m, _)| m.members.get(name).is_some_and(|p| p.patched))?;
                        let settings = self.settings.overlay.as_ref()?;
                        let state = overlay::repeer_state(was, settings, &last_mesh?.plan, &m.plan, part, &m.repeered)?;
                        assembled += 1;
                        patched_states += 1;
                        Some(Arc::new(state))
                    });
                    let state = kept.unwrap_or_else(|| {
                        assembled += 1;
                        let was = last.as_ref().and_then(|l| l.states.get(name)).map(|s| &**s);
                        Arc::new(assemble_node(name, host.map(|h| &**h), meshed.map(|m| &**m), pods.map(|p| &**p), was))
                    });
                    states.insert(name.clone(), state);
                }
                states
            }
        };
        let (mesh_members, mesh_patched) = match mesh.as_ref().filter(|_| mesh_redone) {
            Some(m) => (m.remade, m.patched),
            None => (0, 0),
        };
        self.redone = Redone {
            mesh: mesh_redone,
            mesh_members,
            mesh_patched,
            port_maps: pm_redone,
            port_maps_readmitted: pm_redone && port_maps.built.readmitted,
            port_maps_patched: pm_redone && port_maps.built.patched,
            port_maps_placed: if pm_redone { port_maps.built.placed } else { 0 },
            port_map_statuses: if pm_redone { port_maps.built.statuses_made } else { 0 },
            port_map_hosts: if pm_redone { port_maps.built.rendered } else { 0 },
            intercepts: ic_redone,
            node_states: assembled,
            node_states_patched: patched_states,
        };

        // Shared maps: a capability not redone costs a pointer here.
        let tracked = match &last {
            Some(l) if !pm_redone && !ic_redone => l.tracked.clone(),
            _ if intercepts.tracked.is_empty() => port_maps.out.tracked.clone(),
            _ => {
                let mut both = port_maps.out.tracked.clone();
                both.extend(intercepts.tracked.iter().map(|(k, t)| (k.clone(), t.clone())));
                both
            }
        };
        let mut out = port_maps.out.clone();
        out.tracked = tracked.clone();
        out.intercepts = intercepts.statuses.clone();
        out.intercept_pods = intercepts.placed.clone();
        if let Some(m) = &mesh {
            out.overlay = m.places.clone();
        }
        out.node_states = states.clone();
        self.last = Some(Last { inputs: cluster.clone(), mesh, port_maps, intercepts, states, tracked, indexes });
        out
    }
}

/// The mesh, remaking only the members whose part may differ from `old`'s: every one when the
/// members or their pod CIDRs changed, or an IPv6 endpoint came or went
/// ([`overlay::repeered`]); else those whose own report or last endpoints, node MTU, routes,
/// key or candidates changed, or whose horizon passed. The others keep their part, taking only
/// the peer entries of members whose key or candidates changed ([`overlay::repeer`]): a
/// member's part reads nothing else ([`overlay::member`]). The plan is made from the old one,
/// hearing again only the reports that changed: with the same members when what judges them
/// did not change (`same_members`), else with the members judged again ([`overlay::rejudge`]).
fn mesh_by_member(
    mtus: Arc<BTreeMap<String, u32>>,
    cluster: &Cluster,
    settings: &overlay::OverlaySettings,
    old: Option<(&Meshed, &Cluster)>,
    same_members: bool,
) -> Meshed {
    let now = cluster.now;
    let plan = match old {
        Some((m, was)) if same_members => overlay::replan(&m.plan, was, cluster, settings),
        Some((m, was)) => overlay::rejudge(&m.plan, was, cluster, settings),
        None => overlay::plan(cluster, settings),
    };
    // The members whose new key or endpoint the others take one peer each.
    let repeered = old.and_then(|(m, _)| overlay::repeered(&m.plan, &plan));
    let old = old.filter(|_| repeered.is_some());
    let repeered = repeered.unwrap_or_default();
    let base = old
        .and_then(|(m, _)| overlay::rebase_peers(&m.base, &m.plan.judged, &plan.judged, &repeered))
        .unwrap_or_else(|| overlay::base_peers(&plan.judged));
    let rerouted = old.map(|(m, _)| m.plan.rerouted(&plan)).unwrap_or_default();
    let observed = &cluster.overlay_observed;
    let mut members = BTreeMap::new();
    let (mut remade, mut patched) = (0, 0);
    for name in plan.judged.members.keys() {
        let node_mtu = mtus.get(name).copied().unwrap_or_else(|| KnownNode::default().mtu());
        let kept = old.and_then(|(m, inputs)| {
            let part = m.members.get(name)?;
            let was = &inputs.overlay_observed;
            let same = part.node_mtu == node_mtu
                && part.horizon.holds(now)
                && !rerouted.contains(name)
                && !repeered.contains(name)
                && was.reports.get(name) == observed.reports.get(name)
                && was.last_endpoints.get(name) == observed.last_endpoints.get(name);
            if !same {
                return None;
            }
            if repeered.is_empty() {
                return Some(MemberPart { patched: false, ..part.clone() });
            }
            let netns = overlay::repeer(cluster, (&m.plan, &plan, &base), name, (&part.netns, &part.place), &repeered)?;
            patched += 1;
            Some(MemberPart { netns: Arc::new(netns), patched: true, ..part.clone() })
        });
        let part = match kept {
            Some(p) => p,
            None => {
                let Some((netns, place)) = overlay::member(cluster, settings, (&plan, &base), name, node_mtu) else {
                    continue;
                };
                remade += 1;
                let report = observed.reports.get(name).into_iter().flat_map(|r| r.values());
                let horizon = Horizon { at: now, until: overlay::members::horizon_of(report, now) };
                MemberPart { netns: Arc::new(netns), place: Arc::new(place), node_mtu, horizon, patched: false }
            }
        };
        members.insert(name.clone(), part);
    }
    let mut places: overlay::Places =
        plan.judged.refused.iter().map(|(n, why)| (n.clone(), Arc::new(overlay::refused_place(why)))).collect();
    places.extend(members.iter().map(|(n, p)| (n.clone(), p.place.clone())));
    let addresses = members.iter().filter_map(|(n, p)| Some((n.clone(), (p.place.address?, p.place.mtu)))).collect();
    // Each member's horizon covers its own report, the only reports the mesh reads.
    let until = members.values().filter_map(|p| p.horizon.until).min();
    let horizon = Horizon { at: now, until };
    Meshed { plan, base, members, places: Arc::new(places), mtus, addresses, horizon, remade, patched, repeered }
}

/// The same part, kept (one allocation), or none on both sides.
fn same_part<T>(a: Option<&Arc<T>>, b: Option<&Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// The same part, kept or equal, or none on both sides.
fn same_or_equal<T: PartialEq>(a: Option<&Arc<T>>, b: Option<&Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        (None, None) => true,
        _ => false,
    }
}

fn same_arc<T>(a: &Option<Arc<T>>, b: &Option<Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// One node's state from its capabilities' parts, canonical (ordered, digested, versioned);
/// the sets it shares with `last`, the node's state before, digested by their edit.
fn assemble_node(
    node: &str,
    host: Option<&NetnsState>,
    mesh: Option<&NetnsState>,
    pods: Option<&Vec<NetnsState>>,
    last: Option<&NodeState>,
) -> NodeState {
    let mut first = host.cloned().unwrap_or_default();
    if let Some(part) = mesh {
        merge(&mut first, part.clone());
    }
    let mut netns = vec![first];
    netns.extend(pods.into_iter().flatten().cloned());
    for ns in &mut netns {
        super::drop_route_clashes(node, ns);
    }
    let mut state = NodeState { node: node.to_string(), netns };
    kuport_proto::canonicalize_after(&mut state, last);
    state
}

/// A change ([`diff`]'s pair) to an object's spec, or an object that came or went: not only
/// its status written back.
fn respecified<K: kube::core::object::HasSpec<Spec: PartialEq>>((a, b): &(Option<&K>, Option<&K>)) -> bool {
    a.zip(*b).is_none_or(|(a, b)| a.spec() != b.spec())
}

/// A PortMap whose status was written back as `made` has it, and nothing else the port maps
/// read of it changed.
fn port_map_as_made((a, b): &(Option<&PortMap>, Option<&PortMap>), made: &Outputs) -> bool {
    let (Some(a), Some(b)) = (a, b) else { return false };
    a.spec == b.spec
        && a.metadata.creation_timestamp == b.metadata.creation_timestamp
        && a.metadata.generation == b.metadata.generation
        && b.status.as_ref() == made.port_maps.get(&portmap::admission::key_of(b))
}

/// The same for a class.
fn class_as_made((a, b): &(Option<&PortMapClass>, Option<&PortMapClass>), made: &Outputs) -> bool {
    let (Some(a), Some(b)) = (a, b) else { return false };
    let name = b.metadata.name.clone().unwrap_or_default();
    a.spec == b.spec && a.metadata.generation == b.metadata.generation && b.status.as_ref() == made.classes.get(&name)
}

/// The executors' facts, in any order, are the same.
fn same_facts(a: &[KnownFacts], b: &[KnownFacts]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a == b {
        return true;
    }
    let mut a: Vec<&KnownFacts> = a.iter().collect();
    let mut b: Vec<&KnownFacts> = b.iter().collect();
    a.sort_by(|x, y| x.node.cmp(&y.node));
    b.sort_by(|x, y| x.node.cmp(&y.node));
    a == b
}

/// The namespaces of changed objects ([`diff`]'s pairs), None for an object without one or for
/// a folder's two objects with one name.
fn namespaces_of<'a, K: Resource>(
    changes: &'a [(Option<&'a K>, Option<&'a K>)],
) -> impl Iterator<Item = Option<String>> + 'a {
    changes.iter().flat_map(|(a, b)| match (a, b) {
        (None, None) => vec![None],
        _ => [a, b].into_iter().flatten().map(|o| o.meta().namespace.clone()).collect(),
    })
}

/// The objects that differ between `old` and `new` ([`Objects::changes`]), by reference.
fn diff<'a, K: Resource + PartialEq>(old: &'a Objects<K>, new: &'a Objects<K>) -> Vec<(Option<&'a K>, Option<&'a K>)> {
    refs(&Objects::changes(old, new))
}

fn refs<'a, K>(changes: &[Change<'a, K>]) -> Vec<(Option<&'a K>, Option<&'a K>)> {
    changes.iter().map(|(a, b)| (a.map(|a| &**a), b.map(|b| &**b))).collect()
}
