//! kuportctl's work, as functions that return the text it prints (the binary in
//! src/bin/kuportctl.rs only parses flags), so tests can call them in-process.
//!
//! Credentials ([`credentials`]): `https://` verifies the controller against the CA bundle of
//! --ca-file or of ConfigMap kuport-ca (read with the kubeconfig); the bearer token is --token
//! or the kubeconfig's, which RBAC then judges on every call (docs/security.md). `http://` is the
//! insecure folder mode: plain text.

mod teardown;

pub use teardown::{Progress, teardown};

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use kuport_proto::v1::debug_client::DebugClient;
use kuport_proto::v1::{
    ExplainPortMapRequest, GetNodeRequest, ListNodesRequest, ListNodesResponse, TraceHopState, TraceMesh, TraceReport,
    TraceRequest, TraceVerdict,
};
use tonic::codegen::{Body, Bytes, StdError};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// What the Debug calls below run on: a plain [`DebugClient<Channel>`] or a [`Client`].
pub trait Transport:
    tonic::client::GrpcService<
        tonic::body::Body,
        Error: Into<StdError>,
        ResponseBody: Body<Data = Bytes, Error: Into<StdError> + Send> + Send + 'static,
    >
{
}

impl<T> Transport for T where
    T: tonic::client::GrpcService<
            tonic::body::Body,
            Error: Into<StdError>,
            ResponseBody: Body<Data = Bytes, Error: Into<StdError> + Send> + Send + 'static,
        >
{
}

/// Adds the bearer token to every call.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// A Debug client whose calls carry a bearer token.
pub type Client = DebugClient<InterceptedService<Channel, Bearer>>;

/// How to reach a controller: the CA bundle for https, the bearer token.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    pub ca_pem: Option<Vec<u8>>,
    pub token: Option<String>,
}

/// Where kuportctl's credentials come from.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    pub controller: String,
    /// The CA bundle; None: ConfigMap kuport-ca in `namespace`, read with the kubeconfig.
    pub ca_file: Option<PathBuf>,
    /// The bearer token; None: the kubeconfig's.
    pub token: Option<String>,
    /// The controller's namespace (its ConfigMap kuport-ca).
    pub namespace: String,
    /// The kubeconfig; None: $KUBECONFIG, ~/.kube/config or in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// The Lease naming the leader; None: [`LEASE_NAME`].
    pub lease_name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
    Yaml,
}

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("controller {address}: {reason}")]
    Connect { address: String, reason: String },
    #[error("{0}")]
    Call(String),
    #[error("encoding the answer: {0}")]
    Encode(String),
    #[error("{0}: expected NAMESPACE/NAME")]
    Name(String),
    #[error(transparent)]
    Channel(#[from] kuport_proto::channel::ChannelError),
    #[error("{0}")]
    Credentials(String),
    #[error("usage: {0}")]
    Usage(String),
}

/// How to get a token when the kubeconfig has none.
const TOKEN_HINT: &str = "pass --token \"$(kubectl create token SERVICEACCOUNT -n NAMESPACE)\" (a ServiceAccount bound \
     to the chart's kuport-debug ClusterRole), or set KUPORT_TOKEN";

/// The kubeconfig's client configuration.
async fn kube_config(sources: &Sources) -> Result<kube::Config, CtlError> {
    let err = |e: &dyn std::fmt::Display| CtlError::Credentials(format!("reading the kubeconfig: {e}"));
    match &sources.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| err(&e))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| err(&e))
        }
        None => kube::Config::infer().await.map_err(|e| err(&e)),
    }
}

/// The kubeconfig user's bearer token: its `token`, or its `tokenFile` read; a user with a
/// client certificate (or an exec plugin) has none kuport can forward.
fn kubeconfig_token(config: &kube::Config) -> Result<String, CtlError> {
    // AuthInfo serializes its secrets as they are (it keeps them in secrecy types otherwise).
    let user = serde_json::to_value(&config.auth_info).map_err(|e| CtlError::Credentials(e.to_string()))?;
    if let Some(t) = user.get("token").and_then(|t| t.as_str()).filter(|t| !t.trim().is_empty()) {
        return Ok(t.trim().to_string());
    }
    if let Some(f) = user.get("tokenFile").and_then(|t| t.as_str()) {
        return std::fs::read_to_string(f)
            .map(|t| t.trim().to_string())
            .map_err(|e| CtlError::Credentials(format!("the kubeconfig's tokenFile {f}: {e}")));
    }
    let kind = if user.get("client-certificate-data").is_some() || user.get("client-certificate").is_some() {
        "a client certificate, which cannot be forwarded to the controller"
    } else if user.get("exec").is_some() || user.get("auth-provider").is_some() {
        "an exec or auth-provider plugin, whose token kuportctl does not run"
    } else {
        "no bearer token"
    };
    Err(CtlError::Credentials(format!("the kubeconfig's user has {kind}: {TOKEN_HINT}")))
}

/// The CA bundle and token for `sources` (the kubeconfig only for what the flags leave out).
pub async fn credentials(sources: &Sources) -> Result<Credentials, CtlError> {
    let https = sources.controller.to_ascii_lowercase().starts_with("https://");
    let mut config = None;
    let ca_pem = match (&sources.ca_file, https) {
        (_, false) => None,
        (Some(f), true) => {
            Some(std::fs::read(f).map_err(|e| CtlError::Credentials(format!("--ca-file {}: {e}", f.display())))?)
        }
        (None, true) => {
            let c = kube_config(sources).await?;
            let client = kube::Client::try_from(c.clone()).map_err(|e| CtlError::Credentials(e.to_string()))?;
            config = Some(c);
            let maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
                kube::Api::namespaced(client, &sources.namespace);
            let name = crate::trust::CA_CONFIGMAP;
            let map = maps.get(name).await.map_err(|e| {
                CtlError::Credentials(format!(
                    "reading ConfigMap {}/{name} (the controller's CA bundle; or pass --ca-file): {e}",
                    sources.namespace
                ))
            })?;
            let pem = map.data.and_then(|mut d| d.remove(crate::trust::CA_KEY)).ok_or_else(|| {
                CtlError::Credentials(format!("ConfigMap {}/{name} has no {}", sources.namespace, crate::trust::CA_KEY))
            })?;
            Some(pem.into_bytes())
        }
    };
    let token = match &sources.token {
        Some(t) if !t.trim().is_empty() => Some(t.trim().to_string()),
        // The folder mode checks nothing: no kubeconfig needed.
        _ if !https => None,
        _ => {
            let c = match config {
                Some(c) => c,
                None => kube_config(sources).await?,
            };
            Some(kubeconfig_token(&c)?)
        }
    };
    Ok(Credentials { ca_pem, token })
}

/// The Lease the chart's controller replicas elect their leader on (the controller's
/// `--lease-name` default; the chart's controller fullname for the release `kuport`).
pub const LEASE_NAME: &str = "kuport-controller";

/// The controller's address from the kubeconfig alone, when no --controller is given: the
/// leader's, as its Lease (`LEASE_NAME` in `sources.namespace`) names it (holders are
/// `identity@address`, the address each replica advertises; every replica serves Debug). The
/// address must be reachable from here: a pod address is from a node or the lab, rarely from
/// a laptop (then --controller with `kubectl port-forward`). docs/decisions.md, "kubectl kuport".
pub async fn discover(sources: &Sources) -> Result<String, CtlError> {
    let config = kube_config(sources).await?;
    let client = kube::Client::try_from(config).map_err(|e| CtlError::Credentials(e.to_string()))?;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client, &sources.namespace);
    let ns = &sources.namespace;
    let name = sources.lease_name.as_deref().unwrap_or(LEASE_NAME);
    let lease = leases.get_opt(name).await.map_err(|e| {
        CtlError::Credentials(format!("finding the controller: reading Lease {ns}/{name}: {e} (or pass --controller)"))
    })?;
    let lease = lease.ok_or_else(|| {
        CtlError::Credentials(format!(
            "finding the controller: no Lease {ns}/{name}: is kuport installed in namespace {ns} (-n)? Or pass --controller"
        ))
    })?;
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    match holder.rsplit_once('@') {
        Some((_, address)) if !address.is_empty() => Ok(format!("https://{address}")),
        _ => Err(CtlError::Credentials(format!(
            "finding the controller: Lease {ns}/{name} names no leader ({holder:?}): no replica leads now; pass --controller"
        ))),
    }
}

/// A Debug client for `address` (https:// or http://) with `credentials`.
pub async fn connect_with(address: &str, credentials: &Credentials) -> Result<Client, CtlError> {
    let endpoint = kuport_proto::channel::endpoint(address, credentials.ca_pem.as_deref())?;
    let bearer = match &credentials.token {
        Some(t) => {
            let mut probe = tonic::Request::new(());
            kuport_proto::channel::authorize(&mut probe, t)?;
            probe.metadata().get("authorization").cloned()
        }
        None => None,
    };
    let err = |e: &dyn std::fmt::Display| CtlError::Connect { address: address.to_string(), reason: e.to_string() };
    let channel = endpoint.connect().await.map_err(|e| err(&tls_reason(&e)))?;
    Ok(DebugClient::with_interceptor(channel, Bearer(bearer))
        .max_decoding_message_size(crate::serve::MAX_MESSAGE)
        .max_encoding_message_size(crate::serve::MAX_MESSAGE))
}

/// A transport error with its causes: "transport error" alone hides a certificate refusal.
fn tls_reason(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let _ = write!(text, ": {c}");
        cause = c.source();
    }
    text
}

fn call(s: tonic::Status) -> CtlError {
    CtlError::Call(format!("{:?}: {}", s.code(), s.message()))
}

/// A plain Debug client for `address` (no scheme: http), without credentials: the folder mode.
pub async fn connect(address: &str) -> Result<DebugClient<Channel>, CtlError> {
    let url = if address.contains("://") { address.to_string() } else { format!("http://{address}") };
    let err = |e: &dyn std::fmt::Display| CtlError::Connect { address: address.to_string(), reason: e.to_string() };
    let endpoint = tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| err(&e))?
        .connect_timeout(std::time::Duration::from_secs(5));
    let channel = endpoint.connect().await.map_err(|e| err(&e))?;
    Ok(DebugClient::new(channel)
        .max_decoding_message_size(crate::serve::MAX_MESSAGE)
        .max_encoding_message_size(crate::serve::MAX_MESSAGE))
}

fn encode<T: serde::Serialize>(value: &T, output: Output) -> Result<String, CtlError> {
    match output {
        Output::Json => {
            serde_json::to_string_pretty(value).map(|s| s + "\n").map_err(|e| CtlError::Encode(e.to_string()))
        }
        _ => serde_yaml::to_string(value).map_err(|e| CtlError::Encode(e.to_string())),
    }
}

fn short(version: &str) -> &str {
    version.get(..12).unwrap_or(if version.is_empty() { "-" } else { version })
}

/// `kuportctl node NAME`: the node's desired state as canonical text (nftables as `nft list`
/// prints it, then the ip commands), or the whole DesiredState as JSON or YAML.
pub async fn node<T: Transport>(client: &mut DebugClient<T>, name: &str, output: Output) -> Result<String, CtlError> {
    let n = client.get_node(GetNodeRequest { node: name.to_string() }).await.map_err(call)?.into_inner();
    let Some(desired) = n.desired else {
        return Err(CtlError::Call(format!("node {name}: no desired state computed yet")));
    };
    match output {
        Output::Text => Ok(kuport_proto::text::node_state(&desired.state.unwrap_or_default())),
        o => encode(&desired, o),
    }
}

/// `kuportctl nodes`: every node, its executor, what it applied, and its place in the overlay.
pub async fn nodes<T: Transport>(client: &mut DebugClient<T>, output: Output) -> Result<String, CtlError> {
    let r = client.list_nodes(ListNodesRequest {}).await.map_err(call)?.into_inner();
    if output != Output::Text {
        return encode(&r, output);
    }
    Ok(nodes_text(&r))
}

/// What `kuportctl nodes` prints for `r`.
pub fn nodes_text(r: &ListNodesResponse) -> String {
    let mut t = header(r);
    let _ = writeln!(
        t,
        "{:<16} {:<9} {:<13} {:<13} {:<7} {:<8} {:<22} {:<24} ERROR",
        "NODE", "EXECUTOR", "DESIRED", "ACKED", "SYNCED", "DRIFT", "UNDERLAY", "OVERLAY"
    );
    for n in &r.nodes {
        let executor = if n.connected { "connected" } else { "absent" };
        let synced = if !n.desired_version.is_empty() && n.desired_version == n.acked_version { "yes" } else { "no" };
        let underlay = n
            .facts
            .as_ref()
            .filter(|f| !f.underlay_address.is_empty())
            .map_or("-".to_string(), |f| format!("{} mtu {}", f.underlay_address, f.underlay_mtu));
        let error = n.errors.first().map_or("-".to_string(), |e| format!("{}: {}", e.object, e.reason));
        let _ = writeln!(
            t,
            "{:<16} {:<9} {:<13} {:<13} {:<7} {:<8} {:<22} {:<24} {}",
            n.node,
            executor,
            short(&n.desired_version),
            short(&n.acked_version),
            synced,
            n.drift_repairs,
            underlay,
            overlay_column(&Place::of(&n.overlay)),
            error
        );
        for e in n.errors.iter().skip(1) {
            let _ = writeln!(t, "{:<16} {:>115} {}: {}", "", "", e.object, e.reason);
        }
    }
    t
}

fn header(r: &ListNodesResponse) -> String {
    let mut t = String::new();
    if !r.leader {
        t.push_str("# this replica is not the leader: executors connect to the leader\n");
    }
    if !r.input_error.is_empty() {
        let _ = writeln!(t, "# inputs refused, the previous ones stay in use: {}", r.input_error);
    }
    t
}

/// A node's place in the overlay, read back from NodeDebug.overlay (sync.proto documents it).
#[derive(Debug, PartialEq, Eq)]
enum Place<'a> {
    Off,
    /// "name: value" lines.
    Member(Vec<(&'a str, &'a str)>),
    /// (field, reason, message) per refusal.
    Refused(Vec<(&'a str, &'a str, &'a str)>),
}

impl<'a> Place<'a> {
    fn of(lines: &'a [String]) -> Self {
        match lines.split_first() {
            None => Place::Off,
            Some((first, rest)) if first == crate::compute::overlay::DEBUG_MEMBER => {
                Place::Member(rest.iter().filter_map(|l| l.split_once(": ")).collect())
            }
            Some(_) => Place::Refused(
                lines
                    .iter()
                    .map(|l| {
                        let (field, rest) = l.split_once(": ").unwrap_or((l.as_str(), ""));
                        let (reason, message) = rest.split_once(": ").unwrap_or((rest, ""));
                        (field, reason, message)
                    })
                    .collect(),
            ),
        }
    }

    fn get(&self, name: &str) -> &'a str {
        match self {
            Place::Member(kv) => kv.iter().find(|(k, _)| *k == name).map_or("-", |(_, v)| v),
            _ => "-",
        }
    }
}

fn overlay_column(p: &Place<'_>) -> String {
    match p {
        Place::Off => "-".into(),
        Place::Member(_) => "member".into(),
        Place::Refused(r) => {
            let mut reasons: Vec<&str> = r.iter().map(|(_, reason, _)| *reason).collect();
            reasons.dedup();
            format!("refused: {}", reasons.join(","))
        }
    }
}

/// `kuportctl mesh`: every member of the overlay (its key's fingerprint, endpoint, pod CIDRs,
/// overlay address, peer count, `relay` on a relay candidate) as a tree: under it each peer,
/// its route (direct, via RELAY, unreachable; docs/overlay/relays.md) and what its executor
/// last reported of it (reach, last handshake, bytes received and sent, the endpoint WireGuard
/// uses); then every refused node with each reason (docs/overlay/status.md).
pub async fn mesh<T: Transport>(client: &mut DebugClient<T>, output: Output) -> Result<String, CtlError> {
    let r = client.list_nodes(ListNodesRequest {}).await.map_err(call)?.into_inner();
    if output != Output::Text {
        return encode(&mesh_places(&r), output);
    }
    Ok(mesh_text(&r, std::time::SystemTime::now()))
}

/// One node of `kuportctl mesh -o json|yaml`: its overlay lines, its routes by peer, and its
/// peers as reported.
#[derive(Debug, serde::Serialize)]
pub struct MeshPlace<'a> {
    pub overlay: &'a [String],
    pub routes: std::collections::BTreeMap<&'a str, &'a str>,
    pub peers: &'a [kuport_proto::v1::PeerStatus],
}

/// What `kuportctl mesh -o json|yaml` prints for `r`: every node in the overlay, by name.
pub fn mesh_places(r: &ListNodesResponse) -> std::collections::BTreeMap<&str, MeshPlace<'_>> {
    r.nodes
        .iter()
        .filter(|n| !n.overlay.is_empty())
        .map(|n| {
            let routes = routes(&Place::of(&n.overlay));
            (n.node.as_str(), MeshPlace { overlay: &n.overlay, routes, peers: &n.peers })
        })
        .collect()
}

/// A member's routes from its `routes: PEER=ROUTE,...` line (`overlay::debug_lines`).
fn routes<'a>(p: &Place<'a>) -> std::collections::BTreeMap<&'a str, &'a str> {
    match p.get("routes") {
        "-" => Default::default(),
        line => line.split(',').filter_map(|r| r.split_once('=')).collect(),
    }
}

/// Bytes as `ip -s` would round them: B, KiB, MiB, GiB, TiB.
fn bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} B") } else { format!("{v:.1} {}", units[u]) }
}

/// A handshake `at` (Unix seconds, 0: never) as an age at `now`: "never", "42s ago", "3m ago".
fn handshake_age(at: u64, now: std::time::SystemTime) -> String {
    if at == 0 {
        return "never".into();
    }
    let now = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let age = now.saturating_sub(at);
    match age {
        0..120 => format!("{age}s ago"),
        120..7200 => format!("{}m ago", age / 60),
        _ => format!("{}h ago", age / 3600),
    }
}

/// A reported reach as the annotation `kuport.wlz.li/wireguard-peers` spells it.
fn reach(r: i32) -> &'static str {
    use kuport_proto::v1::Reach;
    match Reach::try_from(r).unwrap_or(Reach::Unknown) {
        Reach::Direct => "direct",
        Reach::Unreachable => "unreachable",
        Reach::Unknown => "unknown",
    }
}

/// What `kuportctl mesh` prints for `r` at `now` (handshake ages).
pub fn mesh_text(r: &ListNodesResponse, now: std::time::SystemTime) -> String {
    let mut t = header(r);
    let places: Vec<(&str, Place<'_>)> = r.nodes.iter().map(|n| (n.node.as_str(), Place::of(&n.overlay))).collect();
    if places.iter().all(|(_, p)| *p == Place::Off) {
        t.push_str("# the overlay is off (kuport-controller --overlay), or no Node is known yet\n");
        return t;
    }
    // Peers are named by the member that has the key; an unknown key by its first 8 characters.
    let names: std::collections::BTreeMap<&str, &str> =
        places.iter().filter(|(_, p)| matches!(p, Place::Member(_))).map(|(n, p)| (p.get("publicKey"), *n)).collect();
    let _ = writeln!(t, "{:<16} {:<9} {:<22} {:<28} {:<15} PEERS", "MEMBER", "KEY", "ENDPOINT", "POD CIDRS", "ADDRESS");
    for (n, (node, p)) in places.iter().enumerate().filter(|(_, (_, p))| matches!(p, Place::Member(_))) {
        let key = p.get("publicKey");
        let relay = if p.get("relay") == "candidate" { " relay" } else { "" };
        let _ = writeln!(
            t,
            "{:<16} {:<9} {:<22} {:<28} {:<15} {}{relay}",
            node,
            key.get(..8).unwrap_or(key),
            p.get("endpoint"),
            p.get("podCIDRs"),
            p.get("address"),
            p.get("peers")
        );
        // Every peer the compute routes, then any key reported that no member has.
        let routes = routes(p);
        fn name_of<'a>(names: &BTreeMap<&'a str, &'a str>, s: &'a kuport_proto::v1::PeerStatus) -> &'a str {
            names.get(s.public_key.as_str()).copied().unwrap_or_else(|| s.public_key.get(..8).unwrap_or("-"))
        }
        let reported: std::collections::BTreeMap<&str, &kuport_proto::v1::PeerStatus> =
            r.nodes[n].peers.iter().map(|s| (name_of(&names, s), s)).collect();
        let mut peers: Vec<&str> = routes.keys().copied().collect();
        peers.extend(reported.keys().filter(|k| !routes.contains_key(*k)));
        if peers.is_empty() {
            continue;
        }
        let _ = writeln!(
            t,
            "  {:<14} {:<16} {:<12} {:<10} {:<11} {:<11} ENDPOINT",
            "PEER", "ROUTE", "REACH", "HANDSHAKE", "RX", "TX"
        );
        for peer in peers {
            let route = routes.get(peer).copied().unwrap_or("-");
            let line = match reported.get(peer) {
                Some(s) => format!(
                    "{:<12} {:<10} {:<11} {:<11} {}",
                    reach(s.reach),
                    handshake_age(s.last_handshake_unix_seconds, now),
                    bytes(s.receive_bytes),
                    bytes(s.transmit_bytes),
                    if s.endpoint.is_empty() { "-" } else { s.endpoint.as_str() }
                ),
                None => format!("{:<12} {:<10} {:<11} {:<11} -", "unreported", "-", "-", "-"),
            };
            let _ = writeln!(t, "  {peer:<14} {route:<16} {line}");
        }
    }
    let mut refused = places.iter().filter_map(|(n, p)| match p {
        Place::Refused(r) => Some((n, r)),
        _ => None,
    });
    if let Some(first) = refused.next() {
        let _ = writeln!(t, "\n{:<16} {:<16} {:<28} MESSAGE", "REFUSED", "REASON", "FIELD");
        for (node, why) in std::iter::once(first).chain(refused) {
            for (field, reason, message) in why.iter() {
                let _ = writeln!(t, "{node:<16} {reason:<16} {field:<28} {message}");
            }
        }
    }
    t
}

/// `kuportctl portmap NS/NAME`: which nodes program it, its endpoint and links, or why not.
pub async fn port_map<T: Transport>(
    client: &mut DebugClient<T>,
    name: &str,
    output: Output,
) -> Result<String, CtlError> {
    let (namespace, name) = name.split_once('/').ok_or_else(|| CtlError::Name(name.to_string()))?;
    let e = client
        .explain_port_map(ExplainPortMapRequest { namespace: namespace.to_string(), name: name.to_string() })
        .await
        .map_err(call)?
        .into_inner();
    if output != Output::Text {
        return encode(&e, output);
    }
    let mut t = format!("PortMap {}/{}\n", e.namespace, e.name);
    if e.nodes.is_empty() {
        t.push_str("programmed on no node\n");
    }
    for n in &e.nodes {
        let acked = if n.acked { "applied" } else { "pending" };
        let links = if n.links.is_empty() { "no link".to_string() } else { n.links.join(", ") };
        let _ = writeln!(t, "node {} ({}): {acked}; {links}", n.node, n.role);
        if let Some(c) = &n.counters {
            let _ = writeln!(
                t,
                "  counters: accepted {} packets ({} bytes), {} connections; dropped: {} by source, {} by rate, {} by connections",
                c.accepted_packets,
                c.accepted_bytes,
                c.connections,
                c.dropped_source,
                c.dropped_rate,
                c.dropped_connections
            );
        }
        if !n.counters_error.is_empty() {
            let _ = writeln!(t, "  counters: {}", n.counters_error);
        }
    }
    t.push_str("status:\n");
    for line in e.status_yaml.lines() {
        let _ = writeln!(t, "  {line}");
    }
    Ok(t)
}

/// What `kuportctl trace` asks: an address, a mesh pair or an Intercept.
pub enum TraceTarget {
    Address { address: String, from: Option<String> },
    Mesh { from: String, to: String, pods: bool },
    Intercept(String),
}

/// `kuportctl trace ...`: where a flow stops (docs/operations/trace.md).
pub async fn trace<T: Transport>(
    client: &mut DebugClient<T>,
    target: TraceTarget,
    watch: u32,
    output: Output,
) -> Result<String, CtlError> {
    use kuport_proto::v1::trace_request::Target;
    let (target, from) = match target {
        TraceTarget::Address { address, from } => (Target::Address(address), from.unwrap_or_default()),
        TraceTarget::Mesh { from, to, pods } => (Target::Mesh(TraceMesh { from, to, pods }), String::new()),
        TraceTarget::Intercept(name) => (Target::Intercept(name), String::new()),
    };
    let request = TraceRequest { target: Some(target), watch_seconds: watch, from };
    let r = client.trace(request).await.map_err(call)?.into_inner();
    match output {
        Output::Text => Ok(trace_text(&r)),
        o => encode(&TraceView::of(&r), o),
    }
}

/// A trace with its verdict and states by name, for JSON and YAML.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct TraceView<'a> {
    subject: &'a str,
    verdict: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    stopped_at: &'a str,
    cause: &'a str,
    watched_seconds: u32,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    unanswered: &'a [String],
    hops: Vec<HopView<'a>>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct HopView<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    node: &'a str,
    object: &'a str,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    packets: Option<u64>,
    #[serde(skip_serializing_if = "is_zero")]
    bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    moved: Option<u64>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    details: &'a [String],
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl<'a> TraceView<'a> {
    fn of(r: &'a TraceReport) -> Self {
        TraceView {
            subject: &r.subject,
            verdict: verdict_word(r.verdict),
            stopped_at: &r.stopped_at,
            cause: &r.cause,
            watched_seconds: r.watched_seconds,
            unanswered: &r.unanswered,
            hops: r
                .hops
                .iter()
                .map(|h| HopView {
                    name: &h.name,
                    node: &h.node,
                    object: &h.object,
                    state: hop_state_word(h.state),
                    packets: h.packets,
                    bytes: h.bytes,
                    moved: h.moved,
                    details: &h.details,
                })
                .collect(),
        }
    }
}

fn verdict_word(v: i32) -> &'static str {
    match TraceVerdict::try_from(v) {
        Ok(TraceVerdict::Healthy) => "healthy",
        Ok(TraceVerdict::Stopped) => "stopped",
        Ok(TraceVerdict::Refused) => "refused",
        _ => "unknown",
    }
}

fn hop_state_word(s: i32) -> &'static str {
    match TraceHopState::try_from(s) {
        Ok(TraceHopState::Ok) => "ok",
        Ok(TraceHopState::Stopped) => "stopped",
        Ok(TraceHopState::Refused) => "refused",
        _ => "-",
    }
}

/// What `kuportctl trace` prints: the subject, one line per hop (state, node, what, counter,
/// how much it moved), its details indented, then the verdict and the cause.
pub fn trace_text(r: &TraceReport) -> String {
    let mut t = format!("{}\n", r.subject);
    for h in &r.hops {
        let node = if h.node.is_empty() { "-" } else { &h.node };
        let mut count = match (h.packets, h.bytes) {
            (Some(p), _) => format!("{p} pkts"),
            (None, b) if b > 0 => bytes(b),
            _ => String::new(),
        };
        match (h.moved, h.packets) {
            (Some(m), Some(_)) => {
                let _ = write!(count, " (+{m})");
            }
            (Some(m), None) => {
                let _ = write!(count, " (+{})", bytes(m));
            }
            _ => {}
        }
        let line =
            format!("  {:<8} {:<11} {:<10} {}  {}", hop_state_word(h.state), h.name, node, h.object, count.trim());
        let _ = writeln!(t, "{}", line.trim_end());
        for d in &h.details {
            let _ = writeln!(t, "  {:<8} {:<11} {:<10}   {d}", "", "", "");
        }
    }
    let verdict = verdict_word(r.verdict);
    if r.stopped_at.is_empty() {
        let _ = writeln!(t, "{verdict}: {}", r.cause);
    } else {
        let _ = writeln!(t, "{verdict} at {}: {}", r.stopped_at, r.cause);
    }
    for u in &r.unanswered {
        let _ = writeln!(t, "not read: {u}");
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::overlay::{NodeOverlay, Refusal, debug_lines, members, reason};
    use kuport_proto::v1::NodeDebug;

    const KEY: &str = "kOzLDlGv6e2AmDVfmJC7dRGCU8vMC9RcrxDBB4Y+uiM=";

    fn response() -> ListNodesResponse {
        let member = NodeOverlay {
            public_key: Some(KEY.into()),
            endpoint: Some("203.0.113.1:51820".parse().expect("endpoint")),
            pod_cidrs: vec!["10.42.1.0/24".parse().expect("cidr"), "fd00:42:1::/64".parse().expect("cidr")],
            address: Some("10.42.1.0".parse().expect("address")),
            mtu: 1420,
            routes: imbl::OrdMap::unit("b".into(), crate::compute::overlay::relays::PeerRoute::Direct),
            refused: Vec::new(),
            ..Default::default()
        };
        let refusal = |field: &str, reason, message: &str| Refusal {
            node: "c".into(),
            field: field.into(),
            reason,
            message: message.into(),
        };
        let refused = NodeOverlay {
            refused: vec![
                refusal(members::FIELD_KEY, reason::NO_PUBLIC_KEY, "the executor's report was refused: bad: key"),
                refusal(members::FIELD_POD_CIDRS, reason::NO_POD_CIDRS, "the Node has no pod CIDRs"),
            ],
            ..Default::default()
        };
        let row = |node: &str, o: Option<&NodeOverlay>| NodeDebug {
            node: node.into(),
            overlay: o.map(debug_lines).unwrap_or_default(),
            ..Default::default()
        };
        ListNodesResponse {
            leader: true,
            nodes: vec![row("a", Some(&member)), row("c", Some(&refused)), row("off", None)],
            input_error: String::new(),
        }
    }

    #[test]
    fn debug_lines_carry_a_members_place_and_every_refusal() {
        let r = response();
        assert_eq!(
            r.nodes[0].overlay,
            [
                "member",
                "address: 10.42.1.0",
                "endpoint: 203.0.113.1:51820",
                "podCIDRs: 10.42.1.0/24,fd00:42:1::/64",
                &format!("publicKey: {KEY}"),
                "peers: 1",
                "routes: b=direct"
            ]
        );
        assert_eq!(
            r.nodes[1].overlay,
            [
                "wireguardPublicKey: NoPublicKey: the executor's report was refused: bad: key",
                "spec.podCIDRs: NoPodCIDRs: the Node has no pod CIDRs"
            ]
        );
    }

    #[test]
    fn nodes_shows_an_overlay_column() {
        let t = nodes_text(&response());
        let at = t.lines().next().and_then(|h| h.find(" OVERLAY ")).expect("an OVERLAY column");
        // From the column to the last one (ERROR, "-" here).
        let col = |node: &str| {
            let line = t.lines().find(|l| l.starts_with(&format!("{node} "))).expect("row");
            line.get(at..).and_then(|c| c.rsplit_once(' ')).map(|(c, _)| c.trim().to_string()).expect("column")
        };
        assert_eq!(col("a"), "member", "{t}");
        assert_eq!(col("c"), "refused: NoPublicKey,NoPodCIDRs", "{t}");
        assert_eq!(col("off"), "-", "{t}");
    }

    #[test]
    fn mesh_lists_members_with_fingerprints_and_refused_nodes_with_reasons() {
        let t = mesh_text(&response(), std::time::SystemTime::now());
        let want = "\
MEMBER           KEY       ENDPOINT               POD CIDRS                    ADDRESS         PEERS
a                kOzLDlGv  203.0.113.1:51820      10.42.1.0/24,fd00:42:1::/64  10.42.1.0       1
  PEER           ROUTE            REACH        HANDSHAKE  RX          TX          ENDPOINT
  b              direct           unreported   -          -           -           -

REFUSED          REASON           FIELD                        MESSAGE
c                NoPublicKey      wireguardPublicKey           the executor's report was refused: bad: key
c                NoPodCIDRs       spec.podCIDRs                the Node has no pod CIDRs
";
        assert_eq!(t, want);
        let off = ListNodesResponse { leader: true, nodes: vec![NodeDebug::default()], input_error: String::new() };
        assert!(mesh_text(&off, std::time::SystemTime::now()).contains("the overlay is off"));
    }

    #[test]
    fn mesh_shows_each_members_peers_with_handshake_age_and_bytes() {
        use kuport_proto::v1::PeerStatus;
        let mut r = response();
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let b = "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiU=";
        r.nodes[0].peers = vec![
            PeerStatus {
                public_key: KEY.into(),
                endpoint: "198.51.100.7:40211".into(),
                last_handshake_unix_seconds: 1_000_000 - 12,
                receive_bytes: 1_234_567,
                transmit_bytes: 340,
                ..Default::default()
            },
            PeerStatus { public_key: b.into(), ..Default::default() },
        ];
        let t = mesh_text(&r, now);
        let want = "\
MEMBER           KEY       ENDPOINT               POD CIDRS                    ADDRESS         PEERS
a                kOzLDlGv  203.0.113.1:51820      10.42.1.0/24,fd00:42:1::/64  10.42.1.0       1
  PEER           ROUTE            REACH        HANDSHAKE  RX          TX          ENDPOINT
  b              direct           unreported   -          -           -           -
  a              -                unknown      12s ago    1.2 MiB     340 B       198.51.100.7:40211
  l3LKPRYY       -                unknown      never      0 B         0 B         -
";
        assert!(t.starts_with(want), "{t}");
        assert_eq!(handshake_age(1_000_000 - 600, now), "10m ago");
        assert_eq!(handshake_age(1_000_000 - 3 * 3600, now), "3h ago");
    }

    /// The homes relayed through cloud: a tree of each member's peers with routes.
    fn homes() -> ListNodesResponse {
        use crate::compute::overlay::relays::PeerRoute;
        use kuport_proto::v1::{PeerStatus, Reach};
        let keys = [
            ("cloud", KEY),
            ("home-a", "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiU="),
            ("home-b", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="),
        ];
        let via = PeerRoute::Via("cloud".into());
        let member = |i: usize, relay: bool, routes: Vec<(&str, PeerRoute)>| NodeOverlay {
            public_key: Some(keys[i].1.into()),
            endpoint: Some(format!("203.0.113.{}:51820", 10 + i).parse().expect("endpoint")),
            pod_cidrs: vec![format!("10.42.{i}.0/24").parse().expect("cidr")],
            address: Some(format!("10.42.{i}.0").parse().expect("address")),
            mtu: 1420,
            relay,
            routes: routes.into_iter().map(|(p, r)| (p.to_string(), r)).collect(),
            ..Default::default()
        };
        let status = |i: usize, reach: Reach, rx: u64| PeerStatus {
            public_key: keys[i].1.into(),
            endpoint: format!("203.0.113.{}:51820", 10 + i),
            last_handshake_unix_seconds: 1_000_000 - 5,
            receive_bytes: rx,
            transmit_bytes: rx / 2,
            reach: reach as i32,
        };
        let row = |node: &str, o: &NodeOverlay, peers: Vec<PeerStatus>| NodeDebug {
            node: node.into(),
            overlay: debug_lines(o),
            peers,
            ..Default::default()
        };
        let cloud = member(0, true, vec![("home-a", PeerRoute::Direct), ("home-b", PeerRoute::Direct)]);
        let home_a = member(1, false, vec![("cloud", PeerRoute::Direct), ("home-b", via.clone())]);
        let home_b = member(2, false, vec![("cloud", PeerRoute::Direct), ("home-a", via)]);
        ListNodesResponse {
            leader: true,
            nodes: vec![
                row("cloud", &cloud, vec![status(1, Reach::Direct, 4096), status(2, Reach::Direct, 2048)]),
                row(
                    "home-a",
                    &home_a,
                    vec![
                        status(0, Reach::Direct, 4096),
                        PeerStatus { reach: Reach::Unreachable as i32, ..status(2, Reach::Direct, 0) },
                    ],
                ),
                row("home-b", &home_b, Vec::new()),
            ],
            input_error: String::new(),
        }
    }

    #[test]
    fn mesh_is_a_tree_of_each_members_peers_with_their_routes() {
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let t = mesh_text(&homes(), now);
        let want = "\
MEMBER           KEY       ENDPOINT               POD CIDRS                    ADDRESS         PEERS
cloud            kOzLDlGv  203.0.113.10:51820     10.42.0.0/24                 10.42.0.0       2 relay
  PEER           ROUTE            REACH        HANDSHAKE  RX          TX          ENDPOINT
  home-a         direct           direct       5s ago     4.0 KiB     2.0 KiB     203.0.113.11:51820
  home-b         direct           direct       5s ago     2.0 KiB     1.0 KiB     203.0.113.12:51820
home-a           l3LKPRYY  203.0.113.11:51820     10.42.1.0/24                 10.42.1.0       2
  PEER           ROUTE            REACH        HANDSHAKE  RX          TX          ENDPOINT
  cloud          direct           direct       5s ago     4.0 KiB     2.0 KiB     203.0.113.10:51820
  home-b         via cloud        unreachable  5s ago     0 B         0 B         203.0.113.12:51820
home-b           AAECAwQF  203.0.113.12:51820     10.42.2.0/24                 10.42.2.0       2
  PEER           ROUTE            REACH        HANDSHAKE  RX          TX          ENDPOINT
  cloud          direct           unreported   -          -           -           -
  home-a         via cloud        unreported   -          -           -           -
";
        assert_eq!(t, want, "{t}");
        // JSON and YAML carry the routes by peer.
        let json = serde_json::to_value(mesh_places(&homes())).expect("json");
        assert_eq!(json["home-a"]["routes"], serde_json::json!({ "cloud": "direct", "home-b": "via cloud" }));
        assert_eq!(json["cloud"]["routes"]["home-b"], "direct");
        assert_eq!(json["home-b"]["peers"], serde_json::json!([]));
    }

    #[test]
    fn a_trace_prints_each_hop_with_its_counter_and_says_where_it_stops() {
        use kuport_proto::v1::TraceHop;
        let r = TraceReport {
            subject: "203.0.113.9:27015/udp: PortMap games/game".into(),
            hops: vec![
                TraceHop {
                    name: "accept".into(),
                    node: "edge-a".into(),
                    object: "steer element of the mapping".into(),
                    packets: Some(12),
                    moved: Some(4),
                    state: TraceHopState::Ok as i32,
                    ..Default::default()
                },
                TraceHop {
                    name: "link out".into(),
                    node: "edge-a".into(),
                    object: "link kup-1 to worker-2".into(),
                    packets: Some(3),
                    moved: Some(0),
                    state: TraceHopState::Stopped as i32,
                    details: vec!["mtu 1330".into()],
                    ..Default::default()
                },
            ],
            verdict: TraceVerdict::Stopped as i32,
            stopped_at: "link out".into(),
            cause: "edge-a steered the flow but its link sent nothing".into(),
            unanswered: vec!["worker-2: node worker-2: its executor is not connected".into()],
            watched_seconds: 3,
        };
        let text = trace_text(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "203.0.113.9:27015/udp: PortMap games/game",
                "  ok       accept      edge-a     steer element of the mapping  12 pkts (+4)",
                "  stopped  link out    edge-a     link kup-1 to worker-2  3 pkts (+0)",
                format!("{:36}mtu 1330", "").as_str(),
                "stopped at link out: edge-a steered the flow but its link sent nothing",
                "not read: worker-2: node worker-2: its executor is not connected",
            ]
        );
        let json = encode(&TraceView::of(&r), Output::Json).expect("json");
        let v: serde_json::Value = serde_json::from_str(&json).expect("parses");
        assert_eq!((v["verdict"].as_str(), v["stoppedAt"].as_str()), (Some("stopped"), Some("link out")));
        assert_eq!((v["hops"][1]["state"].as_str(), v["hops"][1]["moved"].as_u64()), (Some("stopped"), Some(0)));
    }
}
