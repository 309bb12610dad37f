//! The link, address, route, rule and sysctl part of a state applied alone: the executor's
//! steps for those kinds ([`crate::executor`]), without its nftables step.

use std::{fmt, path::Path};

use kuport_proto::v1::NetnsState;

use super::{error::ApplyError, model::Desired};

/// What one apply wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Netlink write requests and sysctl writes sent, refused ones included.
    pub writes: usize,
    /// The writes that succeeded, in order: `add route default via ... table 201`.
    pub actions: Vec<String>,
}

impl fmt::Display for ApplyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} write(s)", self.writes)?;
        for a in &self.actions {
            write!(f, "\n  {a}")?;
        }
        Ok(())
    }
}

/// Applies the link/address/route/rule/sysctl part of `state` to the namespace `netns` (None: the
/// caller's), make before break, with as few writes as possible: a state that already holds costs
/// only the dumps. Blocks the calling thread; the work runs on a thread of its own inside the
/// namespace.
pub fn apply(netns: Option<&Path>, state: &NetnsState) -> Result<ApplyReport, ApplyError> {
    let desired =
        Desired::from_proto(state).map_err(|e| ApplyError { report: ApplyReport::default(), errors: vec![e] })?;
    crate::executor::steps::apply_objects(netns, &desired)
}
