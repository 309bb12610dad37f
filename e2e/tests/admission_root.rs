//! What a tenant can make kuport publish, with the real API server and real packets
//! (docs/portmap/modes.md, "Which endpoints are believed", "Ports no class publishes"):
//!
//! (a) a tenant's selector-less Service with a hand-written EndpointSlice naming apps/api-0 does
//!     not publish api-0: the port stays closed for an internet client and the PortMap says why;
//! (b) `port: 1, endPort: 65535` (and a UDP range over WireGuard's port) in a class that allows
//!     every port leaves the node's own SSH-like and WireGuard-like listeners answering, while the
//!     game's link keeps carrying traffic; the PortMaps say which reserved port refused them;
//! (c) a slice naming a nodeName that is no Node claims no slot and builds no link.
//!
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1. The lab is removed on drop.

mod common;
use common::*;

use std::time::{Duration, Instant};

use kuport_lab::Protocol::{Tcp, Udp};
use kuport_lab::echo::PodServer;
use kuport_lab::plane::{CONVERGE_TIMEOUT, PlaneOptions};
use kuport_lab::topology::Ports;
use kuport_lab::{Manifests, ProbeError};

/// (a) and (c): what a tenant adds (a class admin allows a home network by prefix).
const TENANT: &str = "apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata: {name: homes}
spec:
  nodes:
    edge-a: {interfaces: [enp1s0]}
  externalEndpoints: [192.168.50.0/24]
---
apiVersion: v1
kind: Namespace
metadata: {name: tenant}
---
apiVersion: v1
kind: Service
metadata: {name: steal, namespace: tenant}
spec:
  ports: [{name: api, protocol: TCP, port: 9000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: steal-1
  namespace: tenant
  labels: {kubernetes.io/service-name: steal}
addressType: IPv4
ports: [{name: api, protocol: TCP, port: 9000}]
endpoints:
  - addresses: [10.244.2.9]
    conditions: {ready: true}
    nodeName: worker-2
    targetRef: {kind: Pod, namespace: apps, name: api-0}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: steal, namespace: tenant}
spec:
  className: public
  protocol: TCP
  port: 9000
  serviceRef: {name: steal, port: api}
---
apiVersion: v1
kind: Service
metadata: {name: ghost, namespace: tenant}
spec:
  ports: [{name: dev, protocol: TCP, port: 7100}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ghost-1
  namespace: tenant
  labels: {kubernetes.io/service-name: ghost}
addressType: IPv4
ports: [{name: dev, protocol: TCP, port: 7100}]
endpoints:
  - addresses: [192.168.50.7]
    conditions: {ready: true}
    nodeName: ghost-node
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: ghost, namespace: tenant}
spec:
  className: homes
  protocol: TCP
  port: 7100
  serviceRef: {name: ghost, port: dev}
---
";

/// (b): a class that allows every port, and mappings over all of them.
const WIDE: &str = "apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata: {name: wide}
spec:
  nodes:
    edge-a: {interfaces: [enp1s0]}
  ports: {min: 1, max: 65535}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: everything, namespace: web}
spec:
  className: wide
  protocol: TCP
  port: 1
  endPort: 65535
  serviceRef: {name: web, port: http}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: udp-wide, namespace: apps}
spec:
  className: wide
  protocol: UDP
  port: 50000
  endPort: 60000
  serviceRef: {name: echo, port: udp}
---
";

/// A mapping with an allow-list (client-1 alone) and a per-source rate, for the counters.
const GUARDED: &str = "apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: guarded, namespace: apps}
spec:
  className: public
  protocol: TCP
  port: 9000
  serviceRef: {name: api, port: api}
  sourceRanges: [198.51.100.7/32]
  rateLimit: {newPerSecond: 1, burst: 3}
";

/// A condition of a PortMap as the API server holds it: (status, reason, message).
fn condition_of(api: &kuport_lab::apiserver::ApiServer, ns: &str, name: &str, type_: &str) -> (String, String, String) {
    let field = |f: &str| {
        let path = format!("jsonpath={{.status.conditions[?(@.type=='{type_}')].{f}}}");
        api.kubectl(&["get", "pm", "-n", ns, name, "-o", &path], None).unwrap_or_default()
    };
    (field("status"), field("reason"), field("message"))
}

/// The default lab with edge-a's own listeners (an SSH-like TCP 22 and a WireGuard-like UDP
/// 51820, answering as `edge-a-itself`), on the API server with `extra` added to the default
/// manifests; returns once every verdict named in `written` is in the API server and the game is
/// programmed.
struct Scene {
    lab: kuport_lab::Lab,
    api: OwnedApiServer,
    _host: PodServer,
    _rt: tokio::runtime::Runtime,
}

impl Scene {
    fn start(tag: &str, extra: &str, written: &[(&str, &str, &str)]) -> Scene {
        let dir = std::env::temp_dir().join(format!("kuport-admission-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let api = OwnedApiServer::up(&dir.join("controlplane"));
        let mut lab = default_lab();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a runtime");
        let edge = lab.netns("edge-a").expect("edge-a");
        let host = PodServer::start(
            rt.handle(),
            &edge,
            "edge-a-itself",
            &[Ports { first: 22, last: 22 }],
            &[Ports { first: 51820, last: 51820 }],
        )
        .expect("edge-a's listeners start");
        let manifests = Manifests::default_lab().add("test.yaml", extra).expect("the test's manifests load");
        let mut options = PlaneOptions::new(env!("CARGO_BIN_EXE_kuport-lab"), &dir);
        options.kubernetes = Some(api.source(None, 1));
        lab.start_plane(&manifests, options).expect("the controller and executors start");
        let scene = Scene { lab, api, _host: host, _rt: rt };
        let begun = Instant::now();
        loop {
            let all = written.iter().all(|(ns, name, t)| !scene.condition(ns, name, t).1.is_empty());
            if all && scene.condition("games", "game", "Programmed").0 == "True" {
                break;
            }
            assert!(begun.elapsed() < Duration::from_secs(30), "the statuses were never written");
            std::thread::sleep(Duration::from_millis(200));
        }
        scene.lab.plane().expect("a plane").wait_converged(CONVERGE_TIMEOUT).expect("the lab converges");
        scene
    }

    fn condition(&self, ns: &str, name: &str, type_: &str) -> (String, String, String) {
        condition_of(&self.api.0, ns, name, type_)
    }
}

/// (a) and (c).
#[test]
fn a_forged_endpoint_slice_publishes_nothing_and_claims_no_slot() {
    if !root() {
        return;
    }
    let s = Scene::start("forged", TENANT, &[("tenant", "steal", "Programmed"), ("tenant", "ghost", "Programmed")]);
    let lab = &s.lab;

    // (a) The forged slice publishes nothing: api-0 is not reached at 203.0.113.9:9000.
    let (status, reason, message) = s.condition("tenant", "steal", "Programmed");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "EndpointNotVouched"), "{message}");
    assert!(message.contains("10.244.2.9") && message.contains("namespace apps"), "{message}");
    match lab.probe("client-1", addr("203.0.113.9:9000"), Tcp) {
        Err(ProbeError::Refused { .. } | ProbeError::NoAnswer { .. }) => {}
        other => panic!("(a) the forged slice's port must stay closed: {other:?}"),
    }
    assert_maps(lab, "client-1", "203.0.113.9:27015", Udp, "game-0");

    // (c) A nodeName that is no Node: no slot in the class status, no link on edge-a.
    let (status, reason, message) = s.condition("tenant", "ghost", "Programmed");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "NodeNotReady"), "{message}");
    let slots = s.api.0.kubectl(&["get", "pmc", "homes", "-o", "jsonpath={.status.links}"], None).expect("kubectl");
    assert!(!slots.contains("ghost-node"), "(c) a slot was claimed for a node that does not exist: {slots}");
    let vxlan = lab.ip("edge-a", &["-o", "link", "show", "type", "vxlan"]).expect("ip link");
    assert_eq!(vxlan.lines().count(), 1, "(c) only the game's link on edge-a:\n{vxlan}");
}

/// (b).
#[test]
fn every_port_in_a_class_leaves_the_node_its_own() {
    if !root() {
        return;
    }
    let s = Scene::start("wide", WIDE, &[("web", "everything", "Accepted"), ("apps", "udp-wide", "Accepted")]);
    let lab = &s.lab;
    let (status, reason, message) = s.condition("web", "everything", "Accepted");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "ReservedPort"), "{message}");
    assert!(message.contains("2379"), "{message}");
    let (status, reason, message) = s.condition("apps", "udp-wide", "Accepted");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "ReservedPort"), "{message}");
    assert!(message.contains("51820") && message.contains("WireGuard"), "{message}");
    for (port, protocol) in [("22", Tcp), ("51820", Udp)] {
        let a = lab
            .probe("client-1", addr(&format!("203.0.113.9:{port}")), protocol)
            .unwrap_or_else(|e| panic!("(b) edge-a's own {protocol} {port} must answer: {e}"));
        assert_eq!(a.pod, "edge-a-itself", "(b) {protocol} {port} was taken from the node: {a}");
    }
    // The links' VXLAN port keeps carrying the game's traffic.
    assert_maps(lab, "client-1", "203.0.113.9:27015", Udp, "game-0");
}

/// The counters an operator reads (docs/operations/counters.md): after client-1 is served,
/// client-2 (outside the allow-list) is dropped, and client-1 goes past its rate, `kuportctl
/// portmap` (ExplainPortMap, read live from edge-a's kernel) and the leader's metrics name each,
/// for this mapping and node.
#[test]
fn a_mappings_counters_name_what_was_served_and_what_was_dropped() {
    if !root() {
        return;
    }
    let s = Scene::start("counters", GUARDED, &[("apps", "guarded", "Programmed")]);
    let lab = &s.lab;
    let plane = lab.plane().expect("a plane");
    let to = addr("203.0.113.9:9000");
    let served = lab.probe("client-1", to, Tcp).expect("client-1 is in the allow-list");
    assert_eq!(served.pod, "api-0");
    assert!(lab.probe("client-2", to, Tcp).is_err(), "client-2 is outside the allow-list");
    // Past the burst of 3 (one was spent above): new connections are dropped.
    let path = lab.netns("client-1").expect("client-1's namespace");
    let connected = kuport_lab::sys::in_netns(&path, || {
        let tries = (0..20).map(|_| std::net::TcpStream::connect_timeout(&to.into(), Duration::from_millis(300)));
        Ok(tries.filter(Result::is_ok).count())
    })
    .expect("the connects run");
    assert!((2..20).contains(&connected), "the rest of the burst and the refill connect: {connected}");

    let explained = plane.explain("apps", "guarded").expect("ExplainPortMap");
    let edge = explained.nodes.iter().find(|n| n.node == "edge-a").expect("edge-a programs it");
    assert_eq!(edge.counters_error, "", "{edge:?}");
    let c = edge.counters.expect("edge-a's counters");
    eprintln!("edge-a's counters of apps/guarded: {c:?}");
    assert!(c.connections >= 3 && c.accepted_packets >= c.connections, "{c:?}");
    assert!(c.dropped_source >= 1, "client-2's SYN, dropped by the allow-list: {c:?}");
    assert!(c.dropped_rate >= 5, "client-1's connections past its rate: {c:?}");
    assert_eq!(c.dropped_connections, 0, "{c:?}");
    // A pod-only node is read for nothing.
    let worker = explained.nodes.iter().find(|n| n.node == "worker-2").expect("worker-2 holds api-0");
    assert!(worker.counters.is_none() && worker.counters_error.is_empty(), "{worker:?}");

    // The leader reads every node's counters every 15 s for its metrics.
    let series = |text: &str, name: &str, reason: Option<&str>| -> u64 {
        let labels = match reason {
            Some(r) => format!("{{namespace=\"apps\",name=\"guarded\",node=\"edge-a\",reason=\"{r}\"}}"),
            None => "{namespace=\"apps\",name=\"guarded\",node=\"edge-a\"}".to_string(),
        };
        let line = format!("kuport_{name}_total{labels} ");
        text.lines().find_map(|l| l.strip_prefix(line.as_str())).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
    };
    let begun = Instant::now();
    let text = loop {
        let text = plane.metrics().expect("the leader's metrics");
        if series(&text, "portmap_dropped_packets", Some("rate")) >= c.dropped_rate {
            break text;
        }
        assert!(begun.elapsed() < Duration::from_secs(40), "no counters in the metrics:\n{text}");
        std::thread::sleep(Duration::from_secs(1));
    };
    assert!(series(&text, "portmap_dropped_packets", Some("source")) >= c.dropped_source, "{text}");
    assert!(series(&text, "portmap_connections", None) >= c.connections, "{text}");
    assert!(series(&text, "portmap_accepted_packets", None) >= c.accepted_packets, "{text}");
}

/// What `kuportctl trace` is asked about: a conflicting mapping of the game's range, a mapping
/// with no ready endpoint, and one of a reserved port.
const TRACED: &str = "apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: late, namespace: games}
spec:
  className: public
  protocol: UDP
  port: 27050
  serviceRef: {name: game, port: game}
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: apps}
spec:
  ports: [{name: x, protocol: TCP, port: 9100}]
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: empty, namespace: apps}
spec:
  className: public
  protocol: TCP
  port: 9100
  serviceRef: {name: empty, port: x}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata: {name: wide}
spec:
  nodes:
    edge-a: {interfaces: [enp1s0]}
  ports: {min: 1, max: 65535}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: etcd, namespace: web}
spec:
  className: wide
  protocol: TCP
  port: 2379
  serviceRef: {name: web, port: http}
";

/// New UDP flows from `client` to `to` (a new socket each, answered or not) until `stop`.
fn udp_flows(
    lab: &kuport_lab::Lab,
    client: &str,
    to: std::net::SocketAddrV4,
    stop: Instant,
) -> std::thread::JoinHandle<usize> {
    let path = lab.netns(client).expect("the client's namespace");
    std::thread::spawn(move || {
        kuport_lab::sys::in_netns(&path, || {
            let mut answered = 0;
            while Instant::now() < stop {
                let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
                s.set_read_timeout(Some(Duration::from_millis(100)))?;
                s.send_to(b"trace", to)?;
                let mut buf = [0u8; 512];
                answered += usize::from(s.recv_from(&mut buf).is_ok());
            }
            Ok(answered)
        })
        .unwrap_or(0)
    })
}

/// `command` in `host`'s namespace, from 1 s on (after a trace's first read), then `every`
/// until `stop` (once when `every` is None).
fn in_host(
    lab: &kuport_lab::Lab,
    host: &str,
    command: &[&str],
    every: Option<Duration>,
    stop: Instant,
) -> std::thread::JoinHandle<()> {
    let name = lab.netns_name(host);
    let command: Vec<String> = command.iter().map(ToString::to_string).collect();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        loop {
            let _ = std::process::Command::new("ip").args(["netns", "exec", &name]).args(&command).output();
            match every {
                Some(d) if Instant::now() < stop => std::thread::sleep(d),
                _ => break,
            }
        }
    })
}

/// `kuportctl trace` names the hop and the cause (docs/operations/trace.md): a reserved port and
/// a mapping without endpoints are refused with their reasons; a client that never reaches
/// edge-a stops at its accept; client-1's flows count on every hop of the game's path; a
/// return-mark set emptied by hand on worker-2 is named as drift the executor repaired; and
/// without worker-2's loop guard the replies stop at worker-2's link, whose transmit errors rise.
#[test]
fn trace_names_the_hop_where_a_flow_stops() {
    use kuport_proto::v1::trace_request::Target;
    use kuport_proto::v1::{TraceHopState, TraceRequest, TraceVerdict};
    if !root() {
        return;
    }
    let s = Scene::start(
        "trace",
        TRACED,
        &[("games", "late", "Accepted"), ("apps", "empty", "Programmed"), ("web", "etcd", "Accepted")],
    );
    let lab = &s.lab;
    let plane = lab.plane().expect("a plane");
    let trace = |address: &str, watch: u32| {
        let request =
            TraceRequest { target: Some(Target::Address(address.into())), watch_seconds: watch, from: String::new() };
        let (r, text) = plane.trace(request).expect("Trace");
        eprintln!("kuportctl trace {address} --watch {watch}:\n{text}");
        (r, text)
    };
    let game = addr("203.0.113.9:27015");

    // Refused: a reserved port, and a Service with no ready endpoint.
    let (r, _) = trace("203.0.113.9:2379", 0);
    assert_eq!(r.verdict, TraceVerdict::Refused as i32, "{r:?}");
    assert!(r.cause.contains("PortMap web/etcd") && r.cause.contains("ReservedPort"), "{}", r.cause);
    let (r, _) = trace("203.0.113.9:9100", 0);
    assert_eq!(r.verdict, TraceVerdict::Refused as i32, "{r:?}");
    assert!(r.cause.contains("NoReadyEndpoint"), "{}", r.cause);

    // A client that never reaches edge-a: nothing counts, and the trace says where it stops.
    let (r, text) = trace("203.0.113.9:27015/udp", 2);
    assert_eq!((r.verdict, r.stopped_at.as_str()), (TraceVerdict::Stopped as i32, "accept"), "{text}");
    assert!(r.cause.contains("never reach the accepting node"), "{}", r.cause);
    // A port two mappings asked for: the one that publishes it, and the one refused.
    let (_, text) = trace("203.0.113.9:27050/udp", 0);
    assert!(text.contains("PortMap games/game (class public, Single)"), "{text}");
    // --from: whether the mapping's allow-list admits a client (the game has none).
    let target = Some(Target::Address("203.0.113.9:27050/udp".into()));
    let request = TraceRequest { target, watch_seconds: 0, from: "198.51.100.7".into() };
    let (_, from) = plane.trace(request).expect("Trace --from");
    assert!(from.contains("no allow-list: 198.51.100.7 is admitted"), "{from}");
    assert!(
        text.contains("refused: PortMap games/late: Accepted False, PortConflict"),
        "the losing mapping is named:\n{text}"
    );

    // Healthy: client-1's flows count on every hop there and back.
    let flows = udp_flows(lab, "client-1", game, Instant::now() + Duration::from_secs(4));
    let (r, text) = trace("203.0.113.9:27015/udp", 3);
    assert!(flows.join().expect("the flows") > 0, "client-1 is answered");
    assert_eq!(r.verdict, TraceVerdict::Healthy as i32, "{text}");
    for name in ["accept", "link out", "link in", "arrive", "return", "link back", "link home"] {
        let h = r.hops.iter().find(|h| h.name == name).unwrap_or_else(|| panic!("no {name} hop:\n{text}"));
        assert!(h.moved.is_some_and(|m| m > 0) && h.state == TraceHopState::Ok as i32, "{name}: {h:?}");
    }
    assert_eq!(r.unanswered, Vec::<String>::new());

    // The pod node's element deleted by hand: the executor repairs it, and the trace names it.
    let stop = Instant::now() + Duration::from_secs(4);
    let flows = udp_flows(lab, "client-1", game, stop);
    let flush = in_host(lab, "worker-2", &["nft", "flush", "map", "inet", "kuport", "return_mark_range"], None, stop);
    let (r, text) = trace("203.0.113.9:27015/udp", 3);
    flush.join().expect("the flush");
    flows.join().expect("the flows");
    assert!(r.cause.contains("worker-2's executor repaired drift") && r.cause.contains("return_mark_range"), "{text}");
    let ret = r.hops.iter().find(|h| h.name == "return").expect("the return hop");
    assert!(ret.details.iter().any(|d| d.starts_with("remade during the watch")), "the hop is named: {ret:?}");

    // Without the loop guard (removed again and again while the executor puts it back), the
    // replies stop at worker-2's link.
    let stop = Instant::now() + Duration::from_secs(4);
    let flows = udp_flows(lab, "client-1", game, stop);
    let unguard =
        in_host(lab, "worker-2", &["ip", "rule", "del", "pref", "101"], Some(Duration::from_millis(20)), stop);
    let (r, text) = trace("203.0.113.9:27015/udp", 3);
    unguard.join().expect("the rule deletes");
    flows.join().expect("the flows");
    assert_eq!((r.verdict, r.stopped_at.as_str()), (TraceVerdict::Stopped as i32, "link back"), "{text}");
    assert!(r.cause.contains("loop guard") && r.cause.contains("pref 101"), "{}", r.cause);
}
