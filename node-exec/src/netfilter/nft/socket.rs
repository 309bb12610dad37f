//! nf_tables requests on an nfnetlink socket: transactions (batches acked per message) and
//! dumps or gets, with the kernel's refusals named by the object they were about.

use std::path::Path;

use super::NftError;
use super::encode::Msg;
use crate::netfilter::nfnetlink::{
    self, NFGENMSG_LEN, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES, msg_type, nfgenmsg,
};
use crate::sys::netlink::consts::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_ERROR};
use crate::sys::netlink::{self, Ack, Request, message};
use crate::sys::{self, netns};

/// Receive buffer asked for: a 1,000-message batch gets 1,000 acks, each its own skb.
const RCVBUF_BYTES: i32 = 8 << 20;
/// Send buffer asked for: a whole batch is one sendmsg.
const SNDBUF_BYTES: i32 = 8 << 20;
/// Receive buffer per message of a larger batch, as nft sizes its own: every ack is queued
/// before the first is read (nfnetlink runs the batch inside the send).
const RCVBUF_PER_MESSAGE: usize = 1024;
/// Receive chunk size for the acks of a batch.
const RECV_CHUNK: usize = 256 * 1024;

impl From<sys::Error> for NftError {
    fn from(e: sys::Error) -> Self {
        match e {
            sys::Error::OpenNetns { path, source } | sys::Error::EnterNetns { path, source } => {
                NftError::Netns { path, source }
            }
            sys::Error::Thread { what, source } => NftError::Io { op: what, source },
            sys::Error::Socket { op, source } => NftError::Io { op, source },
            sys::Error::Send(source) => NftError::Io { op: "send(netlink)", source },
            sys::Error::Receive(source) => NftError::Io { op: "recv(netlink)", source },
            sys::Error::Kernel { errno, message } => {
                NftError::Kernel { object: "request".into(), errno, reason: netlink::reason(errno, message.as_deref()) }
            }
        }
    }
}

/// The kernel's answer to one message of a batch.
#[derive(Debug)]
pub(crate) struct KernelError {
    pub(crate) object: String,
    pub(crate) errno: i32,
    pub(crate) message: Option<String>,
}

pub(crate) struct Socket {
    sock: netlink::Socket,
}

impl Socket {
    /// Opens a socket in the calling thread's network namespace.
    pub(crate) fn open() -> Result<Self, NftError> {
        let sock = nfnetlink::socket()?;
        // The FORCE variants need CAP_NET_ADMIN, which the executor has; fall back otherwise.
        sock.set_recv_buffer(RCVBUF_BYTES);
        sock.set_send_buffer(SNDBUF_BYTES);
        Ok(Self { sock })
    }

    /// Opens a socket inside `netns` (a path such as /var/run/netns/NAME), or in the caller's
    /// namespace; it stays there whichever thread uses it.
    pub(crate) fn open_in(netns: Option<&Path>) -> Result<Self, NftError> {
        netns::within(netns, Self::open)
    }

    /// Sends `msgs` as one transaction and waits for every ack. On any refusal the kernel
    /// aborts the whole batch; the errors name the objects it refused.
    pub(crate) fn batch(&mut self, msgs: &[Msg]) -> Result<(), Vec<KernelError>> {
        let mut buf = Vec::new();
        let mut seqs = Vec::with_capacity(msgs.len());
        let batch_header = nfgenmsg(0, NFNL_SUBSYS_NFTABLES);
        let begin = self.sock.next_seq();
        message::put(&mut buf, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, begin, &batch_header, &[]);
        for m in msgs {
            let seq = self.sock.next_seq();
            seqs.push(seq);
            let ty = msg_type(NFNL_SUBSYS_NFTABLES, m.ty);
            message::put(&mut buf, ty, NLM_F_REQUEST | NLM_F_ACK | m.flags, seq, &nfgenmsg(m.family, 0), &m.attrs);
        }
        let end = self.sock.next_seq();
        message::put(&mut buf, NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, &batch_header, &[]);
        let local =
            |e: sys::Error| vec![KernelError { object: "batch".into(), errno: 0, message: Some(e.to_string()) }];
        // A table's first transaction carries all its chains and rules (a chain per limited
        // mapping: 40,000 make 17 MB and 80,000 acks); the buffers grow to fit, or the send is
        // refused (EMSGSIZE) and acks are lost (ENOBUFS).
        if buf.len() > SNDBUF_BYTES as usize {
            self.sock.set_send_buffer(i32::try_from(buf.len()).unwrap_or(i32::MAX));
        }
        let acks = msgs.len().saturating_mul(RCVBUF_PER_MESSAGE);
        if acks > RCVBUF_BYTES as usize {
            self.sock.set_recv_buffer(i32::try_from(acks).unwrap_or(i32::MAX));
        }
        self.sock.send(&buf).map_err(local)?;

        let object_of = |seq: u32| -> String {
            seqs.iter().position(|s| *s == seq).map(|i| msgs[i].object.clone()).unwrap_or_else(|| "batch".to_string())
        };
        let mut acked = 0usize;
        let mut errors = Vec::new();
        let mut rbuf = vec![0u8; RECV_CHUNK];
        // nfnetlink handles the batch inside send(), so every ack is queued by now; the
        // timeout only guards against a kernel that stops early.
        while acked + errors.len() < msgs.len() {
            let timeout = if errors.is_empty() { netlink::ANSWER_TIMEOUT_MS } else { 0 };
            let n = match self.sock.recv(&mut rbuf, timeout) {
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
            for (hdr, payload) in message::split(&rbuf[..n]) {
                if hdr.ty != NLMSG_ERROR {
                    continue;
                }
                let Some(Ack { errno, seq, message }) = Ack::parse(&hdr, payload) else { continue };
                if errno == 0 {
                    acked += 1;
                } else {
                    errors.push(KernelError { object: object_of(seq), errno, message });
                }
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }

    /// A dump (or, with `dump` false, a single get): the payload after nfgenmsg of every
    /// answer; ENOENT is an empty answer. Restarts when the kernel flags the dump interrupted.
    pub(crate) fn request(&mut self, ty: u16, family: u8, attrs: &[u8], dump: bool) -> Result<Vec<Vec<u8>>, NftError> {
        let req = Request {
            ty: msg_type(NFNL_SUBSYS_NFTABLES, ty),
            flags: if dump { NLM_F_DUMP } else { 0 },
            family_header: &nfgenmsg(family, 0),
            attrs,
        };
        let answers = self
            .sock
            .dump(req, Vec::new, |out, payload| out.push(payload.get(NFGENMSG_LEN..).unwrap_or_default().to_vec()));
        match answers {
            Ok(out) => Ok(out),
            Err(sys::Error::Kernel { errno: libc::ENOENT, .. }) => Ok(Vec::new()),
            Err(sys::Error::Kernel { errno, message }) => Err(NftError::Kernel {
                object: "read".into(),
                errno,
                reason: netlink::reason(errno, message.as_deref()),
            }),
            Err(e) => Err(e.into()),
        }
    }
}
