//! Builders for small clusters and the golden scenarios, shared by the controller's tests and by
//! the executor's root tests (which apply every golden state to a real kernel). Compiled for
//! tests and with the `testkit` feature only.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeAddress, NodeCondition, NodeStatus, ObjectReference, Pod, PodIP, PodSpec, PodStatus, Service,
    ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::{Outputs, Settings, compute};
use crate::api::Protocol::{Tcp, Udp};
use crate::api::*;
use crate::observe::index::SERVICE_NAME_LABEL;
use crate::observe::{Cluster, KnownFacts, KnownInterface, KnownRoute};

/// The fixed time every test computes at.
pub fn now() -> Timestamp {
    Timestamp::from_second(1_795_000_000).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A small cluster written the way a test reads it.
#[derive(Clone, Default)]
pub struct World {
    pub c: Cluster,
    /// Leaves out [`CILIUM_ROUTE`], which [`World::run`] otherwise gives every node that has
    /// not been given routes of its own.
    pub no_default_routes: bool,
}

/// The route a Cilium node's kernel has for the pod network (every pod address of the tests is
/// in it): what makes the claims name `cilium_host`, as on the lab's Cilium-like nodes.
pub const CILIUM_ROUTE: (&str, &str) = ("10.244.0.0/16", "cilium_host");

impl World {
    pub fn new() -> Self {
        World { c: Cluster { now: now(), ..Default::default() }, no_default_routes: false }
    }

    pub fn node(mut self, name: &str, ip: &str, ready: bool) -> Self {
        self.c.nodes.push(Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip.into() }]),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
        self
    }

    pub fn facts(mut self, name: &str, mtu: u32, ifaces: &[(&str, &str)]) -> Self {
        self.c.facts.push(KnownFacts {
            node: name.into(),
            underlay_address: None,
            underlay_mtu: Some(mtu),
            interfaces: Some(
                ifaces
                    .iter()
                    .map(|(i, a)| KnownInterface { name: (*i).into(), addresses: vec![(*a).into()] })
                    .collect(),
            ),
            wireguard_public_key: None,
            routes: None,
            vxlan_ports: Vec::new(),
        });
        self
    }

    /// The facts of `name` (made when it has none) with these routes, as its executor reports
    /// them: (prefix, device).
    pub fn routes(mut self, name: &str, routes: &[(&str, &str)]) -> Self {
        let routes = routes.iter().map(|(d, v)| KnownRoute { dst: (*d).into(), dev: (*v).into() }).collect();
        self.facts_of(name).routes = Some(routes);
        self
    }

    /// The facts of `name` (made when it has none) with these VXLAN ports of the CNI's.
    pub fn vxlan_ports(mut self, name: &str, ports: &[u16]) -> Self {
        self.facts_of(name).vxlan_ports = ports.to_vec();
        self
    }

    /// One more address on an interface `name` reported (an IPv6 one beside its IPv4 one).
    pub fn interface_address(mut self, name: &str, iface: &str, address: &str) -> Self {
        let ifaces = self.facts_of(name).interfaces.get_or_insert_default();
        match ifaces.iter_mut().find(|i| i.name == iface) {
            Some(i) => i.addresses.push(address.into()),
            None => ifaces.push(KnownInterface { name: iface.into(), addresses: vec![address.into()] }),
        }
        self
    }

    fn facts_of(&mut self, name: &str) -> &mut KnownFacts {
        let at = match self.c.facts.iter().position(|f| f.node == name) {
            Some(i) => i,
            None => {
                self.c.facts.push(KnownFacts { node: name.into(), ..Default::default() });
                self.c.facts.len() - 1
            }
        };
        &mut self.c.facts[at]
    }

    pub fn class(mut self, name: &str, mode: ServingMode, rp: ReturnPathMode, nodes: &[(&str, &[&str])]) -> Self {
        let spec = PortMapClassSpec {
            nodes: nodes
                .iter()
                .map(|(n, i)| ((*n).into(), ClassNode { interfaces: i.iter().map(|s| (*s).into()).collect() }))
                .collect(),
            serving_mode: mode,
            ports: PortPolicy::default(),
            namespace_selector: None,
            return_path: ReturnPath { mode: rp, vxlan: VxlanSpec::default() },
            external_endpoints: Vec::new(),
            limits: None,
            source_ranges: Vec::new(),
            pin_source_ranges: false,
        };
        let mut c = PortMapClass::new(name, spec);
        c.metadata.generation = Some(1);
        self.c.classes.push(c);
        self
    }

    pub fn edit_class(mut self, name: &str, f: impl FnOnce(&mut PortMapClassSpec)) -> Self {
        if let Some(c) = self.c.classes.iter_mut().find(|c| c.metadata.name.as_deref() == Some(name)) {
            f(&mut c.spec);
        }
        self
    }

    pub fn namespace(mut self, name: &str, labels: &[(&str, &str)]) -> Self {
        self.c.namespaces.push(Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()),
                ..Default::default()
            },
            ..Default::default()
        });
        self
    }

    /// A Service with one port named `p` and its IPv4 EndpointSlice: endpoints are (pod, node,
    /// address, ready).
    pub fn service(mut self, ns: &str, name: &str, proto: &str, port: i32, eps: &[(&str, &str, &str, bool)]) -> Self {
        self.c.services.push(Service {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
            spec: Some(ServiceSpec {
                ports: Some(vec![ServicePort {
                    name: Some("p".into()),
                    protocol: Some(proto.into()),
                    port,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
        self.c.endpoint_slices.push(slice(ns, name, "x", "IPv4", proto, port, eps));
        self.pods_of(ns, eps)
    }

    /// The Pods behind endpoints (pod, node, address, ready), as the kubelet reports them: each
    /// in `ns` on its node, its address in status.podIPs (added to a pod already made).
    pub fn pods_of(mut self, ns: &str, eps: &[(&str, &str, &str, bool)]) -> Self {
        for (pod, node, ip, _) in eps {
            let found =
                self.c.pods.iter().position(|p| {
                    p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(*pod)
                });
            let at = match found {
                Some(i) => i,
                None => {
                    self.c.pods.push(Pod {
                        metadata: ObjectMeta {
                            name: Some((*pod).into()),
                            namespace: Some(ns.into()),
                            ..Default::default()
                        },
                        spec: Some(PodSpec { node_name: Some((*node).into()), ..Default::default() }),
                        status: Some(PodStatus::default()),
                    });
                    self.c.pods.len() - 1
                }
            };
            let status = self.c.pods[at].status.get_or_insert_default();
            status.pod_ips.get_or_insert_default().push(PodIP { ip: (*ip).into() });
        }
        self
    }

    /// Removes Pod `ns/name` (its endpoints stay in the slices).
    pub fn without_pod(mut self, ns: &str, name: &str) -> Self {
        self.c
            .pods
            .retain(|p| !(p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)));
        self
    }

    /// Edits the EndpointSlices (a forged slice: another namespace's pod, a fake node).
    pub fn edit_slices(mut self, f: impl FnOnce(&mut crate::observe::Objects<EndpointSlice>)) -> Self {
        f(&mut self.c.endpoint_slices);
        self
    }

    /// An IPv6 EndpointSlice of Service `name` (named `{name}-{suffix}`), its port named `p`:
    /// endpoints are (pod, node, address, ready), each with a targetRef to Pod `ns/pod`, as
    /// Kubernetes writes the second slice of a dual-stack Service.
    #[allow(clippy::too_many_arguments)]
    pub fn slice6(
        mut self,
        ns: &str,
        name: &str,
        suffix: &str,
        proto: &str,
        port: i32,
        eps: &[(&str, &str, &str, bool)],
    ) -> Self {
        self.c.endpoint_slices.push(slice(ns, name, suffix, "IPv6", proto, port, eps));
        self.pods_of(ns, eps)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn port_map(
        mut self,
        ns: &str,
        name: &str,
        class: &str,
        proto: Protocol,
        port: u16,
        end: Option<u16>,
        svc: &str,
        age: i64,
    ) -> Self {
        let mut pm = PortMap::new(
            name,
            PortMapSpec {
                class_name: class.into(),
                protocol: proto,
                port,
                end_port: end,
                interfaces: None,
                service_ref: ServiceRef { name: svc.into(), port: Some("p".into()) },
                source_ranges: Vec::new(),
                rate_limit: None,
            },
        );
        pm.metadata.namespace = Some(ns.into());
        pm.metadata.generation = Some(1);
        pm.metadata.creation_timestamp = Timestamp::from_second(1_700_000_000 + age).ok().map(Time);
        self.c.port_maps.push(pm);
        self
    }

    pub fn edit_map(mut self, name: &str, f: impl FnOnce(&mut PortMapSpec)) -> Self {
        if let Some(pm) = self.c.port_maps.iter_mut().find(|p| p.metadata.name.as_deref() == Some(name)) {
            f(&mut pm.spec);
        }
        self
    }

    /// Computes; every node without routes of its own gets [`CILIUM_ROUTE`] (unless
    /// `no_default_routes`).
    pub fn run(&self) -> Outputs {
        compute(&self.cluster(), &Settings::default())
    }

    /// The cluster [`World::run`] computes from.
    pub fn cluster(&self) -> Cluster {
        let mut w = self.clone();
        if !w.no_default_routes {
            let names: Vec<String> = w.c.nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
            for name in names {
                if w.facts_of(&name).routes.is_none() {
                    w = w.routes(&name, &[CILIUM_ROUTE]);
                }
            }
        }
        w.c
    }
}

/// An EndpointSlice of Service `ns/svc` with one port named `p`; every endpoint's targetRef
/// names its Pod in `ns`.
fn slice(
    ns: &str,
    svc: &str,
    suffix: &str,
    address_type: &str,
    proto: &str,
    port: i32,
    eps: &[(&str, &str, &str, bool)],
) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("{svc}-{suffix}")),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([(SERVICE_NAME_LABEL.to_string(), svc.to_string())])),
            ..Default::default()
        },
        address_type: address_type.into(),
        ports: Some(vec![EndpointPort {
            name: Some("p".into()),
            protocol: Some(proto.into()),
            port: Some(port),
            ..Default::default()
        }]),
        endpoints: Some(
            eps.iter()
                .map(|(pod, node, ip, ready)| Endpoint {
                    addresses: vec![(*ip).into()],
                    conditions: Some(EndpointConditions { ready: Some(*ready), ..Default::default() }),
                    node_name: Some((*node).into()),
                    target_ref: Some(ObjectReference {
                        kind: Some("Pod".into()),
                        namespace: Some(ns.into()),
                        name: Some((*pod).into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

const EDGE: &[(&str, &[&str])] = &[("edge-a", &["enp1s0", "wt0"])];

fn nodes() -> World {
    World::new()
        .node("edge-a", "100.64.93.143", true)
        .node("worker-b", "100.64.0.2", true)
        .node("worker-c", "100.64.0.3", true)
        .facts("edge-a", 1420, &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.93.143")])
        .facts("worker-b", 1380, &[("wt0", "100.64.0.2")])
        .facts("worker-c", 1420, &[("wt0", "100.64.0.3")])
}

/// Every golden scenario: a name and its cluster.
pub fn scenarios() -> Vec<(&'static str, World)> {
    use ReturnPathMode::{None as NoPath, Vxlan};
    use ServingMode::{Multi, Single};
    vec![
        (
            "local_pod_port_and_range",
            nodes()
                .class("public", Single, Vxlan, EDGE)
                .service("web", "web", "TCP", 8080, &[("web-0", "edge-a", "10.244.0.7", true)])
                .service("games", "game", "UDP", 27015, &[("game-0", "edge-a", "10.244.0.107", true)])
                .port_map("web", "web", "public", Tcp, 3000, None, "web", 0)
                .port_map("games", "game", "public", Udp, 27015, Some(27115), "game", 1),
        ),
        (
            "single_remote_pod",
            nodes()
                .class("public", Single, Vxlan, EDGE)
                .service("web", "web", "TCP", 3000, &[("web-0", "worker-b", "10.244.1.7", true)])
                .service("games", "game", "UDP", 27015, &[("game-0", "worker-b", "10.244.1.107", true)])
                .port_map("web", "web", "public", Tcp, 3000, None, "web", 0)
                .port_map("games", "game", "public", Udp, 27015, Some(27115), "game", 1),
        ),
        (
            "multi_pod_node_two_links",
            nodes()
                .class("pair", Multi, Vxlan, &[("edge-a", &["wt0"]), ("worker-c", &["wt0"])])
                .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])
                .port_map("ns", "m", "pair", Tcp, 3000, None, "svc", 0),
        ),
        (
            "multi_three_accepting",
            nodes()
                .class(
                    "intranet",
                    Multi,
                    Vxlan,
                    &[("edge-a", &["wt0"]), ("worker-b", &["wt0"]), ("worker-c", &["wt0"])],
                )
                .edit_class("intranet", |s| {
                    s.return_path.vxlan.vni = 4300;
                    s.return_path.vxlan.subnet = "169.254.79.0/24".into();
                })
                .service("ns", "dns", "UDP", 5353, &[("dns-0", "worker-b", "10.244.1.53", true)])
                .port_map("ns", "dns", "intranet", Udp, 5353, None, "dns", 0),
        ),
        (
            "none_refusal",
            nodes()
                .class("public", Single, NoPath, EDGE)
                .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])
                .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0),
        ),
        (
            "dual_stack_single",
            nodes()
                .interface_address("edge-a", "enp1s0", "2001:db8::9")
                .class("public", Single, Vxlan, EDGE)
                .service("web", "web", "TCP", 3000, &[("web-0", "worker-c", "10.244.2.7", true)])
                .slice6("web", "web", "v6", "TCP", 3000, &[("web-0", "worker-c", "fd10:244:2::7", true)])
                .service("games", "game", "UDP", 27015, &[("game-0", "edge-a", "10.244.0.107", true)])
                .slice6("games", "game", "v6", "UDP", 27015, &[("game-0", "edge-a", "fd10:244::107", true)])
                .port_map("web", "web", "public", Tcp, 3000, None, "web", 0)
                .port_map("games", "game", "public", Udp, 27015, Some(27115), "game", 1),
        ),
        (
            "dual_stack_multi",
            nodes()
                .interface_address("worker-c", "wt0", "fd64:100::3")
                .class("pair", Multi, Vxlan, &[("edge-a", &["wt0"]), ("worker-c", &["wt0"])])
                .service("ns", "svc", "UDP", 27015, &[("pod", "worker-c", "10.244.2.7", true)])
                .slice6("ns", "svc", "v6", "UDP", 27015, &[("pod", "worker-c", "fd10:244:2::7", true)])
                .port_map("ns", "m", "pair", Udp, 27015, Some(27020), "svc", 0),
        ),
        (
            "two_classes_one_pair",
            nodes()
                .class("public", Single, Vxlan, EDGE)
                .class("mesh", Single, Vxlan, &[("edge-a", &["wt0"])])
                .edit_class("mesh", |s| s.return_path.vxlan.vni = 4400)
                .service("ns", "web", "TCP", 3000, &[("web-0", "worker-b", "10.244.1.7", true)])
                .service("ns", "api", "TCP", 9000, &[("api-0", "worker-b", "10.244.1.9", true)])
                .port_map("ns", "web", "public", Tcp, 3000, None, "web", 0)
                .port_map("ns", "api", "mesh", Tcp, 9000, None, "api", 1)
                .edit_map("web", |s| s.interfaces = Some(vec!["enp1s0".into()])),
        ),
        (
            // docs/portmap/guard.md: the web port admits one IPv4 and one IPv6 network, the
            // game's range the class's default (IPv4 only: IPv6 clients are dropped), the
            // third admits every address of both families (/0).
            "guarded_dual_stack",
            nodes()
                .interface_address("edge-a", "enp1s0", "2001:db8::9")
                .class("public", Single, Vxlan, EDGE)
                .edit_class("public", |s| s.source_ranges = vec!["198.51.100.0/24".into()])
                .service("web", "web", "TCP", 3000, &[("web-0", "worker-c", "10.244.2.7", true)])
                .slice6("web", "web", "v6", "TCP", 3000, &[("web-0", "worker-c", "fd10:244:2::7", true)])
                .service("games", "game", "UDP", 27015, &[("game-0", "edge-a", "10.244.0.107", true)])
                .slice6("games", "game", "v6", "UDP", 27015, &[("game-0", "edge-a", "fd10:244::107", true)])
                .service("open", "dns", "UDP", 53, &[("dns-0", "edge-a", "10.244.0.53", true)])
                .port_map("web", "web", "public", Tcp, 3000, None, "web", 0)
                .port_map("games", "game", "public", Udp, 27015, Some(27115), "game", 1)
                .port_map("open", "dns", "public", Udp, 5353, None, "dns", 2)
                .edit_map("web", |s| {
                    s.source_ranges = vec![
                        "192.0.2.0/24".into(),
                        "192.0.2.64/26".into(),
                        "203.0.113.7/32".into(),
                        "2001:db8:100::/48".into(),
                    ]
                })
                .edit_map("dns", |s| s.source_ranges = vec!["0.0.0.0/0".into(), "::/0".into()]),
        ),
        (
            // docs/portmap/guard.md, "Rate limits": the web port (both families, over the link)
            // bounds new connections and connections held per client; the game's range only new
            // flows, and also has an allow-list, which drops before the limit counts.
            "rate_limited_dual_stack",
            nodes()
                .interface_address("edge-a", "enp1s0", "2001:db8::9")
                .class("public", Single, Vxlan, EDGE)
                .service("web", "web", "TCP", 3000, &[("web-0", "worker-c", "10.244.2.7", true)])
                .slice6("web", "web", "v6", "TCP", 3000, &[("web-0", "worker-c", "fd10:244:2::7", true)])
                .service("games", "game", "UDP", 27015, &[("game-0", "edge-a", "10.244.0.107", true)])
                .port_map("web", "web", "public", Tcp, 3000, None, "web", 0)
                .port_map("games", "game", "public", Udp, 27015, Some(27115), "game", 1)
                .edit_map("web", |s| {
                    s.rate_limit = Some(RateLimit { new_per_second: 20, burst: Some(40), max_connections: Some(8) })
                })
                .edit_map("game", |s| {
                    s.rate_limit = Some(RateLimit { new_per_second: 100, burst: None, max_connections: None });
                    s.source_ranges = vec!["198.51.100.0/24".into()];
                }),
        ),
    ]
}
