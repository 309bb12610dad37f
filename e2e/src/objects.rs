//! The cluster objects a topology stands for: Nodes, Namespaces, Services, EndpointSlices, and
//! the NodeFacts each node's executor would report, and the Pods (as their kubelets would
//! report them) that vouch for the slices' endpoints. Pure: the same topology always gives the
//! same objects, so they can feed the offline computation now and the API server later.
//!
//! Dual-stack: a node's IPv6 addresses follow its IPv4 ones in its facts (IPv4 first, as the
//! executor reports them) but stay out of its Node status: server-side apply keys
//! `status.addresses` by type and refuses a second ExternalIP (kubelets write them with a
//! strategic merge patch). Its IPv6 pod prefix follows the IPv4 one in `podCIDRs`; each Service with pods that have an IPv6 address has an
//! IPv6 EndpointSlice `<service>-v6` beside its IPv4 one `<service>-lab`, with the same pods.
//! Services are left single-stack in their spec (no `ipFamilies`, `ipFamilyPolicy`): the lab's
//! API server has only an IPv4 service range, and kuport reads the EndpointSlices.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Container, Namespace, Node, NodeAddress, NodeCondition, NodeSpec as K8sNodeSpec, NodeStatus, ObjectReference, Pod,
    PodIP, PodSpec as K8sPodSpec, PodStatus, Service, ServicePort, ServiceSpec as K8sServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kuport_controller::observe::{Cluster, KnownFacts, KnownInterface};

use crate::topology::{NatKind, PodSpec, Topology};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The operator's endpoint override on a Node (docs/overlay/mesh.md).
pub use kuport_controller::compute::overlay::EXTERNAL_ENDPOINT_ANNOTATION as EXTERNAL_ENDPOINT;
/// The public key the controller publishes on each mesh member's Node.
pub use kuport_controller::compute::overlay::PUBLIC_KEY_ANNOTATION as WIREGUARD_PUBLIC_KEY;
/// Who manages the generated EndpointSlices (the label endpoint controllers set).
pub const MANAGED_BY: &str = "kuport-lab";

/// What the cluster would hold for a topology.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Objects {
    pub nodes: Vec<Node>,
    pub namespaces: Vec<Namespace>,
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
    /// The topology's pods as the kubelet would report them (node, addresses): what vouches for
    /// their endpoints (docs/portmap/modes.md, "Which endpoints are believed").
    pub pods: Vec<Pod>,
    pub facts: Vec<KnownFacts>,
}

fn meta(name: &str, namespace: Option<&str>, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: (!labels.is_empty()).then_some(labels),
        ..Default::default()
    }
}

/// Every object the topology stands for, in topology order.
pub fn generate(t: &Topology) -> Objects {
    let mut out = Objects::default();
    for n in &t.nodes {
        let mut labels = n.labels.clone();
        labels.entry("kubernetes.io/hostname".into()).or_insert_with(|| n.name.clone());
        labels.entry("kubernetes.io/os".into()).or_insert_with(|| "linux".into());
        let mut addresses =
            vec![NodeAddress { type_: "InternalIP".into(), address: n.underlay.address.addr().to_string() }];
        addresses.extend(
            n.public.iter().map(|p| NodeAddress { type_: "ExternalIP".into(), address: p.address.addr().to_string() }),
        );
        addresses.push(NodeAddress { type_: "Hostname".into(), address: n.name.clone() });
        let mut metadata = meta(&n.name, None, labels);
        // A VM behind a 1:1 NAT announces its public address (docs/overlay/mesh.md, Endpoints).
        if let Some(nat) = n.nat.as_ref().filter(|nat| nat.kind == NatKind::OneToOne) {
            let annotations = BTreeMap::from([(EXTERNAL_ENDPOINT.to_string(), nat.public.addr().to_string())]);
            metadata.annotations = Some(annotations);
        }
        out.nodes.push(Node {
            metadata,
            spec: Some(K8sNodeSpec {
                pod_cidr: Some(n.pod_cidr.0.trunc().to_string()),
                pod_cidrs: Some(
                    std::iter::once(n.pod_cidr.0.trunc().to_string())
                        .chain(n.pod_cidr6.map(|c| c.0.trunc().to_string()))
                        .collect(),
                ),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(addresses),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if n.ready { "True" } else { "False" }.into(),
                    reason: Some(if n.ready { "KubeletReady" } else { "KubeletNotReady" }.into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        });
        let mut interfaces = vec![KnownInterface {
            name: n.underlay.interface.clone(),
            addresses: std::iter::once(n.underlay.address.addr().to_string())
                .chain(n.underlay.address6.map(|a| a.addr().to_string()))
                .collect(),
        }];
        interfaces.extend(n.public.iter().map(|p| KnownInterface {
            name: p.interface.clone(),
            addresses:
                std::iter::once(p.address.addr().to_string()).chain(p.address6.map(|a| a.addr().to_string())).collect(),
        }));
        out.facts.push(KnownFacts {
            node: n.name.clone(),
            underlay_address: Some(n.underlay.address.addr()),
            underlay_mtu: Some(n.underlay.mtu),
            interfaces: Some(interfaces),
            wireguard_public_key: None,
            // The running executors report them; a rendered world has none.
            routes: None,
            vxlan_ports: Vec::new(),
        });
    }

    // Namespaces: the listed ones with their labels, then every other one pods and Services name.
    let mut seen = BTreeSet::new();
    for ns in &t.namespaces {
        if seen.insert(ns.name.clone()) {
            let mut labels = ns.labels.clone();
            labels.insert("kubernetes.io/metadata.name".into(), ns.name.clone());
            out.namespaces.push(Namespace { metadata: meta(&ns.name, None, labels), ..Default::default() });
        }
    }
    let named = t.pods.iter().map(|p| &p.namespace).chain(t.services.iter().map(|s| &s.namespace));
    for ns in named {
        if seen.insert(ns.clone()) {
            let labels = BTreeMap::from([("kubernetes.io/metadata.name".to_string(), ns.clone())]);
            out.namespaces.push(Namespace { metadata: meta(ns, None, labels), ..Default::default() });
        }
    }

    for p in &t.pods {
        let ips = std::iter::once(p.address.to_string()).chain(t.pod_address6(p).map(|a| a.to_string()));
        out.pods.push(Pod {
            metadata: meta(&p.name, Some(&p.namespace), p.labels.clone()),
            spec: Some(K8sPodSpec {
                node_name: Some(p.node.clone()),
                containers: vec![Container {
                    name: "echo".into(),
                    image: Some("kuport-lab-echo".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some(p.address.to_string()),
                pod_ips: Some(ips.map(|ip| PodIP { ip }).collect()),
                ..Default::default()
            }),
        });
    }

    for s in &t.services {
        out.services.push(Service {
            metadata: meta(&s.name, Some(&s.namespace), BTreeMap::new()),
            spec: Some(K8sServiceSpec {
                type_: Some("ClusterIP".into()),
                selector: Some(s.selector.clone()),
                ports: Some(
                    s.ports
                        .iter()
                        .map(|p| ServicePort {
                            name: Some(p.name.clone()),
                            protocol: Some(p.protocol.to_string()),
                            port: p.port.into(),
                            target_port: Some(IntOrString::Int(p.target_port.unwrap_or(p.port).into())),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        });
        let selected =
            |p: &&PodSpec| p.namespace == s.namespace && s.selector.iter().all(|(k, v)| p.labels.get(k) == Some(v));
        let endpoint = |p: &PodSpec, address: String| Endpoint {
            addresses: vec![address],
            conditions: Some(EndpointConditions {
                ready: Some(p.ready),
                serving: Some(p.ready),
                terminating: Some(false),
            }),
            node_name: Some(p.node.clone()),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some(p.namespace.clone()),
                name: Some(p.name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let endpoints: Vec<Endpoint> =
            t.pods.iter().filter(selected).map(|p| endpoint(p, p.address.to_string())).collect();
        let endpoints6: Vec<Endpoint> = t
            .pods
            .iter()
            .filter(selected)
            .filter_map(|p| t.pod_address6(p).map(|a| endpoint(p, a.to_string())))
            .collect();
        let labels = BTreeMap::from([
            (SERVICE_NAME_LABEL.to_string(), s.name.clone()),
            ("endpointslice.kubernetes.io/managed-by".to_string(), MANAGED_BY.to_string()),
        ]);
        let ports: Vec<EndpointPort> = s
            .ports
            .iter()
            .map(|p| EndpointPort {
                name: Some(p.name.clone()),
                protocol: Some(p.protocol.to_string()),
                port: Some(p.target_port.unwrap_or(p.port).into()),
                ..Default::default()
            })
            .collect();
        out.endpoint_slices.push(EndpointSlice {
            metadata: meta(&format!("{}-lab", s.name), Some(&s.namespace), labels.clone()),
            address_type: "IPv4".into(),
            endpoints: Some(endpoints),
            ports: Some(ports.clone()),
        });
        if !endpoints6.is_empty() {
            out.endpoint_slices.push(EndpointSlice {
                metadata: meta(&format!("{}-v6", s.name), Some(&s.namespace), labels),
                address_type: "IPv6".into(),
                endpoints: Some(endpoints6),
                ports: Some(ports),
            });
        }
    }
    out
}

impl Objects {
    /// The objects added to `manifests` (classes, PortMaps and anything else they hold).
    pub fn with(&self, manifests: &Cluster) -> Cluster {
        let mut c = manifests.clone();
        c.nodes.extend(self.nodes.iter().cloned());
        c.namespaces.extend(self.namespaces.iter().cloned());
        c.services.extend(self.services.iter().cloned());
        c.endpoint_slices.extend(self.endpoint_slices.iter().cloned());
        c.pods.extend(self.pods.iter().cloned());
        c.facts.extend(self.facts.iter().cloned());
        c
    }

    /// The objects as YAML documents that `kuport-controller render` reads (and, NodeFacts
    /// aside, `kubectl apply` accepts).
    pub fn to_yaml(&self) -> String {
        let mut docs: Vec<String> = Vec::new();
        let mut push = |v: serde_yaml::Value| docs.push(serde_yaml::to_string(&v).expect("objects serialize"));
        for n in &self.namespaces {
            push(value(n));
        }
        for n in &self.nodes {
            push(value(n));
        }
        for s in &self.services {
            push(value(s));
        }
        for s in &self.endpoint_slices {
            push(value(s));
        }
        for p in &self.pods {
            push(value(p));
        }
        for f in &self.facts {
            let mut m = serde_yaml::Mapping::new();
            m.insert("apiVersion".into(), "kuport.wlz.li/v1alpha1".into());
            m.insert("kind".into(), "NodeFacts".into());
            let mut md = serde_yaml::Mapping::new();
            md.insert("name".into(), f.node.clone().into());
            m.insert("metadata".into(), md.into());
            if let Some(a) = f.underlay_address {
                m.insert("underlayAddress".into(), a.to_string().into());
            }
            if let Some(mtu) = f.underlay_mtu {
                m.insert("underlayMtu".into(), u64::from(mtu).into());
            }
            if let Some(i) = &f.interfaces {
                m.insert("interfaces".into(), serde_yaml::to_value(i).expect("facts serialize"));
            }
            push(m.into());
        }
        docs.join("---\n")
    }
}

/// Any k8s-openapi object as YAML (they carry their own apiVersion and kind).
fn value<T: serde::Serialize>(x: &T) -> serde_yaml::Value {
    serde_yaml::to_value(x).expect("objects serialize")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use kuport_controller::compute::{Settings, compute};

    use super::*;
    use crate::manifests::Manifests;

    fn now() -> k8s_openapi::jiff::Timestamp {
        "2026-11-29T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn default_topology_objects() {
        let t = Topology::default_lab();
        let o = generate(&t);
        assert_eq!(o.nodes.len(), 3);
        assert_eq!(o.facts.len(), 3);
        let edge = &o.facts[0];
        assert_eq!(edge.node, "edge-a");
        assert_eq!(edge.underlay_address, Some("100.64.93.143".parse().unwrap()));
        assert_eq!(edge.underlay_mtu, Some(1420));
        let ifaces = edge.interfaces.as_ref().unwrap();
        assert_eq!(
            ifaces[1],
            KnownInterface { name: "enp1s0".into(), addresses: vec!["203.0.113.9".into(), "2001:db8::9".into()] }
        );
        let slice = o.endpoint_slices.iter().find(|s| s.metadata.name.as_deref() == Some("game-lab")).unwrap();
        assert_eq!(slice.metadata.labels.as_ref().unwrap()[SERVICE_NAME_LABEL], "game");
        let ep = &slice.endpoints.as_ref().unwrap()[0];
        assert_eq!(ep.addresses, vec!["10.244.2.107".to_string()]);
        assert_eq!(ep.node_name.as_deref(), Some("worker-2"));
        assert_eq!(ep.conditions.as_ref().unwrap().ready, Some(true));
        assert_eq!(ep.target_ref.as_ref().unwrap().name.as_deref(), Some("game-0"));
        // Its IPv6 twin: the same pod by targetRef, its IPv6 address.
        let slice6 = o.endpoint_slices.iter().find(|s| s.metadata.name.as_deref() == Some("game-v6")).unwrap();
        assert_eq!(slice6.address_type, "IPv6");
        assert_eq!(slice6.metadata.labels.as_ref().unwrap()[SERVICE_NAME_LABEL], "game");
        let ep6 = &slice6.endpoints.as_ref().unwrap()[0];
        assert_eq!(ep6.addresses, vec!["fd10:244:2::6b".to_string()]);
        assert_eq!(ep6.target_ref, ep.target_ref);
        assert_eq!((ep6.conditions.as_ref().unwrap().ready, ep6.node_name.as_deref()), (Some(true), Some("worker-2")));
        assert_eq!(slice6.ports, slice.ports);
        let edge_node = &o.nodes[0];
        assert_eq!(
            edge_node.spec.as_ref().unwrap().pod_cidrs.as_deref(),
            Some(&["10.244.18.0/24".to_string(), "fd10:244:18::/64".to_string()][..])
        );
        let external: Vec<&str> = edge_node
            .status
            .as_ref()
            .unwrap()
            .addresses
            .as_ref()
            .unwrap()
            .iter()
            .filter(|a| a.type_ == "ExternalIP")
            .map(|a| a.address.as_str())
            .collect();
        assert_eq!(external, ["203.0.113.9"], "IPv6 addresses stay out of the Node status (server-side apply)");
        let namespaces: Vec<_> = o.namespaces.iter().map(|n| n.metadata.name.clone().unwrap()).collect();
        assert_eq!(namespaces, ["web", "apps", "games"]);
        // Deterministic.
        assert_eq!(generate(&t), o);
    }

    /// Sites: the VM behind a 1:1 NAT announces its public address; the others announce
    /// nothing and are known by their InternalIP; every Node has its pod CIDR.
    #[test]
    fn sites_objects() {
        let o = generate(&Topology::sites_lab());
        let node = |n: &str| o.nodes.iter().find(|x| x.metadata.name.as_deref() == Some(n)).unwrap();
        let vm = node("vm").metadata.annotations.as_ref().unwrap();
        assert_eq!(vm[EXTERNAL_ENDPOINT], "203.0.113.30");
        assert!(node("home").metadata.annotations.is_none() && node("cloud").metadata.annotations.is_none());
        let home = node("home");
        assert_eq!(home.spec.as_ref().unwrap().pod_cidrs.as_deref(), Some(&["10.42.2.0/24".to_string()][..]));
        let addresses = home.status.as_ref().unwrap().addresses.as_ref().unwrap();
        assert_eq!((addresses[0].type_.as_str(), addresses[0].address.as_str()), ("InternalIP", "192.168.1.10"));
    }

    #[test]
    fn unready_pods_are_unready_endpoints() {
        let mut t = Topology::default_lab();
        t.pods.iter_mut().find(|p| p.name == "game-0").unwrap().ready = false;
        let o = generate(&t);
        let slice = o.endpoint_slices.iter().find(|s| s.metadata.name.as_deref() == Some("game-lab")).unwrap();
        assert_eq!(slice.endpoints.as_ref().unwrap()[0].conditions.as_ref().unwrap().ready, Some(false));
    }

    /// The YAML form reads back through the render loader into the same cluster.
    #[test]
    fn yaml_reads_back_through_render() {
        let t = Topology::default_lab();
        let o = generate(&t);
        let mut c = Cluster { now: now(), ..Default::default() };
        kuport_controller::render::load_text(Path::new("objects.yaml"), &o.to_yaml(), &mut c).unwrap();
        assert_eq!(c.nodes, o.nodes);
        assert_eq!(c.namespaces, o.namespaces);
        assert_eq!(c.services, o.services);
        assert_eq!(c.endpoint_slices, o.endpoint_slices);
        assert_eq!(c.pods, o.pods);
        assert_eq!(c.facts, o.facts);
    }

    /// The default topology with the default manifests: the game range is programmed on edge-a
    /// over a link to worker-2, and edge-a publishes it on enp1s0 at 203.0.113.9.
    #[test]
    fn default_lab_computes() {
        let t = Topology::default_lab();
        let m = Manifests::default_lab();
        let mut cluster = generate(&t).with(&m.cluster);
        cluster.now = now();
        let out = compute(&cluster, &Settings::default());
        let status = &out.port_maps[&("games".to_string(), "game".to_string())];
        let programmed = status.conditions.iter().find(|c| c.type_ == "Programmed").unwrap();
        assert_eq!(programmed.status, "True", "{programmed:?}");
        assert_eq!(status.endpoint.as_ref().unwrap().node, "worker-2");
        assert!(status.published.iter().any(|p| p.interface == "enp1s0" && p.address == "203.0.113.9"));
        assert_eq!(out.programming[&("games".to_string(), "game".to_string())], ["edge-a"]);
        let edge = kuport_proto::text::node_state(&out.node_states["edge-a"]);
        assert!(edge.contains("local 100.64.93.143 remote 100.64.0.12 dstport 4790"), "{edge}");
        assert!(edge.contains("mtu 1330"), "the link takes the smaller underlay less 50: {edge}");
    }

    #[test]
    fn multi_lab_computes() {
        let t = Topology::multi_lab();
        let m = Manifests::multi_lab();
        let mut cluster = generate(&t).with(&m.cluster);
        cluster.now = now();
        let out = compute(&cluster, &Settings::default());
        for name in ["dns", "dns-tcp"] {
            let key = ("intranet".to_string(), name.to_string());
            assert_eq!(out.programming[&key], ["worker-1", "worker-2", "worker-3"], "{name}");
        }
    }
}
