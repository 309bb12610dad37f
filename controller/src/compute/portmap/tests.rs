//! Table-driven tests of every condition reason and of the serving-mode and return-path table
//! (docs/portmap/modes.md), and property tests of order independence and link numbering
//! (docs/portmap/links.md).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kuport_proto::v1::{NodeState, link};
use proptest::prelude::*;

use super::status::{self, reason};
use super::*;
use crate::api::*;
use crate::compute::Outputs;
use crate::compute::numbers::{self, Rule};
use crate::compute::testkit::{World, now};

/// Three ready nodes with underlays, the usual base.
fn base() -> World {
    World::new().node("edge-a", "100.64.93.143", true).node("worker-b", "100.64.0.2", true).node(
        "worker-c",
        "100.64.0.3",
        true,
    )
}

fn cond<'a>(out: &'a Outputs, name: &str, type_: &str) -> (&'a str, &'a str, &'a str) {
    let st = out.port_maps.iter().find(|((_, n), _)| n == name).map(|(_, s)| s).expect("status exists");
    let c = st.conditions.iter().find(|c| c.type_ == type_).expect("condition exists");
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

fn links_on(out: &Outputs, node: &str) -> usize {
    out.node_states.get(node).map(|s| s.netns.iter().map(|n| n.links.len()).sum()).unwrap_or(0)
}

const PUBLIC: &[(&str, &[&str])] = &[("edge-a", &["enp1s0"])];
const ALL3: &[(&str, &[&str])] = &[("edge-a", &["wt0"]), ("worker-b", &["wt0"]), ("worker-c", &["wt0"])];
use Protocol::{Tcp, Udp};
use ReturnPathMode::{None as NoPath, Vxlan};
use ServingMode::{Multi, Single};

#[test]
fn accepted_reasons() {
    let app = |w: World| w.service("ns", "svc", "TCP", 3000, &[("pod", "edge-a", "10.244.0.7", true)]);
    let w = || app(base().class("public", Single, Vxlan, PUBLIC));
    let cases: Vec<(&str, World, &str, &str)> = vec![
        (
            "class missing",
            w().port_map("ns", "m", "nope", Tcp, 3000, None, "svc", 0),
            reason::CLASS_NOT_FOUND,
            "spec.className",
        ),
        (
            "end below port",
            w().port_map("ns", "m", "public", Tcp, 3000, Some(2999), "svc", 0),
            reason::INVALID_PORT_RANGE,
            "spec.endPort",
        ),
        (
            "port zero",
            w().port_map("ns", "m", "public", Tcp, 0, None, "svc", 0),
            reason::INVALID_PORT_RANGE,
            "spec.port",
        ),
        (
            "namespace not selected",
            w().namespace("ns", &[("team", "b")])
                .edit_class("public", |s| {
                    s.namespace_selector = Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([("team".into(), "a".into())])),
                        ..Default::default()
                    })
                })
                .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0),
            reason::NAMESPACE_NOT_SELECTED,
            "namespaceSelector",
        ),
        (
            "outside range",
            w().edit_class("public", |s| s.ports.min = 1024).port_map(
                "ns",
                "m",
                "public",
                Tcp,
                1000,
                Some(1100),
                "svc",
                0,
            ),
            reason::PORT_OUTSIDE_CLASS_RANGE,
            "1000-1100",
        ),
        (
            "reserved",
            w().edit_class("public", |s| (s.ports.min, s.ports.reserved) = (1, vec![443])).port_map(
                "ns",
                "m",
                "public",
                Tcp,
                400,
                Some(500),
                "svc",
                0,
            ),
            reason::RESERVED_PORT,
            "443",
        ),
        (
            "over a VXLAN port",
            w().port_map("ns", "m", "public", Udp, 4700, Some(4800), "svc", 0),
            reason::RESERVED_PORT,
            "4790",
        ),
        (
            "interface not in class",
            w().port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0)
                .edit_map("m", |s| s.interfaces = Some(vec!["eth9".into()])),
            reason::INTERFACE_NOT_IN_CLASS,
            "eth9",
        ),
        (
            "same class overlap",
            w().port_map("ns", "old", "public", Tcp, 2990, Some(3010), "svc", 0)
                .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 5),
            reason::PORT_CONFLICT,
            "ns/old",
        ),
        (
            "other class, same interface",
            w().class("second", Single, Vxlan, PUBLIC)
                .port_map("ns", "old", "second", Tcp, 3000, None, "svc", 0)
                .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 5),
            reason::PORT_CONFLICT,
            "edge-a interface enp1s0",
        ),
    ];
    for (name, world, want, field) in cases {
        let out = world.run();
        let (status, got, message) = cond(&out, "m", status::ACCEPTED);
        assert_eq!((status, got), ("False", want), "{name}: {message}");
        assert!(message.contains(field), "{name}: {message:?} should name {field:?}");
        assert_eq!(cond(&out, "m", status::PROGRAMMED).1, reason::NOT_ACCEPTED, "{name}");
    }
}

#[test]
fn conflict_loser_is_refused_and_winner_untouched() {
    let w = base()
        .class("public", Single, Vxlan, PUBLIC)
        .service("ns", "svc", "UDP", 27015, &[("pod", "edge-a", "10.244.0.7", true)])
        .port_map("ns", "young", "public", Udp, 27050, None, "svc", 10)
        .port_map("ns", "old", "public", Udp, 27015, Some(27115), "svc", 0);
    let out = w.run();
    assert_eq!(cond(&out, "old", status::PROGRAMMED).0, "True");
    assert_eq!(cond(&out, "young", status::ACCEPTED).1, reason::PORT_CONFLICT);
    // Same age: namespace/name decides.
    let out = base()
        .class("public", Single, Vxlan, PUBLIC)
        .service("ns", "svc", "TCP", 3000, &[("pod", "edge-a", "10.244.0.7", true)])
        .port_map("ns", "b", "public", Tcp, 3000, None, "svc", 0)
        .port_map("ns", "a", "public", Tcp, 3000, None, "svc", 0)
        .run();
    assert_eq!(cond(&out, "a", status::PROGRAMMED).0, "True");
    assert_eq!(cond(&out, "b", status::ACCEPTED).1, reason::PORT_CONFLICT);
}

#[test]
fn programmed_reasons() {
    let mk = || base().class("public", Single, Vxlan, PUBLIC);
    let m = |w: World| w.port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0);
    let cases: Vec<(&str, World, &str, &str)> = vec![
        ("no service", m(mk()), reason::NO_READY_ENDPOINT, "does not exist"),
        (
            "no ready endpoint",
            m(mk().service("ns", "svc", "TCP", 3000, &[("pod", "edge-a", "10.244.0.7", false)])),
            reason::NO_READY_ENDPOINT,
            "no ready endpoint",
        ),
        (
            "no such named port",
            m(mk().service("ns", "svc", "TCP", 3000, &[("pod", "edge-a", "10.244.0.7", true)]))
                .edit_map("m", |s| s.service_ref.port = Some("nope".into())),
            reason::NO_READY_ENDPOINT,
            "no port named",
        ),
        (
            "protocol mismatch",
            m(mk().service("ns", "svc", "UDP", 3000, &[("pod", "edge-a", "10.244.0.7", true)])),
            reason::NO_READY_ENDPOINT,
            "spec.protocol",
        ),
        (
            "node not ready",
            m(World::new()
                .node("edge-a", "100.64.93.143", false)
                .node("worker-b", "100.64.0.2", true)
                .class("public", Single, Vxlan, PUBLIC)
                .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])),
            reason::NODE_NOT_READY,
            "edge-a",
        ),
        (
            "no interface on node",
            m(mk().facts("edge-a", 1500, &[("eth0", "192.0.2.1")]).service(
                "ns",
                "svc",
                "TCP",
                3000,
                &[("pod", "edge-a", "10.244.0.7", true)],
            )),
            reason::NO_INTERFACE_ON_NODE,
            "enp1s0",
        ),
        (
            "None with a remote pod",
            m(base().class("public", Single, NoPath, PUBLIC).service(
                "ns",
                "svc",
                "TCP",
                3000,
                &[("pod", "worker-b", "10.244.1.7", true)],
            )),
            reason::RETURN_PATH_UNAVAILABLE,
            "mode None",
        ),
        (
            "subnet exhausted",
            m(mk().edit_class("public", |s| s.return_path.vxlan.subnet = "169.254.77.0/31".into()).service(
                "ns",
                "svc",
                "TCP",
                3000,
                &[("pod", "worker-b", "10.244.1.7", true)],
            )),
            reason::RETURN_PATH_UNAVAILABLE,
            "",
        ),
        (
            "no underlay address",
            m(World::new()
                .node("edge-a", "not-an-ip", true)
                .node("worker-b", "100.64.0.2", true)
                .class("public", Single, Vxlan, PUBLIC)
                .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])),
            reason::RETURN_PATH_UNAVAILABLE,
            "underlay",
        ),
    ];
    for (name, world, want, text) in cases {
        let out = world.run();
        let (status, got, message) = cond(&out, "m", status::PROGRAMMED);
        assert_eq!((status, got), ("False", want), "{name}: {message}");
        assert!(message.contains(text), "{name}: {message:?} should contain {text:?}");
        assert_eq!(cond(&out, "m", status::ACCEPTED).0, "True", "{name}");
        // A refused mapping programs nothing anywhere.
        assert!(out.node_states.values().all(|s| s.netns.iter().all(|n| n.nft_tables.is_empty())), "{name}");
    }
}

#[test]
fn one_pod_port_returns_one_way() {
    // Two Single classes publish one pod port from different serving nodes: the reply mark
    // would be ambiguous, so the younger mapping is refused.
    let out = base()
        .class("a", Single, Vxlan, &[("edge-a", &["enp1s0"])])
        .class("b", Single, Vxlan, &[("worker-c", &["enp1s0"])])
        .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])
        .port_map("ns", "first", "a", Tcp, 3000, None, "svc", 0)
        .port_map("ns", "m", "b", Tcp, 4000, None, "svc", 1)
        .run();
    assert_eq!(cond(&out, "first", status::PROGRAMMED).0, "True");
    let (_, r, msg) = cond(&out, "m", status::PROGRAMMED);
    assert_eq!(r, reason::RETURN_PATH_UNAVAILABLE, "{msg}");
    assert!(msg.contains("ns/first"));
}

/// docs/portmap/modes.md's table: servingMode x where the pod sits x returnPath.mode.
#[test]
fn serving_mode_and_return_path_table() {
    struct Row {
        name: &'static str,
        mode: ServingMode,
        nodes: &'static [(&'static str, &'static [&'static str])],
        pod_node: &'static str,
        vxlan: (bool, &'static [&'static str], usize),
        none: (bool, &'static [&'static str], usize),
    }
    const ONE: &[(&str, &[&str])] = &[("edge-a", &["wt0"])];
    let rows = [
        Row {
            name: "Single, pod on the serving node",
            mode: Single,
            nodes: PUBLIC,
            pod_node: "edge-a",
            vxlan: (true, &["edge-a"], 0),
            none: (true, &["edge-a"], 0),
        },
        Row {
            name: "Single, pod outside the accepting nodes",
            mode: Single,
            nodes: PUBLIC,
            pod_node: "worker-b",
            vxlan: (true, &["edge-a"], 1),
            none: (false, &[], 0),
        },
        Row {
            name: "Single, several accepting, pod on one",
            mode: Single,
            nodes: ALL3,
            pod_node: "worker-c",
            vxlan: (true, &["worker-c"], 0),
            none: (true, &["worker-c"], 0),
        },
        Row {
            name: "Multi, one accepting node, pod on it",
            mode: Multi,
            nodes: ONE,
            pod_node: "edge-a",
            vxlan: (true, &["edge-a"], 0),
            none: (true, &["edge-a"], 0),
        },
        Row {
            name: "Multi, several accepting, pod on one",
            mode: Multi,
            nodes: ALL3,
            pod_node: "worker-b",
            vxlan: (true, &["edge-a", "worker-b", "worker-c"], 2),
            none: (false, &[], 0),
        },
        Row {
            name: "Multi, one accepting, pod elsewhere",
            mode: Multi,
            nodes: ONE,
            pod_node: "worker-b",
            vxlan: (true, &["edge-a"], 1),
            none: (false, &[], 0),
        },
    ];
    for row in rows {
        for (rp, (programmed, nodes, links)) in [(Vxlan, row.vxlan), (NoPath, row.none)] {
            let out = base()
                .class("c", row.mode, rp, row.nodes)
                .service("ns", "svc", "TCP", 3000, &[("pod", row.pod_node, "10.244.9.9", true)])
                .port_map("ns", "m", "c", Tcp, 3000, None, "svc", 0)
                .run();
            let label = format!("{} / {rp:?}", row.name);
            let (status, r, msg) = cond(&out, "m", status::PROGRAMMED);
            assert_eq!(status == "True", programmed, "{label}: {r} {msg}");
            let prog: Vec<&str> = out.programming.values().flatten().map(String::as_str).collect();
            assert_eq!(prog, nodes.to_vec(), "{label}");
            assert_eq!(links_on(&out, row.pod_node), links, "{label}: links on the pod's node");
            if !programmed {
                assert_eq!(r, reason::RETURN_PATH_UNAVAILABLE, "{label}");
            }
        }
    }
}

#[test]
fn single_prefers_the_pods_node_and_follows_the_pod() {
    let w = |pod_node: &str| {
        base()
            .class("c", Single, Vxlan, ALL3)
            .service("ns", "svc", "TCP", 3000, &[("pod", pod_node, "10.244.9.9", true)])
            .port_map("ns", "m", "c", Tcp, 3000, None, "svc", 0)
            .run()
    };
    assert_eq!(w("worker-b").programming.values().next().cloned(), Some(vec!["worker-b".to_string()]));
    assert_eq!(w("worker-c").programming.values().next().cloned(), Some(vec!["worker-c".to_string()]));
}

#[test]
fn endpoint_choice_prefers_accepting_nodes_then_names() {
    let out = base()
        .class("public", Single, Vxlan, PUBLIC)
        .service(
            "ns",
            "svc",
            "TCP",
            3000,
            &[
                ("pod-z", "worker-b", "10.244.1.1", true),
                ("pod-b", "edge-a", "10.244.0.2", true),
                ("pod-a", "edge-a", "10.244.0.1", true),
            ],
        )
        .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0)
        .run();
    let st = &out.port_maps[&("ns".to_string(), "m".to_string())];
    assert_eq!(st.endpoint.as_ref().map(|e| e.address.as_str()), Some("10.244.0.1"));
}

#[test]
fn link_mtu_is_the_smaller_underlay_less_50() {
    let w = base()
        .class("public", Single, Vxlan, PUBLIC)
        .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])
        .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0)
        .facts("edge-a", 1420, &[("enp1s0", "203.0.113.9")]);
    let mtu = |out: &Outputs, n: &str| out.node_states[n].netns[0].links[0].mtu;
    // worker-b has not reported: edge-a keeps its own figure, and worker-b, knowing nothing of
    // its own underlay, takes edge-a's smaller one.
    let out = w.run();
    assert_eq!((mtu(&out, "edge-a"), mtu(&out, "worker-b")), (1370, 1370));
    let out = w.facts("worker-b", 1380, &[]).run();
    assert_eq!((mtu(&out, "edge-a"), mtu(&out, "worker-b")), (1330, 1330));
}

#[test]
fn slots_are_released_a_day_after_last_use() {
    let w = base()
        .class("public", Single, Vxlan, PUBLIC)
        .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])
        .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0);
    let first = w.run();
    let rows = first.classes["public"].links.clone();
    assert_eq!(rows.len(), 1);
    let mut w = w;
    w.c.classes[0].status = Some(first.classes["public"].clone());
    w.c.port_maps.clear();
    let unused = w.run();
    let since = unused.classes["public"].links[0].unused_since.clone();
    assert_eq!(since.as_ref().map(|t| t.0), Some(now()));
    assert_eq!(links_on(&unused, "edge-a"), 0, "an unused link is not kept on the node");
    w.c.classes[0].status = Some(unused.classes["public"].clone());
    w.c.now = Timestamp::from_second(now().as_second() + links::RELEASE_AFTER_SECONDS - 1).unwrap_or(now());
    assert_eq!(w.run().classes["public"].links.len(), 1);
    w.c.now = Timestamp::from_second(now().as_second() + links::RELEASE_AFTER_SECONDS).unwrap_or(now());
    assert!(w.run().classes["public"].links.is_empty());
}

#[test]
fn unchanged_inputs_keep_condition_times() {
    let mut w = base()
        .class("public", Single, Vxlan, PUBLIC)
        .service("ns", "svc", "TCP", 3000, &[("pod", "edge-a", "10.244.0.7", true)])
        .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0);
    let first = w.run();
    w.c.port_maps[0].status = first.port_maps.values().next().cloned();
    w.c.now = Timestamp::from_second(now().as_second() + 60).unwrap_or(now());
    assert_eq!(w.run().port_maps, first.port_maps);
}

#[test]
fn class_conditions() {
    let ready = |w: World| {
        let out = w.run();
        let c = out.classes["c"].conditions[0].clone();
        (c.status, c.reason)
    };
    let w = || base().class("c", Single, Vxlan, PUBLIC);
    assert_eq!(ready(w()), ("True".into(), reason::READY.into()));
    // The CNI's VXLAN port as a node reports it bounds only that node's links: the class stays
    // Ready, and the node's row says why no link ends there (issue 25, finding 6).
    assert_eq!(ready(w().edit_class("c", |s| s.return_path.vxlan.port = 8472)).1, reason::READY);
    for node in ["edge-a", "worker-c"] {
        let conflict = w().vxlan_ports(node, &[4789, 8472]).edit_class("c", |s| s.return_path.vxlan.port = 8472);
        let out = conflict.run();
        let c = &out.classes["c"].conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", reason::READY));
        if let Some(row) = out.classes["c"].nodes.iter().find(|r| r.name == node) {
            assert!(row.message.contains(reason::VXLAN_PORT_CONFLICT) && row.message.contains("8472"), "{row:?}");
        }
    }
    assert_eq!(ready(w().edit_class("c", |s| s.return_path.vxlan.port = 0)).1, reason::VXLAN_PORT_CONFLICT);
    assert_eq!(
        ready(w().edit_class("c", |s| s.return_path.vxlan.subnet = "fd00::/64".into())).1,
        reason::INVALID_SUBNET
    );
    assert_eq!(
        ready(w().edit_class("c", |s| s.return_path.vxlan.subnet = "169.254.0.0/31".into())).1,
        reason::INVALID_SUBNET
    );
    for stand_ins in ["169.254.76.0/25", "169.254.0.0/16"] {
        assert_eq!(
            ready(w().edit_class("c", |s| s.return_path.vxlan.subnet = stand_ins.into())).1,
            reason::INVALID_SUBNET,
            "{stand_ins} overlaps the stand-ins' network"
        );
    }
    let exhausted = w()
        .edit_class("c", |s| s.return_path.vxlan.subnet = "169.254.77.0/30".into())
        .class("d", Single, Vxlan, &[("worker-c", &["wt0"])])
        .edit_class("d", |s| s.return_path.vxlan.subnet = "169.254.77.0/30".into())
        .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])
        .service("ns", "svc2", "TCP", 4000, &[("pod2", "edge-a", "10.244.0.8", true)])
        .port_map("ns", "m", "c", Tcp, 3000, None, "svc", 0)
        .port_map("ns", "m2", "d", Tcp, 4000, None, "svc2", 0);
    // c (edge-a<->worker-b) takes slot 1 of its /30; d (worker-c<->edge-a) cannot reuse slot 1
    // on edge-a and its /30 has no slot 2.
    let out = exhausted.run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).0, "True");
    assert_eq!(cond(&out, "m2", status::PROGRAMMED).1, reason::RETURN_PATH_UNAVAILABLE);
    assert_eq!(out.classes["d"].conditions[0].reason, reason::SUBNET_EXHAUSTED);
}

/// The request-claim elements of `node`'s state: (device, destination) of `claim_port` and
/// `claim_range`.
fn claims_on(out: &Outputs, node: &str) -> Vec<(String, String)> {
    use kuport_proto::v1::nft_value::Value;
    let Some(state) = out.node_states.get(node) else { return Vec::new() };
    let mut got = Vec::new();
    for set in state.netns.iter().flat_map(|n| &n.nft_tables).flat_map(|t| &t.sets) {
        if set.name != datapath::SET_CLAIM_PORT && set.name != datapath::SET_CLAIM_RANGE {
            continue;
        }
        for e in &set.elements {
            let mut dev = None;
            let mut dst = None;
            for v in e.key.iter().filter_map(|v| v.value.as_ref()) {
                match v {
                    Value::Ifname(i) => dev = Some(i.clone()),
                    Value::Addr(a) => dst = Some(a.clone()),
                    _ => {}
                }
            }
            got.push((dev.unwrap_or_default(), dst.unwrap_or_default()));
        }
    }
    got.sort();
    got
}

#[test]
fn the_claim_names_the_device_of_the_longest_route_to_the_pod() {
    let remote = |w: World| {
        w.class("c", Single, Vxlan, PUBLIC)
            .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])
            .port_map("ns", "m", "c", Tcp, 3000, None, "svc", 0)
    };
    let claim = |dev: &str| (dev.to_string(), "10.244.1.7".to_string());
    // Cilium: the pod network through cilium_host (the testkit's default route).
    let out = remote(base()).run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).0, "True");
    assert_eq!(claims_on(&out, "worker-b"), [claim("cilium_host")]);
    // A bridge: the node's pod CIDR on cni0, the cluster's elsewhere.
    let bridge = remote(base().routes("worker-b", &[("10.244.0.0/16", "flannel.1"), ("10.244.1.0/24", "cni0")]));
    assert_eq!(claims_on(&bridge.run(), "worker-b"), [claim("cni0")]);
    // Calico: a /32 per pod on its own veth wins over the pool's block.
    let calico = remote(base().routes(
        "worker-b",
        &[("10.244.1.0/26", "vxlan.calico"), ("10.244.1.7/32", "cali1b2c3d4e5f6"), ("10.244.1.8/32", "cali0")],
    ));
    let out = calico.run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).0, "True");
    assert_eq!(claims_on(&out, "worker-b"), [claim("cali1b2c3d4e5f6")]);
    // A pod on the accepting node is claimed on that node's route in the same way.
    let local = base()
        .routes("edge-a", &[("10.244.0.7/32", "cali77")])
        .class("c", Single, Vxlan, PUBLIC)
        .service("ns", "svc", "TCP", 3000, &[("pod", "edge-a", "10.244.0.7", true)])
        .port_map("ns", "m", "c", Tcp, 3000, None, "svc", 0);
    assert_eq!(claims_on(&local.run(), "edge-a"), [("cali77".to_string(), "10.244.0.7".to_string())]);
}

#[test]
fn an_unknown_pod_route_leaves_only_the_claim_out_and_says_so() {
    let remote = |w: World| {
        w.class("c", Single, Vxlan, PUBLIC)
            .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])
            .port_map("ns", "m", "c", Tcp, 3000, None, "svc", 0)
    };
    let full = remote(base()).run();
    // Routes reported, none containing the pod.
    let out = remote(base().routes("worker-b", &[("10.244.9.0/24", "cni0")])).run();
    let (status, reason, message) = cond(&out, "m", status::PROGRAMMED);
    assert_eq!((status, reason), ("False", reason::POD_ROUTE_UNKNOWN));
    assert!(message.contains("node worker-b") && message.contains("10.244.1.7"), "{message}");
    assert_eq!(claims_on(&out, "worker-b"), []);
    // Everything else stays, so traffic that works keeps working: the same state but the claim.
    assert_eq!(out.node_states["edge-a"], full.node_states["edge-a"]);
    assert_eq!(links_on(&out, "worker-b"), links_on(&full, "worker-b"));
    let sets = |o: &Outputs| -> Vec<String> {
        o.node_states["worker-b"]
            .netns
            .iter()
            .flat_map(|n| &n.nft_tables)
            .flat_map(|t| &t.sets)
            .map(|s| s.name.clone())
            .collect()
    };
    let mut want = sets(&full);
    want.retain(|s| s != datapath::SET_CLAIM_PORT);
    assert_eq!(sets(&out), want);
    // No routes reported at all (the executor's first report not in yet): the same state, and
    // the mapping waits for the node like any other (Pending until it acknowledges); its report
    // brings the claim.
    let mut w = remote(base());
    w.no_default_routes = true;
    let out = w.run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).0, "True");
    assert_eq!(claims_on(&out, "worker-b"), []);
    assert_eq!(out.node_states["edge-a"], full.node_states["edge-a"]);
    assert!(out.tracked.values().any(|t| t.nodes.contains(&"worker-b".to_string())));
    // A host-network pod (the node's own address) leaves by no device: nothing to claim, and
    // nothing missing.
    let mut w = base()
        .facts("worker-b", 1500, &[("eth0", "100.64.0.2")])
        .class("c", Single, Vxlan, PUBLIC)
        .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "100.64.0.2", true)])
        .port_map("ns", "m", "c", Tcp, 3000, None, "svc", 0);
    w.no_default_routes = true;
    let out = w.run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).0, "True");
    assert_eq!(claims_on(&out, "worker-b"), []);
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

const NODES: [&str; 5] = ["edge-a", "worker-b", "worker-c", "worker-d", "worker-e"];

#[derive(Clone, Debug)]
struct Gen {
    classes: Vec<(bool, Vec<usize>, u32)>,
    maps: Vec<(usize, bool, u16, u16, usize)>,
}

fn gen_world() -> impl Strategy<Value = Gen> {
    let class = (any::<bool>(), proptest::collection::vec(0usize..5, 1..4), 0u32..3);
    let map = (0usize..3, any::<bool>(), 1000u16..1040, 0u16..4, 0usize..5);
    (proptest::collection::vec(class, 1..4), proptest::collection::vec(map, 0..14))
        .prop_map(|(classes, maps)| Gen { classes, maps })
}

fn build(g: &Gen) -> World {
    let mut w = World::new();
    for (i, n) in NODES.iter().enumerate() {
        w = w.node(n, &format!("100.64.0.{}", i + 1), true);
    }
    for (ci, (multi, nodes, subnet)) in g.classes.iter().enumerate() {
        let nodes: BTreeSet<usize> = nodes.iter().copied().collect();
        let ns: Vec<(&str, &[&str])> = nodes.iter().map(|i| (NODES[*i], &["wt0"][..])).collect();
        w = w.class(&format!("c{ci}"), if *multi { Multi } else { Single }, Vxlan, &ns);
        // Classes sharing one subnet and VNI base must still never collide on a node.
        let s = *subnet;
        w = w.edit_class(&format!("c{ci}"), |spec| {
            spec.return_path.vxlan.subnet = format!("169.254.{}.0/24", 77 + s);
            spec.return_path.vxlan.subnet6 = format!("fd64:f5ac:e961:{s}::/112");
            spec.return_path.vxlan.vni = 4200 + 5 * s;
        });
    }
    for (mi, (class, udp, port, width, pod_node)) in g.maps.iter().enumerate() {
        let class = class % g.classes.len();
        let svc = format!("s{mi}");
        let proto = if *udp { "UDP" } else { "TCP" };
        w = w.service(
            "ns",
            &svc,
            proto,
            i32::from(*port),
            &[("pod", NODES[*pod_node], &format!("10.244.{pod_node}.{}", mi + 1), true)],
        );
        let end = (*width > 0).then_some(port + width);
        w = w.port_map(
            "ns",
            &format!("m{mi}"),
            &format!("c{class}"),
            if *udp { Udp } else { Tcp },
            *port,
            end,
            &svc,
            mi as i64,
        );
    }
    w
}

fn check_unique_links(state: &NodeState) -> Result<(), TestCaseError> {
    for ns in &state.netns {
        let mut names = BTreeSet::new();
        let mut vnis = BTreeSet::new();
        let mut addrs = BTreeSet::new();
        for l in &ns.links {
            prop_assert!(names.insert(l.name.clone()), "device {} twice on {}", l.name, state.node);
            if let Some(link::Kind::Vxlan(v)) = &l.kind {
                prop_assert!(vnis.insert(v.vni), "VNI {} twice on {}", v.vni, state.node);
            }
        }
        for a in &ns.addresses {
            // Both families: each link's /31 and /127 are its own on the node.
            let net: ipnet::IpNet = a.cidr.parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert!(addrs.insert(net.trunc()), "{} twice on {}", net, state.node);
        }
        // One route per table and family: an IPv6 route's `via` (or `dst`) holds a colon.
        let mut tables = BTreeSet::new();
        for r in &ns.routes {
            let v6 = r.via.contains(':') || r.dst.contains(':');
            prop_assert!(tables.insert((r.table, v6)), "table {} twice on {}", r.table, state.node);
            prop_assert!(!numbers::RESERVED_TABLES.contains(&r.table));
        }
        let mut marks = BTreeSet::new();
        for r in ns.ip_rules.iter().filter(|r| r.pref == Rule::Divert.preference()) {
            prop_assert!(marks.insert((r.fwmark, r.ipv6)), "mark {:#x} twice on {}", r.fwmark, state.node);
            prop_assert!(
                r.fwmark & numbers::MARK_PREFIX_MASK == numbers::MARK_PREFIX && r.fwmark != numbers::MARK_PREFIX
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn input_order_does_not_matter(g in gen_world()) {
        let w = build(&g);
        let mut r = w.clone();
        r.c.nodes.reverse();
        r.c.classes.reverse();
        r.c.port_maps.reverse();
        r.c.services.reverse();
        r.c.endpoint_slices.reverse();
        prop_assert_eq!(w.run(), r.run());
    }

    #[test]
    fn links_never_collide_on_a_node(g in gen_world()) {
        let out = build(&g).run();
        for state in out.node_states.values() {
            check_unique_links(state)?;
        }
    }

    #[test]
    fn existing_slots_survive_added_mappings(g in gen_world(), extra in (0usize..3, 1100u16..1200, 0usize..5)) {
        let mut w = build(&g);
        let first = w.run();
        for c in &mut w.c.classes {
            let name = c.metadata.name.clone().unwrap_or_default();
            c.status = first.classes.get(&name).cloned();
        }
        let (class, port, node) = extra;
        let class = class % g.classes.len();
        let w = w
            .service("ns", "extra", "TCP", i32::from(port), &[("pod", NODES[node], "10.244.99.1", true)])
            .port_map("ns", "extra", &format!("c{class}"), Tcp, port, None, "extra", 1000);
        let second = w.run();
        for (class, st) in first.classes.iter() {
            for row in &st.links {
                let kept = second.classes[class].links.iter().find(|r| r.pair == row.pair);
                prop_assert_eq!(
                    kept.map(|r| (r.slot, r.subnet.clone(), r.subnet6.clone())),
                    Some((row.slot, row.subnet.clone(), row.subnet6.clone()))
                );
            }
        }
        for state in second.node_states.values() {
            check_unique_links(state)?;
        }
    }
}

#[test]
fn only_routes_that_contain_a_local_endpoint_recompute() {
    use crate::observe::KnownRoute;
    let w = base().class("c", Single, Vxlan, PUBLIC).service(
        "ns",
        "svc",
        "TCP",
        3000,
        &[("pod", "worker-b", "10.244.1.7", true)],
    );
    let facts = |routes: &[(&str, &str)]| crate::observe::KnownFacts {
        node: "worker-b".into(),
        routes: Some(routes.iter().map(|(d, v)| KnownRoute { dst: (*d).into(), dev: (*v).into() }).collect()),
        ..Default::default()
    };
    let read = |f| crate::compute::relevant_facts(Some(&w.c), &f);
    // Another pod's /32 coming: nothing the computation reads changed.
    let before = facts(&[("10.244.1.0/24", "cni0")]);
    let other = facts(&[("10.244.1.0/24", "cni0"), ("10.244.1.9/32", "cali9")]);
    assert_eq!(read(before.clone()), read(other));
    // The endpoint's own /32: it did.
    let own = facts(&[("10.244.1.0/24", "cni0"), ("10.244.1.7/32", "cali7")]);
    assert_ne!(read(before), read(own));
}

// ---------------------------------------------------------------------------------------------
// Dual-stack: subnet6, the /127s, the pod's IPv6 address (docs/portmap/links.md)
// ---------------------------------------------------------------------------------------------

#[test]
fn subnet6_refusals_name_the_field_the_value_and_why() {
    let w = || base().class("c", Single, Vxlan, PUBLIC);
    let ready = |w: World| {
        let c = w.run().classes["c"].conditions[0].clone();
        (c.status, c.reason, c.message)
    };
    assert_eq!(ready(w()).1, reason::READY, "the default subnet6 is accepted");
    let cases: [(&str, &str, &str); 5] = [
        ("169.254.77.0/24", "169.254.77.0/24", "not an IPv6 prefix"),
        ("fd64:f5ac:e961::", "fd64:f5ac:e961::", "not an IPv6 prefix"),
        // The default /24 holds 128 /31s; a /121 only 64 /127s.
        ("fd64:f5ac:e961::/121", "fd64:f5ac:e961::/121", "fewer /127s"),
        ("fd6b:7570::1:0/112", "fd6b:7570::1:0/112", "overlaps fd6b:7570::/96"),
        ("fd6b:7570::/64", "fd6b:7570::/64", "overlaps fd6b:7570::/96"),
    ];
    for (subnet6, shown, why) in cases {
        let (status, r, message) = ready(w().edit_class("c", |s| s.return_path.vxlan.subnet6 = subnet6.into()));
        assert_eq!((status.as_str(), r.as_str()), ("False", reason::INVALID_SUBNET), "{subnet6}: {message}");
        for part in ["spec.returnPath.vxlan.subnet6", shown, why] {
            assert!(message.contains(part), "{subnet6}: {message:?} should contain {part:?}");
        }
    }
    // Exactly as many /127s as /31s is enough, whatever the IPv4 prefix.
    for (subnet, subnet6) in [("169.254.77.0/24", "fd64:f5ac:e961::/120"), ("169.254.77.0/30", "fd64::/126")] {
        let edit = |s: &mut PortMapClassSpec| {
            s.return_path.vxlan.subnet = subnet.into();
            s.return_path.vxlan.subnet6 = subnet6.into();
        };
        assert_eq!(ready(w().edit_class("c", edit)).1, reason::READY, "{subnet} {subnet6}");
    }
}

/// A world where edge-a publishes and pods sit on worker-b, worker-c and a fourth node, so
/// edge-a's links take slots 1, 2 and 3.
fn three_links() -> World {
    let mut w = base().node("worker-d", "100.64.0.4", true).class("c", Multi, Vxlan, PUBLIC);
    for (i, node) in ["worker-b", "worker-c", "worker-d"].into_iter().enumerate() {
        let svc = format!("s{i}");
        let port = 3000 + i as u16;
        w = w
            .service(
                "ns",
                &svc,
                "TCP",
                i32::from(port),
                &[(&format!("pod{i}"), node, &format!("10.244.{}.7", i + 1), true)],
            )
            .port_map("ns", &format!("m{i}"), "c", Tcp, port, None, &svc, i as i64);
    }
    w
}

#[test]
fn slot_s_takes_the_127_at_subnet6_plus_2s_like_its_31() {
    let w = three_links().edit_class("c", |s| s.return_path.vxlan.subnet6 = "fd64:f5ac:e961::100/112".into());
    let out = w.run();
    let rows = &out.classes["c"].links;
    assert_eq!(rows.iter().map(|r| r.slot).collect::<Vec<_>>(), [1, 2, 3]);
    for r in rows {
        // The spec's host bits are dropped, as for subnet.
        assert_eq!(r.subnet, format!("169.254.77.{}/31", 2 * r.slot), "{r:?}");
        assert_eq!(r.subnet6, format!("fd64:f5ac:e961::{}/127", 2 * r.slot), "{r:?}");
    }
    // The numbers each end computes: the pair's first node takes the low address of both.
    let class = &w.c.classes[0];
    let cluster = w.cluster();
    let indexes = crate::observe::index::Indexes::of(&cluster);
    let view = crate::observe::index::View::new(&cluster, &indexes);
    let v = links::class_vxlan(class, &view).expect("class is valid");
    assert_eq!(v.subnet6.to_string(), "fd64:f5ac:e961::/112");
    for slot in 1..=3u32 {
        let net6 = links::slot_net6(v.subnet6, slot).expect("in the subnet");
        let n = links::LinkNumbers {
            slot,
            vni: v.vni + slot,
            port: v.port,
            net: format!("169.254.77.{}/31", 2 * slot).parse().expect("prefix"),
            net6,
        };
        let key = links::LinkKey::new("c", "worker-b", "edge-a");
        assert_eq!(n.address6_of(&key, "edge-a").to_string(), format!("fd64:f5ac:e961::{}", 2 * slot));
        assert_eq!(n.address6_of(&key, "worker-b").to_string(), format!("fd64:f5ac:e961::{}", 2 * slot + 1));
        assert_eq!(n.address_of(&key, "edge-a").to_string(), format!("169.254.77.{}", 2 * slot));
    }
    assert_eq!(links::slot_net6("fd64::/126".parse().expect("prefix"), 2), None, "past the subnet's end");
}

#[test]
fn a_row_without_subnet6_takes_its_slots_127_and_keeps_it() {
    let mut w = three_links();
    let first = w.run();
    let mut old = first.classes["c"].clone();
    for r in &mut old.links {
        r.subnet6.clear();
    }
    let text = serde_json::to_string(&old.links[0]).expect("json");
    assert!(!text.contains("subnet6"), "an empty subnet6 is not written: {text}");
    w.c.classes[0].status = Some(old);
    let second = w.run();
    assert_eq!(second.classes["c"].links, first.classes["c"].links);
    // A later change of the spec's subnet6 moves no existing link.
    w.c.classes[0].status = Some(first.classes["c"].clone());
    w.c.classes[0].spec.return_path.vxlan.subnet6 = "fd64:1::/112".into();
    assert_eq!(w.run().classes["c"].links, first.classes["c"].links);
}

/// The chosen endpoint of mapping `m`, straight from placement.
fn endpoint_of(w: &World) -> Option<placement::Endpoint> {
    let cluster = w.cluster();
    let indexes = crate::observe::index::Indexes::of(&cluster);
    let view = crate::observe::index::View::new(&cluster, &indexes);
    admission::admit(&view, &cluster.port_maps)
        .0
        .into_iter()
        .filter(|((_, n), ..)| n == "m")
        .find_map(|(_, _, a)| placement::choose_endpoint(&view, &a.ok()?).ok())
}

#[test]
fn the_pods_ipv6_address_is_the_same_pod_in_the_ipv6_slice() {
    let v4 = &[("pod-a", "edge-a", "10.244.0.1", true), ("pod-b", "edge-a", "10.244.0.2", true)];
    let w = || {
        base()
            .class("public", Single, Vxlan, PUBLIC)
            .service("ns", "svc", "TCP", 3000, v4)
            .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0)
    };
    let six = |w: World| endpoint_of(&w).map(|e| (e.pod, e.address6.map(|a| a.to_string())));
    // pod-a is chosen over IPv4; its IPv6 twin is found by targetRef, not by order or node.
    let found = w().slice6(
        "ns",
        "svc",
        "v6",
        "TCP",
        3000,
        &[("pod-b", "edge-a", "fd00:10:244::2", true), ("pod-a", "edge-a", "fd00:10:244::1", true)],
    );
    assert_eq!(six(found), Some(("pod-a".into(), Some("fd00:10:244::1".into()))));
    // No IPv6 slice: IPv4 only, as before.
    assert_eq!(six(w()), Some(("pod-a".into(), None)));
    // pod-a not ready in the IPv6 slice: no IPv6 address (not pod-b's).
    let not_ready = w().slice6(
        "ns",
        "svc",
        "v6",
        "TCP",
        3000,
        &[("pod-a", "edge-a", "fd00:10:244::1", false), ("pod-b", "edge-a", "fd00:10:244::2", true)],
    );
    assert_eq!(six(not_ready), Some(("pod-a".into(), None)));
    // Only another pod in the IPv6 slice.
    let other = w().slice6("ns", "svc", "v6", "TCP", 3000, &[("pod-b", "edge-a", "fd00:10:244::2", true)]);
    assert_eq!(six(other), Some(("pod-a".into(), None)));
    // The same pod name in another namespace is another pod.
    let mut elsewhere = w().slice6("ns", "svc", "v6", "TCP", 3000, &[("pod-a", "edge-a", "fd00:10:244::1", true)]);
    for s in &mut elsewhere.c.endpoint_slices.iter_mut().filter(|s| s.address_type == "IPv6") {
        for ep in s.endpoints.iter_mut().flatten() {
            ep.target_ref.iter_mut().for_each(|t| t.namespace = Some("other".into()));
        }
    }
    assert_eq!(six(elsewhere), Some(("pod-a".into(), None)));
    // An IPv6 slice serving another port number is not the same endpoint.
    let port = w().slice6("ns", "svc", "v6", "TCP", 3001, &[("pod-a", "edge-a", "fd00:10:244::1", true)]);
    assert_eq!(six(port), Some(("pod-a".into(), None)));
    // The IPv6 address reaches the PortMap's status.
    let out = w().slice6("ns", "svc", "v6", "TCP", 3000, &[("pod-a", "edge-a", "fd00:10:244::1", true)]).run();
    let st = &out.port_maps[&("ns".to_string(), "m".to_string())];
    let e = st.endpoint.as_ref().expect("an endpoint");
    assert_eq!((e.address.as_str(), e.address6.as_str()), ("10.244.0.1", "fd00:10:244::1"));
    let text = serde_json::to_string(&EndpointStatus { address6: String::new(), ..e.clone() }).expect("json");
    assert!(!text.contains("address6"), "an empty address6 is not written: {text}");
}

#[test]
fn ipv6_slices_are_never_the_ipv4_choice() {
    let v4 = &[("pod-z", "worker-b", "10.244.1.1", true)];
    let w = || {
        base()
            .class("public", Single, Vxlan, PUBLIC)
            .service("ns", "svc", "TCP", 3000, v4)
            .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0)
    };
    // pod-a on the accepting node would sort first, but only its IPv6 slice lists it.
    let both = w().slice6("ns", "svc", "v6", "TCP", 3000, &[("pod-a", "edge-a", "fd00:10:244::1", true)]);
    let e = endpoint_of(&both).expect("an endpoint");
    assert_eq!((e.pod.as_str(), e.address.to_string(), e.address6), ("pod-z", "10.244.1.1".into(), None));
    // A Service with only an IPv6 slice has no endpoint: IPv4 stays the primary.
    let mut only6 = both.clone();
    only6.c.endpoint_slices.retain(|s| s.address_type == "IPv6");
    let out = only6.run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).1, reason::NO_READY_ENDPOINT);
    // An IPv6 address listed in an IPv4 slice (a hand-written folder) is skipped, not misread.
    let mut mixed = w();
    for ep in mixed.c.endpoint_slices[0].endpoints.iter_mut().flatten() {
        ep.addresses.insert(0, "fd00:10:244::9".into());
    }
    assert_eq!(endpoint_of(&mixed).map(|e| e.address.to_string()), Some("10.244.1.1".into()));
}

/// Finding 6 of issue 25: a node that reports VXLAN ports of its CNI (a compromised node can
/// report any) bounds only its own links and mappings. worker-c reports the class's VXLAN port
/// and UDP 8472: mappings between edge-a and worker-b stay Programmed, UDP 8472 included, the
/// class stays Ready, and only a mapping whose link would end on worker-c is refused, naming it.
#[test]
fn a_nodes_reported_vxlan_ports_bound_only_its_own_links_and_mappings() {
    let w = base()
        .class("c", Single, Vxlan, PUBLIC)
        .service("ns", "tcp", "TCP", 3000, &[("pod-b", "worker-b", "10.244.1.7", true)])
        .service("ns", "udp", "UDP", 8472, &[("pod-u", "worker-b", "10.244.1.8", true)])
        .service("ns", "on-c", "TCP", 3001, &[("pod-c", "worker-c", "10.244.2.7", true)])
        .port_map("ns", "tcp", "c", Tcp, 3000, None, "tcp", 0)
        .port_map("ns", "udp", "c", Udp, 8472, None, "udp", 1)
        .port_map("ns", "on-c", "c", Tcp, 3001, None, "on-c", 2);
    let out = w.clone().vxlan_ports("worker-c", &[4790, 8472]).run();
    for m in ["tcp", "udp"] {
        assert_eq!(cond(&out, m, status::PROGRAMMED).0, "True", "{m}: {:?}", cond(&out, m, status::PROGRAMMED));
    }
    let (st, rsn, message) = cond(&out, "on-c", status::PROGRAMMED);
    assert_eq!((st, rsn), ("False", "VxlanPortConflict"), "{message}");
    assert!(message.contains("node worker-c") && message.contains("4790"), "{message}");
    assert_eq!(out.classes["c"].conditions[0].status, "True", "{:?}", out.classes["c"].conditions[0]);
    assert_eq!(links_on(&out, "worker-c"), 0, "no link ends on worker-c");
    assert_eq!(links_on(&out, "worker-b"), 1);
    // Unreported, all three are Programmed.
    let clean = w.clone().run();
    assert_eq!(cond(&clean, "on-c", status::PROGRAMMED).0, "True");
    // The accepting node's own report closes UDP 8472 there: the mapping is refused, naming it.
    let out = w.vxlan_ports("edge-a", &[8472]).run();
    let (st, rsn, message) = cond(&out, "udp", status::PROGRAMMED);
    assert_eq!((st, rsn), ("False", reason::NOT_ACCEPTED), "{message}");
    let (_, rsn, message) = cond(&out, "udp", status::ACCEPTED);
    assert_eq!(rsn, reason::RESERVED_PORT);
    assert!(message.contains("node edge-a") && message.contains("8472"), "{message}");
    assert_eq!(cond(&out, "tcp", status::PROGRAMMED).0, "True");
}

/// A tenant's Service in `ns` whose hand-written slice names an endpoint: (targetRef namespace
/// and name or none, node, address).
fn forged(w: World, target: Option<(&str, &str)>, node: &str, address: &str) -> World {
    let (tns, tname) = target.unwrap_or(("ns", "x"));
    w.service("ns", "svc", "TCP", 3000, &[(tname, node, address, true)]).without_pod("ns", tname).edit_slices(
        |slices| {
            let ep = slices
                .iter_mut()
                .filter(|s| s.metadata.namespace.as_deref() == Some("ns"))
                .flat_map(|s| s.endpoints.iter_mut().flatten())
                .next()
                .expect("the tenant's endpoint");
            match target {
                Some(_) => {
                    if let Some(r) = ep.target_ref.as_mut() {
                        r.namespace = Some(tns.into());
                    }
                }
                None => ep.target_ref = None,
            }
        },
    )
}

/// Finding 1 (docs/portmap/modes.md, "Which endpoints are believed"): an endpoint no Pod of the
/// PortMap's namespace vouches for is refused with a reason naming its address, and nothing is
/// programmed for it.
#[test]
fn endpoints_kubernetes_does_not_vouch_for_are_refused() {
    // apps/api-0 on worker-b: the victim.
    let victim = || {
        base().class("public", Single, Vxlan, PUBLIC).service(
            "apps",
            "api",
            "TCP",
            9000,
            &[("api-0", "worker-b", "10.244.1.9", true)],
        )
    };
    let m = |w: World| w.port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0);
    let cases: Vec<(&str, World, &[&str])> = vec![
        (
            "another namespace's pod by targetRef",
            m(forged(victim(), Some(("apps", "api-0")), "worker-b", "10.244.1.9")),
            &["10.244.1.9", "namespace apps", "not the PortMap's ns"],
        ),
        (
            "another namespace's pod by address alone",
            m(forged(victim(), None, "worker-b", "10.244.1.9")),
            &["10.244.1.9", "no Pod of namespace ns", "it is a Pod's address"],
        ),
        (
            "own pod, not its address",
            m(victim().service("ns", "svc", "TCP", 3000, &[("own-0", "worker-b", "10.244.1.10", true)]).edit_slices(
                |slices| {
                    for s in slices.iter_mut().filter(|s| s.metadata.namespace.as_deref() == Some("ns")) {
                        for ep in s.endpoints.iter_mut().flatten() {
                            ep.addresses = vec!["10.244.1.11".into()];
                        }
                    }
                },
            )),
            &["10.244.1.11", "status.podIPs do not hold 10.244.1.11"],
        ),
        (
            "own pod, another node",
            m(victim().service("ns", "svc", "TCP", 3000, &[("own-0", "worker-b", "10.244.1.12", true)]).edit_slices(
                |slices| {
                    for s in slices.iter_mut().filter(|s| s.metadata.namespace.as_deref() == Some("ns")) {
                        for ep in s.endpoints.iter_mut().flatten() {
                            ep.node_name = Some("edge-a".into());
                        }
                    }
                },
            )),
            &["10.244.1.12", "not on node edge-a"],
        ),
        (
            "a deleted pod",
            m(victim()
                .service("ns", "svc", "TCP", 3000, &[("own-0", "worker-b", "10.244.1.12", true)])
                .without_pod("ns", "own-0")),
            &["10.244.1.12", "does not exist"],
        ),
        (
            "an address that is no pod, not allowed by the class",
            m(forged(victim(), None, "worker-b", "192.168.50.7")),
            &["192.168.50.7", "spec.externalEndpoints does not contain it"],
        ),
        ("the node's kubelet address", m(forged(victim(), None, "worker-b", "100.64.0.2")), &["100.64.0.2"]),
    ];
    for (name, world, texts) in cases {
        let out = world.run();
        let (status, got, message) = cond(&out, "m", status::PROGRAMMED);
        assert_eq!((status, got), ("False", reason::ENDPOINT_NOT_VOUCHED), "{name}: {message}");
        for text in texts {
            assert!(message.contains(text), "{name}: {message:?} should contain {text:?}");
        }
        assert!(out.node_states.values().all(|s| s.netns.iter().all(|n| n.nft_tables.is_empty())), "{name}");
        assert_eq!(links_on(&out, "edge-a") + links_on(&out, "worker-b"), 0, "{name}: no link");
        assert!(out.classes["public"].links.is_empty(), "{name}: no slot");
    }
}

/// A forged endpoint beside a genuine one is passed over, even where it would sort first.
#[test]
fn a_vouched_endpoint_wins_over_a_forged_one() {
    let out = base()
        .class("public", Single, Vxlan, PUBLIC)
        .service(
            "ns",
            "svc",
            "TCP",
            3000,
            &[("fake", "edge-a", "10.244.0.99", true), ("pod", "worker-b", "10.244.1.7", true)],
        )
        .without_pod("ns", "fake")
        .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0)
        .run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).0, "True");
    let ep = out.port_maps[&("ns".to_string(), "m".to_string())].endpoint.clone().expect("endpoint");
    assert_eq!((ep.node.as_str(), ep.address.as_str()), ("worker-b", "10.244.1.7"));
}

/// An address no Pod holds is delivered to where the class's spec.externalEndpoints allows it,
/// and only there; a Pod's address never counts as external.
#[test]
fn external_endpoints_only_by_the_class_prefix() {
    let w = |prefix: &str, address: &str| {
        forged(
            base()
                .class("public", Single, Vxlan, PUBLIC)
                .edit_class("public", |s| s.external_endpoints = vec![prefix.into()])
                .routes("worker-b", &[crate::compute::testkit::CILIUM_ROUTE, ("192.168.50.0/24", "eth1")])
                .service("apps", "api", "TCP", 9000, &[("api-0", "worker-b", "10.244.1.9", true)]),
            None,
            "worker-b",
            address,
        )
        .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0)
    };
    let out = w("192.168.50.0/24", "192.168.50.7").run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).0, "True", "{:?}", cond(&out, "m", status::PROGRAMMED));
    assert_eq!(
        out.port_maps[&("ns".to_string(), "m".to_string())].endpoint.as_ref().map(|e| e.address.as_str()),
        Some("192.168.50.7")
    );
    let out = w("192.168.50.0/24", "192.168.51.7").run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).1, reason::ENDPOINT_NOT_VOUCHED);
    // A careless prefix over the pod network still does not hand over another tenant's pod.
    let out = w("10.244.0.0/16", "10.244.1.9").run();
    let (_, got, message) = cond(&out, "m", status::PROGRAMMED);
    assert_eq!(got, reason::ENDPOINT_NOT_VOUCHED);
    assert!(message.contains("it is a Pod's address"), "{message}");
}

/// Finding 5: a nodeName that is no Node (or no Ready one) claims no slot, link or mark; a
/// status row naming one is released at once, not after 24 h.
#[test]
fn fake_node_names_claim_no_slot() {
    let w = || {
        forged(
            base()
                .class("public", Single, Vxlan, PUBLIC)
                .edit_class("public", |s| s.external_endpoints = vec!["192.168.50.0/24".into()]),
            None,
            "ghost",
            "192.168.50.7",
        )
        .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0)
    };
    let out = w().run();
    let (status, got, message) = cond(&out, "m", status::PROGRAMMED);
    assert_eq!((status, got), ("False", reason::NODE_NOT_READY), "{message}");
    assert!(message.contains("ghost") && message.contains("192.168.50.7"), "{message}");
    assert!(out.classes["public"].links.is_empty(), "no slot: {:?}", out.classes["public"].links);
    assert_eq!(links_on(&out, "edge-a"), 0);
    // A row a forged slice made before (an older controller): gone now, not in 24 h.
    let mut held = w();
    held.c.classes[0].status = Some(PortMapClassStatus {
        links: vec![LinkSlot {
            pair: vec!["edge-a".into(), "ghost".into()],
            slot: 1,
            subnet: "169.254.77.2/31".into(),
            subnet6: String::new(),
            unused_since: None,
        }],
        ..Default::default()
    });
    assert!(held.run().classes["public"].links.is_empty());
    // A NotReady node's pod: refused the same way.
    let out = base()
        .node("worker-d", "100.64.0.4", false)
        .class("public", Single, Vxlan, PUBLIC)
        .service("ns", "svc", "TCP", 3000, &[("pod", "worker-d", "10.244.4.7", true)])
        .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0)
        .run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).1, reason::NODE_NOT_READY);
    assert!(out.classes["public"].links.is_empty());
}

/// Finding 2: the ports a node needs for itself are published by no class, whatever its range;
/// the refusal names the port and whose it is.
#[test]
fn node_ports_are_published_by_no_class() {
    let w = || {
        base().class("public", Single, Vxlan, PUBLIC).edit_class("public", |s| s.ports.min = 1).service(
            "ns",
            "svc",
            "TCP",
            3000,
            &[("pod", "edge-a", "10.244.0.7", true)],
        )
    };
    let cases: Vec<(&str, Protocol, u16, Option<u16>, &str)> = vec![
        ("everything over TCP", Tcp, 1, Some(65535), "2379, etcd"),
        ("the kubelet", Tcp, 10250, None, "10250, the kubelet's API port"),
        ("kube-proxy's health", Tcp, 10256, None, "10256, kube-proxy"),
        ("the API server", Tcp, 6000, Some(7000), "6443"),
        ("kuport's gRPC", Tcp, 9443, None, "9443, kuport's controller gRPC"),
        ("everything over UDP", Udp, 1, Some(65535), "4790, a VXLAN port"),
        ("WireGuard", Udp, 51000, Some(52000), "51820, WireGuard"),
    ];
    // A CNI's VXLAN port a node reports closes it on that node only:
    // `a_nodes_reported_vxlan_ports_bound_only_its_own_links_and_mappings`.
    for (name, proto, port, end, text) in cases {
        let out = w().port_map("ns", "m", "public", proto, port, end, "svc", 0).run();
        let (status, got, message) = cond(&out, "m", status::ACCEPTED);
        assert_eq!((status, got), ("False", reason::RESERVED_PORT), "{name}: {message}");
        assert!(message.contains(text), "{name}: {message:?} should contain {text:?}");
        assert!(out.node_states.values().all(|s| s.netns.iter().all(|n| n.nft_tables.is_empty())), "{name}");
    }
    // VXLAN is UDP: a TCP mapping on the links' port is fine.
    let out = w().port_map("ns", "m", "public", Tcp, 4790, None, "svc", 0).run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).0, "True");
    // The overlay's configured listen port, whatever it is.
    let overlay = crate::compute::overlay::OverlaySettings { interface: "kup-wg".into(), listen_port: 51999 };
    let settings = crate::compute::Settings { overlay: Some(overlay) };
    let out =
        crate::compute::compute(&w().port_map("ns", "m", "public", Udp, 51999, None, "svc", 0).cluster(), &settings);
    let (_, got, message) = cond(&out, "m", status::ACCEPTED);
    assert_eq!(got, reason::RESERVED_PORT, "{message}");
    assert!(message.contains("51999, the overlay's WireGuard listen port"), "{message}");
}

/// Ports below 1024 only where the class names them.
#[test]
fn low_ports_only_where_the_class_names_them() {
    let w = || {
        base().class("public", Single, Vxlan, PUBLIC).service(
            "ns",
            "svc",
            "TCP",
            22,
            &[("pod", "edge-a", "10.244.0.7", true)],
        )
    };
    let out = w().port_map("ns", "m", "public", Tcp, 22, None, "svc", 0).run();
    let (_, got, message) = cond(&out, "m", status::ACCEPTED);
    assert_eq!(got, reason::PORT_OUTSIDE_CLASS_RANGE);
    assert!(message.contains("below 1024") && message.contains("spec.ports.min"), "{message}");
    let out =
        w().edit_class("public", |s| s.ports.min = 22).port_map("ns", "m", "public", Tcp, 22, None, "svc", 0).run();
    assert_eq!(cond(&out, "m", status::PROGRAMMED).0, "True");
}

/// A class's spec.limits bound what one namespace holds: the oldest keep theirs, the newest are
/// refused, other namespaces are untouched.
#[test]
fn namespace_limits_refuse_the_newest() {
    let w = || {
        base()
            .class("public", Single, Vxlan, PUBLIC)
            .service("ns", "svc", "UDP", 3000, &[("pod", "edge-a", "10.244.0.7", true)])
            .service("other", "svc", "UDP", 3000, &[("pod", "edge-a", "10.244.0.8", true)])
    };
    let limits = |maps, ports| {
        move |s: &mut PortMapClassSpec| {
            s.limits = Some(NamespaceLimits { max_port_maps_per_namespace: maps, max_ports_per_namespace: ports })
        }
    };
    let out = w()
        .edit_class("public", limits(Some(2), None))
        .port_map("ns", "c", "public", Udp, 5002, None, "svc", 2)
        .port_map("ns", "a", "public", Udp, 5000, None, "svc", 0)
        .port_map("ns", "b", "public", Udp, 5001, None, "svc", 1)
        .port_map("other", "d", "public", Udp, 5003, None, "svc", 3)
        .run();
    assert_eq!(cond(&out, "a", status::ACCEPTED).0, "True");
    assert_eq!(cond(&out, "b", status::ACCEPTED).0, "True");
    let (status, got, message) = cond(&out, "c", status::ACCEPTED);
    assert_eq!((status, got), ("False", reason::NAMESPACE_LIMIT_EXCEEDED), "{message}");
    assert!(message.contains("maxPortMapsPerNamespace"), "{message}");
    assert_eq!(cond(&out, "d", status::ACCEPTED).0, "True", "another namespace");
    let out = w()
        .edit_class("public", limits(None, Some(10)))
        .port_map("ns", "a", "public", Udp, 5000, Some(5007), "svc", 0)
        .port_map("ns", "b", "public", Udp, 6000, Some(6004), "svc", 1)
        .port_map("ns", "c", "public", Udp, 7000, Some(7001), "svc", 2)
        .run();
    assert_eq!(cond(&out, "a", status::ACCEPTED).0, "True");
    let (_, got, message) = cond(&out, "b", status::ACCEPTED);
    assert_eq!(got, reason::NAMESPACE_LIMIT_EXCEEDED, "{message}");
    assert!(message.contains("maxPortsPerNamespace 10"), "{message}");
    assert_eq!(cond(&out, "c", status::ACCEPTED).0, "True", "a refused mapping holds no ports");
    // A mapping refused for a port another holds counts for nothing either: it cannot spend
    // its namespace's bound and lock out the next one.
    let out = w()
        .edit_class("public", limits(Some(2), Some(10)))
        .port_map("other", "a", "public", Udp, 5000, None, "svc", 0)
        .port_map("ns", "b", "public", Udp, 5000, None, "svc", 1)
        .port_map("ns", "c", "public", Udp, 5001, Some(5009), "svc", 2)
        .port_map("ns", "d", "public", Udp, 5010, None, "svc", 3)
        .run();
    assert_eq!(cond(&out, "b", status::ACCEPTED).1, reason::PORT_CONFLICT);
    assert_eq!(cond(&out, "c", status::ACCEPTED).0, "True");
    assert_eq!(cond(&out, "d", status::ACCEPTED).0, "True", "two PortMaps and ten ports, b not counted");
}

/// The allow-list's admission (docs/portmap/guard.md): the mapping's own prefixes, else the
/// class's; a pinned class takes only narrower ones; a bad prefix is refused naming the field.
#[test]
fn source_ranges_are_the_mappings_else_the_class_and_a_pin_only_narrows() {
    let w = || {
        base()
            .interface_address("edge-a", "enp1s0", "203.0.113.9")
            .class("public", Single, Vxlan, PUBLIC)
            .service("ns", "svc", "TCP", 3000, &[("pod", "edge-a", "10.244.0.7", true)])
            .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0)
    };
    // The rules of each of the mapping's guard chains (steer.rs, `guard_rules`).
    let ranges = |out: &Outputs| -> Vec<String> {
        let tables = out.node_states.get("edge-a").into_iter().flat_map(|s| &s.netns).flat_map(|n| &n.nft_tables);
        let guards = tables.flat_map(|t| &t.chains).filter(|c| c.name.starts_with(steer::CHAIN_GUARD));
        guards.map(|c| format!("{:?}", c.rules)).collect()
    };
    let open = w().run();
    assert!(ranges(&open).is_empty(), "no list, no guard");
    let class_only = w().edit_class("public", |s| s.source_ranges = vec!["198.51.100.7/24".into()]).run();
    let got = ranges(&class_only);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].contains("198.51.100.0/24"), "host bits cleared: {got:?}");
    let own = w()
        .edit_class("public", |s| s.source_ranges = vec!["198.51.100.0/24".into()])
        .edit_map("m", |s| s.source_ranges = vec!["192.0.2.0/24".into()])
        .run();
    assert!(ranges(&own)[0].contains("192.0.2.0/24"), "the mapping's own list wins");

    let pinned = |s: &mut PortMapClassSpec| {
        s.source_ranges = vec!["198.51.100.0/24".into()];
        s.pin_source_ranges = true;
    };
    let narrower =
        w().edit_class("public", pinned).edit_map("m", |s| s.source_ranges = vec!["198.51.100.128/25".into()]);
    let out = narrower.run();
    assert_eq!(cond(&out, "m", status::ACCEPTED).0, "True");
    assert!(ranges(&out)[0].contains("198.51.100.128/25"));
    let wider = w().edit_class("public", pinned).edit_map("m", |s| s.source_ranges = vec!["0.0.0.0/0".into()]).run();
    let (status, got, message) = cond(&wider, "m", status::ACCEPTED);
    assert_eq!((status, got), ("False", reason::SOURCE_RANGE_OUTSIDE_CLASS), "{message}");
    assert!(message.contains("spec.sourceRanges[0]: 0.0.0.0/0") && message.contains("pins"), "{message}");
    assert_eq!(links_on(&wider, "edge-a"), 0);
    assert!(ranges(&wider).is_empty(), "a refused mapping publishes nothing");

    let bad = w().edit_map("m", |s| s.source_ranges = vec!["192.0.2.0/24".into(), "192.0.2.300/24".into()]).run();
    let (status, got, message) = cond(&bad, "m", status::ACCEPTED);
    assert_eq!((status, got), ("False", reason::INVALID_SOURCE_RANGE), "{message}");
    assert!(message.contains("spec.sourceRanges[1]: \"192.0.2.300/24\""), "{message}");
    let bad_class = w().edit_class("public", |s| s.source_ranges = vec!["nope".into()]).run();
    let (_, got, message) = cond(&bad_class, "m", status::ACCEPTED);
    assert_eq!(got, reason::INVALID_SOURCE_RANGE, "{message}");
    assert!(message.contains("PortMapClass \"public\" spec.sourceRanges[0]"), "{message}");
}

/// Changing a mapping's allow-list changes its accepting node's state.
#[test]
fn an_allow_list_change_is_a_new_datapath() {
    let w = base()
        .interface_address("edge-a", "enp1s0", "203.0.113.9")
        .class("public", Single, Vxlan, PUBLIC)
        .service("ns", "svc", "TCP", 3000, &[("pod", "edge-a", "10.244.0.7", true)])
        .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0);
    let before = w.run();
    let after = w.edit_map("m", |s| s.source_ranges = vec!["192.0.2.0/24".into()]).run();
    assert_ne!(before.node_states["edge-a"], after.node_states["edge-a"]);
}

/// docs/portmap/guard.md, "Rate limits": a mapping's bounds become its limit chain on the
/// accepting node (the burst defaults to the rate), a change of them is a new datapath, and a
/// 0 that passed no CRD (a folder's object) is refused with the field named, keeping nothing.
#[test]
fn rate_limits_are_checked_and_become_the_mappings_chain() {
    let w = || {
        base()
            .interface_address("edge-a", "enp1s0", "203.0.113.9")
            .class("public", Single, Vxlan, PUBLIC)
            .service("ns", "svc", "UDP", 3000, &[("pod", "edge-a", "10.244.0.7", true)])
            .port_map("ns", "m", "public", Udp, 3000, None, "svc", 0)
    };
    let limit_chains = |out: &Outputs| -> Vec<String> {
        let tables = out.node_states.get("edge-a").into_iter().flat_map(|s| &s.netns).flat_map(|n| &n.nft_tables);
        tables.flat_map(|t| &t.chains).filter(|c| c.name.starts_with("kup-limit")).map(|c| format!("{c:?}")).collect()
    };
    let open = w().run();
    assert!(limit_chains(&open).is_empty(), "no limit, no chain");
    let limited = |l: RateLimit| w().edit_map("m", move |s| s.rate_limit = Some(l.clone())).run();
    let out = limited(RateLimit { new_per_second: 7, burst: None, max_connections: None });
    let chains = limit_chains(&out);
    assert_eq!(chains.len(), 1, "{chains:?}");
    assert!(chains[0].contains("rate: 7, burst: 7"), "the burst is the rate: {chains:?}");
    assert_ne!(open.node_states["edge-a"], out.node_states["edge-a"]);
    let other = limited(RateLimit { new_per_second: 8, burst: None, max_connections: None });
    assert_ne!(out.node_states["edge-a"], other.node_states["edge-a"], "a new rate is a new datapath");

    for (l, field) in [
        (RateLimit { new_per_second: 0, burst: None, max_connections: None }, "newPerSecond"),
        (RateLimit { new_per_second: 5, burst: Some(0), max_connections: None }, "burst"),
        (RateLimit { new_per_second: 5, burst: None, max_connections: Some(0) }, "maxConnections"),
    ] {
        let out = limited(l);
        let (status, got, message) = cond(&out, "m", status::ACCEPTED);
        assert_eq!((status, got), ("False", reason::INVALID_RATE_LIMIT), "{message}");
        assert!(message.contains(&format!("spec.rateLimit.{field}: 0")), "{message}");
        assert!(limit_chains(&out).is_empty(), "a refused mapping publishes nothing");
    }
}
