//! The last applied state on disk, so a restarted executor keeps (and repairs) it before the
//! controller is reachable again. Always whole: a namespace the controller sent held (no content)
//! is stored as the executor keeps it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kuport_proto::v1::{DesiredState, NetnsState};
use prost::Message;
use prost::encoding::{self, WireType};

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

/// A state's stored form, taken before the state is handed to the executor (so it is not
/// copied). A state with namespaces sent held is encoded one namespace at a time, the held ones
/// filled in once applied from what the executor keeps; the bytes are those
/// [`Message::encode_to_vec`] gives for the whole state.
pub enum Pending {
    /// Nothing held: the state, encoded.
    Whole(Vec<u8>),
    Parts {
        /// The state's term, sequence and version.
        head: Vec<u8>,
        node: String,
        netns: Vec<Part>,
    },
}

pub enum Part {
    /// A namespace's field, encoded.
    Encoded(Vec<u8>),
    /// A namespace sent held: its target and version.
    Held(Box<NetnsState>),
}

/// `DesiredState.state`, `NodeState.node` and `NodeState.netns`.
const STATE_FIELD: u32 = 4;
const NODE_FIELD: u32 = 1;
const NETNS_FIELD: u32 = 2;

impl Pending {
    pub fn new(ds: &DesiredState) -> Self {
        let Some(state) = ds.state.as_ref().filter(|s| s.netns.iter().any(|ns| ns.held)) else {
            return Pending::Whole(ds.encode_to_vec());
        };
        let head = DesiredState { term: ds.term, sequence: ds.sequence, version: ds.version.clone(), state: None }
            .encode_to_vec();
        let netns = state
            .netns
            .iter()
            .map(|ns| {
                if ns.held {
                    let stub =
                        NetnsState { target: ns.target.clone(), version: ns.version.clone(), ..Default::default() };
                    return Part::Held(Box::new(stub));
                }
                let mut buf = Vec::new();
                encoding::message::encode(NETNS_FIELD, ns, &mut buf);
                Part::Encoded(buf)
            })
            .collect();
        Pending::Parts { head, node: state.node.clone(), netns }
    }

    /// The encoded state, each held namespace filled in by `kept`; None when one is not known.
    pub fn finish(self, kept: impl Fn(&NetnsState) -> Option<Arc<NetnsState>>) -> Option<Vec<u8>> {
        let (mut out, node, netns) = match self {
            Pending::Whole(bytes) => return Some(bytes),
            Pending::Parts { head, node, netns } => (head, node, netns),
        };
        let mut state = Vec::new();
        if !node.is_empty() {
            encoding::string::encode(NODE_FIELD, &node, &mut state);
        }
        for part in netns {
            match part {
                Part::Encoded(bytes) => state.extend_from_slice(&bytes),
                Part::Held(stub) => encoding::message::encode(NETNS_FIELD, &*kept(&stub)?, &mut state),
            }
        }
        encoding::encode_key(STATE_FIELD, WireType::LengthDelimited, &mut out);
        encoding::encode_varint(state.len() as u64, &mut out);
        out.extend_from_slice(&state);
        Some(out)
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

    #[test]
    fn a_pending_state_encodes_as_prost_does_with_held_namespaces_filled_in() {
        use kuport_proto::v1::{NodeState, Sysctl};
        let full = |path: &str, key: &str| NetnsState {
            target: kuport_proto::netns::path(path),
            version: format!("v-{path}"),
            sysctls: vec![Sysctl { key: key.into(), value: "1".into() }],
            ..Default::default()
        };
        let whole = DesiredState {
            term: 2,
            sequence: 9,
            version: "all".into(),
            state: Some(NodeState { node: "n".into(), netns: vec![full("", "a"), full("/x", "b")] }),
        };
        let bytes = whole.encode_to_vec();
        assert_eq!(Pending::new(&whole).finish(|_| None), Some(bytes.clone()));

        let mut sent = whole.clone();
        if let Some(s) = sent.state.as_mut() {
            s.netns[1] = NetnsState {
                target: kuport_proto::netns::path("/x"),
                version: "v-/x".into(),
                held: true,
                ..Default::default()
            };
        }
        let kept = Arc::new(full("/x", "b"));
        let filled = Pending::new(&sent).finish(|stub| (stub.version == kept.version).then(|| Arc::clone(&kept)));
        assert_eq!(filled, Some(bytes));
        assert_eq!(Pending::new(&sent).finish(|_| None), None, "a held namespace nobody keeps");
    }
}
