//! Running work inside a network namespace.
//!
//! A netlink socket belongs to the namespace of the thread that creates it, and setns() moves only
//! the calling thread. So each operation runs on a fresh thread that enters the namespace, builds
//! its own current-thread runtime and connection there, and ends with the operation: no other
//! thread ever changes namespace, and none is left behind in the target one.

use std::{fs::File, future::Future, io, os::fd::AsRawFd, path::Path};

use rtnetlink::{Handle, sys::AsyncSocket};

use super::error::Error;

/// Runs `work` on a new thread inside `netns` (None: the caller's namespace) and returns its result.
pub(crate) fn run<T, F>(netns: Option<&Path>, work: F) -> Result<T, Error>
where
    T: Send,
    F: FnOnce() -> Result<T, Error> + Send,
{
    let target = open(netns)?;
    std::thread::scope(|s| {
        let thread = std::thread::Builder::new()
            .name("kuport-netns".into())
            .spawn_scoped(s, move || {
                if let (Some(file), Some(path)) = (&target, netns) {
                    enter(file, path)?;
                }
                work()
            })
            .map_err(|source| Error::Io { what: "spawning the namespace thread", source })?;
        thread.join().map_err(|_| Error::Io { what: "namespace thread", source: io::Error::other("panicked") })?
    })
}

/// Like [`run`], with a netlink connection made inside the namespace.
pub(crate) fn run_netlink<T, F, Fut>(netns: Option<&Path>, work: F) -> Result<T, Error>
where
    T: Send,
    F: FnOnce(Handle) -> Fut + Send,
    Fut: Future<Output = Result<T, Error>>,
{
    run(netns, move || {
        let rt = runtime()?;
        rt.block_on(async move {
            let handle = connect()?;
            work(handle).await
        })
    })
}

pub(crate) fn open(netns: Option<&Path>) -> Result<Option<File>, Error> {
    netns.map(|path| File::open(path).map_err(|source| Error::Netns { path: path.to_path_buf(), source })).transpose()
}

/// Moves the calling thread into the namespace `file` refers to.
pub(crate) fn enter(file: &File, path: &Path) -> Result<(), Error> {
    // SAFETY: setns on a valid, open namespace fd only changes this thread's namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(Error::Netns { path: path.to_path_buf(), source: io::Error::last_os_error() });
    }
    Ok(())
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Io { what: "building the netlink runtime", source })
}

/// A request connection on the calling thread's namespace; must run inside a runtime.
fn connect() -> Result<Handle, Error> {
    let (mut conn, handle, _) =
        rtnetlink::new_connection().map_err(|source| Error::Io { what: "opening a netlink socket", source })?;
    let socket = conn.socket_mut().socket_ref();
    // Extended acks carry the kernel's reason text; CAP_ACK keeps the request out of the error.
    for set in [rtnetlink::sys::Socket::set_ext_ack, rtnetlink::sys::Socket::set_cap_ack] {
        set(socket, true).map_err(|source| Error::Io { what: "configuring the netlink socket", source })?;
    }
    tokio::spawn(conn);
    Ok(handle)
}
