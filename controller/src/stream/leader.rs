//! Who leads. Only the leader serves NodeSync; its term fences the states it sends, so an
//! executor never goes back to an old leader's state.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub leader: bool,
    /// Grows with every new leader; the standalone controller uses its start time in ms.
    pub term: u64,
    /// host:port of the leader's NodeSync, empty when unknown.
    pub leader_address: String,
    /// While leading on a Lease: when writes must stop unless the lease was renewed first
    /// (see [`Leadership::leads`]); renewals move it on without notifying receivers. None:
    /// no lease (standalone).
    pub until: Option<Instant>,
}

impl Leadership {
    /// Whether this replica may write statuses and send states now. `leader` alone can be
    /// stale: a replica frozen (SIGSTOP, a paused VM) or cut off from the API server past its
    /// lease still says true until its next renewal fails, while another replica already
    /// leads; on resuming it ran its pending work before learning that. The lease's end by
    /// the local clock needs no round trip, so every write path asks this.
    pub fn leads(&self) -> bool {
        self.leader && self.until.is_none_or(|t| Instant::now() < t)
    }
}

/// A controller that always leads (standalone: one replica reading a manifest folder).
pub fn standalone(advertise: String) -> (watch::Sender<Leadership>, watch::Receiver<Leadership>) {
    let term = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    watch::channel(Leadership { leader: true, term, leader_address: advertise, until: None })
}

/// How long a lease holds without renewal: a killed leader is replaced within this plus up
/// to a second (the bound is 5 s).
pub const LEASE_SECONDS: u64 = 3;
/// The holder renews this long before expiry.
pub const RENEW_BEFORE_SECONDS: u64 = 1;
/// A leader stops writing this long before its lease ends by its own clock, so a write sent
/// just before still lands before a follower can take over; the renewal, sent 1 s before the
/// end, has the rest of that second to be seen.
pub const WRITE_MARGIN: Duration = Duration::from_millis(500);

/// The term of a leadership that starts now: the wall clock in ms. A new leader can only
/// start after the old lease expired, so its term is greater unless clocks differ by more
/// than the old leader's whole tenure; a lease counter would reset with the Lease object.
fn new_term() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Holder identities carry the NodeSync address, so followers can send executors there.
fn holder(identity: &str, advertise: &str) -> String {
    format!("{identity}@{advertise}")
}

fn address_of(holder: &str) -> String {
    holder.rsplit_once('@').map(|(_, a)| a.to_string()).unwrap_or_default()
}

/// Where executors go once this replica (`me`) stopped leading: the last holder seen, unless
/// that is still itself (then unknown).
fn elsewhere(seen: &str, me: &str) -> String {
    if seen == me { String::new() } else { address_of(seen) }
}

/// When `me`'s writes must stop under `lease`, on the local monotonic clock: its renewTime
/// (set from this replica's own clock) plus its duration, less [`WRITE_MARGIN`]. None when
/// `me` does not hold it.
fn writes_until(lease: &Lease, me: &str) -> Option<Instant> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(me) {
        return None;
    }
    let renewed = SystemTime::from(spec.renew_time.as_ref()?.0);
    let end = renewed + Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
    let left = end.duration_since(SystemTime::now()).unwrap_or_default();
    Some(Instant::now() + left.saturating_sub(WRITE_MARGIN))
}

/// What ended one wait of the election loop.
enum Step {
    Stop(Option<tokio::sync::oneshot::Sender<()>>),
    Changed(Result<bool, kube_lease_manager::LeaseManagerError>),
    /// A follower saw the lease released: try to take it now.
    Released,
    /// The leader's lease ran out by the local clock before a renewal was seen.
    Lapsed,
}

/// Leader election on a Lease. The returned handle releases the lease when told to stop (a
/// graceful shutdown hands over in about a second).
pub async fn kubernetes(
    client: kube::Client,
    namespace: &str,
    name: &str,
    identity: &str,
    advertise: &str,
) -> Result<
    (watch::Receiver<Leadership>, tokio::sync::oneshot::Sender<tokio::sync::oneshot::Sender<()>>),
    kube_lease_manager::LeaseManagerError,
> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};

    let me = holder(identity, advertise);
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), name)
        .with_namespace(namespace)
        .with_identity(me.clone())
        .with_duration(LEASE_SECONDS)
        .with_grace(RENEW_BEFORE_SECONDS)
        .with_create_mode(kube_lease_manager::LeaseCreateMode::AutoCreate)
        .build()
        .await?;
    let (tx, rx) = watch::channel(Leadership { leader: false, term: 0, leader_address: String::new(), until: None });
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<tokio::sync::oneshot::Sender<()>>();
    let advertise = advertise.to_string();
    let leases: kube::Api<Lease> = kube::Api::namespaced(client, namespace);
    let fields = format!("metadata.name={name}");
    let name = name.to_string();
    tokio::spawn(async move {
        let mut lease_events =
            std::pin::pin!(watcher(leases.clone(), watcher::Config::default().fields(&fields)).default_backoff());
        // The holder of the latest Lease event.
        let mut seen = String::new();
        loop {
            // `changed` renews the lease while leading and waits for it otherwise; it runs on
            // across Lease events (our own renewals among them), and is restarted only when a
            // follower sees the lease released, so it takes over at once instead of sleeping
            // until the old expiry. Lease events come first, so a leader resuming from a freeze
            // knows the new holder before its lease lapses.
            let step = {
                let mut changed = std::pin::pin!(manager.changed());
                loop {
                    let until = {
                        let l = tx.borrow();
                        l.until.filter(|_| l.leader)
                    };
                    let lapse = async move {
                        match until {
                            Some(t) => tokio::time::sleep_until(t).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        biased;
                        done = &mut stop_rx => break Step::Stop(done.ok()),
                        event = lease_events.next() => match event {
                            Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) => {
                                if tx.borrow().leader {
                                    // Our own renewal moves the end on; nothing else changed,
                                    // so receivers are not woken.
                                    if let Some(t) = writes_until(&lease, &me) {
                                        tx.send_if_modified(|l| {
                                            l.until = l.until.max(Some(t));
                                            false
                                        });
                                    }
                                }
                                let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                                seen.clone_from(&holder);
                                if !tx.borrow().leader {
                                    tx.send_if_modified(|l| {
                                        let address = address_of(&holder);
                                        let changed = l.leader_address != address;
                                        l.leader_address = address;
                                        changed
                                    });
                                    if holder.is_empty() {
                                        break Step::Released;
                                    }
                                }
                            }
                            Some(Err(e)) => tracing::warn!(error = %e, "watching the lease"),
                            _ => {}
                        },
                        () = lapse => break Step::Lapsed,
                        r = &mut changed => break Step::Changed(r),
                    }
                }
            };
            match step {
                Step::Stop(done) => {
                    if tx.borrow().leader {
                        tx.send_modify(|l| l.leader = false);
                        if let Err(e) = manager.release().await {
                            tracing::warn!(error = %e, "releasing the lease");
                        }
                    }
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                    return;
                }
                Step::Changed(Ok(true)) => {
                    // The lease as written by the acquisition says how long it holds (its
                    // Lease event may not have been seen yet). Unreadable: do not write, so
                    // the lapse below steps down at once.
                    let until = match leases.get(&name).await {
                        Ok(lease) => writes_until(&lease, &me),
                        Err(e) => {
                            tracing::warn!(error = %e, "reading the lease just taken");
                            None
                        }
                    };
                    let term = new_term();
                    tracing::info!(term, "leading");
                    tx.send_replace(Leadership {
                        leader: true,
                        term,
                        leader_address: advertise.clone(),
                        until: Some(until.unwrap_or_else(Instant::now)),
                    });
                }
                Step::Changed(Ok(false)) => {
                    if tx.borrow().leader {
                        tracing::warn!("lost the lease: no more writes");
                    }
                    tx.send_modify(|l| {
                        l.leader = false;
                        l.leader_address = elsewhere(&seen, &me);
                    });
                }
                Step::Lapsed => {
                    tracing::warn!("the lease ran out before a renewal was seen: no more writes");
                    tx.send_modify(|l| {
                        l.leader = false;
                        l.leader_address = elsewhere(&seen, &me);
                    });
                    // The manager still counts itself the holder and would go on renewing: a
                    // release frees the lease if no follower took it yet, and makes its next
                    // `changed` report the loss.
                    if let Err(e) = manager.release().await {
                        tracing::warn!(error = %e, "releasing a lapsed lease");
                    }
                }
                Step::Changed(Err(e)) => {
                    tracing::warn!(error = %e, "lease");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Step::Released => {}
            }
        }
    });
    Ok((rx, stop_tx))
}
