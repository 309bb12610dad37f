//! The NodeSync client: connect, say who we are, apply what arrives (fenced), answer, report,
//! and reconnect with capped exponential backoff and jitter when the stream ends.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kuport_proto::channel::{self, ChannelError};
use kuport_proto::v1::{
    Ack, ControllerMessage, CounterReport, DesiredState, DriftReport, ExecutorMessage, Hello, LinkCounters, NetnsState,
    NodeFacts, NodeState, ObjectError, PeerReport, PeerStatus, PodCounters, TableCounters, controller_message,
    executor_message,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::fence::Fence;
use super::{bounds, facts, store, wire};

/// The largest state the executor decodes; the controller sends none larger (docs/design.md,
/// "What the executor refuses").
pub use kuport_proto::channel::MAX_STATE_MESSAGE;
/// The largest message the executor sends: the controller decodes 4 MiB from an executor.
pub const MAX_UP_MESSAGE: usize = 4 * 1024 * 1024;
/// At most this many refused objects or drift differences go up in one message: the
/// controller accepts 4 MiB from an executor (docs/security.md), and the first ones say enough.
pub const MAX_REPORTED: usize = 1000;
/// At most this many peers go up in one report (the controller refuses more: 100 bytes each,
/// well within its 4 MiB).
pub const MAX_REPORTED_PEERS: usize = 10_000;
/// How often drift counters are looked at for a report.
const DRIFT_POLL: Duration = Duration::from_millis(200);
/// How long link and address changes are collected before the facts are read again.
const FACTS_DEBOUNCE: Duration = Duration::from_millis(100);
/// Facts are re-read this often even without a notification.
const FACTS_BACKSTOP: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct Config {
    /// The controller's NodeSync address, e.g. http://kuport-controller.kuport-system.svc:9443,
    /// or several separated by commas (replicas without a Service in front): a lost stream
    /// moves on to the next.
    pub controller: String,
    /// This node's Kubernetes name.
    pub node: String,
    /// The namespace the node's (host) entry is applied in; None: this process's.
    pub netns: Option<PathBuf>,
    /// Where the last applied state is kept across restarts; None: not kept.
    pub state_dir: Option<PathBuf>,
    /// The interface other nodes reach this one through; None: the default route's.
    pub underlay_interface: Option<String>,
    /// First reconnect delay; doubles per failure up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// The CA bundle (PEM) the controller is verified against; needed for https addresses. Read
    /// at every connect: a ConfigMap volume is updated in place.
    pub ca_file: Option<PathBuf>,
    /// The executor's ServiceAccount token, sent as `authorization: Bearer` on the Sync call.
    /// Read at every connect: the kubelet rotates it.
    pub token_file: Option<PathBuf>,
}

impl Config {
    pub fn new(controller: impl Into<String>, node: impl Into<String>) -> Self {
        Config {
            controller: controller.into(),
            node: node.into(),
            netns: None,
            state_dir: None,
            underlay_interface: None,
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
            ca_file: None,
            token_file: None,
        }
    }

    /// The configured addresses, in turn order.
    fn addresses(&self) -> Vec<String> {
        self.controller.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_string).collect()
    }

    /// Err when an address cannot work whatever the files hold: no scheme, an unknown one, or
    /// https without a CA file. For a clear error at start instead of endless reconnects.
    pub fn check(&self) -> Result<(), SyncError> {
        let addresses = self.addresses();
        if addresses.is_empty() {
            return Err(SyncError::Address { address: self.controller.clone(), reason: "no address".to_string() });
        }
        for address in addresses {
            match channel::endpoint(&address, None) {
                Ok(_) => {}
                Err(ChannelError::NoCa { .. }) if self.ca_file.is_some() => {}
                Err(e) => return Err(SyncError::Channel(e)),
            }
        }
        Ok(())
    }
}

/// What applies the states the controller sends (the real one is [`super::NodeKeepers`]; tests
/// use fakes to check what reaches the kernel).
pub trait NodeApplier: Send {
    /// Makes `state` the node's state and keeps it; Err names each refused object. Owned: a
    /// 50,000-mapping state is hundreds of thousands of allocations, not to be copied.
    fn apply(&mut self, state: NodeState) -> impl Future<Output = Result<(), Vec<ObjectError>>> + Send;
    /// Drift repaired so far (a growing count) and the last differences found.
    fn drift(&self) -> (u64, Vec<String>);
    /// What a namespace sent held (`ns`: its target and version) holds, whole: what the store
    /// keeps for it. None when it is not held at that version.
    fn held(&self, ns: &NetnsState) -> Option<Arc<NetnsState>> {
        let _ = ns;
        None
    }
    /// Called every drift poll: repairs what needs no new state (a pod's new sandbox).
    fn tend(&mut self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
    /// Every WireGuard peer of the node's devices as WireGuard holds it now, sorted by public
    /// key (docs/overlay/status.md); empty without devices.
    fn peers(&self) -> impl Future<Output = Vec<PeerStatus>> + Send {
        std::future::ready(Vec::new())
    }
    /// The bytes this node relayed between two of its peers: its relay rule's counter
    /// (docs/overlay/reach.md, "Relayed bytes"); 0 without one.
    fn relayed_bytes(&self) -> impl Future<Output = u64> + Send {
        std::future::ready(0)
    }
    /// Called every probe tick (`wireguard::reach::TICK`): sends the reach probes that are due
    /// and reads the peers' counters (docs/overlay/reach.md). True when some peer's reach
    /// changed, so that its report goes up at once rather than at the next poll.
    fn probe(&mut self) -> impl Future<Output = bool> + Send {
        std::future::ready(false)
    }
    /// The kernel's counters of the kuport tables of the host namespace, now
    /// (docs/operations/counters.md); Err says why they could not be read.
    fn counters(&self) -> impl Future<Output = Result<Vec<TableCounters>, String>> + Send {
        std::future::ready(Ok(Vec::new()))
    }
    /// The kernel's statistics of each link the host namespace's applied state names (its
    /// links and WireGuard devices), now; a link the kernel lacks is left out. Err says why
    /// they could not be read.
    fn link_counters(&self) -> impl Future<Output = Result<Vec<LinkCounters>, String>> + Send {
        std::future::ready(Ok(Vec::new()))
    }
    /// The counters of the kuport tables of each pod namespace the node's state programs, read
    /// inside it; a pod whose namespace cannot be read says why in its `error`.
    fn pod_counters(&self) -> impl Future<Output = Vec<PodCounters>> + Send {
        std::future::ready(Vec::new())
    }
}

/// What a peer report says: the peers and the relayed bytes.
type Peers = (Vec<PeerStatus>, u64);

/// The peer report to send, if `current` (the peers and the relayed bytes) differs from what
/// this stream carried last (`sent`, None: nothing yet), and records it as sent. Nothing is
/// sent for a node that never had peers. Bytes change under traffic, so a busy mesh reports at
/// most once per poll; relayed bytes alone change a report like the peers' bytes do.
fn peer_report(current: Peers, sent: &mut Option<Peers>, now: SystemTime) -> Option<PeerReport> {
    let unchanged = match sent.as_ref() {
        None => current.0.is_empty(),
        Some(last) => *last == current,
    };
    if unchanged {
        return None;
    }
    *sent = Some(current.clone());
    let read_unix_seconds = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (peers, relayed_bytes) = current;
    Some(PeerReport { peers: peers.into_iter().take(MAX_REPORTED_PEERS).collect(), read_unix_seconds, relayed_bytes })
}

/// The peers and relayed bytes as the applier reads them now.
async fn read_peers<A: NodeApplier>(applier: &A) -> Peers {
    let peers = applier.peers().await;
    let relayed = if peers.is_empty() { 0 } else { applier.relayed_bytes().await };
    (peers, relayed)
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("controller address {address:?}: {reason}")]
    Address { address: String, reason: String },
    #[error(transparent)]
    Channel(#[from] ChannelError),
    #[error("reading {what} {}: {reason}", path.display())]
    File { what: &'static str, path: PathBuf, reason: String },
    #[error("connecting to {address}: {reason}")]
    Connect { address: String, reason: String },
    #[error("stream with {address}: {status}")]
    Stream { address: String, status: tonic::Status },
    #[error("stream with {address} ended by the controller")]
    Ended { address: String },
}

/// How a session ended, when it was not an error.
enum Next {
    /// The replica is not the leader; reconnect to this one (None: the configured address).
    Leader(Option<String>),
}

/// Runs the executor's sync loop until `stop` completes: loads and keeps the stored state,
/// then connects, applies what arrives and reconnects forever. Nothing is torn down on exit.
pub async fn run<A: NodeApplier, F: Future<Output = ()>>(cfg: Config, mut applier: A, stop: F) {
    let mut fence = Fence::default();
    // The key first: the stored state's WireGuard devices need it.
    let public_key = cfg.state_dir.as_deref().and_then(wireguard_key);
    if let Some(dir) = &cfg.state_dir {
        match store::load(dir) {
            Ok(Some(mut stored)) => {
                let state = stored.state.take().unwrap_or_default();
                let outside = bounds::check(&state);
                let applied = if outside.is_empty() { applier.apply(state).await } else { Err(outside) };
                fence = match applied {
                    Ok(()) => {
                        tracing::info!(version = %stored.version, term = stored.term, "keeping the stored state");
                        Fence::from_applied(Some(kuport_proto::v1::Applied {
                            term: stored.term,
                            sequence: stored.sequence,
                            version: stored.version,
                        }))
                    }
                    // Claimed as applied, it would be acknowledged on a resend and never applied:
                    // the hello claims nothing, and the same state may be applied again.
                    Err(e) => {
                        tracing::warn!(version = %stored.version, errors = ?e, "the stored state was refused");
                        Fence::after_refused(stored.term, stored.sequence)
                    }
                };
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "ignoring the stored state"),
        }
    }
    let facts = watch_facts(cfg.netns.clone(), cfg.underlay_interface.clone(), public_key);
    let configured = cfg.addresses();
    let mut turn = 0usize;
    let mut target: Option<String> = None;
    let mut failures: u32 = 0;
    let mut jitter = Jitter::new();
    tokio::pin!(stop);
    loop {
        let address = target
            .clone()
            .or_else(|| configured.get(turn % configured.len().max(1)).cloned())
            .unwrap_or_else(|| cfg.controller.clone());
        let session = session(&cfg, &address, &mut applier, &mut fence, facts.clone());
        let outcome = tokio::select! {
            _ = &mut stop => return,
            o = session => o,
        };
        let delay = match outcome {
            Ok(Next::Leader(leader)) => {
                tracing::info!(from = %address, leader = ?leader, "following the leader");
                // A redirect is not a failure, but a follower that knows no leader yet must
                // not be asked again in a tight loop.
                let known = leader.is_some();
                if !known {
                    turn = turn.wrapping_add(1);
                }
                target = leader;
                if known { Duration::ZERO } else { Duration::from_millis(500) }
            }
            Err((e, connected)) => {
                if connected {
                    failures = 0;
                }
                tracing::warn!(error = %e, "controller stream lost");
                // A leader that went away: start again from the next configured address.
                if target.take().is_none() {
                    turn = turn.wrapping_add(1);
                }
                let d = backoff(&cfg, failures, &mut jitter);
                failures = failures.saturating_add(1);
                d
            }
        };
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// The delay before reconnect attempt `failures` + 1: capped exponential, with jitter of up to
/// half the delay, so that a thousand executors do not reconnect in step.
fn backoff(cfg: &Config, failures: u32, jitter: &mut Jitter) -> Duration {
    let exp = cfg.backoff_initial.saturating_mul(1u32.checked_shl(failures.min(16)).unwrap_or(u32::MAX));
    let capped = exp.min(cfg.backoff_max);
    capped.mul_f64(0.5 + 0.5 * jitter.next_unit())
}

/// A small xorshift generator: jitter needs spread, not secrecy.
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Jitter(t ^ (u64::from(std::process::id()) << 32) | 1)
    }

    fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The node's facts, re-read after link or address changes; None until the first read works.
/// Loads (on first start: makes) the node's WireGuard key in `state_dir` and installs it for
/// the executors; its public key, to report. The private key stays here (docs/overlay/node.md).
/// A key file that does not parse is never replaced: WireGuard devices are then refused.
fn wireguard_key(state_dir: &std::path::Path) -> Option<String> {
    match crate::wireguard::Wireguard::load(state_dir, crate::wireguard::Options::default()) {
        Ok(wg) => {
            let public = wg.public_key().to_string();
            if !crate::wireguard::install(Arc::new(wg)) {
                tracing::debug!("a WireGuard key is installed already");
            }
            tracing::info!(public_key = %public, "WireGuard key");
            Some(public)
        }
        Err(e) => {
            tracing::error!(error = %e, "the WireGuard key; WireGuard devices will be refused");
            None
        }
    }
}

fn watch_facts(
    netns: Option<PathBuf>,
    underlay: Option<String>,
    public_key: Option<String>,
) -> watch::Receiver<Option<NodeFacts>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut subscription = match crate::rtnl::subscribe(netns.as_deref()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch interfaces; facts are re-read every 30 s");
                None
            }
        };
        loop {
            let (n, u) = (netns.clone(), underlay.clone());
            match tokio::task::spawn_blocking(move || facts::read(n.as_deref(), u.as_deref())).await {
                Ok(Ok(mut f)) => {
                    f.wireguard_public_key = public_key.clone().unwrap_or_default();
                    tx.send_if_modified(|cur| {
                        let changed = cur.as_ref() != Some(&f);
                        *cur = Some(f);
                        changed
                    });
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "reading node facts"),
                Err(e) => tracing::warn!(error = %e, "reading node facts"),
            }
            let notified = async {
                match subscription.as_mut() {
                    Some(s) => s.recv().await.is_some(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                alive = notified => if !alive { subscription = None },
                _ = tokio::time::sleep(FACTS_BACKSTOP) => {}
                _ = tx.closed() => return,
            }
            tokio::time::sleep(FACTS_DEBOUNCE).await;
            if let Some(s) = subscription.as_mut() {
                s.drain();
            }
        }
    });
    rx
}

/// `address` with a scheme: a NotLeader redirect names a bare host:port, reached the way the
/// configured addresses are.
fn with_scheme(address: &str, configured: &str) -> String {
    if address.contains("://") {
        return address.to_string();
    }
    match configured.split(',').find_map(|a| a.trim().split_once("://")) {
        Some((scheme, _)) => format!("{scheme}://{address}"),
        // channel::endpoint names both choices.
        None => address.to_string(),
    }
}

/// The endpoint for `url`, with the CA file read now (https only).
fn endpoint_for(cfg: &Config, url: &str) -> Result<tonic::transport::Endpoint, SyncError> {
    let https = url.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://"));
    let ca = match (&cfg.ca_file, https) {
        (Some(path), true) => Some(read_file("CA file", path)?),
        _ => None,
    };
    Ok(channel::endpoint(url, ca.as_deref().map(str::as_bytes))?)
}

fn read_file(what: &'static str, path: &std::path::Path) -> Result<String, SyncError> {
    std::fs::read_to_string(path).map_err(|e| SyncError::File { what, path: path.to_path_buf(), reason: e.to_string() })
}

/// One stream's life. Err carries whether the stream was established (which resets backoff).
async fn session<A: NodeApplier>(
    cfg: &Config,
    address: &str,
    applier: &mut A,
    fence: &mut Fence,
    mut facts: watch::Receiver<Option<NodeFacts>>,
) -> Result<Next, (SyncError, bool)> {
    let not_connected = |e| (e, false);
    let url = with_scheme(address, &cfg.controller);
    let endpoint = endpoint_for(cfg, &url).map_err(not_connected)?;
    // Read before dialling: a missing token is this side's problem, not the controller's.
    let token = match &cfg.token_file {
        Some(path) => Some(read_file("token file", path).map_err(not_connected)?),
        None => None,
    };
    let conn = endpoint
        .connect()
        .await
        .map_err(|e| SyncError::Connect { address: address.to_string(), reason: error_chain(&e) })
        .map_err(not_connected)?;
    let (tx, rx) = mpsc::channel::<ExecutorMessage>(16);
    let send = |m: executor_message::Message| ExecutorMessage { message: Some(m) };
    let hello = Hello {
        node: cfg.node.clone(),
        executor_version: env!("CARGO_PKG_VERSION").to_string(),
        applied: fence.applied().cloned(),
    };
    // The channel has room: these never wait.
    let _ = tx.send(send(executor_message::Message::Hello(hello))).await;
    let current = facts.borrow_and_update().clone();
    if let Some(f) = current {
        let _ = tx.send(send(executor_message::Message::Facts(f))).await;
    }
    // The peers' status goes up after each apply and on the executor's WireGuard poll, when it
    // changed; a new stream (perhaps a new leader) gets it afresh, at once: the reach the probes
    // kept across the reconnect, before any state, so that a new leader computes the same
    // relays as the last one (docs/overlay/reach.md, "The report").
    let mut peers_sent: Option<Peers> = None;
    if let Some(report) = peer_report(read_peers(applier).await, &mut peers_sent, SystemTime::now()) {
        let _ = tx.send(send(executor_message::Message::Peers(report))).await;
    }
    let stream_err = |status| SyncError::Stream { address: address.to_string(), status };
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = &token {
        channel::authorize(&mut request, token).map_err(SyncError::Channel).map_err(not_connected)?;
    }
    let mut inbound = wire::sync(conn, request, MAX_UP_MESSAGE).await.map_err(stream_err).map_err(not_connected)?;
    tracing::info!(controller = %address, node = %cfg.node, "connected");

    let connected = |e| (e, true);
    // The controller learns the running total on every connect (it may be a new one).
    let mut reported = 0;
    let mut drift_tick = tokio::time::interval(DRIFT_POLL);
    // Read once already, just above.
    let poll = crate::executor::WIREGUARD_POLL;
    let mut peer_tick = tokio::time::interval_at(tokio::time::Instant::now() + poll, poll);
    peer_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probe_tick = tokio::time::interval(crate::wireguard::reach::TICK);
    probe_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut read_peers = false;
        tokio::select! {
            msg = inbound.message() => {
                let bytes = match msg {
                    Ok(Some(b)) => b,
                    Ok(None) => return Err(connected(SyncError::Ended { address: address.to_string() })),
                    Err(status) if wire::is_oversize(&status) => {
                        // Not read, so not known which state it was: refused by its size, and the
                        // stream (which cannot go on past it) ends once the refusal is out.
                        let reason = format!("a message larger than the executor decodes: {}", status.message());
                        tracing::warn!(%reason, "state refused");
                        let nack = refusal(&DesiredState::default(), "state", reason);
                        let _ = tx.send(send(executor_message::Message::Ack(nack))).await;
                        flushed(&tx).await;
                        return Err(connected(stream_err(status)));
                    }
                    Err(status) => return Err(connected(stream_err(status))),
                };
                let m = match wire::decode(bytes) {
                    Ok(ControllerMessage { message: Some(m) }) => m,
                    Ok(ControllerMessage { message: None }) => continue,
                    Err(bad) => {
                        tracing::warn!(version = %bad.state.version, reason = %bad.reason, "state refused");
                        if fence.admits(&bad.state) {
                            fence.record(&bad.state, false);
                        }
                        let nack = refusal(&bad.state, "state", bad.reason);
                        let _ = tx.send(send(executor_message::Message::Ack(nack))).await;
                        continue;
                    }
                };
                match m {
                    controller_message::Message::NotLeader(n) => {
                        return Ok(Next::Leader((!n.leader.is_empty()).then_some(n.leader)));
                    }
                    controller_message::Message::State(ds) => {
                        if let Some(ack) = receive(cfg, applier, fence, ds).await
                            && tx.send(send(executor_message::Message::Ack(ack))).await.is_err()
                        {
                            return Err(connected(SyncError::Ended { address: address.to_string() }));
                        }
                        read_peers = true;
                    }
                    controller_message::Message::ReadCounters(r) => {
                        let report = read_counters(applier, r.id).await;
                        let _ = tx.send(send(executor_message::Message::Counters(report))).await;
                    }
                }
            }
            changed = facts.changed() => {
                if changed.is_ok() {
                    let current = facts.borrow_and_update().clone();
                    if let Some(f) = current {
                        let _ = tx.send(send(executor_message::Message::Facts(f))).await;
                    }
                }
            }
            _ = drift_tick.tick() => {
                applier.tend().await;
                let (repairs, mut differences) = applier.drift();
                differences.truncate(MAX_REPORTED);
                if repairs != reported {
                    reported = repairs;
                    let _ = tx.send(send(executor_message::Message::Drift(DriftReport { repairs, differences }))).await;
                }
            }
            _ = peer_tick.tick() => read_peers = true,
            _ = probe_tick.tick() => read_peers = applier.probe().await,
        }
        if read_peers
            && let Some(report) = peer_report(self::read_peers(applier).await, &mut peers_sent, SystemTime::now())
        {
            let _ = tx.send(send(executor_message::Message::Peers(report))).await;
        }
    }
}

/// The answer to ReadCounters `id`: the applier's counters read now (docs/operations/counters.md),
/// cut to what the controller decodes. Reads only: nothing in the kernel changes.
pub async fn read_counters<A: NodeApplier>(applier: &A, id: u64) -> CounterReport {
    let read = Read {
        tables: applier.counters().await,
        links: applier.link_counters().await,
        pods: applier.pod_counters().await,
        peers: applier.peers().await,
    };
    counter_report(id, read, SystemTime::now())
}

/// What one counter read found.
struct Read {
    tables: Result<Vec<TableCounters>, String>,
    links: Result<Vec<LinkCounters>, String>,
    pods: Vec<PodCounters>,
    peers: Vec<PeerStatus>,
}

/// The report of `read` at `now`: each part that failed says so in `error` and the others go
/// up; cut to the controller's limit.
fn counter_report(id: u64, read: Read, now: SystemTime) -> CounterReport {
    use prost::Message;
    let mut errors = Vec::new();
    let tables = read.tables.unwrap_or_else(|e| {
        errors.push(e);
        Vec::new()
    });
    let links = read.links.unwrap_or_else(|e| {
        errors.push(format!("links: {e}"));
        Vec::new()
    });
    let mut report = CounterReport {
        id,
        tables,
        error: String::new(),
        links,
        pods: read.pods,
        peers: read.peers.into_iter().take(MAX_REPORTED_PEERS).collect(),
        read_unix_seconds: now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    };
    // Zero counters are left out already; a node this busy keeps the first elements of each set,
    // the host's and the pods' alike (links and peers are small).
    let budget = MAX_UP_MESSAGE - 64 * 1024;
    if report.encoded_len() > budget {
        let mut cut = false;
        while report.encoded_len() > budget {
            let pods = report.pods.iter_mut().flat_map(|p| p.tables.iter_mut());
            let Some(set) =
                report.tables.iter_mut().chain(pods).flat_map(|t| t.sets.iter_mut()).max_by_key(|s| s.elements.len())
            else {
                break;
            };
            if set.elements.is_empty() {
                break;
            }
            let keep = set.elements.len() / 2;
            set.elements.truncate(keep);
            cut = true;
        }
        if cut {
            errors.push(format!("cut to {budget} bytes: some sets' elements are left out"));
        }
    }
    report.error = errors.join("; ");
    report
}

/// Replaces each namespace `ds` sends as a delta with the whole it gives from the version this
/// executor holds (docs/design.md, "Deltas"); a refusal naming the namespace when it holds
/// another version, or the delta does not give the version it names.
fn resolve_deltas<A: NodeApplier>(applier: &A, ds: &mut DesiredState) -> Result<(), Ack> {
    use kuport_proto::delta::SEND_WHOLE;
    let Some(state) = ds.state.as_mut() else { return Ok(()) };
    let mut refused = None;
    for ns in state.netns.iter_mut().filter(|ns| ns.delta.is_some()) {
        let base = ns.delta.as_ref().map(|d| d.base.clone()).unwrap_or_default();
        let stub = NetnsState { target: ns.target.clone(), version: base.clone(), ..Default::default() };
        let object = format!("network namespace {:?}", ns.describe());
        let whole = match applier.held(&stub) {
            None => Err(format!("the delta applies to version {base}, which is not held here: {SEND_WHOLE}")),
            Some(held) => {
                kuport_proto::delta::apply(&held, std::mem::take(ns)).map_err(|e| format!("{e}: {SEND_WHOLE}"))
            }
        };
        match whole {
            Ok(whole) => *ns = whole,
            Err(reason) => {
                refused = Some((object, reason));
                break;
            }
        }
    }
    match refused {
        Some((object, reason)) => Err(refusal(ds, &object, reason)),
        None => Ok(()),
    }
}

/// A NACK of `ds` for one reason, the executor keeping what it holds.
fn refusal(ds: &DesiredState, object: &str, reason: String) -> Ack {
    Ack {
        term: ds.term,
        sequence: ds.sequence,
        version: ds.version.clone(),
        ok: false,
        errors: vec![ObjectError { object: object.to_string(), reason }],
    }
}

/// Waits (at most a second) until the stream has taken every message queued on `tx`, and a
/// moment for the transport to send them.
async fn flushed(tx: &mpsc::Sender<ExecutorMessage>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while tx.capacity() < tx.max_capacity() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Applies one incoming state if the fence admits it; the answer to send, if any.
async fn receive<A: NodeApplier>(
    cfg: &Config,
    applier: &mut A,
    fence: &mut Fence,
    mut ds: DesiredState,
) -> Option<Ack> {
    if !fence.admits(&ds) {
        // The state this executor already applied, sent again after a reconnect: say so.
        if fence.applied().is_some_and(|a| (a.term, a.sequence, &a.version) == (ds.term, ds.sequence, &ds.version)) {
            return Some(Ack { term: ds.term, sequence: ds.sequence, version: ds.version, ok: true, errors: vec![] });
        }
        tracing::warn!(term = ds.term, sequence = ds.sequence, version = %ds.version, "ignoring a stale state");
        return None;
    }
    // A namespace sent as a change from what this executor holds is made whole first: bounds,
    // store and apply see only whole namespaces.
    if let Err(ack) = resolve_deltas(applier, &mut ds) {
        fence.record(&ds, false);
        tracing::warn!(version = %ds.version, errors = ?ack.errors, "refused: a delta does not give its version");
        return Some(ack);
    }
    // Outside kuport's line: refused whole before anything is applied.
    let outside = ds.state.as_ref().map(bounds::check).unwrap_or_default();
    if !outside.is_empty() {
        fence.record(&ds, false);
        tracing::warn!(version = %ds.version, errors = ?outside, "refused: outside what kuport may program");
        return Some(Ack {
            term: ds.term,
            sequence: ds.sequence,
            version: ds.version,
            ok: false,
            errors: outside.into_iter().take(MAX_REPORTED).collect(),
        });
    }
    // Encoded for the store now, so the state itself can be handed over, not copied.
    let pending = cfg.state_dir.is_some().then(|| store::Pending::new(&ds));
    let state = ds.state.take().unwrap_or_default();
    let result = applier.apply(state).await;
    fence.record(&ds, result.is_ok());
    let ok = result.is_ok();
    if ok && let (Some(dir), Some(pending)) = (&cfg.state_dir, pending) {
        // Held namespaces are stored as the executor keeps them.
        match pending.finish(|ns| applier.held(ns)) {
            Some(encoded) => {
                let dir = dir.clone();
                match tokio::task::spawn_blocking(move || store::save_encoded(&dir, &encoded)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "storing the applied state"),
                    Err(e) => tracing::warn!(error = %e, "storing the applied state"),
                }
            }
            None => {
                tracing::warn!(version = %ds.version, "a held namespace is not known whole; the state is not stored")
            }
        }
    }
    match &result {
        Ok(()) => tracing::info!(version = %ds.version, term = ds.term, sequence = ds.sequence, "applied"),
        Err(errors) => tracing::warn!(version = %ds.version, ?errors, "refused"),
    }
    Some(Ack {
        term: ds.term,
        sequence: ds.sequence,
        version: ds.version,
        ok,
        errors: result.err().unwrap_or_default().into_iter().take(MAX_REPORTED).collect(),
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_to_a_bare_address_keeps_the_configured_scheme() {
        assert_eq!(with_scheme("10.0.0.7:9443", "https://svc:9443"), "https://10.0.0.7:9443");
        assert_eq!(with_scheme("10.0.0.7:9443", " http://a:1,http://b:1"), "http://10.0.0.7:9443");
        assert_eq!(with_scheme("http://x:1", "https://svc:9443"), "http://x:1");
        assert_eq!(with_scheme("10.0.0.7:9443", "svc:9443"), "10.0.0.7:9443");
    }

    #[test]
    fn the_ca_file_is_read_for_https_only() {
        let mut cfg = Config::new("https://a:1", "n");
        cfg.ca_file = Some("/nonexistent/ca.crt".into());
        let e = endpoint_for(&cfg, "https://a:1").unwrap_err().to_string();
        assert!(e.contains("CA file /nonexistent/ca.crt"), "{e}");
        assert!(endpoint_for(&cfg, "http://a:1").is_ok());
    }

    #[test]
    fn peers_are_reported_only_when_they_changed() {
        let peer = |rx: u64| PeerStatus {
            public_key: "k".into(),
            endpoint: "192.0.2.1:51820".into(),
            last_handshake_unix_seconds: 100,
            receive_bytes: rx,
            transmit_bytes: 7,
            ..Default::default()
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let mut sent = None;
        assert_eq!(peer_report((vec![], 0), &mut sent, now), None, "a node without peers reports nothing");
        let first = peer_report((vec![peer(1)], 0), &mut sent, now).expect("the first status");
        assert_eq!((first.peers, first.read_unix_seconds), (vec![peer(1)], 1000));
        assert_eq!(peer_report((vec![peer(1)], 0), &mut sent, now), None, "unchanged");
        assert!(peer_report((vec![peer(2)], 0), &mut sent, now).is_some(), "bytes moved");
        let relayed = peer_report((vec![peer(2)], 1500), &mut sent, now).expect("relayed bytes alone");
        assert_eq!(relayed.relayed_bytes, 1500);
        assert_eq!(peer_report((vec![peer(2)], 1500), &mut sent, now), None, "unchanged");
        let gone = peer_report((vec![], 0), &mut sent, now).expect("the peers went");
        assert!(gone.peers.is_empty());
        assert_eq!(peer_report((vec![], 0), &mut sent, now), None);
    }

    /// An applier that holds a peer whose reach it kept, and applies nothing.
    struct Kept;

    impl NodeApplier for Kept {
        async fn apply(&mut self, _: NodeState) -> Result<(), Vec<ObjectError>> {
            Ok(())
        }
        fn drift(&self) -> (u64, Vec<String>) {
            (0, vec![])
        }
        async fn peers(&self) -> Vec<PeerStatus> {
            vec![PeerStatus {
                public_key: "k".into(),
                reach: kuport_proto::v1::Reach::Unreachable as i32,
                ..Default::default()
            }]
        }
        async fn relayed_bytes(&self) -> u64 {
            7
        }
    }

    /// An applier that keeps the namespaces it applied, as the real one does.
    #[derive(Default)]
    struct Holding(Vec<NetnsState>);

    impl NodeApplier for Holding {
        async fn apply(&mut self, state: NodeState) -> Result<(), Vec<ObjectError>> {
            self.0 = state.netns;
            Ok(())
        }
        fn drift(&self) -> (u64, Vec<String>) {
            (0, vec![])
        }
        fn held(&self, ns: &NetnsState) -> Option<Arc<NetnsState>> {
            self.0.iter().find(|h| h.target == ns.target && h.version == ns.version).cloned().map(Arc::new)
        }
    }

    /// A host namespace of `n` peers, canonical; the peer `moved` at another endpoint.
    fn host(n: usize, moved: usize) -> NetnsState {
        let peers = (0..n)
            .map(|i| kuport_proto::v1::WireguardPeer {
                public_key: format!("key-{i:04}"),
                endpoint: format!("192.0.2.1:{}", if i == moved { 40000 } else { 51820 }),
                allowed_ips: vec![format!("10.42.{}.{}/32", i / 256, i % 256)],
                ..Default::default()
            })
            .collect();
        let device = kuport_proto::v1::WireguardDevice { name: "kup-wg".into(), peers, ..Default::default() };
        let mut ns = NetnsState { wireguard_devices: vec![device], ..Default::default() };
        kuport_proto::canonical::canonicalize_netns_whole(&mut ns);
        ns
    }

    fn desired(sequence: u64, ns: NetnsState, whole: &NetnsState) -> DesiredState {
        let version = kuport_proto::canonical_version(&NodeState { node: "n".into(), netns: vec![whole.clone()] });
        DesiredState { term: 1, sequence, version, state: Some(NodeState { node: "n".into(), netns: vec![ns] }) }
    }

    /// A namespace sent as a change from the version held here is applied whole; one from a
    /// version not held, or one that does not give its version, is refused before anything is
    /// applied, naming the namespace, and the state sent again whole is applied.
    #[tokio::test]
    async fn a_delta_applies_from_the_version_held_and_only_to_its_version() {
        let cfg = Config::new("http://x", "n");
        let (mut applier, mut fence) = (Holding::default(), Fence::default());
        let (a, b, c) = (host(300, usize::MAX), host(300, 7), host(300, 9));
        let ack = receive(&cfg, &mut applier, &mut fence, desired(1, a.clone(), &a)).await.expect("an answer");
        assert!(ack.ok);

        let delta = kuport_proto::delta::diff(&a, &b);
        let ack = receive(&cfg, &mut applier, &mut fence, desired(2, delta, &b)).await.expect("an answer");
        assert!(ack.ok, "{:?}", ack.errors);
        assert_eq!(applier.0, vec![b.clone()], "applied whole");

        // From a version this executor does not hold (it holds b).
        let stale = kuport_proto::delta::diff(&a, &c);
        let ack = receive(&cfg, &mut applier, &mut fence, desired(3, stale, &c)).await.expect("an answer");
        assert!(!ack.ok);
        assert_eq!(ack.errors[0].object, "network namespace \"host\"");
        assert!(ack.errors[0].reason.contains("not held here: send it whole"), "{}", ack.errors[0].reason);
        assert_eq!(applier.0, vec![b.clone()], "nothing applied");

        // A delta whose result is not the version it names.
        let mut forged = kuport_proto::delta::diff(&b, &c);
        if let Some(d) = forged.delta.as_mut() {
            d.peers[0].put[0].allowed_ips.push("0.0.0.0/0".into());
        }
        let ack = receive(&cfg, &mut applier, &mut fence, desired(4, forged, &c)).await.expect("an answer");
        assert!(!ack.ok && ack.errors[0].reason.contains("gives version"), "{:?}", ack.errors);
        assert_eq!(applier.0, vec![b], "nothing applied");

        let ack = receive(&cfg, &mut applier, &mut fence, desired(5, c.clone(), &c)).await.expect("an answer");
        assert!(ack.ok);
        assert_eq!(applier.0, vec![c]);
    }

    /// An applier whose host tables, links, pods and peers are given.
    struct Counted {
        tables: Result<Vec<TableCounters>, String>,
        links: Result<Vec<LinkCounters>, String>,
        pods: Vec<PodCounters>,
    }

    impl NodeApplier for Counted {
        async fn apply(&mut self, _: NodeState) -> Result<(), Vec<ObjectError>> {
            Ok(())
        }
        fn drift(&self) -> (u64, Vec<String>) {
            (0, vec![])
        }
        async fn peers(&self) -> Vec<PeerStatus> {
            vec![PeerStatus { public_key: "k".into(), receive_bytes: 9, ..Default::default() }]
        }
        async fn counters(&self) -> Result<Vec<TableCounters>, String> {
            self.tables.clone()
        }
        async fn link_counters(&self) -> Result<Vec<LinkCounters>, String> {
            self.links.clone()
        }
        async fn pod_counters(&self) -> Vec<PodCounters> {
            self.pods.clone()
        }
    }

    /// A table with one set of `n` counted elements.
    fn table(name: &str, n: u32) -> TableCounters {
        use kuport_proto::build::{ifname, port};
        use kuport_proto::v1::{ElementCount, SetCounters};
        let elements =
            (0..n).map(|i| ElementCount { key: vec![ifname("eth0"), port(i)], packets: 1, bytes: 60 }).collect();
        TableCounters {
            name: name.into(),
            sets: vec![SetCounters { name: "steer_port".into(), elements }],
            ..Default::default()
        }
    }

    fn pod(name: &str, tables: Vec<TableCounters>, error: &str) -> PodCounters {
        let pod = kuport_proto::v1::PodRef { namespace: "apps".into(), name: name.into(), ..Default::default() };
        PodCounters { pod: Some(pod), tables, error: error.into() }
    }

    #[tokio::test]
    async fn a_counter_report_carries_tables_links_pods_and_peers() {
        let link = LinkCounters { name: "kup-l1".into(), mtu: 1450, up: true, tx_packets: 3, ..Default::default() };
        let pods = vec![pod("web-0", vec![table("kuport-intercept", 2)], ""), pod("web-1", vec![], "gone")];
        let applier =
            Counted { tables: Ok(vec![table("kuport", 1)]), links: Ok(vec![link.clone()]), pods: pods.clone() };
        let before = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("clock").as_secs();
        let r = read_counters(&applier, 7).await;
        assert_eq!((r.id, r.error.as_str(), r.tables.len()), (7, "", 1));
        assert_eq!((r.links, r.pods), (vec![link], pods));
        assert_eq!((r.peers.len(), r.peers[0].receive_bytes), (1, 9));
        assert!(r.read_unix_seconds >= before && r.read_unix_seconds < before + 60, "{}", r.read_unix_seconds);

        // A part that fails says so; the others still go up.
        let applier = Counted { tables: Err("table kuport: EPERM".into()), links: Err("ENOMEM".into()), pods: vec![] };
        let r = read_counters(&applier, 8).await;
        assert_eq!(r.error, "table kuport: EPERM; links: ENOMEM");
        assert_eq!((r.tables.len(), r.links.len(), r.peers.len()), (0, 0, 1));
    }

    #[test]
    fn a_report_too_large_cuts_the_biggest_sets_host_or_pod() {
        use prost::Message;
        // A pod's set alone is past the 4 MiB the controller decodes.
        let read = Read {
            tables: Ok(vec![table("kuport", 1000)]),
            links: Ok(vec![LinkCounters { name: "kup-l1".into(), ..Default::default() }]),
            pods: vec![pod("web-0", vec![table("kuport-intercept", 600_000)], "")],
            peers: vec![PeerStatus { public_key: "k".into(), ..Default::default() }],
        };
        let r = counter_report(1, read, SystemTime::UNIX_EPOCH + Duration::from_secs(5));
        assert!(r.encoded_len() <= MAX_UP_MESSAGE - 64 * 1024, "{}", r.encoded_len());
        assert!(r.error.starts_with("cut to "), "{}", r.error);
        let pod_set = r.pods[0].tables[0].sets[0].elements.len();
        assert!(pod_set < 600_000 && pod_set > 1000, "the pod's set is cut, to more than the host's: {pod_set}");
        assert_eq!(r.tables[0].sets[0].elements.len(), 1000, "the smaller host set is whole");
        assert_eq!((r.links.len(), r.peers.len(), r.read_unix_seconds), (1, 1, 5));
    }

    /// A controller that never sends a state: it records what the executor sends.
    struct Silent(mpsc::UnboundedSender<ExecutorMessage>);

    #[tonic::async_trait]
    impl kuport_proto::v1::node_sync_server::NodeSync for Silent {
        type SyncStream =
            std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<ControllerMessage, tonic::Status>> + Send>>;

        async fn sync(
            &self,
            request: tonic::Request<tonic::Streaming<ExecutorMessage>>,
        ) -> Result<tonic::Response<Self::SyncStream>, tonic::Status> {
            let mut inbound = request.into_inner();
            let seen = self.0.clone();
            tokio::spawn(async move {
                while let Ok(Some(m)) = inbound.message().await {
                    let _ = seen.send(m);
                }
            });
            Ok(tonic::Response::new(Box::pin(tokio_stream::pending())))
        }
    }

    /// On a new stream the report goes right after Hello, before any state (a new leader waits
    /// for it to compute the relays): with the reach kept and the relayed bytes.
    #[tokio::test]
    async fn the_peer_report_follows_hello_before_any_state() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let (seen, mut rx) = mpsc::unbounded_channel();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(kuport_proto::v1::node_sync_server::NodeSyncServer::new(Silent(seen)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let cfg = Config::new(format!("http://{address}"), "n");
        let (_facts_tx, facts) = watch::channel(None);
        let client = tokio::spawn(async move {
            let mut applier = Kept;
            let mut fence = Fence::default();
            let _ = session(&cfg, &address, &mut applier, &mut fence, facts).await;
        });
        let mut kinds = Vec::new();
        let report = loop {
            // Sooner than the peers' poll (10 s), the other time a report goes.
            let m = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("a message").expect("open");
            match m.message.expect("a message") {
                executor_message::Message::Peers(r) => break r,
                other => kinds.push(format!("{other:?}")),
            }
        };
        assert!(kinds.len() == 1 && kinds[0].starts_with("Hello"), "only Hello before the report: {kinds:?}");
        assert_eq!(report.peers[0].reach, kuport_proto::v1::Reach::Unreachable as i32);
        assert_eq!(report.relayed_bytes, 7);
        client.abort();
        server.abort();
    }

    #[test]
    fn backoff_grows_to_its_cap_with_jitter() {
        let cfg = Config::new("http://x", "n");
        let mut j = Jitter::new();
        for failures in 0..40 {
            let d = backoff(&cfg, failures, &mut j);
            let full = cfg.backoff_initial.saturating_mul(1 << failures.min(16)).min(cfg.backoff_max);
            assert!(d >= full / 2 && d <= full, "failure {failures}: {d:?} not within [{:?}, {full:?}]", full / 2);
        }
        assert!(backoff(&cfg, 30, &mut j) >= cfg.backoff_max / 2);
    }
}
