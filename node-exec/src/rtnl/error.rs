//! Typed errors. Every error that concerns a kernel object names it the way `ip` would.

use std::{io, path::PathBuf};

use rtnetlink::packet_core::ErrorMessage;

use super::apply::ApplyReport;

/// What went wrong reading or writing one namespace's links, addresses, routes, rules or sysctls.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The desired state cannot be applied as written (nothing was written because of it).
    #[error("invalid {object}: {reason}")]
    Invalid { object: String, reason: String },

    /// The network namespace could not be entered.
    #[error("network namespace {path}: {source}", path = path.display())]
    Netns { path: PathBuf, source: io::Error },

    /// The kernel refused a request.
    #[error("{op} {object}: {reason}")]
    Kernel {
        op: Op,
        object: String,
        /// errno (positive), 0 when the failure was not an errno.
        errno: i32,
        /// The errno text and, when the kernel gave one, its extended-ack message.
        reason: String,
    },

    /// An object depends on a link that does not exist (typically because creating it failed).
    #[error("{object}: device {dev} does not exist")]
    NoDevice { object: String, dev: String },

    /// Reading or writing /proc/sys failed.
    #[error("sysctl {key}: {source}")]
    Sysctl { key: String, source: io::Error },

    /// Local plumbing failed: a socket, a runtime or the namespace thread.
    #[error("{what}: {source}")]
    Io { what: &'static str, source: io::Error },
}

/// The kind of request a kernel refusal answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Dump,
    Add,
    Change,
    Delete,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Dump => "dump",
            Op::Add => "add",
            Op::Change => "change",
            Op::Delete => "delete",
        })
    }
}

impl Error {
    /// The errno of a kernel refusal, if that is what this is.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Kernel { errno, .. } if *errno != 0 => Some(*errno),
            _ => None,
        }
    }

    pub(crate) fn kernel(op: Op, object: impl ToString, err: rtnetlink::Error) -> Self {
        let (errno, reason) = match &err {
            rtnetlink::Error::NetlinkError(msg) => {
                let errno = msg.raw_code().abs();
                let mut reason = io::Error::from_raw_os_error(errno).to_string();
                if let Some(ext) = extack_message(msg) {
                    reason = format!("{reason}: {ext}");
                }
                (errno, reason)
            }
            other => (0, other.to_string()),
        };
        Error::Kernel { op, object: object.to_string(), errno, reason }
    }
}

/// The failures of one apply, with what it did manage to write.
#[derive(Debug, thiserror::Error)]
#[error("{} failure(s) applying network state after {} write(s): {}", errors.len(), report.writes, join(errors))]
pub struct ApplyError {
    /// What was written before and after the failures.
    pub report: ApplyReport,
    pub errors: Vec<Error>,
}

fn join(errors: &[Error]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// NLMSGHDR's length: the echoed request header that precedes the extended-ack attributes.
const NLMSG_HDR_LEN: usize = 16;
/// NLMSGERR_ATTR_MSG: the kernel's human-readable reason.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// The kernel's extended-ack text ("Nexthop has invalid gateway"), if it sent one. The socket sets
/// NETLINK_CAP_ACK, so only the request's header is echoed and the attributes follow it.
fn extack_message(msg: &ErrorMessage) -> Option<String> {
    let buf = msg.header.get(NLMSG_HDR_LEN..)?;
    let mut at = 0;
    while at + 4 <= buf.len() {
        let len = usize::from(u16::from_ne_bytes([buf[at], buf[at + 1]]));
        let kind = u16::from_ne_bytes([buf[at + 2], buf[at + 3]]) & 0x3fff;
        if len < 4 || at + len > buf.len() {
            return None;
        }
        if kind == NLMSGERR_ATTR_MSG {
            let text = &buf[at + 4..at + len];
            let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
            return Some(String::from_utf8_lossy(&text[..end]).into_owned());
        }
        at += (len + 3) & !3;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_extended_ack_text() {
        let mut header = vec![0u8; NLMSG_HDR_LEN];
        let text = b"Nexthop has invalid gateway\0";
        let len = 4 + text.len();
        header.extend_from_slice(&(len as u16).to_ne_bytes());
        header.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        header.extend_from_slice(text);
        header.resize(NLMSG_HDR_LEN + ((len + 3) & !3), 0);
        let mut msg = ErrorMessage::default();
        msg.code = std::num::NonZeroI32::new(-libc::ENETUNREACH);
        msg.header = header;
        let err = Error::kernel(
            Op::Add,
            "route default via 10.200.0.1 dev kup-1 table 201",
            rtnetlink::Error::NetlinkError(msg),
        );
        let text = err.to_string();
        assert!(text.starts_with("add route default via 10.200.0.1 dev kup-1 table 201: "), "{text}");
        assert!(text.ends_with(": Nexthop has invalid gateway"), "{text}");
        assert_eq!(err.errno(), Some(libc::ENETUNREACH));
    }

    #[test]
    fn tolerates_a_missing_or_truncated_extended_ack() {
        let mut msg = ErrorMessage::default();
        assert_eq!(extack_message(&msg), None);
        msg.header = vec![0; NLMSG_HDR_LEN + 3];
        assert_eq!(extack_message(&msg), None);
        msg.header = vec![0; NLMSG_HDR_LEN];
        msg.header.extend_from_slice(&[200, 0, 1, 0]);
        assert_eq!(extack_message(&msg), None);
    }
}
