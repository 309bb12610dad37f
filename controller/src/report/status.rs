//! The status writer (leader only): what the computation decided, written back to the API.
//! Slot claims and node facts go into class status before any node state uses them (the hub's
//! [`Gate`]); PortMap status once the executors that must apply a mapping acknowledged it
//! (Pending until then), and Intercept status likewise, with the [`events`] the change warrants. Only statuses
//! that differ from the stored ones are written. With the overlay on, each member Node's
//! published annotations ([`overlay::annotations`]) likewise, and a Warning event on a Node
//! newly refused from the mesh.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};

use super::events;
use super::metrics::WriteKind;
use crate::api::{Intercept, PortMap, PortMapClass, PortMapStatus};
use crate::compute::conditions::{condition, keep_time};
use crate::compute::overlay;
use crate::compute::portmap::status::{self, reason};
use crate::compute::{ObjectKey, Outputs};
use crate::observe::kubernetes::Stores;
use crate::stream::Hub;
use crate::stream::hub::Gate;

/// The field manager of every status write.
pub const FIELD_MANAGER: &str = "kuport-controller";
/// The field manager of the overlay's Node annotations: its own, so `managedFields` tell
/// kuport's two keys apart from everything else on the Node.
pub const OVERLAY_FIELD_MANAGER: &str = "kuport-controller-overlay";
/// Status writes wait this long for more acknowledgements to arrive together.
const STATUS_DEBOUNCE: Duration = Duration::from_millis(50);
/// After becoming leader, a node whose executor has not reconnected yet is not counted as
/// pending for this long (executors reconnect within their 5 s backoff cap), so a failover
/// or restart does not flap Programmed statuses it has no news about.
pub const RECONNECT_GRACE: Duration = Duration::from_secs(10);

/// Writes what the leader decided.
pub struct Writer {
    client: Client,
    stores: Stores,
    hub: Arc<Hub>,
    recorder: Recorder,
    /// Per node, the overlay refusals an event was published for (only new ones get one).
    overlay_said: Mutex<BTreeMap<String, BTreeSet<events::Said>>>,
}

impl Writer {
    pub fn new(client: Client, stores: Stores, hub: Arc<Hub>, instance: Option<String>) -> Arc<Self> {
        let reporter = Reporter { controller: FIELD_MANAGER.into(), instance };
        let recorder = Recorder::new(client.clone(), reporter);
        Arc::new(Writer { client, stores, hub, recorder, overlay_said: Mutex::default() })
    }

    /// Asked before every write: see [`crate::stream::leader::Leadership::leads`].
    fn leading(&self) -> bool {
        self.hub.leadership().borrow().leads()
    }

    /// Writes every class status that differs from the stored one; false when one failed.
    async fn write_classes(&self, out: &Outputs) -> bool {
        let mut ok = true;
        for (name, st) in out.classes.iter() {
            if !self.leading() {
                return false;
            }
            let Some(stored) = self.stores.class(name) else { continue };
            if stored.status.as_ref() == Some(st) {
                continue;
            }
            let api: Api<PortMapClass> = Api::all(self.client.clone());
            let patch = Patch::Merge(serde_json::json!({ "status": st }));
            self.hub.metrics().api_write(WriteKind::ClassStatus);
            match api.patch_status(name, &PatchParams::apply(FIELD_MANAGER), &patch).await {
                Ok(_) => {
                    tracing::info!(class = %name, "class status written");
                    let reference = stored.object_ref(&());
                    for e in events::of_class_change(stored.status.as_ref(), st) {
                        self.hub.metrics().api_write(WriteKind::Event);
                        if let Err(err) = self.recorder.publish(&e, &reference).await {
                            tracing::warn!(class = %name, error = %err, "publishing an event");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(class = %name, error = %e, "writing class status");
                    ok = false;
                }
            }
        }
        ok
    }

    /// Writes every PortMap status that differs from the stored one, with Programmed held at
    /// Pending until each node that must apply the mapping acknowledged a state holding it as
    /// computed now ([`Hub::unacked`]).
    /// `young`: this term's reconnect grace has not ended, so a node without news of its
    /// executor keeps the status stored before.
    async fn write_port_maps(&self, young: bool) {
        let (out, _) = self.hub.outputs();
        // Per node: whether its executor is counted (false while there is no news of it yet).
        let nodes: BTreeMap<String, bool> = self
            .hub
            .nodes()
            .into_iter()
            .map(|v| {
                let news = v.connected || v.acked.is_some();
                (v.node, news || !young)
            })
            .collect();
        let now = Timestamp::now();
        for (key, computed) in out.port_maps.iter() {
            if !self.leading() {
                return;
            }
            let Some(stored) = self.stores.port_map(key) else { continue };
            let object = ObjectKey::port_map(&key.0, &key.1);
            let must = out.must_ack(&object);
            if stored.status.is_some() && must.iter().any(|n| nodes.get(n) == Some(&false)) {
                // Keep what is stored until the executor reconnects or the grace ends.
                continue;
            }
            let pending = self.hub.unacked(&object, must.to_vec());
            let st = with_pending(computed, stored.status.as_ref(), &pending, stored.metadata.generation, now);
            if stored.status.as_ref() == Some(&st) {
                continue;
            }
            let api: Api<PortMap> = Api::namespaced(self.client.clone(), &key.0);
            let patch = Patch::Merge(serde_json::json!({ "status": st }));
            self.hub.metrics().api_write(WriteKind::PortMapStatus);
            match api.patch_status(&key.1, &PatchParams::apply(FIELD_MANAGER), &patch).await {
                Ok(_) => {
                    tracing::info!(portmap = %format!("{}/{}", key.0, key.1), "status written");
                    self.events(&stored, stored.status.as_ref(), &st).await;
                }
                Err(e) => tracing::warn!(portmap = %format!("{}/{}", key.0, key.1), error = %e, "writing status"),
            }
        }
    }

    /// Writes every Intercept status that differs from the stored one: a placed pod counts as
    /// programmed once its node acknowledged a state holding it; a pod whose namespace its
    /// node's executor could not find is reported with the executor's reason
    /// (`compute::intercept::pods::finish`).
    async fn write_intercepts(&self, young: bool) {
        let (out, _) = self.hub.outputs();
        let snapshots = self.hub.nodes();
        let news: BTreeMap<String, bool> =
            snapshots.iter().map(|v| (v.node.clone(), v.connected || v.acked.is_some() || !young)).collect();
        let refused: BTreeMap<String, Vec<(String, String)>> = snapshots
            .iter()
            .map(|v| (v.node.clone(), v.errors.iter().map(|e| (e.object.clone(), e.reason.clone())).collect()))
            .collect();
        let now = Timestamp::now();
        for (key, computed) in out.intercepts.iter() {
            if !self.leading() {
                return;
            }
            let Some(stored) = self.stores.intercept(key) else { continue };
            let object = ObjectKey::intercept(&key.0, &key.1);
            let must = out.must_ack(&object);
            if stored.status.is_some() && must.iter().any(|n| news.get(n) == Some(&false)) {
                continue;
            }
            let pending = self.hub.unacked(&object, must.to_vec());
            let placed = out.intercept_pods.get(key).map(Vec::as_slice).unwrap_or(&[]);
            let st = crate::compute::intercept::pods::finish(
                key,
                computed,
                placed,
                &refused,
                &pending,
                stored.status.as_ref(),
                now,
            );
            if stored.status.as_ref() == Some(&st) {
                continue;
            }
            let api: Api<Intercept> = Api::namespaced(self.client.clone(), &key.0);
            let patch = Patch::Merge(serde_json::json!({ "status": st }));
            self.hub.metrics().api_write(WriteKind::InterceptStatus);
            match api.patch_status(&key.1, &PatchParams::apply(FIELD_MANAGER), &patch).await {
                Ok(_) => {
                    tracing::info!(intercept = %format!("{}/{}", key.0, key.1), "status written");
                    let reference = stored.object_ref(&());
                    for e in events::of_intercept_change(&key.0, stored.status.as_ref(), &st) {
                        if !self.leading() {
                            return;
                        }
                        self.hub.metrics().api_write(WriteKind::Event);
                        if let Err(err) = self.recorder.publish(&e, &reference).await {
                            tracing::warn!(intercept = %format!("{}/{}", key.0, key.1), error = %err, "publishing an event");
                        }
                    }
                }
                Err(e) => tracing::warn!(intercept = %format!("{}/{}", key.0, key.1), error = %e, "writing status"),
            }
        }
    }

    /// With the overlay on: publishes each member's annotations on its Node and removes them from
    /// every other Node the compute judged (a merge patch of only those keys, when they
    /// differ), with an event on a member's Node for each peer whose route changed, and a
    /// Warning event on a Node for each new reason it is refused. `young`: this term's
    /// reconnect grace has not ended, so a Node is written only once it and its peers were
    /// served in this term ([`settled`]): a failover writes nothing that did not change.
    async fn write_nodes(&self, young: bool) {
        if self.hub.settings().overlay.is_none() {
            return;
        }
        let (out, _) = self.hub.outputs();
        let wanted = overlay::annotations(&out.overlay);
        let held_labels = overlay::labels(&out.overlay);
        let api: Api<Node> = Api::all(self.client.clone());
        let params = PatchParams { field_manager: Some(OVERLAY_FIELD_MANAGER.into()), ..Default::default() };
        for (name, place) in out.overlay.iter() {
            if !self.leading() {
                return;
            }
            let Some(node) = self.stores.node(name) else { continue };
            // In the grace, only once the member's own report is in too: before it, its peers
            // annotation would say "unknown" and be written again when the report comes.
            if young && !(settled(name, place, |n| self.hub.served_this_term(n)) && self.hub.reported(name)) {
                continue;
            }
            let change = annotation_patch(node.metadata.annotations.as_ref(), wanted.get(name));
            let held = label_patch(node.metadata.labels.as_ref(), held_labels.get(name));
            if change.is_some() || held.is_some() {
                let before = events::stored_routes(node.metadata.annotations.as_ref());
                let mut metadata = serde_json::Map::new();
                if let Some(change) = change {
                    metadata.insert("annotations".into(), change.into());
                }
                if let Some(held) = held {
                    metadata.insert("labels".into(), held.into());
                }
                let patch = Patch::Merge(serde_json::json!({ "metadata": metadata }));
                self.hub.metrics().api_write(WriteKind::NodeAnnotations);
                match api.patch(name, &params, &patch).await {
                    Ok(_) => {
                        tracing::info!(node = %name, "overlay annotations written");
                        // Only once the routes' change is stored: a failed write is tried again
                        // and would say it twice.
                        let reference = node.object_ref(&());
                        for e in events::of_route_change(name, before.as_ref(), &out.overlay) {
                            if !self.leading() {
                                return;
                            }
                            tracing::info!(node = %name, reason = %e.reason, note = e.note.as_deref().unwrap_or(""), "overlay route changed");
                            self.hub.metrics().api_write(WriteKind::Event);
                            if let Err(err) = self.recorder.publish(&e, &reference).await {
                                tracing::warn!(node = %name, error = %err, "publishing an event");
                            }
                        }
                    }
                    Err(e) => tracing::warn!(node = %name, error = %e, "writing the overlay annotations"),
                }
            }
            let before = self.said(name);
            let new = events::said(&place.refused);
            if before == new {
                continue;
            }
            let reference = node.object_ref(&());
            for e in events::of_overlay_refusal(&before, &place.refused) {
                if !self.leading() {
                    return;
                }
                self.hub.metrics().api_write(WriteKind::Event);
                if let Err(err) = self.recorder.publish(&e, &reference).await {
                    tracing::warn!(node = %name, error = %err, "publishing an event");
                }
            }
            self.remember(name, new);
        }
    }

    fn said(&self, node: &str) -> BTreeSet<events::Said> {
        self.overlay_said.lock().map(|s| s.get(node).cloned().unwrap_or_default()).unwrap_or_default()
    }

    fn remember(&self, node: &str, said: BTreeSet<events::Said>) {
        if let Ok(mut s) = self.overlay_said.lock() {
            s.insert(node.to_string(), said);
        }
    }

    /// Publishes the events a status change warrants ([`events::of_change`]).
    async fn events(&self, pm: &PortMap, old: Option<&PortMapStatus>, new: &PortMapStatus) {
        let reference = pm.object_ref(&());
        for e in events::of_change(old, new) {
            if !self.leading() {
                return;
            }
            self.hub.metrics().api_write(WriteKind::Event);
            if let Err(err) = self.recorder.publish(&e, &reference).await {
                tracing::warn!(name = %pm.name_any(), error = %err, "publishing an event");
            }
        }
    }

    /// Writes PortMap statuses whenever the hub says they may have changed, and once more
    /// when a new term's reconnect grace ends.
    pub async fn run(self: Arc<Self>) {
        let grace_from_now =
            |leader: bool| leader.then(|| tokio::time::Instant::now() + RECONNECT_GRACE + STATUS_DEBOUNCE);
        let mut leadership = self.hub.leadership();
        let mut grace_end = grace_from_now(leadership.borrow_and_update().leader);
        loop {
            let grace = async {
                match grace_end {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.hub.status_dirty() => {}
                changed = leadership.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    grace_end = grace_from_now(leadership.borrow_and_update().leader);
                    continue;
                }
                _ = grace => grace_end = None,
            }
            tokio::time::sleep(STATUS_DEBOUNCE).await;
            // A term that began during the debounce starts its grace before this write, which
            // would otherwise count the executors not reconnected yet as pending.
            if leadership.has_changed().unwrap_or(false) {
                grace_end = grace_from_now(leadership.borrow_and_update().leader);
            }
            if self.leading() {
                let young = grace_end.is_some_and(|t| tokio::time::Instant::now() < t);
                self.write_port_maps(young).await;
                self.write_intercepts(young).await;
                self.write_nodes(young).await;
            }
        }
    }
}

impl Gate for Writer {
    fn before_publish(
        self: Arc<Self>,
        outputs: Arc<Outputs>,
    ) -> Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
        Box::pin(async move { !self.leading() || self.write_classes(&outputs).await })
    }
}

/// Whether node `name`'s overlay annotations may be written while this term is young: it and
/// every peer were `served` in this term, so what was computed for them reads their
/// executors' reports (docs/overlay/status.md, "A new leader"). Before that, a new leader's
/// routes and peer states would say direct and unknown for a moment.
fn settled(name: &str, place: &overlay::NodeOverlay, served: impl Fn(&str) -> bool) -> bool {
    served(name) && place.peers().all(|p| served(p))
}

/// The merge patch of a Node's annotations that takes the published keys from `have` to `want`
/// (a null removes one), or None when they agree. Other annotations are not touched.
fn annotation_patch(
    have: Option<&BTreeMap<String, String>>,
    want: Option<&BTreeMap<String, String>>,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    let mut change = serde_json::Map::new();
    for key in overlay::WRITTEN_ANNOTATIONS {
        let (h, w) = (have.and_then(|a| a.get(key)), want.and_then(|a| a.get(key)));
        if h != w {
            change.insert(key.to_string(), w.map_or(serde_json::Value::Null, |v| v.clone().into()));
        }
    }
    (!change.is_empty()).then_some(change)
}

/// The merge patch of a Node's labels that sets the ones the overlay writes to `want`
/// (`overlay::labels`), or None when they agree. Never a removal: a key stays held by its Node
/// while it is out of the mesh (docs/overlay/mesh.md, "Who holds a key").
fn label_patch(
    have: Option<&BTreeMap<String, String>>,
    want: Option<&BTreeMap<String, String>>,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    let change: serde_json::Map<String, serde_json::Value> = want
        .into_iter()
        .flatten()
        .filter(|(k, v)| have.and_then(|h| h.get(*k)) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone().into()))
        .collect();
    (!change.is_empty()).then_some(change)
}

/// `computed` with Programmed=False (Pending) while `pending` nodes have not applied it.
fn with_pending(
    computed: &PortMapStatus,
    stored: Option<&PortMapStatus>,
    pending: &[String],
    generation: Option<i64>,
    now: Timestamp,
) -> PortMapStatus {
    let mut st = computed.clone();
    let prev = stored.map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    for c in &mut st.conditions {
        if c.type_ != status::PROGRAMMED {
            continue;
        }
        if c.status == "True" && !pending.is_empty() {
            let message = format!("waiting for node {} to apply the state", pending.join(", "));
            *c = condition(prev, status::PROGRAMMED, false, reason::PENDING, message, generation, now);
        } else {
            // The stored transition time wins over the compute's when the status agrees.
            *c = keep_time(prev, c, generation, now);
        }
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::EndpointStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn programmed(t: &str) -> PortMapStatus {
        let when: Timestamp = t.parse().expect("time");
        PortMapStatus {
            endpoint: Some(EndpointStatus { node: "w".into(), address: "10.0.0.1".into(), ..Default::default() }),
            conditions: vec![condition(
                &[],
                status::PROGRAMMED,
                true,
                reason::PROGRAMMED,
                "on e".into(),
                Some(1),
                when,
            )],
            ..Default::default()
        }
    }

    #[test]
    fn the_key_label_is_set_when_it_differs_and_never_removed() {
        let map = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let held = overlay::KEY_HELD_LABEL;
        let want: BTreeMap<String, String> = map(&[(held, "aa")]);
        let other: BTreeMap<String, String> = map(&[("kubernetes.io/hostname", "n")]);
        let patch = label_patch(Some(&other), Some(&want)).expect("a patch");
        assert_eq!(serde_json::Value::Object(patch), serde_json::json!({ held: "aa" }));
        assert_eq!(label_patch(Some(&want), Some(&want)), None);
        let patch = label_patch(Some(&map(&[(held, "bb")])), Some(&want)).expect("a new key");
        assert_eq!(serde_json::Value::Object(patch), serde_json::json!({ held: "aa" }));
        assert_eq!(label_patch(Some(&want), None), None, "a node out of the mesh keeps its key held");
    }

    #[test]
    fn node_annotations_are_patched_only_when_they_differ_and_removed_on_leaving() {
        let map = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let (key, endpoint) = (overlay::PUBLIC_KEY_ANNOTATION, overlay::ENDPOINT_ANNOTATION);
        let want: BTreeMap<String, String> = map(&[(key, "K"), (endpoint, "203.0.113.1:51820")]);
        // Another annotation (the operator's override included) is never touched.
        let other = overlay::EXTERNAL_ENDPOINT_ANNOTATION;
        let fresh: BTreeMap<String, String> = map(&[(other, "203.0.113.1")]);
        let patch = annotation_patch(Some(&fresh), Some(&want)).expect("a patch");
        assert_eq!(serde_json::Value::Object(patch), serde_json::json!({ key: "K", endpoint: "203.0.113.1:51820" }));
        let mut done = fresh.clone();
        done.extend(want.clone());
        assert_eq!(annotation_patch(Some(&done), Some(&want)), None, "nothing to write");
        // A member whose endpoint went away, then a node out of the mesh: nulls remove them.
        let keyed: BTreeMap<String, String> = map(&[(key, "K")]);
        let patch = annotation_patch(Some(&done), Some(&keyed)).expect("a patch");
        assert_eq!(serde_json::Value::Object(patch), serde_json::json!({ endpoint: null }));
        let patch = annotation_patch(Some(&done), None).expect("a patch");
        assert_eq!(serde_json::Value::Object(patch), serde_json::json!({ key: null, endpoint: null }));
        assert_eq!(annotation_patch(Some(&fresh), None), None, "never had them");
        assert_eq!(annotation_patch(None, None), None);
        // The routes (docs/overlay/relays.md): written when they change, alone.
        let routes = overlay::ROUTES_ANNOTATION;
        let mut relayed = want.clone();
        relayed.insert(routes.into(), r#"{"b":"via r"}"#.into());
        let patch = annotation_patch(Some(&done), Some(&relayed)).expect("a patch");
        assert_eq!(serde_json::Value::Object(patch), serde_json::json!({ routes: r#"{"b":"via r"}"# }));
        done.extend(relayed.clone());
        assert_eq!(annotation_patch(Some(&done), Some(&relayed)), None);
    }

    #[test]
    fn a_young_term_writes_a_node_once_it_and_its_peers_were_served() {
        let routes =
            ["cloud", "home-b"].map(|p| (p.to_string(), overlay::relays::PeerRoute::Direct)).into_iter().collect();
        let place = overlay::NodeOverlay { routes, ..Default::default() };
        let served = |names: &'static [&'static str]| move |n: &str| names.contains(&n);
        assert!(!settled("home-a", &place, served(&["cloud", "home-b"])), "itself");
        assert!(!settled("home-a", &place, served(&["home-a", "cloud"])), "a peer");
        assert!(settled("home-a", &place, served(&["home-a", "cloud", "home-b"])));
        let refused = overlay::NodeOverlay::default();
        assert!(settled("off", &refused, served(&["off"])), "a node with no peers: itself only");
    }

    #[test]
    fn programmed_waits_for_every_node_then_keeps_its_time() {
        let now: Timestamp = "2026-11-29T12:00:00Z".parse().expect("time");
        let computed = programmed("2026-11-29T11:00:00Z");
        let pending = with_pending(&computed, None, &["w".to_string()], Some(1), now);
        let c = &pending.conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason::PENDING));
        assert_eq!(c.message, "waiting for node w to apply the state");
        // Once acknowledged: True, stamped now (it was False before).
        let later: Timestamp = "2026-11-29T12:00:05Z".parse().expect("time");
        let done = with_pending(&computed, Some(&pending), &[], Some(1), later);
        assert_eq!(done.conditions[0].status, "True");
        assert_eq!(done.conditions[0].last_transition_time, Time(later));
        // Unchanged afterwards: the same status, so nothing to write.
        let again = with_pending(&computed, Some(&done), &[], Some(1), "2026-11-29T13:00:00Z".parse().expect("time"));
        assert_eq!(again, done);
    }
}
