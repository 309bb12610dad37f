//! The Kubernetes source: one reflector store per kind the computation reads, feeding the hub a
//! fresh snapshot after every change that matters. The status writer reads the same stores
//! (`report::status`), to write only what differs from what is stored.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
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
use crate::compute::intercept::pods::{InterceptKey, selected_by_any};
use crate::compute::portmap::MapKey;
use crate::stream::Hub;

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
}

impl Stores {
    fn snapshot(&self) -> Cluster {
        fn all<K: Clone + Resource>(s: &Store<K>) -> Vec<K>
        where
            K::DynamicType: Eq + Hash + Clone,
        {
            s.state().iter().map(|o| (**o).clone()).collect()
        }
        Cluster {
            nodes: all(&self.nodes),
            namespaces: all(&self.namespaces),
            services: all(&self.services),
            endpoint_slices: all(&self.slices),
            classes: all(&self.classes),
            port_maps: all(&self.port_maps),
            intercepts: all(&self.intercepts),
            pods: self.selected_pods(),
            facts: Vec::new(),
            refused_facts: Default::default(),
            overlay_observed: Default::default(),
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

    /// The pods some Intercept selects: the only ones the computation reads.
    fn selected_pods(&self) -> Vec<Pod> {
        let intercepts = self.intercepts.state();
        let intercepts: Vec<&Intercept> = intercepts.iter().map(|i| &**i).collect();
        self.pods.state().iter().filter(|p| selected_by_any(&intercepts, p)).map(|p| (**p).clone()).collect()
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
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default()).default_backoff().reflect(writer);
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

/// A digest of what the computation reads of an object (see [`reflect`]).
fn digest(what: &impl Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    what.hash(&mut h);
    h.finish()
}

/// A digest of what the computation reads of a pod (compute::intercept::pods).
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
/// view would tear down what works), then a fresh snapshot after every change.
pub fn watch(client: &Client, hub: Arc<Hub>) -> Stores {
    let changed = Arc::new(Notify::new());
    // Intercepts: every update, as PortMaps. Pods: only what the computation reads of a pod some
    // Intercept selects; a change in the Intercepts themselves recomputes on its own.
    let intercepts: Store<Intercept> = reflect(Api::all(client.clone()), changed.clone(), None);
    let selecting = intercepts.clone();
    let pod_reads: Reads<Pod> = Arc::new(move |p: &Pod| {
        let state = selecting.state();
        let all: Vec<&Intercept> = state.iter().map(|i| &**i).collect();
        selected_by_any(&all, p).then(|| pod_inputs(p))
    });
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
        pods: reflect(Api::all(client.clone()), changed.clone(), Some(pod_reads)),
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
