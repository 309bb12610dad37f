//! The compute by change against the whole compute: random sequences of changes to one cluster
//! (endpoints, pods, their labels, Intercepts, PortMaps, keys, endpoints of members, reach
//! reports, the clock, a leader's restart) drive a long-lived [`Computer`], and after every step
//! its outputs must equal a compute from nothing. Statuses are written back after each step, as
//! the status writer does (but after an `Unwritten` one, whose outputs are then compared
//! without their times), and each member's published endpoints are fed back as the hub does.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeAddress, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use kuport_proto::v1::Reach;
use proptest::prelude::*;

use super::*;
use crate::api::{
    self, Intercept, InterceptPort, PodSelector, Protocol::Tcp, Protocol::Udp, ReturnPathMode::Vxlan, ServingMode,
};
use crate::compute::overlay::relays::RELAY_LABEL;
use crate::compute::overlay::{EXTERNAL_ENDPOINT_ANNOTATION, OverlaySettings};
use crate::compute::testkit::World;
use crate::compute::{Settings, compute};
use crate::observe::ObservedPeer;

const NODES: [&str; 4] = ["edge-a", "worker-b", "worker-c", "worker-d"];
/// (namespace, pod) of every pod, each an endpoint of a Service.
const PODS: [(&str, &str); 5] =
    [("web", "web-0"), ("web", "web-1"), ("web", "web-2"), ("games", "game-0"), ("games", "game-1")];

/// A WireGuard key: 32 bytes in base64, one per seed.
fn key(seed: u8) -> String {
    let c = char::from(b'B' + seed % 24);
    format!("{}A=", c.to_string().repeat(42))
}

fn intercept(namespace: &str, selects: &str) -> Intercept {
    let spec = api::InterceptSpec {
        pod_selector: PodSelector { match_labels: [("app".to_string(), selects.to_string())].into() },
        intercepts: vec![InterceptPort { protocol: Tcp, container_port: 3000, agent_port: 9900, proxy_port: None }],
        agent: Default::default(),
        mesh_dial_subnets: vec!["10.96.0.0/12".into()],
    };
    let mut i = Intercept::new("agent", spec);
    i.metadata.namespace = Some(namespace.into());
    i.metadata.generation = Some(1);
    i.metadata.creation_timestamp = Timestamp::from_second(1_700_000_000).ok().map(Time);
    i
}

/// Four nodes in the mesh, two classes, three PortMaps over two Services, an Intercept in each
/// namespace over its pods (a change in one namespace redoes only its Intercepts).
fn cluster() -> Cluster {
    let mut w = World::new()
        .node("edge-a", "100.64.93.143", true)
        .node("worker-b", "100.64.0.2", true)
        .node("worker-c", "100.64.0.3", true)
        .node("worker-d", "100.64.0.4", true)
        .facts("edge-a", 1420, &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.93.143")])
        .facts("worker-b", 1380, &[("wt0", "100.64.0.2")])
        .facts("worker-c", 1420, &[("wt0", "100.64.0.3")])
        .facts("worker-d", 1420, &[("wt0", "100.64.0.4")])
        .class("public", ServingMode::Single, Vxlan, &[("edge-a", &["enp1s0", "wt0"])])
        .class("pair", ServingMode::Multi, Vxlan, &[("edge-a", &["wt0"]), ("worker-c", &["wt0"])])
        .edit_class("pair", |s| {
            s.return_path.vxlan.vni = 4300;
            s.return_path.vxlan.subnet = "169.254.79.0/24".into();
            // Admission reads the Namespaces (Step::Publish).
            s.namespace_selector = Some(LabelSelector {
                match_labels: Some([("publish".into(), "yes".into())].into()),
                ..Default::default()
            });
        })
        .namespace("web", &[("publish", "yes")])
        .namespace("games", &[])
        .service(
            "web",
            "web",
            "TCP",
            3000,
            &[
                ("web-0", "worker-b", "10.244.1.7", true),
                ("web-1", "worker-c", "10.244.2.7", true),
                ("web-2", "worker-d", "10.244.3.7", false),
            ],
        )
        .service(
            "games",
            "game",
            "UDP",
            27015,
            &[("game-0", "edge-a", "10.244.0.107", true), ("game-1", "worker-b", "10.244.1.107", true)],
        )
        // Dual-stack web: a pod's IPv6 address is built beside its IPv4 one.
        .slice6(
            "web",
            "web",
            "v6",
            "TCP",
            3000,
            &[("web-0", "worker-b", "fd10:244:1::7", true), ("web-1", "worker-c", "fd10:244:2::7", true)],
        )
        // An external endpoint of the games Service, chosen while no Pod holds its address: a
        // web pod that takes it moves the games mapping (Step::Squat).
        .edit_class("public", |s| s.external_endpoints = vec!["10.244.9.0/24".into()])
        .edit_slices(|slices| {
            let games = slices.iter_mut().find(|s| s.metadata.name.as_deref() == Some("game-x"));
            if let Some(eps) = games.and_then(|s| s.endpoints.as_mut()) {
                eps.push(k8s_openapi::api::discovery::v1::Endpoint {
                    addresses: vec!["10.244.9.5".into()],
                    node_name: Some("edge-a".into()),
                    ..Default::default()
                });
            }
        })
        .port_map("web", "web", "public", Tcp, 3000, None, "web", 0)
        .port_map("games", "game", "public", Udp, 27015, Some(27115), "game", 1)
        .port_map("web", "web-pair", "pair", Tcp, 3001, None, "web", 2)
        // web's port in the same class: refused while web/web is older (Step::Remade).
        .port_map("web", "web-late", "public", Tcp, 3000, None, "web", 3);
    for (i, n) in w.c.nodes.iter_mut().enumerate() {
        n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            pod_cidrs: Some(vec![format!("10.244.{i}.0/24")]),
            ..Default::default()
        });
    }
    for (i, f) in w.c.facts.iter_mut().enumerate() {
        f.wireguard_public_key = Some(key(i as u8));
    }
    for p in w.c.pods.iter_mut() {
        p.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        p.metadata.uid = p.metadata.name.as_ref().map(|n| format!("uid-{n}"));
        p.status.get_or_insert_with(PodStatus::default).phase = Some("Running".into());
    }
    w.c.intercepts = vec![intercept("web", "web"), intercept("games", "web")].into();
    // A second candidate endpoint per member: a silent peer's endpoint rotates by the clock.
    for (i, n) in NODES.iter().enumerate() {
        let from = format!("198.18.0.{}", i + 1).parse().expect("an address");
        w.c.overlay_observed.connect_addresses.insert((*n).to_string(), from);
    }
    w.cluster()
}

/// One change to the cluster.
#[derive(Clone, Debug)]
enum Step {
    /// The `i`th endpoint of the web slice turns ready or not ready.
    Ready(usize),
    /// A pod's address moves.
    PodAddress(usize, u8),
    /// A pod's IPv4 address moves in its Pod and its slice, on the same node: its mappings are
    /// placed again over the links they had.
    Readdress(usize, u8),
    /// web-0 takes the games Service's external endpoint address, or gives it back.
    Squat,
    /// A dual-stack pod's IPv6 address moves (in its Pod and the IPv6 slice), its IPv4 stays.
    PodAddress6(usize, u8),
    /// A pod is relabelled in or out of the Intercept.
    Relabel(usize),
    /// A pod turns Running or Pending.
    Phase(usize),
    /// The Intercept selects the other label.
    Selector,
    /// The PortMap web/web-pair comes or goes.
    PortMap,
    /// A PortMap of web's in class public comes or goes, over the link web has: 0, the
    /// youngest of all on port 3002; 1, the oldest on web's port 3000, which it takes from web
    /// and web-late; 2, the oldest on UDP 27050, which it takes from games/game (another
    /// namespace).
    Extra(u8),
    /// What ties web's mappings to their endpoints moves: 0, web's IPv6 slice is relabelled to
    /// another Service or back; 1, the Service web is renamed or back; 2, web's IPv4 slice is
    /// made again at the end of the list (the lists no longer align).
    Service(u8),
    /// The web namespace loses or regains the label the class pair selects.
    Publish,
    /// Another writer moves back the time of the first condition of web/web's status (if
    /// true) or of class public's: a status not as the compute made it.
    Scribble(bool),
    /// web/web (if true) or web/web-late, which publish one port, is deleted and made again
    /// with the same spec in one change, in its place in the list: it is the younger now.
    Remade(bool),
    /// A node's key changes, or is lost.
    Key(usize, Option<u8>),
    /// A node's endpoint annotation comes or goes; an IPv6 one (every device's MTU) if true.
    Endpoint(usize, bool),
    /// A node's underlay MTU changes.
    Mtu(usize, u32),
    /// A node's pod CIDR moves (10.244.N.0/24, 10.245.N.0/24): every member's routes and filter.
    PodCidr(usize),
    /// A node's status lists 192.0.2.E, or no longer: an endpoint reported there is its own.
    NodeAddress(usize, u8),
    /// A node is a relay candidate or not.
    Relay(usize),
    /// A node reports a peer (reach, handshake seconds ago, the endpoint its WireGuard holds).
    Reach(usize, usize, Reach, Option<i64>, Option<u8>),
    /// A node's executor connects again, from another address: a candidate of its own.
    Connect(usize, u8),
    /// A member's state has not been sent since the leader started: no endpoint it gave is
    /// known (a publish lags the compute).
    Unsent(usize),
    /// The clock moves on (or is set back a little).
    Time(i64),
    /// A new leader: nothing kept.
    Restart,
    /// The uninstall's teardown is asked or withdrawn.
    Teardown,
    /// Two changes that arrive together, computed once.
    Both(Box<Step>, Box<Step>),
    /// A change whose statuses are not written back before the next (a status writer behind).
    Unwritten(Box<Step>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        9 => single(),
        1 => (single(), single()).prop_map(|(a, b)| Step::Both(Box::new(a), Box::new(b))),
        1 => single().prop_map(|s| Step::Unwritten(Box::new(s))),
    ]
}

fn single() -> impl Strategy<Value = Step> {
    let node = 0..NODES.len();
    let pod = 0..PODS.len();
    prop_oneof![
        (0usize..3).prop_map(Step::Ready),
        (pod.clone(), 1u8..250).prop_map(|(p, a)| Step::PodAddress(p, a)),
        (pod.clone(), 1u8..250).prop_map(|(p, a)| Step::Readdress(p, a)),
        (pod.clone(), 1u8..250).prop_map(|(p, a)| Step::PodAddress6(p, a)),
        pod.clone().prop_map(Step::Relabel),
        Just(Step::Squat),
        pod.prop_map(Step::Phase),
        Just(Step::Selector),
        Just(Step::PortMap),
        (0u8..3).prop_map(Step::Extra),
        (0u8..3).prop_map(Step::Service),
        any::<bool>().prop_map(Step::Remade),
        Just(Step::Publish),
        any::<bool>().prop_map(Step::Scribble),
        (node.clone(), proptest::option::of(0u8..6)).prop_map(|(n, k)| Step::Key(n, k)),
        (node.clone(), any::<bool>()).prop_map(|(n, v6)| Step::Endpoint(n, v6)),
        (node.clone(), prop_oneof![Just(1280u32), Just(1420), Just(1500)]).prop_map(|(n, m)| Step::Mtu(n, m)),
        node.clone().prop_map(Step::Relay),
        node.clone().prop_map(Step::PodCidr),
        (node.clone(), 1u8..4).prop_map(|(n, e)| Step::NodeAddress(n, e)),
        (
            node.clone(),
            node.clone(),
            prop_oneof![Just(Reach::Direct), Just(Reach::Unreachable), Just(Reach::Unknown)],
            proptest::option::of(0i64..400),
            proptest::option::of(1u8..5),
        )
            .prop_map(|(a, b, r, h, e)| Step::Reach(a, b, r, h, e)),
        (node.clone(), 1u8..4).prop_map(|(n, a)| Step::Connect(n, a)),
        node.prop_map(Step::Unsent),
        prop_oneof![3 => 1i64..400, 1 => -60i64..0, 1 => Just(crate::compute::portmap::links::RELEASE_AFTER_SECONDS)]
            .prop_map(Step::Time),
        Just(Step::Restart),
        Just(Step::Teardown),
    ]
}

/// Pod `p`'s IPv4 (or IPv6) address takes `last` for its last part, in its Pod and in every
/// slice: the pod stays where it is, at another address.
fn readdress(c: &mut Cluster, p: usize, v6: bool, last: &str) {
    let (ns, name) = PODS[p];
    let Some(pod) = named(&mut c.pods, Some(ns), name) else { return };
    let ips = pod.status.get_or_insert_default().pod_ips.get_or_insert_default();
    let Some(ip) = ips.iter_mut().find(|ip| ip.ip.contains(':') == v6) else { return };
    let old = ip.ip.clone();
    let new = format!("{}{last}", &old[..=old.rfind(if v6 { ':' } else { '.' }).unwrap_or(0)]);
    ip.ip = new.clone();
    for slice in c.endpoint_slices.iter_mut() {
        for address in slice.endpoints.iter_mut().flatten().flat_map(|e| e.addresses.iter_mut()) {
            if *address == old {
                *address = new.clone();
            }
        }
    }
}

fn named<'a, K: Resource + Clone>(list: &'a mut Objects<K>, ns: Option<&str>, name: &str) -> Option<&'a mut K> {
    list.iter_mut()
        .find(|o| o.meta().name.as_deref() == Some(name) && (ns.is_none() || o.meta().namespace.as_deref() == ns))
}

fn apply(c: &mut Cluster, step: &Step, computer: &mut Computer, settings: &Settings) {
    match step {
        Step::Ready(i) => {
            if let Some(s) = named(&mut c.endpoint_slices, Some("web"), "web-x")
                && let Some(e) = s.endpoints.as_mut().and_then(|e| e.get_mut(*i))
            {
                let c = e.conditions.get_or_insert_default();
                c.ready = Some(!c.ready.unwrap_or(false));
            }
        }
        Step::PodAddress(p, a) => {
            let (ns, name) = PODS[*p];
            if let Some(pod) = named(&mut c.pods, Some(ns), name) {
                let ips = pod.status.get_or_insert_default().pod_ips.get_or_insert_default();
                if let Some(ip) = ips.first_mut() {
                    let mut parts: Vec<String> = ip.ip.split('.').map(String::from).collect();
                    if let Some(last) = parts.last_mut() {
                        *last = a.to_string();
                    }
                    ip.ip = parts.join(".");
                }
            }
        }
        Step::Readdress(p, a) => readdress(c, *p, false, &a.to_string()),
        Step::Squat => {
            let ips = named(&mut c.pods, Some("web"), "web-0")
                .and_then(|pod| pod.status.as_mut()?.pod_ips.as_mut()?.first_mut());
            if let Some(ip) = ips {
                ip.ip = if ip.ip == "10.244.9.5" { "10.244.1.7".into() } else { "10.244.9.5".into() };
            }
        }
        Step::PodAddress6(p, a) => readdress(c, *p, true, &format!("{a:x}")),
        Step::Relabel(p) => {
            let (ns, name) = PODS[*p];
            if let Some(pod) = named(&mut c.pods, Some(ns), name) {
                let labels = pod.metadata.labels.get_or_insert_default();
                let app = labels.entry("app".into()).or_default();
                *app = if app == "web" { "other".into() } else { "web".into() };
            }
        }
        Step::Phase(p) => {
            let (ns, name) = PODS[*p];
            if let Some(pod) = named(&mut c.pods, Some(ns), name) {
                let phase = pod.status.get_or_insert_default().phase.get_or_insert_default();
                *phase = if phase == "Running" { "Pending".into() } else { "Running".into() };
            }
        }
        Step::Selector => {
            if let Some(i) = named(&mut c.intercepts, Some("web"), "agent") {
                let app = i.spec.pod_selector.match_labels.entry("app".into()).or_default();
                *app = if app == "web" { "other".into() } else { "web".into() };
            }
        }
        Step::PortMap => {
            let before = c.port_maps.len();
            c.port_maps.retain(|p| p.metadata.name.as_deref() != Some("web-pair"));
            if c.port_maps.len() == before {
                let added = World::new().port_map("web", "web-pair", "pair", Tcp, 3001, None, "web", 2);
                c.port_maps.extend(added.c.port_maps.iter().cloned());
            }
        }
        Step::Extra(which) => {
            let (name, proto, port, age) = match which {
                0 => ("web-extra", Tcp, 3002, 10),
                1 => ("web-first", Tcp, 3000, -1),
                _ => ("web-udp", Udp, 27050, -1),
            };
            let before = c.port_maps.len();
            c.port_maps.retain(|p| p.metadata.name.as_deref() != Some(name));
            if c.port_maps.len() == before {
                let added = World::new().port_map("web", name, "public", proto, port, None, "web", age);
                c.port_maps.extend(added.c.port_maps.iter().cloned());
            }
        }
        Step::Service(0) => {
            if let Some(s) = named(&mut c.endpoint_slices, Some("web"), "v6") {
                let labels = s.metadata.labels.get_or_insert_default();
                let svc = labels.entry(crate::observe::index::SERVICE_NAME_LABEL.into()).or_default();
                *svc = if svc == "web" { "elsewhere".into() } else { "web".into() };
            }
        }
        Step::Service(1) => {
            let svc = c.services.iter_mut().find(|s| s.metadata.namespace.as_deref() == Some("web"));
            if let Some(name) = svc.and_then(|s| s.metadata.name.as_mut()) {
                *name = if name == "web" { "web-old".into() } else { "web".into() };
            }
        }
        Step::Service(_) => {
            let at = c.endpoint_slices.iter().position(|s| s.metadata.name.as_deref() == Some("web-x"));
            if let Some(at) = at {
                let slice = c.endpoint_slices.remove(at);
                c.endpoint_slices.push(slice);
            }
        }
        Step::Publish => {
            if let Some(ns) = named(&mut c.namespaces, None, "web") {
                let labels = ns.metadata.labels.get_or_insert_default();
                if labels.remove("publish").is_none() {
                    labels.insert("publish".into(), "yes".into());
                }
            }
        }
        Step::Scribble(port_map) => {
            let long_ago = Timestamp::from_second(1_600_000_000).ok().map(Time);
            let conditions = if *port_map {
                named(&mut c.port_maps, Some("web"), "web").and_then(|p| p.status.as_mut()).map(|s| &mut s.conditions)
            } else {
                named(&mut c.classes, None, "public").and_then(|p| p.status.as_mut()).map(|s| &mut s.conditions)
            };
            if let (Some(first), Some(t)) = (conditions.and_then(|c| c.first_mut()), long_ago) {
                first.last_transition_time = t;
            }
        }
        Step::Remade(web) => {
            let name = if *web { "web" } else { "web-late" };
            let newest = c.port_maps.iter().filter_map(|p| p.metadata.creation_timestamp.as_ref()).map(|t| t.0).max();
            let at = newest.and_then(|t| Timestamp::from_second(t.as_second() + 1).ok());
            let i = c.port_maps.iter().position(|p| p.metadata.name.as_deref() == Some(name));
            if let Some(i) = i {
                let pm = &mut c.port_maps[i];
                pm.metadata.creation_timestamp = at.map(Time);
                pm.status = None;
            }
        }
        Step::Key(n, k) => {
            if let Some(f) = c.facts.iter_mut().find(|f| f.node == NODES[*n]) {
                f.wireguard_public_key = k.map(key);
            }
        }
        Step::Endpoint(n, v6) => {
            if let Some(node) = named(&mut c.nodes, None, NODES[*n]) {
                let a = node.metadata.annotations.get_or_insert_default();
                if a.remove(EXTERNAL_ENDPOINT_ANNOTATION).is_none() {
                    let at = if *v6 {
                        format!("[2001:db8::{}]:51820", n + 1)
                    } else {
                        format!("198.51.100.{}:51820", n + 1)
                    };
                    a.insert(EXTERNAL_ENDPOINT_ANNOTATION.into(), at);
                }
            }
        }
        Step::Mtu(n, m) => {
            if let Some(f) = c.facts.iter_mut().find(|f| f.node == NODES[*n]) {
                f.underlay_mtu = Some(*m);
            }
        }
        Step::PodCidr(n) => {
            if let Some(cidrs) =
                named(&mut c.nodes, None, NODES[*n]).and_then(|node| node.spec.as_mut()?.pod_cidrs.as_mut())
            {
                let moved = format!("10.245.{n}.0/24");
                *cidrs = vec![if cidrs.first() == Some(&moved) { format!("10.244.{n}.0/24") } else { moved }];
            }
        }
        Step::NodeAddress(n, e) => {
            if let Some(addresses) =
                named(&mut c.nodes, None, NODES[*n]).and_then(|node| node.status.as_mut()?.addresses.as_mut())
            {
                let address = format!("192.0.2.{e}");
                let before = addresses.len();
                addresses.retain(|a| a.address != address);
                if addresses.len() == before {
                    addresses.push(NodeAddress { type_: "ExternalIP".into(), address });
                }
            }
        }
        Step::Relay(n) => {
            if let Some(node) = named(&mut c.nodes, None, NODES[*n]) {
                let l = node.metadata.labels.get_or_insert_default();
                if l.remove(RELAY_LABEL).is_none() {
                    l.insert(RELAY_LABEL.into(), "true".into());
                }
            }
        }
        Step::Reach(a, b, reach, handshake, endpoint) => {
            let peer_key = c.facts.iter().find(|f| f.node == NODES[*b]).and_then(|f| f.wireguard_public_key.clone());
            if let Some(k) = peer_key {
                let now = c.now.as_second();
                let seen = ObservedPeer {
                    // 4: the peer's own connect address at another port, which vouches for it: a
                    // new candidate of the peer for every pair.
                    endpoint: endpoint.and_then(|e| match e {
                        4 => format!("198.18.0.{}:4000", b + 1).parse::<SocketAddr>().ok(),
                        e => format!("192.0.2.{e}:51820").parse::<SocketAddr>().ok(),
                    }),
                    last_handshake: handshake.and_then(|h| Timestamp::from_second(now - h).ok()),
                    reach: *reach,
                };
                Arc::make_mut(c.overlay_observed.reports.entry(NODES[*a].into()).or_default()).insert(k, seen);
            }
        }
        Step::Connect(n, a) => {
            let from = format!("198.18.{a}.{}", n + 1).parse().expect("an address");
            c.overlay_observed.connect_addresses.insert(NODES[*n].to_string(), from);
        }
        Step::Unsent(a) => {
            c.overlay_observed.last_endpoints.remove(NODES[*a]);
        }
        Step::Time(s) => {
            c.now = Timestamp::from_second(c.now.as_second() + s).unwrap_or(c.now);
        }
        Step::Restart => *computer = Computer::new(settings.clone()),
        Step::Teardown => c.teardown = !c.teardown,
        Step::Both(a, b) => {
            apply(c, a, computer, settings);
            apply(c, b, computer, settings);
        }
        Step::Unwritten(s) => apply(c, s, computer, settings),
    }
}

/// What the status writer and the hub feed back after a compute: statuses that differ, and the
/// endpoint each member's state gave each peer.
fn feed_back(c: &mut Cluster, out: &Outputs) {
    for class in c.classes.iter_mut() {
        if let Some(s) = class.metadata.name.as_ref().and_then(|n| out.classes.get(n))
            && class.status.as_ref() != Some(s)
        {
            class.status = Some(s.clone());
        }
    }
    for pm in c.port_maps.iter_mut() {
        let key = portmap::admission::key_of(pm);
        if let Some(s) = out.port_maps.get(&key)
            && pm.status.as_ref() != Some(s)
        {
            pm.status = Some(s.clone());
        }
    }
    for i in c.intercepts.iter_mut() {
        let key = (i.metadata.namespace.clone().unwrap_or_default(), i.metadata.name.clone().unwrap_or_default());
        if let Some(s) = out.intercepts.get(&key)
            && i.status.as_ref() != Some(s)
        {
            i.status = Some(s.clone());
        }
    }
    let mut last: BTreeMap<String, BTreeMap<String, SocketAddr>> = BTreeMap::new();
    for (node, state) in &out.node_states {
        for peer in state.netns.iter().flat_map(|n| &n.wireguard_devices).flat_map(|d| &d.peers) {
            if let Ok(e) = peer.endpoint.parse() {
                last.entry(node.clone()).or_default().insert(peer.public_key.clone(), e);
            }
        }
    }
    let last: BTreeMap<String, Arc<BTreeMap<String, SocketAddr>>> =
        last.into_iter().map(|(n, e)| (n, Arc::new(e))).collect();
    if c.overlay_observed.last_endpoints != last {
        c.overlay_observed.last_endpoints = last;
    }
}

fn run(steps: &[Step], settings: &Settings) -> Result<(), TestCaseError> {
    let mut c = cluster();
    let mut computer = Computer::new(settings.clone());
    let out = computer.compute(&c);
    prop_assert_eq!(&out, &compute(&c, settings));
    feed_back(&mut c, &out);
    // Statuses not written back: a kept status carries the time of the compute that made it.
    let mut unwritten = false;
    for (i, s) in steps.iter().enumerate() {
        apply(&mut c, s, &mut computer, settings);
        let mut whole = compute(&c, settings);
        let by_change = computer.compute(&c);
        unwritten |= matches!(s, Step::Unwritten(_));
        let mut compared = by_change.clone();
        if unwritten {
            without_times(&mut whole);
            without_times(&mut compared);
        }
        prop_assert!(whole == compared, "after step {} ({:?}) of {:?}: {:?}", i, s, steps, computer.redone());
        if !matches!(s, Step::Unwritten(_)) {
            feed_back(&mut c, &by_change);
            unwritten = false;
        }
    }
    Ok(())
}

/// `c` after two computes with their statuses written back, and the Computer that made them:
/// what a running hub holds between changes.
fn settled(mut c: Cluster, settings: &Settings) -> (Cluster, Computer) {
    let mut computer = Computer::new(settings.clone());
    for _ in 0..2 {
        let out = computer.compute(&c);
        feed_back(&mut c, &out);
    }
    (c, computer)
}

/// The outputs with the times statuses carry cleared: when a change was seen.
fn without_times(out: &mut Outputs) {
    out.port_maps = std::mem::take(&mut out.port_maps)
        .into_iter()
        .map(|(k, mut st)| {
            st.conditions.iter_mut().for_each(|c| c.last_transition_time = Time(Timestamp::UNIX_EPOCH));
            (k, st)
        })
        .collect();
    for st in Arc::make_mut(&mut out.classes).values_mut() {
        st.conditions.iter_mut().for_each(|c| c.last_transition_time = Time(Timestamp::UNIX_EPOCH));
        st.links.iter_mut().for_each(|l| l.unused_since = l.unused_since.as_ref().map(|_| Time(Timestamp::UNIX_EPOCH)));
    }
    for st in Arc::make_mut(&mut out.intercepts).values_mut() {
        st.conditions.iter_mut().for_each(|c| c.last_transition_time = Time(Timestamp::UNIX_EPOCH));
    }
}

// The mesh has the most to keep apart (members, routes, candidates, each member's reports and
// clock), so it gets the most cases.
proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn by_change_equals_the_whole_compute_with_the_mesh(steps in proptest::collection::vec(step(), 1..14)) {
        run(&steps, &Settings { overlay: Some(OverlaySettings::default()) })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn by_change_equals_the_whole_compute_without_the_mesh(steps in proptest::collection::vec(step(), 1..14)) {
        run(&steps, &Settings::default())?;
    }
}

/// The cost follows the change: a relabel redoes interception alone and assembles one node's
/// state; a reach report redoes the mesh alone, and there only the members whose routes or own
/// report changed; a moved endpoint redoes the port maps alone.
#[test]
fn each_change_redoes_only_the_capability_it_reaches() {
    let settings = Settings { overlay: Some(OverlaySettings::default()) };
    let mut c = cluster();
    let mut computer = Computer::new(settings.clone());
    let out = computer.compute(&c);
    feed_back(&mut c, &out);
    let out = computer.compute(&c);
    feed_back(&mut c, &out);
    computer.compute(&c);
    assert_eq!(
        computer.redone(),
        &Redone {
            mesh: false,
            mesh_members: 0,
            mesh_patched: 0,
            port_maps: false,
            port_maps_readmitted: false,
            port_maps_patched: false,
            port_maps_placed: 0,
            port_map_statuses: 0,
            port_map_hosts: 0,
            intercepts: false,
            node_states: 0,
            node_states_patched: 0
        },
        "nothing changed: nothing redone"
    );

    let mut relabelled = c.clone();
    apply(&mut relabelled, &Step::Relabel(1), &mut computer, &settings);
    computer.compute(&relabelled);
    assert_eq!(
        computer.redone(),
        &Redone {
            mesh: false,
            mesh_members: 0,
            mesh_patched: 0,
            port_maps: false,
            port_maps_readmitted: false,
            port_maps_patched: false,
            port_maps_placed: 0,
            port_map_statuses: 0,
            port_map_hosts: 0,
            intercepts: true,
            node_states: 1,
            node_states_patched: 0
        }
    );

    let mut reported = relabelled.clone();
    apply(&mut reported, &Step::Reach(1, 2, Reach::Unreachable, Some(10), None), &mut computer, &settings);
    computer.compute(&reported);
    let r = computer.redone().clone();
    assert!(r.mesh && !r.port_maps && !r.intercepts, "{r:?}");
    assert_eq!((r.mesh_members, r.node_states), (2, 2), "the pair now relayed, and no other member: {r:?}");

    // A live session's report that changes no route: the reporter's part alone.
    let mut reported = reported.clone();
    apply(&mut reported, &Step::Reach(3, 0, Reach::Direct, Some(5), None), &mut computer, &settings);
    computer.compute(&reported);
    let r = computer.redone().clone();
    assert_eq!((r.mesh, r.mesh_members, r.node_states), (true, 1, 1), "{r:?}");

    // A member's new key: its own part made anew, every other member's part its last with one
    // peer's key and endpoint replaced.
    let mut rekeyed = reported.clone();
    apply(&mut rekeyed, &Step::Key(3, Some(9)), &mut computer, &settings);
    computer.compute(&rekeyed);
    let r = computer.redone().clone();
    assert_eq!((r.mesh, r.mesh_members, r.mesh_patched), (true, 1, NODES.len() - 1), "{r:?}");
    assert_eq!(r.node_states_patched, NODES.len() - 1, "{r:?}");
    let mut announced = rekeyed.clone();
    apply(&mut announced, &Step::Endpoint(0, false), &mut computer, &settings);
    computer.compute(&announced);
    let r = computer.redone().clone();
    assert_eq!((r.mesh, r.mesh_members, r.mesh_patched), (true, 1, NODES.len() - 1), "{r:?}");

    let mut moved = announced.clone();
    apply(&mut moved, &Step::Ready(0), &mut computer, &settings);
    computer.compute(&moved);
    let r = computer.redone().clone();
    assert!(!r.mesh && r.port_maps && !r.intercepts, "{r:?}");
    assert!(r.node_states < NODES.len(), "{r:?}");
    // web's pod moves off worker-b to worker-c: worker-d's host namespace is not rendered, and
    // the games mapping keeps its placement.
    assert_eq!((r.port_maps_placed, r.port_map_hosts), (2, 3), "{r:?}");
    // The statuses and class rows written back as made, for the new link: the port maps'
    // result is kept whole.
    let out = computer.compute(&moved);
    feed_back(&mut moved, &out);
    computer.compute(&moved);
    let r = computer.redone().clone();
    assert_eq!((r.port_maps, r.port_maps_placed, r.port_map_hosts), (false, 0, 0), "{r:?}");
}

/// A mapping is placed again when what it read changed, and only then: its own namespace, and
/// for one with an external endpoint every Pod's addresses. The games mapping's endpoint is
/// external until a web pod takes its address; it then moves to game-0, and back when the pod
/// gives the address up.
#[test]
fn a_placement_is_kept_until_what_it_read_changes() {
    let settings = Settings::default();
    let (mut c, mut computer) = settled(cluster(), &settings);
    let endpoint = |out: &Outputs| {
        let st = out.port_maps.get(&("games".to_string(), "game".to_string()));
        st.and_then(|s| s.endpoint.as_ref()).map(|e| e.address.clone()).unwrap_or_default()
    };
    let out = computer.compute(&c);
    assert_eq!(computer.redone().port_maps_placed, 0, "statuses written back place nothing again");
    assert_eq!(endpoint(&out), "10.244.9.5", "no Pod holds the external endpoint's address");
    // (the change, the mappings placed again, the statuses made again, games' endpoint): a
    // status is taken where the mapping's placement and links were, or its refusal is the same
    // (web-pair's, after Squat).
    for (step, placed, made, address) in [
        (Step::Ready(0), 2, 2, "10.244.9.5"),
        (Step::Squat, 3, 2, "10.244.0.107"),
        (Step::Phase(1), 0, 0, "10.244.0.107"),
        (Step::Squat, 3, 2, "10.244.9.5"),
        // game-1's address: games, and web's mapping on the class with external endpoints.
        (Step::PodAddress(4, 9), 2, 2, "10.244.9.5"),
    ] {
        apply(&mut c, &step, &mut computer, &settings);
        let out = computer.compute(&c);
        assert_eq!(out, compute(&c, &settings), "after {step:?}");
        let r = computer.redone();
        assert_eq!((r.port_maps_placed, endpoint(&out).as_str()), (placed, address), "after {step:?}: {r:?}");
        assert_eq!(r.port_map_statuses, made, "after {step:?}: {r:?}");
        feed_back(&mut c, &out);
    }
}

/// A change that reaches a few mappings is patched into the compute before, a PortMap that
/// comes or goes too, and one that needs a link anew or frees one: only the mappings it reaches
/// are placed and stated again, only the nodes their parts moved are rendered, and the result
/// is the whole compute's.
#[test]
fn a_change_that_reaches_a_few_mappings_is_patched_into_the_compute_before() {
    let settings = Settings::default();
    let (mut c, mut computer) = settled(cluster(), &settings);
    // (the change, patched, mappings placed, statuses made, hosts rendered)
    for (step, patched, placed, made, hosts) in [
        // web-0 (worker-b) gets another address: web's two admitted mappings and games (its
        // class reads every Pod) are placed again, and edge-a and worker-b rendered.
        (Step::Readdress(0, 9), true, 3, 3, 2),
        // game-0 (edge-a) gets another address: the mappings of class public, which reads
        // every Pod, are placed again (games' endpoint is external) and no node is rendered.
        (Step::Readdress(3, 9), true, 2, 2, 0),
        // A status another writer moved: stated again, and nothing else.
        (Step::Scribble(true), true, 0, 1, 0),
        // web-0 not ready: web moves to worker-c, a link no mapping had (claimed).
        (Step::Ready(0), true, 2, 2, 3),
        // Ready again: back to worker-b, and worker-c's link is free (held, unused).
        (Step::Ready(0), true, 2, 2, 3),
        // web made again, younger than web-late: web-late takes the port, over web's link; web's
        // three (web-pair too) placed again, the two statuses that moved made.
        (Step::Remade(true), true, 1, 2, 2),
        (Step::Remade(false), true, 1, 2, 2),
        // A PortMap created and deleted over a link its namespace has: web's mappings placed
        // again, edge-a and worker-b rendered.
        (Step::Extra(0), true, 3, 3, 2),
        (Step::Extra(0), true, 2, 2, 2),
        // Created the oldest, on web's port: web and web-late are refused by it (their
        // statuses made again); and deleted.
        (Step::Extra(1), true, 2, 4, 2),
        (Step::Extra(1), true, 2, 3, 2),
        // Created the oldest on a port games/game publishes: its verdict moved, so it is
        // reached from another namespace.
        (Step::Extra(2), true, 3, 4, 1),
        (Step::Extra(2), true, 3, 3, 1),
        // web-pair deleted frees a link; made again it needs it again.
        (Step::PortMap, true, 1, 1, 2),
        (Step::PortMap, true, 2, 2, 2),
    ] {
        apply(&mut c, &step, &mut computer, &settings);
        let out = computer.compute(&c);
        assert!(out == compute(&c, &settings), "after {step:?}: {:?}", computer.redone());
        let r = computer.redone();
        assert_eq!(
            (r.port_maps_patched, r.port_maps_placed, r.port_map_statuses, r.port_map_hosts),
            (patched, placed, made, hosts),
            "after {step:?}: {r:?}"
        );
        feed_back(&mut c, &out);
        computer.compute(&c);
        assert!(!computer.redone().port_maps, "after {step:?}, written back: {:?}", computer.redone());
    }
}

/// Admission's verdicts are taken while nothing it reads changed: a change to endpoints or
/// pods judges no mapping again. A PortMap deleted and made again with the same spec, in its
/// place in the list, is judged by its new age: the port goes to the mapping now older.
#[test]
fn verdicts_are_kept_until_what_admission_reads_changes() {
    let settings = Settings::default();
    let (mut c, mut computer) = settled(cluster(), &settings);
    let accepted = |out: &Outputs, name: &str| {
        let st = out.port_maps.get(&("web".to_string(), name.to_string()));
        let c = st.into_iter().flat_map(|s| &s.conditions).find(|c| c.type_ == "Accepted");
        c.map(|c| c.status.clone()).unwrap_or_default()
    };
    // (the change, whether the verdicts were taken (None: the port maps' result was kept
    // whole), web's Accepted, web-late's, web-pair's)
    for (step, readmitted, web, late, pair) in [
        (Step::Ready(0), Some(true), "True", "False", "True"),
        (Step::Squat, Some(true), "True", "False", "True"),
        (Step::Remade(true), Some(false), "False", "True", "True"),
        // A pod's phase: nothing port maps read, and the statuses were written back as made.
        (Step::Phase(1), None, "False", "True", "True"),
        (Step::Remade(false), Some(false), "True", "False", "True"),
        (Step::Publish, Some(false), "True", "False", "False"),
        (Step::Publish, Some(false), "True", "False", "True"),
        (Step::PortMap, Some(false), "True", "False", ""),
    ] {
        apply(&mut c, &step, &mut computer, &settings);
        let out = computer.compute(&c);
        assert_eq!(out, compute(&c, &settings), "after {step:?}");
        let r = computer.redone();
        assert_eq!(r.port_maps.then_some(r.port_maps_readmitted), readmitted, "after {step:?}: {r:?}");
        let names = ["web", "web-late", "web-pair"].map(|n| accepted(&out, n));
        assert_eq!(names, [web, late, pair], "after {step:?}");
        feed_back(&mut c, &out);
    }
}

/// Two members' keys change in one compute, one taking the other's old key: each state's peer
/// entries are found by their old keys before any is replaced.
#[test]
fn a_key_passed_from_one_member_to_another_in_one_compute() {
    let settings = Settings { overlay: Some(OverlaySettings::default()) };
    let mut c = cluster();
    let mut computer = Computer::new(settings.clone());
    let rekey = |c: &mut Cluster, node: usize, seed: u8| {
        if let Some(f) = c.facts.iter_mut().find(|f| f.node == NODES[node]) {
            f.wireguard_public_key = Some(key(seed));
        }
    };
    // First a key that orders worker-b's peer entry after worker-d's, where a search for
    // worker-d's old key would find worker-b's entry once it holds that key.
    rekey(&mut c, 1, 20);
    let out = computer.compute(&c);
    feed_back(&mut c, &out);
    computer.compute(&c);
    rekey(&mut c, 1, 3);
    rekey(&mut c, 3, 9);
    let by_change = computer.compute(&c);
    assert!(by_change == compute(&c, &settings), "{:?}", computer.redone());
    let r = computer.redone();
    assert_eq!((r.mesh_members, r.mesh_patched, r.node_states_patched), (2, 2, 2), "{r:?}");
}

/// Sequences random steps seldom reach: the endpoints a member's last state gave (a live session
/// keeps them; unsent, the report's are used); a peer's candidates, which a silent peer's
/// endpoint rotates over, and which another member's report adds to, until its session turns
/// silent; a broken pair that heals.
#[test]
fn a_members_part_follows_its_last_endpoints_and_its_peers_candidates() {
    let mesh = Settings { overlay: Some(OverlaySettings::default()) };
    let unsent = [Step::Reach(0, 1, Reach::Direct, Some(10), Some(2)), Step::Unsent(0)];
    if let Err(e) = run(&unsent, &mesh) {
        panic!("{e}");
    }
    // Over six rotation periods, so that the new candidate list rotates elsewhere than the old.
    for period in 0..6 {
        let vouched = [
            Step::Time(period * crate::compute::overlay::members::ROTATE_EVERY_SECONDS),
            Step::Reach(2, 1, Reach::Unknown, None, None),
            Step::Reach(3, 1, Reach::Direct, Some(10), Some(4)),
        ];
        if let Err(e) = run(&vouched, &mesh) {
            panic!("period {period}: {e}");
        }
        // A session that vouched for a candidate turns silent: the candidate goes.
        let fading = [
            Step::Time(period * crate::compute::overlay::members::ROTATE_EVERY_SECONDS),
            Step::Reach(3, 1, Reach::Direct, Some(170), Some(4)),
            Step::Reach(2, 1, Reach::Unknown, None, None),
            Step::Time(15),
        ];
        if let Err(e) = run(&fading, &mesh) {
            panic!("period {period}: {e}");
        }
    }
    // A member's new key: what the others' reports said of its old one no longer speaks of it.
    let rekeyed = [Step::Reach(3, 0, Reach::Direct, Some(10), Some(2)), Step::Key(0, Some(9))];
    if let Err(e) = run(&rekeyed, &mesh) {
        panic!("{e}");
    }
    // A key changes while a report says its holder is unreachable: the pair heals. Then the
    // report names the key again, and the pair is broken again.
    let rekeyed = [
        Step::Key(2, Some(5)),
        Step::Reach(1, 2, Reach::Unreachable, Some(10), None),
        Step::Key(2, Some(4)),
        Step::Key(2, Some(5)),
    ];
    if let Err(e) = run(&rekeyed, &mesh) {
        panic!("{e}");
    }
    // In one compute with another member's new key (the members judged again): a member's
    // connect address moves, a learned endpoint of it becomes its Node's own (its candidates
    // change, which a silent peer's endpoint rotates over), a report breaks a pair.
    let rotate = || Step::Time(crate::compute::overlay::members::ROTATE_EVERY_SECONDS);
    let together = [
        Step::Reach(3, 1, Reach::Direct, Some(10), Some(2)),
        Step::Reach(2, 1, Reach::Unknown, None, None),
        Step::Both(Box::new(Step::Key(0, Some(5))), Box::new(Step::Connect(1, 2))),
        rotate(),
        rotate(),
        Step::Both(Box::new(Step::Key(0, Some(4))), Box::new(Step::NodeAddress(1, 2))),
        rotate(),
        rotate(),
        rotate(),
        // And a report that breaks a pair, heard with the members judged again.
        Step::Both(Box::new(Step::Key(0, Some(5))), Box::new(Step::Reach(3, 2, Reach::Unreachable, Some(10), None))),
    ];
    if let Err(e) = run(&together, &mesh) {
        panic!("{e}");
    }
    // A pair breaks, then heals.
    let healed =
        [Step::Reach(1, 2, Reach::Unreachable, Some(10), None), Step::Reach(1, 2, Reach::Direct, Some(10), None)];
    if let Err(e) = run(&healed, &mesh) {
        panic!("{e}");
    }
}

/// A kept placement that an older mapping now refuses claims no link. extra/ext (Multi, on
/// `pair`) and games/game (Single) deliver to the same external endpoint once games' slice
/// lists it; only games' namespace changed, so ext keeps its placement, and is refused (its
/// pod port already answers the older games mapping through edge-a), its links to worker-d
/// unused as a whole compute leaves them.
#[test]
fn a_kept_placement_refused_by_an_older_mapping_claims_no_link() {
    let settings = Settings::default();
    let mut c = cluster();
    let external = |c: &mut Cluster, listed: bool| {
        let slice = named(&mut c.endpoint_slices, Some("games"), "game-x");
        if let Some(eps) = slice.and_then(|s| s.endpoints.as_mut()) {
            eps.retain(|e| e.addresses != ["10.244.9.5"]);
            if listed {
                eps.push(k8s_openapi::api::discovery::v1::Endpoint {
                    addresses: vec!["10.244.9.5".into()],
                    node_name: Some("edge-a".into()),
                    ..Default::default()
                });
            }
        }
    };
    external(&mut c, false);
    if let Some(pair) = named(&mut c.classes, None, "pair") {
        pair.spec.external_endpoints = vec!["10.244.9.0/24".into()];
    }
    let extra = World::new()
        .service("extra", "ext", "UDP", 27015, &[])
        .edit_slices(|slices| {
            for s in slices.iter_mut() {
                s.endpoints = Some(vec![k8s_openapi::api::discovery::v1::Endpoint {
                    addresses: vec!["10.244.9.5".into()],
                    node_name: Some("worker-d".into()),
                    ..Default::default()
                }]);
            }
        })
        .port_map("extra", "ext", "pair", Udp, 28000, None, "ext", 3)
        .namespace("extra", &[("publish", "yes")]);
    c.namespaces.extend(extra.c.namespaces.iter().cloned());
    c.services.extend(extra.c.services.iter().cloned());
    c.endpoint_slices.extend(extra.c.endpoint_slices.iter().cloned());
    c.port_maps.extend(extra.c.port_maps.iter().cloned());

    let (mut c, mut computer) = settled(c, &settings);
    let out = computer.compute(&c);
    let ext = ("extra".to_string(), "ext".to_string());
    assert!(out.programming.contains_key(&ext), "ext is programmed while games goes to game-0");
    let links = |out: &Outputs| out.classes.get("pair").map(|s| s.links.clone()).unwrap_or_default();
    let used = |out: &Outputs| -> Vec<Vec<String>> {
        links(out).into_iter().filter(|l| l.unused_since.is_none()).map(|l| l.pair).collect()
    };
    assert!(used(&out).contains(&vec!["edge-a".to_string(), "worker-d".to_string()]), "{:?}", links(&out));

    external(&mut c, true);
    let out = computer.compute(&c);
    assert_eq!(out, compute(&c, &settings));
    assert_eq!(computer.redone().port_maps_placed, 1, "games alone is placed again");
    assert!(!out.programming.contains_key(&ext), "ext is refused");
    assert!(!used(&out).iter().any(|p| p.contains(&"worker-d".to_string())), "ext's links: {:?}", links(&out));
}

/// A patch takes a deleted mapping's parts out of its nodes' kept parts: every golden scenario
/// (ranges, Multi, dual-stack, allow-lists, rate limits) loses its PortMaps one at a time, youngest
/// first, each deletion patched (a patch that cannot take what a mapping gave gives up), and
/// the result is the whole compute's to the last.
#[test]
fn each_mapping_deleted_is_taken_out_of_the_kept_parts() {
    let settings = Settings::default();
    for (name, world) in crate::compute::testkit::scenarios() {
        let (mut c, mut computer) = settled(world.cluster(), &settings);
        while let Some(pm) = c.port_maps.iter().max_by_key(|p| p.metadata.creation_timestamp.clone()) {
            let gone = (pm.metadata.namespace.clone(), pm.metadata.name.clone());
            c.port_maps.retain(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()) != gone);
            let out = computer.compute(&c);
            assert!(out == compute(&c, &settings), "{name}, {gone:?} deleted: {:?}", computer.redone());
            assert!(computer.redone().port_maps_patched, "{name}, {gone:?} deleted: {:?}", computer.redone());
            feed_back(&mut c, &out);
            computer.compute(&c);
        }
    }
}
