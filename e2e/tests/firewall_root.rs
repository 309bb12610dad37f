//! Port maps behind a host firewall (docs/portmap/firewall.md). On every node, the accepting
//! node edge-a and the pods' nodes worker-1 and worker-2, the test installs, with `nft -f` in
//! its namespace, a Talos-like firewall (a filter chain at prerouting -110 that drops new
//! connections to the node's own addresses unless allowed) and a netbird-like mark (a filter
//! chain at mangle, -150, marking packets by `fib daddr type local`). kuport's steering chain
//! rewrites, at -120 between the two, the published destination on edge-a and, on a pod's node,
//! this end of the link the request arrives over, each to a stand-in. Proven: clients still reach
//! the pods with their own address and get the reply from the dialed one, TCP and UDP, for pods
//! on another node and on edge-a, and netbird's rule still counts the requests on every node.
//! Ablations: without the steering chain on the pods' nodes their firewalls drop the requests
//! that crossed the link, and without it on edge-a edge-a's drops them all; with the chain at
//! -160, before netbird, netbird no longer counts them.
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1. Each lab is removed on drop.

mod common;
use common::*;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use kuport_controller::compute::portmap::steer::{CHAIN_STEER, STAND_IN_NET, STEER_PRIORITY};
use kuport_lab::Protocol::{self, Tcp, Udp};
use kuport_lab::program::{apply, compute};
use kuport_lab::topology::{Protocol as P, ServicePortSpec};
use kuport_lab::{Lab, Manifests, Topology};
use kuport_proto::owned::{MAP_LINK_PORT, MAP_LINK_RANGE};
use kuport_proto::v1::{NodeState, nft_value};

/// Talos-like: new connections to the node's own addresses are dropped unless allowed (ssh,
/// the API server, and kuport's link port 4790, which a Talos user allows as they allow the
/// CNI's VXLAN port). Named counters so the test can read them.
const TALOS: &str = r#"
table ip talos {
	counter dropped { }
	chain ingress {
		type filter hook prerouting priority -110; policy accept;
		iifname "lo" accept
		ct state { established, related } accept
		fib daddr type local tcp dport { 22, 6443 } accept
		fib daddr type local udp dport 4790 accept
		ct state new fib daddr type local counter name "dropped" drop
	}
}
"#;

/// netbird-like: packets addressed to the node are marked at mangle priority. Scoped to the
/// lab's clients (198.51.100.0/24) so that the counter counts the probes and nothing else
/// (the links' own VXLAN packets are addressed to the node too). On a pod's node the requests
/// that crossed the link still come from the client, addressed to this end of the link.
const NETBIRD: &str = r#"
table ip netbird {
	counter marked { }
	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		ip saddr 198.51.100.0/24 fib daddr type local counter name "marked" meta mark set 0x1bd00
	}
}
"#;

const EDGE: &str = "edge-a";
/// The pods' nodes that the requests reach over kuport's links.
const POD_NODES: [&str; 2] = ["worker-1", "worker-2"];
const NODES: [&str; 3] = [EDGE, POD_NODES[0], POD_NODES[1]];
const SHORT: Duration = Duration::from_millis(500);

/// The mappings: web-0 on edge-a itself (TCP and UDP 3000), echo-0 on worker-1 (TCP and UDP
/// 8080) and the game range to game-0 on worker-2.
fn mappings() -> Manifests {
    with_classes(
        &(port_map("web", "web", "public", "TCP", "3000", "web", "http")
            + &port_map("web", "web-udp", "public", "UDP", "3000", "web", "udp")
            + &port_map("apps", "echo-tcp", "public", "TCP", "8080", "echo", "tcp")
            + &port_map("apps", "echo-udp", "public", "UDP", "8080", "echo", "udp")
            + &port_map("games", "game", "public", "UDP", "27015-27115", "game", "game")),
    )
}

/// (address, protocol, pod, the pod's node) of every probe.
const PROBES: [(&str, Protocol, &str, &str); 5] = [
    ("203.0.113.9:3000", Tcp, "web-0", EDGE),
    ("203.0.113.9:3000", Udp, "web-0", EDGE),
    ("203.0.113.9:8080", Tcp, "echo-0", "worker-1"),
    ("203.0.113.9:8080", Udp, "echo-0", "worker-1"),
    ("203.0.113.9:27015", Udp, "game-0", "worker-2"),
];
const CLIENTS: [&str; 2] = ["client-1", "client-2"];

/// The addresses in the keys of a pod node's link maps: the stand-ins the steering chain writes.
fn link_keys(states: &mut BTreeMap<String, std::sync::Arc<NodeState>>, node: &str) -> Vec<Ipv4Addr> {
    let t = kuport_table(host_state(states, node));
    t.sets
        .iter()
        .filter(|s| s.name == MAP_LINK_PORT || s.name == MAP_LINK_RANGE)
        .flat_map(|s| &s.elements)
        .flat_map(|e| &e.key)
        .filter_map(|v| match &v.value {
            Some(nft_value::Value::Addr(a)) => a.parse().ok(),
            _ => None,
        })
        .collect()
}

/// The default lab with web-0 answering UDP 3000 too, programmed, the firewall and the mark on
/// every node; the computed states.
fn firewalled_lab() -> (Lab, BTreeMap<String, std::sync::Arc<NodeState>>) {
    let mut t = Topology::default_lab();
    let web = t.pods.iter_mut().find(|p| p.name == "web-0").expect("web-0");
    web.udp.push("3000".parse().expect("a port"));
    let svc = t.services.iter_mut().find(|s| s.name == "web").expect("the web Service");
    svc.ports.push(ServicePortSpec { name: "udp".into(), protocol: P::Udp, port: 3000, target_port: None });
    let mut lab = Lab::up(&t).expect("the lab builds");
    let out = compute(&mut lab, &mappings());
    for (ns, name) in
        [("web", "web"), ("web", "web-udp"), ("apps", "echo-tcp"), ("apps", "echo-udp"), ("games", "game")]
    {
        let why = message(&out, ns, name, "Programmed");
        assert_eq!(condition(&out, ns, name, "Programmed").0, "True", "{ns}/{name}: {why}");
    }
    let mut states = out.node_states;
    for node in NODES {
        let t = kuport_table(host_state(&mut states, node));
        let steer = t.chains.iter().find(|c| c.name == CHAIN_STEER).expect("every node steers");
        assert_eq!(steer.base.as_ref().map(|b| b.priority), Some(STEER_PRIORITY), "{node}");
    }
    for node in POD_NODES {
        let keys = link_keys(&mut states, node);
        assert!(!keys.is_empty(), "{node} translates link arrivals");
        for a in keys {
            assert_eq!(a.octets()[..3], STAND_IN_NET, "{node}: the link maps are keyed by a stand-in, not {a}");
        }
    }
    apply(&mut lab, &states).expect("the full state applies");
    for node in NODES {
        for (name, text) in [("talos", TALOS), ("netbird", NETBIRD)] {
            let file = std::env::temp_dir().join(format!("kuport-firewall-{}-{node}-{name}.nft", lab.id()));
            std::fs::write(&file, text).expect("write the table");
            lab.exec(node, &["nft", "-f", &file.to_string_lossy()]).expect("nft -f");
            let _ = std::fs::remove_file(&file);
        }
    }
    (lab, states)
}

/// A named counter's packets in `node`'s table `table`.
fn packets(lab: &Lab, node: &str, table: &str, counter: &str) -> u64 {
    let out = lab.exec(node, &["nft", "list", "counter", "ip", table, counter]).expect("nft list counter");
    out.split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{node}: no packet count in {out}"))
}

/// One counter on every node.
fn counts(lab: &Lab, table: &str, counter: &str) -> BTreeMap<&'static str, u64> {
    NODES.iter().map(|n| (*n, packets(lab, n, table, counter))).collect()
}

/// Every probe from both clients maps intact; how many probes reached each node: all of them
/// edge-a, and each pod's node its pod's.
fn all_map(lab: &Lab) -> BTreeMap<&'static str, u64> {
    let mut n: BTreeMap<&str, u64> = NODES.iter().map(|n| (*n, 0)).collect();
    for client in CLIENTS {
        for (to, proto, pod, node) in PROBES {
            assert_maps(lab, client, to, proto, pod);
            *n.entry(EDGE).or_default() += 1;
            if node != EDGE {
                *n.entry(node).or_default() += 1;
            }
        }
    }
    n
}

/// The full state with the steering chain changed on `nodes`: removed (None) or moved.
fn steering_on(
    full: &BTreeMap<String, std::sync::Arc<NodeState>>,
    nodes: &[&str],
    priority: Option<i32>,
) -> BTreeMap<String, std::sync::Arc<NodeState>> {
    let mut states = full.clone();
    for node in nodes {
        let t = kuport_table(host_state(&mut states, node));
        match priority {
            None => t.chains.retain(|c| c.name != CHAIN_STEER),
            Some(p) => {
                let steer = t.chains.iter_mut().find(|c| c.name == CHAIN_STEER).expect("the steering chain");
                if let Some(b) = steer.base.as_mut() {
                    b.priority = p;
                }
            }
        }
    }
    states
}

#[test]
fn clients_get_past_a_host_firewall_and_netbird_still_marks() {
    if !root() {
        return;
    }
    let (lab, _) = firewalled_lab();
    let (dropped, marked) = (counts(&lab, "talos", "dropped"), counts(&lab, "netbird", "marked"));
    let probes = all_map(&lab);
    let (dropped2, marked2) = (counts(&lab, "talos", "dropped"), counts(&lab, "netbird", "marked"));
    for node in NODES {
        println!(
            "{node}: {} probes: talos dropped {} -> {}, netbird marked {} -> {}",
            probes[node], dropped[node], dropped2[node], marked[node], marked2[node]
        );
        assert_eq!(dropped2[node], dropped[node], "{node}: the firewall dropped none of the requests");
        assert!(
            marked2[node] - marked[node] >= probes[node],
            "{node}: netbird's rule saw every request addressed to it"
        );
    }
}

#[test]
fn without_steering_the_firewall_drops_and_before_netbird_it_hides_the_node() {
    if !root() {
        return;
    }
    let (mut lab, full) = firewalled_lab();
    all_map(&lab);

    // Without the steering chain on the pods' nodes: edge-a still delivers web-0's requests,
    // but each pod node's firewall sees the requests that crossed the link addressed to this
    // end of it, and drops them.
    apply(&mut lab, &steering_on(&full, &POD_NODES, None)).expect("the ablated state applies");
    let dropped = counts(&lab, "talos", "dropped");
    for client in CLIENTS {
        for (to, proto, pod, node) in PROBES {
            if node == EDGE {
                assert_maps(&lab, client, to, proto, pod);
                continue;
            }
            let r = lab.probe_with(client, addr(to), proto, SHORT);
            println!("without steering on {node}: {client} -> {to}/{proto}: {r:?}");
            assert!(r.is_err(), "{client} -> {to}/{proto} got past {node}'s firewall: {r:?}");
        }
    }
    let dropped2 = counts(&lab, "talos", "dropped");
    for node in NODES {
        println!("without steering on the pods' nodes: {node}: talos dropped {} -> {}", dropped[node], dropped2[node]);
    }
    assert_eq!(dropped2[EDGE], dropped[EDGE], "edge-a, which steers, dropped nothing");
    for node in POD_NODES {
        assert!(dropped2[node] > dropped[node], "{node}'s drop counter rose");
    }

    // Without the steering chain on edge-a: its firewall sees requests to the node and drops them.
    apply(&mut lab, &steering_on(&full, &[EDGE], None)).expect("the ablated state applies");
    let dropped = packets(&lab, EDGE, "talos", "dropped");
    for client in CLIENTS {
        for (to, proto, _, _) in PROBES {
            let r = lab.probe_with(client, addr(to), proto, SHORT);
            println!("without steering on edge-a: {client} -> {to}/{proto}: {r:?}");
            assert!(r.is_err(), "{client} -> {to}/{proto} got past the firewall: {r:?}");
        }
    }
    let dropped2 = packets(&lab, EDGE, "talos", "dropped");
    println!("edge-a: talos dropped {dropped} -> {dropped2}");
    assert!(dropped2 > dropped, "edge-a's drop counter rose");

    // The steering chain before netbird's mark (-160) on every node: the clients still get
    // through, but netbird no longer sees the requests as addressed to the node.
    apply(&mut lab, &steering_on(&full, &NODES, Some(-160))).expect("the early chain applies");
    let marked = counts(&lab, "netbird", "marked");
    all_map(&lab);
    let marked2 = counts(&lab, "netbird", "marked");
    for node in NODES {
        println!("steering at -160: {node}: netbird marked {} -> {}", marked[node], marked2[node]);
        assert_eq!(marked2[node], marked[node], "{node}: netbird's rule never saw a request addressed to the node");
    }

    // The full state again: netbird counts again.
    apply(&mut lab, &full).expect("the full state applies again");
    let marked = counts(&lab, "netbird", "marked");
    let n = all_map(&lab);
    let marked2 = counts(&lab, "netbird", "marked");
    for node in NODES {
        assert!(marked2[node] - marked[node] >= n[node], "{node}: netbird counts again");
    }
}
