//! The hub: what the controller knows at run time, between its inputs and its executors.
//!
//! Inputs (from a manifest folder or the Kubernetes API) and the facts executors report go in; a recompute (paced: at once after a quiet spell, then at most every [`PACE`]) runs the pure
//! [`compute`] and publishes each node's state, stamped with the leader's term and a sequence
//! number, on that node's channel. Only nodes whose version changed get a new message.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::jiff::Timestamp;
use kuport_proto::channel::MAX_STATE_MESSAGE;
use kuport_proto::v1::{
    Applied, CounterReport, DesiredState, ExecutorMessage, Hello, NodeFacts as WireFacts, NodeState, ObjectError,
    PeerStatus, Reach, executor_message,
};
use tokio::sync::{Notify, watch};

use super::leader::Leadership;
use super::peers::{self, Digest, Reported};
use crate::api::{PortMapClassStatus, PortMapStatus};
use crate::compute::by_change::Computer;
use crate::compute::overlay::members::{self, ROTATE_EVERY_SECONDS};
use crate::compute::overlay::reason as overlay_reason;
use crate::compute::overlay::relays::PeerRoute;
use crate::compute::portmap::{MapKey, admission};
use crate::compute::{ObjectKey, Outputs, Settings, relevant_facts};
use crate::observe::facts::{self, Refused};
use crate::observe::{Cluster, KnownFacts, OverlayObserved};
use crate::report::metrics::Metrics;

/// The least time between the starts of two recomputes: a change after a quiet spell is
/// computed at once, and the changes of a burst wait out the rest of this together
/// (docs/decisions.md, "Recomputes are paced, not debounced").
pub const PACE: Duration = Duration::from_millis(100);

/// How often the leader reads every node's counters for the per-mapping metrics
/// (docs/operations/counters.md): half Prometheus' usual scrape interval.
pub const COUNTER_POLL: Duration = Duration::from_secs(15);

/// A node's stream of desired states (None until the first compute that knows the node).
pub type DesiredRx = watch::Receiver<Option<Arc<DesiredState>>>;

/// The id of a node's newest session: changes when a newer stream says Hello for the node.
pub type NewestRx = watch::Receiver<u64>;

/// How long a node's first state after this replica began leading waits for its executor's
/// first peer report (docs/overlay/status.md, "A new leader"): an executor without WireGuard
/// peers, or one too old to report on Hello, then gets its state anyway.
pub const FIRST_STATE_HOLD: Duration = Duration::from_secs(2);

/// The report a held first state waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaited {
    /// The node's facts: without its routes the state lacks the port maps' request claims
    /// (docs/portmap/datapath.md, "Which device reaches the pod").
    Facts,
    /// The peer report, which the executor sends after its facts: without it a relayed pair
    /// would be direct for a moment (docs/overlay/status.md, "A new leader").
    Peers,
}

/// What [`Hub::connect`] gives a new session.
#[derive(Debug)]
pub struct Session {
    pub id: u64,
    pub desired: DesiredRx,
    pub newest: NewestRx,
    /// true while the session must not send a state yet ([`FIRST_STATE_HOLD`]).
    pub held: watch::Receiver<bool>,
    /// When the hold ends anyway; None: not held.
    pub hold_until: Option<Instant>,
    /// The newest counter read asked of this node ([`Hub::read_counters`]): the session sends
    /// ReadCounters when it grows.
    pub counters_asked: watch::Receiver<u64>,
}

/// Where a node's first state of this term is (docs/overlay/status.md, "A new leader").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// States go out as they are computed.
    Free,
    /// Held until this session's first report of the kind it `awaits` (`reported`) and the keys
    /// of every Node that carries a published one (its peers, as the last leader computed them)...
    Waiting { session: u64, awaits: Awaited, reported: bool },
    /// ...and then until a compute that read them is published: one that began after `after`
    /// computes had begun.
    Compute { session: u64, after: u64 },
}

/// What the controller knows of one node and its executor.
#[derive(Debug)]
struct NodeEntry {
    tx: watch::Sender<Option<Arc<DesiredState>>>,
    /// The connected executor's session id.
    session: Option<u64>,
    /// The newest session's id: a stream whose session is no longer it was superseded and ends.
    newest: watch::Sender<u64>,
    executor_version: String,
    /// When the executor connected or disconnected.
    since: Instant,
    /// The last state the executor applied (ok Ack, or what it held when it said Hello).
    acked: Option<Applied>,
    /// The refusal of the latest answer, empty after an ok.
    errors: Vec<ObjectError>,
    /// The newest computed state, when it was too large to send (the executor has the one before).
    oversize: Option<Oversize>,
    drift_repairs: u64,
    last_drift: Vec<String>,
    /// The last report that passed [`facts::check`], as sent and as checked.
    facts: Option<(WireFacts, KnownFacts)>,
    /// Why the latest report was refused; None once one passes.
    refused_facts: Option<Refused>,
    /// The latest peer report that passed [`peers::check`] (docs/overlay/status.md); dropped
    /// when the node leaves the mesh.
    peers: Option<Reported>,
    /// What of it the last compute read.
    peer_digest: Digest,
    /// Per peer key, its reach in the reports and when a report first said it (for trace:
    /// who reported a peer unreachable, and since when).
    reach_since: BTreeMap<String, (Reach, SystemTime)>,
    /// The address the executor's latest stream came from.
    connect_address: Option<IpAddr>,
    /// Per peer key, the endpoint the overlay device of the state last sent gives it.
    sent_endpoints: Option<Arc<BTreeMap<String, SocketAddr>>>,
    /// Whether the node's first state of this term waits ([`Hold`]); `held` tells the session.
    hold: Hold,
    held: watch::Sender<bool>,
    /// The leadership term whose states this node was last let have: its executor's report
    /// (if any) is in what this term computed. A new term holds its first state again.
    served_term: u64,
    /// The newest counter read asked ([`Hub::read_counters`]), and the last answer to one.
    counters_asked: watch::Sender<u64>,
    counters: watch::Sender<Option<Arc<CounterReport>>>,
}

impl Hold {
    /// `session` sent a report of kind `kind`: the one a held first state waits for, or not.
    fn report(&mut self, session: u64, kind: Awaited) {
        if let Hold::Waiting { session: s, awaits, reported } = self
            && *s == session
            && *awaits == kind
        {
            *reported = true;
        }
    }
}

impl NodeEntry {
    fn new() -> Self {
        NodeEntry {
            tx: watch::channel(None).0,
            session: None,
            newest: watch::channel(0).0,
            executor_version: String::new(),
            since: Instant::now(),
            acked: None,
            errors: Vec::new(),
            oversize: None,
            drift_repairs: 0,
            last_drift: Vec::new(),
            facts: None,
            refused_facts: None,
            peers: None,
            reach_since: BTreeMap::new(),
            peer_digest: Digest::new(),
            connect_address: None,
            sent_endpoints: None,
            hold: Hold::Free,
            held: watch::channel(false).0,
            served_term: 0,
            counters_asked: watch::channel(0).0,
            counters: watch::channel(None).0,
        }
    }

    /// Lets the node's session send states: this term's states now read its report.
    fn release(&mut self, term: u64) {
        self.hold = Hold::Free;
        self.served_term = term;
        self.held.send_replace(false);
    }

    fn desired(&self) -> Option<Arc<DesiredState>> {
        self.tx.borrow().clone()
    }
}

/// A computed state larger than [`MAX_STATE_MESSAGE`], not sent.
#[derive(Debug)]
struct Oversize {
    version: String,
    bytes: usize,
}

impl Oversize {
    fn error(&self) -> ObjectError {
        ObjectError {
            object: format!("node state {}", self.version),
            reason: format!(
                "{} bytes, more than the {MAX_STATE_MESSAGE} an executor decodes: not sent, the node keeps its last state",
                self.bytes
            ),
        }
    }
}

/// One node as the Debug service and the metrics show it.
#[derive(Debug, Clone)]
pub struct NodeSnapshot {
    pub node: String,
    pub desired: Option<Arc<DesiredState>>,
    pub connected: bool,
    pub executor_version: String,
    pub since: Duration,
    pub acked: Option<Applied>,
    pub errors: Vec<ObjectError>,
    pub drift_repairs: u64,
    pub last_drift: Vec<String>,
    pub facts: Option<WireFacts>,
    /// The executor's latest peer report, handshakes on the controller's clock.
    pub peers: Vec<PeerStatus>,
    /// Per peer key, when the reports first gave its current reach (the controller's clock).
    pub reach_since: BTreeMap<String, SystemTime>,
}

/// One member's route to one peer as last computed, for the metrics (docs/overlay/relays.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSeries {
    pub node: String,
    pub peer: String,
    pub route: PeerRoute,
}

/// One peer of one node, for the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerSeries {
    /// The reporting node.
    pub node: String,
    /// The peer's node, or its key's first 8 characters when no member has the key.
    pub peer: String,
    pub receive_bytes: u64,
    pub transmit_bytes: u64,
    /// Seconds since its last handshake; None: never.
    pub handshake_age: Option<u64>,
}

/// Per node, the (term, sequence) of its first state holding an object as now computed.
type HeldSince = BTreeMap<String, (u64, u64)>;

#[derive(Debug, Default)]
struct Inner {
    /// The latest inputs; None until the source delivered them once.
    inputs: Option<Arc<Cluster>>,
    /// The statuses the last compute decided, fed back as the objects' stored status (slots
    /// and condition times survive recomputes, as they would through the API server).
    class_status: Arc<BTreeMap<String, PortMapClassStatus>>,
    port_map_status: crate::compute::Shared<MapKey, PortMapStatus>,
    outputs: Arc<Outputs>,
    term: u64,
    sequence: u64,
    next_session: u64,
    nodes: BTreeMap<String, NodeEntry>,
    /// The source's last error (a bad manifest); the previous inputs stay in use.
    source_error: Option<String>,
    /// Per tracked object: its fingerprint, and for each node that must acknowledge it the
    /// (term, sequence) of the first state holding it as it is now. A node that acked that
    /// state or a later one of the term has it, whatever else changed on the node since.
    holds_since: BTreeMap<ObjectKey, (u64, HeldSince)>,
    computes: u64,
    /// The mesh members' public keys, as last computed: only peer reports about them count.
    member_keys: BTreeSet<String>,
    /// The keys of the members with more than one endpoint candidate, as last computed: only
    /// they rotate while silent.
    rotating: BTreeSet<String>,
    /// Computes begun (each numbered when it reads the inputs): a held state waits for one
    /// numbered after its report ([`Hold::Compute`]).
    reads: u64,
    /// Counter reads asked so far: each read's id.
    counter_reads: u64,
}

/// Shared by the source, the recompute loop and every gRPC session.
#[derive(Debug)]
pub struct Hub {
    inner: Mutex<Inner>,
    changed: Notify,
    settings: Settings,
    leadership: watch::Receiver<Leadership>,
    /// Set when the controller stops: every session ends, so the server can finish.
    closing: watch::Sender<bool>,
    /// Standalone: no API server stores statuses, so the last computed ones are fed back.
    feed_back_status: bool,
    status_dirty: Notify,
    metrics: Metrics,
    /// The last compute's results, so that the next redoes only what changed.
    computer: Mutex<Computer>,
}

impl Hub {
    /// A hub whose inputs carry no stored status when `feed_back_status` (a manifest
    /// folder): the statuses it computes are then fed back into the next compute, as the API
    /// server would store them.
    pub fn new(settings: Settings, leadership: watch::Receiver<Leadership>, feed_back_status: bool) -> Arc<Self> {
        Arc::new(Hub {
            inner: Mutex::default(),
            changed: Notify::new(),
            leadership,
            closing: watch::channel(false).0,
            feed_back_status,
            status_dirty: Notify::new(),
            computer: Mutex::new(Computer::new(settings.clone())),
            settings,
            metrics: Metrics::default(),
        })
    }

    /// Ends every executor session (the controller is stopping).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The data stays consistent per field even if a holder panicked.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What every compute runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// New inputs from the source (facts in them are defaults; reported facts win).
    pub fn set_inputs(&self, cluster: Cluster) {
        let mut inner = self.lock();
        inner.inputs = Some(Arc::new(cluster));
        inner.source_error = None;
        drop(inner);
        self.changed.notify_one();
    }

    /// The source could not read its inputs; the previous ones stay in use.
    pub fn set_source_error(&self, error: String) {
        self.lock().source_error = Some(error);
    }

    pub fn source_error(&self) -> Option<String> {
        self.lock().source_error.clone()
    }

    /// An executor said Hello: registers its session (superseding any older one of the node,
    /// whose messages are dropped from now on) and returns the node's state channel.
    pub fn connect(&self, hello: &Hello) -> Session {
        self.connect_from(hello, None)
    }

    /// [`Hub::connect`] for a stream that comes from `from`: with the overlay on, that
    /// address is one of the node's endpoint candidates (docs/overlay/status.md).
    pub fn connect_from(&self, hello: &Hello, from: Option<SocketAddr>) -> Session {
        let overlay = self.settings.overlay.is_some();
        let mut inner = self.lock();
        inner.next_session += 1;
        let session = inner.next_session;
        let entry = inner.nodes.entry(hello.node.clone()).or_insert_with(NodeEntry::new);
        entry.session = Some(session);
        entry.newest.send_replace(session);
        entry.executor_version = hello.executor_version.clone();
        entry.since = Instant::now();
        entry.errors.clear();
        if let Some(a) = &hello.applied {
            entry.acked = Some(a.clone());
        }
        let from = from.map(|a| a.ip().to_canonical());
        let moved = from.is_some() && entry.connect_address != from;
        if from.is_some() {
            entry.connect_address = from;
        }
        // The first state after this replica began leading waits for the executor's report
        // (docs/overlay/status.md, "A new leader"): computed without it, a relayed pair would
        // be direct for a moment. Only with the overlay on, for an executor that holds a state
        // (so perhaps peers), and not for a node this term's compute knows is no member.
        let term = self.leadership.borrow().term;
        let place = inner.outputs.overlay.get(&hello.node);
        let not_member = place.is_some_and(|o| {
            o.public_key.is_none() && o.refused.iter().all(|r| r.reason != overlay_reason::NO_PUBLIC_KEY)
        });
        let entry = inner.nodes.entry(hello.node.clone()).or_insert_with(NodeEntry::new);
        // Every executor's first state also waits for its facts, fresh or not: computed without
        // its routes, the state would lack the port maps' request claims and new flows would
        // reach pods from the node's address (docs/portmap/datapath.md, "Which device reaches
        // the pod").
        let awaits = if overlay && hello.applied.is_some() && entry.served_term != term && !not_member {
            Some(Awaited::Peers)
        } else if entry.facts.is_none() {
            Some(Awaited::Facts)
        } else {
            None
        };
        let hold = awaits.is_some();
        if let Some(awaits) = awaits {
            entry.hold = Hold::Waiting { session, awaits, reported: false };
            entry.held.send_replace(true);
        } else {
            entry.release(term);
        }
        let desired = entry.tx.subscribe();
        let newest = entry.newest.subscribe();
        let held = entry.held.subscribe();
        let counters_asked = entry.counters_asked.subscribe();
        let new_node = inner.inputs.is_some() && !inner.outputs.node_states.contains_key(&hello.node);
        drop(inner);
        if new_node || (overlay && moved) {
            // Publish at least an empty state for a node the inputs do not name.
            self.changed.notify_one();
        }
        let hold_until = hold.then(|| Instant::now() + FIRST_STATE_HOLD);
        Session { id: session, desired, newest, held, hold_until, counters_asked }
    }

    /// Ends the hold of `session`'s first state ([`FIRST_STATE_HOLD`] passed): it goes out
    /// as computed now.
    pub fn release_hold(&self, node: &str, session: u64) {
        let term = self.leadership.borrow().term;
        let mut inner = self.lock();
        if let Some(e) = inner.nodes.get_mut(node)
            && matches!(e.hold, Hold::Waiting { session: s, .. } | Hold::Compute { session: s, .. } if s == session)
        {
            tracing::info!(%node, session, "no peer report in time: the first state goes out");
            e.release(term);
        }
        drop(inner);
        self.status_dirty.notify_one();
    }

    /// Publishes `node`'s state again under a new sequence, for `session` to send whole: its
    /// executor refused it as sent, with namespaces as stubs or deltas from a version it turned
    /// out not to hold (docs/design.md, "Deltas"). A new sequence, because the executor's fence
    /// admits only newer ones.
    pub fn resend(&self, node: &str, session: u64) {
        self.metrics.deltas_refused.inc();
        let mut inner = self.lock();
        let Some(ds) = inner.nodes.get(node).filter(|e| e.session == Some(session)).and_then(NodeEntry::desired) else {
            return;
        };
        inner.sequence += 1;
        let again = DesiredState { sequence: inner.sequence, ..DesiredState::clone(&ds) };
        if let Some(e) = inner.nodes.get_mut(node) {
            e.tx.send_replace(Some(Arc::new(again)));
        }
    }

    /// Whether what this term computed for `node` reads its executor's report, if it has one:
    /// the node's state was let go in this term (docs/overlay/status.md, "A new leader"). The
    /// status writer waits for it before it writes a member's overlay annotations.
    /// Whether `node`'s executor has sent this replica a peer report: a new leader publishes a
    /// member's peers annotation only from its own report (docs/overlay/status.md, "A new leader").
    pub fn reported(&self, node: &str) -> bool {
        self.lock().nodes.get(node).is_some_and(|e| e.peers.is_some())
    }

    pub fn served_this_term(&self, node: &str) -> bool {
        let term = self.leadership.borrow().term;
        self.lock().nodes.get(node).is_some_and(|e| e.served_term == term)
    }

    /// The session ended (a newer session of the same node is left alone).
    pub fn disconnect(&self, node: &str, session: u64) {
        let mut inner = self.lock();
        if let Some(e) = inner.nodes.get_mut(node)
            && e.session == Some(session)
        {
            e.session = None;
            e.since = Instant::now();
        }
        drop(inner);
        self.status_dirty.notify_one();
    }

    /// A message from the node's current session.
    pub fn receive(&self, node: &str, message: ExecutorMessage) {
        let session = self.lock().nodes.get(node).and_then(|e| e.session);
        if let Some(session) = session {
            self.receive_from(node, session, message);
        }
    }

    /// A message from `session` of `node`; false (and dropped) when that session is not the
    /// node's newest: only the newest stream's facts, acks and drift count (docs/security.md).
    pub fn receive_from(&self, node: &str, session: u64, message: ExecutorMessage) -> bool {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(entry) = inner.nodes.get_mut(node) else { return false };
        if entry.session != Some(session) {
            return false;
        }
        let mut recompute = false;
        // A report or a key may be the last a held first state waits for.
        let news =
            matches!(message.message, Some(executor_message::Message::Facts(_) | executor_message::Message::Peers(_)));
        match message.message {
            // Facts are taken from this stream for its Hello's node only: `node` is that name,
            // and the report carries none of its own (docs/security.md).
            Some(executor_message::Message::Facts(f)) => match facts::check(node, &f) {
                Ok(checked) => {
                    // Only facts the computation reads recompute: a recompute for a pod's veth
                    // coming or going would only restart the debounce of a real change.
                    let inputs = inner.inputs.as_deref();
                    let read = |f: &KnownFacts| relevant_facts(inputs, f);
                    recompute = entry.refused_facts.take().is_some()
                        || entry.facts.as_ref().is_none_or(|(_, old)| read(old) != read(&checked));
                    entry.facts = Some((f, checked));
                    entry.hold.report(session, Awaited::Facts);
                }
                Err(refused) => {
                    // Refused whole; the previous facts stay in use.
                    tracing::warn!(%node, field = %refused.field, error = %refused, "executor facts refused");
                    self.metrics.facts_refused.inc();
                    recompute = entry.refused_facts.as_ref() != Some(&refused);
                    entry.refused_facts = Some(refused);
                }
            },
            Some(executor_message::Message::Ack(a)) => {
                if a.ok {
                    entry.acked = Some(Applied { term: a.term, sequence: a.sequence, version: a.version });
                    entry.errors.clear();
                } else {
                    entry.errors = a.errors;
                    self.metrics.nacks.inc();
                }
            }
            Some(executor_message::Message::Drift(d)) => {
                entry.drift_repairs = d.repairs;
                entry.last_drift = d.differences;
            }
            // Not facts: only a peer turning silent or live, or a live peer's packets coming
            // from elsewhere, recomputes (docs/overlay/status.md).
            Some(executor_message::Message::Peers(r)) => match peers::check(&r, Timestamp::now()) {
                Ok(checked) => {
                    let digest = peers::digest(&checked.observed, &inner.member_keys, Timestamp::now());
                    recompute = self.settings.overlay.is_some() && digest != entry.peer_digest;
                    entry.peer_digest = digest;
                    let now = SystemTime::now();
                    for p in &checked.statuses {
                        let reach = p.reach();
                        if entry.reach_since.get(&p.public_key).is_none_or(|(r, _)| *r != reach) {
                            entry.reach_since.insert(p.public_key.clone(), (reach, now));
                        }
                    }
                    entry.reach_since.retain(|k, _| checked.statuses.iter().any(|p| p.public_key == *k));
                    entry.peers = Some(checked);
                    entry.hold.report(session, Awaited::Peers);
                }
                Err(e) => tracing::warn!(%node, error = %e, "executor peer report refused"),
            },
            // Only an answer to a read asked: an executor cannot push counters of its own.
            Some(executor_message::Message::Counters(r)) => {
                if r.id > 0 && r.id <= *entry.counters_asked.borrow() {
                    entry.counters.send_replace(Some(Arc::new(r)));
                }
                return true;
            }
            Some(executor_message::Message::Hello(_)) | None => {}
        }
        if news {
            recompute |= advance_holds(inner);
        }
        drop(guard);
        if recompute {
            self.changed.notify_one();
        }
        self.status_dirty.notify_one();
        true
    }

    /// Every node known, by name.
    pub fn nodes(&self) -> Vec<NodeSnapshot> {
        let inner = self.lock();
        inner.nodes.iter().map(|(n, e)| snapshot(n, e)).collect()
    }

    /// Which of `nodes` have not yet acknowledged a state holding `key` as last computed: a node
    /// counts as done once it acked that state or any later one of the same term, or when it is
    /// synced. Another object's change on the node (a new state version) does not make this
    /// one pending again.
    pub fn unacked(&self, key: &ObjectKey, nodes: Vec<String>) -> Vec<String> {
        let inner = self.lock();
        let since = inner.holds_since.get(key).map(|(_, s)| s);
        nodes
            .into_iter()
            .filter(|n| {
                let Some(e) = inner.nodes.get(n) else { return true };
                let Some(acked) = &e.acked else { return true };
                let synced = e.desired().is_some_and(|d| d.version == acked.version);
                let holds = since
                    .and_then(|s| s.get(n))
                    .is_some_and(|(term, seq)| acked.term == *term && acked.sequence >= *seq);
                // A held first state (facts without the overlay): the executor keeps what it
                // applied until its report is in, so nothing changes for it yet.
                let held = self.settings.overlay.is_none() && e.hold != Hold::Free;
                !(synced || holds || held)
            })
            .collect()
    }

    pub fn node(&self, name: &str) -> Option<NodeSnapshot> {
        let inner = self.lock();
        inner.nodes.get(name).map(|e| snapshot(name, e))
    }

    /// The last compute's outputs and the latest inputs (shared, not copied).
    pub fn outputs(&self) -> (Arc<Outputs>, Option<Arc<Cluster>>) {
        let inner = self.lock();
        (inner.outputs.clone(), inner.inputs.clone())
    }

    pub fn computes(&self) -> u64 {
        self.lock().computes
    }

    /// Every connected member's peers as last reported, for the metrics: peers named by the
    /// mesh (by their key), handshake ages at `now`.
    pub fn peer_series(&self, now: Timestamp) -> Vec<PeerSeries> {
        let inner = self.lock();
        let names: BTreeMap<&str, &str> =
            inner.outputs.overlay.iter().filter_map(|(n, o)| Some((o.public_key.as_deref()?, n.as_str()))).collect();
        let mut out = Vec::new();
        for (node, e) in &inner.nodes {
            let Some(r) = e.peers.as_ref().filter(|_| e.session.is_some()) else { continue };
            for p in &r.statuses {
                let peer = names
                    .get(p.public_key.as_str())
                    .map_or_else(|| p.public_key.get(..8).unwrap_or(&p.public_key).to_string(), |n| n.to_string());
                let handshake_age = (p.last_handshake_unix_seconds != 0)
                    .then(|| u64::try_from(now.as_second()).unwrap_or(0).saturating_sub(p.last_handshake_unix_seconds));
                out.push(PeerSeries {
                    node: node.clone(),
                    peer,
                    receive_bytes: p.receive_bytes,
                    transmit_bytes: p.transmit_bytes,
                    handshake_age,
                });
            }
        }
        out
    }

    /// Every member's route to each peer, as last computed (docs/overlay/relays.md).
    pub fn route_series(&self) -> Vec<RouteSeries> {
        let inner = self.lock();
        let mut out = Vec::new();
        for (node, o) in inner.outputs.overlay.iter().filter(|(_, o)| o.public_key.is_some()) {
            for (peer, route) in &o.routes {
                out.push(RouteSeries { node: node.clone(), peer: peer.clone(), route: route.clone() });
            }
        }
        out
    }

    /// Per connected relay candidate, the bytes it relayed as its executor last reported them.
    pub fn relayed_bytes(&self) -> Vec<(String, u64)> {
        let inner = self.lock();
        inner
            .nodes
            .iter()
            .filter(|(n, e)| e.session.is_some() && inner.outputs.overlay.get(*n).is_some_and(|o| o.relay))
            .filter_map(|(n, e)| Some((n.clone(), e.peers.as_ref()?.relayed_bytes)))
            .collect()
    }

    /// Whether a silent peer's endpoint may move at `now` (docs/overlay/status.md): some
    /// member's report has a silent peer with more than one candidate, or a peer turned silent
    /// or live by time alone since the last compute. Records the new digests.
    /// Reads `node`'s counters from its kernel now (docs/operations/counters.md): asks its
    /// executor over its stream and waits for the answer, at most `timeout`. Err says why
    /// there is none: not connected, or no answer in time.
    pub async fn read_counters(&self, node: &str, timeout: Duration) -> Result<Arc<CounterReport>, String> {
        let (id, mut answers) = {
            let mut guard = self.lock();
            let Inner { nodes, counter_reads, .. } = &mut *guard;
            let Some(e) = nodes.get(node).filter(|e| e.session.is_some()) else {
                return Err(format!("node {node}: its executor is not connected"));
            };
            *counter_reads += 1;
            let id = *counter_reads;
            e.counters_asked.send_replace(id);
            (id, e.counters.subscribe())
        };
        let answered = async {
            loop {
                if let Some(r) = answers.borrow_and_update().as_ref().filter(|r| r.id >= id) {
                    return Some(r.clone());
                }
                if answers.changed().await.is_err() {
                    return None;
                }
            }
        };
        match tokio::time::timeout(timeout, answered).await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(format!("node {node}: gone while its counters were read")),
            Err(_) => Err(format!("node {node}: its executor did not answer within {} s", timeout.as_secs_f32())),
        }
    }

    /// Asks every connected executor for its counters, without waiting: the answers replace
    /// the last ones ([`Hub::counter_reports`]).
    pub fn ask_counters(&self) {
        let mut inner = self.lock();
        inner.counter_reads += 1;
        let id = inner.counter_reads;
        for e in inner.nodes.values().filter(|e| e.session.is_some()) {
            e.counters_asked.send_replace(id);
        }
    }

    /// Each node's last counter report with its desired state, for the metrics: a node whose
    /// executor disconnected has none.
    pub fn counter_reports(&self) -> Vec<(String, Arc<CounterReport>, Option<Arc<DesiredState>>)> {
        let inner = self.lock();
        inner
            .nodes
            .iter()
            .filter(|(_, e)| e.session.is_some())
            .filter_map(|(n, e)| Some((n.clone(), e.counters.borrow().clone()?, e.desired())))
            .collect()
    }

    /// While this replica leads, asks every executor for its counters every [`COUNTER_POLL`],
    /// for the per-mapping metrics.
    pub async fn counter_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(COUNTER_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut closing = self.closing();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = closing.changed() => return,
            }
            if self.leadership.borrow().leads() {
                self.ask_counters();
            }
        }
    }

    fn rotation_due(&self, now: Timestamp) -> bool {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let mut due = false;
        for e in inner.nodes.values_mut() {
            let Some(r) = &e.peers else { continue };
            let d = peers::digest(&r.observed, &inner.member_keys, now);
            due |= peers::any_rotating(&d, &inner.rotating) || d != e.peer_digest;
            e.peer_digest = d;
        }
        due
    }

    /// Recomputes whenever something changed, paced by [`PACE`], until the process ends. With
    /// a `gate`, each result is published only once the gate passed it (the Kubernetes source
    /// writes slot claims first); a closed gate retries after [`GATE_RETRY`].
    pub async fn recompute_loop(self: Arc<Self>, gate: Option<Arc<dyn Gate>>) {
        let mut leadership = self.leadership.clone();
        let overlay = self.settings.overlay.is_some();
        let mut last_start: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = self.changed.notified() => {}
                r = leadership.changed() => if r.is_err() { return },
                // Right after each rotation period begins: silent peers move on.
                _ = tokio::time::sleep(until_next_rotation(Timestamp::now())), if overlay => {
                    if !self.rotation_due(Timestamp::now()) {
                        continue;
                    }
                }
            }
            // Soon after the last start, wait out the pace: the changes that come meanwhile are
            // read by this compute, so their notices are taken here, not left to start another.
            if let Some(last) = last_start {
                let paced = tokio::time::sleep_until(last + PACE);
                tokio::pin!(paced);
                loop {
                    tokio::select! {
                        _ = &mut paced => break,
                        _ = self.changed.notified() => {}
                    }
                }
            }
            last_start = Some(tokio::time::Instant::now());
            let hub = self.clone();
            let computed = match tokio::task::spawn_blocking(move || hub.compute_now()).await {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "compute panicked");
                    continue;
                }
            };
            if let Some(gate) = &gate
                && !gate.clone().before_publish(computed.outputs.clone()).await
            {
                let hub = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(GATE_RETRY).await;
                    hub.changed.notify_one();
                });
                continue;
            }
            self.publish(computed);
        }
    }

    /// One compute and publish, now (no gate). Does nothing before the first inputs.
    pub fn recompute(&self) {
        if let Some(c) = self.compute_now() {
            self.publish(c);
        }
    }

    /// Computes from the current inputs, the reported facts and (standalone) the fed-back
    /// statuses. None before the first inputs.
    pub fn compute_now(&self) -> Option<Computed> {
        let started = Instant::now();
        let (mut cluster, term, read) = {
            let mut guard = self.lock();
            guard.inputs.as_ref()?;
            guard.reads += 1;
            let inner = &*guard;
            let read = inner.reads;
            let inputs = inner.inputs.as_ref()?;
            let mut cluster = Cluster::clone(inputs);
            if self.feed_back_status {
                for c in cluster.classes.iter_mut() {
                    if let Some(s) = c.metadata.name.as_ref().and_then(|n| inner.class_status.get(n)) {
                        c.status = Some(s.clone());
                    }
                }
                for pm in cluster.port_maps.iter_mut() {
                    let key: MapKey = admission::key_of(pm);
                    if let Some(s) = inner.port_map_status.get(&key) {
                        pm.status = Some(s.clone());
                    }
                }
            }
            let reported: BTreeMap<&String, &KnownFacts> =
                inner.nodes.iter().filter_map(|(node, e)| Some((node, &e.facts.as_ref()?.1))).collect();
            cluster.facts.retain(|x| !reported.contains_key(&x.node));
            cluster.facts.extend(reported.into_values().cloned());
            for (node, e) in &inner.nodes {
                if let Some(r) = &e.refused_facts {
                    cluster.refused_facts.insert(node.clone(), r.clone());
                }
            }
            if self.settings.overlay.is_some() {
                cluster.overlay_observed = observed(inner);
            }
            (cluster, self.leadership.borrow().term, read)
        };
        cluster.now = Timestamp::now();
        let (outputs, port_maps) = {
            let mut computer = self.computer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let outputs = Arc::new(computer.compute(&cluster));
            let r = computer.redone();
            (
                outputs,
                if !r.port_maps {
                    "kept"
                } else if r.port_maps_patched {
                    "patched"
                } else {
                    "whole"
                },
            )
        };
        if let Some(o) = &self.settings.overlay {
            // Which peers rotate while silent: judged again, which is cheap beside the compute.
            let judged = members::judge(&cluster, o);
            let rotating = judged
                .candidates
                .iter()
                .filter(|(_, c)| c.len() > 1)
                .filter_map(|(n, _)| Some(judged.members.get(n)?.public_key.clone()))
                .collect();
            self.lock().rotating = rotating;
        }
        self.metrics.observe_reconcile(started.elapsed());
        tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, port_maps, "computed");
        Some(Computed { outputs, term, read })
    }

    /// Makes `c` the current outputs and sends every node whose state changed its new state.
    pub fn publish(&self, c: Computed) {
        let Computed { outputs: out, term, read } = c;
        let mut inner = self.lock();
        inner.computes += 1;
        inner.class_status = out.classes.clone();
        inner.port_map_status = out.port_maps.clone();
        let restamp = inner.term != term;
        inner.term = term;
        let mut names: Vec<String> = out.node_states.keys().cloned().collect();
        names.extend(inner.nodes.keys().filter(|n| !out.node_states.contains_key(*n)).cloned());
        let mut published = 0;
        for name in names {
            let state = out
                .node_states
                .get(&name)
                .cloned()
                .unwrap_or_else(|| Arc::new(NodeState { node: name.clone(), ..Default::default() }));
            // Computed states are canonical already (compute's assembly canonicalizes them).
            let version = kuport_proto::canonical_version(&state);
            let same =
                inner.nodes.get(&name).and_then(NodeEntry::desired).is_some_and(|d| d.version == version && !restamp);
            if same {
                if let Some(e) = inner.nodes.get_mut(&name) {
                    e.oversize = None;
                }
                continue;
            }
            // Copied only when sent: most computes change few states.
            let state = Some(NodeState::clone(&state));
            let ds = DesiredState { term, sequence: inner.sequence + 1, version, state };
            // A state the executor would not decode is not sent: the node keeps its last one,
            // and the refusal is logged, counted and shown as the node's error.
            let bytes = kuport_proto::channel::state_message_len(&ds);
            if bytes > MAX_STATE_MESSAGE {
                let entry = inner.nodes.entry(name.clone()).or_insert_with(NodeEntry::new);
                if entry.oversize.as_ref().is_none_or(|o| o.version != ds.version) {
                    tracing::error!(node = %name, bytes, limit = MAX_STATE_MESSAGE, version = %ds.version,
                        "node state larger than an executor decodes: not sent, the node keeps its last state");
                    self.metrics.states_oversize.inc();
                }
                entry.oversize = Some(Oversize { version: ds.version, bytes });
                continue;
            }
            inner.sequence += 1;
            let endpoints = self.settings.overlay.as_ref().and_then(|o| sent_endpoints(&ds, &o.interface));
            let entry = inner.nodes.entry(name).or_insert_with(NodeEntry::new);
            entry.oversize = None;
            entry.sent_endpoints = endpoints;
            entry.tx.send_replace(Some(Arc::new(ds)));
            published += 1;
        }
        let mut since = std::mem::take(&mut inner.holds_since);
        since.retain(|k, _| out.tracked.contains_key(k));
        for (key, tracked) in out.tracked.iter() {
            if !restamp && since.get(key).is_some_and(|(f, _)| *f == tracked.fingerprint) {
                continue;
            }
            let nodes = tracked
                .nodes
                .iter()
                .filter_map(|n| {
                    let d = inner.nodes.get(n).and_then(NodeEntry::desired)?;
                    Some((n.clone(), (d.term, d.sequence)))
                })
                .collect();
            since.insert(key.clone(), (tracked.fingerprint, nodes));
        }
        inner.holds_since = since;
        // Peer reports count for members only; a node that left the mesh loses its series.
        inner.member_keys = out.overlay.values().filter_map(|o| o.public_key.clone()).collect();
        for (name, e) in inner.nodes.iter_mut() {
            if out.overlay.get(name).is_none_or(|o| o.public_key.is_none()) {
                e.peers = None;
                e.reach_since.clear();
                e.peer_digest.clear();
            }
        }
        // Held first states that this compute read the report of go out now.
        for e in inner.nodes.values_mut() {
            if let Hold::Compute { after, .. } = e.hold
                && read > after
            {
                e.release(term);
            }
        }
        inner.outputs = out;
        drop(inner);
        self.status_dirty.notify_one();
        tracing::info!(published, "node states published");
    }

    /// Resolves when statuses may need writing (a publish, an ack, a connect or disconnect).
    pub async fn status_dirty(&self) {
        self.status_dirty.notified().await;
    }

    /// Asks for a recompute (the inputs changed in place, or a retry).
    pub fn request_recompute(&self) {
        self.changed.notify_one();
    }
}

/// Moves every held first state whose executor reported on to wait for the next compute, once
/// every Node that carries a published key (`kuport.wlz.li/wireguard-public-key`, written by
/// the last leader) has had its executor's key reported here: without them, that state would
/// lack those peers. The annotation is only a hint of whom to wait for; keys still come from
/// the executors alone. true: a compute is needed.
fn advance_holds(inner: &mut Inner) -> bool {
    use crate::compute::overlay::PUBLIC_KEY_ANNOTATION;
    if !inner.nodes.values().any(|e| matches!(e.hold, Hold::Waiting { reported: true, .. })) {
        return false;
    }
    let inputs = inner.inputs.clone();
    let keyed = inputs
        .iter()
        .flat_map(|c| &c.nodes)
        .filter(|n| n.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(PUBLIC_KEY_ANNOTATION)));
    let known = |name: &str| {
        inner.nodes.get(name).and_then(|e| e.facts.as_ref()).is_some_and(|(_, f)| f.wireguard_public_key.is_some())
    };
    if !keyed.filter_map(|n| n.metadata.name.as_deref()).all(known) {
        return false;
    }
    let after = inner.reads;
    for e in inner.nodes.values_mut() {
        if let Hold::Waiting { session, reported: true, .. } = e.hold {
            e.hold = Hold::Compute { session, after };
        }
    }
    true
}

/// How long until the next rotation period begins at `now`, and a little: a compute right
/// after it sees the new period.
fn until_next_rotation(now: Timestamp) -> Duration {
    let period = Duration::from_secs(ROTATE_EVERY_SECONDS.unsigned_abs());
    let into =
        Duration::from_nanos(u64::try_from(now.as_nanosecond().rem_euclid(period.as_nanos() as i128)).unwrap_or(0));
    period.saturating_sub(into) + Duration::from_millis(50)
}

/// What the endpoint choice reads of the hub (docs/overlay/status.md): every node's latest
/// peer report, the address each executor's stream came from, and the endpoint the state last
/// sent to each node gives each peer. Each node's part is shared, not copied.
fn observed(inner: &Inner) -> OverlayObserved {
    let mut o = OverlayObserved::default();
    for (node, e) in &inner.nodes {
        if let Some(r) = &e.peers {
            o.reports.insert(node.clone(), r.observed.clone());
        }
        if let Some(a) = e.connect_address {
            o.connect_addresses.insert(node.clone(), a);
        }
        if let Some(endpoints) = &e.sent_endpoints {
            o.last_endpoints.insert(node.clone(), endpoints.clone());
        }
    }
    o
}

/// Per peer key, the endpoint `ds`'s overlay device `interface` gives it; None when it gives
/// none. Read once per state sent, not at every compute.
fn sent_endpoints(ds: &DesiredState, interface: &str) -> Option<Arc<BTreeMap<String, SocketAddr>>> {
    let endpoints: BTreeMap<String, SocketAddr> = ds
        .state
        .iter()
        .flat_map(|s| &s.netns)
        .filter(|ns| ns.is_host())
        .flat_map(|ns| &ns.wireguard_devices)
        .filter(|d| d.name == interface)
        .flat_map(|d| &d.peers)
        .filter_map(|p| Some((p.public_key.clone(), p.endpoint.parse().ok()?)))
        .collect();
    (!endpoints.is_empty()).then(|| Arc::new(endpoints))
}

/// A compute's result, not yet published.
#[derive(Debug, Clone)]
pub struct Computed {
    pub outputs: Arc<Outputs>,
    pub term: u64,
    /// Its number among the computes begun ([`Hold::Compute`]).
    read: u64,
}

/// What must happen before node states are published (the Kubernetes source writes the
/// classes' slot claims, so that no executor holds a slot the API does not).
pub trait Gate: Send + Sync {
    /// true: publish; false: keep the previous states and retry later.
    fn before_publish(
        self: Arc<Self>,
        outputs: Arc<Outputs>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;
}

/// How long a closed gate waits before the compute is tried again.
pub const GATE_RETRY: Duration = Duration::from_secs(1);

fn snapshot(node: &str, e: &NodeEntry) -> NodeSnapshot {
    NodeSnapshot {
        node: node.to_string(),
        desired: e.desired(),
        connected: e.session.is_some(),
        executor_version: e.executor_version.clone(),
        since: e.since.elapsed(),
        acked: e.acked.clone(),
        errors: e.oversize.iter().map(Oversize::error).chain(e.errors.iter().cloned()).collect(),
        drift_repairs: e.drift_repairs,
        last_drift: e.last_drift.clone(),
        facts: e.facts.as_ref().map(|(f, _)| f.clone()),
        peers: e.peers.as_ref().map(|r| r.statuses.clone()).unwrap_or_default(),
        reach_since: e.reach_since.iter().map(|(k, (_, at))| (k.clone(), *at)).collect(),
    }
}

/// A change of a peer's reach recomputes, and relays the pair (docs/overlay/relays.md); a report
/// that changes only bytes does not.
#[cfg(test)]
mod reach_tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kuport_proto::v1::{ExecutorMessage, Hello, PeerReport, PeerStatus, Reach, executor_message};

    use super::*;
    use crate::compute::overlay::OverlaySettings;
    use crate::compute::overlay::relays::{CONTROL_PLANE_LABEL, PeerRoute};
    use crate::stream::leader;

    const CLOUD: &str = "kOzLDlGv6e2AmDVfmJC7dRGCU8vMC9RcrxDBB4Y+uiM=";
    const HOME_A: &str = "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiU=";
    const HOME_B: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    fn node(name: &str, ip: &str, pod_cidr: &str, relay: bool) -> Node {
        let labels = relay.then(|| [(CONTROL_PLANE_LABEL.to_string(), String::new())].into());
        Node {
            metadata: ObjectMeta { name: Some(name.into()), labels, ..Default::default() },
            spec: Some(NodeSpec { pod_cidrs: Some(vec![pod_cidr.into()]), ..Default::default() }),
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip.into() }]),
                ..Default::default()
            }),
        }
    }

    fn report(peers: &[(&str, u64, Reach)]) -> ExecutorMessage {
        let peers = peers
            .iter()
            .map(|(key, rx, reach)| PeerStatus {
                public_key: (*key).into(),
                receive_bytes: *rx,
                reach: *reach as i32,
                ..Default::default()
            })
            .collect();
        ExecutorMessage {
            message: Some(executor_message::Message::Peers(PeerReport {
                peers,
                read_unix_seconds: 0,
                relayed_bytes: 0,
            })),
        }
    }

    /// A hub with the overlay on, given the homes scenario (cloud labelled control-plane, two
    /// homes behind the same LAN address, each with its executor's key) and computed once. The
    /// leadership sender keeps the hub the leader while it lives.
    fn homes() -> (watch::Sender<Leadership>, Arc<Hub>) {
        let (tx, rx) = leader::standalone("127.0.0.1:1".into());
        let settings = Settings { overlay: Some(OverlaySettings::default()) };
        let hub = Hub::new(settings, rx, true);
        let facts = |n: &str, k: &str| KnownFacts {
            node: n.into(),
            wireguard_public_key: Some(k.into()),
            ..Default::default()
        };
        hub.set_inputs(Cluster {
            nodes: vec![
                node("cloud", "203.0.113.10", "10.42.0.0/24", true),
                node("home-a", "10.99.0.2", "10.42.1.0/24", false),
                node("home-b", "10.99.0.2", "10.42.2.0/24", false),
            ]
            .into(),
            facts: vec![facts("cloud", CLOUD), facts("home-a", HOME_A), facts("home-b", HOME_B)],
            ..Default::default()
        });
        hub.recompute();
        (tx, hub)
    }

    /// Whether the hub asked for a recompute since the last call (a stored permit).
    async fn asked(hub: &Hub) -> bool {
        tokio::time::timeout(Duration::from_millis(50), hub.changed.notified()).await.is_ok()
    }

    #[tokio::test]
    async fn a_change_of_reach_recomputes_and_relays_the_pair_and_bytes_alone_do_not() {
        let (_tx, hub) = homes();
        for n in ["cloud", "home-a", "home-b"] {
            let _ = hub.connect(&Hello { node: n.into(), executor_version: "test".into(), applied: None });
        }
        let _ = asked(&hub).await;
        let route = |hub: &Hub| hub.outputs().0.overlay["home-a"].routes["home-b"].clone();

        hub.receive("home-a", report(&[(CLOUD, 1, Reach::Direct), (HOME_B, 1, Reach::Unknown)]));
        assert!(asked(&hub).await, "a first report");
        hub.receive("home-a", report(&[(CLOUD, 9, Reach::Direct), (HOME_B, 9, Reach::Unknown)]));
        assert!(!asked(&hub).await, "bytes alone");
        hub.receive("home-a", report(&[(CLOUD, 9, Reach::Direct), (HOME_B, 9, Reach::Unreachable)]));
        assert!(asked(&hub).await, "home-b turned unreachable");
        hub.recompute();
        assert_eq!(route(&hub), PeerRoute::Via("cloud".into()));
        let desired = hub.node("home-a").and_then(|n| n.desired).expect("a state");
        let state = desired.state.as_ref().expect("a state");
        let peer = state.netns[0].wireguard_devices[0].peers.iter().find(|p| p.public_key == HOME_B).expect("home-b");
        assert_eq!(
            (peer.allowed_ips.as_slice(), peer.probe_address.as_str()),
            (&["10.42.2.0/32".to_string()][..], "10.42.2.0")
        );
        hub.receive("home-a", report(&[(CLOUD, 20, Reach::Direct), (HOME_B, 20, Reach::Unreachable)]));
        assert!(!asked(&hub).await, "bytes alone, relayed");
        hub.receive("home-a", report(&[(CLOUD, 20, Reach::Direct), (HOME_B, 20, Reach::Direct)]));
        assert!(asked(&hub).await, "home-b reachable again");
        hub.recompute();
        assert_eq!(route(&hub), PeerRoute::Direct);
    }

    /// A new leader (docs/overlay/status.md, "A new leader"): its first compute ran before any
    /// report, so it has every pair direct. home-a's first state waits for home-a's report after
    /// Hello and goes out relayed; a report that changes nothing computed still asks for the
    /// compute that lets it go; the timeout lets an executor that sends none have its state.
    #[tokio::test]
    async fn a_new_leaders_first_state_waits_for_the_report_and_goes_out_relayed() {
        use kuport_proto::v1::Applied;
        let (_tx, hub) = homes();
        let route = |hub: &Hub| hub.outputs().0.overlay["home-a"].routes["home-b"].clone();
        assert_eq!(route(&hub), PeerRoute::Direct, "no report yet");
        // Executors that applied a state before (the old leader's) say so in Hello.
        let applied = Some(Applied { term: 1, sequence: 7, version: "old".into() });
        let hello = |n: &str| Hello { node: n.into(), executor_version: "test".into(), applied: applied.clone() };
        let a = hub.connect(&hello("home-a"));
        assert!(*a.held.borrow() && a.hold_until.is_some(), "held for home-a's report");
        assert!(!hub.served_this_term("home-a"));
        let _ = asked(&hub).await;

        hub.receive("home-a", report(&[(CLOUD, 1, Reach::Direct), (HOME_B, 1, Reach::Unreachable)]));
        assert!(asked(&hub).await, "the report recomputes");
        assert!(*a.held.borrow(), "until a compute read it");
        hub.recompute();
        assert!(!*a.held.borrow(), "let go by the compute that read the report");
        assert!(hub.served_this_term("home-a"));
        let desired = a.desired.borrow().clone().expect("a state");
        let state = desired.state.as_ref().expect("a state");
        let peer = state.netns[0].wireguard_devices[0].peers.iter().find(|p| p.public_key == HOME_B).expect("home-b");
        assert_eq!(peer.allowed_ips, ["10.42.2.0/32".to_string()], "the first state it sends has the pair relayed");
        assert_eq!(route(&hub), PeerRoute::Via("cloud".into()));

        // home-b's report changes nothing computed (it names no member): the next compute lets
        // it go, and one is asked for.
        let b = hub.connect(&hello("home-b"));
        assert!(*b.held.borrow());
        hub.receive("home-b", report(&[]));
        assert!(asked(&hub).await && *b.held.borrow());
        hub.recompute();
        assert!(!*b.held.borrow() && hub.served_this_term("home-b"));
        // cloud sends none: held until the timeout, which the session calls.
        let c = hub.connect(&hello("cloud"));
        assert!(*c.held.borrow() && !hub.served_this_term("cloud"));
        hub.release_hold("cloud", c.id);
        assert!(!*c.held.borrow() && hub.served_this_term("cloud"));
        // What the status writer then writes: the routes as they were (so nothing changes).
        let annotations = crate::compute::overlay::annotations(&hub.outputs().0.overlay);
        assert_eq!(
            annotations["home-a"][crate::compute::overlay::ROUTES_ANNOTATION],
            r#"{"cloud":"direct","home-b":"via cloud"}"#
        );
        // A reconnect in the same term does not wait for its report: this term's computes have
        // it. It waits only for the facts this replica never got from home-a (the test's are
        // inputs).
        let again = hub.connect(&hello("home-a"));
        assert!(matches!(hub.lock().nodes["home-a"].hold, Hold::Waiting { awaits: Awaited::Facts, .. }));
        hub.release_hold("home-a", again.id);
        assert!(!*again.held.borrow());
        // A fresh executor waits for its facts.
        let fresh = hub.connect(&Hello { node: "home-c".into(), executor_version: "test".into(), applied: None });
        assert!(*fresh.held.borrow(), "held for its facts");
    }
}

/// A computed state larger than an executor decodes is not sent: the node keeps its last one and
/// the refusal is counted and shown (docs/design.md, "What the executor refuses").
#[cfg(test)]
mod oversize_tests {
    use kuport_proto::v1::{NetnsState, Sysctl};

    use super::*;
    use crate::stream::leader;

    fn outputs(value_bytes: usize) -> Computed {
        let ns = NetnsState {
            sysctls: vec![Sysctl {
                key: kuport_proto::owned::SYSCTL_FORWARDING.into(),
                value: "1".repeat(value_bytes),
            }],
            ..Default::default()
        };
        let mut state = NodeState { node: "n1".into(), netns: vec![ns] };
        kuport_proto::canonicalize(&mut state);
        let mut out = Outputs::default();
        out.node_states.insert("n1".into(), Arc::new(state));
        Computed { outputs: Arc::new(out), term: 1, read: 0 }
    }

    #[test]
    fn an_oversize_state_is_kept_back_counted_and_shown() {
        let (_tx, rx) = leader::standalone("127.0.0.1:1".into());
        let hub = Hub::new(Settings::default(), rx, true);
        hub.publish(outputs(1));
        let first = hub.node("n1").and_then(|n| n.desired).expect("the small state is sent");
        for _ in 0..2 {
            hub.publish(outputs(MAX_STATE_MESSAGE));
        }
        let n = hub.node("n1").expect("n1");
        assert_eq!(n.desired.map(|d| d.version.clone()), Some(first.version.clone()), "the last state stays");
        assert_eq!(hub.metrics().states_oversize.get(), 1, "counted once per state");
        assert!(
            n.errors.len() == 1 && n.errors[0].reason.contains("more than the 33554432 an executor decodes"),
            "{:?}",
            n.errors
        );
        // A state that fits again is sent, and the refusal goes.
        hub.publish(outputs(2));
        let n = hub.node("n1").expect("n1");
        assert!(n.desired.is_some_and(|d| d.version != first.version) && n.errors.is_empty(), "{:?}", n.errors);
    }
}

/// Counter reads (docs/operations/counters.md): asked over the stream, answered by the
/// executor; an answer nobody asked for is not believed.
#[cfg(test)]
mod counter_tests {
    use std::time::Duration;

    use kuport_proto::v1::{CounterReport, ExecutorMessage, Hello, executor_message};

    use super::*;
    use crate::stream::leader;

    fn answer(id: u64, error: &str) -> ExecutorMessage {
        let report = CounterReport { id, error: error.into(), ..Default::default() };
        ExecutorMessage { message: Some(executor_message::Message::Counters(report)) }
    }

    #[tokio::test]
    async fn a_read_is_asked_on_the_stream_and_only_its_answer_is_taken() {
        let (_lead, rx) = leader::standalone("127.0.0.1:1".into());
        let hub = Hub::new(Settings::default(), rx, true);
        let gone = hub.read_counters("edge-a", Duration::from_millis(50)).await.unwrap_err();
        assert_eq!(gone, "node edge-a: its executor is not connected");

        let mut session = hub.connect(&Hello { node: "edge-a".into(), ..Default::default() });
        // The attack: counters pushed before any read was asked are dropped.
        assert!(hub.receive_from("edge-a", session.id, answer(7, "pushed")));
        assert!(hub.counter_reports().is_empty(), "an unasked report is not kept");

        let reader = {
            let hub = hub.clone();
            tokio::spawn(async move { hub.read_counters("edge-a", Duration::from_secs(5)).await })
        };
        session.counters_asked.changed().await.expect("the session is asked");
        let id = *session.counters_asked.borrow_and_update();
        assert_eq!(id, 1);
        assert!(hub.receive_from("edge-a", session.id, answer(id, "")));
        let report = reader.await.expect("join").expect("answered");
        assert_eq!((report.id, report.error.as_str()), (1, ""));
        assert_eq!(hub.counter_reports().len(), 1);

        // No answer in time: the read says so, naming the node.
        let late = hub.read_counters("edge-a", Duration::from_millis(50)).await.unwrap_err();
        assert_eq!(late, "node edge-a: its executor did not answer within 0.05 s");
    }
}
