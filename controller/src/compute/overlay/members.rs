//! Who is in the mesh: every Node with a valid public key, pod CIDRs that overlap no other
//! member's, and an endpoint that parses. Everything else is refused with the node, the field
//! and why; a refused node is no one's peer and has no device, and the rest of the mesh is
//! computed as if it did not exist (docs/overlay/mesh.md, "Refusals").

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use super::{EXTERNAL_ENDPOINT_ANNOTATION, OverlaySettings, Refusal, reason};
use crate::observe::facts;
use crate::observe::{Cluster, KnownFacts};

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
}

/// What [`judge`] decides, per node name.
#[derive(Debug, Default)]
pub struct Judged {
    pub members: BTreeMap<String, Member>,
    /// Every node with a Node object that is not a member, with why (at least one reason).
    pub refused: BTreeMap<String, Vec<Refusal>>,
}

/// Judges every Node (by name; input order does not matter).
pub fn judge(cluster: &Cluster, settings: &OverlaySettings) -> Judged {
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
                out.members.insert(name.to_string(), Member { public_key, pod_cidrs, endpoint });
            }
            _ => {
                out.refused.insert(name.to_string(), why);
            }
        }
    }
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

fn usable(ip: IpAddr) -> bool {
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

/// Members that share a public key, or whose pod CIDRs overlap, are refused, each naming the
/// others: a peer listed twice, or two peers claiming one prefix, would make every node's state
/// ambiguous. As with a clashing underlay (docs/security.md), none of them is used.
fn refuse_clashes(out: &mut Judged) {
    let mut clashes: BTreeMap<String, Vec<Refusal>> = BTreeMap::new();
    let mut by_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, m) in &out.members {
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
        out.members.remove(&n);
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
