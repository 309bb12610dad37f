//! The manifest folder a plane's controller reads (the lab state dir for `kuport-lab up`):
//!
//! ```text
//! manifests -> manifests.N   the folder the controller watches (a symlink, swapped atomically)
//! manifests.N/00-lab-objects.yaml   Nodes, Namespaces, Services, EndpointSlices, NodeFacts
//! manifests.N/01-<file>.yaml ...    the user's manifests, in their order
//! nodes/<node>/applied.pb    each executor's stored state
//! nodes/<node>/token         its pod-bound token (Kubernetes source, mode 0600)
//! ca.crt                     the controller's CA bundle (Kubernetes source)
//! controller.log, node-exec-<node>.log, kubelet.log
//! ```
//!
//! Every change writes a whole new generation and swaps the link, so the controller never reads
//! a half-replaced set of files (a moment without the classes would withdraw every mapping).

use std::path::Path;

use anyhow::Context as _;

use super::Plane;
use crate::apiserver;
use crate::manifests::Manifests;

/// The folder the controller watches, inside the plane's folder.
pub const MANIFESTS: &str = "manifests";
/// The generated objects' file in it.
pub const OBJECTS_FILE: &str = "00-lab-objects.yaml";
/// The executors' stored states, one folder per node.
pub const STORES: &str = "nodes";

impl Plane {
    /// Replaces the user's manifests (the generated objects stay); the controller picks the
    /// change up within its folder poll (250 ms) and the recompute pace (100 ms).
    pub fn set_manifests(&mut self, manifests: &Manifests) -> anyhow::Result<()> {
        self.user = manifests.files.clone();
        self.write_folder()
    }

    /// Replaces the generated objects (after a pod moved, say).
    pub fn set_objects(&mut self, objects: String) -> anyhow::Result<()> {
        self.objects = objects;
        self.write_folder()
    }

    /// Writes a new generation and points the watched folder at it, then removes all but the
    /// previous generation. With the Kubernetes source, the API server is then made to hold
    /// the new generation's objects and none of the old one's that it lacks.
    pub(super) fn write_folder(&mut self) -> anyhow::Result<()> {
        let old = match self.options.kubernetes {
            Some(_) => apiserver::folder_docs(&self.manifests_dir())?,
            None => Vec::new(),
        };
        self.write_generation()?;
        if self.options.kubernetes.is_some() {
            let new = apiserver::folder_docs(&self.manifests_dir())?;
            let client = self.kube()?;
            self.rt.block_on(apiserver::sync(&client, &old, &new))?;
        }
        Ok(())
    }

    fn write_generation(&mut self) -> anyhow::Result<()> {
        let dir = self.dir().to_path_buf();
        let generations = generations(&dir)?;
        let n = generations.last().map_or(1, |g| g + 1);
        let target = format!("{MANIFESTS}.{n}");
        let folder = dir.join(&target);
        std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
        let mut files = vec![(OBJECTS_FILE.to_string(), self.objects.clone())];
        for (i, (name, text)) in self.user.iter().enumerate() {
            let base = Path::new(name).file_name().map(|b| b.to_string_lossy().into_owned()).unwrap_or_default();
            let base = if base.ends_with(".yaml") || base.ends_with(".yml") { base } else { format!("{base}.yaml") };
            files.push((format!("{:02}-{base}", i + 1), text.clone()));
        }
        for (name, text) in &files {
            let path = folder.join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        let link = dir.join(MANIFESTS);
        let tmp = dir.join(format!(".{MANIFESTS}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp).with_context(|| format!("linking {}", tmp.display()))?;
        std::fs::rename(&tmp, &link).with_context(|| format!("replacing {}", link.display()))?;
        for g in generations.iter().filter(|g| **g + 1 < n) {
            let _ = std::fs::remove_dir_all(dir.join(format!("{MANIFESTS}.{g}")));
        }
        Ok(())
    }
}

/// The generation numbers of `manifests.N` folders in `dir`, ascending.
fn generations(dir: &Path) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(n) = name.strip_prefix(&format!("{MANIFESTS}.")).and_then(|n| n.parse().ok()) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The files and folders a plane writes into `dir` (for `kuport-lab down`).
pub fn remove_files(dir: &Path) {
    if let Ok(gens) = generations(dir) {
        for g in gens {
            let _ = std::fs::remove_dir_all(dir.join(format!("{MANIFESTS}.{g}")));
        }
    }
    let _ = std::fs::remove_file(dir.join(MANIFESTS));
    let _ = std::fs::remove_file(dir.join(format!(".{MANIFESTS}.tmp")));
    let _ = std::fs::remove_dir_all(dir.join(STORES));
    let _ = std::fs::remove_dir_all(dir.join(super::WIREGUARD_SOCKETS));
    let _ = std::fs::remove_file(dir.join(super::trust::CA_FILE));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if (n.starts_with("node-exec-") || n.starts_with("controller") || n.starts_with("kubelet"))
                && n.ends_with(".log")
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}
