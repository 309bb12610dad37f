//! The Kubernetes source: one reflector store per kind the computation reads, feeding the hub a
//! fresh snapshot after every change that matters. The status writer reads the same stores
//! (`report::status`), to write only what differs from what is stored.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use super::Cluster;
use super::index::node_inputs;
use crate::api::{Intercept, PortMap, PortMapClass};
use crate::compute::intercept::pods::InterceptKey;
use crate::compute::portmap::MapKey;
use crate::stream::Hub;

/// The ConfigMap in the controller's namespace that empties every node's state when its
/// [`TEARDOWN_KEY`] is `"true"`: the chart's pre-delete hook sets it (`kuportctl teardown`).
pub const TEARDOWN_CONFIGMAP: &str = "kuport-teardown";
pub const TEARDOWN_KEY: &str = "teardown";

/// The stores of everything the computation reads.
#[derive(Clone)]
pub struct Stores {
    nodes: Store<Node>,
    namespaces: Store<Namespace>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    classes: Store<PortMapClass>,
    port_maps: Store<PortMap>,
    intercepts: Store<Intercept>,
    pods: Store<Pod>,
    teardown: Store<ConfigMap>,
    /// The last teardown the ConfigMap asked for. Its deletion changes nothing: Helm deletes it
    /// while the uninstalled controller may still run, and that controller must not program
    /// the nodes again.
    torn_down: Arc<AtomicBool>,
}

impl Stores {
    /// Whether every node's state is to be empty; see [`Stores::torn_down`].
    fn teardown(&self) -> bool {
        if let Some(cm) = self.teardown.state().first() {
            let asked = cm.data.as_ref().and_then(|d| d.get(TEARDOWN_KEY)).is_some_and(|v| v == "true");
            if self.torn_down.swap(asked, Ordering::Relaxed) != asked {
                tracing::warn!(
                    configmap = TEARDOWN_CONFIGMAP,
                    teardown = asked,
                    "teardown {}: every node's state {}",
                    if asked { "asked" } else { "withdrawn" },
                    if asked { "is emptied" } else { "is computed again" }
                );
            }
        }
        self.torn_down.load(Ordering::Relaxed)
    }

    fn snapshot(&self) -> Cluster {
        // The cache's own objects, not copies.
        fn all<K: Clone + Resource>(s: &Store<K>) -> super::Objects<K>
        where
            K::DynamicType: Eq + Hash + Clone,
        {
            s.state().into()
        }
        Cluster {
            nodes: all(&self.nodes),
            namespaces: all(&self.namespaces),
            services: all(&self.services),
            endpoint_slices: all(&self.slices),
            classes: all(&self.classes),
            port_maps: all(&self.port_maps),
            intercepts: all(&self.intercepts),
            pods: all(&self.pods),
            facts: Vec::new(),
            refused_facts: Default::default(),
            overlay_observed: Default::default(),
            teardown: self.teardown(),
            now: Timestamp::now(),
        }
    }

    /// The stored Node `name`.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    /// The stored class `name`.
    pub fn class(&self, name: &str) -> Option<Arc<PortMapClass>> {
        self.classes.get(&ObjectRef::new(name))
    }

    /// The stored Intercept `ns/name`.
    pub fn intercept(&self, (ns, name): &InterceptKey) -> Option<Arc<Intercept>> {
        self.intercepts.get(&ObjectRef::new(name).within(ns))
    }

    /// The stored PortMap `ns/name`.
    pub fn port_map(&self, (ns, name): &MapKey) -> Option<Arc<PortMap>> {
        self.port_maps.get(&ObjectRef::new(name).within(ns))
    }
}

/// What the computation reads of an object, digested; None when it reads nothing of it (a pod
/// no Intercept selects).
type Reads<K> = Arc<dyn Fn(&K) -> Option<u64> + Send + Sync>;

/// Watches one kind into a store; every event pokes `changed`, except an update that left
/// `reads(object)` alone, when given: what the computation reads of the object. Kubelet
/// heartbeats leave a Node's readiness and address alone; at 5,000 nodes they alone would keep
/// the controller recomputing. Nor does an event of an object read neither before nor after.
fn reflect<K>(api: Api<K>, changed: Arc<Notify>, reads: Option<Reads<K>>) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    reflect_stripped(api, changed, reads, |_| {})
}

/// [`reflect`], storing each object as `strip` leaves it (what the computation reads of it).
fn reflect_stripped<K>(
    api: Api<K>,
    changed: Arc<Notify>,
    reads: Option<Reads<K>>,
    strip: impl FnMut(&mut K) + Send + 'static,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default()).default_backoff().modify(strip).reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut seen: std::collections::HashMap<ObjectRef<K>, u64> = Default::default();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(o)) if let Some(reads) = &reads => {
                    let read = reads(&o);
                    let before = match read {
                        Some(r) => seen.insert(ObjectRef::from_obj(&o), r),
                        None => seen.remove(&ObjectRef::from_obj(&o)),
                    };
                    if before != read {
                        changed.notify_one();
                    }
                }
                Ok(watcher::Event::Delete(o)) => {
                    let before = seen.remove(&ObjectRef::from_obj(&o));
                    if reads.is_none() || before.is_some() {
                        changed.notify_one();
                    }
                }
                Ok(watcher::Event::InitApply(o)) => {
                    if let Some(reads) = &reads
                        && let Some(r) = reads(&o)
                    {
                        seen.insert(ObjectRef::from_obj(&o), r);
                    }
                    changed.notify_one();
                }
                Ok(_) => changed.notify_one(),
                Err(e) => tracing::warn!(kind = %K::kind(&K::DynamicType::default()), error = %e, "watch"),
            }
        }
    });
    reader
}

/// Watches the one object `name` of `api` into a store (a field selector, as RBAC grants it
/// by name).
fn reflect_named<K>(api: Api<K>, name: &str, changed: Arc<Notify>) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(api, config).default_backoff().reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => changed.notify_one(),
                Err(e) => tracing::warn!(kind = %K::kind(&K::DynamicType::default()), error = %e, "watch"),
            }
        }
    });
    reader
}

/// A digest of what the computation reads of an object (see [`reflect`]).
fn digest(what: &impl Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    what.hash(&mut h);
    h.finish()
}

/// A Pod as the controller keeps it: what vouching for endpoints (compute::portmap::placement)
/// and interception (compute::intercept::pods) read, and nothing else. Every pod of the cluster
/// is kept; the rest of a Pod (its containers, volumes, managed fields) is most of its size
/// (docs/performance.md, "Pods in memory").
pub fn strip_pod(p: &mut Pod) {
    let m = &mut p.metadata;
    *m = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: m.name.take(),
        namespace: m.namespace.take(),
        uid: m.uid.take(),
        labels: m.labels.take(),
        deletion_timestamp: m.deletion_timestamp.take(),
        ..Default::default()
    };
    p.spec = p.spec.take().map(|s| k8s_openapi::api::core::v1::PodSpec {
        node_name: s.node_name,
        host_network: s.host_network,
        host_users: s.host_users,
        ..Default::default()
    });
    p.status = p.status.take().map(|s| k8s_openapi::api::core::v1::PodStatus {
        phase: s.phase,
        pod_ip: s.pod_ip,
        pod_ips: s.pod_ips,
        ..Default::default()
    });
}

/// A digest of what the computation reads of a pod (compute::intercept::pods and the
/// endpoints' vouching).
fn pod_inputs(p: &Pod) -> u64 {
    let spec = p.spec.as_ref();
    let status = p.status.as_ref();
    let ips: Vec<&str> = status.iter().flat_map(|s| s.pod_ips.iter().flatten()).map(|i| i.ip.as_str()).collect();
    digest(&(
        (&p.metadata.uid, &p.metadata.labels, p.metadata.deletion_timestamp.is_some()),
        (spec.and_then(|s| s.node_name.as_deref()), spec.and_then(|s| s.host_network), spec.and_then(|s| s.host_users)),
        (status.and_then(|s| s.phase.as_deref()), ips, status.and_then(|s| s.pod_ip.as_deref())),
    ))
}

/// Starts the watches and feeds the hub: nothing until every store has listed once (a partial
/// view would tear down what works), then a fresh snapshot after every change. `namespace`:
/// the controller's, where [`TEARDOWN_CONFIGMAP`] is.
pub fn watch(client: &Client, namespace: &str, hub: Arc<Hub>) -> Stores {
    let changed = Arc::new(Notify::new());
    // Intercepts: every update, as PortMaps. Pods: every pod (an endpoint is believed only when
    // its Pod vouches for it), stripped to what the computation reads, and only a change in that
    // recomputes.
    let intercepts: Store<Intercept> = reflect(Api::all(client.clone()), changed.clone(), None);
    let pod_reads: Reads<Pod> = Arc::new(|p: &Pod| Some(pod_inputs(p)));
    let node_reads: Reads<Node> = Arc::new(|n: &Node| Some(digest(&node_inputs(n))));
    let stores = Stores {
        nodes: reflect(Api::all(client.clone()), changed.clone(), Some(node_reads)),
        namespaces: reflect(Api::all(client.clone()), changed.clone(), None),
        services: reflect(Api::all(client.clone()), changed.clone(), None),
        slices: reflect(Api::all(client.clone()), changed.clone(), None),
        // PortMaps and classes: every update, status writes included. The computation reads their
        // statuses (condition times, slot rows); skipping status-only updates left a new leader
        // rewriting every status after a failover (robust_root's leader test).
        classes: reflect(Api::all(client.clone()), changed.clone(), None),
        port_maps: reflect(Api::all(client.clone()), changed.clone(), None),
        intercepts,
        pods: reflect_stripped(Api::all(client.clone()), changed.clone(), Some(pod_reads), strip_pod),
        teardown: reflect_named(Api::namespaced(client.clone(), namespace), TEARDOWN_CONFIGMAP, changed.clone()),
        torn_down: Arc::default(),
    };
    let s = stores.clone();
    tokio::spawn(async move {
        let ready = futures::future::join_all([
            s.nodes.wait_until_ready().boxed(),
            s.namespaces.wait_until_ready().boxed(),
            s.services.wait_until_ready().boxed(),
            s.slices.wait_until_ready().boxed(),
            s.classes.wait_until_ready().boxed(),
            s.port_maps.wait_until_ready().boxed(),
            s.intercepts.wait_until_ready().boxed(),
            s.pods.wait_until_ready().boxed(),
            // A new leader learns of a teardown before it publishes anything.
            s.teardown.wait_until_ready().boxed(),
        ])
        .await;
        if ready.iter().any(Result::is_err) {
            tracing::error!("a watch ended before listing");
            return;
        }
        tracing::info!("caches synced");
        loop {
            hub.set_inputs(s.snapshot());
            changed.notified().await;
        }
    });
    stores
}
