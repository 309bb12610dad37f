//! Who leads. Only the leader serves NodeSync; its term fences the states it sends, so an
//! executor never goes back to an old leader's state.

use std::time::Duration;

use tokio::sync::watch;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub leader: bool,
    /// Grows with every new leader; the standalone controller uses its start time in ms.
    pub term: u64,
    /// host:port of the leader's NodeSync, empty when unknown.
    pub leader_address: String,
}

/// A controller that always leads (standalone: one replica reading a manifest folder).
pub fn standalone(advertise: String) -> (watch::Sender<Leadership>, watch::Receiver<Leadership>) {
    let term = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    watch::channel(Leadership { leader: true, term, leader_address: advertise })
}

/// How long a lease holds without renewal: a killed leader is replaced within this plus up
/// to a second (the bound is 5 s).
pub const LEASE_SECONDS: u64 = 3;
/// The holder renews this long before expiry.
pub const RENEW_BEFORE_SECONDS: u64 = 1;

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

/// What ended one wait of the election loop.
enum Step {
    Stop(Option<tokio::sync::oneshot::Sender<()>>),
    Changed(Result<bool, kube_lease_manager::LeaseManagerError>),
    /// A follower saw the lease released: try to take it now.
    Released,
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
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::runtime::{WatchStreamExt, watcher};

    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), name)
        .with_namespace(namespace)
        .with_identity(holder(identity, advertise))
        .with_duration(LEASE_SECONDS)
        .with_grace(RENEW_BEFORE_SECONDS)
        .with_create_mode(kube_lease_manager::LeaseCreateMode::AutoCreate)
        .build()
        .await?;
    let (tx, rx) = watch::channel(Leadership { leader: false, term: 0, leader_address: String::new() });
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<tokio::sync::oneshot::Sender<()>>();
    let advertise = advertise.to_string();
    let leases: kube::Api<Lease> = kube::Api::namespaced(client, namespace);
    let fields = format!("metadata.name={name}");
    tokio::spawn(async move {
        let mut lease_events =
            std::pin::pin!(watcher(leases, watcher::Config::default().fields(&fields)).default_backoff());
        loop {
            // `changed` renews the lease while leading and waits for it otherwise; it runs on
            // across Lease events (our own renewals among them), and is restarted only when a
            // follower sees the lease released, so it takes over at once instead of sleeping
            // until the old expiry.
            let step = {
                let mut changed = std::pin::pin!(manager.changed());
                loop {
                    tokio::select! {
                        done = &mut stop_rx => break Step::Stop(done.ok()),
                        r = &mut changed => break Step::Changed(r),
                        event = lease_events.next() => match event {
                            Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) => {
                                let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
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
                    let term = new_term();
                    tracing::info!(term, "leading");
                    tx.send_replace(Leadership { leader: true, term, leader_address: advertise.clone() });
                }
                Step::Changed(Ok(false)) => {
                    tracing::warn!("lost the lease: no more writes");
                    tx.send_modify(|l| l.leader = false);
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
