//! Noticing outside changes to nf_tables: a NETLINK_NETFILTER socket subscribed to the
//! NFNLGRP_NFTABLES multicast group inside a namespace. The kernel announces every committed
//! change of any table there (ours included); a notification only says "something changed":
//! the caller re-reads and re-diffs.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

use super::NftError;

/// NETLINK_NETFILTER, the netlink protocol of nfnetlink.
const NETLINK_NETFILTER: i32 = libc::NETLINK_NETFILTER;
/// NFNLGRP_NFTABLES: the group nf_tables announces its changes to (linux/netfilter/nfnetlink.h).
const NFNLGRP_NFTABLES: u32 = 7;
/// How often the listening thread checks whether its subscription was dropped.
const STOP_POLL_MS: i32 = 200;
/// Receive buffer: a rebuild of a large table announces every element.
const RCVBUF_BYTES: i32 = 4 << 20;
/// One datagram; its content is not parsed.
const RECV_CHUNK: usize = 64 * 1024;

/// A live subscription; dropping it stops its thread (within [`STOP_POLL_MS`]).
#[derive(Debug)]
pub struct Subscription {
    events: mpsc::UnboundedReceiver<()>,
    stop: Arc<AtomicBool>,
}

impl Subscription {
    /// The next change; None once the subscription has failed.
    pub async fn recv(&mut self) -> Option<()> {
        self.events.recv().await
    }

    /// Discards every change that already arrived; returns how many there were.
    pub fn drain(&mut self) -> usize {
        let mut n = 0;
        while self.events.try_recv().is_ok() {
            n += 1;
        }
        n
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Subscribes to nf_tables changes in `netns` (None: the caller's namespace). Returns once the
/// socket listens, so every change committed after this returns is reported.
pub fn subscribe(netns: Option<&Path>) -> Result<Subscription, NftError> {
    let target = match netns.filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => Some((File::open(p).map_err(|source| NftError::Netns { path: p.to_path_buf(), source })?, p)),
        None => None,
    }
    .map(|(f, p)| (f, p.to_path_buf()));
    let (tx, events) = mpsc::unbounded_channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let (ready_tx, ready) = std::sync::mpsc::channel::<Result<(), NftError>>();
    std::thread::Builder::new()
        .name("kuport-nftwatch".into())
        .spawn(move || {
            // The socket joins the namespace of the thread that creates it; this thread never
            // leaves it and ends with the subscription.
            let sock = enter(target).and_then(|()| listen());
            let sock = match sock {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            forward(&sock, &tx, &stopped);
        })
        .map_err(|source| NftError::Io { op: "spawning the nftables watch thread", source })?;
    match ready.recv() {
        Ok(Ok(())) => Ok(Subscription { events, stop }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(NftError::Io { op: "nftables watch thread", source: io::Error::other("ended before listening") }),
    }
}

fn enter(target: Option<(File, PathBuf)>) -> Result<(), NftError> {
    let Some((file, path)) = target else { return Ok(()) };
    // SAFETY: setns on this thread only, with a valid namespace fd.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(NftError::Netns { path, source: io::Error::last_os_error() });
    }
    Ok(())
}

fn io_err(op: &'static str) -> NftError {
    NftError::Io { op, source: io::Error::last_os_error() }
}

/// A netfilter socket bound to NFNLGRP_NFTABLES in the calling thread's namespace.
fn listen() -> Result<OwnedFd, NftError> {
    // SAFETY: plain socket(2); the fd is owned right away.
    let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER) };
    if raw < 0 {
        return Err(io_err("socket(NETLINK_NETFILTER)"));
    }
    // SAFETY: raw is a fresh, valid fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: zeroed sockaddr_nl is valid; nl_pid 0 lets the kernel assign the port id.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: sa is a valid sockaddr_nl of the given length.
    let bound = unsafe {
        libc::bind(raw, (&sa as *const libc::sockaddr_nl).cast(), std::mem::size_of::<libc::sockaddr_nl>() as u32)
    };
    if bound < 0 {
        return Err(io_err("bind(netlink)"));
    }
    let group = NFNLGRP_NFTABLES;
    // SAFETY: group lives for the call; the length matches its type.
    let joined = unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_NETLINK,
            libc::NETLINK_ADD_MEMBERSHIP,
            (&group as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if joined < 0 {
        return Err(io_err("joining NFNLGRP_NFTABLES"));
    }
    // Best effort: an overrun only costs an ENOBUFS, which is reported as a change too.
    // SAFETY: v lives for the call; the length matches its type.
    unsafe {
        let v = RCVBUF_BYTES;
        let len = std::mem::size_of::<i32>() as libc::socklen_t;
        if libc::setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, (&v as *const i32).cast(), len) != 0 {
            libc::setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, (&v as *const i32).cast(), len);
        }
    }
    Ok(fd)
}

/// Forwards one notification per datagram until the subscription is dropped.
fn forward(fd: &OwnedFd, tx: &mpsc::UnboundedSender<()>, stop: &AtomicBool) {
    let mut buf = vec![0u8; RECV_CHUNK];
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, STOP_POLL_MS) };
        if r < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if r == 0 {
            continue;
        }
        // SAFETY: buf is valid and writable for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            match io::Error::last_os_error().raw_os_error() {
                // Events were lost: that too means "look again".
                Some(libc::ENOBUFS) => {}
                Some(libc::EAGAIN) | Some(libc::EINTR) => continue,
                _ => return,
            }
        }
        if tx.send(()).is_err() {
            return;
        }
    }
}
