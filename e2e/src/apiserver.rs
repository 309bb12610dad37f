//! The lab's Kubernetes source: a local control plane (etcd and kube-apiserver from
//! `e2e/controlplane/`) and the objects the lab registers in it, kept equal to the plane's
//! manifest folder.
//!
//! There is no kubelet: the lab writes Node and Pod status itself (through the status
//! subresource), and the EndpointSlices stand for the endpoint controller's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{self, ApiCapabilities, ApiResource, Scope};
use serde::{Deserialize, Serialize};

/// The field manager of everything the lab writes.
const MANAGER: &str = "kuport-lab";
/// Where the controller replicas elect their leader: the chart's release namespace and Lease.
pub const LEASE_NAMESPACE: &str = "kuport-system";
pub const LEASE_NAME: &str = "kuport-controller";
/// Kinds only the standalone controller reads (its folder's stand-in for executor reports).
const FOLDER_ONLY: &[&str] = &["NodeFacts"];
/// Kinds whose status the lab writes because no kubelet does.
const STATUS_KINDS: &[&str] = &["Node", "Pod"];

fn e2e_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The repository's CRDs.
pub fn crds_file() -> PathBuf {
    e2e_dir().join("../crds/kuport.wlz.li.yaml")
}

fn script(name: &str, args: &[&Path]) -> anyhow::Result<String> {
    script_showing(name, args, false)
}

/// Runs a control-plane script; its last stdout line. `show`: its stderr (what it does, the
/// build's heartbeat) goes to ours rather than into the error.
fn script_showing(name: &str, args: &[&Path], show: bool) -> anyhow::Result<String> {
    let path = e2e_dir().join("controlplane").join(name);
    let mut cmd = Command::new("bash");
    cmd.arg(&path).args(args);
    if show {
        cmd.stderr(std::process::Stdio::inherit());
    }
    let out = cmd.output().with_context(|| format!("running {name}"))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        bail!("{name} failed: {}", if show { "see its output above" } else { said.trim() });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(stdout.lines().last().unwrap_or_default().trim().to_string())
}

/// etcd and kube-apiserver on loopback, with their state in `dir`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiServer {
    pub dir: PathBuf,
    /// The admin's kubeconfig (system:masters).
    pub kubeconfig: PathBuf,
    /// Where kubectl and helm are.
    pub bin: PathBuf,
}

impl ApiServer {
    /// Builds what is missing (cached) and starts etcd and kube-apiserver with state in `dir`.
    pub fn up(dir: &Path) -> anyhow::Result<ApiServer> {
        Self::up_showing(dir, false)
    }

    /// As [`ApiServer::up`]; `show`: the build's and the start's progress on stderr (the CLI:
    /// a cold build takes half an hour, e2e/README.md).
    pub fn up_showing(dir: &Path, show: bool) -> anyhow::Result<ApiServer> {
        let bin = PathBuf::from(script_showing("build.sh", &[], show)?);
        let kubeconfig = PathBuf::from(script_showing("up.sh", &[dir], show)?);
        Ok(ApiServer { dir: dir.to_path_buf(), kubeconfig, bin })
    }

    /// Stops both and removes `dir`.
    pub fn down(&self) -> anyhow::Result<()> {
        script("down.sh", &[&self.dir]).map(|_| ())
    }

    /// Runs kubectl as the admin; its stdout.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        run_tool(&self.bin.join("kubectl"), &self.kubeconfig, args, stdin)
    }

    /// Runs helm as the admin; its stdout.
    pub fn helm(&self, args: &[&str]) -> anyhow::Result<String> {
        run_tool(&self.bin.join("helm"), &self.kubeconfig, args, None)
    }
}

fn run_tool(tool: &Path, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    use std::io::Write as _;
    let mut cmd = Command::new(tool);
    cmd.args(args).env("KUBECONFIG", kubeconfig);
    cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("running {}", tool.display()))?;
    if let Some(mut pipe) = child.stdin.take() {
        pipe.write_all(stdin.unwrap_or_default().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{} {}: {}", tool.display(), args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A kube client from a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc =
        kube::config::Kubeconfig::read_from(kubeconfig).with_context(|| format!("reading {}", kubeconfig.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("{}", kubeconfig.display()))?;
    kube::Client::try_from(cfg).context("a Kubernetes client")
}

/// The leader's NodeSync address, from the Lease holder (`identity@address`); None while no
/// replica holds it.
pub async fn leader(client: &kube::Client) -> anyhow::Result<Option<String>> {
    let lease = Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE).get_opt(LEASE_NAME).await?;
    let holder = lease.and_then(|l| l.spec).and_then(|s| s.holder_identity).unwrap_or_default();
    Ok(holder.rsplit_once('@').map(|(_, a)| a.to_string()))
}

/// One object of the folder, as the API server knows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    api_version: String,
    kind: String,
    namespace: Option<String>,
    name: String,
}

/// The YAML documents of a folder's files, in file order; a missing folder has none.
pub fn folder_docs(dir: &Path) -> anyhow::Result<Vec<serde_yaml::Value>> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.flatten().map(|e| e.path()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"));
    files.sort();
    let mut docs = Vec::new();
    for f in files {
        docs.extend(file_docs(&f)?);
    }
    Ok(docs)
}

/// Makes the API server hold `new`'s objects: each is applied (server-side, the lab's field
/// manager), and each of `old` that `new` lacks is deleted. Namespaces go first and are deleted
/// last; NodeFacts are the standalone controller's only.
pub async fn sync(client: &kube::Client, old: &[serde_yaml::Value], new: &[serde_yaml::Value]) -> anyhow::Result<()> {
    let mut resources: BTreeMap<(String, String), (ApiResource, ApiCapabilities)> = BTreeMap::new();
    let mut ordered: Vec<&serde_yaml::Value> = new.iter().collect();
    ordered.sort_by_key(|v| v["kind"].as_str() != Some("Namespace"));
    let mut keep = Vec::new();
    for doc in ordered {
        let Some(obj) = object(doc)? else { continue };
        let api = api(client, &mut resources, &obj.0).await?;
        keep.push(obj.0.clone());
        let (key, mut value) = obj;
        let status = value.as_object_mut().and_then(|m| m.remove("status"));
        let what = format!("{} {}", key.kind, key.name);
        let params = PatchParams::apply(MANAGER).force();
        match api.patch(&key.name, &params, &Patch::Apply(&value)).await {
            // A pod moved to another node: its nodeName is immutable, so it is a new Pod (as a
            // rescheduled one would be); without a kubelet only a force delete removes the old.
            Err(kube::Error::Api(e)) if e.code == 422 && key.kind == "Pod" => {
                let force = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
                api.delete(&key.name, &force).await.with_context(|| format!("deleting {what} to recreate it"))?;
                api.patch(&key.name, &params, &Patch::Apply(&value))
                    .await
                    .with_context(|| format!("recreating {what}"))?;
            }
            r => {
                r.with_context(|| format!("applying {what}"))?;
            }
        }
        if let Some(status) = status.filter(|_| STATUS_KINDS.contains(&key.kind.as_str())) {
            let body = serde_json::json!({
                "apiVersion": key.api_version, "kind": key.kind,
                "metadata": {"name": key.name}, "status": status,
            });
            api.patch_status(&key.name, &params, &Patch::Apply(&body))
                .await
                .with_context(|| format!("writing the status of {what}"))?;
        }
    }
    let mut gone: Vec<Key> = Vec::new();
    for doc in old {
        if let Some((key, _)) = object(doc)?
            && !keep.contains(&key)
            && !gone.contains(&key)
        {
            gone.push(key);
        }
    }
    gone.sort_by_key(|k| k.kind == "Namespace");
    for key in gone {
        let api = api(client, &mut resources, &key).await?;
        // No kubelet finishes a Pod's graceful deletion.
        let params = if key.kind == "Pod" {
            DeleteParams { grace_period_seconds: Some(0), ..Default::default() }
        } else {
            DeleteParams::default()
        };
        match api.delete(&key.name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {} {}", key.kind, key.name)),
        }
    }
    Ok(())
}

/// A document's identity and JSON body; None for what the API server does not take.
fn object(doc: &serde_yaml::Value) -> anyhow::Result<Option<(Key, serde_json::Value)>> {
    let s = |v: &serde_yaml::Value| v.as_str().map(str::to_string);
    let (Some(api_version), Some(kind)) = (s(&doc["apiVersion"]), s(&doc["kind"])) else {
        bail!("a document without apiVersion or kind: {doc:?}");
    };
    if FOLDER_ONLY.contains(&kind.as_str()) {
        return Ok(None);
    }
    let name = s(&doc["metadata"]["name"]).ok_or_else(|| anyhow!("a {kind} without metadata.name"))?;
    let namespace = s(&doc["metadata"]["namespace"]);
    let value = serde_json::to_value(doc).with_context(|| format!("{kind} {name}"))?;
    Ok(Some((Key { api_version, kind, namespace, name }, value)))
}

async fn api(
    client: &kube::Client,
    resources: &mut BTreeMap<(String, String), (ApiResource, ApiCapabilities)>,
    key: &Key,
) -> anyhow::Result<Api<DynamicObject>> {
    let id = (key.api_version.clone(), key.kind.clone());
    if !resources.contains_key(&id) {
        let (group, version) = key.api_version.rsplit_once('/').unwrap_or(("", &key.api_version));
        let gvk = GroupVersionKind::gvk(group, version, &key.kind);
        let found = discovery::pinned_kind(client, &gvk)
            .await
            .with_context(|| format!("the API server does not serve {} {}", key.api_version, key.kind))?;
        resources.insert(id.clone(), found);
    }
    let (ar, caps) = &resources[&id];
    Ok(match (&caps.scope, &key.namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, ar),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), ar),
        (Scope::Cluster, _) => Api::all_with(client.clone(), ar),
    })
}

/// Readies an API server for the lab's controllers: the repository's CRDs, served, and the
/// Lease's namespace.
pub async fn prepare(client: &kube::Client) -> anyhow::Result<()> {
    let docs = file_docs(&crds_file())?;
    let namespace: serde_yaml::Value =
        serde_yaml::from_str(&format!("{{apiVersion: v1, kind: Namespace, metadata: {{name: {LEASE_NAMESPACE}}}}}"))?;
    let mut all = docs.clone();
    all.push(namespace);
    sync(client, &[], &all).await?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let started = std::time::Instant::now();
    for doc in &docs {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        loop {
            let crd = crds.get(name).await?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
            if established {
                break;
            }
            if started.elapsed() > std::time::Duration::from_secs(30) {
                bail!("CRD {name} not established within 30 s");
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// The YAML documents of one file.
pub fn file_docs(file: &Path) -> anyhow::Result<Vec<serde_yaml::Value>> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_yaml::Value::deserialize(doc).with_context(|| format!("parsing {}", file.display()))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}
