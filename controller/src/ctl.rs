//! kuportctl's work, as functions that return the text it prints (the binary in
//! src/bin/kuportctl.rs only parses flags), so tests can call them in-process.

use std::fmt::Write as _;

use kuport_proto::v1::debug_client::DebugClient;
use kuport_proto::v1::{ExplainPortMapRequest, GetNodeRequest, ListNodesRequest};
use tonic::transport::Channel;

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
}

fn call(s: tonic::Status) -> CtlError {
    CtlError::Call(format!("{:?}: {}", s.code(), s.message()))
}

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
pub async fn node(client: &mut DebugClient<Channel>, name: &str, output: Output) -> Result<String, CtlError> {
    let n = client.get_node(GetNodeRequest { node: name.to_string() }).await.map_err(call)?.into_inner();
    let Some(desired) = n.desired else {
        return Err(CtlError::Call(format!("node {name}: no desired state computed yet")));
    };
    match output {
        Output::Text => Ok(kuport_proto::text::node_state(&desired.state.unwrap_or_default())),
        o => encode(&desired, o),
    }
}

/// `kuportctl nodes`: every node, its executor, and what it applied.
pub async fn nodes(client: &mut DebugClient<Channel>, output: Output) -> Result<String, CtlError> {
    let r = client.list_nodes(ListNodesRequest {}).await.map_err(call)?.into_inner();
    if output != Output::Text {
        return encode(&r, output);
    }
    let mut t = String::new();
    if !r.leader {
        t.push_str("# this replica is not the leader: executors connect to the leader\n");
    }
    if !r.input_error.is_empty() {
        let _ = writeln!(t, "# inputs refused, the previous ones stay in use: {}", r.input_error);
    }
    let _ = writeln!(
        t,
        "{:<16} {:<9} {:<13} {:<13} {:<7} {:<8} {:<22} ERROR",
        "NODE", "EXECUTOR", "DESIRED", "ACKED", "SYNCED", "DRIFT", "UNDERLAY"
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
            "{:<16} {:<9} {:<13} {:<13} {:<7} {:<8} {:<22} {}",
            n.node,
            executor,
            short(&n.desired_version),
            short(&n.acked_version),
            synced,
            n.drift_repairs,
            underlay,
            error
        );
        for e in n.errors.iter().skip(1) {
            let _ = writeln!(t, "{:<16} {:>90} {}: {}", "", "", e.object, e.reason);
        }
    }
    Ok(t)
}

/// `kuportctl portmap NS/NAME`: which nodes program it, its endpoint and links, or why not.
pub async fn port_map(client: &mut DebugClient<Channel>, name: &str, output: Output) -> Result<String, CtlError> {
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
    }
    t.push_str("status:\n");
    for line in e.status_yaml.lines() {
        let _ = writeln!(t, "  {line}");
    }
    Ok(t)
}
