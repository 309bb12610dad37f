//! Running rtnetlink work inside a network namespace: [`crate::sys::netns`] with rtnl's error,
//! and the current-thread runtime each namespace thread drives its connection with.

use std::path::Path;

use super::error::Error;
use crate::sys;

impl From<sys::Error> for Error {
    fn from(e: sys::Error) -> Self {
        match e {
            sys::Error::OpenNetns { path, source } | sys::Error::EnterNetns { path, source } => {
                Error::Netns { path, source }
            }
            sys::Error::Thread { what, source } => Error::Io { what, source },
            other => Error::Io { what: "netlink", source: std::io::Error::other(other.to_string()) },
        }
    }
}

/// Runs `work` on a new thread inside `netns` (None: the caller's namespace) and returns its result.
pub(crate) fn run<T, F>(netns: Option<&Path>, work: F) -> Result<T, Error>
where
    T: Send,
    F: FnOnce() -> Result<T, Error> + Send,
{
    sys::netns::run(netns, work)
}

pub(crate) fn open(netns: Option<&Path>) -> Result<Option<sys::netns::Netns>, Error> {
    Ok(sys::netns::open(netns)?)
}

/// Moves the calling thread into `netns` (its error names the path it was opened from).
pub(crate) fn enter(netns: &sys::netns::Netns, _path: &Path) -> Result<(), Error> {
    Ok(netns.enter()?)
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Io { what: "building the netlink runtime", source })
}
