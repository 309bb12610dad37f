//! `kuportctl trace` (docs/operations/trace.md): a flow's hops on the nodes of its path, each
//! with its live counter, and where the flow stops. Pure: the Debug service reads the counters
//! of the nodes on the path (twice around a watch) and hands them here with what the
//! controller computed; every hop and every cause is decided here.
//!
//! A counter counts only where the node's desired state has the set or link it names, like the
//! per-mapping counters (`report::counters`): a node's report is believed for its own
//! kernel's counters and nothing else.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kuport_proto::v1::nft_value::Value;
use kuport_proto::v1::{
    CounterReport, L4Proto, LinkCounters, NftValue, NodeState, PeerStatus, Reach, TableCounters, TraceHop,
    TraceHopState, TraceReport, TraceVerdict,
};

use crate::api::{Intercept, InterceptStatus, PortMap, PortMapClass, PortMapStatus, Protocol};
use crate::compute::Outputs;
use crate::compute::overlay::{self, relays::PeerRoute};
use crate::compute::portmap::admission::{MapKey, key_of, source_ranges};
use crate::compute::portmap::links::device_name;
use crate::compute::portmap::placement::l4;
use crate::observe::Objects;
use crate::report::counters::{MapCounters, Owners, attribute};

/// One node's counters: before the watch (None without one) and now.
#[derive(Debug, Clone, Default)]
pub struct Read {
    pub first: Option<Arc<CounterReport>>,
    pub last: Arc<CounterReport>,
}

/// What the Debug service saw of the nodes on a path.
#[derive(Debug, Default)]
pub struct Seen {
    /// Per node, its counters, or why they could not be read.
    pub reads: BTreeMap<String, Result<Read, String>>,
    /// Per node, its desired state.
    pub states: BTreeMap<String, NodeState>,
    /// Per node: drift repairs before the watch, now, and the last differences found.
    pub drift: BTreeMap<String, (u64, u64, Vec<String>)>,
    /// Seconds watched; 0: one read.
    pub watched: u32,
    /// Per node, per peer key, since when its reports give the peer's current reach.
    pub reach_since: BTreeMap<String, BTreeMap<String, std::time::SystemTime>>,
    /// The controller's clock at the last read.
    pub now: Option<std::time::SystemTime>,
}

impl Seen {
    fn read(&self, node: &str) -> Option<&Read> {
        self.reads.get(node).and_then(|r| r.as_ref().ok())
    }

    /// A counter on `node`, read from each report by `count`: its value now and how much it
    /// moved during the watch (a counter that went down was remade: its new value).
    fn count(&self, node: &str, count: impl Fn(&CounterReport) -> Option<u64>) -> Option<Count> {
        let read = self.read(node)?;
        let before = self.first(read).map(|f| count(f).unwrap_or(0));
        Some(Count::new(count(&read.last)?, before))
    }

    /// The read before the watch; None without a watch.
    fn first<'a>(&self, read: &'a Read) -> Option<&'a CounterReport> {
        read.first.as_deref().filter(|_| self.watched > 0)
    }

    /// Each node that did not answer, and why.
    fn unanswered(&self) -> Vec<String> {
        self.reads.iter().filter_map(|(n, r)| r.as_ref().err().map(|e| format!("{n}: {e}"))).collect()
    }

    /// The drift `node`'s executor repaired during the watch, named.
    fn drift_during(&self, node: &str) -> Option<String> {
        let (before, after, last) = self.drift.get(node)?;
        (after > before).then(|| {
            let what = if last.is_empty() { "-".to_string() } else { last.join("; ") };
            format!("{node}'s executor repaired drift {} time(s) during the watch: {what}", after - before)
        })
    }
}

/// A hop under construction: `walk` hops carry the flow's packets, in order; the others
/// (drops, NAT counts) explain.
struct Hop {
    hop: TraceHop,
    walk: bool,
}

impl Hop {
    /// A hop that failed during the watch even if packets still passed: a link whose transmit
    /// errors rose.
    fn fails(&self) -> bool {
        self.hop.name.starts_with("link") && errors_rose(&self.hop)
    }

    /// Where the flow stops: it did not count, or it failed.
    fn stops(&self) -> bool {
        self.hop.moved == Some(0) || self.fails()
    }
}

fn hop(name: &str, node: &str, object: String) -> TraceHop {
    TraceHop { name: name.into(), node: node.into(), object, ..Default::default() }
}

/// A counter as a trace reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Count {
    now: u64,
    /// During the watch; None without one.
    moved: Option<u64>,
    /// It went down during the watch: its element or link was made again.
    remade: bool,
}

impl Count {
    /// A counter at `now` that was `before` when the watch began (None: no watch).
    fn new(now: u64, before: Option<u64>) -> Count {
        Count {
            now,
            moved: before.map(|b| if now >= b { now - b } else { now }),
            remade: before.is_some_and(|b| now < b),
        }
    }
}

fn counted(mut h: TraceHop, c: Option<Count>) -> TraceHop {
    if let Some(c) = c {
        h.packets = Some(c.now);
        h.moved = c.moved;
        if c.remade {
            h.details.push("remade during the watch: its counter started again from 0".into());
        }
    }
    h
}

/// The report of a traced flow: the first walked hop that did not move (after one that did)
/// stops it, with `cause` saying why in words.
fn finish(subject: String, hops: Vec<Hop>, seen: &Seen, cause: impl Fn(&TraceHop, bool) -> String) -> TraceReport {
    let mut report =
        TraceReport { subject, watched_seconds: seen.watched, unanswered: seen.unanswered(), ..Default::default() };
    if let Some(h) = hops.iter().find(|h| h.hop.state == TraceHopState::Refused as i32) {
        report.verdict = TraceVerdict::Refused as i32;
        report.stopped_at = h.hop.name.clone();
        report.cause = h.hop.details.first().cloned().unwrap_or_default();
    } else if seen.watched > 0 {
        let walked: Vec<&Hop> = hops.iter().filter(|h| h.walk && h.hop.moved.is_some()).collect();
        let stop = walked.iter().position(|h| h.stops());
        match stop {
            Some(i) => {
                report.verdict = TraceVerdict::Stopped as i32;
                report.stopped_at = walked[i].hop.name.clone();
                report.cause = cause(&walked[i].hop, i == 0);
            }
            None if !walked.is_empty() => {
                report.verdict = TraceVerdict::Healthy as i32;
                let moved: Vec<String> =
                    walked.iter().map(|h| format!("{} +{}", h.hop.name, h.hop.moved.unwrap_or(0))).collect();
                report.cause = format!("every hop counted the flow: {}", moved.join(", "));
            }
            None => report.cause = "no hop's counter could be read".into(),
        }
    } else {
        report.cause = "one read: run with --watch SECONDS while the client tries to see where it stops".into();
    }
    // Drift repaired on the path during the watch is news whatever the verdict.
    let nodes: std::collections::BTreeSet<&str> = hops.iter().map(|h| h.hop.node.as_str()).collect();
    let drift: Vec<String> = nodes.iter().filter_map(|n| seen.drift_during(n)).collect();
    if !drift.is_empty() {
        report.cause = format!("{}; {}", report.cause, drift.join("; "));
    }
    let stopped = report.stopped_at.clone();
    let mut marked = false;
    report.hops = hops
        .into_iter()
        .map(|mut h| {
            // Judged by the watch: moved is ok, the stop is stopped, the rest is not judged.
            if h.hop.state == TraceHopState::Unknown as i32 {
                let stops = !marked && h.walk && h.hop.name == stopped && h.stops();
                marked |= stops;
                if stops {
                    h.hop.state = TraceHopState::Stopped as i32;
                } else if h.hop.moved.is_some_and(|m| m > 0) {
                    h.hop.state = TraceHopState::Ok as i32;
                }
            }
            h.hop
        })
        .collect();
    report
}

// ---- Port maps -------------------------------------------------------------------------------

/// What `trace ADDR:PORT` resolves: the mapping that publishes it, on which node and interface.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub addr: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

/// Parses "ADDR:PORT", "ADDR:PORT/udp", "[ADDR6]:PORT/tcp".
pub fn parse_target(text: &str) -> Result<Target, String> {
    let (a, proto) = match text.rsplit_once('/') {
        Some((a, p)) if p.eq_ignore_ascii_case("udp") => (a, Protocol::Udp),
        Some((a, p)) if p.eq_ignore_ascii_case("tcp") => (a, Protocol::Tcp),
        Some((_, p)) => return Err(format!("{text:?}: protocol {p:?} is neither tcp nor udp")),
        None => (text, Protocol::Tcp),
    };
    let s: SocketAddr = a.parse().map_err(|_| format!("{text:?}: not ADDR:PORT[/udp] (IPv6 as [ADDR]:PORT)"))?;
    Ok(Target { addr: s.ip(), port: s.port(), protocol: proto })
}

/// The nodes whose counters a port-map trace reads: the accepting node publishing `t`, and the
/// pod's node.
pub fn port_map_nodes(t: &Target, port_maps: &Objects<PortMap>, out: &Outputs) -> Vec<String> {
    let Some((key, node)) = publisher(t, port_maps, out) else { return Vec::new() };
    let mut nodes = vec![node];
    if let Some(pod) = out.port_maps.get(&key).and_then(|s| s.endpoint.as_ref()).map(|e| e.node.clone())
        && !nodes.contains(&pod)
    {
        nodes.push(pod);
    }
    nodes
}

fn covers(pm: &PortMap, t: &Target) -> bool {
    pm.spec.protocol == t.protocol && (pm.spec.port..=pm.spec.end_port.unwrap_or(pm.spec.port)).contains(&t.port)
}

/// The mapping whose status publishes `t`, and the accepting node.
fn publisher(t: &Target, port_maps: &Objects<PortMap>, out: &Outputs) -> Option<(MapKey, String)> {
    port_maps.iter().filter(|pm| covers(pm, t)).find_map(|pm| {
        let key = key_of(pm);
        let status = out.port_maps.get(&key)?;
        let p = status.published.iter().find(|p| p.address.parse::<IpAddr>().ok() == Some(t.addr))?;
        Some((key, p.node.clone()))
    })
}

fn condition<'a>(
    status: &'a PortMapStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// Why a mapping is not in the datapath, from its status: "Reason: message"; None when it is.
fn refusal(status: &PortMapStatus) -> Option<String> {
    for type_ in ["Accepted", "Programmed"] {
        if let Some(c) = condition(status, type_)
            && c.status == "False"
            && c.reason != "Pending"
        {
            return Some(format!("{type_} False, {}: {}", c.reason, c.message));
        }
    }
    None
}

/// The sum of the counted elements of a node's kuport sets named `base` (and the IPv6 twin)
/// whose key satisfies `matches`, among the sets the node's desired state counts.
fn elements(state: &NodeState, report: &CounterReport, base: &str, matches: impl Fn(&[NftValue]) -> bool) -> u64 {
    let named = |n: &str| n == base || n.strip_suffix('6') == Some(base);
    let host: Vec<_> = state.netns.iter().filter(|n| n.is_host()).flat_map(|n| &n.nft_tables).collect();
    let counted = |t: &TableCounters, set: &str| {
        host.iter()
            .any(|w| w.family == t.family && w.name == t.name && w.sets.iter().any(|s| s.name == set && s.counter))
    };
    let mut sum = 0;
    for t in &report.tables {
        for s in t.sets.iter().filter(|s| named(&s.name) && counted(t, &s.name)) {
            sum += s.elements.iter().filter(|e| matches(&e.key)).map(|e| e.packets).sum::<u64>();
        }
    }
    sum
}

fn key_has_ifname(key: &[NftValue], name: &str) -> bool {
    key.iter().any(|v| matches!(&v.value, Some(Value::Ifname(i)) if i == name))
}

/// A key naming the pod (one of `addrs`), the protocol and, for a range, a port in it.
fn key_names_pod(key: &[NftValue], addrs: &[IpAddr], proto: L4Proto, ports: Option<(u16, u16)>) -> bool {
    let mut addr = false;
    let mut pr = false;
    let mut port = ports.is_none();
    for v in key {
        match &v.value {
            Some(Value::Addr(a)) => addr |= a.parse::<IpAddr>().is_ok_and(|a| addrs.contains(&a)),
            Some(Value::Proto(p)) => pr |= *p == proto as i32,
            Some(Value::Port(r)) => {
                port |= ports.is_some_and(|(a, b)| r.first <= u32::from(b) && r.last >= u32::from(a));
            }
            _ => {}
        }
    }
    addr && pr && port
}

fn link<'a>(report: &'a CounterReport, name: &str) -> Option<&'a LinkCounters> {
    report.links.iter().find(|l| l.name == name)
}

/// A link hop: its transmit (`tx`) or receive counter, with its MTU and errors as details.
fn link_hop(name: &str, node: &str, device: &str, peer: &str, tx: bool, seen: &Seen) -> TraceHop {
    let object = format!("link {device} to {peer}");
    let count = seen.count(node, |r| link(r, device).map(|l| if tx { l.tx_packets } else { l.rx_packets }));
    let mut h = counted(hop(name, node, object), count);
    let Some(read) = seen.read(node) else { return h };
    let Some(l) = link(&read.last, device) else {
        h.state = TraceHopState::Refused as i32;
        h.details.push(format!("{node} has no link {device}: its executor has not made it, or it was removed"));
        return h;
    };
    h.details.push(format!("mtu {}", l.mtu));
    if !l.up {
        h.details.push("down".into());
    }
    // Transmit errors belong to the sending hop: the same device's receiving hop does not
    // repeat them.
    let errors = seen.count(node, |r| link(r, device).map(|l| l.tx_errors)).filter(|_| tx);
    if let Some(Count { now: n, moved, .. }) = errors
        && n > 0
    {
        h.details.push(match moved {
            Some(m) => format!("transmit errors {n} (+{m})"),
            None => format!("transmit errors {n}"),
        });
    }
    if l.rx_errors + l.rx_dropped + l.tx_dropped > 0 {
        h.details.push(format!("rx errors {}, rx dropped {}, tx dropped {}", l.rx_errors, l.rx_dropped, l.tx_dropped));
    }
    h
}

/// Whether a hop's details say its transmit errors rose during the watch.
fn errors_rose(h: &TraceHop) -> bool {
    h.details.iter().any(|d| d.starts_with("transmit errors") && !d.ends_with("(+0)") && d.contains("(+"))
}

/// `trace ADDR:PORT[/udp]`: the mapping that publishes it (or each that was refused for it),
/// the accepting node's guard, steering and DNAT, the link both ways, the pod node's claim and
/// return mark, and the pod.
pub fn port_map(
    t: &Target,
    from: Option<IpAddr>,
    port_maps: &Objects<PortMap>,
    classes: &Objects<PortMapClass>,
    out: &Outputs,
    seen: &Seen,
) -> TraceReport {
    let proto = match t.protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    };
    let dialed = format!("{}/{proto}", SocketAddr::new(t.addr, t.port));
    let refused: Vec<(MapKey, String)> = port_maps
        .iter()
        .filter(|pm| covers(pm, t))
        .filter_map(|pm| {
            let key = key_of(pm);
            let why = out.port_maps.get(&key).and_then(refusal)?;
            Some((key, why))
        })
        .collect();
    let Some((key, accepting)) = publisher(t, port_maps, out) else {
        let mut report = TraceReport { subject: dialed.clone(), watched_seconds: seen.watched, ..Default::default() };
        report.verdict = TraceVerdict::Refused as i32;
        report.stopped_at = "publish".into();
        report.cause = match refused.first() {
            Some(_) => {
                let each: Vec<String> =
                    refused.iter().map(|((ns, n), why)| format!("PortMap {ns}/{n}: {why}")).collect();
                format!("no PortMap publishes {dialed}; refused for it: {}", each.join("; "))
            }
            None => format!(
                "no PortMap publishes {dialed}: none covers the port and protocol, or none's status lists the address"
            ),
        };
        for ((ns, n), why) in &refused {
            let mut h = hop("publish", "", format!("PortMap {ns}/{n}"));
            h.state = TraceHopState::Refused as i32;
            h.details.push(why.clone());
            report.hops.push(h);
        }
        return report;
    };
    let Some(pm) = port_maps.iter().find(|pm| key_of(pm) == key) else {
        return TraceReport { subject: dialed, ..Default::default() };
    };
    let status = out.port_maps.get(&key).cloned().unwrap_or_default();
    let class = &pm.spec.class_name;
    let class_spec = classes.iter().find(|c| c.metadata.name.as_deref() == Some(class.as_str()));
    let mode = match class_spec.map(|c| c.spec.serving_mode) {
        Some(crate::api::ServingMode::Multi) => "Multi",
        _ => "Single",
    };
    let subject = format!("{dialed}: PortMap {}/{} (class {class}, {mode}), accepted on {accepting}", key.0, key.1);
    let mut hops = Vec::new();
    let mut mapping = hop("publish", &accepting, format!("PortMap {}/{}", key.0, key.1));
    for ((ns, n), why) in refused.iter().filter(|(k, _)| *k != key) {
        mapping.details.push(format!("also asked for it, refused: PortMap {ns}/{n}: {why}"));
    }
    if let Some(why) = refusal(&status) {
        mapping.state = TraceHopState::Refused as i32;
        mapping.details.insert(0, why);
    } else {
        mapping.state = TraceHopState::Ok as i32;
    }
    hops.push(Hop { hop: mapping, walk: false });
    let Some(endpoint) = status.endpoint.clone() else {
        let subject = format!("{subject}; no endpoint");
        return finish(subject, hops, seen, |_, _| String::new());
    };
    let pod_node = endpoint.node.clone();
    let owners = Owners::new(port_maps.iter(), &out.port_maps);
    // The mapping's counters on the accepting node, attributed once per read.
    let mine = |r: &CounterReport| -> Option<MapCounters> {
        let state = seen.states.get(&accepting)?;
        Some(attribute(&accepting, state, r, &owners).0.remove(&key).unwrap_or_default())
    };
    let read = seen.read(&accepting);
    let (before, now) =
        (read.and_then(|r| seen.first(r)).map(|r| mine(r).unwrap_or_default()), read.and_then(|r| mine(&r.last)));
    let of = |pick: fn(&MapCounters) -> u64| now.as_ref().map(|n| Count::new(pick(n), before.as_ref().map(pick)));
    let list = class_spec.and_then(|c| source_ranges(c, class, &pm.spec.source_ranges).ok()).flatten();
    if let (Some(client), Some(h)) = (from, hops.first_mut()) {
        h.hop.details.push(match &list {
            Some(l) if l.iter().any(|n| n.contains(&client)) => format!("the allow-list admits {client}"),
            Some(l) => {
                let l: Vec<String> = l.iter().map(ToString::to_string).collect();
                format!("the allow-list drops {client}: it admits {} only", l.join(", "))
            }
            None => format!("no allow-list: {client} is admitted"),
        });
    }
    if list.is_some() || pm.spec.rate_limit.is_some() {
        let c = of(|m| m.dropped_source);
        let mut h = counted(hop("allow-list", &accepting, "the mapping's kup-guard chain".into()), c);
        h.details.push("counts the packets it drops".into());
        hops.push(Hop { hop: h, walk: false });
        let c = of(|m| m.dropped_rate + m.dropped_connections);
        let mut h = counted(hop("rate limit", &accepting, "the mapping's kup-limit chain".into()), c);
        h.details.push("counts the new connections it drops".into());
        hops.push(Hop { hop: h, walk: false });
    }
    let c = of(|m| m.accepted_packets);
    hops.push(Hop { hop: counted(hop("accept", &accepting, "steer element of the mapping".into()), c), walk: true });
    let c = of(|m| m.connections);
    let mut dnat = counted(hop("dnat", &accepting, "publish element of the mapping".into()), c);
    dnat.details.push("counts new connections".into());
    hops.push(Hop { hop: dnat, walk: false });

    let pod_addrs: Vec<IpAddr> =
        [&endpoint.address, &endpoint.address6].iter().filter_map(|a| a.parse().ok()).collect();
    let ports = pm.spec.end_port.map(|e| (pm.spec.port, e));
    let p = l4(pm.spec.protocol);
    if pod_node != accepting {
        let out_dev = device_name(class, &pod_node);
        let in_dev = device_name(class, &accepting);
        hops.push(Hop { hop: link_hop("link out", &accepting, &out_dev, &pod_node, true, seen), walk: true });
        hops.push(Hop { hop: link_hop("link in", &pod_node, &in_dev, &accepting, false, seen), walk: true });
        let st = seen.states.get(&pod_node);
        let arrive = seen.count(&pod_node, |r| {
            let on_link = |k: &[NftValue]| key_has_ifname(k, &in_dev);
            Some(elements(st?, r, "steer_port", on_link) + elements(st?, r, "steer_range", on_link))
        });
        hops.push(Hop {
            hop: counted(hop("arrive", &pod_node, format!("steer element of {in_dev}")), arrive),
            walk: true,
        });
        let claim = seen.count(&pod_node, |r| {
            let pod = |k: &[NftValue]| key_names_pod(k, &pod_addrs, p, ports);
            Some(elements(st?, r, "claim_port", pod) + elements(st?, r, "claim_range", pod))
        });
        let mut h = counted(hop("claim", &pod_node, "claim element of the pod".into()), claim);
        h.details.push("counts new connections".into());
        hops.push(Hop { hop: h, walk: false });
        let single = st.is_some_and(|s| has_set(s, "return_mark_port") || has_set(s, "return_mark_range"));
        if single {
            let ret = seen.count(&pod_node, |r| {
                let pod = |k: &[NftValue]| key_names_pod(k, &pod_addrs, p, ports);
                Some(elements(st?, r, "return_mark_port", pod) + elements(st?, r, "return_mark_range", pod))
            });
            hops.push(Hop {
                hop: counted(hop("return", &pod_node, "return mark element of the pod".into()), ret),
                walk: true,
            });
        }
        hops.push(Hop { hop: link_hop("link back", &pod_node, &in_dev, &accepting, true, seen), walk: true });
        hops.push(Hop { hop: link_hop("link home", &accepting, &out_dev, &pod_node, false, seen), walk: true });
    }
    let mut pod = hop("pod", &pod_node, format!("{} {}", endpoint.address, endpoint.address6).trim().to_string());
    pod.state = TraceHopState::Ok as i32;
    hops.push(Hop { hop: pod, walk: false });

    let cause = |h: &TraceHop, first: bool| -> String {
        let on = &h.node;
        match h.name.as_str() {
            "accept" if first => format!(
                "no packet of the flow reached {on}'s published address during the watch: the client's packets never \
                 reach the accepting node (a firewall, NAT or route before it), the allow-list or rate limit dropped \
                 them (see their counters), or the client did not try"
            ),
            "link back" if errors_rose(h) => format!(
                "{on} marked the pod's replies but its link could not send them (transmit errors rose): the loop guard \
                 (ip rule pref 101) is likely missing, so the link's own packets loop into it"
            ),
            _ if errors_rose(h) => format!("{on}'s {} could not send (transmit errors rose)", h.object),
            "link out" => {
                format!("{on} steered the flow but its link to {pod_node} sent nothing: check the link's route and MTU")
            }
            "link in" => format!(
                "{accepting} sent on the link but {on} received nothing: the underlay or the mesh loses the link's packets"
            ),
            "arrive" => format!(
                "{on} received on the link but its steer element did not count: the pod node's element is missing"
            ),
            "return" => format!(
                "the pod did not answer through {on}'s return mark: the pod does not reply, or the return mark element is missing"
            ),
            "link back" => format!("{on} marked the replies but its link sent nothing"),
            "link home" => {
                format!("{on} received no reply on the link from {pod_node}: the underlay or the mesh loses them")
            }
            _ => format!("{} on {on} did not count the flow", h.name),
        }
    };
    finish(subject, hops, seen, cause)
}

fn has_set(state: &NodeState, name: &str) -> bool {
    state
        .netns
        .iter()
        .filter(|n| n.is_host())
        .flat_map(|n| &n.nft_tables)
        .any(|t| t.sets.iter().any(|s| s.name == name))
}

// ---- The mesh --------------------------------------------------------------------------------

/// The node a mesh trace's end names: the node itself, or a pod's node.
pub fn mesh_end(end: &str, pods: bool, cluster_pods: &Objects<Pod>) -> Result<String, String> {
    if !pods {
        return Ok(end.to_string());
    }
    let (ns, name) = end.split_once('/').ok_or_else(|| format!("pod {end:?}: not NS/NAME"))?;
    let pod = cluster_pods
        .iter()
        .find(|p| p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name))
        .ok_or_else(|| format!("pod {end}: not in the controller's inputs"))?;
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).ok_or_else(|| format!("pod {end}: not scheduled to a node"))
}

/// The nodes whose counters a mesh trace reads: both ends, and the relay between them.
pub fn mesh_nodes(from: &str, to: &str, out: &Outputs) -> Vec<String> {
    let mut nodes = vec![from.to_string(), to.to_string()];
    if let Some(PeerRoute::Via(r)) = out.overlay.get(from).and_then(|o| o.routes.get(to)) {
        nodes.push(r.clone());
    }
    nodes
}

fn peer<'a>(report: &'a CounterReport, key: &str) -> Option<&'a PeerStatus> {
    report.peers.iter().find(|p| p.public_key == key)
}

/// A WireGuard entry hop: `node`'s entry for `other`, counted by the bytes it sent (`tx`) or
/// received.
fn peer_hop(name: &str, node: &str, other: &str, tx: bool, out: &Outputs, seen: &Seen) -> TraceHop {
    let key = out.overlay.get(other).and_then(|o| o.public_key.clone()).unwrap_or_default();
    let short = key.get(..8).unwrap_or(&key);
    let mut h = hop(name, node, format!("wg peer {short}… ({other})"));
    let bytes = seen.count(node, |r| peer(r, &key).map(|p| if tx { p.transmit_bytes } else { p.receive_bytes }));
    if let Some(c) = bytes {
        h.bytes = c.now;
        h.moved = c.moved;
    }
    let Some(read) = seen.read(node) else { return h };
    let Some(p) = peer(&read.last, &key) else {
        h.state = TraceHopState::Refused as i32;
        h.details.push(format!("{node}'s WireGuard has no peer for {other}"));
        return h;
    };
    h.details.push(format!("endpoint {}", if p.endpoint.is_empty() { "-" } else { &p.endpoint }));
    h.details.push(match p.last_handshake_unix_seconds {
        0 => "no handshake yet".to_string(),
        t => format!("last handshake {}s ago", read.last.read_unix_seconds.saturating_sub(t)),
    });
    h.details.push(format!("sent {} B, received {} B", p.transmit_bytes, p.receive_bytes));
    if let Some(seen_) = overlay::seen_of(&out.overlay, node, other) {
        h.details.push(format!("reach {}", reach_word(seen_.reach)));
    }
    h
}

fn reach_word(r: Reach) -> &'static str {
    match r {
        Reach::Unknown => "unknown",
        Reach::Direct => "direct",
        Reach::Unreachable => "unreachable",
    }
}

/// `trace pod A --to B` or `trace node A --to B`: direct or relayed and through whom, each
/// WireGuard entry's handshake, bytes and endpoint, who reports the other unreachable, the MTU.
pub fn mesh(from: &str, to: &str, out: &Outputs, seen: &Seen) -> TraceReport {
    let subject = format!("mesh {from} to {to}");
    let mut hops = Vec::new();
    for n in [from, to] {
        match out.overlay.get(n) {
            None => {
                let mut h = hop("member", n, format!("node {n}"));
                h.state = TraceHopState::Refused as i32;
                h.details.push(format!("{n} is not in the overlay (the overlay is off, or no such Node)"));
                hops.push(Hop { hop: h, walk: false });
            }
            Some(o) if !o.refused.is_empty() => {
                let mut h = hop("member", n, format!("node {n}"));
                h.state = TraceHopState::Refused as i32;
                h.details.extend(o.refused.iter().map(|r| format!("{}: {}: {}", r.field, r.reason, r.message)));
                hops.push(Hop { hop: h, walk: false });
            }
            Some(_) => {}
        }
    }
    if !hops.is_empty() || from == to {
        let mut report = finish(subject, hops, seen, |_, _| String::new());
        if from == to {
            report.cause = format!("{from} is both ends: pods on one node do not cross the mesh");
        }
        return report;
    }
    let route = out.overlay.get(from).and_then(|o| o.routes.get(to)).cloned().unwrap_or_default();
    let mut r = hop("route", from, format!("{from} to {to}: {route}"));
    r.state = TraceHopState::Ok as i32;
    if let Some(o) = out.overlay.get(from) {
        r.details.push(format!("mtu {}", o.mtu));
    }
    for (a, b) in [(from, to), (to, from)] {
        let reach = overlay::seen_of(&out.overlay, a, b).map(|s| s.reach).unwrap_or_default();
        let key = out.overlay.get(b).and_then(|o| o.public_key.as_deref()).unwrap_or_default();
        let since = seen.reach_since.get(a).and_then(|k| k.get(key)).zip(seen.now);
        r.details.push(match since.and_then(|(at, now)| now.duration_since(*at).ok()) {
            Some(age) => format!("{a} reports {b} {} (since {}s ago)", reach_word(reach), age.as_secs()),
            None => format!("{a} reports {b} {}", reach_word(reach)),
        });
    }
    match &route {
        PeerRoute::Via(relay) => r
            .details
            .push(format!("relayed: one of them reports the other unreachable, and {relay} reaches both directly")),
        PeerRoute::Unreachable => {
            r.details.push("unreachable: no relay reaches both directly; the pair stays on its direct entry".into())
        }
        PeerRoute::Direct => {}
    }
    hops.push(Hop { hop: r, walk: false });
    match &route {
        PeerRoute::Via(relay) => {
            hops.push(Hop { hop: peer_hop("send", from, relay, true, out, seen), walk: true });
            hops.push(Hop { hop: peer_hop("relay in", relay, from, false, out, seen), walk: true });
            hops.push(Hop { hop: peer_hop("relay out", relay, to, true, out, seen), walk: true });
            hops.push(Hop { hop: peer_hop("receive", to, relay, false, out, seen), walk: true });
        }
        _ => {
            hops.push(Hop { hop: peer_hop("send", from, to, true, out, seen), walk: true });
            hops.push(Hop { hop: peer_hop("receive", to, from, false, out, seen), walk: true });
        }
    }
    let cause = |h: &TraceHop, first: bool| -> String {
        if first {
            format!("{} sent nothing to the peer during the watch: no traffic, or no route to it", h.node)
        } else {
            format!("{} received nothing from the peer: the packets are lost between them ({})", h.node, h.object)
        }
    };
    let mut report = finish(subject, hops, seen, cause);
    if report.verdict == TraceVerdict::Healthy as i32 {
        report.cause = format!("{route}: {}", report.cause);
    }
    report
}

// ---- Interception ----------------------------------------------------------------------------

/// `trace intercept NS/NAME`: per selected pod, its table and the counters of its rules, or why
/// it is refused.
pub fn intercept(
    ic: &Intercept,
    status: &InterceptStatus,
    placed: &[(String, String)],
    unacked: &[String],
    seen: &Seen,
) -> TraceReport {
    let ns = ic.metadata.namespace.clone().unwrap_or_default();
    let name = ic.metadata.name.clone().unwrap_or_default();
    let subject = format!(
        "Intercept {ns}/{name}: {} pod(s) selected, {} programmed",
        status.selected_pods, status.programmed_pods
    );
    let mut hops = Vec::new();
    for (pod, node) in placed {
        let mut h = hop("pod", node, format!("pod {ns}/{pod}"));
        let counters = seen.read(node).and_then(|r| {
            r.last.pods.iter().find(|p| p.pod.as_ref().is_some_and(|p| p.namespace == ns && p.name == *pod))
        });
        match counters {
            Some(c) if !c.error.is_empty() => {
                h.state = TraceHopState::Unknown as i32;
                h.details.push(format!("its table could not be read: {}", c.error));
            }
            Some(c) => {
                h.state = TraceHopState::Ok as i32;
                let mut total = 0;
                for t in &c.tables {
                    for set in &t.sets {
                        for e in &set.elements {
                            total += e.packets;
                            let key: Vec<String> = e.key.iter().map(value_text).collect();
                            h.details.push(format!(
                                "table {} {} {}: {} packets",
                                t.name,
                                set.name,
                                key.join(" . "),
                                e.packets
                            ));
                        }
                    }
                    for ch in &t.chains {
                        for r in &ch.rules {
                            total += r.packets;
                            h.details.push(format!(
                                "table {} chain {} rule {}: {} packets",
                                t.name, ch.name, r.index, r.packets
                            ));
                        }
                    }
                }
                h.packets = Some(total);
                if total == 0 {
                    h.details.push("its table is in place; it has redirected nothing yet".into());
                }
            }
            None if seen.read(node).is_some() => {
                h.state = TraceHopState::Unknown as i32;
                h.details.push(format!("{node}'s executor holds no table for it yet"));
            }
            None => h.details.push(format!("{node}'s counters were not read")),
        }
        if unacked.contains(node) {
            h.details.push(format!("{node}'s executor has not acknowledged it yet"));
        }
        hops.push(Hop { hop: h, walk: false });
    }
    let mut refused = Vec::new();
    for p in &status.pods {
        if placed.iter().any(|(n, _)| *n == p.name) {
            continue;
        }
        let mut h = hop("pod", &p.node, format!("pod {ns}/{}", p.name));
        h.state = TraceHopState::Refused as i32;
        h.details.push(format!("{}: {}", p.reason, p.message));
        refused.push(format!("pod {ns}/{}: {}: {}", p.name, p.reason, p.message));
        hops.push(Hop { hop: h, walk: false });
    }
    let hops_out: Vec<TraceHop> = hops.into_iter().map(|h| h.hop).collect();
    let unanswered = seen.unanswered();
    let programmed = hops_out.iter().filter(|h| h.state == TraceHopState::Ok as i32).count();
    let mut report =
        TraceReport { subject, hops: hops_out, unanswered, watched_seconds: seen.watched, ..Default::default() };
    if refused.is_empty() {
        report.verdict = TraceVerdict::Healthy as i32;
        report.cause = format!("{programmed} pod(s) hold the table");
    } else {
        report.verdict = TraceVerdict::Refused as i32;
        report.stopped_at = "pod".into();
        report.cause = format!("{programmed} pod(s) hold the table; refused: {}", refused.join("; "));
    }
    report
}

/// A key's value as nft prints it, for a hop's details.
fn value_text(v: &NftValue) -> String {
    match &v.value {
        Some(Value::Proto(p)) => match L4Proto::try_from(*p) {
            Ok(L4Proto::Tcp) => "tcp".into(),
            Ok(L4Proto::Udp) => "udp".into(),
            _ => p.to_string(),
        },
        Some(Value::Port(r)) if r.first == r.last => r.first.to_string(),
        Some(Value::Port(r)) => format!("{}-{}", r.first, r.last),
        Some(Value::Addr(a)) => a.clone(),
        Some(Value::Ifname(i)) => format!("\"{i}\""),
        Some(Value::Mark(m)) => format!("{m:#x}"),
        _ => "?".into(),
    }
}

#[cfg(test)]
mod tests;
