//! The Kubernetes source: one reflector store per kind the computation reads, feeding the hub a
//! fresh snapshot after every change that matters. The status writer reads the same stores
//! (`report::status`), to write only what differs from what is stored.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

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
    /// What the last snapshot read of each pod (the selected ones): the pod watch compares an
    /// event with this, never with an earlier event (see [`watch`]).
    pods_read: LastRead<Pod>,
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

    /// The pods some Intercept selects now: the only ones the computation reads. Recorded in
    /// `pods_read` under its lock, so that a pod event either precedes this read or is compared
    /// with it.
    fn selected_pods(&self) -> Vec<Pod> {
        select_pods(&self.intercepts, &self.pods, &self.pods_read)
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

/// What the last snapshot read of each object, as [`Reads`] digests, written by the snapshot.
type LastRead<K> = Arc<Mutex<HashMap<ObjectRef<K>, u64>>>;

/// What the computation reads of `p`: its digest when some Intercept in `intercepts` selects it.
fn pod_read(intercepts: &Store<Intercept>, p: &Pod) -> Option<u64> {
    let state = intercepts.state();
    let all: Vec<&Intercept> = state.iter().map(|i| &**i).collect();
    selected_by_any(&all, p).then(|| pod_inputs(p))
}

/// The pods some Intercept selects, by the current stores; records what was read of each in
/// `last`, replacing what an earlier snapshot read.
fn select_pods(intercepts: &Store<Intercept>, pods: &Store<Pod>, last: &LastRead<Pod>) -> Vec<Pod> {
    let mut read = last.lock().unwrap_or_else(|e| e.into_inner());
    let intercepts = intercepts.state();
    let intercepts: Vec<&Intercept> = intercepts.iter().map(|i| &**i).collect();
    let selected: Vec<Pod> =
        pods.state().iter().filter(|p| selected_by_any(&intercepts, p)).map(|p| (**p).clone()).collect();
    *read = selected.iter().map(|p| (ObjectRef::from_obj(p), pod_inputs(p))).collect();
    selected
}

/// Whether an event's object changes what the computation reads of it: `read` now against what
/// the last snapshot read (`last`). Not against the object's previous event: selection depends
/// on the Intercepts too, and a pod untouched since an Intercept began selecting it was read by
/// no event (issue 25, finding 8: such a pod relabelled out of the selector kept its table).
fn changes<K: Resource>(last: &HashMap<ObjectRef<K>, u64>, key: &ObjectRef<K>, read: Option<u64>) -> bool
where
    K::DynamicType: Eq + Hash + Clone,
{
    last.get(key).copied() != read
}

/// Watches one kind into a store; every event pokes `changed`, except an update that left
/// `reads(object)` alone, when given: what the computation reads of the object. Kubelet
/// heartbeats leave a Node's readiness and address alone; at 5,000 nodes they alone would keep
/// the controller recomputing. Nor does an event of an object read neither before nor after.
fn reflect<K>(api: Api<K>, changed: Arc<Notify>, reads: Option<Reads<K>>) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    reflect_read(api, changed, reads, None)
}

/// [`reflect`], comparing each update with what the last snapshot read (`last`, written by the
/// snapshot) instead of with the object's previous event, when given.
fn reflect_read<K>(api: Api<K>, changed: Arc<Notify>, reads: Option<Reads<K>>, last: Option<LastRead<K>>) -> Store<K>
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
                Ok(watcher::Event::Apply(o))
                    if let Some(reads) = &reads
                        && let Some(last) = &last =>
                {
                    // Under the snapshot's lock: the store already holds `o`, so a snapshot
                    // either read it or reads it after this comparison.
                    let last = last.lock().unwrap_or_else(|e| e.into_inner());
                    if changes(&last, &ObjectRef::from_obj(&o), reads(&o)) {
                        changed.notify_one();
                    }
                }
                Ok(watcher::Event::Delete(o)) if let Some(last) = &last => {
                    let last = last.lock().unwrap_or_else(|e| e.into_inner());
                    if changes(&last, &ObjectRef::from_obj(&o), None) {
                        changed.notify_one();
                    }
                }
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
    // Intercepts: every update, as PortMaps. Pods: an update that changes what the computation
    // reads of a pod some Intercept selects now, compared with what the last snapshot read of
    // it; a change in the Intercepts themselves recomputes on its own.
    let intercepts: Store<Intercept> = reflect(Api::all(client.clone()), changed.clone(), None);
    let selecting = intercepts.clone();
    let pod_reads: Reads<Pod> = Arc::new(move |p: &Pod| pod_read(&selecting, p));
    let node_reads: Reads<Node> = Arc::new(|n: &Node| Some(digest(&node_inputs(n))));
    let pods_read: LastRead<Pod> = Default::default();
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
        pods: reflect_read(Api::all(client.clone()), changed.clone(), Some(pod_reads), Some(pods_read.clone())),
        pods_read,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{InterceptPort, InterceptSpec, PodSelector, Protocol};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(name: &str, app: &str) -> Pod {
        let metadata = ObjectMeta {
            name: Some(name.into()),
            namespace: Some("dev".into()),
            uid: Some(format!("uid-{name}")),
            labels: Some([("app".to_string(), app.to_string())].into()),
            ..Default::default()
        };
        Pod { metadata, ..Default::default() }
    }

    fn intercept(app: &str) -> Intercept {
        let spec = InterceptSpec {
            pod_selector: PodSelector { match_labels: [("app".to_string(), app.to_string())].into() },
            intercepts: vec![InterceptPort {
                protocol: Protocol::Tcp,
                container_port: 8080,
                agent_port: 9900,
                proxy_port: None,
            }],
            agent: Default::default(),
            mesh_dial_subnets: Vec::new(),
        };
        let mut i = Intercept::new("web", spec);
        i.metadata.namespace = Some("dev".into());
        i
    }

    fn names(pods: &[Pod]) -> Vec<&str> {
        pods.iter().filter_map(|p| p.metadata.name.as_deref()).collect()
    }

    /// Issue 25, finding 8: a pod whose last event came before any Intercept selected it, then
    /// selected by a new Intercept, then relabelled out. The old watch compared the relabel with
    /// the pod's previous event (read nothing, reads nothing) and never recomputed, so the pod
    /// kept its table; compared with what the last snapshot read, the relabel recomputes.
    #[test]
    fn a_pod_untouched_since_an_intercept_selected_it_is_seen_to_leave() {
        let (pods, mut pods_w) = reflector::store::<Pod>();
        let (intercepts, mut intercepts_w) = reflector::store::<Intercept>();
        let last: LastRead<Pod> = Default::default();
        let changed = |p: &Pod| {
            let read = pod_read(&intercepts, p);
            changes(&last.lock().expect("lock"), &ObjectRef::from_obj(p), read)
        };
        let app = pod("app", "web");
        pods_w.apply_watcher_event(&watcher::Event::Apply(app.clone()));
        assert!(!changed(&app), "no Intercept: nothing read of it");
        assert!(select_pods(&intercepts, &pods, &last).is_empty());

        // The Intercept's own event recomputes; the snapshot selects the untouched pod.
        intercepts_w.apply_watcher_event(&watcher::Event::Apply(intercept("web")));
        assert_eq!(names(&select_pods(&intercepts, &pods, &last)), ["app"]);
        assert!(!changed(&app), "read as it is");

        // Relabelled out of the selector: recomputed, and the next snapshot leaves it out.
        let moved = pod("app", "other");
        pods_w.apply_watcher_event(&watcher::Event::Apply(moved.clone()));
        assert!(changed(&moved), "the relabelled pod must recompute");
        assert!(select_pods(&intercepts, &pods, &last).is_empty());
        assert!(!changed(&moved), "an unselected pod's updates do not recompute");

        // Relabelled back in: recomputed; another pod's update, selected by nothing, is not.
        pods_w.apply_watcher_event(&watcher::Event::Apply(app.clone()));
        assert!(changed(&app));
        assert_eq!(names(&select_pods(&intercepts, &pods, &last)), ["app"]);
        let other = pod("other", "api");
        pods_w.apply_watcher_event(&watcher::Event::Apply(other.clone()));
        assert!(!changed(&other));

        // The Intercept's selector changing recomputes by its own event; the pod it left is then
        // not read, and its deletion changes nothing read.
        intercepts_w.apply_watcher_event(&watcher::Event::Apply(intercept("api")));
        assert_eq!(names(&select_pods(&intercepts, &pods, &last)), ["other"]);
        assert!(!changes(&last.lock().expect("lock"), &ObjectRef::from_obj(&app), None), "app's deletion");
        assert!(changes(&last.lock().expect("lock"), &ObjectRef::from_obj(&other), None), "other's deletion");
    }
}
