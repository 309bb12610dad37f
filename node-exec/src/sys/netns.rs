//! Network namespaces: opening one by its file, entering it on the calling thread, and running
//! work inside one.
//!
//! setns(2) moves only the calling thread, and a netlink socket belongs to the namespace of the
//! thread that creates it. So work for another namespace runs on a fresh thread that enters it
//! and ends with the work (or, for a watcher, lives as long as it listens): no other thread ever
//! changes namespace, and none goes back to a pool in the wrong one. The caller's own namespace
//! is None, or an empty path (the host entry of a node state).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::Error;

/// The name of the threads that work inside a namespace.
const THREAD_NAME: &str = "kuport-netns";

/// An open namespace file (such as /var/run/netns/NAME).
#[derive(Debug)]
pub struct Netns {
    file: File,
    path: PathBuf,
}

impl Netns {
    pub fn open(path: &Path) -> Result<Self, Error> {
        match File::open(path) {
            Ok(file) => Ok(Self { file, path: path.to_path_buf() }),
            Err(source) => Err(Error::OpenNetns { path: path.to_path_buf(), source }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the calling thread (only it) into this namespace.
    pub fn enter(&self) -> Result<(), Error> {
        // SAFETY: setns on a valid, open namespace fd changes only this thread's namespace.
        if unsafe { libc::setns(self.file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(Error::EnterNetns { path: self.path.clone(), source: io::Error::last_os_error() });
        }
        Ok(())
    }

    /// Makes `cmd` run inside this namespace: its child enters it between fork and exec, so no
    /// thread of the caller moves (and no `ip netns exec` is run or timed).
    pub fn command(&self, cmd: &mut Command) -> Result<(), Error> {
        let fd: OwnedFd =
            self.file.try_clone().map_err(|source| Error::OpenNetns { path: self.path.clone(), source })?.into();
        // SAFETY: the hook only calls setns, which is async-signal-safe, on an fd the hook owns
        // (it lives as long as `cmd`, so it is open in the child until exec).
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(())
    }
}

/// Opens `netns`; None for the caller's namespace (None or an empty path).
pub fn open(netns: Option<&Path>) -> Result<Option<Netns>, Error> {
    netns.filter(|p| !p.as_os_str().is_empty()).map(Netns::open).transpose()
}

/// Runs `work` on a fresh thread inside `netns` (None: the caller's namespace) and returns its
/// result. The thread ends with the work; the calling thread never changes namespace, and
/// `work` may build a runtime of its own.
pub fn run<T, E, F>(netns: Option<&Path>, work: F) -> Result<T, E>
where
    T: Send,
    E: From<Error> + Send,
    F: FnOnce() -> Result<T, E> + Send,
{
    let target = open(netns)?;
    std::thread::scope(|s| {
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn_scoped(s, move || {
                if let Some(ns) = &target {
                    ns.enter()?;
                }
                work()
            })
            .map_err(|source| Error::Thread { what: "spawning a namespace thread", source })?;
        thread.join().map_err(|_| Error::Thread { what: "namespace thread", source: io::Error::other("panicked") })?
    })
}

/// Runs `work` inside `netns`: on the calling thread for the caller's own namespace (no thread
/// to spawn), else on a fresh thread like [`run`]. For work that makes no runtime and leaves
/// nothing behind but what it returns (a socket stays in the namespace it was made in).
pub fn within<T, E, F>(netns: Option<&Path>, work: F) -> Result<T, E>
where
    T: Send,
    E: From<Error> + Send,
    F: FnOnce() -> Result<T, E> + Send,
{
    match netns.filter(|p| !p.as_os_str().is_empty()) {
        None => work(),
        Some(path) => run(Some(path), work),
    }
}

/// Starts a long-lived thread `name` inside `netns` (None: the caller's namespace): `setup`
/// runs there first, and this returns its outcome once it is known (so a watcher listens before
/// this returns); then `serve` runs with what `setup` made, until it returns.
pub fn spawn<S, E, F, G>(netns: Option<&Path>, name: &str, setup: F, serve: G) -> Result<(), E>
where
    E: From<Error> + Send + 'static,
    F: FnOnce() -> Result<S, E> + Send + 'static,
    G: FnOnce(S) + Send + 'static,
{
    let target = open(netns)?;
    let (ready_tx, ready) = std::sync::mpsc::channel::<Result<(), E>>();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let made = match &target {
                Some(ns) => ns.enter().map_err(E::from).and_then(|()| setup()),
                None => setup(),
            };
            match made {
                Ok(state) => {
                    let _ = ready_tx.send(Ok(()));
                    serve(state);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|source| Error::Thread { what: "spawning a namespace thread", source })?;
    match ready.recv() {
        Ok(outcome) => outcome,
        Err(_) => {
            Err(Error::Thread { what: "namespace thread", source: io::Error::other("ended before it was ready") }
                .into())
        }
    }
}
