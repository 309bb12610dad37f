//! The folder source (standalone): a folder of manifests (the render inputs), read again
//! whenever a file in it changes. A folder that does not parse keeps the previous inputs in use and says
//! why, so a bad edit never tears down what works.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;

use crate::render;
use crate::stream::Hub;

/// How often the folder's listing is compared.
pub const POLL: Duration = Duration::from_millis(250);

/// What identifies the folder's content cheaply: each manifest's name, size and modification
/// time (the files `render::load_dir` reads).
fn listing(dir: &Path) -> std::io::Result<Vec<(PathBuf, u64, Option<SystemTime>)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !matches!(entry.path().extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            continue;
        }
        let meta = entry.metadata()?;
        out.push((entry.path(), meta.len(), meta.modified().ok()));
    }
    out.sort();
    Ok(out)
}

/// Loads `dir` into the hub now and on every change, until the process ends.
pub async fn watch(dir: PathBuf, hub: Arc<Hub>) {
    let mut last = None;
    loop {
        let current = listing(&dir).map_err(|e| e.to_string());
        if last.as_ref() != Some(&current) {
            match render::load_dir(&dir, Timestamp::now()) {
                Ok(cluster) => {
                    tracing::info!(dir = %dir.display(), "manifests loaded");
                    hub.set_inputs(cluster);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "manifests refused; keeping the previous ones");
                    hub.set_source_error(e.to_string());
                }
            }
            last = Some(current);
        }
        tokio::time::sleep(POLL).await;
    }
}
