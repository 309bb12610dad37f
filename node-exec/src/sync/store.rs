//! The last applied state on disk, so a restarted executor keeps (and repairs) it before the
//! controller is reachable again.

use std::path::{Path, PathBuf};

use kuport_proto::v1::DesiredState;
use prost::Message;

const FILE: &str = "applied.pb";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a stored state: {source}")]
    Decode { path: PathBuf, source: prost::DecodeError },
}

/// Reads the stored state from `dir`; None when there is none.
pub fn load(dir: &Path) -> Result<Option<DesiredState>, StoreError> {
    let path = dir.join(FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            DesiredState::decode(bytes.as_slice()).map(Some).map_err(|source| StoreError::Decode { path, source })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StoreError::Io { path, source }),
    }
}

/// Replaces the stored state atomically (write, fsync, rename).
pub fn save(dir: &Path, state: &DesiredState) -> Result<(), StoreError> {
    save_encoded(dir, &state.encode_to_vec())
}

/// [`save`] for a state already encoded (the caller encodes before handing the state away).
pub fn save_encoded(dir: &Path, encoded: &[u8]) -> Result<(), StoreError> {
    use std::io::Write as _;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StoreError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(encoded).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    let path = dir.join(FILE);
    std::fs::rename(&tmp, &path).map_err(io(&path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_and_loads() {
        let dir = std::env::temp_dir().join(format!("kuport-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(load(&dir).expect("empty dir").is_none());
        let s = DesiredState { term: 7, sequence: 3, version: "abc".into(), state: None };
        save(&dir, &s).expect("save");
        assert_eq!(load(&dir).expect("load"), Some(s));
        std::fs::write(dir.join(FILE), b"\xff\xff").expect("write junk");
        assert!(matches!(load(&dir), Err(StoreError::Decode { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
