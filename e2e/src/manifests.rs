//! The user's side of a lab: PortMapClasses and PortMaps (and anything else `render` reads),
//! from a folder or from text.

use std::path::Path;

use kuport_controller::compute::Cluster;
use kuport_controller::render::{LoadError, load_dir, load_text};

/// The shipped default manifests: note 000's two classes and a PortMap to a pod on a worker.
const DEFAULT: [(&str, &str); 2] = [
    ("manifests/default/classes.yaml", include_str!("../manifests/default/classes.yaml")),
    ("manifests/default/game.yaml", include_str!("../manifests/default/game.yaml")),
];
/// Note 000's two classes and the intranet DNS mappings for the Multi topology.
const MULTI: [(&str, &str); 2] = [
    ("manifests/multi/classes.yaml", include_str!("../manifests/multi/classes.yaml")),
    ("manifests/multi/dns.yaml", include_str!("../manifests/multi/dns.yaml")),
];

#[derive(Debug, Clone, Default)]
pub struct Manifests {
    /// What the documents hold; `now` is set when the lab computes.
    pub cluster: Cluster,
}

impl Manifests {
    pub fn default_lab() -> Manifests {
        Manifests::from_texts(&DEFAULT).expect("the shipped default manifests load")
    }

    pub fn multi_lab() -> Manifests {
        Manifests::from_texts(&MULTI).expect("the shipped Multi manifests load")
    }

    /// Every *.yaml and *.yml file of `dir`, sorted by name.
    pub fn from_dir(dir: &Path) -> Result<Manifests, LoadError> {
        Ok(Manifests { cluster: load_dir(dir, Default::default())? })
    }

    /// YAML documents; `name` stands for the file in errors.
    pub fn from_text(name: &str, text: &str) -> Result<Manifests, LoadError> {
        Manifests::from_texts(&[(name, text)])
    }

    pub fn from_texts(files: &[(&str, &str)]) -> Result<Manifests, LoadError> {
        let mut m = Manifests::default();
        for (name, text) in files {
            load_text(Path::new(name), text, &mut m.cluster)?;
        }
        Ok(m)
    }

    /// Adds the documents of `text` to these.
    pub fn add(mut self, name: &str, text: &str) -> Result<Manifests, LoadError> {
        load_text(Path::new(name), text, &mut self.cluster)?;
        Ok(self)
    }
}
