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
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kuport_proto::v1::Reach;
use serde::{Deserialize, Serialize};

use crate::api::{Intercept, PortMap, PortMapClass};

/// The objects of one kind, shared with the watch cache they came from: copying the inputs
/// (the hub does before each compute) copies one pointer per kind, and a snapshot of the
/// caches one pointer per object. Changed in place only by tests and the folder source, each
/// object copied on its first write.
#[derive(Debug)]
pub struct Objects<K>(Arc<Vec<Arc<K>>>);

impl<K> Clone for Objects<K> {
    fn clone(&self) -> Self {
        Objects(self.0.clone())
    }
}

impl<K> Default for Objects<K> {
    fn default() -> Self {
        Objects(Arc::default())
    }
}

impl<K> std::ops::Deref for Objects<K> {
    type Target = [Arc<K>];
    fn deref(&self) -> &[Arc<K>] {
        &self.0
    }
}

/// An iterator over [`Objects`], by reference to each object.
pub type Iter<'a, K> = std::iter::Map<std::slice::Iter<'a, Arc<K>>, fn(&Arc<K>) -> &K>;

impl<K> Objects<K> {
    pub fn iter(&self) -> Iter<'_, K> {
        self.0.iter().map(|o| &**o)
    }

    /// The shared objects themselves: one unchanged since an earlier list is the same allocation.
    pub fn arcs(&self) -> &[Arc<K>] {
        &self.0
    }
}

impl<'a, K> IntoIterator for &'a Objects<K> {
    type Item = &'a K;
    type IntoIter = Iter<'a, K>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<K: PartialEq> PartialEq<Vec<K>> for Objects<K> {
    fn eq(&self, other: &Vec<K>) -> bool {
        self.iter().eq(other.iter())
    }
}

impl<K> std::ops::Index<usize> for Objects<K> {
    type Output = K;
    fn index(&self, i: usize) -> &K {
        &self.0[i]
    }
}

impl<K: Clone> std::ops::IndexMut<usize> for Objects<K> {
    fn index_mut(&mut self, i: usize) -> &mut K {
        Arc::make_mut(&mut Arc::make_mut(&mut self.0)[i])
    }
}

impl<'a, K: Clone> IntoIterator for &'a mut Objects<K> {
    type Item = &'a mut K;
    type IntoIter = std::iter::Map<std::slice::IterMut<'a, Arc<K>>, fn(&mut Arc<K>) -> &mut K>;
    fn into_iter(self) -> Self::IntoIter {
        Arc::make_mut(&mut self.0).iter_mut().map(Arc::make_mut)
    }
}

/// One object that changed between two lists ([`Objects::changes`]): before and after, either
/// None for an object added or removed; both None where two objects share a name.
pub type Change<'a, K> = (Option<&'a Arc<K>>, Option<&'a Arc<K>>);

impl<K: kube::Resource + PartialEq> Objects<K> {
    /// The objects that differ between `old` and `new` (by namespace and name, in any order).
    /// An object the watch cache did not replace is the same allocation, so an unchanged list
    /// costs a pointer per object. Two objects with one name (a folder's) are compared as lists,
    /// and a difference is one change of neither.
    pub fn changes<'a>(old: &'a Objects<K>, new: &'a Objects<K>) -> Vec<Change<'a, K>> {
        type Key<'a> = (Option<&'a str>, Option<&'a str>);
        fn key<K: kube::Resource>(o: &K) -> Key<'_> {
            (o.meta().namespace.as_deref(), o.meta().name.as_deref())
        }
        let mut changed = Vec::new();
        if old.len() == new.len() {
            let mut aligned = true;
            for (a, b) in old.arcs().iter().zip(new.arcs()) {
                if Arc::ptr_eq(a, b) {
                    continue;
                }
                if key(&**a) != key(&**b) {
                    aligned = false;
                    break;
                }
                if a != b {
                    changed.push((Some(a), Some(b)));
                }
            }
            if aligned {
                return changed;
            }
            changed.clear();
        }
        let mut before: std::collections::HashMap<Key<'a>, &'a Arc<K>> =
            std::collections::HashMap::with_capacity(old.len());
        let mut twice = false;
        for a in old.arcs() {
            twice |= before.insert(key(&**a), a).is_some();
        }
        for b in new.arcs() {
            match before.remove(&key(&**b)) {
                Some(a) if Arc::ptr_eq(a, b) || a == b => {}
                a => changed.push((a, Some(b))),
            }
        }
        changed.extend(before.into_values().map(|a| (Some(a), None)));
        if twice && changed.is_empty() && old.iter().ne(new.iter()) {
            changed.push((None, None));
        }
        changed
    }
}

impl<K> From<Vec<Arc<K>>> for Objects<K> {
    fn from(v: Vec<Arc<K>>) -> Self {
        Objects(Arc::new(v))
    }
}

impl<K> From<Vec<K>> for Objects<K> {
    fn from(v: Vec<K>) -> Self {
        v.into_iter().collect()
    }
}

impl<K> FromIterator<K> for Objects<K> {
    fn from_iter<I: IntoIterator<Item = K>>(iter: I) -> Self {
        Objects(Arc::new(iter.into_iter().map(Arc::new).collect()))
    }
}

impl<K: Clone> Objects<K> {
    pub fn push(&mut self, object: K) {
        Arc::make_mut(&mut self.0).push(Arc::new(object));
    }

    pub fn extend(&mut self, objects: impl IntoIterator<Item = K>) {
        Arc::make_mut(&mut self.0).extend(objects.into_iter().map(Arc::new));
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        Arc::make_mut(&mut self.0).retain(|o| keep(o));
    }

    /// Each object, copied when another holder shares it.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut K> {
        self.into_iter()
    }

    pub fn remove(&mut self, i: usize) -> K {
        Arc::unwrap_or_clone(Arc::make_mut(&mut self.0).remove(i))
    }

    pub fn pop(&mut self) -> Option<K> {
        Arc::make_mut(&mut self.0).pop().map(Arc::unwrap_or_clone)
    }

    pub fn sort_by(&mut self, mut order: impl FnMut(&K, &K) -> std::cmp::Ordering) {
        Arc::make_mut(&mut self.0).sort_by(|a, b| order(a, b));
    }

    pub fn reverse(&mut self) {
        Arc::make_mut(&mut self.0).reverse();
    }

    pub fn clear(&mut self) {
        Arc::make_mut(&mut self.0).clear();
    }

    pub fn last_mut(&mut self) -> Option<&mut K> {
        Arc::make_mut(&mut self.0).last_mut().map(Arc::make_mut)
    }

    pub fn get_mut(&mut self, i: usize) -> Option<&mut K> {
        Arc::make_mut(&mut self.0).get_mut(i).map(Arc::make_mut)
    }
}

/// Everything the computation reads.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    pub nodes: Objects<Node>,
    pub namespaces: Objects<Namespace>,
    pub services: Objects<Service>,
    pub endpoint_slices: Objects<EndpointSlice>,
    pub classes: Objects<PortMapClass>,
    pub port_maps: Objects<PortMap>,
    pub intercepts: Objects<Intercept>,
    /// Pods, stripped to what the computation reads (`kubernetes::strip_pod`): what vouches
    /// for an endpoint and what Intercepts select.
    pub pods: Objects<Pod>,
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

/// What the leader learns of the mesh at run time, from the executors' streams. Each node's
/// part is shared from where the hub keeps it, so that a compute finds a node whose report or
/// state did not change by one pointer (`compute::by_change`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OverlayObserved {
    /// Per reporting node, its latest PeerReport.
    pub reports: BTreeMap<String, Arc<SeenPeers>>,
    /// Per node, the address its executor's NodeSync stream comes from.
    pub connect_addresses: BTreeMap<String, IpAddr>,
    /// Per node, per peer public key, the endpoint its last published state gave that peer:
    /// a peer with a live session keeps it.
    pub last_endpoints: BTreeMap<String, Arc<BTreeMap<String, SocketAddr>>>,
}

/// One node's peer report: per peer public key, what its WireGuard holds.
pub type SeenPeers = BTreeMap<String, ObservedPeer>;

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
