//! The user's side of a lab: PortMapClasses and PortMaps (and anything else `render` reads),
//! from a folder or from text. The texts are kept as well, so the lab can hand the same files
//! to a controller process.

use std::path::Path;

use kuport_controller::observe::Cluster;
use kuport_controller::render::{LoadError, load_text};

/// The shipped default manifests: the two example classes of docs/portmap/modes.md and a
/// PortMap to a pod on a worker.
const DEFAULT: [(&str, &str); 2] = [
    ("manifests/default/classes.yaml", include_str!("../manifests/default/classes.yaml")),
    ("manifests/default/game.yaml", include_str!("../manifests/default/game.yaml")),
];
/// The two example classes and the intranet DNS mappings for the Multi topology.
const MULTI: [(&str, &str); 2] = [
    ("manifests/multi/classes.yaml", include_str!("../manifests/multi/classes.yaml")),
    ("manifests/multi/dns.yaml", include_str!("../manifests/multi/dns.yaml")),
];

/// The sites topology's class and the PortMaps of the home worker's pod (docs/overlay/lab.md).
const SITES: [(&str, &str); 2] = [
    ("manifests/sites/classes.yaml", include_str!("../manifests/sites/classes.yaml")),
    ("manifests/sites/web.yaml", include_str!("../manifests/sites/web.yaml")),
];

#[derive(Debug, Clone, Default)]
pub struct Manifests {
    /// What the documents hold; `now` is set when the lab computes.
    pub cluster: Cluster,
    /// The files they came from, (name, text), in load order.
    pub files: Vec<(String, String)>,
}

impl Manifests {
    pub fn default_lab() -> Manifests {
        Manifests::from_texts(&DEFAULT).expect("the shipped default manifests load")
    }

    pub fn multi_lab() -> Manifests {
        Manifests::from_texts(&MULTI).expect("the shipped Multi manifests load")
    }

    pub fn sites_lab() -> Manifests {
        Manifests::from_texts(&SITES).expect("the shipped sites manifests load")
    }

    /// The manifests shipped with a shipped topology (`default`, `multi`, `sites`).
    pub fn shipped(topology: &str) -> Option<Manifests> {
        match topology {
            "default" => Some(Manifests::default_lab()),
            "multi" => Some(Manifests::multi_lab()),
            "sites" => Some(Manifests::sites_lab()),
            "homes" => Some(Manifests::from_texts(&[]).expect("no manifests load")),
            _ => None,
        }
    }

    /// Every *.yaml and *.yml file of `dir`, sorted by name (what `render::load_dir` reads).
    pub fn from_dir(dir: &Path) -> Result<Manifests, LoadError> {
        let read_err = |source| LoadError::Read { path: dir.to_path_buf(), source };
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .map_err(read_err)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .collect();
        paths.sort();
        let mut m = Manifests::default();
        for path in paths {
            let text =
                std::fs::read_to_string(&path).map_err(|source| LoadError::Read { path: path.clone(), source })?;
            load_text(&path, &text, &mut m.cluster)?;
            m.files.push((path.display().to_string(), text));
        }
        Ok(m)
    }

    /// YAML documents; `name` stands for the file in errors.
    pub fn from_text(name: &str, text: &str) -> Result<Manifests, LoadError> {
        Manifests::from_texts(&[(name, text)])
    }

    pub fn from_texts(files: &[(&str, &str)]) -> Result<Manifests, LoadError> {
        let mut m = Manifests::default();
        for (name, text) in files {
            m = m.add(name, text)?;
        }
        Ok(m)
    }

    /// Adds the documents of `text` to these.
    pub fn add(mut self, name: &str, text: &str) -> Result<Manifests, LoadError> {
        load_text(Path::new(name), text, &mut self.cluster)?;
        self.files.push((name.to_string(), text.to_string()));
        Ok(self)
    }
}
