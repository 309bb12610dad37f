//! Who is in the mesh: every Node with a valid public key, pod CIDRs that overlap no other
//! member's, and an endpoint that parses. Everything else is refused with the node, the field
//! and why; a refused node is no one's peer and has no device, and the rest of the mesh is
//! computed as if it did not exist (docs/overlay/mesh.md, "Refusals").

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;

use super::heard::Heard;
use super::{EXTERNAL_ENDPOINT_ANNOTATION, KEY_HELD_LABEL, OverlaySettings, Refusal, key_tag, reason};
use crate::observe::facts;
use crate::observe::{Cluster, KnownFacts, ObservedPeer};

/// A silent peer's endpoint moves to its next candidate this often (seconds): the overlay
/// note's figure, a little under its 25 s keepalive, so that every candidate gets a keepalive's
/// handshake attempt before the next one (docs/overlay/status.md).
pub const ROTATE_EVERY_SECONDS: i64 = 20;
/// A peer whose last handshake is older than this (seconds), or that never had one, is
/// silent: WireGuard's REJECT_AFTER_TIME, after which its session is gone.
pub const SESSION_LIFE_SECONDS: i64 = 180;

/// The field a refusal names, as `kubectl explain` and the executor's report spell them.
pub const FIELD_KEY: &str = "wireguardPublicKey";
pub const FIELD_POD_CIDRS: &str = "spec.podCIDRs";
/// How a NoPublicKey refusal begins when the executor's report carrying the key was refused
/// (not merely awaited): events are published only for such a one.
pub const REPORT_REFUSED: &str = "the executor's report was refused";

fn endpoint_field() -> String {
    format!("metadata.annotations[{EXTERNAL_ENDPOINT_ANNOTATION}]")
}

/// A node that passed every check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub public_key: String,
    /// Canonical (no host bits), as the Node lists them.
    pub pod_cidrs: Vec<IpNet>,
    /// Where peers send first; None when the Node has no usable address (it sends first).
    pub endpoint: Option<SocketAddr>,
    /// A relay candidate, by its labels ([`super::relays::is_candidate`]).
    pub relay: bool,
}

/// What [`judge`] decides, per node name.
#[derive(Debug, Default, PartialEq)]
pub struct Judged {
    /// Shared: a plan made again from the last one keeps them (`super::replan`).
    pub members: Arc<BTreeMap<String, Member>>,
    /// Every node with a Node object that is not a member, with why (at least one reason).
    pub refused: BTreeMap<String, Vec<Refusal>>,
    /// Per member, every endpoint it may be reached at, in the order tried
    /// ([`candidates`]).
    pub candidates: BTreeMap<String, Vec<SocketAddr>>,
}

/// The endpoint member `node`'s state gives its peer `peer` ([`choose`] among the peer's
/// [`Judged::candidates`]).
pub fn endpoint_for(
    cluster: &Cluster,
    members: &BTreeMap<String, Member>,
    candidates: &BTreeMap<String, Vec<SocketAddr>>,
    node: &str,
    peer: &str,
) -> Option<SocketAddr> {
    let m = members.get(peer)?;
    choose(cluster, node, &m.public_key, candidates.get(peer).map_or(&[][..], Vec::as_slice))
}

/// Whether a peer as a node reported it is silent at `now`: no handshake within
/// [`SESSION_LIFE_SECONDS`], or none ever.
pub fn silent(p: &ObservedPeer, now: Timestamp) -> bool {
    p.last_handshake.is_none_or(|t| now.as_second().saturating_sub(t.as_second()) >= SESSION_LIFE_SECONDS)
}

/// The first moment after `now` at which the clock alone may change what these peers' reports
/// say: a live session turning [`silent`], or, while some peer is silent, the next
/// [`rotation`]. Until then a member's part computed at `now` holds (`compute::by_change`).
pub fn horizon_of<'a>(peers: impl IntoIterator<Item = &'a ObservedPeer>, now: Timestamp) -> Option<Timestamp> {
    let now = now.as_second();
    let mut next: Option<i64> = None;
    let mut any_silent = false;
    for p in peers {
        match p.last_handshake.map(|t| t.as_second().saturating_add(SESSION_LIFE_SECONDS)) {
            Some(turns) if turns > now => next = Some(next.map_or(turns, |n| n.min(turns))),
            _ => any_silent = true,
        }
    }
    if any_silent {
        let turn = now.div_euclid(ROTATE_EVERY_SECONDS).saturating_add(1).saturating_mul(ROTATE_EVERY_SECONDS);
        next = Some(next.map_or(turn, |n| n.min(turn)));
    }
    next.and_then(|s| Timestamp::from_second(s).ok())
}

/// The candidate a silent peer gets at `now`: the next one every [`ROTATE_EVERY_SECONDS`],
/// the same on every replica and every recompute within one period.
pub fn rotation(candidates: &[SocketAddr], now: Timestamp) -> Option<SocketAddr> {
    let n = i64::try_from(candidates.len()).ok().filter(|n| *n > 0)?;
    let slot = now.as_second().div_euclid(ROTATE_EVERY_SECONDS).rem_euclid(n);
    candidates.get(usize::try_from(slot).ok()?).copied()
}

/// The endpoint `node`'s state gives the peer whose key is `key` (docs/overlay/status.md):
/// - the node's latest report says the peer is [`silent`]: its candidate of the moment
///   ([`rotation`]);
/// - the report says its session lives: what the node's last state gave it (WireGuard keeps
///   the endpoint it learned anyway), else what the report shows (a new leader has no last
///   state), else the first candidate;
/// - no report names the peer yet: the first candidate, the endpoint the peer announces.
pub fn choose(cluster: &Cluster, node: &str, key: &str, candidates: &[SocketAddr]) -> Option<SocketAddr> {
    let observed = &cluster.overlay_observed;
    let first = candidates.first().copied();
    match observed.reports.get(node).and_then(|r| r.get(key)) {
        None => first,
        Some(p) if silent(p, cluster.now) => rotation(candidates, cluster.now),
        Some(p) => observed.last_endpoints.get(node).and_then(|l| l.get(key)).copied().or(p.endpoint).or(first),
    }
}

/// Every member's endpoint candidates, in this order, each once:
/// 1. the endpoint it announces ([`Member::endpoint`]);
/// 2. the endpoints other members' WireGuard learned for it from its packets (their reports
///    of a live session with it: where its packets come from, NAT-mapped), in address order,
///    each only when its address is vouched for ([`vouched`]): one node's report alone never
///    puts an address on other pairs' paths;
/// 3. the address its executor's stream reaches the controller from, at its announced port
///    (else the listen port).
///
/// A member whose Node carries the `kuport.wlz.li/external-endpoint` annotation has only the
/// endpoint it announces: the operator said where it is reached (a port forward, a 1:1 NAT), and
/// where other members see its packets come from is a NAT's choice per flow, never the
/// announced one. Rotating away from it would leave a pair that cannot reach it on a wrong
/// candidate for most of the time its direct path is probed (docs/overlay/status.md).
pub fn candidates(
    cluster: &Cluster,
    members: &BTreeMap<String, Member>,
    heard: &Heard,
    listen_port: u16,
) -> BTreeMap<String, Vec<SocketAddr>> {
    let nodes = node_index(cluster);
    members.iter().map(|(n, m)| (n.clone(), candidates_of(cluster, &nodes, heard, listen_port, n, m))).collect()
}

/// Every Node by name, for [`candidates_of`].
pub fn node_index(cluster: &Cluster) -> BTreeMap<&str, &Node> {
    cluster.nodes.iter().filter_map(|n| Some((n.metadata.name.as_deref()?, n))).collect()
}

/// Member `name`'s [`candidates`].
pub fn candidates_of(
    cluster: &Cluster,
    nodes: &BTreeMap<&str, &Node>,
    heard: &Heard,
    listen_port: u16,
    name: &str,
    m: &Member,
) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = m.endpoint.into_iter().collect();
    let node = nodes.get(name).copied();
    if m.endpoint.is_some() && node.is_some_and(announces) {
        return out;
    }
    let port = m.endpoint.map_or(listen_port, |e| e.port());
    let connect = cluster
        .overlay_observed
        .connect_addresses
        .get(name)
        .map(|ip| ip.to_canonical())
        .filter(|ip| usable(*ip))
        .map(|ip| SocketAddr::new(ip, port));
    let reports = heard.learned(name);
    // Each address once, with its distinct reporters: every member may report the same.
    let mut reporters: BTreeMap<IpAddr, BTreeSet<&str>> = BTreeMap::new();
    for (r, e) in reports.into_iter().flatten() {
        reporters.entry(e.ip()).or_default().insert(r.as_str());
    }
    let mut learned: Vec<SocketAddr> = reports.into_iter().flat_map(|r| r.values().copied()).collect();
    learned.sort();
    learned.dedup();
    learned.retain(|e| vouched(node, m, connect, reporters.get(&e.ip()).map_or(0, BTreeSet::len), e.ip()));
    for e in learned.into_iter().chain(connect) {
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// Whether an address another member observed member `name`'s packets come from may be one of
/// its candidates for every pair (docs/overlay/status.md, "Candidates"): it is an address the
/// member itself stands for (its announced endpoint's, its Node's `status.addresses`, which its
/// own kubelet writes), the address its executor's stream reaches the controller from
/// (`connect`, what the controller sees, not what a node says), or two or more distinct members
/// report it (`reporters`: how many distinct members do). A node's own report of a peer is what
/// its WireGuard holds, never rewritten here; so one compromised node cannot steer other pairs'
/// handshakes to an address of its choosing.
fn vouched(node: Option<&Node>, m: &Member, connect: Option<SocketAddr>, reporters: usize, ip: IpAddr) -> bool {
    let own = m.endpoint.iter().chain(connect.iter()).any(|e| e.ip() == ip)
        || node
            .into_iter()
            .flat_map(|n| n.status.iter().flat_map(|s| s.addresses.iter().flatten()))
            .any(|a| a.address.parse::<IpAddr>().is_ok_and(|a| a.to_canonical() == ip.to_canonical()));
    own || reporters >= 2
}

/// Whether a Node carries the external-endpoint annotation.
fn announces(node: &Node) -> bool {
    node.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(EXTERNAL_ENDPOINT_ANNOTATION))
}

/// Judges every Node (by name; input order does not matter).
pub fn judge(cluster: &Cluster, settings: &OverlaySettings) -> Judged {
    judge_and_hear(cluster, settings).0
}

/// [`judge`], with what the members' reports told ([`Heard`]).
pub fn judge_and_hear(cluster: &Cluster, settings: &OverlaySettings) -> (Judged, Heard) {
    let mut out = judge_members(cluster, settings);
    let mut heard = Heard::default();
    heard.hear(cluster, &out.members);
    out.candidates = candidates(cluster, &out.members, &heard, settings.listen_port);
    (out, heard)
}

/// The members and the refused nodes, without candidates: what reports tell is not read.
pub fn judge_members(cluster: &Cluster, settings: &OverlaySettings) -> Judged {
    let mut nodes: Vec<&Node> = cluster.nodes.iter().filter(|n| n.metadata.name.is_some()).collect();
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut keys: BTreeMap<&str, &KnownFacts> = BTreeMap::new();
    for f in &cluster.facts {
        keys.insert(&f.node, f);
    }
    let mut out = Judged::default();
    for node in nodes {
        let Some(name) = node.metadata.name.as_deref() else { continue };
        let mut why = Vec::new();
        let key = public_key(name, keys.get(name).copied(), cluster.refused_facts.get(name), &mut why);
        let pod_cidrs = pod_cidrs(name, node, &mut why);
        let endpoint = endpoint(name, node, settings.listen_port, &mut why);
        match (key, why.is_empty()) {
            (Some(public_key), true) => {
                let relay = super::relays::is_candidate(node.metadata.labels.as_ref());
                Arc::make_mut(&mut out.members)
                    .insert(name.to_string(), Member { public_key, pod_cidrs, endpoint, relay });
            }
            _ => {
                out.refused.insert(name.to_string(), why);
            }
        }
    }
    refuse_held(cluster, &mut out);
    refuse_clashes(&mut out);
    out
}

fn refuse(node: &str, field: impl Into<String>, reason: &'static str, message: String) -> Refusal {
    Refusal { node: node.to_string(), field: field.into(), reason, message }
}

/// The node's reported key, checked again: a folder's NodeFacts did not pass `facts::check`.
fn public_key(
    node: &str,
    facts: Option<&KnownFacts>,
    refused: Option<&facts::Refused>,
    why: &mut Vec<Refusal>,
) -> Option<String> {
    let reported = facts.and_then(|f| f.wireguard_public_key.as_deref());
    match reported {
        Some(k) => match facts::wireguard_key(k) {
            Ok(_) => return Some(k.to_string()),
            Err(m) => why.push(refuse(node, FIELD_KEY, reason::INVALID_PUBLIC_KEY, m)),
        },
        None => {
            // A refused report whose key was the problem says so; otherwise the key is awaited.
            let message = match refused {
                Some(r) if r.field == FIELD_KEY => format!("{REPORT_REFUSED}: {}", r.message),
                _ => "the node's executor has not reported a WireGuard public key yet".to_string(),
            };
            why.push(refuse(node, FIELD_KEY, reason::NO_PUBLIC_KEY, message));
        }
    }
    None
}

/// spec.podCIDRs (spec.podCIDR when only that is set), each canonical.
fn pod_cidrs(node: &str, n: &Node, why: &mut Vec<Refusal>) -> Vec<IpNet> {
    let spec = n.spec.as_ref();
    let listed: Vec<String> = match spec.and_then(|s| s.pod_cidrs.clone()).filter(|l| !l.is_empty()) {
        Some(l) => l,
        None => spec.and_then(|s| s.pod_cidr.clone()).filter(|c| !c.is_empty()).into_iter().collect(),
    };
    if listed.is_empty() {
        why.push(refuse(
            node,
            FIELD_POD_CIDRS,
            reason::NO_POD_CIDRS,
            "the Node has no pod CIDRs: the cluster's IPAM (kube-controller-manager --allocate-node-cidrs) assigns them"
                .into(),
        ));
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, c) in listed.iter().enumerate() {
        let field = format!("{FIELD_POD_CIDRS}[{i}]");
        match c.parse::<IpNet>() {
            Ok(net) if net.trunc() == net => out.push(net),
            // WireGuard refuses an allowed IP with host bits set, and the executor the state.
            Ok(net) => why.push(refuse(
                node,
                field,
                reason::INVALID_POD_CIDR,
                format!("{c:?} has host bits set (the prefix is {})", net.trunc()),
            )),
            Err(_) => why.push(refuse(node, field, reason::INVALID_POD_CIDR, format!("{c:?} is not a CIDR"))),
        }
    }
    out.sort();
    out.dedup();
    out
}

pub fn usable(ip: IpAddr) -> bool {
    !(ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || ip == IpAddr::from([255, 255, 255, 255]))
}

/// The endpoint the node announces: the annotation (IP, or IP:port), else its ExternalIP, else
/// its InternalIP (IPv4 first in each), at the listen port.
fn endpoint(node: &str, n: &Node, port: u16, why: &mut Vec<Refusal>) -> Option<SocketAddr> {
    if let Some(v) = n.metadata.annotations.as_ref().and_then(|a| a.get(EXTERNAL_ENDPOINT_ANNOTATION)) {
        let parsed = v.parse::<SocketAddr>().ok().or_else(|| v.parse::<IpAddr>().ok().map(|ip| (ip, port).into()));
        return match parsed {
            Some(e) if usable(e.ip()) && e.port() != 0 => Some(e),
            _ => {
                why.push(refuse(
                    node,
                    endpoint_field(),
                    reason::INVALID_ENDPOINT,
                    format!("{v:?} is not IP, IP:port or [IPv6]:port of a host (port 1 to 65535)"),
                ));
                None
            }
        };
    }
    let addresses: Vec<(&str, IpAddr)> = n
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter_map(|a| Some((a.type_.as_str(), a.address.parse::<IpAddr>().ok().filter(|ip| usable(*ip))?)))
        .collect();
    ["ExternalIP", "InternalIP"].into_iter().find_map(|t| {
        let of_type = || addresses.iter().filter(move |(ty, _)| *ty == t).map(|(_, ip)| *ip);
        of_type().find(IpAddr::is_ipv4).or_else(|| of_type().next()).map(|ip| SocketAddr::from((ip, port)))
    })
}

/// A member whose key another Node holds (that Node carries the key's [`KEY_HELD_LABEL`], which
/// the controller wrote when it joined the mesh with it, and no kubelet can write) is refused;
/// the holder keeps its place. So a node that reports another member's published key takes no
/// one out but itself (docs/overlay/mesh.md, "Who holds a key"). The label is an input like any
/// other: every replica and every new leader decides the same.
fn refuse_held(cluster: &Cluster, out: &mut Judged) {
    let mut held: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for n in &cluster.nodes {
        if let (Some(name), Some(tag)) =
            (n.metadata.name.as_deref(), n.metadata.labels.as_ref().and_then(|l| l.get(KEY_HELD_LABEL)))
        {
            held.entry(tag.as_str()).or_default().push(name);
        }
    }
    let mut refused = Vec::new();
    for (name, m) in out.members.iter() {
        let holders: Vec<&str> =
            held.get(key_tag(&m.public_key).as_str()).into_iter().flatten().copied().filter(|h| h != name).collect();
        if !holders.is_empty() {
            refused.push(refuse(
                name,
                FIELD_KEY,
                reason::PUBLIC_KEY_HELD,
                format!(
                    "node {} holds this public key (its label {KEY_HELD_LABEL}); this node is not in the mesh until its executor reports a key of its own",
                    holders.join(", ")
                ),
            ));
        }
    }
    for r in refused {
        Arc::make_mut(&mut out.members).remove(&r.node);
        out.refused.entry(r.node.clone()).or_default().push(r);
    }
}

/// Members that share a public key no Node holds, or whose pod CIDRs overlap, are refused,
/// each naming the others: a peer listed twice, or two peers claiming one prefix, would make
/// every node's state ambiguous. As with a clashing underlay (docs/security.md), none of them
/// is used.
fn refuse_clashes(out: &mut Judged) {
    let mut clashes: BTreeMap<String, Vec<Refusal>> = BTreeMap::new();
    let mut by_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, m) in out.members.iter() {
        by_key.entry(&m.public_key).or_default().push(name);
    }
    for names in by_key.values().filter(|n| n.len() > 1) {
        for n in names {
            let others: Vec<&str> = names.iter().filter(|o| *o != n).copied().collect();
            clashes.entry(n.to_string()).or_default().push(refuse(
                n,
                FIELD_KEY,
                reason::PUBLIC_KEY_CLASH,
                format!("node {} reports the same public key; none of them is in the mesh", others.join(", ")),
            ));
        }
    }
    for ((a, net_a), (b, net_b)) in overlaps(&out.members) {
        for (n, mine, other, theirs) in [(a, net_a, b, net_b), (b, net_b, a, net_a)] {
            clashes.entry(n.to_string()).or_default().push(refuse(
                n,
                FIELD_POD_CIDRS,
                reason::POD_CIDR_OVERLAP,
                format!("{mine} overlaps node {other}'s {theirs}; neither is in the mesh"),
            ));
        }
    }
    for (n, why) in clashes {
        Arc::make_mut(&mut out.members).remove(&n);
        out.refused.entry(n).or_default().extend(why);
    }
}

/// A pod CIDR and the node it is of.
type Owned<'a> = (&'a str, IpNet);

/// Every pair of members' overlapping pod CIDRs, each pair once. Prefixes either nest or are
/// disjoint, so one sweep in address order with a stack of the prefixes still open finds them
/// all (at 5,000 nodes a pairwise check would be 12.5 million comparisons).
fn overlaps(members: &BTreeMap<String, Member>) -> Vec<(Owned<'_>, Owned<'_>)> {
    let mut all: Vec<(IpNet, &str)> =
        members.iter().flat_map(|(n, m)| m.pod_cidrs.iter().map(move |c| (*c, n.as_str()))).collect();
    // Same start: the wider prefix first, so it is open when the narrower one comes.
    all.sort_by(|(a, na), (b, nb)| (a.network(), a.prefix_len(), na).cmp(&(b.network(), b.prefix_len(), nb)));
    let mut open: Vec<(IpNet, &str)> = Vec::new();
    let mut found = Vec::new();
    for (net, node) in all {
        open.retain(|(o, _)| o.contains(&net.network()));
        for (o, other) in &open {
            if *other != node {
                found.push(((*other, *o), (node, net)));
            }
        }
        open.push((net, node));
    }
    found
}

#[cfg(test)]
mod rotation_tests {
    use std::collections::BTreeMap;
    use std::net::SocketAddr;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::compute::{Settings, compute};
    use crate::observe::{Cluster, KnownFacts, ObservedPeer};

    const CLOUD: &str = "kOzLDlGv6e2AmDVfmJC7dRGCU8vMC9RcrxDBB4Y+uiM=";
    const HOME: &str = "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiU=";
    const VM: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    /// A multiple of 20 s: rotation slot 50,000,000.
    const T0: i64 = 1_000_000_000;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("timestamp")
    }

    fn ep(s: &str) -> SocketAddr {
        s.parse().expect("endpoint")
    }

    fn node(name: &str, addresses: &[(&str, &str)], pod_cidr: &str) -> Node {
        Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(NodeSpec { pod_cidrs: Some(vec![pod_cidr.into()]), ..Default::default() }),
            status: Some(NodeStatus {
                addresses: Some(
                    addresses.iter().map(|(t, a)| NodeAddress { type_: (*t).into(), address: (*a).into() }).collect(),
                ),
                ..Default::default()
            }),
        }
    }

    /// The sites: a cloud node with an ExternalIP, a home worker behind NAT with only
    /// its InternalIP, a VM with only a private InternalIP.
    fn sites(now: i64) -> Cluster {
        let facts = |n: &str, k: &str| KnownFacts {
            node: n.into(),
            wireguard_public_key: Some(k.into()),
            ..Default::default()
        };
        Cluster {
            nodes: vec![
                node("cloud", &[("InternalIP", "10.0.0.5"), ("ExternalIP", "203.0.113.7")], "10.42.0.0/24"),
                node("home", &[("InternalIP", "192.168.1.10")], "10.42.1.0/24"),
                node("vm", &[("InternalIP", "172.31.5.4")], "10.42.2.0/24"),
            ]
            .into(),
            facts: vec![facts("cloud", CLOUD), facts("home", HOME), facts("vm", VM)],
            now: at(now),
            ..Default::default()
        }
    }

    fn live(endpoint: &str, now: i64) -> ObservedPeer {
        ObservedPeer { endpoint: Some(ep(endpoint)), last_handshake: Some(at(now - 30)), ..Default::default() }
    }

    fn silent_peer(endpoint: Option<&str>) -> ObservedPeer {
        ObservedPeer { endpoint: endpoint.map(ep), last_handshake: None, ..Default::default() }
    }

    /// The endpoint `node`'s computed state gives the peer with `key`.
    fn endpoint(c: &Cluster, node: &str, key: &str) -> Option<SocketAddr> {
        let settings = Settings { overlay: Some(OverlaySettings::default()) };
        let out = compute(c, &settings);
        let state = out.node_states.get(node).expect("a state");
        let peer = state
            .netns
            .iter()
            .flat_map(|ns| &ns.wireguard_devices)
            .flat_map(|d| &d.peers)
            .find(|p| p.public_key == key)
            .expect("the peer");
        (!peer.endpoint.is_empty()).then(|| ep(&peer.endpoint))
    }

    #[test]
    fn candidates_are_the_announced_then_the_observed_then_the_connect_address_each_once() {
        let mut c = sites(T0);
        let o = &mut c.overlay_observed;
        // cloud and vm both see home's packets from its NAT's mappings; vm's silent view of
        // home is only what we set, not where packets come from.
        o.reports.insert("cloud".into(), Arc::new(BTreeMap::from([(HOME.into(), live("198.51.100.20:40002", T0))])));
        o.reports.insert(
            "vm".into(),
            Arc::new(BTreeMap::from([
                (HOME.into(), live("198.51.100.20:40001", T0)),
                (CLOUD.into(), live("203.0.113.7:51820", T0)),
            ])),
        );
        o.reports.insert("home".into(), Arc::new(BTreeMap::from([(VM.into(), silent_peer(Some("198.51.100.99:1")))])));
        o.connect_addresses.insert("home".into(), "::ffff:198.51.100.20".parse().expect("ip"));
        o.connect_addresses.insert("cloud".into(), "203.0.113.7".parse().expect("ip"));
        o.connect_addresses.insert("vm".into(), "127.0.0.1".parse().expect("ip"));
        let judged = judge(&c, &OverlaySettings::default());
        assert_eq!(
            judged.candidates["home"],
            [ep("192.168.1.10:51820"), ep("198.51.100.20:40001"), ep("198.51.100.20:40002"), ep("198.51.100.20:51820")]
        );
        assert_eq!(judged.candidates["cloud"], [ep("203.0.113.7:51820")], "deduplicated");
        assert_eq!(judged.candidates["vm"], [ep("172.31.5.4:51820")], "no silent view, no loopback");
    }

    #[test]
    fn a_member_with_an_external_endpoint_annotation_has_only_that_candidate() {
        let mut c = sites(T0);
        c.overlay_observed
            .reports
            .insert("cloud".into(), Arc::new(BTreeMap::from([(HOME.into(), live("198.51.100.20:40002", T0))])));
        c.overlay_observed.connect_addresses.insert("home".into(), "198.51.100.20".parse().expect("ip"));
        let home = c.nodes.iter_mut().find(|n| n.metadata.name.as_deref() == Some("home")).expect("home");
        home.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(EXTERNAL_ENDPOINT_ANNOTATION.into(), "198.51.100.20".into());
        let judged = judge(&c, &OverlaySettings::default());
        assert_eq!(judged.candidates["home"], [ep("198.51.100.20:51820")], "the forward the operator announced");
        // Silent toward home, vm does not rotate away from it.
        for dt in [0, 20, 40] {
            let mut c = c.clone();
            c.now = at(T0 + dt);
            c.overlay_observed
                .reports
                .insert("vm".into(), Arc::new(BTreeMap::from([(HOME.into(), silent_peer(None))])));
            assert_eq!(endpoint(&c, "vm", HOME), Some(ep("198.51.100.20:51820")), "at +{dt} s");
        }
    }

    #[test]
    fn a_silent_peer_rotates_through_its_candidates_every_20_s_and_cycles() {
        let at_time = |now: i64, handshake: Option<i64>| {
            let mut c = sites(now);
            let o = &mut c.overlay_observed;
            let home_sees_vm = ObservedPeer { endpoint: None, last_handshake: handshake.map(at), ..Default::default() };
            o.reports.insert("home".into(), Arc::new(BTreeMap::from([(VM.into(), home_sees_vm)])));
            // cloud sees vm's packets from its 1:1 NAT's public address, where vm's stream
            // reaches the controller from too (one node's observation alone is no candidate).
            o.reports.insert("cloud".into(), Arc::new(BTreeMap::from([(VM.into(), live("198.51.100.4:51820", now))])));
            o.connect_addresses.insert("vm".into(), "198.51.100.4".parse().expect("ip"));
            endpoint(&c, "home", VM)
        };
        let (a, b) = (Some(ep("172.31.5.4:51820")), Some(ep("198.51.100.4:51820")));
        // Slot 50,000,000 is even: the first candidate, then the next, then the first again.
        assert_eq!(at_time(T0, None), a);
        assert_eq!(at_time(T0 + 19, None), a, "within one period it stays");
        assert_eq!(at_time(T0 + 20, None), b);
        assert_eq!(at_time(T0 + 40, None), a);
        // A handshake 180 s ago is as silent as none; 179 s ago it is live and not rotated.
        assert_eq!(at_time(T0 + 20, Some(T0 + 20 - 180)), b);
        assert_eq!(at_time(T0 + 20, Some(T0 + 20 - 179)), a, "live, no last state, no endpoint held: the first");
        // cloud's live peer vm, with no report of home: the announced endpoint.
        let c = sites(T0 + 20);
        assert_eq!(endpoint(&c, "cloud", VM), a);
    }

    #[test]
    fn a_live_peer_keeps_what_its_last_state_said() {
        for now in [T0, T0 + 20, T0 + 40] {
            let mut c = sites(now);
            let o = &mut c.overlay_observed;
            o.reports.insert("home".into(), Arc::new(BTreeMap::from([(CLOUD.into(), live("203.0.113.7:51820", now))])));
            o.reports.insert("vm".into(), Arc::new(BTreeMap::from([(CLOUD.into(), live("203.0.113.70:4000", now))])));
            o.last_endpoints.insert("home".into(), Arc::new(BTreeMap::from([(CLOUD.into(), ep("203.0.113.70:4000"))])));
            assert_eq!(endpoint(&c, "home", CLOUD), Some(ep("203.0.113.70:4000")), "at {now}");
            // No last state (a new leader): what WireGuard holds.
            c.overlay_observed.last_endpoints.clear();
            assert_eq!(endpoint(&c, "home", CLOUD), Some(ep("203.0.113.7:51820")), "at {now}");
        }
    }

    /// Issue 25, finding 6: home (compromised) reports a live session with vm at its own
    /// address. cloud is silent toward vm and rotates through vm's candidates: never onto
    /// home's address. What one node observes becomes a candidate for every pair only when the
    /// address is vm's own (its Node's, or where its stream reaches the controller from), or a
    /// second node observes it too.
    #[test]
    fn one_nodes_observed_endpoint_never_puts_its_address_on_another_pairs_path() {
        let attacked = |now: i64| {
            let mut c = sites(now);
            let o = &mut c.overlay_observed;
            o.reports.insert("home".into(), Arc::new(BTreeMap::from([(VM.into(), live("198.51.100.20:40000", now))])));
            o.reports.insert("cloud".into(), Arc::new(BTreeMap::from([(VM.into(), silent_peer(None))])));
            o.connect_addresses.insert("home".into(), "198.51.100.20".parse().expect("ip"));
            c
        };
        for slot in 0..6 {
            let now = T0 + slot * ROTATE_EVERY_SECONDS;
            let got = endpoint(&attacked(now), "cloud", VM);
            assert_eq!(got, Some(ep("172.31.5.4:51820")), "at +{} s", slot * ROTATE_EVERY_SECONDS);
        }
        let judged = judge(&attacked(T0), &OverlaySettings::default());
        assert_eq!(judged.candidates["vm"], [ep("172.31.5.4:51820")]);
        // The real use: vm's 1:1 NAT maps it to 198.51.100.4, where its stream reaches the
        // controller from; a mapping another node observes there is a candidate.
        let mut c = attacked(T0);
        c.overlay_observed.connect_addresses.insert("vm".into(), "198.51.100.4".parse().expect("ip"));
        Arc::make_mut(c.overlay_observed.reports.get_mut("home").expect("home"))
            .insert(VM.into(), live("198.51.100.4:40001", T0));
        let judged = judge(&c, &OverlaySettings::default());
        assert_eq!(
            judged.candidates["vm"],
            [ep("172.31.5.4:51820"), ep("198.51.100.4:40001"), ep("198.51.100.4:51820")]
        );
        // Or two nodes observe the same address.
        let mut c = attacked(T0);
        c.overlay_observed
            .reports
            .insert("cloud".into(), Arc::new(BTreeMap::from([(VM.into(), live("198.51.100.20:40002", T0))])));
        let judged = judge(&c, &OverlaySettings::default());
        assert_eq!(
            judged.candidates["vm"],
            [ep("172.31.5.4:51820"), ep("198.51.100.20:40000"), ep("198.51.100.20:40002")]
        );
    }

    #[test]
    fn rotation_with_no_candidate_is_none_and_slots_are_euclidean() {
        assert_eq!(rotation(&[], at(T0)), None);
        let two = [ep("192.0.2.1:1"), ep("192.0.2.2:1")];
        assert_eq!(rotation(&two, at(-20)), Some(two[1]), "before 1970 too");
        assert_eq!(rotation(&two, at(-1)), Some(two[1]));
        assert_eq!(rotation(&two, at(0)), Some(two[0]));
    }
}
