//! A raw netlink socket of any family (NETLINK_NETFILTER, NETLINK_GENERIC, ...) in the calling
//! thread's namespace: bound for requests or to multicast groups, sending, receiving with a
//! timeout, dumps and acked requests. Families build their messages with [`message::put`] and
//! [`attr::AttrWriter`] and read answers with [`message::split`], [`attr::parse`] and
//! [`message::Ack`].

pub mod attr;
pub mod consts;
pub mod message;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::Error;
use consts::{
    NETLINK_ADD_MEMBERSHIP, NETLINK_CAP_ACK, NETLINK_EXT_ACK, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
    NLMSG_DONE, NLMSG_ERROR, SOL_NETLINK,
};
pub use message::{Ack, Header, reason};

/// Receive buffer of requests: a dump datagram is at most a few pages.
const RECV_CHUNK: usize = 256 * 1024;
/// How long to wait for the kernel's next answer to a request.
pub const ANSWER_TIMEOUT_MS: i32 = 5_000;
/// How often a dump the kernel flags interrupted is restarted before giving up.
const DUMP_ATTEMPTS: usize = 5;

/// One request: its type and flags (NLM_F_REQUEST is added), the family's fixed header and
/// the attributes.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub ty: u16,
    pub flags: u16,
    pub family_header: &'a [u8],
    pub attrs: &'a [u8],
}

/// A netlink socket, with the sequence numbers of its requests.
#[derive(Debug)]
pub struct Socket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

fn socket_err(op: &'static str) -> Error {
    Error::Socket { op, source: io::Error::last_os_error() }
}

impl Socket {
    /// Opens a socket of netlink `protocol` in the calling thread's namespace, bound with a port
    /// id the kernel assigns.
    pub fn open(protocol: i32) -> Result<Self, Error> {
        // SAFETY: plain socket(2); the fd is owned right away.
        let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
        if raw < 0 {
            return Err(socket_err("socket"));
        }
        // SAFETY: raw is a fresh, valid fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a zeroed sockaddr_nl is valid; nl_pid 0 lets the kernel assign the port id.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: sa is a valid sockaddr_nl of the given length.
        let bound = unsafe {
            libc::bind(
                raw,
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if bound < 0 {
            return Err(socket_err("bind"));
        }
        Ok(Self { fd, seq: 0, buf: Vec::new() })
    }

    fn set_option<T>(&self, level: i32, name: i32, value: T) -> bool {
        // SAFETY: value lives for the call and the length is its type's.
        unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (&value as *const T).cast(),
                std::mem::size_of::<T>() as libc::socklen_t,
            ) == 0
        }
    }

    /// Joins multicast `group` (a watcher's socket).
    pub fn join_group(&self, group: u32) -> Result<(), Error> {
        if !self.set_option(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group) {
            return Err(socket_err("joining a multicast group"));
        }
        Ok(())
    }

    /// Small acks that name the failing request by its sequence number (NETLINK_CAP_ACK), with
    /// the kernel's reason text (NETLINK_EXT_ACK). Best effort: a kernel without them still acks.
    pub fn ask_extended_acks(&self) {
        self.set_option(SOL_NETLINK, NETLINK_CAP_ACK, 1i32);
        self.set_option(SOL_NETLINK, NETLINK_EXT_ACK, 1i32);
    }

    /// Asks for a receive buffer of `bytes`: beyond the system limit when the process may
    /// (CAP_NET_ADMIN), else up to it. Best effort; false when neither was granted.
    pub fn set_recv_buffer(&self, bytes: i32) -> bool {
        self.set_option(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, bytes)
            || self.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, bytes)
    }

    /// Like [`Socket::set_recv_buffer`], for sending (a whole batch is one sendmsg).
    pub fn set_send_buffer(&self, bytes: i32) -> bool {
        self.set_option(libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, bytes)
            || self.set_option(libc::SOL_SOCKET, libc::SO_SNDBUF, bytes)
    }

    /// The sequence number of the next request (never 0, which notifications carry).
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    /// Sends one datagram (one or more messages) to the kernel.
    pub fn send(&self, buf: &[u8]) -> Result<(), Error> {
        // SAFETY: buf is valid for its length; an unconnected netlink socket sends to the kernel.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(Error::Send(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Receives one datagram into `buf`: its length, or None when nothing came within
    /// `timeout_ms`. A datagram longer than `buf` is an error (its end would be lost); so is an
    /// overrun (ENOBUFS: the kernel dropped messages for this socket).
    pub fn recv(&self, buf: &mut [u8], timeout_ms: i32) -> Result<Option<usize>, Error> {
        loop {
            let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::Receive(e));
            }
            if r == 0 {
                return Ok(None);
            }
            // SAFETY: buf is valid and writable for its length. MSG_TRUNC returns the real length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_TRUNC | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) {
                    continue;
                }
                return Err(Error::Receive(e));
            }
            let n = n as usize;
            if n > buf.len() {
                return Err(Error::Receive(io::Error::other(format!("datagram of {n} bytes truncated"))));
            }
            return Ok(Some(n));
        }
    }

    /// Discards every datagram already queued.
    pub fn drain(&self, buf: &mut [u8]) {
        while let Ok(Some(_)) = self.recv(buf, 0) {}
    }

    /// Like [`Socket::recv`] into the socket's own buffer, waiting [`ANSWER_TIMEOUT_MS`] at most.
    fn answer(&mut self) -> Result<usize, Error> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(RECV_CHUNK, 0);
        let got = self.recv(&mut buf, ANSWER_TIMEOUT_MS);
        self.buf = buf;
        got?.ok_or_else(|| Error::Receive(io::Error::from(io::ErrorKind::TimedOut)))
    }

    /// Sends `req` with a fresh sequence number; returns it.
    fn send_request(&mut self, req: &Request<'_>, flags: u16) -> Result<u32, Error> {
        let seq = self.next_seq();
        let mut msg = Vec::new();
        message::put(&mut msg, req.ty, NLM_F_REQUEST | flags | req.flags, seq, req.family_header, req.attrs);
        self.send(&msg)?;
        Ok(seq)
    }

    /// A dump (`req.flags` with NLM_F_DUMP) or a single get (without it: acked, the answer
    /// comes before the ack). Folds the payload (after nlmsghdr) of every answer into a fresh
    /// `init()`, restarting when the kernel flags the dump interrupted. A refusal is
    /// [`Error::Kernel`].
    pub fn dump<A>(
        &mut self,
        req: Request<'_>,
        init: impl Fn() -> A,
        mut each: impl FnMut(&mut A, &[u8]),
    ) -> Result<A, Error> {
        let dump = req.flags & NLM_F_DUMP == NLM_F_DUMP;
        'attempt: for _ in 0..DUMP_ATTEMPTS {
            let seq = self.send_request(&req, if dump { 0 } else { NLM_F_ACK })?;
            let mut acc = init();
            let mut interrupted = false;
            loop {
                let n = self.answer()?;
                for (hdr, payload) in message::split(&self.buf[..n]) {
                    if hdr.seq != seq {
                        continue;
                    }
                    interrupted |= hdr.flags & NLM_F_DUMP_INTR != 0;
                    match hdr.ty {
                        NLMSG_DONE if interrupted => continue 'attempt,
                        NLMSG_DONE => return Ok(acc),
                        NLMSG_ERROR => {
                            let ack = Ack::parse(&hdr, payload).ok_or_else(short_ack)?;
                            if ack.errno != 0 {
                                return Err(Error::Kernel { errno: ack.errno, message: ack.message });
                            }
                            if !dump {
                                return Ok(acc);
                            }
                        }
                        _ => each(&mut acc, payload),
                    }
                }
            }
        }
        Err(Error::Receive(io::Error::other(format!("dump interrupted {DUMP_ATTEMPTS} times"))))
    }

    /// Sends `req` asking for an ack and waits for it; a refusal is [`Error::Kernel`].
    pub fn ack(&mut self, req: Request<'_>) -> Result<(), Error> {
        let seq = self.send_request(&req, NLM_F_ACK)?;
        loop {
            let n = self.answer()?;
            for (hdr, payload) in message::split(&self.buf[..n]) {
                if hdr.seq != seq || hdr.ty != NLMSG_ERROR {
                    continue;
                }
                let ack = Ack::parse(&hdr, payload).ok_or_else(short_ack)?;
                if ack.errno != 0 {
                    return Err(Error::Kernel { errno: ack.errno, message: ack.message });
                }
                return Ok(());
            }
        }
    }
}

fn short_ack() -> Error {
    Error::Receive(io::Error::other("short NLMSG_ERROR"))
}
