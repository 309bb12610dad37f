//! The status writer (leader only): what the computation decided, written back to the API.
//! Slot claims and node facts go into class status before any node state uses them (the hub's
//! [`Gate`]); PortMap status once the executors that must apply a mapping acknowledged it
//! (Pending until then), and Intercept status likewise, with the [`events`] the change warrants. Only statuses
//! that differ from the stored ones are written.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};

use super::events;
use super::metrics::WriteKind;
use crate::api::{Intercept, PortMap, PortMapClass, PortMapStatus};
use crate::compute::conditions::{condition, keep_time};
use crate::compute::portmap::status::{self, reason};
use crate::compute::{ObjectKey, Outputs};
use crate::observe::kubernetes::Stores;
use crate::stream::Hub;
use crate::stream::hub::Gate;

/// The field manager of every status write.
pub const FIELD_MANAGER: &str = "kuport-controller";
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
}

impl Writer {
    pub fn new(client: Client, stores: Stores, hub: Arc<Hub>, instance: Option<String>) -> Arc<Self> {
        let reporter = Reporter { controller: FIELD_MANAGER.into(), instance };
        let recorder = Recorder::new(client.clone(), reporter);
        Arc::new(Writer { client, stores, hub, recorder })
    }

    /// Asked before every write: see [`crate::stream::leader::Leadership::leads`].
    fn leading(&self) -> bool {
        self.hub.leadership().borrow().leads()
    }

    /// Writes every class status that differs from the stored one; false when one failed.
    async fn write_classes(&self, out: &Outputs) -> bool {
        let mut ok = true;
        for (name, st) in &out.classes {
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
        for (key, computed) in &out.port_maps {
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
        for (key, computed) in &out.intercepts {
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
            endpoint: Some(EndpointStatus { node: "w".into(), address: "10.0.0.1".into() }),
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
