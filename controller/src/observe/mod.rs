//! Observe: what the controller knows of the cluster, gathered for the computation.
//!
//! A source delivers whole [`Cluster`] snapshots to the hub: [`kubernetes`] from reflector
//! stores over the API, [`folder`] from a folder of manifests. Executors' facts arrive over
//! NodeSync and join the snapshot as [`KnownFacts`], once [`facts`] checked them. [`index`] holds
//! the indexes the computation reads the snapshot through.

pub mod facts;
pub mod folder;
pub mod index;
pub mod kubernetes;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kuport_proto::v1::Reach;
use serde::{Deserialize, Serialize};

use crate::api::{Intercept, PortMap, PortMapClass};

/// Everything the computation reads.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    pub nodes: Vec<Node>,
    pub namespaces: Vec<Namespace>,
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
    pub classes: Vec<PortMapClass>,
    pub port_maps: Vec<PortMap>,
    pub intercepts: Vec<Intercept>,
    /// Pods, stripped to what the computation reads (`kubernetes::strip_pod`): what vouches
    /// for an endpoint and what Intercepts select.
    pub pods: Vec<Pod>,
    pub facts: Vec<KnownFacts>,
    /// Per node, why its executor's latest report was refused ([`facts::check`]); its
    /// previous facts, if any, are in `facts`.
    pub refused_facts: BTreeMap<String, facts::Refused>,
    /// What the executors observe of the overlay's peers, for its endpoint choice
    /// (docs/overlay/status.md) and its relays (docs/overlay/relays.md); empty from a folder or
    /// before any report.
    pub overlay_observed: OverlayObserved,
    /// Every node's state is to be empty: the chart's uninstall asked for it (the ConfigMap
    /// [`kubernetes::TEARDOWN_CONFIGMAP`]; docs/operations/uninstall.md).
    pub teardown: bool,
    pub now: Timestamp,
}

/// What the leader learns of the mesh at run time, from the executors' streams.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OverlayObserved {
    /// Per reporting node, its latest PeerReport: per peer public key, what its WireGuard
    /// holds.
    pub reports: BTreeMap<String, BTreeMap<String, ObservedPeer>>,
    /// Per node, the address its executor's NodeSync stream comes from.
    pub connect_addresses: BTreeMap<String, IpAddr>,
    /// Per node, per peer public key, the endpoint its last published state gave that peer:
    /// a peer with a live session keeps it.
    pub last_endpoints: BTreeMap<String, BTreeMap<String, SocketAddr>>,
}

/// One peer in a node's PeerReport.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedPeer {
    /// Where WireGuard sends to it now: learned from its packets while its session lives.
    pub endpoint: Option<SocketAddr>,
    /// The last completed handshake, on the controller's clock; None: never.
    pub last_handshake: Option<Timestamp>,
    /// Whether the direct path to it works, as the node's probes find: an unreachable one makes
    /// the pair relayed (docs/overlay/relays.md).
    pub reach: Reach,
}

/// What the computation knows of a node from its executor's reports (the wire's `NodeFacts`,
/// checked by [`facts`]), or from a folder's `NodeFacts` documents.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KnownFacts {
    pub node: String,
    #[serde(default)]
    pub underlay_address: Option<Ipv4Addr>,
    #[serde(default)]
    pub underlay_mtu: Option<u32>,
    /// The node's interfaces; None until reported, which leaves every interface possible.
    #[serde(default)]
    pub interfaces: Option<Vec<KnownInterface>>,
    /// The node's WireGuard public key (base64), checked by [`facts::wireguard_key`]; None until
    /// reported. The overlay's peers are built from it (docs/overlay/mesh.md).
    #[serde(default)]
    pub wireguard_public_key: Option<String>,
    /// The main table's routes (prefix, device), checked by [`facts::check`]: which device
    /// reaches a local pod (docs/portmap/datapath.md, "The request claim"). None until
    /// reported.
    #[serde(default)]
    pub routes: Option<Vec<KnownRoute>>,
    /// The UDP ports of the node's VXLAN devices that are not kuport's (the CNI's): a class's
    /// links must not use them (docs/portmap/links.md, "UDP port").
    #[serde(default)]
    pub vxlan_ports: Vec<u16>,
}

/// One route of [`KnownFacts`]: the destination prefix ("a.b.c.d/len", as [`facts::check`]
/// writes it) and the device it leaves through.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KnownRoute {
    pub dst: String,
    pub dev: String,
}

/// One interface of [`KnownFacts`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KnownInterface {
    pub name: String,
    #[serde(default)]
    pub addresses: Vec<String>,
}
