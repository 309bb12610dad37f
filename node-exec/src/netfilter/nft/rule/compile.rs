//! Compiling a model rule (typed matches and statements) into expressions, the way nft 1.0.6
//! compiles the equivalent text.

use std::collections::HashMap;

use kuport_proto::v1::{
    CmpOp, Compare, MapLookup, NatKind, NftFamily, NftRule, NftStatement, NftType, Selector, SetUpdate, TcpFlags, nat,
    nft_match, nft_statement, nft_value::Value, redirect, set_mark, set_update,
};

use crate::netfilter::nft::NftError;
use crate::netfilter::nft::consts::*;
use crate::netfilter::nft::expr::{Expr, Imm, Stateful, reg_of_slot};
use crate::netfilter::nft::value::*;

/// What a rule needs to know about a set it reads.
#[derive(Debug, Clone)]
pub(crate) struct SetRef {
    pub(crate) key: Vec<NftType>,
    pub(crate) data: Vec<NftType>,
    pub(crate) interval: bool,
    /// `flags dynamic`: what `update`/`add` statements may write.
    pub(crate) dynamic: bool,
    /// The batch-local id when the set is created in the same batch as the rule.
    pub(crate) id: Option<u32>,
}

/// The table a rule lives in.
#[derive(Debug, Clone)]
pub(crate) struct RuleCtx {
    pub(crate) family: NftFamily,
    pub(crate) sets: HashMap<String, SetRef>,
}

fn invalid(object: &str, reason: impl Into<String>) -> NftError {
    NftError::Invalid { object: object.to_string(), reason: reason.into() }
}

fn load(src: Source, len: u32, dreg: u32) -> Expr {
    match src {
        Source::Meta(key) => Expr::Meta { key, dreg },
        Source::Ct(key) => Expr::Ct { key, dreg },
        Source::Payload(base, offset) => Expr::Payload { base, offset, len, dreg },
    }
}

fn sel(object: &str, s: i32) -> Result<(Selector, SelInfo), NftError> {
    let s = Selector::try_from(s).map_err(|_| invalid(object, format!("unknown selector {s}")))?;
    let i = sel_info(s).ok_or_else(|| invalid(object, "unspecified selector"))?;
    Ok((s, i))
}

/// The protocols a rule's earlier expressions already guarantee, so that nft's dependencies
/// are emitted once, where nft emits them.
#[derive(Debug, Default)]
struct Deps {
    /// The transport protocol an earlier `meta l4proto == P` guarantees.
    l4: Option<u8>,
    /// The network family an earlier `meta nfproto == F` guarantees (inet tables only).
    l3: Option<u8>,
}

/// Compiles a rule.
pub(crate) fn compile(rule: &NftRule, ctx: &RuleCtx, object: &str) -> Result<Vec<Expr>, NftError> {
    let mut out = Vec::new();
    let mut deps = Deps::default();
    for m in &rule.matches {
        match m.kind.as_ref().ok_or_else(|| invalid(object, "empty match"))? {
            nft_match::Kind::Compare(c) => {
                let (s, info) = sel(object, c.selector)?;
                check_family(object, ctx, s)?;
                dep(&mut out, &mut deps.l4, info.l4dep);
                nfproto_dep(&mut out, &mut deps.l3, ctx, object, s)?;
                compile_compare(&mut out, object, c, s, info)?;
                if s == Selector::L4proto
                    && c.op == CmpOp::Eq as i32
                    && let Some(Value::Proto(p)) = c.value.as_ref().and_then(value_of)
                {
                    deps.l4 = Some(proto_byte(object, *p)?);
                }
            }
            nft_match::Kind::Literal(l) => {
                let (s, info) = sel(object, l.selector)?;
                check_family(object, ctx, s)?;
                let key = info.ty.ok_or_else(|| invalid(object, format!("{} cannot be a set key", s.as_str_name())))?;
                if l.values.is_empty() {
                    return Err(invalid(object, "an empty literal set"));
                }
                dep(&mut out, &mut deps.l4, info.l4dep);
                nfproto_dep(&mut out, &mut deps.l3, ctx, object, s)?;
                out.push(load(info.source, info.len, NFT_REG_1));
                let mut values = l.values.clone();
                kuport_proto::canonical::sort_values(&mut values);
                out.push(Expr::Literal { sreg: NFT_REG_1, key, values, negate: l.negate, set_id: None });
            }
            nft_match::Kind::TcpFlags(f) => {
                let (value, mask) = tcp_flags(object, f)?;
                dep(&mut out, &mut deps.l4, Some(IPPROTO_TCP));
                out.push(Expr::Payload {
                    base: NFT_PAYLOAD_TRANSPORT_HEADER,
                    offset: TCP_FLAGS_OFFSET,
                    len: 1,
                    dreg: NFT_REG_1,
                });
                // nft compares the whole byte without a bitwise.
                if mask != 0xff {
                    out.push(Expr::Bitwise {
                        sreg: NFT_REG_1,
                        dreg: NFT_REG_1,
                        len: 1,
                        mask: vec![mask],
                        xor: vec![0],
                        with_op: true,
                    });
                }
                out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: vec![value] });
            }
            nft_match::Kind::CtState(c) => {
                // What nft sends for `ct state new`: the state bits under the mask, not zero.
                if c.states == 0 || c.states & !CT_STATES != 0 {
                    return Err(invalid(
                        object,
                        format!(
                            "ct state {:#x}: bits of invalid 1, established 2, related 4, new 8, untracked 64",
                            c.states
                        ),
                    ));
                }
                out.push(Expr::Ct { key: NFT_CT_STATE, dreg: NFT_REG_1 });
                out.push(Expr::Bitwise {
                    sreg: NFT_REG_1,
                    dreg: NFT_REG_1,
                    len: 4,
                    mask: c.states.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                    with_op: false,
                });
                out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_NEQ, data: vec![0; 4] });
            }
            nft_match::Kind::Lookup(l) => {
                let set = set_ref(ctx, object, &l.set)?;
                if !set.data.is_empty() {
                    return Err(invalid(object, format!("@{} is a map, not a set", l.set)));
                }
                key_loads(&mut out, &mut deps, ctx, object, &l.key, set)?;
                out.push(Expr::Lookup {
                    sreg: NFT_REG_1,
                    dreg: None,
                    set: l.set.clone(),
                    set_id: set.id,
                    flags: if l.negate { NFT_LOOKUP_F_INV } else { 0 },
                });
            }
        }
    }
    for s in &rule.statements {
        compile_statement(&mut out, &mut deps, ctx, object, s)?;
    }
    Ok(out)
}

/// The `ct state` bits kuport knows: invalid, established, related, new, untracked.
pub(crate) const CT_STATES: u32 = 0x01 | 0x02 | 0x04 | 0x08 | 0x40;

/// A `tcp flags` match's (value, mask) as bytes: a mask of 1 to 0xff and a value inside it.
fn tcp_flags(object: &str, f: &TcpFlags) -> Result<(u8, u8), NftError> {
    let mask = u8::try_from(f.mask).ok().filter(|m| *m != 0);
    let value = u8::try_from(f.value).ok();
    match (value, mask) {
        (Some(v), Some(m)) if v & !m == 0 => Ok((v, m)),
        _ => Err(invalid(
            object,
            format!("tcp flags {:#x} / {:#x}: a mask of 1 to 0xff and a value inside it", f.value, f.mask),
        )),
    }
}

fn check_family(object: &str, ctx: &RuleCtx, s: Selector) -> Result<(), NftError> {
    match (ctx.family, addr_family(s)) {
        (NftFamily::Ip, Some(NFPROTO_IPV6)) => Err(invalid(object, "ip6 selector in an ip table")),
        (NftFamily::Ip6, Some(NFPROTO_IPV4)) => Err(invalid(object, "ip selector in an ip6 table")),
        _ => Ok(()),
    }
}

/// nft's network dependency: in an inet table, `meta nfproto ipv4|ipv6` before the first load
/// of an address field, once per rule (docs/overlay/filter.md). nft refuses an ip and an ip6
/// selector in one rule ("conflicting protocols"), and so does this.
fn nfproto_dep(
    out: &mut Vec<Expr>,
    l3: &mut Option<u8>,
    ctx: &RuleCtx,
    object: &str,
    s: Selector,
) -> Result<(), NftError> {
    let Some(f) = addr_family(s).filter(|_| ctx.family == NftFamily::Inet) else {
        return Ok(());
    };
    match *l3 {
        Some(have) if have == f => Ok(()),
        Some(_) => Err(invalid(object, "ip and ip6 selectors in one rule (nft: conflicting protocols)")),
        None => {
            out.push(Expr::Meta { key: NFT_META_NFPROTO, dreg: NFT_REG_1 });
            out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: vec![f] });
            *l3 = Some(f);
            Ok(())
        }
    }
}

/// nft's protocol dependency: `meta l4proto P` before a tcp/udp header field.
fn dep(out: &mut Vec<Expr>, l4: &mut Option<u8>, need: Option<u8>) {
    if let Some(p) = need
        && *l4 != Some(p)
    {
        out.push(Expr::Meta { key: NFT_META_L4PROTO, dreg: NFT_REG_1 });
        out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: vec![p] });
        *l4 = Some(p);
    }
}

fn set_ref<'a>(ctx: &'a RuleCtx, object: &str, name: &str) -> Result<&'a SetRef, NftError> {
    ctx.sets.get(name).ok_or_else(|| invalid(object, format!("set @{name} does not exist")))
}

/// Loads a concatenation into consecutive register words, as a set key. Every component's
/// dependencies come first, in component order, as nft emits them.
fn key_loads(
    out: &mut Vec<Expr>,
    deps: &mut Deps,
    ctx: &RuleCtx,
    object: &str,
    keys: &[i32],
    set: &SetRef,
) -> Result<(), NftError> {
    if keys.len() != set.key.len() {
        return Err(invalid(object, format!("key has {} components, the set {}", keys.len(), set.key.len())));
    }
    let infos = keys.iter().map(|k| sel(object, *k)).collect::<Result<Vec<_>, _>>()?;
    for ((s, info), ty) in infos.iter().zip(&set.key) {
        check_family(object, ctx, *s)?;
        if info.ty != Some(*ty) {
            return Err(invalid(object, format!("{} does not give a {}", s.as_str_name(), ty.as_str_name())));
        }
        dep(out, &mut deps.l4, info.l4dep);
        nfproto_dep(out, &mut deps.l3, ctx, object, *s)?;
    }
    let concat_interval = set.interval && keys.len() > 1;
    let mut slot = 0;
    for (_, info) in &infos {
        let reg = reg_of_slot(slot);
        out.push(load(info.source, info.len, reg));
        if let (true, Some((len, size))) = (concat_interval, info.hton) {
            out.push(Expr::Byteorder { sreg: reg, dreg: reg, op: NFT_BYTEORDER_HTON, len, size });
        }
        slot += padded(info.len) / 4;
    }
    Ok(())
}

fn map_lookup<'a>(
    out: &mut Vec<Expr>,
    deps: &mut Deps,
    ctx: &'a RuleCtx,
    object: &str,
    m: &MapLookup,
) -> Result<&'a SetRef, NftError> {
    let set = set_ref(ctx, object, &m.map)?;
    if set.data.is_empty() {
        return Err(invalid(object, format!("@{} is a set, not a map", m.map)));
    }
    key_loads(out, deps, ctx, object, &m.key, set)?;
    out.push(Expr::Lookup { sreg: NFT_REG_1, dreg: Some(NFT_REG_1), set: m.map.clone(), set_id: set.id, flags: 0 });
    Ok(set)
}

fn compile_compare(out: &mut Vec<Expr>, object: &str, c: &Compare, s: Selector, info: SelInfo) -> Result<(), NftError> {
    let op = match CmpOp::try_from(c.op) {
        Ok(CmpOp::Eq) => NFT_CMP_EQ,
        Ok(CmpOp::Neq) => NFT_CMP_NEQ,
        Err(_) => return Err(invalid(object, format!("unknown compare op {}", c.op))),
    };
    let v = c.value.as_ref().and_then(value_of).ok_or_else(|| invalid(object, "compare without a value"))?;
    let is_mark = matches!(s, Selector::MetaMark | Selector::CtMark);
    if c.mask != 0 && !is_mark {
        return Err(invalid(object, "a mask is only valid on marks"));
    }
    let r1 = NFT_REG_1;
    let mismatch = || invalid(object, format!("{} cannot be compared with {v:?}", s.as_str_name()));
    match (info.ty, v) {
        (Some(NftType::Ifname), Value::Ifname(name)) => {
            let data = match name.strip_suffix('*') {
                Some(prefix) if !prefix.is_empty() && prefix.len() < IFNAMSIZ && !prefix.contains('*') => {
                    prefix.as_bytes().to_vec()
                }
                Some(_) => return Err(invalid(object, format!("bad interface wildcard {name:?}"))),
                None => ifname_bytes(object, name)?,
            };
            out.push(load(info.source, info.len, r1));
            out.push(Expr::Cmp { sreg: r1, op, data });
        }
        (Some(NftType::InetProto), Value::Proto(p)) => {
            out.push(load(info.source, info.len, r1));
            out.push(Expr::Cmp { sreg: r1, op, data: vec![proto_byte(object, *p)?] });
        }
        (Some(NftType::Ipv4Addr | NftType::Ipv6Addr), Value::Addr(text)) => {
            let (a, len) = parse_prefix(object, text)?;
            let b = addr_bytes(a);
            if b.len() as u32 != info.len {
                return Err(mismatch());
            }
            let full = (b.len() * 8) as u8;
            let mask = mask_bytes(b.len(), len);
            if b.iter().zip(&mask).any(|(x, m)| x & !m != 0) {
                return Err(invalid(object, format!("prefix {text} has host bits set")));
            }
            if len == 0 {
                return Err(NftError::Unsupported {
                    object: object.to_string(),
                    what: "a /0 prefix (it matches everything)".into(),
                });
            } else if len == full {
                out.push(load(info.source, info.len, r1));
                out.push(Expr::Cmp { sreg: r1, op, data: b });
            } else if len % 8 == 0 {
                // nft loads only the prefix's whole bytes.
                let n = usize::from(len / 8);
                out.push(load(info.source, n as u32, r1));
                out.push(Expr::Cmp { sreg: r1, op, data: b[..n].to_vec() });
            } else {
                out.push(load(info.source, info.len, r1));
                out.push(Expr::Bitwise {
                    sreg: r1,
                    dreg: r1,
                    len: info.len,
                    mask,
                    xor: vec![0; b.len()],
                    with_op: false,
                });
                out.push(Expr::Cmp { sreg: r1, op, data: b });
            }
        }
        (Some(NftType::InetService), Value::Port(r)) => {
            let (f, l) = port_range(object, r)?;
            out.push(load(info.source, info.len, r1));
            if f == l {
                out.push(Expr::Cmp { sreg: r1, op, data: f.to_be_bytes().to_vec() });
            } else if op == NFT_CMP_EQ {
                out.push(Expr::Cmp { sreg: r1, op: NFT_CMP_GTE, data: f.to_be_bytes().to_vec() });
                out.push(Expr::Cmp { sreg: r1, op: NFT_CMP_LTE, data: l.to_be_bytes().to_vec() });
            } else {
                out.push(Expr::Range {
                    sreg: r1,
                    op: NFT_RANGE_NEQ,
                    from: f.to_be_bytes().to_vec(),
                    to: l.to_be_bytes().to_vec(),
                });
            }
        }
        (Some(NftType::Mark), Value::Mark(m)) => {
            out.push(load(info.source, info.len, r1));
            if c.mask != 0 {
                out.push(Expr::Bitwise {
                    sreg: r1,
                    dreg: r1,
                    len: 4,
                    mask: c.mask.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                    with_op: true,
                });
            }
            out.push(Expr::Cmp { sreg: r1, op, data: m.to_ne_bytes().to_vec() });
        }
        (None, Value::Id(id)) if s == Selector::CtDirection => {
            let dir = u8::try_from(*id).ok().filter(|d| *d <= 1);
            let dir = dir.ok_or_else(|| invalid(object, format!("ct direction {id}: 0 (original) or 1 (reply)")))?;
            out.push(load(info.source, info.len, r1));
            out.push(Expr::Cmp { sreg: r1, op, data: vec![dir] });
        }
        (None, Value::Id(id)) if matches!(s, Selector::MetaSkuid | Selector::MetaSkgid) => {
            out.push(load(info.source, info.len, r1));
            out.push(Expr::Cmp { sreg: r1, op, data: id.to_ne_bytes().to_vec() });
        }
        _ => return Err(mismatch()),
    }
    Ok(())
}

fn nat_family(object: &str, ctx: &RuleCtx, f: i32) -> Result<u32, NftError> {
    match (NftFamily::try_from(f).unwrap_or(NftFamily::Unspecified), ctx.family) {
        (NftFamily::Ip, _) | (NftFamily::Unspecified, NftFamily::Ip) => Ok(u32::from(NFPROTO_IPV4)),
        (NftFamily::Ip6, _) | (NftFamily::Unspecified, NftFamily::Ip6) => Ok(u32::from(NFPROTO_IPV6)),
        _ => Err(invalid(object, "nat needs an ip or ip6 family")),
    }
}

fn compile_statement(
    out: &mut Vec<Expr>,
    deps: &mut Deps,
    ctx: &RuleCtx,
    object: &str,
    s: &NftStatement,
) -> Result<(), NftError> {
    let r1 = NFT_REG_1;
    match s.kind.as_ref().ok_or_else(|| invalid(object, "empty statement"))? {
        nft_statement::Kind::Counter(_) => out.push(Expr::Counter),
        nft_statement::Kind::Nat(n) => {
            let kind = match NatKind::try_from(n.kind) {
                Ok(NatKind::Snat) => NFT_NAT_SNAT,
                Ok(NatKind::Dnat) => NFT_NAT_DNAT,
                _ => return Err(invalid(object, "nat without snat/dnat")),
            };
            let family = nat_family(object, ctx, n.family)?;
            let addr_len = if family == u32::from(NFPROTO_IPV4) { 4 } else { 16 };
            let mut e = Expr::Nat { kind, family, addr_min: Some(r1), proto_min: None, proto_max: None, flags: None };
            match n.to.as_ref().ok_or_else(|| invalid(object, "nat without a target"))? {
                nat::To::Target(t) => {
                    if t.addr.is_empty() {
                        return Err(NftError::Unsupported {
                            object: object.to_string(),
                            what: "nat to a port without an address".into(),
                        });
                    }
                    let (a, len) = parse_prefix(object, &t.addr)?;
                    let b = addr_bytes(a);
                    if b.len() != addr_len || usize::from(len) != addr_len * 8 {
                        return Err(invalid(object, format!("nat address {} does not fit the nat family", t.addr)));
                    }
                    out.push(Expr::Immediate { dreg: r1, data: Imm::Value(b) });
                    if let (Some(p), Expr::Nat { proto_min, proto_max, flags, .. }) = (&t.port, &mut e) {
                        let (f, l) = port_range(object, p)?;
                        out.push(Expr::Immediate { dreg: 2, data: Imm::Value(f.to_be_bytes().to_vec()) });
                        *proto_min = Some(2);
                        if l != f {
                            out.push(Expr::Immediate { dreg: 3, data: Imm::Value(l.to_be_bytes().to_vec()) });
                            *proto_max = Some(3);
                        }
                        *flags = Some(NF_NAT_RANGE_PROTO_SPECIFIED);
                    }
                }
                nat::To::Selector(sl) => {
                    let (s, info) = sel(object, *sl)?;
                    if info.len as usize != addr_len || !matches!(info.ty, Some(NftType::Ipv4Addr | NftType::Ipv6Addr))
                    {
                        return Err(invalid(
                            object,
                            format!("nat to {} needs an address of the nat family", s.as_str_name()),
                        ));
                    }
                    check_family(object, ctx, s)?;
                    nfproto_dep(out, &mut deps.l3, ctx, object, s)?;
                    out.push(load(info.source, info.len, r1));
                }
                nat::To::Map(m) => {
                    let set = map_lookup(out, deps, ctx, object, m)?;
                    let want_addr = if addr_len == 4 { NftType::Ipv4Addr } else { NftType::Ipv6Addr };
                    match set.data.as_slice() {
                        [a] if *a == want_addr => {}
                        [a, NftType::InetService] if *a == want_addr => {
                            if let Expr::Nat { proto_min, .. } = &mut e {
                                *proto_min = Some(reg_of_slot(padded(addr_len as u32) / 4));
                            }
                        }
                        _ => return Err(invalid(object, format!("@{} does not map to an address (and port)", m.map))),
                    }
                }
            }
            out.push(e);
        }
        nft_statement::Kind::Redirect(r) => {
            match r.to.as_ref().ok_or_else(|| invalid(object, "redirect without a target"))? {
                redirect::To::Port(p) => {
                    let (f, l) = port_range(object, p)?;
                    out.push(Expr::Immediate { dreg: r1, data: Imm::Value(f.to_be_bytes().to_vec()) });
                    let mut max = None;
                    if l != f {
                        out.push(Expr::Immediate { dreg: 2, data: Imm::Value(l.to_be_bytes().to_vec()) });
                        max = Some(2);
                    }
                    out.push(Expr::Redir {
                        proto_min: Some(r1),
                        proto_max: max,
                        flags: Some(NF_NAT_RANGE_PROTO_SPECIFIED),
                    });
                }
                redirect::To::Map(m) => {
                    let set = map_lookup(out, deps, ctx, object, m)?;
                    if set.data != [NftType::InetService] {
                        return Err(invalid(object, format!("@{} does not map to a port", m.map)));
                    }
                    out.push(Expr::Redir {
                        proto_min: Some(r1),
                        proto_max: None,
                        flags: Some(NF_NAT_RANGE_PROTO_SPECIFIED),
                    });
                }
            }
        }
        nft_statement::Kind::MetaMarkSet(m) | nft_statement::Kind::CtMarkSet(m) => {
            let ct = matches!(s.kind, Some(nft_statement::Kind::CtMarkSet(_)));
            match m.from.as_ref().ok_or_else(|| invalid(object, "mark set without a value"))? {
                set_mark::From::Value(v) => {
                    out.push(Expr::Immediate { dreg: r1, data: Imm::Value(v.to_ne_bytes().to_vec()) })
                }
                set_mark::From::Map(map) => {
                    let set = map_lookup(out, deps, ctx, object, map)?;
                    if set.data != [NftType::Mark] {
                        return Err(invalid(object, format!("@{} does not map to a mark", map.map)));
                    }
                }
                set_mark::From::Selector(sl) => {
                    let (s, info) = sel(object, *sl)?;
                    if !matches!(s, Selector::MetaMark | Selector::CtMark) {
                        return Err(invalid(object, "a mark can only be set from meta mark or ct mark"));
                    }
                    out.push(load(info.source, info.len, r1));
                }
            }
            out.push(if ct {
                Expr::CtSet { key: NFT_CT_MARK, sreg: r1 }
            } else {
                Expr::MetaSet { key: NFT_META_MARK, sreg: r1 }
            });
        }
        nft_statement::Kind::AddressSet(a) => {
            // What nft sends for `ip daddr set K map @m` / `ip6 daddr set K map @m`: the
            // lookup, then a payload write over the destination. IPv4 updates its header
            // checksum (at offset 10) and the transport checksum's pseudo-header part; IPv6 has
            // no header checksum, so nft asks only for the pseudo-header part (docs/portmap/
            // firewall.md, "Checksums"). In an inet table the write's `meta nfproto` comes
            // first, before the key's own dependencies, as nft emits it.
            let (s, info) = sel(object, a.selector)?;
            let (want, csum_type, csum_offset) = match (s, ctx.family) {
                (Selector::IpDaddr, NftFamily::Ip | NftFamily::Inet) => {
                    (NftType::Ipv4Addr, NFT_PAYLOAD_CSUM_INET, IPV4_CSUM_OFFSET)
                }
                (Selector::Ip6Daddr, NftFamily::Ip6 | NftFamily::Inet) => (NftType::Ipv6Addr, NFT_PAYLOAD_CSUM_NONE, 0),
                _ => {
                    return Err(NftError::Unsupported {
                        object: object.to_string(),
                        what: format!("{} set in a table of this family", s.as_str_name()),
                    });
                }
            };
            let m = a.map.as_ref().ok_or_else(|| invalid(object, "address set without a map"))?;
            nfproto_dep(out, &mut deps.l3, ctx, object, s)?;
            let set = map_lookup(out, deps, ctx, object, m)?;
            if set.data != [want] {
                let what = if want == NftType::Ipv4Addr { "an IPv4" } else { "an IPv6" };
                return Err(invalid(object, format!("@{} does not map to {what} address", m.map)));
            }
            let Source::Payload(base, offset) = info.source else {
                return Err(invalid(object, "address set of a field outside the packet"));
            };
            out.push(Expr::PayloadSet {
                base,
                offset,
                len: info.len,
                sreg: r1,
                csum_type,
                csum_offset,
                csum_flags: NFT_PAYLOAD_L4CSUM_PSEUDOHDR,
            });
        }
        nft_statement::Kind::TcpMssClamp(_) => {
            // What nft sends for `tcp option maxseg size set rt mtu`: the route's MSS, in
            // network order, written over the option's value. No protocol dependency: the
            // kernel leaves a packet that is not TCP, or has no MSS option, alone.
            out.push(Expr::Rt { key: NFT_RT_TCPMSS, dreg: r1 });
            out.push(Expr::Byteorder { sreg: r1, dreg: r1, op: NFT_BYTEORDER_HTON, len: 2, size: 2 });
            out.push(Expr::ExthdrSet {
                op: NFT_EXTHDR_OP_TCPOPT,
                ty: TCPOPT_MAXSEG,
                offset: TCPOPT_MAXSEG_OFFSET,
                len: TCPOPT_MAXSEG_LEN,
                sreg: r1,
            });
        }
        nft_statement::Kind::Verdict(v) => {
            let (code, chain) = verdict_code(object, v)?;
            out.push(Expr::Immediate { dreg: NFT_REG_VERDICT, data: Imm::Verdict { code, chain } });
        }
        nft_statement::Kind::VerdictMap(m) => {
            // `KEY vmap @m`: the lookup writes the verdict register itself.
            let set = set_ref(ctx, object, &m.map)?;
            if set.data != [NftType::Verdict] {
                return Err(invalid(object, format!("@{} is not a verdict map", m.map)));
            }
            key_loads(out, deps, ctx, object, &m.key, set)?;
            out.push(Expr::Lookup {
                sreg: NFT_REG_1,
                dreg: Some(NFT_REG_VERDICT),
                set: m.map.clone(),
                set_id: set.id,
                flags: 0,
            });
        }
        nft_statement::Kind::SetUpdate(u) => compile_set_update(out, deps, ctx, object, u)?,
    }
    Ok(())
}

/// `update @s { KEY . TAG limit ... }` / `add @s { KEY . TAG ct count ... }` as nft 1.0.6 sends
/// it: the key's loads (each component's dependencies first), the tag as an immediate into the
/// next register word, then the dynset with its expression.
fn compile_set_update(
    out: &mut Vec<Expr>,
    deps: &mut Deps,
    ctx: &RuleCtx,
    object: &str,
    u: &SetUpdate,
) -> Result<(), NftError> {
    let set = set_ref(ctx, object, &u.set)?;
    if !set.dynamic || !set.data.is_empty() || set.interval {
        return Err(invalid(object, format!("@{} is not a dynamic set (flags dynamic, no data, no interval)", u.set)));
    }
    let (op, expr) = match u.stateful.as_ref().ok_or_else(|| invalid(object, "update without a limit or ct count"))? {
        set_update::Stateful::Limit(l) => {
            if l.rate == 0 || l.burst == 0 {
                return Err(invalid(
                    object,
                    format!("limit rate {}/second burst {}: neither may be 0", l.rate, l.burst),
                ));
            }
            (NFT_DYNSET_OP_UPDATE, Stateful::Limit { rate: l.rate, burst: l.burst, over: l.over })
        }
        set_update::Stateful::CtCount(c) => (NFT_DYNSET_OP_ADD, Stateful::Connlimit { count: c.count, over: c.over }),
    };
    let want = set.key.len();
    let have = u.key.len() + usize::from(u.tag.is_some());
    if u.key.is_empty() || have != want {
        return Err(invalid(object, format!("key has {have} components, the set {want}")));
    }
    if u.tag.is_some() && set.key.last() != Some(&NftType::Mark) {
        return Err(invalid(object, format!("@{}: a tag needs a mark as the key's last component", u.set)));
    }
    let infos = u.key.iter().map(|k| sel(object, *k)).collect::<Result<Vec<_>, _>>()?;
    for ((s, info), ty) in infos.iter().zip(&set.key) {
        check_family(object, ctx, *s)?;
        if info.ty != Some(*ty) {
            return Err(invalid(object, format!("{} does not give a {}", s.as_str_name(), ty.as_str_name())));
        }
        dep(out, &mut deps.l4, info.l4dep);
        nfproto_dep(out, &mut deps.l3, ctx, object, *s)?;
    }
    let mut slot = 0;
    for (_, info) in &infos {
        out.push(load(info.source, info.len, reg_of_slot(slot)));
        slot += padded(info.len) / 4;
    }
    if let Some(tag) = u.tag {
        out.push(Expr::Immediate { dreg: reg_of_slot(slot), data: Imm::Value(tag.to_ne_bytes().to_vec()) });
    }
    out.push(Expr::Dynset { sreg_key: NFT_REG_1, op, set: u.set.clone(), set_id: set.id, expr });
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Decompiling
// ------------------------------------------------------------------------------------------
