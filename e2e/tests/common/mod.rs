//! What every lab test needs: the root check, labs, manifests, assertions on probes, and the
//! test-only edits of computed node states that the ablations make.
#![allow(dead_code)]

pub mod boundary;
pub mod cni;
pub mod dual;
pub mod homes;
pub mod mesh;

use std::net::{Ipv4Addr, SocketAddrV4};

use kuport_controller::compute::Outputs;
use kuport_lab::probe::Answer;
use kuport_lab::{Lab, Manifests, Topology};
use kuport_proto::owned;
use kuport_proto::v1::{NetnsState, NftElement, NftRule, NftTable, NodeState};

/// Edits the spec of PortMap `ns/name` in `m`.
pub fn edit_port_map(
    mut m: Manifests,
    ns: &str,
    name: &str,
    edit: impl FnOnce(&mut kuport_controller::api::PortMapSpec),
) -> Manifests {
    let pm = m
        .cluster
        .port_maps
        .iter_mut()
        .find(|p| p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name));
    edit(&mut pm.unwrap_or_else(|| panic!("no PortMap {ns}/{name}")).spec);
    m
}

/// True to run; false (after printing a skip line) when not root and KUPORT_SKIP_ROOT_TESTS=1.
/// Panics otherwise: CI runs these tests as root, and a silent skip would hide them.
pub fn root() -> bool {
    if kuport_lab::sys::is_root() {
        return true;
    }
    if std::env::var("KUPORT_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
        println!("skipped: not root and KUPORT_SKIP_ROOT_TESTS=1");
        return false;
    }
    panic!("these tests need root (network namespaces); set KUPORT_SKIP_ROOT_TESTS=1 to skip");
}

/// The default topology, built; removed when the returned lab drops.
pub fn default_lab() -> Lab {
    Lab::up(&Topology::default_lab()).expect("the default lab builds")
}

/// The two example classes of docs/portmap/modes.md (unchanged) and the given documents.
pub fn with_classes(extra: &str) -> Manifests {
    Manifests::from_text("classes.yaml", include_str!("../../manifests/default/classes.yaml"))
        .and_then(|m| m.add("test.yaml", extra))
        .expect("the test's manifests load")
}

/// A PortMap as YAML; `ports` is a port or `first-last`.
pub fn port_map(ns: &str, name: &str, class: &str, proto: &str, ports: &str, svc: &str, svc_port: &str) -> String {
    let (port, end) = match ports.split_once('-') {
        Some((a, b)) => (a, format!("  endPort: {b}\n")),
        None => (ports, String::new()),
    };
    format!(
        "apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata:
  name: {name}
  namespace: {ns}
  creationTimestamp: \"2026-11-01T10:00:00Z\"
spec:
  className: {class}
  protocol: {proto}
  port: {port}
{end}  serviceRef:
    name: {svc}
    port: {svc_port}
---
"
    )
}

pub fn addr(s: &str) -> SocketAddrV4 {
    s.parse().expect("an address:port")
}

pub fn client_address(lab: &Lab, client: &str) -> Ipv4Addr {
    lab.topology().client(client).expect("a client of the topology").address
}

/// The pod saw the client's real address and port; the reply came from what was dialed.
pub fn assert_intact(lab: &Lab, client: &str, a: &Answer, pod: &str) {
    let real = client_address(lab, client);
    assert_eq!(a.pod, pod, "the wrong pod answered: {a}");
    assert_eq!(*a.seen.ip(), real, "{pod} did not see {client}'s real address: {a}");
    assert_eq!(a.seen.port(), a.local.port(), "{pod} saw another source port than {client} sent from: {a}");
    assert_eq!(a.reply_from, a.dialed, "the reply to {client} did not come from the address it dialed: {a}");
}

/// Probes and asserts the mapping works end to end.
pub fn assert_maps(lab: &Lab, client: &str, to: &str, proto: kuport_lab::Protocol, pod: &str) -> Answer {
    let a = lab.probe(client, addr(to), proto).unwrap_or_else(|e| panic!("{client} -> {to}/{proto}: {e}"));
    assert_intact(lab, client, &a, pod);
    a
}

/// The condition `type_` of a PortMap's computed status: (status, reason).
pub fn condition(out: &Outputs, ns: &str, name: &str, type_: &str) -> (String, String) {
    let st = out.port_maps.get(&(ns.to_string(), name.to_string())).unwrap_or_else(|| panic!("no PortMap {ns}/{name}"));
    let c = st.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("{ns}/{name}: no {type_}"));
    (c.status.clone(), c.reason.clone())
}

/// The message of a PortMap's condition.
pub fn message(out: &Outputs, ns: &str, name: &str, type_: &str) -> String {
    let st = out.port_maps.get(&(ns.to_string(), name.to_string())).unwrap_or_else(|| panic!("no PortMap {ns}/{name}"));
    let c = st.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("{ns}/{name}: no {type_}"));
    c.message.clone()
}

/// A node's own (host) namespace entry of its computed state.
pub fn host_state<'a>(
    states: &'a mut std::collections::BTreeMap<String, std::sync::Arc<NodeState>>,
    node: &str,
) -> &'a mut NetnsState {
    let s = std::sync::Arc::make_mut(states.get_mut(node).unwrap_or_else(|| panic!("no state for {node}")));
    s.netns.iter_mut().find(|n| n.is_host()).unwrap_or_else(|| panic!("{node}: no host namespace entry"))
}

pub fn kuport_table(ns: &mut NetnsState) -> &mut NftTable {
    ns.nft_tables.iter_mut().find(|t| t.name == owned::NFT_TABLE).expect("kuport's table")
}

/// Removes the elements of set or map `set` that `pick` selects; how many. The set's runs and
/// digest are computed anew: an executor that remembers the set skips what they say is unchanged.
pub fn drop_elements(ns: &mut NetnsState, set: &str, pick: impl Fn(&NftElement) -> bool) -> usize {
    let t = kuport_table(ns);
    let s = t.sets.iter_mut().find(|s| s.name == set).unwrap_or_else(|| panic!("no set {set}"));
    let before = s.elements.len();
    s.elements.retain(|e| !pick(e));
    (s.runs, s.digest) = kuport_proto::canonical::element_runs(&s.elements);
    before - s.elements.len()
}

/// Removes the rules of `chain` that `pick` selects; how many.
pub fn drop_rules(ns: &mut NetnsState, chain: &str, pick: impl Fn(&NftRule) -> bool) -> usize {
    let t = kuport_table(ns);
    let c = t.chains.iter_mut().find(|c| c.name == chain).unwrap_or_else(|| panic!("no chain {chain}"));
    let before = c.rules.len();
    c.rules.retain(|r| !pick(r));
    before - c.rules.len()
}

/// Removes the ip rules at `pref`; how many.
pub fn drop_ip_rules(ns: &mut NetnsState, pref: u32) -> usize {
    let before = ns.ip_rules.len();
    ns.ip_rules.retain(|r| r.pref != pref);
    before - ns.ip_rules.len()
}

/// The names of kuport's links in a node's state.
pub fn links(
    states: &std::collections::BTreeMap<String, std::sync::Arc<NodeState>>,
    node: &str,
) -> Vec<(String, String)> {
    states
        .get(node)
        .into_iter()
        .flat_map(|s| &s.netns)
        .flat_map(|n| &n.links)
        .map(|l| {
            let remote = match &l.kind {
                Some(kuport_proto::v1::link::Kind::Vxlan(v)) => v.remote.clone(),
                None => String::new(),
            };
            (l.name.clone(), remote)
        })
        .collect()
}

/// A device's counter in a host's namespace: `dir` rx or tx, `field` packets, errors, ...
pub fn link_stat(lab: &Lab, host: &str, dev: &str, dir: &str, field: &str) -> u64 {
    let json = lab.ip(host, &["-s", "-j", "link", "show", "dev", dev]).expect("ip -s link");
    let v: serde_json::Value = serde_json::from_str(&json).expect("ip -j prints JSON");
    v[0]["stats64"][dir][field].as_u64().unwrap_or_else(|| panic!("no {dir} {field} in {json}"))
}

/// A device's transmit errors in a host's namespace.
pub fn tx_errors(lab: &Lab, host: &str, dev: &str) -> u64 {
    link_stat(lab, host, dev, "tx", "errors")
}

/// A local API server the test owns: stopped and its folder removed on drop.
pub struct OwnedApiServer(pub kuport_lab::apiserver::ApiServer);

impl OwnedApiServer {
    pub fn up(dir: &std::path::Path) -> OwnedApiServer {
        OwnedApiServer(kuport_lab::apiserver::ApiServer::up(dir).expect("the API server starts"))
    }

    /// A plane source on it: `replicas` controllers running with `controller`'s kubeconfig
    /// (None: the admin's).
    pub fn source(&self, controller: Option<std::path::PathBuf>, replicas: usize) -> kuport_lab::plane::KubeSource {
        let admin = self.0.kubeconfig.clone();
        kuport_lab::plane::KubeSource { controller: controller.unwrap_or_else(|| admin.clone()), admin, replicas }
    }
}

impl Drop for OwnedApiServer {
    fn drop(&mut self) {
        let _ = self.0.down();
    }
}

/// The default lab's standard probe streams: the game range from client-1 (an established flow
/// and new ones) and the TCP mapping from client-2, every `interval`, a probe lost after
/// `timeout`. They must answer before the caller's test starts.
pub fn standard_prober(
    lab: &Lab,
    interval: std::time::Duration,
    timeout: std::time::Duration,
) -> kuport_lab::probe::Prober {
    use kuport_lab::Protocol::{Tcp, Udp};
    use kuport_lab::probe::{Flow, Prober, Target};
    let target = |label: &str, client: &str, to: &str, protocol, flow, pod: &str| Target {
        label: label.into(),
        from: lab.netns(client).expect("a client"),
        client: client_address(lab, client),
        to: addr(to),
        protocol,
        flow,
        pod: pod.into(),
    };
    let p = Prober::start(
        vec![
            target("udp-established", "client-1", "203.0.113.9:27015", Udp, Flow::Established, "game-0"),
            target("udp-new", "client-1", "203.0.113.9:27015", Udp, Flow::New, "game-0"),
            target("tcp-new", "client-2", "203.0.113.9:9000", Tcp, Flow::New, "api-0"),
        ],
        interval,
        timeout,
    );
    let zero = std::time::Duration::ZERO;
    assert!(
        p.wait_answered(zero, std::time::Duration::from_secs(3)),
        "the probes work before the test:\n{}{:?}",
        { p.report(zero, p.now()) },
        p.first_failure("udp-established", zero, p.now())
    );
    p
}
