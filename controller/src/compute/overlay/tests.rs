//! The overlay's mesh: goldens of a three-site mesh, every refusal, and properties over random
//! clusters (docs/overlay/mesh.md); relays over random reach matrices and the golden of two
//! homes relayed through a cloud node (docs/overlay/relays.md).

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;

use k8s_openapi::jiff::Timestamp;
use kuport_proto::v1::Reach;
use kuport_proto::v1::link::Kind::Vxlan;

use super::relays::{CONTROL_PLANE_LABEL, PeerRoute, RELAY_LABEL};
use super::*;
use crate::compute::testkit::World;
use crate::compute::{Outputs, Settings, compute};
use crate::observe::{KnownFacts, ObservedPeer};

/// A key as `wg` prints it: 32 bytes in base64.
fn key(seed: u8) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = (0..32u8).map(|i| seed.wrapping_mul(31).wrapping_add(i.wrapping_mul(7))).collect();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out.push('=');
    out
}

/// A Node with `addresses` (type, address), `pod_cidrs` and annotations.
fn node(name: &str, addresses: &[(&str, &str)], pod_cidrs: &[&str], annotations: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: (!annotations.is_empty())
                .then(|| annotations.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: pod_cidrs.first().map(|c| (*c).into()),
            pod_cidrs: Some(pod_cidrs.iter().map(|c| (*c).into()).collect()),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(
                addresses.iter().map(|(t, a)| NodeAddress { type_: (*t).into(), address: (*a).into() }).collect(),
            ),
            ..Default::default()
        }),
    }
}

fn facts(name: &str, public_key: Option<String>, mtu: Option<u32>) -> KnownFacts {
    KnownFacts { node: name.into(), underlay_mtu: mtu, wireguard_public_key: public_key, ..Default::default() }
}

fn on() -> Settings {
    Settings { overlay: Some(OverlaySettings::default()) }
}

fn run(w: &World) -> Outputs {
    compute(&w.cluster(), &on())
}

/// The issue's three sites: a cloud node with a public ExternalIP, a home worker behind NAT with
/// only its InternalIP, and a cloud VM whose own address is private behind a 1:1 NAT, announced
/// by the endpoint annotation (on another port: a port forward).
fn sites() -> World {
    let mut w = World::new();
    w.c.nodes = vec![
        node("cloud", &[("InternalIP", "10.0.0.5"), ("ExternalIP", "203.0.113.7")], &["10.42.0.0/24"], &[]),
        node("home", &[("InternalIP", "192.168.1.10"), ("Hostname", "home")], &["10.42.1.0/24"], &[]),
        node(
            "vm",
            &[("InternalIP", "172.31.5.4")],
            &["10.42.2.0/24"],
            &[(EXTERNAL_ENDPOINT_ANNOTATION, "198.51.100.4:51821")],
        ),
    ]
    .into();
    w.c.facts = vec![
        facts("cloud", Some(key(1)), Some(1500)),
        facts("home", Some(key(2)), Some(1492)),
        facts("vm", Some(key(3)), None),
    ];
    w
}

fn text(out: &Outputs) -> String {
    let mut t = crate::render::render_text(out);
    t.push_str(&format!("=== annotations\n{:#?}\n", annotations(&out.overlay)));
    t
}

#[test]
fn golden_three_sites() {
    insta::assert_snapshot!("three_sites", text(&run(&sites())));
}

/// Two members that see a third alike hold one entry for it, not two copies; one whose entry
/// differs (an unreachable peer, docs/overlay/relays.md) holds its own (docs/decisions.md, "Peers
/// shared between states").
#[test]
fn members_that_see_a_peer_alike_share_its_entry() {
    let out = run(&sites());
    let entry = |node: &str, peer: u8| {
        out.node_states[node].netns[0].wireguard_devices[0].peers.get_shared(&key(peer)).cloned().expect("an entry")
    };
    assert!(std::sync::Arc::ptr_eq(&entry("cloud", 2), &entry("vm", 2)), "home's entry, shared");
    assert!(std::sync::Arc::ptr_eq(&entry("home", 3), &entry("cloud", 3)), "vm's entry, shared");
    // One filter table for every member that is not a relay candidate, made once per plan.
    let members: Vec<&String> = out.overlay.iter().filter(|(_, o)| !o.relay).map(|(n, _)| n).collect();
    let tables = |node: &str| &out.node_states[node].netns[0].nft_tables;
    assert!(members.len() >= 2, "{members:?}");
    for m in &members[1..] {
        assert!(kuport_proto::shared::Shared::ptr_eq(tables(members[0]), tables(m)), "{m}'s table, shared");
    }

    let mut w = sites();
    report(&mut w, "home", key(3), None, Reach::Unreachable);
    let relayed = run(&w);
    let entry = |node: &str, peer: u8| {
        relayed.node_states[node].netns[0].wireguard_devices[0].peers.get_shared(&key(peer)).cloned().expect("an entry")
    };
    assert_ne!(entry("home", 3), entry("cloud", 3), "home cannot reach vm, and no relay can");
    assert_eq!(entry("home", 3).persistent_keepalive_seconds, 0, "no keepalive to it");
}

/// A dual-stack node and an IPv6 endpoint: IPv6 forwarding and the IPv6 overhead; its IPv6 pod
/// CIDR is routed only by nodes whose pods have IPv6 too (none here), but allowed everywhere.
#[test]
fn golden_dual_stack() {
    let mut w = sites();
    w.c.nodes[0] = node(
        "cloud",
        &[("InternalIP", "10.0.0.5"), ("ExternalIP", "2001:db8::7")],
        &["10.42.0.0/24", "fd00:42::/64"],
        &[],
    );
    insta::assert_snapshot!("dual_stack", text(&run(&w)));
}

/// Two nodes refused beside the three sites: their reasons, and a mesh that does not know them.
#[test]
fn golden_refusals() {
    let mut w = sites();
    w.c.nodes.push(node("new", &[("InternalIP", "10.0.0.20")], &[], &[]));
    w.c.nodes.push(node(
        "typo",
        &[("InternalIP", "10.0.0.21")],
        &["10.42.4.0/24"],
        &[(EXTERNAL_ENDPOINT_ANNOTATION, "198.51.100.9:")],
    ));
    w.c.facts.push(facts("typo", Some(key(5)), None));
    insta::assert_snapshot!("refusals", text(&run(&w)));
}

/// A mesh beside the port maps' golden scenario: the overlay adds to the host namespace and
/// changes nothing the port maps put there.
#[test]
fn the_overlay_adds_to_port_maps_state_and_changes_nothing_of_it() {
    for (name, world) in crate::compute::testkit::scenarios() {
        let off = world.run();
        let mut w = world.clone();
        for (i, n) in w.c.nodes.iter_mut().enumerate() {
            n.spec = Some(NodeSpec { pod_cidrs: Some(vec![format!("10.42.{i}.0/24")]), ..Default::default() });
        }
        for (i, f) in w.c.facts.iter_mut().enumerate() {
            f.wireguard_public_key = Some(key(i as u8));
        }
        let with = run(&w);
        assert_eq!(off.port_maps, with.port_maps, "{name}");
        assert_eq!(off.classes, with.classes, "{name}");
        for (node, state) in &with.node_states {
            let mut s = kuport_proto::v1::NodeState::clone(state);
            let before = &off.node_states[node];
            for ns in &mut s.netns {
                ns.wireguard_devices.clear();
                ns.nft_tables.retain(|t| t.name != super::NFT_TABLE);
                ns.routes.retain(|r| r.dev != DEFAULT_INTERFACE);
                ns.addresses.retain(|a| a.dev != DEFAULT_INTERFACE);
            }
            // Links ride on the mesh: between overlay addresses, 50 below the device's MTU, the
            // loop guard's destination with them; otherwise they are the same links.
            let device_mtu: BTreeMap<String, u32> =
                with.overlay.values().filter_map(|o| Some((o.address?.to_string(), o.mtu))).collect();
            let mut peers = BTreeMap::new();
            for (link, old) in s.netns[0].links.iter_mut().zip(&before.netns[0].links) {
                let Some(Vxlan(v)) = &mut link.kind else { continue };
                let (Some(a), Some(b)) = (device_mtu.get(&v.local), device_mtu.get(&v.remote)) else {
                    panic!("{name}/{node}: a link off the mesh: {v:?}");
                };
                assert_eq!(link.mtu, a.min(b) - 50, "{name}/{node}: {}", link.name);
                let Some(Vxlan(o)) = &old.kind else { continue };
                peers.insert(v.remote.clone(), o.remote.clone());
                (v.local, v.remote, link.mtu) = (o.local.clone(), o.remote.clone(), old.mtu);
            }
            // The link peer filter names each link's peer by the address its packets come from.
            let peer_sets =
                s.netns[0].nft_tables.iter_mut().flat_map(|t| &mut t.sets).filter(|s| s.name == "link_peers");
            for v in peer_sets.flat_map(|s| &mut s.elements).flat_map(|e| &mut e.key) {
                if let Some(kuport_proto::v1::nft_value::Value::Addr(a)) = &mut v.value
                    && let Some(o) = peers.get(a.as_str())
                {
                    *a = o.clone();
                }
            }
            for (rule, old) in s.netns[0].ip_rules.iter_mut().zip(&before.netns[0].ip_rules) {
                rule.to = old.to.clone();
            }
            // Forwarding is the one thing both may set.
            s.netns[0].sysctls = before.netns[0].sysctls.clone();
            kuport_proto::canonicalize(&mut s);
            assert_eq!(&s, &**before, "{name}/{node}");
            assert_eq!(state.netns[0].wireguard_devices[0].peers.len(), w.c.nodes.len() - 1, "{name}/{node}");
        }
    }
}

#[test]
fn off_by_default_and_nothing_without_members() {
    let out = compute(&sites().c, &Settings::default());
    assert!(out.overlay.is_empty());
    assert!(out.node_states.values().all(|s| s.netns.iter().all(|n| n.wireguard_devices.is_empty())));
    let mut w = sites();
    w.c.facts.clear();
    let out = run(&w);
    assert!(out.overlay.values().all(|o| o.refused[0].reason == reason::NO_PUBLIC_KEY));
    assert!(out.node_states.values().all(|s| s.netns.iter().all(|n| n.wireguard_devices.is_empty())));
}

/// `refused`'s one node is out, with `reason` on `field`; the others form the mesh without it.
fn assert_refused(out: &Outputs, refused: &str, reason: &str, field: &str) {
    let o = &out.overlay[refused];
    assert!(o.public_key.is_none() && o.peers().next().is_none(), "{o:?}");
    let r = o.refused.iter().find(|r| r.reason == reason).unwrap_or_else(|| panic!("{reason} not in {:?}", o.refused));
    assert_eq!((r.node.as_str(), r.field.as_str()), (refused, field), "{r}");
    assert!(r.to_string().contains(&format!("node {refused}")), "{r}");
    if let Some(s) = out.node_states.get(refused) {
        assert!(s.netns.iter().all(|n| n.wireguard_devices.is_empty()), "{refused} has no device");
    }
    let members: Vec<&String> = out.overlay.iter().filter(|(_, o)| o.refused.is_empty()).map(|(n, _)| n).collect();
    for m in &members {
        let peers: Vec<&String> = out.overlay[*m].peers().collect();
        assert!(!peers.iter().any(|p| *p == refused), "{m} peers with refused {refused}");
        assert_eq!(peers.len(), members.len() - 1, "{m}: the rest of the mesh keeps working");
        let device = &out.node_states[*m].netns[0].wireguard_devices[0];
        assert_eq!(device.peers.len(), members.len() - 1);
    }
}

#[test]
fn every_refusal_names_the_node_and_field_and_the_rest_of_the_mesh_works() {
    let endpoint = format!("metadata.annotations[{EXTERNAL_ENDPOINT_ANNOTATION}]");
    let edit = |f: &dyn Fn(&mut World)| {
        let mut w = sites();
        // A fourth node, so that two members remain when one or two are refused.
        w.c.nodes.push(node("edge", &[("InternalIP", "10.0.0.9")], &["10.42.3.0/24"], &[]));
        w.c.facts.push(facts("edge", Some(key(4)), None));
        f(&mut w);
        run(&w)
    };
    // No pod CIDRs at all (neither podCIDRs nor podCIDR).
    let out = edit(&|w| w.c.nodes[1].spec = None);
    assert_refused(&out, "home", reason::NO_POD_CIDRS, "spec.podCIDRs");
    // A pod CIDR that does not parse, or has host bits set.
    let out = edit(&|w| w.c.nodes[1] = node("home", &[("InternalIP", "192.168.1.10")], &["10.42.1.0/33"], &[]));
    assert_refused(&out, "home", reason::INVALID_POD_CIDR, "spec.podCIDRs[0]");
    let out = edit(&|w| {
        w.c.nodes[1] = node("home", &[("InternalIP", "192.168.1.10")], &["10.42.9.0/24", "10.42.1.5/24"], &[])
    });
    assert_refused(&out, "home", reason::INVALID_POD_CIDR, "spec.podCIDRs[1]");
    // Overlapping pod CIDRs: both nodes are out, each naming the other.
    let out = edit(&|w| w.c.nodes[1] = node("home", &[("InternalIP", "192.168.1.10")], &["10.42.0.128/25"], &[]));
    assert_refused(&out, "home", reason::POD_CIDR_OVERLAP, "spec.podCIDRs");
    assert_refused(&out, "cloud", reason::POD_CIDR_OVERLAP, "spec.podCIDRs");
    assert!(out.overlay["home"].refused[0].message.contains("node cloud's 10.42.0.0/24"));
    assert!(out.overlay["cloud"].refused[0].message.contains("node home's 10.42.0.128/25"));
    // A key that is not 32 bytes of base64 (a folder's NodeFacts skip facts::check).
    let out = edit(&|w| w.c.facts[2].wireguard_public_key = Some("c2hvcnQ=".into()));
    assert_refused(&out, "vm", reason::INVALID_PUBLIC_KEY, "wireguardPublicKey");
    // No key reported yet.
    let out = edit(&|w| w.c.facts[2].wireguard_public_key = None);
    assert_refused(&out, "vm", reason::NO_PUBLIC_KEY, "wireguardPublicKey");
    // A report refused for its key says so.
    let out = edit(&|w| {
        w.c.facts[2].wireguard_public_key = None;
        w.c.refused_facts.insert(
            "vm".into(),
            crate::observe::facts::Refused {
                node: "vm".into(),
                field: "wireguardPublicKey".into(),
                reason: crate::observe::facts::reason::INVALID_FACTS,
                message: "\"x\" is not a WireGuard key".into(),
            },
        );
    });
    assert_refused(&out, "vm", reason::NO_PUBLIC_KEY, "wireguardPublicKey");
    assert!(out.overlay["vm"].refused[0].message.contains("refused: \"x\" is not a WireGuard key"));
    // Two nodes with one key: both out.
    let out = edit(&|w| w.c.facts[1].wireguard_public_key = Some(key(1)));
    assert_refused(&out, "home", reason::PUBLIC_KEY_CLASH, "wireguardPublicKey");
    assert_refused(&out, "cloud", reason::PUBLIC_KEY_CLASH, "wireguardPublicKey");
    // Endpoint annotations that do not parse.
    for bad in ["198.51.100.4:0", "vm.example.com:51820", "198.51.100.4:65536", "0.0.0.0", "224.0.0.1:1", "", "[::1]"] {
        let out = edit(&|w| {
            w.c.nodes[2].metadata.annotations = Some([(EXTERNAL_ENDPOINT_ANNOTATION.into(), bad.into())].into())
        });
        assert_refused(&out, "vm", reason::INVALID_ENDPOINT, &endpoint);
        assert!(out.overlay["vm"].refused[0].message.contains(&format!("{bad:?}")));
    }
    // Every independent reason of one node at once.
    let out = edit(&|w| {
        w.c.nodes[2].spec = None;
        w.c.facts[2].wireguard_public_key = None;
        w.c.nodes[2].metadata.annotations = Some([(EXTERNAL_ENDPOINT_ANNOTATION.into(), "nope".into())].into());
    });
    let reasons: Vec<&str> = out.overlay["vm"].refused.iter().map(|r| r.reason).collect();
    assert_eq!(reasons, [reason::NO_PUBLIC_KEY, reason::NO_POD_CIDRS, reason::INVALID_ENDPOINT]);
}

#[test]
fn endpoints_follow_the_annotation_then_external_then_internal_ip() {
    let out = run(&sites());
    let endpoint = |n: &str| out.overlay[n].endpoint.map(|e| e.to_string());
    assert_eq!(endpoint("cloud").as_deref(), Some("203.0.113.7:51820"));
    assert_eq!(endpoint("home").as_deref(), Some("192.168.1.10:51820"));
    assert_eq!(endpoint("vm").as_deref(), Some("198.51.100.4:51821"));
    let mut w = sites();
    // A bare address takes the listen port; IPv6 in brackets; no address at all: none.
    w.c.nodes[2].metadata.annotations = Some([(EXTERNAL_ENDPOINT_ANNOTATION.into(), "198.51.100.4".into())].into());
    w.c.nodes[1].metadata.annotations =
        Some([(EXTERNAL_ENDPOINT_ANNOTATION.into(), "[2001:db8::10]:4500".into())].into());
    w.c.nodes[0].status = None;
    let out = run(&w);
    let endpoint = |n: &str| out.overlay[n].endpoint.map(|e| e.to_string());
    assert_eq!(endpoint("vm").as_deref(), Some("198.51.100.4:51820"));
    assert_eq!(endpoint("home").as_deref(), Some("[2001:db8::10]:4500"));
    assert_eq!(endpoint("cloud"), None);
    // A peer without an endpoint is still a peer: it sends first.
    let vm = &out.node_states["vm"].netns[0].wireguard_devices[0];
    assert!(vm.peers.iter().any(|p| p.public_key == key(1) && p.endpoint.is_empty()));
    // IPv4 first among a type's addresses.
    let mut w = sites();
    w.c.nodes[0] =
        node("cloud", &[("ExternalIP", "2001:db8::7"), ("ExternalIP", "203.0.113.7")], &["10.42.0.0/24"], &[]);
    assert_eq!(run(&w).overlay["cloud"].endpoint.map(|e| e.to_string()).as_deref(), Some("203.0.113.7:51820"));
}

#[test]
fn the_mtu_is_the_nodes_own_underlay_less_60_or_80_over_ipv6() {
    let out = run(&sites());
    // cloud reports 1500, home 1492, vm nothing (Ethernet's 1500 until it does).
    assert_eq!((out.overlay["cloud"].mtu, out.overlay["home"].mtu, out.overlay["vm"].mtu), (1440, 1432, 1440));
    let mut w = sites();
    w.c.nodes[2].metadata.annotations =
        Some([(EXTERNAL_ENDPOINT_ANNOTATION.into(), "[2001:db8::4]:51820".into())].into());
    let out = run(&w);
    assert_eq!((out.overlay["cloud"].mtu, out.overlay["home"].mtu, out.overlay["vm"].mtu), (1420, 1412, 1420));
}

#[test]
fn the_overlay_address_is_the_pod_cidrs_first_address_and_needs_no_memory() {
    let cidrs: Vec<IpNet> =
        ["fd00:42:7::/64", "10.42.7.0/24", "10.99.0.0/16"].iter().map(|c| c.parse().unwrap()).collect();
    assert_eq!(overlay_address(&cidrs), Some("10.42.7.0".parse().unwrap()));
    assert_eq!(overlay_address(&cidrs[..1]), None);
    // The same inputs compute the same address whatever else is in the cluster (a new leader
    // has no memory to consult), and a node keeps it when others join or leave.
    let out = run(&sites());
    let mut w = sites();
    w.c.nodes.remove(0);
    w.c.facts.remove(0);
    assert_eq!(run(&w).overlay["home"].address, out.overlay["home"].address);
}

#[test]
fn settings_refuse_an_interface_the_executor_would_not_own() {
    assert!(OverlaySettings::new("kup-wg", 51820).is_ok());
    assert!(OverlaySettings::new("kup-mesh0", 1).is_ok());
    for bad in ["kuport-wg", "wg0", "kup-", "kup-0123456789ab", "kup-a/b"] {
        assert_eq!(OverlaySettings::new(bad, 51820), Err(SettingsError::Interface(bad.into())), "{bad}");
    }
    assert_eq!(OverlaySettings::new("kup-wg", 0), Err(SettingsError::ListenPort));
}

#[test]
fn only_members_keys_and_endpoints_are_published() {
    let mut w = sites();
    w.c.nodes[1].spec = None;
    let a = annotations(&run(&w).overlay);
    assert_eq!(a.keys().collect::<Vec<_>>(), ["cloud", "vm"]);
    assert_eq!(a["cloud"][PUBLIC_KEY_ANNOTATION], key(1));
    assert_eq!(a["cloud"][ENDPOINT_ANNOTATION], "203.0.113.7:51820");
    // The operator's override is read, and the computed endpoint published under another key.
    assert_eq!(a["vm"][ENDPOINT_ANNOTATION], "198.51.100.4:51821");
    assert_ne!(ENDPOINT_ANNOTATION, EXTERNAL_ENDPOINT_ANNOTATION);
    assert_eq!(PUBLISHED_ANNOTATIONS, [PUBLIC_KEY_ANNOTATION, ENDPOINT_ANNOTATION]);
    // Published on the Node, then read back: the mesh is the same (no feedback).
    let mut back = sites();
    for n in &mut back.c.nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let mut published = annotations(&run(&sites()).overlay).remove(&name).unwrap_or_default();
        published.insert(ENDPOINT_ANNOTATION.into(), "192.0.2.99:1".into());
        n.metadata.annotations.get_or_insert_default().extend(published);
    }
    assert_eq!(run(&back).overlay, run(&sites()).overlay);
    // A member without a usable address has no endpoint to publish.
    let mut w = sites();
    w.c.nodes[1].status = None;
    let a = annotations(&run(&w).overlay);
    assert!(!a["home"].contains_key(ENDPOINT_ANNOTATION), "{a:?}");
}

// ---- properties ------------------------------------------------------------------------------

/// A random node: a pod CIDR that may overlap others', a key that may repeat or be malformed,
/// an address of some type, maybe an endpoint annotation.
#[derive(Clone, Debug)]
struct GenNode {
    cidr: (u8, u8),
    key: Option<u8>,
    malformed: bool,
    external: bool,
    annotation: Option<&'static str>,
}

fn gen_node() -> impl Strategy<Value = GenNode> {
    let annotation = prop_oneof![
        4 => Just(None),
        1 => Just(Some("198.51.100.4:51821")),
        1 => Just(Some("[2001:db8::4]:51820")),
        1 => Just(Some("not an endpoint")),
    ];
    // Prefixes 22..=26 of 10.42.0.0/16 at a few starts: nested, disjoint and equal ones happen.
    ((0u8..8, 22u8..=26), prop::option::of(0u8..12), prop::bool::weighted(0.1), any::<bool>(), annotation)
        .prop_map(|(cidr, key, malformed, external, annotation)| GenNode { cidr, key, malformed, external, annotation })
}

fn build(nodes: &[GenNode]) -> World {
    let mut w = World::new();
    for (i, g) in nodes.iter().enumerate() {
        let name = format!("n{i:02}");
        let net: IpNet = format!("10.42.{}.0/{}", g.cidr.0 * 4, g.cidr.1).parse().unwrap();
        let cidr = net.trunc().to_string();
        let ip = format!("100.64.0.{}", i + 1);
        let kind = if g.external { "ExternalIP" } else { "InternalIP" };
        let ann: Vec<(&str, &str)> = g.annotation.map(|a| (EXTERNAL_ENDPOINT_ANNOTATION, a)).into_iter().collect();
        w.c.nodes.push(node(&name, &[(kind, &ip)], &[&cidr], &ann));
        let k = g.key.map(|k| if g.malformed { format!("{}x", key(k)) } else { key(k) });
        w.c.facts.push(facts(&name, k, Some(1400 + i as u32)));
    }
    w
}

/// A prefix as an inclusive range of numbers, IPv6 above every IPv4 one.
fn ranges(c: &str) -> (u128, u128) {
    match c.parse::<IpNet>().unwrap() {
        IpNet::V4(n) => (u32::from(n.network()).into(), u32::from(n.broadcast()).into()),
        IpNet::V6(n) => (u128::from(n.network()).max(1 << 32), u128::from(n.broadcast()).max(1 << 32)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// A lists B iff B lists A, under the key each reports; allowed IPs never overlap across the
    /// peers of one node nor the node's own pod CIDRs; the routes are the fewest prefixes of
    /// exactly the IPv4 addresses its peers allow; a
    /// refused node has no device and is no one's peer; and input order does not matter.
    #[test]
    fn peers_are_symmetric_and_allowed_ips_never_overlap(nodes in prop::collection::vec(gen_node(), 0..12)) {
        let w = build(&nodes);
        let out = run(&w);
        let key_of: BTreeMap<&str, &str> =
            out.overlay.iter().filter_map(|(n, o)| Some((n.as_str(), o.public_key.as_deref()?))).collect();
        let node_of: BTreeMap<&str, &str> = key_of.iter().map(|(n, k)| (*k, *n)).collect();
        prop_assert_eq!(key_of.len(), node_of.len(), "members' keys are distinct");
        let mut lists: BTreeSet<(String, String)> = BTreeSet::new();
        for (n, state) in &out.node_states {
            let devices: Vec<_> = state.netns.iter().flat_map(|s| &s.wireguard_devices).collect();
            if !key_of.contains_key(n.as_str()) {
                prop_assert!(devices.is_empty(), "refused {} has a device", n);
                prop_assert!(state.netns.iter().all(|s| s.nft_tables.iter().all(|t| t.name != super::NFT_TABLE)));
                prop_assert!(!out.overlay[n].refused.is_empty());
                continue;
            }
            prop_assert_eq!(devices.len(), 1);
            // The overlay's filter on every member, for its device.
            let filter: Vec<_> =
                state.netns[0].nft_tables.iter().filter(|t| t.name == super::NFT_TABLE).cloned().collect();
            prop_assert_eq!(plain(filter), vec![super::filter_table(DEFAULT_INTERFACE, &member_cidrs(&out))]);
            let mut taken: Vec<((u128, u128), String)> =
                out.overlay[n].pod_cidrs.iter().map(|c| (ranges(&c.to_string()), n.clone())).collect();
            for p in &devices[0].peers {
                let peer = node_of.get(p.public_key.as_str());
                prop_assert!(peer.is_some(), "{} lists a key no member holds", n);
                let peer = peer.copied().unwrap_or_default();
                prop_assert!(peer != n.as_str());
                lists.insert((n.clone(), peer.to_string()));
                prop_assert_eq!(p.persistent_keepalive_seconds, u32::from(KEEPALIVE_SECONDS));
                for a in &p.allowed_ips {
                    let r = ranges(a);
                    for (t, owner) in &taken {
                        prop_assert!(r.1 < t.0 || t.1 < r.0, "{}: {} of {} overlaps {}'s", n, a, peer, owner);
                    }
                    taken.push((r, peer.to_string()));
                }
            }
            let allowed: Vec<IpNet> = devices[0]
                .peers
                .iter()
                .flat_map(|p| p.allowed_ips.iter().filter_map(|a| a.parse().ok()))
                // IPv4 only: IPv6 pod CIDRs are not routed yet (docs/overlay/mesh.md).
                .filter(|a: &IpNet| matches!(a, IpNet::V4(_)))
                .collect();
            let mut routed: Vec<IpNet> = state.netns[0]
                .routes
                .iter()
                .filter(|r| r.dev == DEFAULT_INTERFACE)
                .filter_map(|r| r.dst.parse().ok())
                .collect();
            routed.sort();
            prop_assert_eq!(
                IpNet::aggregate(&allowed),
                routed,
                "{}: routes of exactly the IPv4 addresses its peers allow, as the fewest prefixes",
                n
            );
            let address = out.overlay[n].address.map(|a| format!("{a}/32"));
            let on_device: Vec<&str> =
                state.netns[0].addresses.iter().filter(|a| a.dev == DEFAULT_INTERFACE).map(|a| a.cidr.as_str()).collect();
            prop_assert_eq!(on_device, address.iter().map(String::as_str).collect::<Vec<_>>());
        }
        for (a, b) in &lists {
            prop_assert!(lists.contains(&(b.clone(), a.clone())), "{} lists {} but not the reverse", a, b);
        }
        let members = key_of.len();
        prop_assert_eq!(lists.len(), members * members.saturating_sub(1), "a full mesh of the members");
        let mut r = w.clone();
        r.c.nodes.reverse();
        r.c.facts.reverse();
        prop_assert_eq!(run(&r), out);
    }
}

/// The folder source carries what the mesh reads: a Node's podCIDRs and annotations, and a
/// NodeFacts document's key.
#[test]
fn the_folder_source_carries_pod_cidrs_annotations_and_keys() {
    let yaml = format!(
        r#"
apiVersion: v1
kind: Node
metadata:
  name: vm
  annotations:
    {EXTERNAL_ENDPOINT_ANNOTATION}: "198.51.100.4:51821"
spec:
  podCIDRs: ["10.42.2.0/24"]
status:
  addresses: [{{type: InternalIP, address: 172.31.5.4}}]
---
apiVersion: v1
kind: Node
metadata: {{name: home}}
spec:
  podCIDR: 10.42.1.0/24
status:
  addresses: [{{type: InternalIP, address: 192.168.1.10}}]
---
apiVersion: kuport.wlz.li/v1alpha1
kind: NodeFacts
metadata: {{name: vm}}
wireguardPublicKey: "{}"
---
apiVersion: kuport.wlz.li/v1alpha1
kind: NodeFacts
metadata: {{name: home}}
wireguardPublicKey: "{}"
"#,
        key(3),
        key(2)
    );
    let mut c = crate::observe::Cluster::default();
    crate::render::load_text(std::path::Path::new("mesh.yaml"), &yaml, &mut c).unwrap();
    let out = compute(&c, &on());
    let home = &out.node_states["home"].netns[0].wireguard_devices[0];
    let peer = home.peers.iter().next().expect("a peer");
    assert_eq!(peer.endpoint, "198.51.100.4:51821");
    assert_eq!(peer.allowed_ips, ["10.42.2.0/24"]);
    assert_eq!(out.overlay["vm"].peers().collect::<Vec<_>>(), ["home"]);
}

/// What the Kubernetes source digests of a Node changes with what the mesh reads, and not with
/// a heartbeat.
#[test]
fn a_node_watch_recomputes_for_pod_cidrs_addresses_the_endpoint_annotation_and_relay_labels() {
    use crate::observe::index::node_inputs;
    let digest = |n: &Node| format!("{:?}", node_inputs(n));
    let base = node("vm", &[("InternalIP", "172.31.5.4")], &["10.42.2.0/24"], &[]);
    let mut heartbeat = base.clone();
    heartbeat.metadata.resource_version = Some("2".into());
    heartbeat.metadata.annotations = Some([("node.alpha.kubernetes.io/ttl".into(), "0".into())].into());
    assert_eq!(digest(&heartbeat), digest(&base));
    let changed = [
        node("vm", &[("InternalIP", "172.31.5.4")], &["10.42.3.0/24"], &[]),
        node("vm", &[("ExternalIP", "172.31.5.4")], &["10.42.2.0/24"], &[]),
        node(
            "vm",
            &[("InternalIP", "172.31.5.4")],
            &["10.42.2.0/24"],
            &[(EXTERNAL_ENDPOINT_ANNOTATION, "198.51.100.4")],
        ),
        // A published one removed or changed by hand: the status writer puts it back.
        node("vm", &[("InternalIP", "172.31.5.4")], &["10.42.2.0/24"], &[(PUBLIC_KEY_ANNOTATION, "x")]),
        node("vm", &[("InternalIP", "172.31.5.4")], &["10.42.2.0/24"], &[(ENDPOINT_ANNOTATION, "x")]),
    ];
    let mut relay = base.clone();
    relay.metadata.labels = Some([(relays::RELAY_LABEL.into(), "true".into())].into());
    let mut control_plane = base.clone();
    control_plane.metadata.labels = Some([(relays::CONTROL_PLANE_LABEL.into(), String::new())].into());
    let mut routes = base.clone();
    routes.metadata.annotations = Some([(WRITTEN_ANNOTATIONS[2].into(), "x".into())].into());
    let mut key_held = base.clone();
    key_held.metadata.labels = Some([(KEY_HELD_LABEL.into(), "aa".into())].into());
    for c in changed.into_iter().chain([relay, control_plane, routes, key_held]) {
        assert_ne!(digest(&c), digest(&base), "{c:?}");
    }
    let mut other_label = base.clone();
    other_label.metadata.labels = Some([("topology.kubernetes.io/zone".into(), "a".into())].into());
    assert_eq!(digest(&other_label), digest(&base), "a label the mesh does not read");
}

// ---- relays (docs/overlay/relays.md) ---------------------------------------------------------

fn label(n: &mut Node, k: &str, v: &str) {
    n.metadata.labels.get_or_insert_default().insert(k.into(), v.into());
}

/// `node`'s report of its peer with key `peer_key`: live at `endpoint`, or never heard from,
/// with `reach`.
fn report(w: &mut World, node: &str, peer_key: String, endpoint: Option<&str>, reach: Reach) {
    let now = w.c.now;
    let p = ObservedPeer {
        endpoint: endpoint.map(|e| e.parse().expect("endpoint")),
        last_handshake: endpoint.map(|_| Timestamp::from_second(now.as_second() - 10).expect("time")),
        reach,
    };
    std::sync::Arc::make_mut(w.c.overlay_observed.reports.entry(node.into()).or_default()).insert(peer_key, p);
}

/// The issue's scenario: a cloud node with a public address (a control-plane node, so a
/// relay) and two homes behind their own NATs, on the same LAN prefix, that report each other
/// unreachable. Both reach the cloud.
fn homes() -> World {
    let mut w = World::new();
    let mut cloud = node("cloud", &[("ExternalIP", "203.0.113.10")], &["10.42.0.0/24"], &[]);
    label(&mut cloud, CONTROL_PLANE_LABEL, "");
    w.c.nodes = vec![
        cloud,
        node("home-a", &[("InternalIP", "10.99.0.2")], &["10.42.1.0/24"], &[]),
        node("home-b", &[("InternalIP", "10.99.0.2")], &["10.42.2.0/24"], &[]),
    ]
    .into();
    w.c.facts = vec![
        facts("cloud", Some(key(1)), Some(1500)),
        facts("home-a", Some(key(2)), Some(1500)),
        facts("home-b", Some(key(3)), Some(1500)),
    ];
    report(&mut w, "cloud", key(2), Some("198.51.100.10:51820"), Reach::Direct);
    report(&mut w, "cloud", key(3), Some("192.0.2.10:51820"), Reach::Direct);
    report(&mut w, "home-a", key(1), Some("203.0.113.10:51820"), Reach::Direct);
    report(&mut w, "home-a", key(3), None, Reach::Unreachable);
    report(&mut w, "home-b", key(1), Some("203.0.113.10:51820"), Reach::Direct);
    report(&mut w, "home-b", key(2), None, Reach::Unreachable);
    w
}

/// Every member's peers as the renderer does not show them: probe address and keepalive.
fn probes(out: &Outputs) -> String {
    let mut t = String::from("=== probes\n");
    for (n, s) in &out.node_states {
        for p in s.netns.iter().flat_map(|ns| &ns.wireguard_devices).flat_map(|d| &d.peers) {
            t.push_str(&format!(
                "{n}: peer {} probe {} keepalive {} allowed-ips {}\n",
                &p.public_key[..8],
                p.probe_address,
                p.persistent_keepalive_seconds,
                p.allowed_ips.join(",")
            ));
        }
    }
    t
}

#[test]
fn golden_relayed_homes() {
    let out = run(&homes());
    assert_eq!(out.overlay["home-a"].routes["home-b"], PeerRoute::Via("cloud".into()));
    // The Debug service's lines (kuportctl reads them as "name: value").
    let lines = debug_lines(&out.overlay["home-a"]);
    assert_eq!(lines.last().map(String::as_str), Some("routes: cloud=direct,home-b=via cloud"));
    assert!(debug_lines(&out.overlay["cloud"]).iter().any(|l| l == "relay: candidate"));
    // What home-a's executor reported, on its Node.
    assert_eq!(
        annotations(&out.overlay)["home-a"][PEERS_ANNOTATION],
        r#"{"cloud":{"endpoint":"203.0.113.10:51820","state":"direct"},"home-b":{"state":"unreachable"}}"#
    );
    insta::assert_snapshot!("relayed_homes", format!("{}{}", text(&out), probes(&out)));
}

/// The scenario's transitions: a port forward (neither reports the other unreachable) makes the
/// pair direct; without the relay (its label says false) the pair is unreachable on its direct
/// entry; one side's report alone relays it.
#[test]
fn the_homes_go_direct_without_reports_and_stay_on_the_direct_entry_without_a_relay() {
    let route = |w: &World| run(w).overlay["home-a"].routes["home-b"].clone();
    assert_eq!(route(&homes()), PeerRoute::Via("cloud".into()));
    let mut w = homes();
    report(&mut w, "home-a", key(3), Some("192.0.2.10:51820"), Reach::Direct);
    assert_eq!(route(&w), PeerRoute::Via("cloud".into()), "home-b still reports home-a unreachable");
    report(&mut w, "home-b", key(2), Some("198.51.100.10:51820"), Reach::Unknown);
    assert_eq!(route(&w), PeerRoute::Direct, "unknown is no news");
    let out = run(&w);
    assert_eq!(annotations(&out.overlay)["home-a"][ROUTES_ANNOTATION], r#"{"cloud":"direct","home-b":"direct"}"#);
    let mut w = homes();
    label(&mut w.c.nodes[0], RELAY_LABEL, "false");
    let out = run(&w);
    assert_eq!(out.overlay["home-b"].routes["home-a"], PeerRoute::Unreachable);
    assert!(!out.overlay["cloud"].relay);
    assert_eq!(
        plain(out.node_states["cloud"].netns[0].nft_tables.to_vec()),
        vec![filter_table(DEFAULT_INTERFACE, &member_cidrs(&out))]
    );
    let a = &out.node_states["home-a"].netns[0].wireguard_devices[0];
    let b = a.peers.iter().find(|p| p.public_key == key(3)).expect("home-b");
    assert_eq!((b.allowed_ips.as_slice(), b.persistent_keepalive_seconds), (&["10.42.2.0/24".to_string()][..], 0));
    // A home labelled a relay relays nothing between the homes: it is one of the pair.
    label(&mut w.c.nodes[1], RELAY_LABEL, "true");
    assert_eq!(run(&w).overlay["home-b"].routes["home-a"], PeerRoute::Unreachable);
}

fn reach_of(i: u8) -> Reach {
    match i {
        0 => Reach::Unknown,
        1 => Reach::Direct,
        _ => Reach::Unreachable,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random reach matrices over up to 8 members, some of them relays, maybe one dual-stack
    /// and one IPv6-only:
    /// - both sides of every pair agree on its route;
    /// - a pair is relayed or unreachable iff one side reports the other unreachable, and
    ///   unreachable only when no relay both reach directly exists;
    /// - a relayed pair's relay is a candidate, neither side of the pair, reached directly by
    ///   both (neither pair with it broken);
    /// - on every node, no two peers' allowed IPs overlap, except a relayed peer's overlay /32
    ///   inside its pod CIDR on the relay's entry;
    /// - every member's pod CIDRs sit on exactly one peer entry of every other member: the
    ///   peer's own (direct or unreachable), or the relay's, which holds them on its own entry
    ///   of the peer;
    /// - every entry probes its peer's overlay address; relays have the relay accept, the
    ///   others only the drop.
    #[test]
    fn relayed_routes_agree_and_every_pod_cidr_is_on_exactly_one_entry(
        n in 2usize..=8,
        relay in prop::collection::vec(prop::bool::weighted(0.4), 8),
        matrix in prop::collection::vec(prop::collection::vec(0u8..3, 8), 8),
        v6 in any::<bool>(),
    ) {
        let mut w = World::new();
        let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            let v4 = format!("10.42.{i}.0/24");
            let six = format!("fd00:42:{i}::/64");
            // With v6: n0 dual-stack, n1 IPv6 only (no overlay address, so no probe address).
            let cidrs: Vec<&str> = match (v6, i) {
                (true, 0) => vec![&v4, &six],
                (true, 1) => vec![&six],
                _ => vec![&v4],
            };
            let mut nd = node(name, &[("InternalIP", &format!("100.64.0.{}", i + 1))], &cidrs, &[]);
            if relay[i] {
                label(&mut nd, if i % 2 == 0 { CONTROL_PLANE_LABEL } else { RELAY_LABEL }, "true");
            }
            w.c.nodes.push(nd);
            w.c.facts.push(facts(name, Some(key(i as u8)), None));
        }
        for i in 0..n {
            for j in (0..n).filter(|j| *j != i) {
                report(&mut w, &names[i], key(j as u8), None, reach_of(matrix[i][j]));
            }
        }
        let broken = |i: usize, j: usize| matrix[i][j] == 2 || matrix[j][i] == 2;
        let out = run(&w);
        let idx = |s: &str| names.iter().position(|x| x == s).expect("a member");
        let o = |i: usize| &out.overlay[&names[i]];
        for i in 0..n {
            prop_assert_eq!(o(i).relay, relay[i]);
            let cidrs = member_cidrs(&out);
            let want = if relay[i] {
                super::relay_filter_table(DEFAULT_INTERFACE, &cidrs)
            } else {
                super::filter_table(DEFAULT_INTERFACE, &cidrs)
            };
            let ns = kuport_proto::v1::NetnsState { nft_tables: vec![want].into(), ..Default::default() };
            let mut want_state = kuport_proto::v1::NodeState { netns: vec![ns], ..Default::default() };
            kuport_proto::canonicalize(&mut want_state);
            prop_assert_eq!(&out.node_states[&names[i]].netns[0].nft_tables, &want_state.netns[0].nft_tables);
            for j in (0..n).filter(|j| *j != i) {
                let r = &o(i).routes[&names[j]];
                prop_assert_eq!(r, &o(j).routes[&names[i]], "{} and {} disagree", i, j);
                let common = (0..n).any(|k| k != i && k != j && relay[k] && !broken(i, k) && !broken(j, k));
                match r {
                    PeerRoute::Direct => prop_assert!(!broken(i, j)),
                    PeerRoute::Unreachable => prop_assert!(broken(i, j) && !common),
                    PeerRoute::Via(via) => {
                        let k = idx(via);
                        prop_assert!(broken(i, j) && relay[k] && k != i && k != j);
                        prop_assert!(!broken(i, k) && !broken(j, k), "{} is not reached directly by both", via);
                    }
                }
            }
        }
        // Per node: entries by peer.
        let entries = |i: usize| -> BTreeMap<usize, kuport_proto::v1::WireguardPeer> {
            out.node_states[&names[i]].netns[0].wireguard_devices[0]
                .peers
                .iter()
                .map(|p| ((0..n).find(|k| key(*k as u8) == p.public_key).expect("a member's key"), p.clone()))
                .collect()
        };
        for i in 0..n {
            let es = entries(i);
            prop_assert_eq!(es.len(), n - 1);
            let mut taken: Vec<((u128, u128), usize)> = Vec::new();
            for (j, p) in &es {
                prop_assert_eq!(&p.probe_address, &o(*j).address.map(|a| a.to_string()).unwrap_or_default());
                let relayed = matches!(o(i).routes[&names[*j]], PeerRoute::Via(_));
                let direct = o(i).routes[&names[*j]] == PeerRoute::Direct;
                prop_assert_eq!(p.persistent_keepalive_seconds, if direct { 25 } else { 0 });
                for a in &p.allowed_ips {
                    if relayed && *a == format!("{}/32", p.probe_address) {
                        continue;
                    }
                    let r = ranges(a);
                    for (t, owner) in &taken {
                        prop_assert!(r.1 < t.0 || t.1 < r.0, "n{}: {} of n{} overlaps n{}'s", i, a, j, owner);
                    }
                    taken.push((r, *j));
                }
            }
            for j in (0..n).filter(|j| *j != i) {
                for c in o(j).pod_cidrs.iter().map(ToString::to_string) {
                    let holders: Vec<usize> =
                        es.iter().filter(|(_, p)| p.allowed_ips.contains(&c)).map(|(k, _)| *k).collect();
                    prop_assert_eq!(holders.len(), 1, "n{}: {} of n{} on {:?}", i, c, j, holders);
                    match &o(i).routes[&names[j]] {
                        PeerRoute::Via(via) => {
                            let k = idx(via);
                            prop_assert_eq!(holders[0], k);
                            prop_assert!(entries(k)[&j].allowed_ips.contains(&c), "the relay holds n{}'s {}", j, c);
                        }
                        _ => prop_assert_eq!(holders[0], j),
                    }
                }
            }
        }
    }
}

/// A relay's table: an interval set of the members' IPv4 pod CIDRs, its accept and its drop of
/// what arrives for an address outside it, and the IPv6 ones only when some member has an IPv6
/// pod CIDR. This text was loaded with `nft -f` (1.0.6) by hand and lists back identically with
/// `nft -s` (docs/overlay/relays.md, docs/overlay/filter.md).
#[test]
fn a_relay_gets_pods_v6_only_when_some_pod_cidr_is_ipv6() {
    let cidrs: Vec<IpNet> =
        ["10.42.0.0/24", "10.42.1.0/24", "fd00:42::/64"].iter().map(|c| c.parse().expect("cidr")).collect();
    let text = |cidrs: &[IpNet]| kuport_proto::text::nft_table(&relay_filter_table(DEFAULT_INTERFACE, cidrs));
    let v4 = r#"iifname "kup-wg" oifname "kup-wg" ip saddr @pods_v4 ip daddr @pods_v4 counter accept"#;
    let v6 = r#"iifname "kup-wg" oifname "kup-wg" ip6 saddr @pods_v6 ip6 daddr @pods_v6 counter accept"#;
    let drop = r#"iifname "kup-wg" oifname "kup-wg" counter drop"#;
    let out4 = r#"iifname "kup-wg" ip daddr != @pods_v4 counter drop"#;
    let out6 = r#"iifname "kup-wg" ip6 daddr != @pods_v6 counter drop"#;
    let both = text(&cidrs);
    let order: Vec<usize> =
        ["maxseg", v4, v6, drop, out4, out6].iter().map(|l| both.find(l).expect("a rule")).collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "clamp, accepts, drop, drops of the outside: {both}");
    assert!(both.contains("elements = { fd00:42::/64 }"), "{both}");
    let only_v4 = text(&cidrs[..2]);
    assert!(only_v4.contains(v4) && only_v4.contains(out4) && !only_v4.contains("pods_v6"), "{only_v4}");
}

/// Every member's pod CIDRs, sorted: what every member's filter holds in its sets.
/// A member's routes are the other members' IPv4 pod addresses as the fewest prefixes: a few
/// routes for a mesh of contiguous pod CIDRs, whatever its size.
#[test]
fn routes_are_the_other_members_pod_addresses_as_the_fewest_prefixes() {
    let nets = |s: &[&str]| -> Vec<IpNet> { s.iter().filter_map(|c| c.parse().ok()).collect() };
    let text = |v: Vec<ipnet::Ipv4Net>| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    let four = IpNet::aggregate(&nets(&["10.42.0.0/24", "10.42.1.0/24", "10.42.2.0/24", "10.42.3.0/24"]));
    assert_eq!(four, nets(&["10.42.0.0/22"]));
    assert_eq!(text(others_v4(&four, &nets(&["10.42.1.0/24", "fd00::/64"]))), ["10.42.0.0/24", "10.42.2.0/23"]);
    assert_eq!(text(others_v4(&four, &nets(&["fd00::/64"]))), ["10.42.0.0/22"]);
    // docs/overlay/mesh.md's example: ten members, 10.42.0.0/24 to 10.42.9.0/24.
    let ten: Vec<String> = (0..10).map(|i| format!("10.42.{i}.0/24")).collect();
    let ten = IpNet::aggregate(&ten.iter().filter_map(|c| c.parse().ok()).collect());
    assert_eq!(
        text(others_v4(&ten, &nets(&["10.42.3.0/24"]))),
        ["10.42.0.0/23", "10.42.2.0/24", "10.42.4.0/22", "10.42.8.0/23"]
    );
    let apart = nets(&["10.1.0.0/24", "10.3.0.0/24", "fd00::/64"]);
    assert_eq!(text(others_v4(&apart, &nets(&["10.3.0.0/24"]))), ["10.1.0.0/24"]);
    // 1,000 members numbered from 10.42.0.0/24: six prefixes in all, at most 6 + 24 routes each.
    let all: Vec<IpNet> = (0..1000u32)
        .map(|i| IpNet::V4(ipnet::Ipv4Net::new((0x0a2a_0000 + (i << 8)).into(), 24).expect("a /24")))
        .collect();
    let merged = IpNet::aggregate(&all);
    assert_eq!(merged.len(), 6);
    for (i, own) in all.iter().enumerate() {
        let routes = others_v4(&merged, std::slice::from_ref(own));
        assert!(routes.len() <= 30, "{i}: {routes:?}");
        let addresses: u64 = routes.iter().map(|r| 1u64 << (32 - r.prefix_len())).sum();
        assert_eq!(addresses, 999 * 256, "{i}");
        let apart_from_own = |r: &ipnet::Ipv4Net| !IpNet::V4(*r).contains(own) && !own.contains(&IpNet::V4(*r));
        assert!(routes.iter().all(apart_from_own), "{i}: {routes:?}");
    }
}

fn member_cidrs(out: &crate::compute::Outputs) -> Vec<IpNet> {
    let cidrs: Vec<IpNet> =
        out.overlay.values().filter(|o| o.refused.is_empty()).flat_map(|o| o.pod_cidrs.clone()).collect();
    IpNet::aggregate(&cidrs)
}

/// Tables without the digests the state's canonical form adds to sets, to compare with what the
/// builders make.
fn plain(mut tables: Vec<kuport_proto::v1::NftTable>) -> Vec<kuport_proto::v1::NftTable> {
    for s in tables.iter_mut().flat_map(|t| t.sets.iter_mut()) {
        s.digest.clear();
        s.runs.clear();
    }
    tables
}

// ---- one node cannot act for another (issue 25, finding 6) ----------------------------------

/// The label the controller writes on a member's Node for its key, spelled out: the first 30
/// bytes of the key's SHA-256 in hex, under NodeRestriction's prefix.
fn held(n: &mut Node, k: &str) {
    use sha2::{Digest, Sha256};
    let tag: String = Sha256::digest(k.as_bytes()).iter().take(30).map(|b| format!("{b:02x}")).collect();
    label(n, "node-restriction.kubernetes.io/kuport-key", &tag);
}

/// A compromised node (home) reports cloud's published key, and forges the key annotation on
/// its own Node (its kubelet may): cloud, whose Node holds the key, keeps its place and its
/// peers on every other node; only home is refused, with a reason naming cloud. The same when
/// cloud is out of the mesh for a while (no key reported): home does not take its key.
#[test]
fn a_node_that_reports_another_members_key_is_refused_and_the_holder_stays() {
    let world = || {
        let mut w = sites();
        w.c.nodes.push(node("edge", &[("InternalIP", "10.0.0.9")], &["10.42.3.0/24"], &[]));
        w.c.facts.push(facts("edge", Some(key(4)), None));
        held(&mut w.c.nodes[0], &key(1));
        w.c.facts[1].wireguard_public_key = Some(key(1));
        w.c.nodes[1].metadata.annotations = Some([(PUBLIC_KEY_ANNOTATION.into(), key(1))].into());
        w
    };
    let out = run(&world());
    assert_refused(&out, "home", "PublicKeyHeld", "wireguardPublicKey");
    let why = &out.overlay["home"].refused[0];
    assert!(why.message.contains("node cloud holds this public key"), "{why}");
    assert_eq!(out.overlay["cloud"].public_key, Some(key(1)), "cloud stays");
    for other in ["vm", "edge"] {
        assert!(out.overlay[other].peers().any(|p| p == "cloud"), "{other} keeps cloud");
        let device = &out.node_states[other].netns[0].wireguard_devices[0];
        let cloud = device.peers.iter().filter(|p| p.public_key == key(1)).count();
        assert_eq!(cloud, 1, "{other}: cloud's entry, once");
    }
    // cloud out of the mesh for a while: its key stays held, home is still refused.
    let mut w = world();
    w.c.facts[0].wireguard_public_key = None;
    let out = run(&w);
    assert_refused(&out, "home", "PublicKeyHeld", "wireguardPublicKey");
    // With no Node holding it (a new cluster), two reporters of one key are both refused.
    let mut w = world();
    w.c.nodes[0].metadata.labels = None;
    let out = run(&w);
    assert_refused(&out, "home", reason::PUBLIC_KEY_CLASH, "wireguardPublicKey");
    assert_refused(&out, "cloud", reason::PUBLIC_KEY_CLASH, "wireguardPublicKey");
}

/// A kubelet may set `kuport.wlz.li/relay=true` on its own Node: it makes no relay. Only the
/// label under NodeRestriction's prefix (which no kubelet may set) does; the old one is
/// ignored, whatever its value.
#[test]
fn the_old_relay_label_a_kubelet_can_set_makes_no_relay() {
    let route = |old: Option<&str>, new: Option<&str>| {
        let mut w = homes();
        w.c.nodes[0].metadata.labels = None;
        if let Some(v) = old {
            label(&mut w.c.nodes[0], "kuport.wlz.li/relay", v);
        }
        if let Some(v) = new {
            label(&mut w.c.nodes[0], "node-restriction.kubernetes.io/kuport-relay", v);
        }
        let out = run(&w);
        (out.overlay["cloud"].relay, out.overlay["home-a"].routes["home-b"].clone())
    };
    assert_eq!(route(Some("true"), None), (false, PeerRoute::Unreachable));
    assert_eq!(route(None, Some("true")), (true, PeerRoute::Via("cloud".into())));
    assert_eq!(route(Some("true"), Some("true")), (true, PeerRoute::Via("cloud".into())));
    assert_eq!(route(Some("false"), Some("true")), (true, PeerRoute::Via("cloud".into())));
    assert_eq!(route(None, None), (false, PeerRoute::Unreachable));
    let mut w = homes();
    label(&mut w.c.nodes[0], "kuport.wlz.li/relay", "false");
    assert!(run(&w).overlay["cloud"].relay, "a control-plane node is a candidate whatever the old label says");
}
