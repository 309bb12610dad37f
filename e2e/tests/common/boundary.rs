//! Boundaries of the datapath (docs/portmap/datapath.md): the rules as they were before they
//! were held to what a mapping publishes, rebuilt on a computed state so that a test shows the
//! attack getting through them; a lab with a pod whose UDP socket the test owns; and a pod's
//! forged VXLAN packet.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

use kuport_lab::program::compute;
use kuport_lab::sys::in_netns;
use kuport_lab::topology::{Cni, PodSpec, Protocol as P, ServicePortSpec, ServiceSpec};
use kuport_lab::{Lab, Topology};
use kuport_proto::v1::{NetnsState, NftMatch, NodeState, Selector, nat, nft_match, nft_statement, set_mark};

use super::{host_state, kuport_table, port_map, with_classes};

/// Removes field `at` of set `set`'s key, from the set, its elements and every lookup of it;
/// and, when `ct_direction`, the `ct direction` match of the rules that read it.
fn drop_key_field(ns: &mut NetnsState, set: &str, at: usize, ct_direction: bool) {
    let t = kuport_table(ns);
    let Some(s) = t.sets.iter_mut().find(|s| s.name == set) else { return };
    s.key.remove(at);
    let mut seen = BTreeSet::new();
    s.elements.retain_mut(|e| {
        e.key.remove(at);
        seen.insert(format!("{:?}", e.key))
    });
    (s.runs, s.digest) = kuport_proto::canonical::element_runs(&s.elements);
    for rule in t.chains.iter_mut().flat_map(|c| c.rules.iter_mut()) {
        let mut reads = false;
        for st in &mut rule.statements {
            let map = match &mut st.kind {
                Some(nft_statement::Kind::Nat(n)) => match &mut n.to {
                    Some(nat::To::Map(m)) => Some(m),
                    _ => None,
                },
                Some(nft_statement::Kind::MetaMarkSet(m) | nft_statement::Kind::CtMarkSet(m)) => match &mut m.from {
                    Some(set_mark::From::Map(m)) => Some(m),
                    _ => None,
                },
                _ => None,
            };
            if let Some(m) = map.filter(|m| m.map == set) {
                m.key.remove(at);
                reads = true;
            }
        }
        if reads && ct_direction {
            rule.matches.retain(|m: &NftMatch| {
                !matches!(&m.kind, Some(nft_match::Kind::Compare(c)) if c.selector == Selector::CtDirection as i32)
            });
        }
    }
}

/// The publish maps as they were before issue 25: keyed by the arrival interface, protocol and
/// port, not by the destination, so a packet routed through the node on a published port was
/// translated too.
pub fn publish_maps_of_any_destination(ns: &mut NetnsState) {
    for (set, at) in [("publish_port", 1), ("publish_range", 2), ("publish_port6", 1), ("publish_range6", 2)] {
        drop_key_field(ns, set, at, false);
    }
}

/// The return mark as it was before issue 25: any packet from the pod's address and port, in
/// any direction and of any connection.
pub fn return_mark_on_any_packet(ns: &mut NetnsState) {
    for (set, at) in
        [("return_mark_port", 0), ("return_mark_range", 1), ("return_mark_port6", 0), ("return_mark_range6", 1)]
    {
        drop_key_field(ns, set, at, true);
    }
}

/// The counter of `chain`'s `drop` rule on `node`, as `nft` lists it.
pub fn drop_counter(lab: &Lab, node: &str, chain: &str) -> u64 {
    let out = lab.exec(node, &["nft", "list", "chain", "inet", "kuport", chain]).expect("nft lists the chain");
    let line = out.lines().find(|l| l.trim_end().ends_with("drop")).unwrap_or_else(|| panic!("no drop rule in {out}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    let i = w.iter().position(|w| *w == "packets").unwrap_or_else(|| panic!("no counter in {line}"));
    w[i + 1].parse().expect("a number")
}

/// The packets counted by the elements of map `map` on `node`, together.
pub fn element_packets(lab: &Lab, node: &str, map: &str) -> u64 {
    let out = lab.exec(node, &["nft", "list", "map", "inet", "kuport", map]).expect("nft lists the map");
    packets_listed(&out)
}

/// The packets counted by the elements of set `set` on `node`, together; none where `node`
/// has no such set (a family or kind of mapping it does not publish).
pub fn set_packets(lab: &Lab, node: &str, set: &str) -> u64 {
    lab.exec(node, &["nft", "list", "set", "inet", "kuport", set]).map(|out| packets_listed(&out)).unwrap_or(0)
}

/// The sum of every `packets N` counter in an nft listing.
fn packets_listed(out: &str) -> u64 {
    let w: Vec<&str> = out.split_whitespace().collect();
    w.windows(2).filter(|p| p[0] == "packets").map(|p| p[1].trim_end_matches(',').parse::<u64>().unwrap_or(0)).sum()
}

/// `node`'s kuport table as the kernel lists it (`nft -s`) is the computed table's canonical text:
/// the codec encoded each rule as nft would.
pub fn assert_lists_as_computed(lab: &Lab, states: &mut BTreeMap<String, std::sync::Arc<NodeState>>, node: &str) {
    let listed = lab.exec(node, &["nft", "-s", "list", "table", "inet", "kuport"]).expect("nft lists the table");
    let computed = kuport_proto::text::nft_table(kuport_table(host_state(states, node)));
    assert_eq!(listed, computed, "{node}: the kernel lists the table as computed");
}

/// The port push-0 (on worker-2, 10.244.2.70) listens on, published on edge-a: no echo server
/// owns it, the test does.
pub const PUSH: &str = "203.0.113.9:7000";

/// The default lab on `cni` with push-0 on worker-2, whose UDP 7000 edge-a publishes (so over
/// the link); its computed states, not applied yet.
pub fn push_lab(cni: Cni) -> (Lab, BTreeMap<String, std::sync::Arc<NodeState>>) {
    let mut t = Topology::default_lab().with_cni(cni);
    t.pods.push(PodSpec {
        name: "push-0".into(),
        namespace: "apps".into(),
        node: "worker-2".into(),
        labels: [("app".to_string(), "push".to_string())].into(),
        address: "10.244.2.70".parse().unwrap(),
        ready: true,
        tcp: vec![],
        udp: vec![],
    });
    t.services.push(ServiceSpec {
        name: "push".into(),
        namespace: "apps".into(),
        selector: [("app".to_string(), "push".to_string())].into(),
        ports: vec![ServicePortSpec { name: "push".into(), protocol: P::Udp, port: 7000, target_port: None }],
    });
    let mut lab = Lab::up(&t).expect("builds");
    let m = with_classes(&port_map("apps", "push", "public", "UDP", "7000", "push", "push"));
    let out = compute(&mut lab, &m);
    (lab, out.node_states)
}

/// A UDP socket in `host`'s namespace on `bind`, reading for at most `wait`.
pub fn socket(lab: &Lab, host: &str, bind: &str, wait: Duration) -> UdpSocket {
    let s = in_netns(&lab.netns(host).unwrap(), || UdpSocket::bind(bind)).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s
}

/// What `s` receives next: the payload and its source, or None within its timeout.
pub fn receive(s: &UdpSocket) -> Option<(String, String)> {
    let mut buf = [0u8; 256];
    s.recv_from(&mut buf).ok().map(|(n, from)| (String::from_utf8_lossy(&buf[..n]).into_owned(), from.to_string()))
}

/// A pod (or any host of the lab) that sends VXLAN packets of its own into `node`'s link: a
/// VXLAN device in its namespace with the link's VNI and port, aimed at `node`'s underlay, with
/// the far end's link address, `node`'s end resolved to `node`'s device MAC, and a forged
/// source address.
pub struct Forger {
    ns: PathBuf,
    /// `node`'s end of the link.
    pub link_end: Ipv4Addr,
    forged: Ipv4Addr,
}

impl Forger {
    pub fn new(
        lab: &Lab,
        states: &mut BTreeMap<String, std::sync::Arc<NodeState>>,
        node: &str,
        attacker: &str,
        forged: Ipv4Addr,
    ) -> Forger {
        let ns = host_state(states, node).clone();
        let link = ns.links.iter().find(|l| l.name.starts_with("kup-")).expect("a link on the node");
        let Some(kuport_proto::v1::link::Kind::Vxlan(v)) = &link.kind else { panic!("a VXLAN link") };
        let cidr = ns.addresses.iter().find(|a| a.dev == link.name && !a.cidr.contains(':')).expect("the link's /31");
        let link_end: Ipv4Addr = cidr.cidr.split('/').next().unwrap().parse().unwrap();
        let peer = ns.neighbours.iter().find(|n| n.dev == link.name && !n.address.contains(':')).expect("the far end");
        // No IPv6 on the device: its neighbour discovery would go to `node` too.
        let lines = [
            format!("link add kupatk type vxlan id {} dstport {} remote {}", v.vni, v.dstport, v.local),
            "link set kupatk addrgenmode none".to_string(),
            "link set kupatk up".to_string(),
            format!("addr add {}/31 dev kupatk", peer.address),
            format!("addr add {forged}/32 dev kupatk"),
            format!("neigh replace {link_end} lladdr {} dev kupatk nud permanent", link.mac),
        ];
        for l in lines {
            let args: Vec<&str> = l.split_whitespace().collect();
            lab.ip(attacker, &args).unwrap_or_else(|e| panic!("{attacker}: ip {l}: {e:#}"));
        }
        Forger { ns: lab.netns(attacker).unwrap(), link_end, forged }
    }

    /// Sends one datagram from the forged address into the link, to `to`: its inner
    /// destination; one outside the link's /31 is routed to `node`'s end.
    pub fn send(&self, lab: &Lab, attacker: &str, to: SocketAddrV4, payload: &[u8]) {
        if !to.ip().is_link_local() {
            let _ =
                lab.ip(attacker, &["route", "replace", &format!("{}/32", to.ip()), "via", &self.link_end.to_string()]);
        }
        let forged = self.forged;
        in_netns(&self.ns, || UdpSocket::bind(SocketAddrV4::new(forged, 0))?.send_to(payload, to))
            .unwrap_or_else(|e| panic!("the forged datagram to {to} goes out: {e}"));
    }
}
