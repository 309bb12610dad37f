//! What a cluster gives kuport's callers, stood up by the lab on its API server (Kubernetes
//! source only; docs/security.md): per node a Pod `node-exec-<node>` of the ServiceAccount
//! `kuport-node-exec` bound to that node (there is no kubelet: it never runs), and the token a
//! kubelet would project into it, minted with the TokenRequest API (audience
//! `kuport.wlz.li/node-exec`, 1 h, bound to the Pod, so the API server writes the node into it)
//! and written to `nodes/<node>/token`; the CA bundle of ConfigMap `kuport-ca`, copied to
//! `ca.crt` once the controller published it; and the lab's own Debug caller, the ServiceAccount
//! `kuport-lab` bound to the chart's debug ClusterRole (`access.yaml`).
//!
//! A kubelet refreshes a projected token at 80% of its life; here the `kuport-lab kubelet`
//! process does ([`run_kubelet`]), for as long as the lab's other processes live.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::apiserver::{self, LEASE_NAMESPACE};

/// The namespace of everything here: the chart's release namespace.
pub const NAMESPACE: &str = LEASE_NAMESPACE;
/// The executors' ServiceAccount (the chart's, release "kuport").
pub const EXECUTOR_SERVICE_ACCOUNT: &str = "kuport-node-exec";
/// The lab's Debug caller.
pub const LAB_SERVICE_ACCOUNT: &str = "kuport-lab";
/// The audience of the executors' tokens (the chart's projected volume, the controller's default).
pub const EXECUTOR_AUDIENCE: &str = kuport_controller::trust::EXECUTOR_AUDIENCE;
/// The executors' token lifetime, as the chart's projected volume asks.
pub const TOKEN_SECONDS: i64 = 3600;
/// A node's token, in its folder.
pub const TOKEN_FILE: &str = "token";
/// The CA bundle, in the plane's folder.
pub const CA_FILE: &str = "ca.crt";
/// How long the controller may take to publish its CA.
const CA_TIMEOUT: Duration = Duration::from_secs(30);
/// The field manager of what is written here.
const MANAGER: &str = "kuport-lab";

/// The ServiceAccounts, the debug ClusterRole and its binding.
const ACCESS: &str = include_str!("access.yaml");

/// The executor Pod of `node`.
pub fn pod_name(node: &str) -> String {
    format!("node-exec-{node}")
}

/// `system:serviceaccount:NS:NAME` as the controller's `--executor-service-account` takes it.
pub fn executor_service_account() -> String {
    format!("{NAMESPACE}:{EXECUTOR_SERVICE_ACCOUNT}")
}

/// Applies `access.yaml` (after [`apiserver::prepare`], which makes the namespace).
pub async fn prepare(client: &kube::Client) -> anyhow::Result<()> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(ACCESS) {
        use serde::Deserialize as _;
        docs.push(serde_yaml::Value::deserialize(doc).context("access.yaml")?);
    }
    apiserver::sync(client, &[], &docs).await
}

/// Creates (server-side apply) the executor Pod of `node`, bound to it as the scheduler would.
pub async fn ensure_pod(client: &kube::Client, node: &str) -> anyhow::Result<Pod> {
    let name = pod_name(node);
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/component": "node-exec"}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": EXECUTOR_SERVICE_ACCOUNT,
            "automountServiceAccountToken": false,
            "containers": [{"name": "node-exec", "image": "kuport-node-exec"}],
        },
    });
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    pods.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&pod))
        .await
        .with_context(|| format!("creating Pod {NAMESPACE}/{name}"))
}

/// A minted token and when it expires.
#[derive(Debug, Clone)]
pub struct Token {
    pub token: String,
    pub expires: SystemTime,
}

/// A TokenRequest for `account`: `audiences` (empty: the API server's own), bound to `pod`
/// (name, uid) if given.
async fn request(
    client: &kube::Client,
    account: &str,
    audiences: Vec<String>,
    seconds: Option<i64>,
    pod: Option<&Pod>,
) -> anyhow::Result<Token> {
    let bound = match pod {
        Some(p) => Some(BoundObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: p.metadata.name.clone(),
            uid: Some(p.metadata.uid.clone().ok_or_else(|| anyhow!("Pod {:?} has no uid", p.metadata.name))?),
        }),
        None => None,
    };
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: (!audiences.is_empty()).then_some(audiences),
            expiration_seconds: seconds,
            bound_object_ref: bound,
            ..Default::default()
        }),
        ..Default::default()
    };
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE);
    let answer: TokenRequest = accounts
        .create_subresource("token", account, &PostParams::default(), &req)
        .await
        .with_context(|| format!("TokenRequest for ServiceAccount {NAMESPACE}/{account}"))?;
    let status = answer.status.ok_or_else(|| anyhow!("TokenRequest for {account}: no status"))?;
    let token =
        status.token.filter(|t| !t.is_empty()).ok_or_else(|| anyhow!("TokenRequest for {account}: no token"))?;
    let expires = status
        .expiration_timestamp
        .map(|t| SystemTime::from(t.0))
        .ok_or_else(|| anyhow!("TokenRequest for {account}: no expiration"))?;
    Ok(Token { token, expires })
}

/// The token a kubelet would project into `node`'s executor Pod: audience
/// [`EXECUTOR_AUDIENCE`], [`TOKEN_SECONDS`], bound to the Pod (read anew: its uid).
pub async fn executor_token(client: &kube::Client, node: &str) -> anyhow::Result<Token> {
    let name = pod_name(node);
    let pod = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .get(&name)
        .await
        .with_context(|| format!("reading Pod {NAMESPACE}/{name}"))?;
    request(client, EXECUTOR_SERVICE_ACCOUNT, vec![EXECUTOR_AUDIENCE.into()], Some(TOKEN_SECONDS), Some(&pod)).await
}

/// A token of the lab's Debug caller (the API server's own audience, 1 h).
pub async fn lab_token(client: &kube::Client) -> anyhow::Result<Token> {
    request(client, LAB_SERVICE_ACCOUNT, Vec::new(), Some(TOKEN_SECONDS), None).await
}

/// How long the token in [`KUBECONFIG_FILE`] lasts: a lab's working day.
pub const KUBECONFIG_TOKEN_SECONDS: i64 = 24 * 3600;
/// The kubeconfig of the lab's Debug caller, in the lab's folder: `kubectl kuport` (kuportctl)
/// needs nothing else (docs/decisions.md, "kubectl kuport").
pub const KUBECONFIG_FILE: &str = "kuportctl.kubeconfig";

/// Writes to `out` a kubeconfig for the lab's Debug caller: the admin kubeconfig's cluster, and
/// a token of ServiceAccount kuport-lab ([`KUBECONFIG_TOKEN_SECONDS`]), which `access.yaml`
/// lets call Debug and read the Lease and the CA bundle. The admin's client certificate is no
/// token kuportctl could forward.
pub async fn write_kubeconfig(client: &kube::Client, admin: &Path, out: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(admin).with_context(|| format!("reading {}", admin.display()))?;
    let admin: serde_yaml::Value = serde_yaml::from_str(&text).with_context(|| format!("{}", admin.display()))?;
    let cluster = admin
        .get("clusters")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("cluster"))
        .cloned()
        .ok_or_else(|| anyhow!("the admin kubeconfig has no cluster"))?;
    let token = request(client, LAB_SERVICE_ACCOUNT, Vec::new(), Some(KUBECONFIG_TOKEN_SECONDS), None).await?;
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kuport-lab", "cluster": cluster}],
        "users": [{"name": LAB_SERVICE_ACCOUNT, "user": {"token": token.token}}],
        "contexts": [{"name": "kuport-lab", "context": {"cluster": "kuport-lab", "user": LAB_SERVICE_ACCOUNT, "namespace": NAMESPACE}}],
        "current-context": "kuport-lab",
    });
    write_private(out, &serde_yaml::to_string(&config)?)
}

/// Writes `text` to `path` with mode 0600, replacing it at once (a reader never sees half).
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
}

/// Mints `node`'s executor token and writes it to `file`; when it expires.
pub async fn refresh(client: &kube::Client, node: &str, file: &Path) -> anyhow::Result<SystemTime> {
    let t = executor_token(client, node).await?;
    write_private(file, &t.token)?;
    Ok(t.expires)
}

/// Waits until the controller published its CA bundle (ConfigMap kuport-ca) and returns it.
pub async fn wait_ca(client: &kube::Client) -> anyhow::Result<String> {
    use kuport_controller::trust::{CA_CONFIGMAP, CA_KEY};
    let maps = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE);
    let started = std::time::Instant::now();
    loop {
        let found = maps.get_opt(CA_CONFIGMAP).await.with_context(|| format!("reading ConfigMap {CA_CONFIGMAP}"))?;
        if let Some(ca) = found.and_then(|m| m.data).and_then(|mut d| d.remove(CA_KEY)).filter(|c| !c.is_empty()) {
            return Ok(ca);
        }
        if started.elapsed() > CA_TIMEOUT {
            bail!("the controller did not publish ConfigMap {NAMESPACE}/{CA_CONFIGMAP} within {CA_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// When a token minted at `minted` that expires at `expires` is refreshed: at 80% of its life,
/// as a kubelet does.
pub fn refresh_at(minted: SystemTime, expires: SystemTime) -> SystemTime {
    let life = expires.duration_since(minted).unwrap_or_default();
    minted + life.mul_f64(0.8)
}

/// `kuport-lab kubelet`: refreshes each node's token (written by the plane at start) at 80% of its
/// life, until SIGTERM; a failed refresh is retried every 10 s. The lab's stand-in for the kubelet's
/// projected token volume.
pub async fn run_kubelet(kubeconfig: PathBuf, nodes: Vec<(String, PathBuf)>) -> anyhow::Result<()> {
    let client = apiserver::client(&kubeconfig).await?;
    let now = SystemTime::now();
    // The plane minted them just now: the first refresh is due at 80% of a whole life.
    let first = now + Duration::from_secs(TOKEN_SECONDS as u64).mul_f64(0.8);
    let mut due: Vec<(String, PathBuf, SystemTime)> = nodes.into_iter().map(|(n, f)| (n, f, first)).collect();
    loop {
        let next = due.iter().map(|d| d.2).min().unwrap_or(now + Duration::from_secs(3600));
        let wait = next.duration_since(SystemTime::now()).unwrap_or_default();
        tokio::time::sleep(wait).await;
        for (node, file, at) in due.iter_mut() {
            if *at > SystemTime::now() {
                continue;
            }
            let minted = SystemTime::now();
            match refresh(&client, node, file).await {
                Ok(expires) => {
                    *at = refresh_at(minted, expires);
                    tracing::info!(%node, file = %file.display(), "token refreshed");
                }
                Err(e) => {
                    *at = SystemTime::now() + Duration::from_secs(10);
                    tracing::warn!(%node, "token refresh failed, retrying in 10 s: {e:#}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refreshed_at_four_fifths_of_its_life() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        assert_eq!(refresh_at(t, t + Duration::from_secs(3600)), t + Duration::from_secs(2880));
        // An expiry in the past: due at once.
        assert_eq!(refresh_at(t, t - Duration::from_secs(1)), t);
    }

    #[test]
    fn private_files_are_0600() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("kuport-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        write_private(&f, "a").unwrap();
        write_private(&f, "b").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "b");
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
