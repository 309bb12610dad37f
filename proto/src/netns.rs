//! Naming a network namespace of a node state the same way everywhere: in the canonical text,
//! in the executor's keepers and refusals, in kuportctl.

use crate::v1::netns_ref::Kind;
use crate::v1::{NetnsRef, NetnsState, PodRef};

/// The host's namespace.
pub fn host() -> Option<NetnsRef> {
    None
}

/// A namespace file (the lab's simulated nodes and pods).
pub fn path(path: impl Into<String>) -> Option<NetnsRef> {
    Some(NetnsRef { kind: Some(Kind::Path(path.into())) })
}

/// A pod's sandbox namespace.
pub fn pod(pod: PodRef) -> Option<NetnsRef> {
    Some(NetnsRef { kind: Some(Kind::Pod(pod)) })
}

/// `host`, the path (`/var/run/netns/x`), or `pod ns/name uid`.
pub fn describe(target: Option<&NetnsRef>) -> String {
    match target.and_then(|t| t.kind.as_ref()) {
        None => "host".to_string(),
        Some(Kind::Path(p)) if p.is_empty() => "host".to_string(),
        Some(Kind::Path(p)) => p.clone(),
        Some(Kind::Pod(p)) => format!("pod {}/{} {}", p.namespace, p.name, p.uid),
    }
}

impl NetnsState {
    /// [`describe`] of this namespace's target.
    pub fn describe(&self) -> String {
        describe(self.target.as_ref())
    }

    /// Whether this is the host's namespace (no target, or an empty path).
    pub fn is_host(&self) -> bool {
        match self.target.as_ref().and_then(|t| t.kind.as_ref()) {
            None => true,
            Some(Kind::Path(p)) => p.is_empty(),
            Some(Kind::Pod(_)) => false,
        }
    }
}
