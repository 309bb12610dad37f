//! The synthetic cluster the compute and fan-out benchmarks share (included with `#[path]`):
//! Ready nodes with InternalIPs and NodeFacts; ten edge nodes carrying four Vxlan PortMapClasses
//! (two Single, two Multi); PortMaps in 100 namespaces, each with its own Service whose pods are
//! spread over all nodes; every tenth mapping a UDP range of ten ports, every tenth a single UDP
//! port, the rest a single TCP port.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeAddress, NodeCondition, NodeStatus, ObjectReference, Pod, PodIP, PodSpec, PodStatus, Service,
    ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kuport_controller::api::{
    ClassNode, PortMap, PortMapClass, PortMapClassSpec, PortMapSpec, PortPolicy, Protocol, ReturnPath, ReturnPathMode,
    ServiceRef, ServingMode, VxlanSpec,
};
use kuport_controller::observe::index as observe;
use kuport_controller::observe::{Cluster, KnownFacts, KnownInterface, KnownRoute};

pub const PODS_PER_SERVICE: usize = 3;
pub const EDGES: usize = 10;
pub const NAMESPACES: usize = 100;

/// (name, mode, accepting edges, interface, subnet, first VNI, VXLAN port)
pub type ClassShape = (&'static str, ServingMode, &'static [usize], &'static str, &'static str, u32, u16);
pub const CLASSES: [ClassShape; 4] = [
    ("public", ServingMode::Single, &[0, 1, 2], "enp1s0", "172.16.0.0/16", 10_000, 4790),
    ("public-multi", ServingMode::Multi, &[3, 4, 5], "enp1s0", "172.17.0.0/16", 100_000, 4791),
    ("intranet", ServingMode::Multi, &[6, 7, 8, 9], "wt0", "172.18.0.0/16", 200_000, 4792),
    ("mesh", ServingMode::Single, &[0, 1], "wt0", "172.19.0.0/16", 300_000, 4793),
];
pub const UNDERLAY: u32 = 0x0a00_0001; // 10.0.0.1
pub const PUBLIC: u32 = 0xcb00_7100; // 203.0.113.0
pub const PODS: u32 = 0x0a80_0000; // 10.128.0.0

pub fn node_name(i: usize) -> String {
    if i < EDGES { format!("edge-{i:02}") } else { format!("worker-{i:05}") }
}

pub fn ip(base: u32, i: usize) -> String {
    Ipv4Addr::from(base + i as u32).to_string()
}

/// A small deterministic generator (splitmix64).
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub fn meta(ns: Option<&str>, name: String) -> ObjectMeta {
    ObjectMeta { name: Some(name), namespace: ns.map(Into::into), ..Default::default() }
}

/// One published mapping: the PortMap, its Service and its EndpointSlice.
pub struct Mapping<'a> {
    pub name: String,
    pub ns: String,
    pub class: &'a str,
    pub protocol: Protocol,
    pub port: u16,
    pub end_port: Option<u16>,
    pub pod_port: i32,
    /// (address, node) of each pod.
    pub pods: Vec<(String, String)>,
    pub created: i64,
}

pub fn add_mapping(c: &mut Cluster, m: Mapping) {
    let svc = format!("svc-{}", m.name);
    let proto_s = if m.protocol == Protocol::Tcp { "TCP" } else { "UDP" };
    let mut pm = PortMap::new(
        &m.name,
        PortMapSpec {
            class_name: m.class.into(),
            protocol: m.protocol,
            port: m.port,
            end_port: m.end_port,
            interfaces: None,
            service_ref: ServiceRef { name: svc.clone(), port: Some("p".into()) },
            source_ranges: Vec::new(),
            rate_limit: None,
        },
    );
    pm.metadata.namespace = Some(m.ns.clone());
    pm.metadata.generation = Some(1);
    pm.metadata.creation_timestamp = Timestamp::from_second(m.created).ok().map(Time);
    c.port_maps.push(pm);
    c.services.push(Service {
        metadata: meta(Some(&m.ns), svc.clone()),
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                name: Some("p".into()),
                protocol: Some(proto_s.into()),
                port: m.pod_port,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
    // The Pods behind the endpoints, as the kubelet reports them: what vouches for each.
    for (k, (address, node)) in m.pods.iter().enumerate() {
        c.pods.push(Pod {
            metadata: meta(Some(&m.ns), format!("{svc}-{k}")),
            spec: Some(PodSpec { node_name: Some(node.clone()), ..Default::default() }),
            status: Some(PodStatus { pod_ips: Some(vec![PodIP { ip: address.clone() }]), ..Default::default() }),
        });
    }
    let endpoints = m
        .pods
        .iter()
        .enumerate()
        .map(|(k, (address, node))| Endpoint {
            addresses: vec![address.clone()],
            conditions: Some(EndpointConditions { ready: Some(true), serving: Some(true), terminating: Some(false) }),
            node_name: Some(node.clone()),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some(format!("{svc}-{k}")),
                namespace: Some(m.ns.clone()),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    let mut slice = EndpointSlice {
        metadata: meta(Some(&m.ns), slice_name(&m.name)),
        address_type: "IPv4".into(),
        ports: Some(vec![EndpointPort {
            name: Some("p".into()),
            protocol: Some(proto_s.into()),
            port: Some(m.pod_port),
            ..Default::default()
        }]),
        endpoints: Some(endpoints),
    };
    slice.metadata.labels = Some(BTreeMap::from([(observe::SERVICE_NAME_LABEL.to_string(), svc)]));
    c.endpoint_slices.push(slice);
}

pub fn build(n_nodes: usize, n_maps: usize, rng: &mut Rng) -> Cluster {
    let now = Timestamp::from_second(1_795_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
    let mut c = Cluster { now, ..Default::default() };
    for i in 0..n_nodes {
        let name = node_name(i);
        c.nodes.push(Node {
            metadata: meta(None, name.clone()),
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress { type_: "InternalIP".into(), address: ip(UNDERLAY, i) },
                    NodeAddress { type_: "Hostname".into(), address: name.clone() },
                ]),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let mut interfaces = vec![
            KnownInterface { name: "wt0".into(), addresses: vec![ip(UNDERLAY, i)] },
            KnownInterface { name: "cilium_host".into(), addresses: vec![ip(PODS, i * 256)] },
        ];
        if i < EDGES {
            interfaces.push(KnownInterface { name: "enp1s0".into(), addresses: vec![ip(PUBLIC, i)] });
        }
        c.facts.push(KnownFacts {
            node: name,
            underlay_address: Some(Ipv4Addr::from(UNDERLAY + i as u32)),
            underlay_mtu: Some(if i % 7 == 0 { 1380 } else { 1420 }),
            interfaces: Some(interfaces),
            wireguard_public_key: None,
            // Cilium's: the node's pods through cilium_host.
            routes: Some(vec![KnownRoute { dst: format!("{}/24", ip(PODS, i * 256)), dev: "cilium_host".into() }]),
            vxlan_ports: Vec::new(),
        });
    }
    for (name, mode, edges, iface, subnet, vni, port) in CLASSES {
        let spec = PortMapClassSpec {
            nodes: edges.iter().map(|e| (node_name(*e), ClassNode { interfaces: vec![iface.into()] })).collect(),
            serving_mode: mode,
            ports: PortPolicy::default(),
            namespace_selector: None,
            return_path: ReturnPath {
                mode: ReturnPathMode::Vxlan,
                vxlan: VxlanSpec { vni, port, subnet: subnet.into(), ..Default::default() },
            },
            external_endpoints: Vec::new(),
            limits: None,
            source_ranges: Vec::new(),
            pin_source_ranges: false,
        };
        let mut class = PortMapClass::new(name, spec);
        class.metadata.generation = Some(1);
        c.classes.push(class);
    }
    for k in 0..NAMESPACES {
        c.namespaces.push(Namespace {
            metadata: ObjectMeta {
                name: Some(format!("team-{k:03}")),
                labels: Some(BTreeMap::from([("team".to_string(), k.to_string())])),
                ..Default::default()
            },
            ..Default::default()
        });
    }
    let mut on_node = vec![0; n_nodes];
    for i in 0..n_maps {
        let j = i / CLASSES.len();
        // Published ports are unique within each class and protocol.
        let (protocol, port, end_port, pod_port) = match j % 10 {
            0 => (Protocol::Udp, 20_000 + (j / 10) as u16 * 10, Some(20_009 + (j / 10) as u16 * 10), 27_015),
            5 => (Protocol::Udp, 50_000 + (j / 10) as u16, None, 5_353),
            _ => (Protocol::Tcp, 1_024 + j as u16, None, 8_080),
        };
        let pods = (0..PODS_PER_SERVICE)
            .map(|_| {
                let node = rng.below(n_nodes);
                on_node[node] += 1;
                (pod_address(node, on_node[node]), node_name(node))
            })
            .collect();
        add_mapping(
            &mut c,
            Mapping {
                name: format!("pm-{i:05}"),
                ns: format!("team-{:03}", i % NAMESPACES),
                class: CLASSES[i % CLASSES.len()].0,
                protocol,
                port,
                end_port,
                pod_port,
                pods,
                created: 1_700_000_000 + i as i64,
            },
        );
    }
    c
}

/// The `k`th pod address on node `node`, inside the pod route the node reports (its /24), as a
/// CNI hands them out: the controller delivers only to a pod its node routes.
pub fn pod_address(node: usize, k: usize) -> String {
    ip(PODS, node * 256 + 1 + k % 253)
}

/// Pod `address` of PortMap `name` is recreated on node `to` with `new_address`: its Pod and its
/// EndpointSlice endpoint both move, as after a reschedule.
pub fn move_pod(c: &mut Cluster, ns: &str, name: &str, address: &str, to: usize, new_address: &str) {
    let in_ns = |m: &ObjectMeta| m.namespace.as_deref() == Some(ns);
    let slice = slice_name(name);
    // Only the objects that change are copied, as a watch cache replaces only those.
    let slices: Vec<usize> = (0..c.endpoint_slices.len())
        .filter(|i| {
            let s = &c.endpoint_slices[*i];
            s.metadata.name.as_deref() == Some(slice.as_str()) && in_ns(&s.metadata)
        })
        .collect();
    for i in slices {
        let Some(s) = c.endpoint_slices.get_mut(i) else { continue };
        let endpoints = s.endpoints.iter_mut().flatten();
        for ep in endpoints.filter(|e| e.addresses.first().map(String::as_str) == Some(address)) {
            ep.node_name = Some(node_name(to));
            ep.addresses = vec![new_address.to_string()];
        }
    }
    let held = |p: &Pod| p.status.iter().flat_map(|s| s.pod_ips.iter().flatten()).any(|ip| ip.ip == address);
    let pods: Vec<usize> = (0..c.pods.len()).filter(|i| in_ns(&c.pods[*i].metadata) && held(&c.pods[*i])).collect();
    for i in pods {
        let Some(pod) = c.pods.get_mut(i) else { continue };
        pod.spec.get_or_insert_default().node_name = Some(node_name(to));
        pod.status.get_or_insert_default().pod_ips = Some(vec![PodIP { ip: new_address.to_string() }]);
    }
}

/// The EndpointSlice of PortMap `name`'s Service.
pub fn slice_name(name: &str) -> String {
    format!("svc-{name}-x7k2p")
}

/// Every node joins the WireGuard mesh: its executor's public key (distinct, valid) and its
/// Node's pod CIDR, the /24 its pods are in. Endpoints come from the InternalIPs.
pub fn join_mesh(c: &mut Cluster) {
    for (i, node) in c.nodes.iter_mut().enumerate() {
        node.spec.get_or_insert_default().pod_cidrs = Some(vec![format!("{}/24", ip(PODS, i * 256))]);
    }
    for (i, facts) in c.facts.iter_mut().enumerate() {
        facts.wireguard_public_key = Some(test_key(i));
    }
}

/// A WireGuard public key for node `i`: 32 bytes, base64.
pub fn test_key(i: usize) -> String {
    let mut bytes = [0x4bu8; 32];
    bytes[..8].copy_from_slice(&(i as u64 + 1).to_be_bytes());
    base64(&bytes)
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * k)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The label an Intercept selects.
pub const INTERCEPTED: (&str, &str) = ("kuport-bench/intercepted", "yes");

/// An Intercept per namespace (two intercepted ports) selecting the labelled pods; every
/// `every`th pod is labelled, Running, with a UID, as its kubelet reports it.
pub fn add_intercepts(c: &mut Cluster, every: usize) {
    use kuport_controller::api::{Intercept, InterceptPort, InterceptSpec, PodSelector};
    for (k, pod) in c.pods.iter_mut().enumerate() {
        let status = pod.status.get_or_insert_default();
        status.phase = Some("Running".into());
        pod.metadata.uid = Some(format!("uid-{k:08}"));
        if k % every == 0 {
            pod.metadata.labels = Some(BTreeMap::from([(INTERCEPTED.0.to_string(), INTERCEPTED.1.to_string())]));
        }
    }
    let now = c.now.as_second();
    for n in 0..NAMESPACES {
        let spec = InterceptSpec {
            pod_selector: PodSelector { match_labels: BTreeMap::from([(INTERCEPTED.0.into(), INTERCEPTED.1.into())]) },
            intercepts: [(8080, 9900), (9090, 9901)]
                .iter()
                .map(|(container, agent)| InterceptPort {
                    protocol: Protocol::Tcp,
                    container_port: *container,
                    agent_port: *agent,
                    proxy_port: None,
                })
                .collect(),
            agent: Default::default(),
            mesh_dial_subnets: vec!["10.96.0.0/12".into()],
        };
        let mut ic = Intercept::new("agent", spec);
        ic.metadata.namespace = Some(format!("team-{n:03}"));
        ic.metadata.generation = Some(1);
        ic.metadata.creation_timestamp = Timestamp::from_second(now - 3600 + n as i64).ok().map(Time);
        c.intercepts.push(ic);
    }
}

/// Every node state's version.
pub fn versions(out: &kuport_controller::compute::Outputs) -> BTreeMap<String, String> {
    out.node_states.iter().map(|(n, s)| (n.clone(), kuport_proto::version(s))).collect()
}

/// How many nodes' versions differ between `a` and `b`.
pub fn changed(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> usize {
    let names: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    names.into_iter().filter(|n| a.get(*n) != b.get(*n)).count()
}

/// One change computed by a fresh `Computer` that computed `base` just before (untimed): its
/// time, what it redid, and how many node states' versions changed.
pub fn by_change_once(
    base: &Cluster,
    changed: &Cluster,
    settings: &kuport_controller::compute::Settings,
) -> (std::time::Duration, kuport_controller::compute::by_change::Redone, usize) {
    let mut computer = kuport_controller::compute::by_change::Computer::new(settings.clone());
    let before = versions(&computer.compute(base));
    let (d, out) = super::machine::timed(|| computer.compute(changed));
    (d, computer.redone().clone(), self::changed(&before, &versions(&out)))
}
