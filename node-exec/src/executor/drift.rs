//! Keeping a state: the drift check (compare, and re-apply on a difference) and the loop that
//! runs it on change notifications, on a backstop timer and after failures.

use std::future::Future;
use std::time::Duration;

use kuport_proto::v1::NetnsState;
use tokio::sync::mpsc;

use super::{Command, ExecError, Executor};
use crate::{nft, rtnl};

/// How long a burst of change notifications is collected before one check: a deleted link
/// takes its addresses and routes with it, each announced on its own.
pub const DEBOUNCE: Duration = Duration::from_millis(50);
/// How often the kernel is checked without any notification (a lost or missed event).
pub const BACKSTOP: Duration = Duration::from_secs(30);
/// The first retry after a failed apply or repair; later ones double up to [`BACKSTOP`].
pub const RETRY_FIRST: Duration = Duration::from_millis(250);
/// How often the WireGuard devices of a state are read back: WireGuard announces no change to
/// its peers (`wg set ... peer K remove` is silent), so the keep loop polls them, as the
/// overlay note's agents watch their peers every 10 s.
pub const WIREGUARD_POLL: Duration = Duration::from_secs(10);
/// How often a namespace kept by reference is checked to be still reachable: our own watch
/// sockets keep it alive, so its end shows only as its file or pod being gone. A quarter second,
/// so that a restarted pod's new sandbox is programmed within a second (sync::NodeKeepers); the
/// check is one stat while the namespace's last path still is it.
const REACHABLE_EVERY: Duration = Duration::from_millis(250);

impl Executor {
    /// One drift check: when the kernel differs from the desired state, re-applies it. Returns
    /// the differences found (empty: nothing to do, which is also what our own writes cause).
    pub fn check(&mut self) -> Vec<String> {
        let Some(desired) = self.desired.clone() else { return Vec::new() };
        let found = match self.differences(&desired) {
            Ok(d) => d,
            Err(e) => {
                self.stats.lock().last_error = Some(e.to_string());
                return Vec::new();
            }
        };
        if found.is_empty() {
            self.drifting = false;
            return found;
        }
        {
            let mut stats = self.stats.lock();
            if !self.drifting {
                stats.drift_repairs += 1;
            }
            stats.last_differences = found.clone();
        }
        self.drifting = true;
        // The kernel changed under the steps: the repair must start from what it holds.
        for applier in self.tables.values_mut() {
            applier.forget();
        }
        self.tables_present = None;
        self.objects_known = false;
        if self.apply_shared(desired).is_ok() {
            self.drifting = false;
        }
        found
    }

    /// Applies `desired`, then keeps it until `stop` completes: waits for link, address,
    /// neighbour, route, rule and nftables change notifications (or the [`BACKSTOP`] timer),
    /// collects a burst for [`DEBOUNCE`], then [`Executor::check`]s. A failed apply is recorded
    /// in the stats and retried at the next check. Never tears anything down on exit.
    pub async fn keep<F: Future<Output = ()>>(&mut self, desired: &NetnsState, stop: F) -> Result<(), ExecError> {
        let (_commands, rx) = mpsc::channel(1);
        self.keep_loop(Some(desired), rx, stop).await
    }

    /// Like [`Executor::keep`], but the state to keep arrives as [`Command`]s (each answered
    /// with its apply's result); ends when every sender is dropped, or with
    /// [`ExecError::Gone`] once a namespace kept by reference can no longer be reached.
    pub async fn serve(&mut self, commands: mpsc::Receiver<Command>) -> Result<(), ExecError> {
        self.keep_loop(None, commands, std::future::pending()).await
    }

    async fn keep_loop<F: Future<Output = ()>>(
        &mut self,
        initial: Option<&NetnsState>,
        mut commands: mpsc::Receiver<Command>,
        stop: F,
    ) -> Result<(), ExecError> {
        // Subscribe first, so that no change after the apply goes unnoticed.
        let mut links = rtnl::subscribe(self.netns.as_deref())
            .map_err(|e| ExecError::Watch { what: "rtnetlink", reason: e.to_string() })?;
        let mut tables = nft::watch::subscribe(self.netns.as_deref())
            .map_err(|e| ExecError::Watch { what: "nftables", reason: e.to_string() })?;
        if let Some(desired) = initial {
            // Failures are in the stats; the next check retries.
            let _ = self.apply(desired);
        }
        let mut backstop = tokio::time::interval(BACKSTOP);
        backstop.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        backstop.tick().await;
        let mut wireguard = tokio::time::interval(WIREGUARD_POLL);
        wireguard.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        wireguard.tick().await;
        let mut reachable = tokio::time::interval(REACHABLE_EVERY);
        reachable.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut open = true;
        // A failed apply or repair is tried again after RETRY_FIRST, doubling up to BACKSTOP,
        // rather than waiting for the next notification (a transient refusal under load).
        let mut retry_after = RETRY_FIRST;
        let mut retry = self.stats.get().last_error.is_some().then(|| tokio::time::Instant::now() + retry_after);
        tokio::pin!(stop);
        loop {
            let retry_due = async {
                match retry {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut stop => return Ok(()),
                _ = retry_due => {}
                c = commands.recv(), if open => match c {
                    Some(Command::Apply(state, reply)) => {
                        let result = self.apply_shared(state);
                        // Our own writes are not drift.
                        links.drain();
                        tables.drain();
                        retry_after = RETRY_FIRST;
                        retry = result.is_err().then(|| tokio::time::Instant::now() + retry_after);
                        let _ = reply.send(result);
                        continue;
                    }
                    None if initial.is_none() => return Ok(()),
                    None => open = false,
                },
                n = links.recv() => if n.is_none() {
                    return Err(ExecError::Watch { what: "rtnetlink", reason: "subscription ended".into() });
                },
                n = tables.recv() => if n.is_none() {
                    return Err(ExecError::Watch { what: "nftables", reason: "subscription ended".into() });
                },
                _ = reachable.tick(), if self.held.is_some() => {
                    if let Some(held) = self.held.as_mut()
                        && !held.reachable()
                    {
                        return Err(ExecError::Gone { what: held.to_string() });
                    }
                    continue;
                }
                _ = wireguard.tick(), if self.desired.as_ref().is_some_and(|d| !d.wireguard_devices.is_empty()) => {
                    let desired = self.desired.clone();
                    if !desired.is_some_and(|d| self.wireguard_drift(&d)) {
                        continue;
                    }
                }
                _ = backstop.tick() => {}
            }
            tokio::time::sleep(DEBOUNCE).await;
            links.drain();
            tables.drain();
            self.check();
            // What the repair itself caused is checked by the next round, and finds nothing.
            if self.drifting || self.stats.get().last_error.is_some() {
                retry = Some(tokio::time::Instant::now() + retry_after);
                retry_after = (retry_after * 2).min(BACKSTOP);
            } else {
                retry = None;
                retry_after = RETRY_FIRST;
            }
        }
    }
}
