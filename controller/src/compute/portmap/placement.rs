//! Programmed, first half: which pod receives a mapping and which nodes must program it.
//!
//! Every choice here is a pure function of the observed state, so any replica, and any node
//! reading the same objects, picks the same pod and the same nodes.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::admission::{Admitted, proto_text};
use super::status::{Refusal, reason};
use crate::api::{Protocol, ReturnPathMode, ServingMode};
use crate::observe::index::View;

/// The one pod that receives a mapping's traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub node: String,
    pub pod: String,
    pub address: Ipv4Addr,
    /// The same pod's IPv6 address, from the Service's IPv6 EndpointSlices (by targetRef), when
    /// it is ready there; None otherwise, and the mapping is IPv4 only.
    pub address6: Option<Ipv6Addr>,
    /// The pod's port for the Service's named port.
    pub port: u16,
}

#[derive(Clone, Debug)]
pub struct Placement<'a> {
    pub admitted: Admitted<'a>,
    pub endpoint: Endpoint,
    /// Programming nodes with the interfaces each publishes on.
    pub nodes: BTreeMap<String, Vec<String>>,
}

impl Placement<'_> {
    /// Every node the mapping gives something to ([`super::datapath::Builder::add`] writes to no
    /// other): its programming nodes and the pod's node.
    pub fn nodes_built(&self) -> impl Iterator<Item = &String> {
        self.nodes.keys().chain([&self.endpoint.node])
    }

    /// Programming nodes that lack the pod: each needs a link to the pod's node.
    pub fn remote_nodes(&self) -> impl Iterator<Item = &String> {
        self.nodes.keys().filter(move |n| **n != self.endpoint.node)
    }

    /// The ports the pod serves ([`pod_ports`]).
    pub fn pod_ports(&self) -> (u16, u16) {
        pod_ports(&self.admitted, &self.endpoint)
    }

    /// The node whose route a reply from this pod port must take, or None under Multi, where
    /// each reply follows its own request's link.
    pub fn return_route(&self) -> Option<&str> {
        match self.admitted.class.spec.serving_mode {
            ServingMode::Single => self.nodes.keys().next().map(String::as_str),
            ServingMode::Multi => None,
        }
    }
}

/// The ports a mapping's pod serves: a range keeps its numbers; a single port goes to the
/// Service's target port.
pub fn pod_ports(accepted: &super::admission::Accepted, endpoint: &Endpoint) -> (u16, u16) {
    if accepted.is_range() { accepted.ports } else { (endpoint.port, endpoint.port) }
}

/// Chooses the endpoint and the programming nodes of one accepted mapping.
pub fn place<'a>(view: &View<'a>, admitted: Admitted<'a>) -> Result<Placement<'a>, Refusal> {
    let endpoint = choose_endpoint(view, &admitted)?;
    let class = &admitted.class.spec;
    // Nodes that can carry the mapping now: Ready, and holding one of its interfaces.
    let usable: BTreeMap<String, Vec<String>> = admitted
        .accepting
        .iter()
        .filter_map(|(node, ifaces)| {
            let v = view.node(node);
            let present: Vec<String> = ifaces.iter().filter(|i| v.may_have(i)).cloned().collect();
            (v.ready && !present.is_empty()).then(|| (node.clone(), present))
        })
        .collect();
    if usable.is_empty() {
        let names: Vec<&String> = admitted.accepting.keys().collect();
        let any_ready = names.iter().any(|n| view.node(n).ready);
        return Err(if any_ready {
            Refusal::programmed(
                reason::NO_INTERFACE_ON_NODE,
                format!(
                    "no Ready accepting node of PortMapClass {:?} has any of the interfaces {:?}",
                    admitted.class_name,
                    interface_list(&admitted)
                ),
            )
        } else {
            Refusal::programmed(
                reason::NODE_NOT_READY,
                format!("no accepting node of PortMapClass {:?} is Ready ({})", admitted.class_name, join(&names)),
            )
        });
    }
    let nodes: BTreeMap<String, Vec<String>> = match class.serving_mode {
        ServingMode::Multi => usable,
        ServingMode::Single => {
            let serving = if usable.contains_key(&endpoint.node) {
                endpoint.node.clone()
            } else {
                usable.keys().next().cloned().unwrap_or_default()
            };
            usable.into_iter().filter(|(n, _)| *n == serving).collect()
        }
    };
    let placement = Placement { admitted, endpoint, nodes };
    let lacking: Vec<&String> = placement.remote_nodes().collect();
    if !lacking.is_empty() && class.return_path.mode == ReturnPathMode::None {
        return Err(Refusal::programmed(
            reason::RETURN_PATH_UNAVAILABLE,
            format!(
                "the chosen pod {} is on node {}, which {} lacks; PortMapClass {:?} has spec.returnPath.mode None",
                placement.endpoint.pod,
                placement.endpoint.node,
                join(&lacking),
                placement.admitted.class_name
            ),
        ));
    }
    Ok(placement)
}

fn interface_list(a: &Admitted) -> Vec<String> {
    let mut all: Vec<String> = a.accepting.values().flatten().cloned().collect();
    all.sort();
    all.dedup();
    all
}

fn join(names: &[&String]) -> String {
    names.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

/// One ready endpoint of the Service's named port, from its IPv4 EndpointSlices, that Kubernetes
/// vouches for ([`vouch`]) on a Ready Node: accepting nodes first, then by node name, then by
/// pod name. Its IPv6 address is the same pod's in the IPv6 slices ([`address6_of`]), when the
/// pod holds it.
pub fn choose_endpoint(view: &View, a: &Admitted) -> Result<Endpoint, Refusal> {
    let (ns, _) = &a.key;
    let svc_ref = &a.pm.spec.service_ref;
    let no_endpoint = |m: String| Refusal::programmed(reason::NO_READY_ENDPOINT, m);
    let Some(svc) = view.services.service(ns, &svc_ref.name) else {
        return Err(no_endpoint(format!("spec.serviceRef.name: Service {ns}/{} does not exist", svc_ref.name)));
    };
    let ports = svc.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default();
    let svc_port = match &svc_ref.port {
        Some(name) => ports.iter().find(|p| p.name.as_deref() == Some(name.as_str())),
        None if ports.len() == 1 => ports.first(),
        None => None,
    };
    let Some(svc_port) = svc_port else {
        return Err(no_endpoint(match &svc_ref.port {
            Some(name) => format!("spec.serviceRef.port: Service {ns}/{} has no port named {name:?}", svc_ref.name),
            None => format!("spec.serviceRef.port: Service {ns}/{} has {} ports; name one", svc_ref.name, ports.len()),
        }));
    };
    let svc_proto = svc_port.protocol.as_deref().unwrap_or("TCP");
    if svc_proto != proto_text(a.protocol) {
        return Err(no_endpoint(format!(
            "spec.protocol: {} does not match Service {ns}/{} port {:?}, which is {svc_proto}",
            proto_text(a.protocol),
            svc_ref.name,
            svc_port.name.clone().unwrap_or_default()
        )));
    }
    let port_name = svc_port.name.clone().unwrap_or_default();
    let slices = view.services.slices(ns, &svc_ref.name);
    let mut candidates = Vec::new();
    // Why endpoints were passed over: not vouched for, and on no Ready Node.
    let (mut unvouched, mut not_ready) = (Vec::new(), Vec::new());
    // IPv6 slices (and FQDN ones) are not candidates: IPv4 stays the primary.
    for (port, ep) in ready_endpoints(slices, "IPv4", &port_name, a.protocol) {
        let (Some(node), Some(address)) =
            (ep.node_name.clone(), ep.addresses.iter().find_map(|a| a.parse::<Ipv4Addr>().ok()))
        else {
            continue;
        };
        let pod = match vouch(view, a, ep.target_ref.as_ref(), &node, IpAddr::V4(address)) {
            Ok(pod) => pod,
            Err(why) => {
                unvouched.push(why);
                continue;
            }
        };
        // Links, slots and marks are claimed for Ready Nodes only (docs/portmap/links.md).
        if !view.node(&node).ready {
            not_ready.push(format!("endpoint {address} is on node {node}, which is no Ready Node"));
            continue;
        }
        let order = (!a.accepting.contains_key(&node), node.clone(), pod.clone(), address);
        candidates.push((order, ep.target_ref.as_ref(), Endpoint { node, pod, address, address6: None, port }));
    }
    candidates.sort_by(|x, y| x.0.cmp(&y.0));
    let Some((_, target, mut endpoint)) = candidates.into_iter().next() else {
        let svc = format!("Service {ns}/{}", svc_ref.name);
        return Err(if !unvouched.is_empty() {
            Refusal::programmed(
                reason::ENDPOINT_NOT_VOUCHED,
                format!("{svc} has no endpoint Kubernetes vouches for: {}", unvouched.join("; ")),
            )
        } else if !not_ready.is_empty() {
            Refusal::programmed(reason::NODE_NOT_READY, format!("{svc}: {}", not_ready.join("; ")))
        } else {
            no_endpoint(format!("{svc} has no ready endpoint for port {port_name:?}"))
        });
    };
    endpoint.address6 = target
        .and_then(|t| address6_of(slices, ns, t, &port_name, a.protocol, endpoint.port))
        .filter(|a6| vouch(view, a, target, &endpoint.node, IpAddr::V6(*a6)).is_ok());
    Ok(endpoint)
}

/// Whether Kubernetes vouches for an endpoint `address` on `node` (docs/portmap/modes.md,
/// "Which endpoints are believed"): a Pod of the PortMap's own namespace (the one `target`
/// names, else any) whose status.podIPs hold the address and whose spec.nodeName is the node;
/// else an address no Pod holds, inside the class's spec.externalEndpoints. The pod's name
/// (the address for an external endpoint), or why not, naming the address.
fn vouch(
    view: &View,
    a: &Admitted,
    target: Option<&ObjectReference>,
    node: &str,
    address: IpAddr,
) -> Result<String, String> {
    let ns = a.key.0.as_str();
    let target = target.filter(|r| r.kind.as_deref() == Some("Pod"));
    let by_pod = match target {
        Some(r) => match (r.namespace.as_deref().unwrap_or(ns), r.name.as_deref()) {
            (tns, _) if tns != ns => {
                Err(format!("its targetRef names a Pod of namespace {tns}, not the PortMap's {ns}"))
            }
            (_, None) => Err("its targetRef names no Pod".to_string()),
            (_, Some(name)) => {
                view.pod_holding(ns, Some(name), node, address).map_err(|e| format!("its targetRef {e}"))
            }
        },
        None => view.pod_holding(ns, None, node, address),
    };
    let why = match by_pod {
        Ok(pod) => return Ok(pod.to_string()),
        Err(why) => why,
    };
    let external = &a.class.spec.external_endpoints;
    let allowed = external.iter().filter_map(|c| c.parse::<IpNet>().ok()).any(|c| c.contains(&address));
    if allowed && !view.is_pod_address(&address) {
        return Ok(address.to_string());
    }
    let class = &a.class_name;
    let external = if view.is_pod_address(&address) {
        "it is a Pod's address".to_string()
    } else {
        format!("PortMapClass {class:?} spec.externalEndpoints does not contain it")
    };
    Err(format!("endpoint {address} on node {node}: {why}, and {external}"))
}

/// The ready endpoints of `slices` of one address type that serve the named port, with the
/// port's number (never 0): the one readiness rule both families follow (an endpoint without
/// a ready condition counts as ready, as Kubernetes says).
fn ready_endpoints<'s>(
    slices: &'s [Arc<EndpointSlice>],
    address_type: &'s str,
    port_name: &'s str,
    protocol: Protocol,
) -> impl Iterator<Item = (u16, &'s k8s_openapi::api::discovery::v1::Endpoint)> + 's {
    slices.iter().filter(move |s| s.address_type == address_type).flat_map(move |slice| {
        let port = slice
            .ports
            .iter()
            .flatten()
            .find(|p| {
                p.name.as_deref().unwrap_or_default() == port_name
                    && p.protocol.as_deref().unwrap_or("TCP") == proto_text(protocol)
            })
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0);
        port.into_iter().flat_map(move |port| {
            slice
                .endpoints
                .iter()
                .flatten()
                .filter(|ep| ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                .map(move |ep| (port, ep))
        })
    })
}

/// The IPv6 address of the pod `target` (the chosen IPv4 endpoint's targetRef) in the
/// Service's IPv6 slices: the same Pod by namespace and name (an absent namespace is the
/// Service's), ready, serving the named port on the same number. None when any of that fails,
/// and the mapping stays IPv4 only.
pub fn address6_of(
    slices: &[Arc<EndpointSlice>],
    ns: &str,
    target: &ObjectReference,
    port_name: &str,
    protocol: Protocol,
    port: u16,
) -> Option<Ipv6Addr> {
    let pod = pod_ref(target, ns)?;
    ready_endpoints(slices, "IPv6", port_name, protocol)
        .filter(|(p, ep)| *p == port && ep.target_ref.as_ref().and_then(|t| pod_ref(t, ns)) == Some(pod))
        .find_map(|(_, ep)| ep.addresses.iter().find_map(|a| a.parse::<Ipv6Addr>().ok()))
}

/// A targetRef as (namespace, name) when it names a Pod.
fn pod_ref<'r>(r: &'r ObjectReference, ns: &'r str) -> Option<(&'r str, &'r str)> {
    (r.kind.as_deref() == Some("Pod")).then_some(())?;
    Some((r.namespace.as_deref().unwrap_or(ns), r.name.as_deref()?))
}

/// Whether two mappings' pod ports overlap, which makes their replies indistinguishable.
pub fn same_pod_port(a: &Placement, b: &Placement) -> bool {
    let (x0, x1) = a.pod_ports();
    let (y0, y1) = b.pod_ports();
    a.endpoint.address == b.endpoint.address && a.admitted.protocol == b.admitted.protocol && x0 <= y1 && y0 <= x1
}

pub fn l4(p: Protocol) -> kuport_proto::v1::L4Proto {
    match p {
        Protocol::Tcp => kuport_proto::v1::L4Proto::Tcp,
        Protocol::Udp => kuport_proto::v1::L4Proto::Udp,
    }
}
