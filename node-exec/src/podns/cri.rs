//! Asking the container runtime (CRI, runtime.v1 over its unix socket) for a pod's network
//! namespace: the pod's ready sandbox by its UID label (ListPodSandbox), then that sandbox's
//! verbose status (PodSandboxStatus), whose `info` JSON, in containerd and CRI-O alike, holds
//! `runtimeSpec.linux.namespaces` (the network namespace's path) and `pid`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kuport_proto::v1::PodRef;

/// The vendored CRI subset (node-exec/proto/runtime/v1/api.proto), client and server (tests
/// serve a fake runtime with it).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod api {
    tonic::include_proto!("runtime.v1");
}

use api::runtime_service_client::RuntimeServiceClient;

/// Where containerd and CRI-O serve the CRI, in the order they are tried.
pub const SOCKETS: [&str; 2] = ["/run/containerd/containerd.sock", "/var/run/crio/crio.sock"];

/// How long one question to the runtime may take.
const TIMEOUT: Duration = Duration::from_secs(3);

/// The first of [`SOCKETS`] that exists on this node.
pub fn default_socket() -> Option<PathBuf> {
    SOCKETS.iter().map(PathBuf::from).find(|p| p.exists())
}

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The runtime did not answer (connect, the call, the deadline).
    #[error("CRI {socket}: {reason}", socket = socket.display())]
    Unreachable { socket: PathBuf, reason: String },
    /// The runtime answered with a status kuport cannot read a namespace from.
    #[error("CRI {socket}: sandbox {sandbox}: {reason}", socket = socket.display())]
    Info { socket: PathBuf, sandbox: String, reason: String },
}

/// What the runtime says of a pod's ready sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    /// Its network namespace's file; None when the sandbox has no network namespace of its own
    /// (it runs in the host's).
    pub netns: Option<PathBuf>,
    /// The sandbox's process, when the runtime names it.
    pub pid: Option<u32>,
}

/// The pod's newest ready sandbox as the runtime at `socket` reports it; None when it has none.
/// Blocking: the question runs on a thread of its own, with its own runtime, so that callers on
/// any thread (or inside another runtime) can ask.
pub fn sandbox(socket: &Path, pod: &PodRef) -> Result<Option<Sandbox>, CriError> {
    let (socket, pod) = (socket.to_path_buf(), pod.clone());
    let unreachable = |s: &Path, reason: String| CriError::Unreachable { socket: s.to_path_buf(), reason };
    let worker = std::thread::Builder::new().name("kuport-cri".into()).spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| unreachable(&socket, format!("starting a runtime: {e}")))?;
        rt.block_on(async {
            match tokio::time::timeout(TIMEOUT, ask(&socket, &pod)).await {
                Ok(r) => r,
                Err(_) => Err(unreachable(&socket, format!("no answer within {TIMEOUT:?}"))),
            }
        })
    });
    match worker {
        Ok(handle) => handle.join().unwrap_or_else(|_| {
            Err(CriError::Unreachable { socket: PathBuf::new(), reason: "the CRI thread panicked".into() })
        }),
        Err(e) => Err(CriError::Unreachable { socket: PathBuf::new(), reason: format!("spawning a thread: {e}") }),
    }
}

async fn ask(socket: &Path, pod: &PodRef) -> Result<Option<Sandbox>, CriError> {
    let unreachable = |reason: String| CriError::Unreachable { socket: socket.to_path_buf(), reason };
    let path = socket.to_path_buf();
    // The URI is required by tonic and ignored: the connector dials the socket.
    let channel = tonic::transport::Endpoint::from_static("http://cri.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { tokio::net::UnixStream::connect(path).await.map(hyper_util::rt::TokioIo::new) }
        }))
        .await
        .map_err(|e| unreachable(format!("connecting: {e}")))?;
    let mut client = RuntimeServiceClient::new(channel);
    let filter = api::PodSandboxFilter {
        state: Some(api::PodSandboxStateValue { state: api::PodSandboxState::SandboxReady as i32 }),
        label_selector: labels(pod),
        ..Default::default()
    };
    let listed = client
        .list_pod_sandbox(api::ListPodSandboxRequest { filter: Some(filter) })
        .await
        .map_err(|e| unreachable(format!("ListPodSandbox: {}", e.message())))?
        .into_inner();
    // A runtime that ignores the filter still must not hand us another pod's sandbox.
    let Some(newest) = listed
        .items
        .into_iter()
        .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32 && belongs(s, pod))
        .max_by_key(|s| s.created_at)
    else {
        return Ok(None);
    };
    let status = client
        .pod_sandbox_status(api::PodSandboxStatusRequest { pod_sandbox_id: newest.id.clone(), verbose: true })
        .await
        .map_err(|e| unreachable(format!("PodSandboxStatus {}: {}", newest.id, e.message())))?
        .into_inner();
    let info = |reason: String| CriError::Info { socket: socket.to_path_buf(), sandbox: newest.id.clone(), reason };
    let (netns, pid) = parse_info(&status.info).map_err(info)?;
    Ok(Some(Sandbox { id: newest.id, netns, pid }))
}

/// The labels the kubelet puts on every sandbox: the pod's UID, else its namespace and name.
fn labels(pod: &PodRef) -> HashMap<String, String> {
    if pod.uid.is_empty() {
        HashMap::from([
            ("io.kubernetes.pod.namespace".to_string(), pod.namespace.clone()),
            ("io.kubernetes.pod.name".to_string(), pod.name.clone()),
        ])
    } else {
        HashMap::from([("io.kubernetes.pod.uid".to_string(), pod.uid.clone())])
    }
}

/// Whether sandbox `s` is `pod`'s, by its labels or its metadata.
fn belongs(s: &api::PodSandbox, pod: &PodRef) -> bool {
    let label = |k: &str| s.labels.get(k).map(String::as_str);
    let meta = s.metadata.as_ref();
    if !pod.uid.is_empty() {
        return label("io.kubernetes.pod.uid") == Some(pod.uid.as_str()) || meta.is_some_and(|m| m.uid == pod.uid);
    }
    let named = |ns: &str, name: &str| ns == pod.namespace && name == pod.name;
    named(label("io.kubernetes.pod.namespace").unwrap_or_default(), label("io.kubernetes.pod.name").unwrap_or_default())
        || meta.is_some_and(|m| named(&m.namespace, &m.name))
}

/// The network namespace and pid in a verbose status's `info`: containerd and CRI-O both write
/// `{"pid": N, "runtimeSpec": {"linux": {"namespaces": [{"type": "network", "path": P}]}}}`.
/// No network entry: the sandbox shares the host's; an entry without a path: a namespace of its
/// own, reached through its process.
pub fn parse_info(info: &HashMap<String, String>) -> Result<(Option<PathBuf>, Option<u32>), String> {
    let text = info.get("info").ok_or("the verbose status has no \"info\"")?;
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("its \"info\" is not JSON: {e}"))?;
    let pid = v.get("pid").and_then(serde_json::Value::as_u64).and_then(|p| u32::try_from(p).ok()).filter(|p| *p > 0);
    let namespaces = v
        .pointer("/runtimeSpec/linux/namespaces")
        .and_then(serde_json::Value::as_array)
        .ok_or("its \"info\" has no runtimeSpec.linux.namespaces")?;
    let Some(network) = namespaces.iter().find(|n| n.get("type").and_then(|t| t.as_str()) == Some("network")) else {
        return Ok((None, pid));
    };
    match network.get("path").and_then(|p| p.as_str()).filter(|p| !p.is_empty()) {
        Some(p) => Ok((Some(PathBuf::from(p)), pid)),
        None => match pid {
            Some(pid) => Ok((Some(PathBuf::from(format!("/proc/{pid}/ns/net"))), Some(pid))),
            None => Err("its network namespace has neither a path nor a process".into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(json: &str) -> HashMap<String, String> {
        HashMap::from([("info".to_string(), json.to_string())])
    }

    #[test]
    fn the_network_namespace_is_read_from_containerd_and_cri_o_info() {
        // containerd's (trimmed): pid, runtimeSpec with every namespace the sandbox has.
        let containerd = info(
            r#"{"pid":4242,"processStatus":"running","runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"},{"type":"network","path":"/var/run/netns/cni-1b2c"}]}}}"#,
        );
        assert_eq!(parse_info(&containerd), Ok((Some(PathBuf::from("/var/run/netns/cni-1b2c")), Some(4242))));
        // CRI-O's pins its namespaces under /var/run/netns too.
        let crio = info(
            r#"{"image":"pause","pid":77,"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"/var/run/netns/9f3a"},{"type":"user","path":"/var/run/userns/9f3a"}]}}}"#,
        );
        assert_eq!(parse_info(&crio), Ok((Some(PathBuf::from("/var/run/netns/9f3a")), Some(77))));
        let host = info(r#"{"pid":9,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"}]}}}"#);
        assert_eq!(parse_info(&host), Ok((None, Some(9))));
        let own = info(r#"{"pid":9,"runtimeSpec":{"linux":{"namespaces":[{"type":"network"}]}}}"#);
        assert_eq!(parse_info(&own), Ok((Some(PathBuf::from("/proc/9/ns/net")), Some(9))));
        assert!(parse_info(&HashMap::new()).is_err());
        assert!(parse_info(&info("{")).is_err());
        assert!(parse_info(&info(r#"{"pid":1}"#)).is_err());
    }

    #[test]
    fn a_sandbox_is_the_pods_by_uid_else_by_name() {
        let pod = PodRef { namespace: "web".into(), name: "web-0".into(), uid: "u-1".into(), ..Default::default() };
        let mut s = api::PodSandbox { labels: labels(&pod), ..Default::default() };
        assert!(belongs(&s, &pod));
        s.labels.insert("io.kubernetes.pod.uid".into(), "u-2".into());
        assert!(!belongs(&s, &pod));
        let unnamed = PodRef { uid: String::new(), ..pod.clone() };
        let s = api::PodSandbox { labels: labels(&unnamed), ..Default::default() };
        assert!(belongs(&s, &unnamed));
        assert!(!belongs(&s, &PodRef { name: "web-1".into(), ..unnamed }));
    }
}
