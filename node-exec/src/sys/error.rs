//! What can go wrong entering a namespace or talking netlink; callers convert it into their own
//! error, naming the object they were working on.

use std::io;
use std::path::PathBuf;

use super::netlink::reason;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening network namespace {}: {source}", path.display())]
    OpenNetns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("entering network namespace {}: {source}", path.display())]
    EnterNetns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Spawning the thread that works inside a namespace, or that thread failing.
    #[error("{what}: {source}")]
    Thread {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// Opening, binding or configuring a netlink socket.
    #[error("netlink socket ({op}): {source}")]
    Socket {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("sending a netlink request: {0}")]
    Send(#[source] io::Error),
    /// Waiting for or reading the kernel's answer (a timeout, a truncated datagram, a dump
    /// interrupted too often).
    #[error("receiving a netlink answer: {0}")]
    Receive(#[source] io::Error),
    /// The kernel refused a request: its errno (positive) and extended-ack text.
    #[error("the kernel refused the request: {}", reason(*errno, message.as_deref()))]
    Kernel { errno: i32, message: Option<String> },
}

impl Error {
    /// The kernel's errno when it refused the request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}
