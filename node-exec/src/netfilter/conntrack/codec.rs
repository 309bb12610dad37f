//! ctnetlink's messages (linux/netfilter/nfnetlink_conntrack.h), as far as deleting stale
//! entries needs them: the dump and delete requests, and a dumped entry's tuples, zone and id.

use std::net::Ipv4Addr;

use crate::netfilter::nfnetlink::{NFNL_SUBSYS_CTNETLINK, msg_type, nfgenmsg};
use crate::sys::netlink::Request;
use crate::sys::netlink::attr::{self, Attr, AttrWriter};
use crate::sys::netlink::consts::NLM_F_DUMP;

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

/// The nfgenmsg of every request: IPv4 (the dump then holds only IPv4 entries).
const IPV4: [u8; 4] = nfgenmsg(libc::AF_INET as u8, 0);

/// The request that dumps the IPv4 entries.
pub(super) fn dump_request() -> Request<'static> {
    Request {
        ty: msg_type(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_GET),
        flags: NLM_F_DUMP,
        family_header: &IPV4,
        attrs: &[],
    }
}

/// The request that deletes one entry, with its attributes ([`delete_attrs`]).
pub(super) fn delete_request(attrs: &[u8]) -> Request<'_> {
    Request { ty: msg_type(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_DELETE), flags: 0, family_header: &IPV4, attrs }
}

/// An original-direction tuple, as far as deleting needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Tuple {
    pub(super) src: Ipv4Addr,
    pub(super) dst: Ipv4Addr,
    pub(super) proto: u8,
    pub(super) sport: u16,
    pub(super) dport: u16,
    /// A directional zone (CTA_TUPLE_ZONE), rarely set.
    pub(super) zone: Option<u16>,
}

/// One dumped entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) orig: Tuple,
    /// The reply-direction tuple: its source is the DNAT target (the original destination
    /// without DNAT), its destination the client as the server saw it (the original source
    /// without SNAT).
    pub(super) reply: Tuple,
    pub(super) zone: Option<u16>,
    pub(super) id: Option<u32>,
}

/// Parses one dumped entry (the attributes after nfgenmsg). None for entries this module does
/// not handle: not IPv4, or without ports.
pub(super) fn parse_entry(payload: &[u8]) -> Option<Entry> {
    let top = attrs(payload)?;
    let orig = parse_tuple(find(&top, CTA_TUPLE_ORIG)?)?;
    let reply = parse_tuple(find(&top, CTA_TUPLE_REPLY)?)?;
    Some(Entry { orig, reply, zone: find(&top, CTA_ZONE).and_then(be16), id: find(&top, CTA_ID).and_then(be32) })
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
pub(super) fn delete_attrs(e: &Entry) -> Vec<u8> {
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

// --- attributes ---------------------------------------------------------------------------

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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A UDP entry to `dport`, answered from `reply_src` on the same port, not source-NATed.
    pub(in super::super) fn entry(dport: u16, reply_src: [u8; 4]) -> Entry {
        let orig = Tuple {
            src: Ipv4Addr::new(10, 0, 0, 2),
            dst: Ipv4Addr::new(10, 0, 0, 1),
            proto: 17,
            sport: 40000,
            dport,
            zone: None,
        };
        let reply =
            Tuple { src: Ipv4Addr::from(reply_src), dst: orig.src, sport: dport, dport: orig.sport, ..orig.clone() };
        Entry { orig, reply, zone: Some(7), id: Some(0xdead_beef) }
    }

    /// A dumped entry as the kernel encodes it: the delete's attributes plus a reply tuple.
    fn dumped(e: &Entry) -> Vec<u8> {
        let mut w = AttrWriter { buf: delete_attrs(e) };
        let reply = w.begin(CTA_TUPLE_REPLY);
        let ip = w.begin(CTA_TUPLE_IP);
        w.put(CTA_IP_V4_SRC, &e.reply.src.octets());
        w.put(CTA_IP_V4_DST, &e.reply.dst.octets());
        w.end(ip);
        let proto = w.begin(CTA_TUPLE_PROTO);
        w.put(CTA_PROTO_NUM, &[e.reply.proto]);
        w.put(CTA_PROTO_SRC_PORT, &e.reply.sport.to_be_bytes());
        w.put(CTA_PROTO_DST_PORT, &e.reply.dport.to_be_bytes());
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
}
