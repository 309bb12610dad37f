//! Offline render: a folder of YAML manifests in, every node's state and every status out.
//!
//! The same computation the controller runs, fed from files, so a user can see what kuport
//! would program before installing it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::api::{Intercept, PortMap, PortMapClass};
use crate::compute::Outputs;
use crate::observe::{Cluster, KnownFacts, KnownInterface};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: cannot read: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: document {doc}: not YAML: {source}")]
    Yaml { path: PathBuf, doc: usize, source: serde_yaml::Error },
    #[error("{path}: document {doc}: {object}: field {field}: {reason}")]
    Field { path: PathBuf, doc: usize, object: String, field: String, reason: String },
    #[error("{path}: document {doc}: {object}: kind {kind:?} of apiVersion {api_version:?} is not a render input")]
    Kind { path: PathBuf, doc: usize, object: String, kind: String, api_version: String },
}

/// Node facts as a render input: what an executor would report.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeFactsDoc {
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    #[serde(default)]
    underlay_address: Option<std::net::Ipv4Addr>,
    #[serde(default)]
    underlay_mtu: Option<u32>,
    #[serde(default)]
    interfaces: Option<Vec<KnownInterface>>,
    /// Checked by the overlay's computation as an executor's report is by `facts::check`.
    #[serde(default)]
    wireguard_public_key: Option<String>,
    /// The main table's routes, as an executor reports them (`routes` of sync.proto).
    #[serde(default)]
    routes: Option<Vec<crate::observe::KnownRoute>>,
    #[serde(default)]
    vxlan_ports: Vec<u16>,
}

/// Reads every *.yaml and *.yml file in `dir` (sorted, not recursive) into a cluster.
pub fn load_dir(dir: &Path, now: Timestamp) -> Result<Cluster, LoadError> {
    let read_err = |source| LoadError::Read { path: dir.to_path_buf(), source };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    let mut cluster = Cluster { now, ..Default::default() };
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Read { path: path.clone(), source })?;
        load_text(&path, &text, &mut cluster)?;
    }
    Ok(cluster)
}

/// Adds the documents of one file to `cluster`.
pub fn load_text(path: &Path, text: &str, cluster: &mut Cluster) -> Result<(), LoadError> {
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let doc_no = i + 1;
        let value = serde_yaml::Value::deserialize(doc).map_err(|source| LoadError::Yaml {
            path: path.to_path_buf(),
            doc: doc_no,
            source,
        })?;
        if value.is_null() {
            continue;
        }
        let s = |k: &str| value.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
        let (api_version, kind) = (s("apiVersion"), s("kind"));
        let meta = |k: &str| {
            value.get("metadata").and_then(|m| m.get(k)).and_then(|v| v.as_str()).unwrap_or_default().to_string()
        };
        let object = match meta("namespace").as_str() {
            "" => format!("{kind} {}", meta("name")),
            ns => format!("{kind} {ns}/{}", meta("name")),
        };
        let ctx = Ctx { path, doc: doc_no, object: &object };
        match (api_version.as_str(), kind.as_str()) {
            ("v1", "Node") => cluster.nodes.push(ctx.parse::<Node>(value)?),
            ("v1", "Namespace") => cluster.namespaces.push(ctx.parse::<Namespace>(value)?),
            ("v1", "Service") => cluster.services.push(ctx.parse::<Service>(value)?),
            ("v1", "Pod") => cluster.pods.push(ctx.parse::<Pod>(value)?),
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                cluster.endpoint_slices.push(ctx.parse::<EndpointSlice>(value)?)
            }
            ("kuport.wlz.li/v1alpha1", "PortMapClass") => cluster.classes.push(ctx.parse::<PortMapClass>(value)?),
            ("kuport.wlz.li/v1alpha1", "PortMap") => cluster.port_maps.push(ctx.parse::<PortMap>(value)?),
            ("kuport.wlz.li/v1alpha1", "Intercept") => cluster.intercepts.push(ctx.parse::<Intercept>(value)?),
            ("kuport.wlz.li/v1alpha1", "NodeFacts") => {
                let f: NodeFactsDoc = ctx.parse(value)?;
                cluster.facts.push(KnownFacts {
                    node: f.metadata.name.unwrap_or_default(),
                    underlay_address: f.underlay_address,
                    underlay_mtu: f.underlay_mtu,
                    interfaces: f.interfaces,
                    wireguard_public_key: f.wireguard_public_key,
                    routes: f.routes,
                    vxlan_ports: f.vxlan_ports,
                });
            }
            _ => {
                return Err(LoadError::Kind { path: path.to_path_buf(), doc: doc_no, object, kind, api_version });
            }
        }
    }
    Ok(())
}

struct Ctx<'a> {
    path: &'a Path,
    doc: usize,
    object: &'a str,
}

impl Ctx<'_> {
    fn parse<T: DeserializeOwned>(&self, value: serde_yaml::Value) -> Result<T, LoadError> {
        serde_path_to_error::deserialize(value).map_err(|e| LoadError::Field {
            path: self.path.to_path_buf(),
            doc: self.doc,
            object: self.object.to_string(),
            field: e.path().to_string(),
            reason: e.into_inner().to_string(),
        })
    }
}

/// The text `kuport-controller render` prints: every node's state, then every status.
pub fn render_text(out: &Outputs) -> String {
    let mut text = String::new();
    for (node, state) in &out.node_states {
        let _ = writeln!(text, "=== node {node} (version {})", &kuport_proto::canonical_version(state)[..12]);
        text.push_str(&kuport_proto::text::node_state(state));
        text.push('\n');
    }
    for ((ns, name), status) in out.port_maps.iter() {
        let _ = writeln!(text, "=== PortMap {ns}/{name} status");
        text.push_str(&serde_yaml::to_string(status).unwrap_or_else(|e| format!("<unprintable: {e}>\n")));
        text.push('\n');
    }
    for ((ns, name), status) in out.intercepts.iter() {
        let _ = writeln!(text, "=== Intercept {ns}/{name} status");
        text.push_str(&serde_yaml::to_string(status).unwrap_or_else(|e| format!("<unprintable: {e}>\n")));
        text.push('\n');
    }
    if !out.overlay.is_empty() {
        text.push_str("=== overlay\n");
        text.push_str(&crate::compute::overlay::summary(&out.overlay));
        text.push('\n');
    }
    for (name, status) in out.classes.iter() {
        let _ = writeln!(text, "=== PortMapClass {name} status");
        text.push_str(&serde_yaml::to_string(status).unwrap_or_else(|e| format!("<unprintable: {e}>\n")));
        text.push('\n');
    }
    text
}
