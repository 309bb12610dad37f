//! Deleting stale conntrack entries natively, over ctnetlink (NETLINK_NETFILTER, subsystem
//! NFNL_SUBSYS_CTNETLINK); the `conntrack` CLI is never run.
//!
//! When a published port's DNAT target moves, an established UDP flow keeps its old translation
//! forever: every datagram refreshes the entry. Deleting the entry makes the next datagram go
//! through the NAT rules again, as kube-proxy does.
//!
//! One dump of the IPv4 table selects the entries; they are deleted one by one after the dump
//! (deleting while dumping would disturb the dump), each by its original tuple, zone and id.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use kuport_proto::canonical::common_ends;
use kuport_proto::owned;

use crate::nft::attr::{self, Attr, AttrWriter};
use crate::nft::netlink::{Hdr, split};
use kuport_proto::v1::nft_value::Value;
use kuport_proto::v1::{NftElement, NftTable, NftValue};

// --- netlink (linux/netlink.h) ------------------------------------------------------------
/// Request flag.
const NLM_F_REQUEST: u16 = 0x1;
/// Ask for an ack (an NLMSG_ERROR with error 0).
const NLM_F_ACK: u16 = 0x4;
/// Dump request (root|match).
const NLM_F_DUMP: u16 = 0x300;
/// A dump was interrupted by a concurrent change; it must be restarted.
const NLM_F_DUMP_INTR: u16 = 0x10;
/// On an NLMSG_ERROR: extended-ack attributes follow.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// Error/ack message type.
const NLMSG_ERROR: u16 = 0x2;
/// End of a dump.
const NLMSG_DONE: u16 = 0x3;
/// Extended-ack attribute: the kernel's text.
const NLMSGERR_ATTR_MSG: u16 = 1;
/// Socket option: acks echo only the header of the request.
const NETLINK_CAP_ACK: i32 = 10;
/// Socket option: extended acks (a reason text) on errors.
const NETLINK_EXT_ACK: i32 = 11;
/// Length of struct nlmsghdr.
const NLMSG_HDRLEN: usize = 16;

// --- nfnetlink (linux/netfilter/nfnetlink.h) ----------------------------------------------
/// Length of struct nfgenmsg.
const NFGENMSG_LEN: usize = 4;
/// nfgenmsg version.
const NFNETLINK_V0: u8 = 0;
/// nfnetlink subsystem of connection tracking.
const NFNL_SUBSYS_CTNETLINK: u16 = 1;

// --- ctnetlink (linux/netfilter/nfnetlink_conntrack.h) ------------------------------------
/// enum cntl_msg_types: get (dump) entries.
const IPCTNL_MSG_CT_GET: u16 = 1;
/// enum cntl_msg_types: delete an entry.
const IPCTNL_MSG_CT_DELETE: u16 = 2;
/// enum ctattr_type: the original-direction tuple (nested).
const CTA_TUPLE_ORIG: u16 = 1;
/// enum ctattr_type: the reply-direction tuple (nested).
const CTA_TUPLE_REPLY: u16 = 2;
/// enum ctattr_type: the entry's id (be32); a delete naming it spares a newer entry of the same tuple.
const CTA_ID: u16 = 12;
/// enum ctattr_type: the entry's zone (be16), present only when not the default zone.
const CTA_ZONE: u16 = 18;
/// enum ctattr_tuple: addresses (nested).
const CTA_TUPLE_IP: u16 = 1;
/// enum ctattr_tuple: protocol and ports (nested).
const CTA_TUPLE_PROTO: u16 = 2;
/// enum ctattr_tuple: a directional zone (be16).
const CTA_TUPLE_ZONE: u16 = 3;
/// enum ctattr_ip: IPv4 source address.
const CTA_IP_V4_SRC: u16 = 1;
/// enum ctattr_ip: IPv4 destination address.
const CTA_IP_V4_DST: u16 = 2;
/// enum ctattr_l4proto: protocol number (u8).
const CTA_PROTO_NUM: u16 = 1;
/// enum ctattr_l4proto: source port (be16).
const CTA_PROTO_SRC_PORT: u16 = 2;
/// enum ctattr_l4proto: destination port (be16).
const CTA_PROTO_DST_PORT: u16 = 3;

// --- this module --------------------------------------------------------------------------
/// Receive buffer: a dump datagram is at most a few pages.
const RECV_CHUNK: usize = 256 * 1024;
/// How long to wait for the kernel's next answer.
const ANSWER_TIMEOUT_MS: i32 = 5_000;
/// How often an interrupted dump is restarted before giving up.
const DUMP_ATTEMPTS: usize = 5;

/// Which conntrack entries to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleFlows {
    /// IPPROTO_TCP (6) or IPPROTO_UDP (17); entries without ports never match.
    pub protocol: u8,
    /// Original-direction destination ports, inclusive.
    pub ports: RangeInclusive<u16>,
    /// Some: entries translated to this address (their reply source), by an element that moved
    /// or went; never another service's flows. None: entries not translated at all (reply source
    /// = original destination), which a new element would now translate.
    pub translated_to: Option<Ipv4Addr>,
}

impl StaleFlows {
    fn selects(&self, e: &Entry) -> bool {
        e.orig.proto == self.protocol
            && self.ports.contains(&e.orig.dport)
            && e.reply_src == self.translated_to.unwrap_or(e.orig.dst)
    }
}

/// kuport's DNAT maps: key (.. proto .. ports ..), data (target address[, port]).
const DNAT_MAPS: [&str; 4] =
    [owned::MAP_PUBLISH_PORT, owned::MAP_PUBLISH_RANGE, owned::MAP_LINK_PORT, owned::MAP_LINK_RANGE];
/// IPPROTO_UDP.
const UDP: u8 = 17;

/// The UDP flows a table change leaves on the wrong path, which keep it as long as they send:
/// - those an element of `old` translated, when the element is gone from `new` or now maps
///   elsewhere;
/// - those no element translated (their first datagram came before the element), for every
///   element `new` adds or changes. On a pod's node the link's element can land after the
///   accepting node already sends the flow there; that datagram makes an untranslated entry.
///
/// Only UDP, as kube-proxy does: an established UDP flow refreshes its entry with every datagram,
/// while a TCP flow to a vanished pod ends on its own and one to a live pod may still drain.
/// Sets whose digests match are skipped without a walk, and so are the equal runs at both ends
/// of a changed set; elements are in canonical order, so its common head and tail are skipped
/// too.
pub fn stale_udp(old: Option<&NftTable>, new: Option<&NftTable>) -> Vec<StaleFlows> {
    let mut out = Vec::new();
    for name in DNAT_MAPS {
        let (before, after) = (set_of(old, name), set_of(new, name));
        if let (Some(b), Some(a)) = (before, after)
            && !a.digest.is_empty()
            && a.digest == b.digest
        {
            continue;
        }
        let (b, a) = (elements(before), elements(after));
        let (_, head, tail) = common_ends(b, runs(before), a, runs(after));
        let (b, a) = (&b[head..b.len() - tail], &a[head..a.len() - tail]);
        let by_key = |list: &[NftElement]| -> HashMap<String, Vec<NftValue>> {
            list.iter().map(|e| (format!("{:?}", e.key), e.data.clone())).collect()
        };
        let (was, now) = (by_key(b), by_key(a));
        let unchanged = |e: &NftElement, other: &HashMap<String, Vec<NftValue>>| {
            other.get(&format!("{:?}", e.key)).is_some_and(|data| *data == e.data)
        };
        for e in b.iter().filter(|e| !unchanged(e, &now)) {
            out.extend(dnat_flows(e, true));
        }
        for e in a.iter().filter(|e| !unchanged(e, &was)) {
            out.extend(dnat_flows(e, false));
        }
    }
    out
}

fn set_of<'a>(table: Option<&'a NftTable>, name: &str) -> Option<&'a kuport_proto::v1::NftSet> {
    table.and_then(|t| t.sets.iter().find(|s| s.name == name))
}

fn elements(set: Option<&kuport_proto::v1::NftSet>) -> &[NftElement] {
    set.map_or(&[][..], |s| &s.elements[..])
}

fn runs(set: Option<&kuport_proto::v1::NftSet>) -> &[kuport_proto::v1::ElementRun] {
    set.map_or(&[][..], |s| &s.runs[..])
}

/// The UDP flows of one DNAT element: its ports, and its target (`translated`) or none.
fn dnat_flows(e: &NftElement, translated: bool) -> Option<StaleFlows> {
    let mut protocol = None;
    let mut ports = None;
    for v in &e.key {
        match &v.value {
            Some(Value::Proto(p)) => protocol = u8::try_from(*p).ok(),
            Some(Value::Port(r)) => ports = Some(u16::try_from(r.first).ok()?..=u16::try_from(r.last).ok()?),
            _ => {}
        }
    }
    let target = e.data.iter().find_map(|v| match &v.value {
        Some(Value::Addr(a)) => a.parse().ok(),
        _ => None,
    })?;
    let translated_to = translated.then_some(target);
    Some(StaleFlows { protocol: protocol?, ports: ports?, translated_to }).filter(|f| f.protocol == UDP)
}

/// Everything that can go wrong deleting conntrack entries.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
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
    #[error("conntrack namespace thread: {0}")]
    Thread(#[source] io::Error),
    #[error("opening the ctnetlink socket ({op}): {source}")]
    Socket {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("sending the conntrack {what} request: {source}")]
    Send {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("receiving the conntrack {what} answer: {source}")]
    Receive {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The kernel refused a request; `reason` is its errno text (and extended-ack message).
    #[error("the kernel refused the conntrack {what}: {reason} (errno {errno})")]
    Kernel { what: &'static str, errno: i32, reason: String },
}

/// Deletes IPv4 conntrack entries matching any of `flows` in the network namespace `netns`
/// (None: this thread's namespace). Returns how many were deleted; entries that vanish between
/// the dump and their delete are not counted and are no error.
pub fn delete_stale(netns: Option<&Path>, flows: &[StaleFlows]) -> Result<usize, ConntrackError> {
    if flows.is_empty() {
        return Ok(0);
    }
    let Some(path) = netns else { return delete_here(flows) };
    let file = File::open(path).map_err(|source| ConntrackError::OpenNetns { path: path.to_path_buf(), source })?;
    // setns() moves only the calling thread, and a netlink socket stays in the namespace it was
    // made in: a scratch thread enters, opens the socket there, and ends with the work.
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("kuport-conntrack".into())
            .spawn_scoped(s, || {
                // SAFETY: setns on this thread only, with a valid, open namespace fd.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    let source = io::Error::last_os_error();
                    return Err(ConntrackError::EnterNetns { path: path.to_path_buf(), source });
                }
                delete_here(flows)
            })
            .map_err(ConntrackError::Thread)?;
        worker.join().map_err(|_| ConntrackError::Thread(io::Error::other("panicked")))?
    })
}

/// [`delete_stale`] in the calling thread's namespace.
fn delete_here(flows: &[StaleFlows]) -> Result<usize, ConntrackError> {
    let mut sock = Socket::open()?;
    let stale = sock.dump(|e| flows.iter().any(|f| f.selects(e)))?;
    let mut deleted = 0;
    for e in &stale {
        if sock.delete(e)? {
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// An original-direction tuple, as far as deleting needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tuple {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    sport: u16,
    dport: u16,
    /// A directional zone (CTA_TUPLE_ZONE), rarely set.
    zone: Option<u16>,
}

/// One dumped entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    orig: Tuple,
    /// Reply-direction source: the DNAT target (or the original destination without DNAT).
    reply_src: Ipv4Addr,
    zone: Option<u16>,
    id: Option<u32>,
}

/// Parses one dumped entry (the attributes after nfgenmsg). None for entries this module does
/// not handle: not IPv4, or without ports.
fn parse_entry(payload: &[u8]) -> Option<Entry> {
    let top = attrs(payload)?;
    let orig = parse_tuple(find(&top, CTA_TUPLE_ORIG)?)?;
    let reply = parse_tuple(find(&top, CTA_TUPLE_REPLY)?)?;
    Some(Entry {
        orig,
        reply_src: reply.src,
        zone: find(&top, CTA_ZONE).and_then(be16),
        id: find(&top, CTA_ID).and_then(be32),
    })
}

fn parse_tuple(data: &[u8]) -> Option<Tuple> {
    let tuple = attrs(data)?;
    let ip = attrs(find(&tuple, CTA_TUPLE_IP)?)?;
    let proto = attrs(find(&tuple, CTA_TUPLE_PROTO)?)?;
    Some(Tuple {
        src: ipv4(find(&ip, CTA_IP_V4_SRC)?)?,
        dst: ipv4(find(&ip, CTA_IP_V4_DST)?)?,
        proto: *find(&proto, CTA_PROTO_NUM)?.first()?,
        sport: be16(find(&proto, CTA_PROTO_SRC_PORT)?)?,
        dport: be16(find(&proto, CTA_PROTO_DST_PORT)?)?,
        zone: find(&tuple, CTA_TUPLE_ZONE).and_then(be16),
    })
}

/// The attributes of an IPCTNL_MSG_CT_DELETE naming `e`.
fn delete_attrs(e: &Entry) -> Vec<u8> {
    let t = &e.orig;
    let mut w = AttrWriter::new();
    let tuple = w.begin(CTA_TUPLE_ORIG);
    let ip = w.begin(CTA_TUPLE_IP);
    w.put(CTA_IP_V4_SRC, &t.src.octets());
    w.put(CTA_IP_V4_DST, &t.dst.octets());
    w.end(ip);
    let proto = w.begin(CTA_TUPLE_PROTO);
    w.put(CTA_PROTO_NUM, &[t.proto]);
    w.put(CTA_PROTO_SRC_PORT, &t.sport.to_be_bytes());
    w.put(CTA_PROTO_DST_PORT, &t.dport.to_be_bytes());
    w.end(proto);
    if let Some(z) = t.zone {
        w.put(CTA_TUPLE_ZONE, &z.to_be_bytes());
    }
    w.end(tuple);
    if let Some(z) = e.zone {
        w.put(CTA_ZONE, &z.to_be_bytes());
    }
    if let Some(id) = e.id {
        w.put(CTA_ID, &id.to_be_bytes());
    }
    w.buf
}

// --- attributes (TLVs): the nf_tables codec's writer and parser ------------------------

/// An entry's attributes; a malformed run makes the entry unreadable (it is skipped).
fn attrs(buf: &[u8]) -> Option<Vec<Attr<'_>>> {
    attr::parse(buf).ok()
}

fn find<'a>(attrs: &[Attr<'a>], ty: u16) -> Option<&'a [u8]> {
    attr::find(attrs, ty).map(|a| a.data)
}

fn be16(d: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(d.get(..2)?.try_into().ok()?))
}

fn be32(d: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(d.get(..4)?.try_into().ok()?))
}

fn ipv4(d: &[u8]) -> Option<Ipv4Addr> {
    let b: [u8; 4] = d.get(..4)?.try_into().ok()?;
    Some(Ipv4Addr::from(b))
}

// --- messages -----------------------------------------------------------------------------

/// An nfnetlink message of the ctnetlink subsystem, for IPv4.
fn message(msg: u16, flags: u16, seq: u32, attrs: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(NLMSG_HDRLEN + NFGENMSG_LEN + attrs.len());
    buf.extend_from_slice(&((NLMSG_HDRLEN + NFGENMSG_LEN + attrs.len()) as u32).to_ne_bytes());
    buf.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | msg).to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.push(libc::AF_INET as u8);
    buf.push(NFNETLINK_V0);
    buf.extend_from_slice(&0u16.to_be_bytes());
    buf.extend_from_slice(attrs);
    buf
}

/// An NLMSG_ERROR's (positive errno, 0 for an ack) and the kernel's reason text.
fn parse_error(hdr: &Hdr, payload: &[u8]) -> (i32, Option<String>) {
    let Some(err) = payload.get(..4).and_then(|b| b.try_into().ok()).map(i32::from_ne_bytes) else {
        return (libc::EIO, Some("short error message".into()));
    };
    let mut text = None;
    if hdr.flags & NLM_F_ACK_TLVS != 0 {
        // With NETLINK_CAP_ACK only the request's header is echoed; the TLVs follow it.
        let tlvs = payload.get(4 + NLMSG_HDRLEN..).unwrap_or_default();
        text = attrs(tlvs)
            .and_then(|a| find(&a, NLMSGERR_ATTR_MSG).map(<[u8]>::to_vec))
            .map(|d| String::from_utf8_lossy(d.split(|b| *b == 0).next().unwrap_or_default()).into_owned());
    }
    (-err, text)
}

fn kernel_err(what: &'static str, errno: i32, text: Option<String>) -> ConntrackError {
    let base = io::Error::from_raw_os_error(errno).to_string();
    let reason = match text {
        Some(t) if !t.is_empty() => format!("{base} ({t})"),
        _ => base,
    };
    ConntrackError::Kernel { what, errno, reason }
}

// --- socket -------------------------------------------------------------------------------

struct Socket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

fn socket_err(op: &'static str) -> ConntrackError {
    ConntrackError::Socket { op, source: io::Error::last_os_error() }
}

impl Socket {
    /// A NETLINK_NETFILTER socket in the calling thread's namespace.
    fn open() -> Result<Self, ConntrackError> {
        // SAFETY: plain socket(2); the fd is owned right away.
        let raw =
            unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_NETFILTER) };
        if raw < 0 {
            return Err(socket_err("socket(NETLINK_NETFILTER)"));
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
        // Best effort: small acks, with the kernel's reason text on errors.
        for opt in [NETLINK_CAP_ACK, NETLINK_EXT_ACK] {
            let on: i32 = 1;
            // SAFETY: `on` lives for the call; the length matches its type.
            unsafe {
                libc::setsockopt(
                    raw,
                    libc::SOL_NETLINK,
                    opt,
                    (&on as *const i32).cast(),
                    std::mem::size_of::<i32>() as libc::socklen_t,
                );
            }
        }
        Ok(Self { fd, seq: 0, buf: vec![0; RECV_CHUNK] })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    fn send(&self, what: &'static str, msg: &[u8]) -> Result<(), ConntrackError> {
        // SAFETY: msg is valid for its length; an unconnected netlink socket sends to the kernel.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(ConntrackError::Send { what, source: io::Error::last_os_error() });
        }
        Ok(())
    }

    /// Receives one datagram into `self.buf`; returns its length.
    fn recv(&mut self, what: &'static str) -> Result<usize, ConntrackError> {
        let fail = |source| ConntrackError::Receive { what, source };
        loop {
            let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, ANSWER_TIMEOUT_MS) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(fail(e));
            }
            if r == 0 {
                return Err(fail(io::Error::from(io::ErrorKind::TimedOut)));
            }
            // SAFETY: buf is valid and writable for its length. MSG_TRUNC returns the real length.
            let n = unsafe {
                libc::recv(self.fd.as_raw_fd(), self.buf.as_mut_ptr().cast(), self.buf.len(), libc::MSG_TRUNC)
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(fail(e));
            }
            let n = n as usize;
            if n > self.buf.len() {
                return Err(fail(io::Error::other(format!("datagram of {n} bytes truncated"))));
            }
            return Ok(n);
        }
    }

    /// The IPv4 entries `wanted` selects (only those are kept: a table can hold millions).
    /// Restarts when the kernel flags the dump interrupted.
    fn dump(&mut self, wanted: impl Fn(&Entry) -> bool) -> Result<Vec<Entry>, ConntrackError> {
        const WHAT: &str = "dump";
        'attempt: for _ in 0..DUMP_ATTEMPTS {
            let seq = self.next_seq();
            self.send(WHAT, &message(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, &[]))?;
            let mut entries = Vec::new();
            let mut interrupted = false;
            loop {
                let n = self.recv(WHAT)?;
                for (hdr, payload) in split(&self.buf[..n]) {
                    if hdr.seq != seq {
                        continue;
                    }
                    interrupted |= hdr.flags & NLM_F_DUMP_INTR != 0;
                    match hdr.ty {
                        NLMSG_DONE if interrupted => continue 'attempt,
                        NLMSG_DONE => return Ok(entries),
                        NLMSG_ERROR => {
                            let (errno, text) = parse_error(&hdr, payload);
                            return Err(kernel_err(WHAT, errno, text));
                        }
                        _ => entries.extend(payload.get(NFGENMSG_LEN..).and_then(parse_entry).filter(&wanted)),
                    }
                }
            }
        }
        Err(ConntrackError::Receive {
            what: WHAT,
            source: io::Error::other(format!("dump interrupted {DUMP_ATTEMPTS} times")),
        })
    }

    /// Deletes one entry; false when it was already gone.
    fn delete(&mut self, e: &Entry) -> Result<bool, ConntrackError> {
        const WHAT: &str = "delete";
        let seq = self.next_seq();
        self.send(WHAT, &message(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, seq, &delete_attrs(e)))?;
        loop {
            let n = self.recv(WHAT)?;
            for (hdr, payload) in split(&self.buf[..n]) {
                if hdr.seq != seq || hdr.ty != NLMSG_ERROR {
                    continue;
                }
                return match parse_error(&hdr, payload) {
                    (0, _) => Ok(true),
                    (libc::ENOENT, _) => Ok(false),
                    (errno, text) => Err(kernel_err(WHAT, errno, text)),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(dport: u16, reply_src: [u8; 4]) -> Entry {
        Entry {
            orig: Tuple {
                src: Ipv4Addr::new(10, 0, 0, 2),
                dst: Ipv4Addr::new(10, 0, 0, 1),
                proto: 17,
                sport: 40000,
                dport,
                zone: None,
            },
            reply_src: Ipv4Addr::from(reply_src),
            zone: Some(7),
            id: Some(0xdead_beef),
        }
    }

    /// A dumped entry as the kernel encodes it: the delete's attributes plus a reply tuple.
    fn dumped(e: &Entry) -> Vec<u8> {
        let mut w = AttrWriter { buf: delete_attrs(e) };
        let reply = w.begin(CTA_TUPLE_REPLY);
        let ip = w.begin(CTA_TUPLE_IP);
        w.put(CTA_IP_V4_SRC, &e.reply_src.octets());
        w.put(CTA_IP_V4_DST, &e.orig.src.octets());
        w.end(ip);
        let proto = w.begin(CTA_TUPLE_PROTO);
        w.put(CTA_PROTO_NUM, &[e.orig.proto]);
        w.put(CTA_PROTO_SRC_PORT, &e.orig.dport.to_be_bytes());
        w.put(CTA_PROTO_DST_PORT, &e.orig.sport.to_be_bytes());
        w.end(proto);
        w.end(reply);
        w.buf
    }

    #[test]
    fn entries_round_trip_through_the_wire_format() {
        let e = entry(27015, [10, 0, 1, 2]);
        assert_eq!(parse_entry(&dumped(&e)), Some(e));
    }

    #[test]
    fn entries_without_ports_or_reply_are_skipped() {
        let e = entry(27015, [10, 0, 1, 2]);
        // The delete's attributes lack the reply tuple.
        assert_eq!(parse_entry(&delete_attrs(&e)), None);
        assert_eq!(parse_entry(&[1, 2, 3]), None);
    }

    #[test]
    fn flows_select_by_protocol_port_and_old_target() {
        let old = Ipv4Addr::new(10, 0, 1, 2);
        let flows = StaleFlows { protocol: 17, ports: 27000..=27015, translated_to: Some(old) };
        assert!(flows.selects(&entry(27015, old.octets())));
        assert!(flows.selects(&entry(27000, old.octets())));
        assert!(!flows.selects(&entry(27015, [10, 0, 1, 3])), "another target's flow");
        assert!(!flows.selects(&entry(27016, old.octets())), "a port outside the range");
        assert!(!StaleFlows { protocol: 6, ..flows }.selects(&entry(27015, old.octets())), "another protocol");
    }

    fn v(value: Value) -> NftValue {
        NftValue { value: Some(value) }
    }

    /// A publish_port element: (ifname, proto, port) to (target, port).
    fn published(proto: i32, port: u32, target: &str) -> NftElement {
        let ports = kuport_proto::v1::PortRange { first: port, last: port };
        NftElement {
            key: vec![v(Value::Ifname("eth1".into())), v(Value::Proto(proto)), v(Value::Port(ports))],
            data: vec![v(Value::Addr(target.into())), v(Value::Port(ports))],
        }
    }

    fn table(elements: Vec<NftElement>) -> NftTable {
        let mut set = kuport_proto::v1::NftSet { name: owned::MAP_PUBLISH_PORT.into(), elements, ..Default::default() };
        (set.runs, set.digest) = kuport_proto::canonical::element_runs(&set.elements);
        NftTable { name: owned::NFT_TABLE.into(), sets: vec![set], ..Default::default() }
    }

    #[test]
    fn moved_removed_and_added_udp_elements_leave_stale_flows() {
        let old =
            table(vec![published(6, 80, "10.0.0.1"), published(17, 5000, "10.0.0.2"), published(17, 6000, "10.0.0.3")]);
        // Unchanged: nothing, whether or not digests are there.
        assert!(stale_udp(Some(&old), Some(&old)).is_empty());
        let mut undigested = old.clone();
        undigested.sets[0].digest.clear();
        assert!(stale_udp(Some(&undigested), Some(&undigested)).is_empty());

        // 5000 moves, 6000 goes, 7000 comes, TCP 80 moves too (TCP is left alone).
        let new =
            table(vec![published(6, 80, "10.0.0.9"), published(17, 5000, "10.0.0.8"), published(17, 7000, "10.0.0.7")]);
        let flows = |list: &[(u16, Option<&str>)]| -> Vec<StaleFlows> {
            list.iter()
                .map(|(p, t)| StaleFlows {
                    protocol: UDP,
                    ports: *p..=*p,
                    translated_to: t.map(|t| t.parse().expect("an address")),
                })
                .collect()
        };
        // The old targets' flows, then the untranslated flows of what the new elements catch.
        let want = flows(&[(5000, Some("10.0.0.2")), (6000, Some("10.0.0.3")), (5000, None), (7000, None)]);
        assert_eq!(stale_udp(Some(&old), Some(&new)), want);
        // The table gone: every UDP element's flows; the first table: its untranslated ones.
        assert_eq!(stale_udp(Some(&old), None), flows(&[(5000, Some("10.0.0.2")), (6000, Some("10.0.0.3"))]));
        assert_eq!(stale_udp(None, Some(&old)), flows(&[(5000, None), (6000, None)]));
    }

    #[test]
    fn runs_skip_the_unchanged_ends_of_a_large_map_and_find_the_same_flows() {
        let many = |skip: u32, moved: u32| {
            let target = |p: u32| if p == moved { "10.0.9.9" } else { "10.0.0.1" };
            table((1..=20_000).filter(|p| *p != skip).map(|p| published(17, p, target(p))).collect())
        };
        let (old, new) = (many(10_001, 0), many(0, 15_000));
        assert!(old.sets[0].runs.len() > 20);
        let mut plain = (old.clone(), new.clone());
        for s in [&mut plain.0.sets[0], &mut plain.1.sets[0]] {
            (s.runs, s.digest) = (Vec::new(), Vec::new());
        }
        let want = stale_udp(Some(&plain.0), Some(&plain.1));
        assert_eq!(want.len(), 3, "{want:?}");
        assert_eq!(stale_udp(Some(&old), Some(&new)), want);
    }

    #[test]
    fn untranslated_flows_are_selected_by_port_only_when_nothing_translated_them() {
        let flows = StaleFlows { protocol: 17, ports: 27015..=27115, translated_to: None };
        let mut e = entry(27015, [203, 0, 113, 9]);
        e.orig.dst = Ipv4Addr::new(203, 0, 113, 9);
        assert!(flows.selects(&e), "reply source = original destination: untranslated");
        e.reply_src = Ipv4Addr::new(10, 0, 1, 2);
        assert!(!flows.selects(&e), "translated by something else");
    }
}
