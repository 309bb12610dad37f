//! Prometheus metrics: counters the hub bumps as it works, gauges read from the hub at scrape
//! time, served as text on --metrics-listen at /metrics.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::compute::overlay::relays::PeerRoute;
use crate::report::counters::{Owners, attribute};
use crate::stream::Hub;
use crate::stream::hub::NodeSnapshot;
use crate::trust::tls::Tls;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

/// A WireGuard peer as a node reports it: `node` reports, `peer` is the peer's node (its key's
/// first 8 characters when no member has the key).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    pub node: String,
    pub peer: String,
}

/// A relayed peer: `node`'s pod traffic to `peer` goes through `via` (docs/overlay/relays.md).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RelayLabels {
    pub node: String,
    pub peer: String,
    pub via: String,
}

/// One PortMap on one of its accepting nodes (docs/operations/counters.md).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabels {
    pub namespace: String,
    pub name: String,
    pub node: String,
}

/// A PortMap's drops on one accepting node, by what dropped them: `source` (the allow-list),
/// `rate` or `connections` (the per-source bounds).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub reason: String,
}

/// What a write to the API server was.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum WriteKind {
    ClassStatus,
    PortMapStatus,
    InterceptStatus,
    /// The overlay's annotations on a Node (docs/overlay/mesh.md).
    NodeAnnotations,
    Event,
}

/// Why a stream or call was refused (crate::trust::identity::reason).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    pub kind: WriteKind,
}

/// Everything kuport's controller exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Computes run (each a full recompute of every node's state and status).
    pub reconciles: Counter,
    pub reconcile_seconds: Histogram,
    /// Refusals (NACKs) executors answered with.
    pub nacks: Counter,
    /// Executor reports refused whole for breaking a bound (docs/security.md).
    pub facts_refused: Counter,
    /// Computed node states not sent for exceeding what an executor decodes.
    pub states_oversize: Counter,
    /// States sent with namespaces as deltas or stubs that an executor refused, each followed
    /// by the state sent whole (docs/design.md, "Deltas").
    pub deltas_refused: Counter,
    /// Namespaces sent as deltas from the version an executor held (docs/design.md, "Deltas").
    pub deltas_sent: Counter,
    /// Writes sent to the API server, failed ones included: a replica that does not lead
    /// sends none.
    api_writes: Family<WriteLabel, Counter>,
    /// NodeSync streams refused, by reason (no token, wrong node, ...).
    executor_refusals: Family<ReasonLabel, Counter>,
    /// Debug calls refused, by reason.
    debug_refusals: Family<ReasonLabel, Counter>,
    /// TokenReviews sent for executors (the cache answers the rest).
    pub token_reviews: Counter,
    /// TokenReviews and SubjectAccessReviews sent for Debug calls.
    pub debug_reviews: Counter,
    /// Connections refused at the TLS handshake (a plain-text client, a wrong CA, a timeout).
    pub tls_refusals: Counter,
    executors_connected: Gauge,
    /// Nodes whose executor has not acknowledged their current desired version.
    nodes_out_of_sync: Gauge,
    /// Per node: 1 when the acknowledged version is the desired one.
    node_in_sync: Family<NodeLabel, Gauge>,
    /// Per node: 1 while its executor has a stream open (an alert needs to know which node).
    node_connected: Family<NodeLabel, Gauge>,
    /// The gRPC port's certificate, read at each scrape (renewals replace it).
    serving: OnceLock<Tls>,
    /// When that certificate ends, seconds since the epoch; 0 before one is served.
    serving_not_after: Gauge,
    /// Drift repairs executors reported (the sum of their counters).
    drift_repairs: Gauge,
    leader: Gauge,
    /// Per connected member and peer, WireGuard's counters as its executor last reported them
    /// (docs/overlay/status.md); they start again when a peer entry is made anew.
    peer_receive_bytes: Family<PeerLabels, Counter>,
    peer_transmit_bytes: Family<PeerLabels, Counter>,
    /// Seconds since the peer's last handshake; +Inf for none ever.
    peer_handshake_age: Family<PeerLabels, Gauge<f64, AtomicU64>>,
    /// Per member and peer, the route as last computed (docs/overlay/relays.md): 1 when
    /// direct; a relayed peer has a `peer_relayed` series naming its relay instead.
    peer_direct: Family<PeerLabels, Gauge>,
    peer_relayed: Family<RelayLabels, Gauge>,
    /// Per connected relay candidate, what its relay rule's counter says it relayed.
    relayed_bytes: Family<NodeLabel, Counter>,
    portmap_packets: Family<MapLabels, Counter>,
    portmap_bytes: Family<MapLabels, Counter>,
    portmap_connections: Family<MapLabels, Counter>,
    portmap_dropped: Family<DropLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kuport");
        let reconciles = Counter::default();
        let reconcile_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let nacks = Counter::default();
        let facts_refused = Counter::default();
        let states_oversize = Counter::default();
        let deltas_refused = Counter::default();
        let deltas_sent = Counter::default();
        let api_writes = Family::<WriteLabel, Counter>::default();
        let executor_refusals = Family::<ReasonLabel, Counter>::default();
        let debug_refusals = Family::<ReasonLabel, Counter>::default();
        let token_reviews = Counter::default();
        let debug_reviews = Counter::default();
        let tls_refusals = Counter::default();
        let executors_connected = Gauge::default();
        let nodes_out_of_sync = Gauge::default();
        let node_in_sync = Family::<NodeLabel, Gauge>::default();
        let node_connected = Family::<NodeLabel, Gauge>::default();
        let serving_not_after = Gauge::default();
        let drift_repairs = Gauge::default();
        let leader = Gauge::default();
        let peer_receive_bytes = Family::<PeerLabels, Counter>::default();
        let peer_transmit_bytes = Family::<PeerLabels, Counter>::default();
        let peer_handshake_age = Family::<PeerLabels, Gauge<f64, AtomicU64>>::default();
        let peer_direct = Family::<PeerLabels, Gauge>::default();
        let peer_relayed = Family::<RelayLabels, Gauge>::default();
        let relayed_bytes = Family::<NodeLabel, Counter>::default();
        let portmap_packets = Family::<MapLabels, Counter>::default();
        let portmap_bytes = Family::<MapLabels, Counter>::default();
        let portmap_connections = Family::<MapLabels, Counter>::default();
        let portmap_dropped = Family::<DropLabels, Counter>::default();
        registry.register("reconciles", "Full recomputes of every node state and status", reconciles.clone());
        registry.register("reconcile_seconds", "Time of one recompute", reconcile_seconds.clone());
        registry.register("nacks", "States an executor refused", nacks.clone());
        registry.register("facts_refused", "Executor fact reports refused for breaking a bound", facts_refused.clone());
        registry.register(
            "states_oversize",
            "Computed node states not sent: larger than an executor decodes",
            states_oversize.clone(),
        );
        registry.register(
            "deltas_refused",
            "States sent as deltas from what an executor held that it refused, then sent whole",
            deltas_refused.clone(),
        );
        registry.register(
            "deltas_sent",
            "Namespaces sent as deltas from the version an executor held",
            deltas_sent.clone(),
        );
        registry.register(
            "api_writes",
            "Writes sent to the API server (failed ones too): class and PortMap statuses, events",
            api_writes.clone(),
        );
        registry.register("executor_refusals", "NodeSync streams refused, by reason", executor_refusals.clone());
        registry.register("debug_refusals", "Debug calls refused, by reason", debug_refusals.clone());
        registry.register("token_reviews", "TokenReviews sent to prove executors' nodes", token_reviews.clone());
        registry.register("debug_reviews", "Token and access reviews sent for Debug calls", debug_reviews.clone());
        registry.register(
            "tls_refusals",
            "Connections refused at the TLS handshake: plain text, a failed or timed-out handshake",
            tls_refusals.clone(),
        );
        registry.register("executors_connected", "Executors with an open NodeSync stream", executors_connected.clone());
        registry.register(
            "nodes_out_of_sync",
            "Nodes whose executor has not acknowledged the desired version",
            nodes_out_of_sync.clone(),
        );
        registry.register("node_in_sync", "1 when the node acknowledged its desired version", node_in_sync.clone());
        registry.register(
            "node_connected",
            "1 while the node's executor has a NodeSync stream open",
            node_connected.clone(),
        );
        registry.register(
            "serving_certificate_expiration_timestamp_seconds",
            "When the gRPC port's certificate ends, in seconds since the epoch (0: none served yet)",
            serving_not_after.clone(),
        );
        registry.register("drift_repairs_reported", "Drift repairs executors reported", drift_repairs.clone());
        registry.register("leader", "1 while this replica leads", leader.clone());
        registry.register(
            "overlay_peer_receive_bytes",
            "Bytes a node's WireGuard received from a peer, as its executor reported",
            peer_receive_bytes.clone(),
        );
        registry.register(
            "overlay_peer_transmit_bytes",
            "Bytes a node's WireGuard sent to a peer, as its executor reported",
            peer_transmit_bytes.clone(),
        );
        registry.register(
            "overlay_peer_last_handshake_age_seconds",
            "Seconds since a node's last WireGuard handshake with a peer (+Inf: never)",
            peer_handshake_age.clone(),
        );
        registry.register(
            "overlay_peer_direct",
            "1 when a member's pod traffic to a peer goes directly, as last computed; 0 when relayed or unreachable",
            peer_direct.clone(),
        );
        registry.register(
            "overlay_peer_relayed",
            "1 for each peer a member's pod traffic reaches through a relay (via: the relay's node)",
            peer_relayed.clone(),
        );
        registry.register(
            "overlay_relayed_bytes",
            "Bytes a relay candidate forwarded between two of its WireGuard peers, as its executor reported",
            relayed_bytes.clone(),
        );
        registry.register(
            "portmap_accepted_packets",
            "Packets a PortMap's accepting node let through to it, from the kernel's counters (read every 15 s)",
            portmap_packets.clone(),
        );
        registry.register(
            "portmap_accepted_bytes",
            "Bytes a PortMap's accepting node let through to it, from the kernel's counters (read every 15 s)",
            portmap_bytes.clone(),
        );
        registry.register(
            "portmap_connections",
            "New connections (TCP, or UDP flows) a PortMap's accepting node translated to it",
            portmap_connections.clone(),
        );
        registry.register(
            "portmap_dropped_packets",
            "Packets a PortMap's accepting node dropped: reason source (allow-list), rate or connections (per-source bounds; new connections)",
            portmap_dropped.clone(),
        );
        Metrics {
            registry,
            reconciles,
            reconcile_seconds,
            nacks,
            states_oversize,
            deltas_refused,
            deltas_sent,
            facts_refused,
            api_writes,
            executor_refusals,
            debug_refusals,
            token_reviews,
            debug_reviews,
            tls_refusals,
            executors_connected,
            nodes_out_of_sync,
            node_in_sync,
            node_connected,
            serving: OnceLock::new(),
            serving_not_after,
            drift_repairs,
            leader,
            peer_receive_bytes,
            peer_transmit_bytes,
            peer_handshake_age,
            peer_direct,
            peer_relayed,
            relayed_bytes,
            portmap_packets,
            portmap_bytes,
            portmap_connections,
            portmap_dropped,
        }
    }
}

impl Metrics {
    pub fn observe_reconcile(&self, took: Duration) {
        self.reconciles.inc();
        self.reconcile_seconds.observe(took.as_secs_f64());
    }

    /// Counts one write about to be sent to the API server.
    pub fn api_write(&self, kind: WriteKind) {
        self.api_writes.get_or_create(&WriteLabel { kind }).inc();
    }

    /// Reports `tls`'s certificate end from now on (the first call wins: one port, one Tls).
    pub fn watch_certificate(&self, tls: Tls) {
        let _ = self.serving.set(tls);
    }

    /// Counts one NodeSync stream refused for `reason`.
    pub fn executor_refused(&self, reason: &str) {
        self.executor_refusals.get_or_create(&ReasonLabel { reason: reason.into() }).inc();
    }

    /// Counts one Debug call refused for `reason`.
    pub fn debug_refused(&self, reason: &str) {
        self.debug_refusals.get_or_create(&ReasonLabel { reason: reason.into() }).inc();
    }

    /// The metrics as Prometheus text, gauges read from `hub` now.
    pub fn render(&self, hub: &Hub) -> String {
        self.refresh(hub);
        self.encode()
    }

    /// Gives each family with labels one label set of placeholders: a family is encoded only
    /// once it holds a label set, and a test of series names needs all of them. Not for a
    /// running controller (the placeholders would be scraped).
    #[doc(hidden)]
    pub fn touch_every_family(&self) {
        let (node, peer, via) = ("-".to_string(), "-".to_string(), "-".to_string());
        let _ = self.api_writes.get_or_create(&WriteLabel { kind: WriteKind::Event });
        let _ = self.executor_refusals.get_or_create(&ReasonLabel { reason: "-".into() });
        let _ = self.debug_refusals.get_or_create(&ReasonLabel { reason: "-".into() });
        let _ = self.node_in_sync.get_or_create(&NodeLabel { node: node.clone() });
        let _ = self.node_connected.get_or_create(&NodeLabel { node: node.clone() });
        let pair = PeerLabels { node: node.clone(), peer: peer.clone() };
        let _ = self.peer_receive_bytes.get_or_create(&pair);
        let _ = self.peer_transmit_bytes.get_or_create(&pair);
        let _ = self.peer_handshake_age.get_or_create(&pair);
        let _ = self.peer_direct.get_or_create(&pair);
        let _ = self.peer_relayed.get_or_create(&RelayLabels { node: node.clone(), peer, via });
        let _ = self.relayed_bytes.get_or_create(&NodeLabel { node: node.clone() });
        let map = MapLabels { namespace: "-".into(), name: "-".into(), node: node.clone() };
        let _ = self.portmap_packets.get_or_create(&map);
        let _ = self.portmap_bytes.get_or_create(&map);
        let _ = self.portmap_connections.get_or_create(&map);
        let _ = self.portmap_dropped.get_or_create(&DropLabels {
            namespace: "-".into(),
            name: "-".into(),
            node,
            reason: "-".into(),
        });
    }

    /// The registry as Prometheus text, as it is now.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        text
    }

    /// Reads the gauges and the per-node and per-peer families from `hub`.
    fn refresh(&self, hub: &Hub) {
        let nodes = hub.nodes();
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.executors_connected.set(gauge(nodes.iter().filter(|n| n.connected).count()));
        let in_sync = |n: &NodeSnapshot| match (&n.acked, &n.desired) {
            (Some(a), Some(d)) => a.version == d.version,
            _ => false,
        };
        self.nodes_out_of_sync.set(gauge(nodes.iter().filter(|n| n.desired.is_some() && !in_sync(n)).count()));
        self.node_in_sync.clear();
        self.node_connected.clear();
        for n in &nodes {
            let label = NodeLabel { node: n.node.clone() };
            self.node_in_sync.get_or_create(&label).set(i64::from(in_sync(n)));
            self.node_connected.get_or_create(&label).set(i64::from(n.connected));
        }
        if let Some(end) = self.serving.get().and_then(Tls::not_after) {
            self.serving_not_after.set(end);
        }
        self.drift_repairs.set(nodes.iter().map(|n| i64::try_from(n.drift_repairs).unwrap_or(i64::MAX)).sum());
        self.leader.set(i64::from(hub.leadership().borrow().leads()));
        // Rebuilt at every scrape: a node that disconnected or left the mesh has no series.
        self.peer_receive_bytes.clear();
        self.peer_transmit_bytes.clear();
        self.peer_handshake_age.clear();
        for p in hub.peer_series(k8s_openapi::jiff::Timestamp::now()) {
            let labels = PeerLabels { node: p.node, peer: p.peer };
            self.peer_receive_bytes.get_or_create(&labels).inc_by(p.receive_bytes);
            self.peer_transmit_bytes.get_or_create(&labels).inc_by(p.transmit_bytes);
            self.peer_handshake_age.get_or_create(&labels).set(p.handshake_age.map_or(f64::INFINITY, |a| a as f64));
        }
        self.peer_direct.clear();
        self.peer_relayed.clear();
        for r in hub.route_series() {
            let direct = r.route == PeerRoute::Direct;
            self.peer_direct
                .get_or_create(&PeerLabels { node: r.node.clone(), peer: r.peer.clone() })
                .set(i64::from(direct));
            if let PeerRoute::Via(via) = r.route {
                self.peer_relayed.get_or_create(&RelayLabels { node: r.node, peer: r.peer, via }).set(1);
            }
        }
        self.relayed_bytes.clear();
        for (node, bytes) in hub.relayed_bytes() {
            self.relayed_bytes.get_or_create(&NodeLabel { node }).inc_by(bytes);
        }
        self.refresh_port_maps(hub);
    }

    /// The per-mapping counters from each node's last counter report (docs/operations/counters.md).
    fn refresh_port_maps(&self, hub: &Hub) {
        self.portmap_packets.clear();
        self.portmap_bytes.clear();
        self.portmap_connections.clear();
        self.portmap_dropped.clear();
        let reports = hub.counter_reports();
        let (out, inputs) = hub.outputs();
        let (Some(inputs), false) = (inputs, reports.is_empty()) else { return };
        let owners = Owners::new(&inputs.port_maps, &out.port_maps);
        for (node, report, desired) in reports {
            let Some(state) = desired.as_ref().and_then(|d| d.state.as_ref()) else { continue };
            for ((namespace, name), c) in attribute(&node, state, &report, &owners).0 {
                let map = MapLabels { namespace, name, node: node.clone() };
                self.portmap_packets.get_or_create(&map).inc_by(c.accepted_packets);
                self.portmap_bytes.get_or_create(&map).inc_by(c.accepted_bytes);
                self.portmap_connections.get_or_create(&map).inc_by(c.connections);
                for (reason, n) in
                    [("source", c.dropped_source), ("rate", c.dropped_rate), ("connections", c.dropped_connections)]
                {
                    let labels = DropLabels {
                        namespace: map.namespace.clone(),
                        name: map.name.clone(),
                        node: node.clone(),
                        reason: reason.into(),
                    };
                    self.portmap_dropped.get_or_create(&labels).inc_by(n);
                }
            }
        }
    }
}

/// Serves GET /metrics on `listener` until the process ends: a plain HTTP/1.1 responder,
/// enough for Prometheus and curl.
pub async fn serve(listener: TcpListener, hub: Arc<Hub>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else { continue };
        let hub = hub.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut len = 0;
            // Read the request head (the body, if any, is ignored).
            while len < buf.len() && !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf[len..])).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
                    Ok(Ok(n)) => len += n,
                }
            }
            let head = String::from_utf8_lossy(&buf[..len]);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = if path == "/metrics" || path.starts_with("/metrics?") {
                ("200 OK", hub.metrics().render(&hub))
            } else {
                ("404 Not Found", "not found: try /metrics\n".to_string())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(response.as_bytes()).await;
        });
    }
}
