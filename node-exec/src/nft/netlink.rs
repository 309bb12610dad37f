//! A raw NETLINK_NETFILTER socket: batches (one transaction each, acked per message) and dumps.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::NftError;
use super::attr::{align4, parse};
use super::consts::*;
use super::encode::Msg;

/// Receive buffer asked for: a 1,000-message batch gets 1,000 acks, each its own skb.
const RCVBUF_BYTES: i32 = 8 << 20;
/// Send buffer asked for: a whole batch is one sendmsg.
const SNDBUF_BYTES: i32 = 8 << 20;
/// Receive chunk size (a dump message is at most a few pages).
const RECV_CHUNK: usize = 256 * 1024;
/// How long to wait for acks the kernel has not queued yet.
const ACK_TIMEOUT_MS: i32 = 5_000;

/// The kernel's answer to one message of a batch.
#[derive(Debug)]
pub(crate) struct KernelError {
    pub(crate) object: String,
    pub(crate) errno: i32,
    pub(crate) message: Option<String>,
}

pub(crate) struct Socket {
    fd: OwnedFd,
    seq: u32,
}

fn io_err(op: &'static str) -> NftError {
    NftError::Io { op, source: io::Error::last_os_error() }
}

fn setsockopt(fd: i32, level: i32, name: i32, v: i32) -> bool {
    // SAFETY: v lives for the call; the length matches its type.
    unsafe {
        libc::setsockopt(fd, level, name, (&v as *const i32).cast(), std::mem::size_of::<i32>() as libc::socklen_t) == 0
    }
}

impl Socket {
    /// Opens a socket in the calling thread's network namespace.
    pub(crate) fn open() -> Result<Self, NftError> {
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
        if unsafe {
            libc::bind(raw, (&sa as *const libc::sockaddr_nl).cast(), std::mem::size_of::<libc::sockaddr_nl>() as u32)
        } < 0
        {
            return Err(io_err("bind(netlink)"));
        }
        // The FORCE variants need CAP_NET_ADMIN, which the executor has; fall back otherwise.
        if !setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RCVBUF_BYTES) {
            setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, RCVBUF_BYTES);
        }
        if !setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, SNDBUF_BYTES) {
            setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUF, SNDBUF_BYTES);
        }
        // Small acks that name the failing message by sequence number, with the kernel's text.
        setsockopt(raw, SOL_NETLINK, NETLINK_CAP_ACK, 1);
        setsockopt(raw, SOL_NETLINK, NETLINK_EXT_ACK, 1);
        Ok(Self { fd, seq: 1 })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    fn send(&self, buf: &[u8]) -> Result<(), NftError> {
        // SAFETY: buf is valid for its length; the socket is connected to the kernel (pid 0).
        let n = unsafe { libc::send(self.fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io_err("send(netlink)"));
        }
        Ok(())
    }

    /// One datagram, or None when nothing is queued within `timeout_ms`.
    fn recv(&self, buf: &mut [u8], timeout_ms: i32) -> Result<Option<usize>, NftError> {
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if r < 0 {
            return Err(io_err("poll(netlink)"));
        }
        if r == 0 {
            return Ok(None);
        }
        // SAFETY: buf is valid and writable for its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io_err("recv(netlink)"));
        }
        Ok(Some(n as usize))
    }

    /// Sends `msgs` as one transaction and waits for every ack. On any refusal the kernel
    /// aborts the whole batch; the errors name the objects it refused.
    pub(crate) fn batch(&mut self, msgs: &[Msg]) -> Result<(), Vec<KernelError>> {
        let mut buf = Vec::new();
        let mut seqs = Vec::with_capacity(msgs.len());
        let begin = self.next_seq();
        put_msg(&mut buf, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, begin, 0, NFNL_SUBSYS_NFTABLES, &[]);
        for m in msgs {
            let seq = self.next_seq();
            seqs.push(seq);
            put_msg(
                &mut buf,
                (NFNL_SUBSYS_NFTABLES << 8) | m.ty,
                NLM_F_REQUEST | NLM_F_ACK | m.flags,
                seq,
                m.family,
                0,
                &m.attrs,
            );
        }
        let end = self.next_seq();
        put_msg(&mut buf, NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, 0, NFNL_SUBSYS_NFTABLES, &[]);
        let local = |e: NftError| vec![KernelError { object: "batch".into(), errno: 0, message: Some(e.to_string()) }];
        self.send(&buf).map_err(local)?;

        let object_of = |seq: u32| -> String {
            seqs.iter().position(|s| *s == seq).map(|i| msgs[i].object.clone()).unwrap_or_else(|| "batch".to_string())
        };
        let mut acked = 0usize;
        let mut errors = Vec::new();
        let mut rbuf = vec![0u8; RECV_CHUNK];
        // nfnetlink handles the batch inside send(), so every ack is queued by now; the
        // timeout only guards against a kernel that stops early.
        while acked + errors.len() < msgs.len() {
            let n = match self.recv(&mut rbuf, if errors.is_empty() { ACK_TIMEOUT_MS } else { 0 }) {
                Ok(Some(n)) => n,
                Ok(None) if !errors.is_empty() => break,
                Ok(None) => {
                    return Err(vec![KernelError {
                        object: "batch".into(),
                        errno: libc::ETIMEDOUT,
                        message: Some("acks missing".into()),
                    }]);
                }
                Err(e) => return Err(local(e)),
            };
            for (hdr, payload) in split(&rbuf[..n]) {
                if hdr.ty != NLMSG_ERROR {
                    continue;
                }
                let Some((errno, seq, text)) = parse_error(&hdr, payload) else { continue };
                if errno == 0 {
                    acked += 1;
                } else {
                    errors.push(KernelError { object: object_of(seq), errno, message: text });
                }
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }

    /// A dump (or, with `dump` false, a single get). Returns (header, payload after nfgenmsg)
    /// pairs; ENOENT is an empty answer. Restarts when the kernel flags the dump interrupted.
    pub(crate) fn request(&mut self, ty: u16, family: u8, attrs: &[u8], dump: bool) -> Result<Vec<Vec<u8>>, NftError> {
        'retry: for _ in 0..5 {
            let seq = self.next_seq();
            let mut buf = Vec::new();
            let flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { NLM_F_ACK };
            put_msg(&mut buf, (NFNL_SUBSYS_NFTABLES << 8) | ty, flags, seq, family, 0, attrs);
            self.send(&buf)?;
            let mut out = Vec::new();
            let mut rbuf = vec![0u8; RECV_CHUNK];
            loop {
                let n = self
                    .recv(&mut rbuf, ACK_TIMEOUT_MS)?
                    .ok_or(NftError::Io { op: "netlink dump", source: io::Error::from(io::ErrorKind::TimedOut) })?;
                let mut done = false;
                for (hdr, payload) in split(&rbuf[..n]) {
                    if hdr.seq != seq {
                        continue;
                    }
                    if hdr.flags & NLM_F_DUMP_INTR != 0 {
                        self.drain();
                        continue 'retry;
                    }
                    match hdr.ty {
                        NLMSG_DONE => done = true,
                        NLMSG_ERROR => {
                            let (errno, _, text) = parse_error(&hdr, payload).unwrap_or((libc::EIO, 0, None));
                            if errno == 0 {
                                // The ack of a get: the answer came before it.
                                done = !dump || done;
                                continue;
                            }
                            if errno == libc::ENOENT {
                                return Ok(Vec::new());
                            }
                            return Err(NftError::Kernel { object: "read".into(), errno, reason: reason(errno, text) });
                        }
                        _ => out.push(payload.get(NFGENMSG_LEN..).unwrap_or_default().to_vec()),
                    }
                }
                if done {
                    return Ok(out);
                }
            }
        }
        Err(NftError::Io {
            op: "netlink dump (interrupted 5 times)",
            source: io::Error::from(io::ErrorKind::Interrupted),
        })
    }

    fn drain(&self) {
        let mut rbuf = vec![0u8; RECV_CHUNK];
        while let Ok(Some(_)) = self.recv(&mut rbuf, 0) {}
    }
}

/// The kernel's reason: its extended-ack text when it gave one, else strerror.
pub(crate) fn reason(errno: i32, text: Option<String>) -> String {
    let base = io::Error::from_raw_os_error(errno).to_string();
    match text {
        Some(t) if !t.is_empty() => format!("{base} ({t})"),
        _ => base,
    }
}

pub(crate) struct Hdr {
    pub(crate) ty: u16,
    pub(crate) flags: u16,
    pub(crate) seq: u32,
}

fn put_msg(buf: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, family: u8, res_id: u16, attrs: &[u8]) {
    let len = (NLMSG_HDRLEN + NFGENMSG_LEN + attrs.len()) as u32;
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.push(family);
    buf.push(NFNETLINK_V0);
    buf.extend_from_slice(&res_id.to_be_bytes());
    buf.extend_from_slice(attrs);
    buf.resize(align4(buf.len()), 0);
}

/// Splits a datagram into (header, payload) messages; stops at anything malformed.
pub(crate) fn split(mut buf: &[u8]) -> Vec<(Hdr, &[u8])> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            break;
        }
        let hdr = Hdr {
            ty: u16::from_ne_bytes([buf[4], buf[5]]),
            flags: u16::from_ne_bytes([buf[6], buf[7]]),
            seq: u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]),
        };
        out.push((hdr, &buf[NLMSG_HDRLEN..len]));
        buf = &buf[align4(len).min(buf.len())..];
    }
    out
}

/// (errno, sequence number of the message it answers, extended-ack text).
fn parse_error(hdr: &Hdr, payload: &[u8]) -> Option<(i32, u32, Option<String>)> {
    let err = i32::from_ne_bytes(payload.get(..4)?.try_into().ok()?);
    let orig = payload.get(4..4 + NLMSG_HDRLEN)?;
    let seq = u32::from_ne_bytes(orig.get(8..12)?.try_into().ok()?);
    let mut text = None;
    if hdr.flags & NLM_F_ACK_TLVS != 0 {
        // With NETLINK_CAP_ACK only the original header is echoed; the TLVs follow it.
        let tlvs = payload.get(4 + NLMSG_HDRLEN..).unwrap_or_default();
        if let Ok(attrs) = parse(tlvs) {
            text = attrs.iter().find(|a| a.ty == NLMSGERR_ATTR_MSG).and_then(|a| a.str().ok());
        }
    }
    Some((-err, seq, text))
}
