//! Deleting stale conntrack entries natively, over ctnetlink (NETLINK_NETFILTER, subsystem
//! NFNL_SUBSYS_CTNETLINK); the `conntrack` CLI is never run.
//!
//! When a published port's DNAT target moves, an established UDP flow keeps its old translation
//! forever: every datagram refreshes the entry. Deleting the entry makes the next datagram go
//! through the NAT rules again, as kube-proxy does. Likewise a flow the CNI masqueraded before
//! its pod's request claim came keeps the rewritten client address until its entry goes.
//!
//! `policy` says which flows a change leaves stale, from the sets the state flags; `codec`
//! reads and writes ctnetlink's messages. One dump of the IPv4 table selects the entries; they
//! are deleted one by one after the dump (deleting while dumping would disturb the dump), each
//! by its original tuple, zone and id.

mod codec;
mod policy;

use std::path::Path;

pub use policy::{StaleFlows, StalePath, stale_udp};

use crate::netfilter::nfnetlink::{self, NFGENMSG_LEN};
use crate::sys::{self, netlink, netns};

/// Everything that can go wrong deleting conntrack entries.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// The namespace file could not be opened (it is gone, or never was).
    #[error(transparent)]
    OpenNetns(sys::Error),
    /// Entering the namespace, or the thread working there, failed.
    #[error(transparent)]
    Netns(sys::Error),
    /// The ctnetlink socket could not be opened, or the request sent or answered.
    #[error("conntrack {what}: {source}")]
    Netlink {
        what: &'static str,
        #[source]
        source: sys::Error,
    },
    /// The kernel refused a request; `reason` is its errno text (and extended-ack message).
    #[error("the kernel refused the conntrack {what}: {reason} (errno {errno})")]
    Kernel { what: &'static str, errno: i32, reason: String },
}

impl ConntrackError {
    /// `e`, met while doing `what` (the dump or a delete).
    fn of(what: &'static str, e: sys::Error) -> Self {
        match e {
            sys::Error::OpenNetns { .. } => ConntrackError::OpenNetns(e),
            sys::Error::EnterNetns { .. } | sys::Error::Thread { .. } => ConntrackError::Netns(e),
            sys::Error::Kernel { errno, message } => {
                ConntrackError::Kernel { what, errno, reason: netlink::reason(errno, message.as_deref()) }
            }
            source => ConntrackError::Netlink { what, source },
        }
    }
}

impl From<sys::Error> for ConntrackError {
    fn from(e: sys::Error) -> Self {
        ConntrackError::of("request", e)
    }
}

/// Deletes IPv4 conntrack entries matching any of `flows` in the network namespace `netns`
/// (None: this thread's namespace). Returns how many were deleted; entries that vanish between
/// the dump and their delete are not counted and are no error.
pub fn delete_stale(netns: Option<&Path>, flows: &[StaleFlows]) -> Result<usize, ConntrackError> {
    if flows.is_empty() {
        return Ok(0);
    }
    netns::within(netns, || delete_here(flows))
}

/// [`delete_stale`] in the calling thread's namespace.
fn delete_here(flows: &[StaleFlows]) -> Result<usize, ConntrackError> {
    let mut sock = nfnetlink::socket().map_err(|e| ConntrackError::of("socket", e))?;
    // Only the selected entries are kept: a table can hold millions.
    let stale = sock
        .dump(codec::dump_request(), Vec::new, |out, payload| {
            let entry = payload.get(NFGENMSG_LEN..).and_then(codec::parse_entry);
            out.extend(entry.filter(|e| flows.iter().any(|f| f.selects(e))));
        })
        .map_err(|e| ConntrackError::of("dump", e))?;
    let mut deleted = 0;
    for e in &stale {
        match sock.ack(codec::delete_request(&codec::delete_attrs(e))) {
            Ok(()) => deleted += 1,
            Err(sys::Error::Kernel { errno: libc::ENOENT, .. }) => {}
            Err(e) => return Err(ConntrackError::of("delete", e)),
        }
    }
    Ok(deleted)
}
