//! The Intercept resource, assembled: which pods each Intercept selects, which of them get the
//! tables ([`super::tables`]) in their own namespace on their node, and the status that says so.
//! docs/intercept/resource.md lists the reasons.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kuport_proto::v1::{NetnsState, PodRef};
use prost::Message;

use super::{AgentIdentity, Intercept as Port, InterceptSpec, Protocol, Refusal};
use crate::api::{self, Intercept, InterceptStatus, PodProgress};
use crate::compute::conditions::{condition, keep_time};
use crate::compute::{ObjectKey, Tracked};

/// An Intercept's namespace and name.
pub type InterceptKey = (String, String);

pub const ACCEPTED: &str = "Accepted";
pub const PROGRAMMED: &str = "Programmed";

/// The reasons of the Accepted and Programmed conditions and of each pod not programmed.
pub mod reason {
    pub const ACCEPTED: &str = "Accepted";
    pub const PORT_OUT_OF_RANGE: &str = "PortOutOfRange";
    pub const DUPLICATE_PORT: &str = "DuplicatePort";
    pub const PROXY_PORT_CONFLICT: &str = "ProxyPortConflict";
    pub const INVALID_SUBNET: &str = "InvalidSubnet";
    pub const INVALID_IDENTITY: &str = "InvalidIdentity";
    pub const NO_INTERCEPT: &str = "NoIntercept";
    pub const PROGRAMMED: &str = "Programmed";
    pub const NO_POD_SELECTED: &str = "NoPodSelected";
    pub const PODS_NOT_PROGRAMMED: &str = "PodsNotProgrammed";
    pub const NOT_ACCEPTED: &str = "NotAccepted";
    pub const NOT_RUNNING: &str = "PodNotRunning";
    pub const HOST_NETWORK: &str = "HostNetwork";
    pub const NO_POD_IP: &str = "NoPodIP";
    pub const OWNER_MATCH_IMPOSSIBLE: &str = "OwnerMatchImpossible";
    pub const ALREADY_INTERCEPTED: &str = "AlreadyIntercepted";
    pub const NAMESPACE_NOT_FOUND: &str = "NamespaceNotFound";
    pub const PENDING: &str = "Pending";
}

/// What the computation decided for every Intercept; the maps [`super::super::Outputs`] shares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decided {
    /// Per node, the pod namespaces to program, in canonical order: a node whose list did not
    /// change keeps its allocation ([`Decided::with_namespaces_redone`]).
    pub netns: BTreeMap<String, Arc<Vec<NetnsState>>>,
    /// Statuses as if every placed pod were programmed ([`finish`] corrects them).
    pub statuses: Arc<BTreeMap<InterceptKey, InterceptStatus>>,
    /// Per Intercept, its placed pods: (pod name, node).
    pub placed: Arc<BTreeMap<InterceptKey, Vec<(String, String)>>>,
    pub tracked: Arc<BTreeMap<ObjectKey, Tracked>>,
}

fn key_of(i: &Intercept) -> InterceptKey {
    (i.metadata.namespace.clone().unwrap_or_default(), i.metadata.name.clone().unwrap_or_default())
}

/// The spec as the table function reads it, or why it cannot be read.
fn table_spec(spec: &api::InterceptSpec) -> Result<InterceptSpec, (&'static str, String)> {
    let identity = match (spec.agent.group, spec.agent.user, spec.agent.mark) {
        (None, None, None) => AgentIdentity::default(),
        (Some(g), None, None) => AgentIdentity::Group(g),
        (None, Some(u), None) => AgentIdentity::User(u),
        (None, None, Some(m)) => AgentIdentity::Mark(m),
        _ => return Err((reason::INVALID_IDENTITY, "agent: set one of group, user, mark".into())),
    };
    let mut subnets = Vec::new();
    for (i, s) in spec.mesh_dial_subnets.iter().enumerate() {
        let net: IpNet =
            s.parse().map_err(|_| (reason::INVALID_SUBNET, format!("meshDialSubnets[{i}]: {s:?} is not a CIDR")))?;
        subnets.push(net);
    }
    let intercepts = spec
        .intercepts
        .iter()
        .map(|p| Port {
            protocol: match p.protocol {
                api::Protocol::Tcp => Protocol::Tcp,
                api::Protocol::Udp => Protocol::Udp,
            },
            container_port: p.container_port,
            agent_port: p.agent_port,
            proxy_port: p.proxy_port,
        })
        .collect();
    Ok(InterceptSpec { intercepts, identity, mesh_dial_subnets: subnets, pod_addresses: Vec::new() })
}

fn refusal_reason(r: &Refusal) -> &'static str {
    match r {
        Refusal::PortOutOfRange { .. } => reason::PORT_OUT_OF_RANGE,
        Refusal::DuplicatePort { .. } => reason::DUPLICATE_PORT,
        Refusal::ProxyPortIntercepted { .. } | Refusal::DuplicateProxyPort { .. } => reason::PROXY_PORT_CONFLICT,
    }
}

/// The Accepted verdict: the spec the tables come from, or the reason and message it is not.
/// An intercept refused by [`super::tables`] leaves the others programmed (Accepted stays True,
/// with the refusal's reason and message).
fn accept(spec: &api::InterceptSpec) -> (Result<InterceptSpec, ()>, &'static str, String) {
    let s = match table_spec(spec) {
        Ok(s) => s,
        Err((r, m)) => return (Err(()), r, m),
    };
    let (kept, refusals) = super::accept(&s);
    let why: Vec<String> = refusals.iter().map(ToString::to_string).collect();
    let first = refusals.first().map(refusal_reason);
    if kept.is_empty() {
        let why = if why.is_empty() { "none listed".to_string() } else { why.join("; ") };
        return (Err(()), first.unwrap_or(reason::NO_INTERCEPT), format!("no intercept accepted: {why}"));
    }
    match first {
        None => (Ok(s), reason::ACCEPTED, "every intercept is accepted".into()),
        Some(r) => (Ok(s), r, format!("{}; the other intercepts are programmed", why.join("; "))),
    }
}

/// Why a selected pod cannot be programmed, before any table is computed.
fn pod_refusal(pod: &Pod) -> Option<(&'static str, String)> {
    let status = pod.status.as_ref();
    let spec = pod.spec.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if pod.metadata.deletion_timestamp.is_some() {
        return Some((reason::NOT_RUNNING, "the pod is terminating".into()));
    }
    if phase != "Running" {
        return Some((reason::NOT_RUNNING, format!("the pod is {phase}, not Running")));
    }
    if spec.and_then(|s| s.host_network) == Some(true) {
        return Some((
            reason::HOST_NETWORK,
            "the pod uses the host's network namespace (hostNetwork: true); kuport never programs the host's \
             namespace for an Intercept"
                .into(),
        ));
    }
    if spec.and_then(|s| s.node_name.as_deref()).unwrap_or_default().is_empty() {
        return Some((reason::NOT_RUNNING, "the pod has no node".into()));
    }
    if pod_ips(pod).is_empty() {
        return Some((reason::NO_POD_IP, "the pod has no address yet (status.podIPs)".into()));
    }
    // A pod in a user namespace (hostUsers: false) is programmed: the group or user goes as the
    // pod sees it, and the executor, which sees the namespaces, maps it to how the kernel reads
    // it there (docs/intercept/table.md, "Pods in a user namespace").
    None
}

fn pod_ips(pod: &Pod) -> Vec<String> {
    let Some(s) = pod.status.as_ref() else { return Vec::new() };
    let mut ips: Vec<String> = s.pod_ips.iter().flatten().map(|p| p.ip.clone()).collect();
    if ips.is_empty()
        && let Some(ip) = &s.pod_ip
    {
        ips.push(ip.clone());
    }
    ips.retain(|a| a.parse::<IpAddr>().is_ok());
    ips
}

fn selects(spec: &api::InterceptSpec, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    spec.pod_selector.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Whether some Intercept in `intercepts` selects `pod`: the Kubernetes source keeps only those.
pub fn selected_by_any(intercepts: &[&Intercept], pod: &Pod) -> bool {
    intercepts.iter().any(|i| i.metadata.namespace == pod.metadata.namespace && selects(&i.spec, pod))
}

/// Every Intercept, oldest first: an older Intercept keeps a pod a younger one also selects
/// (the younger reports AlreadyIntercepted for it).
/// An Intercept reads only its own namespace's pods and claims only them, so the Intercepts and
/// pods of some namespaces alone decide exactly those namespaces' part.
pub fn compute<'a>(
    intercepts: impl IntoIterator<Item = &'a Intercept>,
    pods: impl IntoIterator<Item = &'a Pod>,
    now: Timestamp,
) -> Decided {
    let mut order: Vec<&Intercept> = intercepts.into_iter().collect();
    order.sort_by(|a, b| {
        let t = |i: &Intercept| i.metadata.creation_timestamp.as_ref().map(|t| t.0);
        t(a).cmp(&t(b)).then_with(|| key_of(a).cmp(&key_of(b)))
    });
    // By namespace, in name order: an Intercept reads only its own namespace's pods.
    let mut by_namespace: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for p in pods {
        if let Some(ns) = p.metadata.namespace.as_deref() {
            by_namespace.entry(ns).or_default().push(p);
        }
    }
    for list in by_namespace.values_mut() {
        list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    }
    // Pod (namespace, name, UID) -> the Intercept programming it. The name too: a manifest
    // folder's pods have no UID, and each is a pod of its own.
    let mut claimed: BTreeMap<(String, String, String), InterceptKey> = BTreeMap::new();
    let mut out = Decided::default();
    let mut netns: BTreeMap<String, Vec<NetnsState>> = BTreeMap::new();
    for ic in order {
        let key = key_of(ic);
        let stored = ic.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or(&[]);
        let generation = ic.metadata.generation;
        let (verdict, accepted_reason, accepted_message) = accept(&ic.spec);
        let selected: Vec<&Pod> =
            by_namespace.get(key.0.as_str()).into_iter().flatten().copied().filter(|p| selects(&ic.spec, p)).collect();
        let mut st = InterceptStatus {
            observed_generation: generation,
            selected_pods: selected.len() as u32,
            ..Default::default()
        };
        let mut placed = Vec::new();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        let mut nodes = BTreeSet::new();
        for pod in selected {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            let mut refuse = |reason: &str, message: String| {
                st.pods.push(PodProgress { name: name.clone(), node: node.clone(), reason: reason.into(), message });
            };
            let Ok(spec) = &verdict else {
                refuse(reason::NOT_ACCEPTED, "the Intercept is not accepted (see Accepted)".into());
                continue;
            };
            if let Some((r, m)) = pod_refusal(pod) {
                refuse(r, m);
                continue;
            }
            let claim = (key.0.clone(), name.clone(), uid.clone());
            if let Some((ns, other)) = claimed.get(&claim) {
                refuse(reason::ALREADY_INTERCEPTED, format!("the older Intercept {ns}/{other} programs this pod"));
                continue;
            }
            let addresses = pod_ips(pod);
            let spec = InterceptSpec {
                pod_addresses: addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                ..spec.clone()
            };
            let tables = match super::tables(&spec) {
                Ok(c) => c.tables,
                Err(e) => {
                    refuse(reason::NOT_ACCEPTED, e.to_string());
                    continue;
                }
            };
            claimed.insert(claim, key.clone());
            let target =
                kuport_proto::netns::pod(PodRef { namespace: key.0.clone(), name: name.clone(), uid, addresses });
            let ns = NetnsState { target, nft_tables: tables.into(), ..Default::default() };
            ns.encode_to_vec().hash(&mut hasher);
            node.hash(&mut hasher);
            nodes.insert(node.clone());
            placed.push((name, node.clone()));
            netns.entry(node).or_default().push(ns);
        }
        st.programmed_pods = placed.len() as u32;
        st.conditions = vec![
            condition(stored, ACCEPTED, verdict.is_ok(), accepted_reason, accepted_message, generation, now),
            programmed_condition(stored, &st, generation, now),
        ];
        if !placed.is_empty() {
            Arc::make_mut(&mut out.tracked).insert(
                ObjectKey::intercept(&key.0, &key.1),
                Tracked { nodes: nodes.into_iter().collect(), fingerprint: hasher.finish() },
            );
        }
        Arc::make_mut(&mut out.placed).insert(key.clone(), placed);
        Arc::make_mut(&mut out.statuses).insert(key, st);
    }
    for (node, mut list) in netns {
        in_canonical_order(&mut list);
        out.netns.insert(node, Arc::new(list));
    }
    out
}

impl Decided {
    /// This result with `namespaces`' part replaced by `redone`, which [`compute`] made from
    /// those namespaces' Intercepts and pods alone. A node whose pod namespaces are the same
    /// keeps its list.
    pub fn with_namespaces_redone(&self, namespaces: &BTreeSet<&str>, redone: Decided) -> Decided {
        let inside = |ns: &str| namespaces.contains(ns);
        let gone: Vec<&InterceptKey> = self.statuses.keys().filter(|k| inside(&k.0)).collect();
        let mut nodes: BTreeSet<&str> =
            gone.iter().flat_map(|k| self.placed.get(*k)).flatten().map(|(_, node)| node.as_str()).collect();
        nodes.extend(redone.netns.keys().map(String::as_str));
        let mut netns = self.netns.clone();
        for node in nodes {
            let old = self.netns.get(node);
            let mut list: Vec<NetnsState> =
                old.into_iter().flat_map(|l| l.iter()).filter(|ns| !inside(pod_namespace(ns))).cloned().collect();
            list.extend(redone.netns.get(node).into_iter().flat_map(|l| l.iter()).cloned());
            in_canonical_order(&mut list);
            if old.is_some_and(|o| **o == list) {
                continue;
            }
            if list.is_empty() {
                netns.remove(node);
            } else {
                netns.insert(node.to_string(), Arc::new(list));
            }
        }
        let mut statuses = self.statuses.clone();
        let mut placed = self.placed.clone();
        let mut tracked = self.tracked.clone();
        {
            let (s, p, t) = (Arc::make_mut(&mut statuses), Arc::make_mut(&mut placed), Arc::make_mut(&mut tracked));
            for key in gone {
                s.remove(key);
                p.remove(key);
                t.remove(&ObjectKey::intercept(&key.0, &key.1));
            }
            s.extend(Arc::unwrap_or_clone(redone.statuses));
            p.extend(Arc::unwrap_or_clone(redone.placed));
            t.extend(Arc::unwrap_or_clone(redone.tracked));
        }
        Decided { netns, statuses, placed, tracked }
    }
}

/// A node's pod namespaces, ordered as its state orders them: equal lists compare equal.
fn in_canonical_order(list: &mut [NetnsState]) {
    list.sort_by(|a, b| kuport_proto::canonical::netns_order(a).cmp(&kuport_proto::canonical::netns_order(b)));
}

/// The Kubernetes namespace of a pod's network namespace ("" for any other).
fn pod_namespace(ns: &NetnsState) -> &str {
    match ns.target.as_ref().and_then(|t| t.kind.as_ref()) {
        Some(kuport_proto::v1::netns_ref::Kind::Pod(p)) => &p.namespace,
        _ => "",
    }
}

/// Programmed: True once every selected pod is programmed; else the reason the pods not
/// programmed share (PodsNotProgrammed when they differ).
fn programmed_condition(
    stored: &[Condition],
    st: &InterceptStatus,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let (ok, r, message) = if st.selected_pods == 0 {
        (false, reason::NO_POD_SELECTED, "the selector matches no pod".to_string())
    } else if st.pods.is_empty() {
        (true, reason::PROGRAMMED, format!("{} of {} pods programmed", st.programmed_pods, st.selected_pods))
    } else {
        let reasons: BTreeSet<&str> = st.pods.iter().map(|p| p.reason.as_str()).collect();
        let r = if reasons.len() == 1 { st.pods[0].reason.as_str() } else { reason::PODS_NOT_PROGRAMMED };
        let first = &st.pods[0];
        let message = format!(
            "{} of {} pods programmed; pod {}: {}",
            st.programmed_pods, st.selected_pods, first.name, first.message
        );
        (false, r, message)
    };
    condition(stored, PROGRAMMED, ok, r, message, generation, now)
}

/// The status to write: `computed` with each placed pod whose executor refused its namespace
/// (`refused`: node -> the executor's (object, reason) errors) reported NamespaceNotFound, and
/// each placed pod on a `pending` node reported Pending; condition times kept from `stored`.
pub fn finish(
    key: &InterceptKey,
    computed: &InterceptStatus,
    placed: &[(String, String)],
    refused: &BTreeMap<String, Vec<(String, String)>>,
    pending: &[String],
    stored: Option<&InterceptStatus>,
    now: Timestamp,
) -> InterceptStatus {
    let mut st = computed.clone();
    for (pod, node) in placed {
        let object = format!("pod {}/{pod}", key.0);
        let nack =
            refused.get(node).into_iter().flatten().find(|(o, _)| *o == object || o.starts_with(&format!("{object} ")));
        let progress = match nack {
            // The executor's owner refusals (node-exec podns::IdError) all name the pod's user
            // namespace; any other refusal of the pod is about finding its namespace.
            Some((_, why)) if why.contains("user namespace") => {
                Some((reason::OWNER_MATCH_IMPOSSIBLE, format!("node {node}: {why}")))
            }
            Some((_, why)) => Some((reason::NAMESPACE_NOT_FOUND, format!("node {node}: {why}"))),
            None if pending.contains(node) => {
                Some((reason::PENDING, format!("waiting for node {node} to apply the state")))
            }
            None => None,
        };
        if let Some((r, message)) = progress {
            st.programmed_pods = st.programmed_pods.saturating_sub(1);
            st.pods.push(PodProgress { name: pod.clone(), node: node.clone(), reason: r.into(), message });
        }
    }
    st.pods.sort();
    let prev = stored.map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    let generation = st.observed_generation;
    let programmed = programmed_condition(prev, &st, generation, now);
    for c in &mut st.conditions {
        if c.type_ == PROGRAMMED {
            *c = programmed.clone();
        } else {
            // The stored transition time wins over the compute's when the status agrees.
            *c = keep_time(prev, c, generation, now);
        }
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{InterceptPort, PodSelector};
    use crate::compute::testkit::{World, now};
    use k8s_openapi::api::core::v1::{PodIP, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod(name: &str, phase: &str, ips: &[&str], edit: impl FnOnce(&mut PodSpec)) -> Pod {
        let mut spec = PodSpec { node_name: Some("worker-2".into()), ..Default::default() };
        edit(&mut spec);
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("dev".into()),
                uid: Some(format!("uid-{name}")),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            },
            spec: Some(spec),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                pod_ips: Some(ips.iter().map(|i| PodIP { ip: (*i).into() }).collect()),
                ..Default::default()
            }),
        }
    }

    fn intercept(name: &str, created: i64, ports: &[(u32, u32)]) -> Intercept {
        let spec = api::InterceptSpec {
            pod_selector: PodSelector { match_labels: [("app".to_string(), "web".to_string())].into() },
            intercepts: ports
                .iter()
                .map(|(c, a)| InterceptPort {
                    protocol: api::Protocol::Tcp,
                    container_port: *c,
                    agent_port: *a,
                    proxy_port: None,
                })
                .collect(),
            agent: Default::default(),
            mesh_dial_subnets: vec!["10.96.0.0/12".into(), "fd00:96::/108".into()],
        };
        let mut i = Intercept::new(name, spec);
        i.metadata.namespace = Some("dev".into());
        i.metadata.generation = Some(1);
        i.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_794_000_000 + created).expect("time")));
        i
    }

    fn pods_world() -> World {
        let mut w = World::new().node("worker-2", "100.64.0.12", true);
        w.c.pods = vec![
            pod("app", "Running", &["10.0.1.5", "fd00:1::5"], |_| {}),
            pod("starting", "Pending", &[], |_| {}),
            pod("hostnet", "Running", &["100.64.0.12"], |s| s.host_network = Some(true)),
            pod("noip", "Running", &[], |_| {}),
            pod("userns", "Running", &["10.0.1.7"], |s| s.host_users = Some(false)),
        ]
        .into();
        w.c.intercepts = vec![intercept("web", 0, &[(8080, 9900), (8080, 9901)])].into();
        w
    }

    fn reasons(st: &InterceptStatus) -> Vec<(&str, &str)> {
        st.pods.iter().map(|p| (p.name.as_str(), p.reason.as_str())).collect()
    }

    #[test]
    fn selected_pods_get_tables_the_others_a_reason() {
        let out = pods_world().run();
        let key = ("dev".to_string(), "web".to_string());
        let st = &out.intercepts[&key];
        assert_eq!((st.selected_pods, st.programmed_pods), (5, 2), "app, and userns (hostUsers: false)");
        assert_eq!(
            reasons(st),
            [("hostnet", reason::HOST_NETWORK), ("noip", reason::NO_POD_IP), ("starting", reason::NOT_RUNNING),]
        );
        let accepted = &st.conditions[0];
        assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("True", reason::DUPLICATE_PORT));
        assert!(accepted.message.contains("the first agent port wins"), "{}", accepted.message);
        assert_eq!(st.conditions[1].reason, reason::PODS_NOT_PROGRAMMED);
        assert_eq!(
            out.intercept_pods[&key],
            [("app".to_string(), "worker-2".to_string()), ("userns".to_string(), "worker-2".to_string())]
        );
        assert_eq!(out.must_ack(&ObjectKey::intercept("dev", "web")), ["worker-2"]);
        let state = &out.node_states["worker-2"];
        let pods: Vec<_> = state.netns.iter().filter(|n| !n.is_host()).collect();
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0].describe(), "pod dev/app uid-app");
        assert_eq!(pods[1].describe(), "pod dev/userns uid-userns");
        assert_eq!(pods[0].nft_tables.len(), 2, "ip and ip6");
    }

    #[test]
    fn the_older_intercept_keeps_a_pod_both_select() {
        let mut w = pods_world();
        w.c.intercepts.push(intercept("young", 10, &[(9090, 9902)]));
        let out = w.run();
        let young = &out.intercepts[&("dev".to_string(), "young".to_string())];
        let app = young.pods.iter().find(|p| p.name == "app").expect("app reported");
        assert_eq!(app.reason, reason::ALREADY_INTERCEPTED);
        assert!(app.message.contains("dev/web"), "{}", app.message);
        assert!(!out.tracked.contains_key(&ObjectKey::intercept("dev", "young")));
        // Only the older one's table is in each pod's namespace (app and userns).
        let ns = out.node_states["worker-2"].netns.iter().filter(|n| !n.is_host()).count();
        assert_eq!(ns, 2);
    }

    /// Issue 25, finding 8: a manifest folder's pods have no UID; each is a pod of its own, and
    /// the Intercept programs every one (it programmed only the first, the others
    /// AlreadyIntercepted by itself).
    #[test]
    fn pods_without_a_uid_are_each_programmed() {
        let mut w = World::new().node("worker-2", "100.64.0.12", true);
        let unnamed = |name: &str, ip: &str| {
            let mut p = pod(name, "Running", &[ip], |_| {});
            p.metadata.uid = None;
            p
        };
        w.c.pods = vec![unnamed("a", "10.0.1.5"), unnamed("b", "10.0.1.6"), unnamed("c", "10.0.1.7")].into();
        w.c.intercepts = vec![intercept("web", 0, &[(8080, 9900)]), intercept("young", 10, &[(9090, 9902)])].into();
        let out = w.run();
        let st = &out.intercepts[&("dev".to_string(), "web".to_string())];
        assert_eq!((st.selected_pods, st.programmed_pods), (3, 3), "{:?}", reasons(st));
        let ns: Vec<String> =
            out.node_states["worker-2"].netns.iter().filter(|n| !n.is_host()).map(|n| n.describe()).collect();
        assert_eq!(ns, ["pod dev/a ", "pod dev/b ", "pod dev/c "]);
        // A younger Intercept still finds each of them taken by the older one.
        let young = &out.intercepts[&("dev".to_string(), "young".to_string())];
        assert_eq!(
            reasons(young),
            [
                ("a", reason::ALREADY_INTERCEPTED),
                ("b", reason::ALREADY_INTERCEPTED),
                ("c", reason::ALREADY_INTERCEPTED)
            ]
        );
    }

    #[test]
    fn no_intercept_selected_leaves_port_map_states_alone() {
        let mut w = pods_world();
        w.c.intercepts.clear();
        let with_pods = w.clone().run();
        w.c.pods.clear();
        assert_eq!(with_pods.node_states, w.run().node_states);
    }

    #[test]
    fn finish_reports_pending_and_namespace_not_found() {
        let out = pods_world().run();
        let key = ("dev".to_string(), "web".to_string());
        let placed = &out.intercept_pods[&key];
        let computed = &out.intercepts[&key];
        let st = finish(&key, computed, placed, &BTreeMap::new(), &["worker-2".into()], None, now());
        assert_eq!(st.programmed_pods, 0);
        assert!(st.pods.iter().any(|p| p.name == "app" && p.reason == reason::PENDING));
        let refused = BTreeMap::from([(
            "worker-2".to_string(),
            vec![("pod dev/app".to_string(), "no namespace holds 10.0.1.5".to_string())],
        )]);
        let st = finish(&key, computed, placed, &refused, &[], None, now());
        let app = st.pods.iter().find(|p| p.name == "app").expect("app");
        assert_eq!(app.reason, reason::NAMESPACE_NOT_FOUND);
        assert!(app.message.contains("no namespace holds 10.0.1.5"));
        // The executor's owner refusal (its agent group unmapped in the pod's user namespace).
        let unmapped = "the agent's group 70000 is not mapped in the pod's user namespace";
        let refused =
            BTreeMap::from([("worker-2".to_string(), vec![("pod dev/userns".to_string(), unmapped.to_string())])]);
        let st = finish(&key, computed, placed, &refused, &[], None, now());
        let userns = st.pods.iter().find(|p| p.name == "userns").expect("userns");
        assert_eq!((userns.reason.as_str(), st.programmed_pods), (reason::OWNER_MATCH_IMPOSSIBLE, 1));
        let st = finish(&key, computed, placed, &BTreeMap::new(), &[], None, now());
        assert_eq!(st.programmed_pods, 2);
    }

    #[test]
    fn a_bad_subnet_is_not_accepted() {
        let mut w = pods_world();
        w.c.intercepts[0].spec.mesh_dial_subnets = vec!["10.96.0.0/33".into()];
        let out = w.run();
        let st = &out.intercepts[&("dev".to_string(), "web".to_string())];
        let accepted = &st.conditions[0];
        assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("False", reason::INVALID_SUBNET));
        assert!(accepted.message.contains("meshDialSubnets[0]"));
        assert!(out.node_states["worker-2"].netns.iter().all(|n| n.is_host()));
    }

    #[test]
    fn golden_pod_namespace() {
        let mut w = World::new().node("worker-2", "100.64.0.12", true);
        w.c.pods = vec![pod("app", "Running", &["10.0.1.5", "fd00:1::5"], |_| {})].into();
        w.c.intercepts = vec![intercept("web", 0, &[(8080, 9900)])].into();
        insta::assert_snapshot!(crate::render::render_text(&w.run()));
    }
}
