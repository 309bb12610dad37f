//! Noticing outside changes to nf_tables: a NETLINK_NETFILTER socket subscribed to the
//! NFNLGRP_NFTABLES multicast group inside a namespace. The kernel announces every committed
//! change of any table there (ours included); a notification only says "something changed":
//! the caller re-reads and re-diffs.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

use super::NftError;
use crate::netfilter::nfnetlink::NFNLGRP_NFTABLES;
use crate::sys::netlink::{Socket, consts::NETLINK_NETFILTER};
use crate::sys::{self, netns};

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
    let (tx, events) = mpsc::unbounded_channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    // The socket joins the namespace of the thread that creates it; that thread never leaves
    // it and ends with the subscription.
    netns::spawn(netns, "kuport-nftwatch", listen, move |sock| forward(&sock, &tx, &stopped))?;
    Ok(Subscription { events, stop })
}

/// A netfilter socket bound to NFNLGRP_NFTABLES in the calling thread's namespace.
fn listen() -> Result<Socket, NftError> {
    let sock = Socket::open(NETLINK_NETFILTER)?;
    sock.join_group(NFNLGRP_NFTABLES)?;
    // Best effort: an overrun only costs an ENOBUFS, which is reported as a change too.
    sock.set_recv_buffer(RCVBUF_BYTES);
    Ok(sock)
}

/// Forwards one notification per datagram until the subscription is dropped.
fn forward(sock: &Socket, tx: &mpsc::UnboundedSender<()>, stop: &AtomicBool) {
    let mut buf = vec![0u8; RECV_CHUNK];
    while !stop.load(Ordering::Relaxed) {
        match sock.recv(&mut buf, STOP_POLL_MS) {
            Ok(None) => continue,
            Ok(Some(_)) => {}
            // Events were lost: that too means "look again".
            Err(sys::Error::Receive(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
            Err(_) => return,
        }
        if tx.send(()).is_err() {
            return;
        }
    }
}
