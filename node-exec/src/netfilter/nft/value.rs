//! Datatypes, values and selectors: how each model value is laid out in a register, a set key
//! or a compare, exactly as nft 1.0.6 lays it out.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kuport_proto::v1::{L4Proto, NftType, NftValue, PortRange, Selector, Verdict, VerdictKind, nft_value::Value};

use super::NftError;
use super::consts::*;

/// What nft knows about a datatype: its id, its length in bytes, and its byteorder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TypeInfo {
    pub(crate) id: u32,
    pub(crate) len: u32,
    pub(crate) byteorder: u32,
}

pub(crate) fn type_info(t: NftType) -> Option<TypeInfo> {
    let (id, len, byteorder) = match t {
        NftType::Unspecified => return None,
        NftType::Ifname => (TYPE_IFNAME, IFNAMSIZ as u32, BYTEORDER_HOST),
        NftType::Ipv4Addr => (TYPE_IPADDR, 4, BYTEORDER_BIG),
        NftType::Ipv6Addr => (TYPE_IP6ADDR, 16, BYTEORDER_BIG),
        NftType::InetProto => (TYPE_INET_PROTOCOL, 1, BYTEORDER_INVALID),
        NftType::InetService => (TYPE_INET_SERVICE, 2, BYTEORDER_BIG),
        NftType::Mark => (TYPE_MARK, 4, BYTEORDER_HOST),
        NftType::Verdict => (NFT_DATA_VERDICT_TYPE, 0, BYTEORDER_INVALID),
    };
    Some(TypeInfo { id, len, byteorder })
}

pub(crate) fn type_from_id(id: u32) -> Option<NftType> {
    Some(match id {
        TYPE_IFNAME => NftType::Ifname,
        TYPE_IPADDR => NftType::Ipv4Addr,
        TYPE_IP6ADDR => NftType::Ipv6Addr,
        TYPE_INET_PROTOCOL => NftType::InetProto,
        TYPE_INET_SERVICE => NftType::InetService,
        TYPE_MARK => NftType::Mark,
        NFT_DATA_VERDICT_TYPE => NftType::Verdict,
        _ => return None,
    })
}

/// A concatenation's combined type id (nft's concat_subtype_add).
pub(crate) fn concat_id(types: &[TypeInfo]) -> u32 {
    types.iter().fold(0, |acc, t| (acc << TYPE_BITS) | t.id)
}

/// Splits a combined type id back into its components.
pub(crate) fn split_concat_id(mut id: u32) -> Option<Vec<NftType>> {
    let mut out = Vec::new();
    while id != 0 {
        out.push(type_from_id(id & ((1 << TYPE_BITS) - 1))?);
        id >>= TYPE_BITS;
    }
    out.reverse();
    Some(out)
}

/// Bytes a component occupies in a concatenation: whole 32-bit register words.
pub(crate) fn padded(len: u32) -> u32 {
    len.div_ceil(4) * 4
}

fn invalid(object: &str, reason: impl Into<String>) -> NftError {
    NftError::Invalid { object: object.to_string(), reason: reason.into() }
}

pub(crate) fn value_of(v: &NftValue) -> Option<&Value> {
    v.value.as_ref()
}

/// An interface name as 16 NUL-padded bytes (no wildcard).
pub(crate) fn ifname_bytes(object: &str, name: &str) -> Result<Vec<u8>, NftError> {
    if name.is_empty() || name.len() >= IFNAMSIZ || name.contains('*') || name.contains('\0') {
        return Err(invalid(object, format!("bad interface name {name:?} (1 to 15 bytes, no wildcard)")));
    }
    let mut b = name.as_bytes().to_vec();
    b.resize(IFNAMSIZ, 0);
    Ok(b)
}

/// Parses "a.b.c.d" or "a.b.c.d/len" (or IPv6) into the address and its prefix length.
pub(crate) fn parse_prefix(object: &str, s: &str) -> Result<(IpAddr, u8), NftError> {
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: IpAddr = a.parse().map_err(|_| invalid(object, format!("bad address {s:?}")))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match l {
        Some(l) => l
            .parse::<u8>()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| invalid(object, format!("bad prefix length in {s:?}")))?,
        None => max,
    };
    Ok((addr, len))
}

pub(crate) fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// A netmask of `len` bits over `bytes` bytes.
pub(crate) fn mask_bytes(bytes: usize, len: u8) -> Vec<u8> {
    (0..bytes)
        .map(|i| {
            let bits = (usize::from(len)).saturating_sub(i * 8).min(8);
            if bits == 0 { 0 } else { 0xffu8 << (8 - bits) }
        })
        .collect()
}

/// The prefix length of a contiguous netmask.
pub(crate) fn mask_len(mask: &[u8]) -> Option<u8> {
    let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
    let ones = u8::try_from(ones).ok()?;
    (mask_bytes(mask.len(), ones) == mask).then_some(ones)
}

pub(crate) fn addr_from_bytes(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?))),
        _ => None,
    }
}

/// "a.b.c.d" for a full-length prefix, else "a.b.c.d/len": the canonical text of the model.
pub(crate) fn prefix_text(a: IpAddr, len: u8) -> String {
    let max = if a.is_ipv4() { 32 } else { 128 };
    if len == max { a.to_string() } else { format!("{a}/{len}") }
}

pub(crate) fn port_range(object: &str, r: &PortRange) -> Result<(u16, u16), NftError> {
    let first = u16::try_from(r.first).map_err(|_| invalid(object, format!("port {} out of range", r.first)))?;
    let last = if r.last == 0 {
        first
    } else {
        u16::try_from(r.last).map_err(|_| invalid(object, format!("port {} out of range", r.last)))?
    };
    if last < first {
        return Err(invalid(object, format!("port range {first}-{last} is reversed")));
    }
    Ok((first, last))
}

pub(crate) fn proto_byte(object: &str, p: i32) -> Result<u8, NftError> {
    match L4Proto::try_from(p) {
        Ok(L4Proto::Tcp) => Ok(IPPROTO_TCP),
        Ok(L4Proto::Udp) => Ok(IPPROTO_UDP),
        _ => Err(invalid(object, format!("unknown l4 protocol {p}"))),
    }
}

pub(crate) fn proto_from_byte(b: u8) -> Option<L4Proto> {
    match b {
        IPPROTO_TCP => Some(L4Proto::Tcp),
        IPPROTO_UDP => Some(L4Proto::Udp),
        _ => None,
    }
}

/// One set-element component as (start, end) bytes, unpadded. `hton` marks interval
/// concatenations, where nft stores host-endian components in network order.
pub(crate) fn encode_component(
    object: &str,
    ty: NftType,
    v: &NftValue,
    interval: bool,
    hton: bool,
) -> Result<(Vec<u8>, Vec<u8>), NftError> {
    let mismatch = || invalid(object, format!("value {v:?} does not fit type {}", ty.as_str_name()));
    let single = |b: Vec<u8>| Ok((b.clone(), b));
    match (ty, value_of(v).ok_or_else(mismatch)?) {
        (NftType::Ifname, Value::Ifname(s)) => single(ifname_bytes(object, s)?),
        (NftType::Ipv4Addr | NftType::Ipv6Addr, Value::Addr(s)) => {
            let (a, len) = parse_prefix(object, s)?;
            if a.is_ipv4() != (ty == NftType::Ipv4Addr) {
                return Err(mismatch());
            }
            let b = addr_bytes(a);
            let max = b.len() * 8;
            if usize::from(len) != max && !interval {
                return Err(invalid(object, format!("prefix {s} needs an interval set")));
            }
            let m = mask_bytes(b.len(), len);
            let start: Vec<u8> = b.iter().zip(&m).map(|(x, m)| x & m).collect();
            if start != b {
                return Err(invalid(object, format!("prefix {s} has host bits set")));
            }
            let end = b.iter().zip(&m).map(|(x, m)| x | !m).collect();
            Ok((start, end))
        }
        (NftType::InetProto, Value::Proto(p)) => single(vec![proto_byte(object, *p)?]),
        (NftType::InetService, Value::Port(r)) => {
            let (f, l) = port_range(object, r)?;
            if f != l && !interval {
                return Err(invalid(object, format!("port range {f}-{l} needs an interval set")));
            }
            Ok((f.to_be_bytes().to_vec(), l.to_be_bytes().to_vec()))
        }
        (NftType::Mark, Value::Mark(m)) => {
            single(if hton { m.to_be_bytes().to_vec() } else { m.to_ne_bytes().to_vec() })
        }
        _ => Err(mismatch()),
    }
}

/// The inverse of [`encode_component`].
pub(crate) fn decode_component(ty: NftType, start: &[u8], end: &[u8], hton: bool) -> Result<NftValue, NftError> {
    let bad = || NftError::Decode { what: format!("element value {start:02x?} does not fit {}", ty.as_str_name()) };
    let value = match ty {
        // A verdict is no value: see `encode::put_element` and `decode::elements`.
        NftType::Unspecified | NftType::Verdict => return Err(bad()),
        NftType::Ifname => {
            let s = start.split(|b| *b == 0).next().unwrap_or_default();
            Value::Ifname(String::from_utf8(s.to_vec()).map_err(|_| bad())?)
        }
        NftType::Ipv4Addr | NftType::Ipv6Addr => {
            let a = addr_from_bytes(start).ok_or_else(bad)?;
            // The end is the last address of a prefix: the mask is where start and end agree.
            let m: Vec<u8> = start.iter().zip(end).map(|(s, e)| !(s ^ e)).collect();
            let len = mask_len(&m).ok_or_else(bad)?;
            Value::Addr(prefix_text(a, len))
        }
        NftType::InetProto => Value::Proto(proto_from_byte(*start.first().ok_or_else(bad)?).ok_or_else(bad)? as i32),
        NftType::InetService => {
            let f = u16::from_be_bytes(start.get(..2).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
            let l = u16::from_be_bytes(end.get(..2).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
            Value::Port(PortRange { first: u32::from(f), last: u32::from(l) })
        }
        NftType::Mark => {
            let b: [u8; 4] = start.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?;
            Value::Mark(if hton { u32::from_be_bytes(b) } else { u32::from_ne_bytes(b) })
        }
    };
    Ok(NftValue { value: Some(value) })
}

/// A verdict's code and chain, as an immediate or a verdict map's data carries them: jump and
/// goto need a chain, the others have none.
pub(crate) fn verdict_code(object: &str, v: &Verdict) -> Result<(i32, Option<String>), NftError> {
    let chain =
        || (!v.chain.is_empty()).then(|| v.chain.clone()).ok_or_else(|| invalid(object, "jump/goto needs a chain"));
    Ok(match VerdictKind::try_from(v.kind) {
        Ok(VerdictKind::Accept) => (NF_ACCEPT, None),
        Ok(VerdictKind::Drop) => (NF_DROP, None),
        Ok(VerdictKind::Return) => (NFT_RETURN, None),
        Ok(VerdictKind::Jump) => (NFT_JUMP, Some(chain()?)),
        Ok(VerdictKind::Goto) => (NFT_GOTO, Some(chain()?)),
        _ => return Err(invalid(object, "unknown verdict")),
    })
}

/// The inverse of [`verdict_code`]; None for a code outside kuport's verdicts.
pub(crate) fn verdict_of(code: i32, chain: Option<&str>) -> Option<Verdict> {
    let kind = match code {
        NF_ACCEPT => VerdictKind::Accept,
        NF_DROP => VerdictKind::Drop,
        NFT_RETURN => VerdictKind::Return,
        NFT_JUMP => VerdictKind::Jump,
        NFT_GOTO => VerdictKind::Goto,
        _ => return None,
    };
    let chain = if matches!(kind, VerdictKind::Jump | VerdictKind::Goto) { chain?.to_string() } else { String::new() };
    Some(Verdict { kind: kind as i32, chain })
}

/// Where a selector's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Meta(u32),
    Ct(u32),
    Payload(u32, u32),
}

/// What nft knows about a selector.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SelInfo {
    pub(crate) source: Source,
    /// Bytes loaded.
    pub(crate) len: u32,
    /// The set type its values have, when it may be a set key.
    pub(crate) ty: Option<NftType>,
    /// Host-endian values, converted to network order in interval concatenations:
    /// nft's byteorder (len, size).
    pub(crate) hton: Option<(u32, u32)>,
    /// The transport protocol the selector implies (tcp/udp ports).
    pub(crate) l4dep: Option<u8>,
}

pub(crate) fn sel_info(sel: Selector) -> Option<SelInfo> {
    use Selector as S;
    let meta = |key, len, ty, hton| SelInfo { source: Source::Meta(key), len, ty, hton, l4dep: None };
    let net = |off, len, ty| SelInfo {
        source: Source::Payload(NFT_PAYLOAD_NETWORK_HEADER, off),
        len,
        ty: Some(ty),
        hton: None,
        l4dep: None,
    };
    let th = |off, dep| SelInfo {
        source: Source::Payload(NFT_PAYLOAD_TRANSPORT_HEADER, off),
        len: 2,
        ty: Some(NftType::InetService),
        hton: None,
        l4dep: dep,
    };
    Some(match sel {
        S::Unspecified => return None,
        S::Iifname => meta(NFT_META_IIFNAME, IFNAMSIZ as u32, Some(NftType::Ifname), None),
        S::Oifname => meta(NFT_META_OIFNAME, IFNAMSIZ as u32, Some(NftType::Ifname), None),
        S::L4proto => meta(NFT_META_L4PROTO, 1, Some(NftType::InetProto), Some((1, 2))),
        S::MetaMark => meta(NFT_META_MARK, 4, Some(NftType::Mark), Some((4, 4))),
        S::MetaSkuid => meta(NFT_META_SKUID, 4, None, Some((4, 4))),
        S::MetaSkgid => meta(NFT_META_SKGID, 4, None, Some((4, 4))),
        S::CtMark => SelInfo {
            source: Source::Ct(NFT_CT_MARK),
            len: 4,
            ty: Some(NftType::Mark),
            hton: Some((4, 4)),
            l4dep: None,
        },
        // One byte: IP_CT_DIR_ORIGINAL 0, IP_CT_DIR_REPLY 1.
        S::CtDirection => SelInfo { source: Source::Ct(NFT_CT_DIRECTION), len: 1, ty: None, hton: None, l4dep: None },
        S::IpSaddr => net(IPV4_SADDR_OFFSET, 4, NftType::Ipv4Addr),
        S::IpDaddr => net(IPV4_DADDR_OFFSET, 4, NftType::Ipv4Addr),
        S::Ip6Saddr => net(IPV6_SADDR_OFFSET, 16, NftType::Ipv6Addr),
        S::Ip6Daddr => net(IPV6_DADDR_OFFSET, 16, NftType::Ipv6Addr),
        S::ThSport => th(TH_SPORT_OFFSET, None),
        S::ThDport => th(TH_DPORT_OFFSET, None),
        S::TcpSport => th(TH_SPORT_OFFSET, Some(IPPROTO_TCP)),
        S::TcpDport => th(TH_DPORT_OFFSET, Some(IPPROTO_TCP)),
        S::UdpSport => th(TH_SPORT_OFFSET, Some(IPPROTO_UDP)),
        S::UdpDport => th(TH_DPORT_OFFSET, Some(IPPROTO_UDP)),
    })
}

/// The network family (NFPROTO_IPV4 or NFPROTO_IPV6) of an address selector.
pub(crate) fn addr_family(sel: Selector) -> Option<u8> {
    match sel {
        Selector::IpSaddr | Selector::IpDaddr => Some(NFPROTO_IPV4),
        Selector::Ip6Saddr | Selector::Ip6Daddr => Some(NFPROTO_IPV6),
        _ => None,
    }
}

/// The network family of a load from an address field: the whole address or, for a compare
/// with a byte-aligned prefix, its first bytes (each address field starts at its own offset).
pub(crate) fn addr_family_of_source(src: Source) -> Option<u8> {
    [Selector::IpSaddr, Selector::IpDaddr, Selector::Ip6Saddr, Selector::Ip6Daddr]
        .into_iter()
        .find(|s| sel_info(*s).is_some_and(|i| i.source == src))
        .and_then(addr_family)
}

/// The selector a load reads, when it is one of kuport's (transport ports decode as th).
pub(crate) fn sel_of_source(src: Source, len: u32) -> Option<Selector> {
    use Selector as S;
    [
        S::Iifname,
        S::Oifname,
        S::L4proto,
        S::MetaMark,
        S::MetaSkuid,
        S::MetaSkgid,
        S::CtMark,
        S::CtDirection,
        S::IpSaddr,
        S::IpDaddr,
        S::Ip6Saddr,
        S::Ip6Daddr,
        S::ThSport,
        S::ThDport,
    ]
    .into_iter()
    .find(|s| sel_info(*s).is_some_and(|i| i.source == src && i.len == len))
}
