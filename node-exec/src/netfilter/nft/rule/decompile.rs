//! Decompiling expressions (a rule read back from the kernel) into the model rule nft would print.

use kuport_proto::v1::{
    AddressSet, CmpOp, Compare, ConnLimit, Counter, CtState, Limit, LiteralSet, MapLookup, Nat, NatKind, NatTarget,
    NftFamily, NftMatch, NftRule, NftStatement, NftType, NftValue, PortRange, Redirect, Selector, SetLookup, SetMark,
    SetUpdate, TcpFlags, TcpMssClamp, VerdictMap, nat, nft_match, nft_statement, nft_value::Value, redirect, set_mark,
    set_update,
};

use crate::netfilter::nft::NftError;
use crate::netfilter::nft::consts::*;
use crate::netfilter::nft::expr::{Expr, Imm, Stateful, reg_of_slot, slot_of_reg};
use crate::netfilter::nft::rule::compile::CT_STATES;
use crate::netfilter::nft::value::*;

fn shape(object: &str, why: &str) -> NftError {
    NftError::Decode { what: format!("{object}: {why}") }
}

/// A value waiting in a register for the expression that consumes it.
#[derive(Debug)]
enum Pending {
    Load { slot: u32, src: Source, len: u32 },
    Imm { reg: u32, data: Vec<u8> },
}

/// nft's network dependency in an inet table (`meta nfproto ipv4|ipv6` before the rule's
/// first address load), as the decompiler meets it.
#[derive(Debug, Default)]
struct Nfproto {
    /// The family the dependency guarantees from where it stands.
    family: Option<u8>,
    /// Read, and no address load has used it yet.
    unused: bool,
}

impl Nfproto {
    /// Absorbs `meta load nfproto => reg R; cmp eq reg R F` at the head of `rest`, exactly as
    /// compile writes it; anything else is refused, so a hand-made change reads as a
    /// difference instead of as kuport's rule.
    fn absorb(&mut self, object: &str, table: NftFamily, pending: &[Pending], rest: &[Expr]) -> Result<(), NftError> {
        let f = match rest {
            [Expr::Meta { key: NFT_META_NFPROTO, dreg }, Expr::Cmp { sreg, op: NFT_CMP_EQ, data }, ..]
                if sreg == dreg =>
            {
                match data.as_slice() {
                    [f @ (NFPROTO_IPV4 | NFPROTO_IPV6)] => *f,
                    _ => return Err(shape(object, "meta nfproto of an unknown family")),
                }
            }
            _ => return Err(shape(object, "a meta nfproto that is not an address's dependency")),
        };
        if table != NftFamily::Inet {
            return Err(shape(object, "meta nfproto outside an inet table"));
        }
        if self.family.is_some() {
            return Err(shape(object, "a second meta nfproto"));
        }
        if !pending.is_empty() {
            return Err(shape(object, "meta nfproto between a load and its use"));
        }
        *self = Nfproto { family: Some(f), unused: true };
        Ok(())
    }

    /// Checks a load from an address field against the table and the dependency before it.
    fn address(&mut self, object: &str, table: NftFamily, f: u8) -> Result<(), NftError> {
        let ok = match table {
            NftFamily::Ip => f == NFPROTO_IPV4,
            NftFamily::Ip6 => f == NFPROTO_IPV6,
            NftFamily::Inet => self.family == Some(f),
            NftFamily::Unspecified => false,
        };
        if !ok {
            let why = match (table, self.family) {
                (NftFamily::Inet, None) => "an address load without its meta nfproto dependency",
                (NftFamily::Inet, Some(_)) => "an address load of the other family than its meta nfproto",
                _ => "an address load of the other family than the table",
            };
            return Err(shape(object, why));
        }
        self.unused = false;
        Ok(())
    }
}

/// Whether the match is `meta l4proto == P`, which nft may emit as a dependency between a
/// `meta nfproto` and the address load that needs it (`ip daddr . tcp dport @s`).
fn is_l4proto_eq(m: Option<&NftMatch>) -> bool {
    matches!(
        m.and_then(|m| m.kind.as_ref()),
        Some(nft_match::Kind::Compare(c)) if c.selector == Selector::L4proto as i32 && c.op == CmpOp::Eq as i32
    )
}

/// Decompiles a rule's expressions, read from a table of `table`'s family.
pub(crate) fn decompile(exprs: &[Expr], table: NftFamily, object: &str) -> Result<NftRule, NftError> {
    let mut rule = NftRule::default();
    let mut pending: Vec<Pending> = Vec::new();
    let mut nfproto = Nfproto::default();
    // The `meta l4proto` match read between a `meta nfproto` and its address load: the
    // dependency of a tcp/udp component of the key being loaded.
    let mut window_l4: Option<usize> = None;
    let mut i = 0;
    while i < exprs.len() {
        let e = &exprs[i];
        i += 1;
        let before = (rule.matches.len(), rule.statements.len());
        match e {
            Expr::Meta { key: NFT_META_NFPROTO, .. } => {
                nfproto.absorb(object, table, &pending, &exprs[i - 1..])?;
                i += 1;
            }
            Expr::Meta { key, dreg } => pending.push(load_pending(object, Source::Meta(*key), 0, *dreg, e)?),
            Expr::Ct { key: NFT_CT_STATE, dreg } => {
                // `ct state S`, exactly as compile writes it.
                let r = *dreg;
                let states = match (exprs.get(i), exprs.get(i + 1)) {
                    (
                        Some(Expr::Bitwise { sreg, dreg: d, len: 4, mask, xor, .. }),
                        Some(Expr::Cmp { sreg: c, op: NFT_CMP_NEQ, data }),
                    ) if *sreg == r && *d == r && *c == r && xor == &[0; 4] && data == &[0; 4] => {
                        let b: [u8; 4] =
                            mask.as_slice().try_into().map_err(|_| shape(object, "ct state of a bad length"))?;
                        u32::from_ne_bytes(b)
                    }
                    _ => return Err(shape(object, "ct state in a shape kuport never writes")),
                };
                if states == 0 || states & !CT_STATES != 0 || !pending.is_empty() || !rule.statements.is_empty() {
                    return Err(shape(object, "ct state in a shape kuport never writes"));
                }
                i += 2;
                rule.matches.push(NftMatch { kind: Some(nft_match::Kind::CtState(CtState { states })) });
            }
            Expr::Ct { key, dreg } => pending.push(load_pending(object, Source::Ct(*key), 0, *dreg, e)?),
            Expr::Payload { base, offset, len, dreg } => {
                let src = Source::Payload(*base, *offset);
                if let Some(f) = addr_family_of_source(src) {
                    nfproto.address(object, table, f)?;
                }
                pending.push(load_pending(object, src, *len, *dreg, e)?)
            }
            // Implied by the set's interval flag; recomputed by compile.
            Expr::Byteorder { .. } => {}
            Expr::Immediate { dreg, data: Imm::Value(v) } => pending.push(Pending::Imm { reg: *dreg, data: v.clone() }),
            Expr::Cmp { .. } | Expr::Range { .. } | Expr::Bitwise { .. } if is_tcp_flags_load(&pending) => {
                if !rule.statements.is_empty() {
                    return Err(shape(object, "a match after a statement"));
                }
                let (f, used) = decompile_tcp_flags(object, &exprs[i - 1..])?;
                i += used - 1;
                pending.clear();
                rule.matches.push(NftMatch { kind: Some(nft_match::Kind::TcpFlags(f)) });
            }
            Expr::Rt { key: NFT_RT_TCPMSS, dreg } => {
                // `tcp option maxseg size set rt mtu`, exactly as compile writes it.
                let r = *dreg;
                match (exprs.get(i), exprs.get(i + 1)) {
                    (
                        Some(Expr::Byteorder { sreg, dreg, op: NFT_BYTEORDER_HTON, len: 2, size: 2 }),
                        Some(Expr::ExthdrSet {
                            op: NFT_EXTHDR_OP_TCPOPT,
                            ty: TCPOPT_MAXSEG,
                            offset: TCPOPT_MAXSEG_OFFSET,
                            len: TCPOPT_MAXSEG_LEN,
                            sreg: to,
                        }),
                    ) if *sreg == r && *dreg == r && *to == r && pending.is_empty() => {}
                    _ => return Err(shape(object, "rt mtu not written into the MSS option")),
                }
                i += 2;
                rule.statements.push(NftStatement { kind: Some(nft_statement::Kind::TcpMssClamp(TcpMssClamp {})) });
            }
            Expr::Cmp { .. } | Expr::Range { .. } | Expr::Bitwise { .. } => {
                if !rule.statements.is_empty() {
                    return Err(shape(object, "a match after a statement"));
                }
                let (c, used) = decompile_compare(object, &pending, &exprs[i - 1..])?;
                i += used - 1;
                pending.clear();
                rule.matches.push(NftMatch { kind: Some(nft_match::Kind::Compare(c)) });
            }
            Expr::Literal { values, negate, .. } => {
                if !rule.statements.is_empty() {
                    return Err(shape(object, "a match after a statement"));
                }
                let [selector] = take_keys(object, &mut pending)?[..] else {
                    return Err(shape(object, "a literal set with a concatenated key"));
                };
                rule.matches.push(NftMatch {
                    kind: Some(nft_match::Kind::Literal(LiteralSet {
                        selector,
                        values: values.clone(),
                        negate: *negate,
                    })),
                });
            }
            Expr::Lookup { dreg: None, set, flags, .. } => {
                if !rule.statements.is_empty() {
                    return Err(shape(object, "a match after a statement"));
                }
                let mut key = take_keys(object, &mut pending)?;
                fold_key_dependency(&mut rule.matches, &mut window_l4, &mut key);
                rule.matches.push(NftMatch {
                    kind: Some(nft_match::Kind::Lookup(SetLookup {
                        key,
                        set: set.clone(),
                        negate: flags & NFT_LOOKUP_F_INV != 0,
                    })),
                });
            }
            Expr::Lookup { dreg: Some(NFT_REG_VERDICT), set, flags: 0, .. } => {
                let mut key = take_keys(object, &mut pending)?;
                fold_key_dependency(&mut rule.matches, &mut window_l4, &mut key);
                let m = VerdictMap { key, map: set.clone() };
                rule.statements.push(NftStatement { kind: Some(nft_statement::Kind::VerdictMap(m)) });
            }
            Expr::Dynset { sreg_key: NFT_REG_1, op, set, expr, .. } => {
                let (key, tag) = take_update_key(object, &mut pending)?;
                let stateful = match (*op, expr) {
                    (NFT_DYNSET_OP_UPDATE, Stateful::Limit { rate, burst, over }) => {
                        set_update::Stateful::Limit(Limit { rate: *rate, burst: *burst, over: *over })
                    }
                    (NFT_DYNSET_OP_ADD, Stateful::Connlimit { count, over }) => {
                        set_update::Stateful::CtCount(ConnLimit { count: *count, over: *over })
                    }
                    _ => return Err(shape(object, "a dynset operation kuport never writes with its expression")),
                };
                let u = SetUpdate { key, tag, set: set.clone(), stateful: Some(stateful) };
                rule.statements.push(NftStatement { kind: Some(nft_statement::Kind::SetUpdate(u)) });
            }
            Expr::Lookup { dreg: Some(_), set, .. } => {
                let mut key = take_keys(object, &mut pending)?;
                fold_key_dependency(&mut rule.matches, &mut window_l4, &mut key);
                let map = MapLookup { key, map: set.clone() };
                let next = exprs.get(i).ok_or_else(|| shape(object, "a map lookup without a consumer"))?;
                i += 1;
                let kind = match next {
                    Expr::Nat { kind, family, .. } => nft_statement::Kind::Nat(Nat {
                        kind: nat_kind(object, *kind)?,
                        family: nat_fam(object, *family)?,
                        to: Some(nat::To::Map(map)),
                    }),
                    Expr::Redir { .. } => nft_statement::Kind::Redirect(Redirect { to: Some(redirect::To::Map(map)) }),
                    Expr::MetaSet { key: NFT_META_MARK, .. } => {
                        nft_statement::Kind::MetaMarkSet(SetMark { from: Some(set_mark::From::Map(map)) })
                    }
                    Expr::CtSet { key: NFT_CT_MARK, .. } => {
                        nft_statement::Kind::CtMarkSet(SetMark { from: Some(set_mark::From::Map(map)) })
                    }
                    // `ip daddr set K map @m` and `ip6 daddr set K map @m`, exactly as compile
                    // writes them; the write uses the rule's `meta nfproto` in an inet table.
                    Expr::PayloadSet {
                        base: NFT_PAYLOAD_NETWORK_HEADER,
                        offset,
                        len,
                        csum_type,
                        csum_offset,
                        csum_flags: NFT_PAYLOAD_L4CSUM_PSEUDOHDR,
                        ..
                    } => {
                        let (selector, f) = match (*offset, *len, *csum_type, *csum_offset) {
                            (IPV4_DADDR_OFFSET, 4, NFT_PAYLOAD_CSUM_INET, IPV4_CSUM_OFFSET) => {
                                (Selector::IpDaddr, NFPROTO_IPV4)
                            }
                            (IPV6_DADDR_OFFSET, 16, NFT_PAYLOAD_CSUM_NONE, 0) => (Selector::Ip6Daddr, NFPROTO_IPV6),
                            _ => return Err(shape(object, "a payload write kuport never writes")),
                        };
                        nfproto.address(object, table, f)?;
                        nft_statement::Kind::AddressSet(AddressSet { selector: selector as i32, map: Some(map) })
                    }
                    _ => return Err(shape(object, "a map lookup feeding an unknown statement")),
                };
                rule.statements.push(NftStatement { kind: Some(kind) });
            }
            Expr::Counter => {
                rule.statements.push(NftStatement { kind: Some(nft_statement::Kind::Counter(Counter {})) })
            }
            Expr::Immediate { data: Imm::Verdict { code, chain }, .. } => {
                let v = verdict_of(*code, chain.as_deref()).ok_or_else(|| shape(object, &format!("verdict {code}")))?;
                rule.statements.push(NftStatement { kind: Some(nft_statement::Kind::Verdict(v)) });
            }
            Expr::Nat { kind, family, addr_min, proto_min, proto_max, .. } => {
                let to = match pending.as_slice() {
                    [Pending::Load { src, len, .. }] => {
                        let s = sel_of_source(*src, *len).ok_or_else(|| shape(object, "nat from an unknown field"))?;
                        nat::To::Selector(s as i32)
                    }
                    imms => {
                        let get = |r: Option<u32>| -> Option<Vec<u8>> {
                            let r = r?;
                            imms.iter().find_map(|p| match p {
                                Pending::Imm { reg, data } if *reg == r => Some(data.clone()),
                                _ => None,
                            })
                        };
                        let addr = get(*addr_min)
                            .and_then(|b| addr_from_bytes(&b))
                            .ok_or_else(|| shape(object, "nat without an address"))?;
                        let port = match get(*proto_min) {
                            Some(f) => {
                                let f = u32::from(be16(object, &f)?);
                                let l = match get(*proto_max) {
                                    Some(l) => u32::from(be16(object, &l)?),
                                    None => f,
                                };
                                Some(PortRange { first: f, last: l })
                            }
                            None => None,
                        };
                        nat::To::Target(NatTarget { addr: addr.to_string(), port })
                    }
                };
                pending.clear();
                rule.statements.push(NftStatement {
                    kind: Some(nft_statement::Kind::Nat(Nat {
                        kind: nat_kind(object, *kind)?,
                        family: nat_fam(object, *family)?,
                        to: Some(to),
                    })),
                });
            }
            Expr::Redir { proto_min, proto_max, .. } => {
                let get = |r: Option<u32>| -> Option<u16> {
                    let r = r?;
                    pending.iter().find_map(|p| match p {
                        Pending::Imm { reg, data } if *reg == r => be16(object, data).ok(),
                        _ => None,
                    })
                };
                let f = get(*proto_min).ok_or_else(|| shape(object, "redirect without a port"))?;
                let l = get(*proto_max).unwrap_or(f);
                pending.clear();
                let port = PortRange { first: u32::from(f), last: u32::from(l) };
                rule.statements.push(NftStatement {
                    kind: Some(nft_statement::Kind::Redirect(Redirect { to: Some(redirect::To::Port(port)) })),
                });
            }
            Expr::MetaSet { key: NFT_META_MARK, .. } | Expr::CtSet { key: NFT_CT_MARK, .. } => {
                let from = match pending.as_slice() {
                    [Pending::Imm { data, .. }] => {
                        let b: [u8; 4] =
                            data.as_slice().try_into().map_err(|_| shape(object, "mark of a bad length"))?;
                        set_mark::From::Value(u32::from_ne_bytes(b))
                    }
                    [Pending::Load { src, len, .. }] => set_mark::From::Selector(
                        sel_of_source(*src, *len).ok_or_else(|| shape(object, "mark from an unknown field"))? as i32,
                    ),
                    _ => return Err(shape(object, "mark set without a source")),
                };
                pending.clear();
                let m = SetMark { from: Some(from) };
                let kind = if matches!(e, Expr::CtSet { .. }) {
                    nft_statement::Kind::CtMarkSet(m)
                } else {
                    nft_statement::Kind::MetaMarkSet(m)
                };
                rule.statements.push(NftStatement { kind: Some(kind) });
            }
            other => return Err(shape(object, &format!("unexpected expression {other:?}"))),
        }
        // What a `meta nfproto` may precede before the address load that uses it: only another
        // dependency.
        let after = (rule.matches.len(), rule.statements.len());
        if nfproto.unused && after != before {
            if after == (before.0 + 1, before.1) && is_l4proto_eq(rule.matches.last()) {
                window_l4 = Some(before.0);
            } else {
                return Err(shape(object, "a meta nfproto that no address load follows"));
            }
        }
    }
    if !pending.is_empty() {
        return Err(shape(object, "a load nobody reads"));
    }
    if nfproto.unused {
        return Err(shape(object, "a meta nfproto that no address load follows"));
    }
    fold_l4_dependencies(&mut rule.matches);
    Ok(rule)
}

fn be16(object: &str, b: &[u8]) -> Result<u16, NftError> {
    let a: [u8; 2] = b.get(..2).and_then(|s| s.try_into().ok()).ok_or_else(|| shape(object, "port of a bad length"))?;
    Ok(u16::from_be_bytes(a))
}

fn nat_kind(object: &str, k: u32) -> Result<i32, NftError> {
    match k {
        NFT_NAT_SNAT => Ok(NatKind::Snat as i32),
        NFT_NAT_DNAT => Ok(NatKind::Dnat as i32),
        _ => Err(shape(object, "unknown nat type")),
    }
}

fn nat_fam(object: &str, f: u32) -> Result<i32, NftError> {
    match u8::try_from(f) {
        Ok(NFPROTO_IPV4) => Ok(NftFamily::Ip as i32),
        Ok(NFPROTO_IPV6) => Ok(NftFamily::Ip6 as i32),
        _ => Err(shape(object, "unknown nat family")),
    }
}

fn load_pending(object: &str, src: Source, len: u32, dreg: u32, e: &Expr) -> Result<Pending, NftError> {
    let slot = slot_of_reg(dreg).ok_or_else(|| shape(object, &format!("load into register {dreg}: {e:?}")))?;
    let len = match src {
        Source::Payload(..) => len,
        _ => [
            Selector::Iifname,
            Selector::Oifname,
            Selector::L4proto,
            Selector::MetaMark,
            Selector::MetaSkuid,
            Selector::MetaSkgid,
            Selector::CtMark,
            Selector::CtDirection,
        ]
        .into_iter()
        .filter_map(sel_info)
        .find(|i| i.source == src)
        .map(|i| i.len)
        .ok_or_else(|| shape(object, &format!("unknown load {e:?}")))?,
    };
    Ok(Pending::Load { slot, src, len })
}

fn take_keys(object: &str, pending: &mut Vec<Pending>) -> Result<Vec<i32>, NftError> {
    let mut keys = Vec::new();
    let mut slot = 0;
    for p in pending.drain(..) {
        match p {
            Pending::Load { slot: s, src, len } if s == slot => {
                keys.push(sel_of_source(src, len).ok_or_else(|| shape(object, "a key from an unknown field"))? as i32);
                slot += padded(len) / 4;
            }
            _ => return Err(shape(object, "a lookup key out of register order")),
        }
    }
    if keys.is_empty() {
        return Err(shape(object, "a lookup without a key"));
    }
    Ok(keys)
}

/// A dynset's key: loads in register order, then optionally the tag, a 4-byte immediate in the
/// next register word.
fn take_update_key(object: &str, pending: &mut Vec<Pending>) -> Result<(Vec<i32>, Option<u32>), NftError> {
    let tag = match pending.last() {
        Some(Pending::Imm { reg, data }) => {
            let b: [u8; 4] = data.as_slice().try_into().map_err(|_| shape(object, "a tag of a bad length"))?;
            let reg = *reg;
            pending.pop();
            Some((reg, u32::from_ne_bytes(b)))
        }
        _ => None,
    };
    let mut slot = 0;
    for p in pending.iter() {
        if let Pending::Load { len, .. } = p {
            slot += padded(*len) / 4;
        }
    }
    let key = take_keys(object, pending)?;
    match tag {
        Some((reg, _)) if reg != reg_of_slot(slot) => Err(shape(object, "a tag out of register order")),
        Some((_, t)) => Ok((key, Some(t))),
        None => Ok((key, None)),
    }
}

/// nft emits the dependencies of a concatenation's components in component order, so in an inet
/// table `ip daddr . tcp dport @s` reads `meta nfproto ipv4`, `meta l4proto tcp`, then the
/// loads. That `meta l4proto` (the last match, read in the window) belongs to the key's first
/// transport port: fold it back into `tcp dport`, so that the normal form compiles to nft's
/// order again.
fn fold_key_dependency(matches: &mut Vec<NftMatch>, window_l4: &mut Option<usize>, key: &mut [i32]) {
    let Some(at) = window_l4.take() else { return };
    if at + 1 != matches.len() {
        return;
    }
    let proto = match matches[at].kind.as_ref() {
        Some(nft_match::Kind::Compare(c)) => match c.value.as_ref().and_then(value_of) {
            Some(Value::Proto(p)) => proto_byte("", *p).ok(),
            _ => None,
        },
        _ => None,
    };
    let Some(k) = key.iter_mut().find(|k| matches!(Selector::try_from(**k), Ok(Selector::ThSport | Selector::ThDport)))
    else {
        return;
    };
    let folded = match (Selector::try_from(*k), proto) {
        (Ok(Selector::ThSport), Some(IPPROTO_TCP)) => Selector::TcpSport,
        (Ok(Selector::ThDport), Some(IPPROTO_TCP)) => Selector::TcpDport,
        (Ok(Selector::ThSport), Some(IPPROTO_UDP)) => Selector::UdpSport,
        (Ok(Selector::ThDport), Some(IPPROTO_UDP)) => Selector::UdpDport,
        _ => return,
    };
    *k = folded as i32;
    matches.remove(at);
}

/// Decompiles `load [bitwise] cmp`, `load cmp(gte) cmp(lte)` or `load range`; returns how
/// many expressions from `rest` it consumed.
fn decompile_compare(object: &str, pending: &[Pending], rest: &[Expr]) -> Result<(Compare, usize), NftError> {
    let [Pending::Load { slot: 0, src, len }] = pending else {
        return Err(shape(object, "a compare without exactly one load"));
    };
    // A shorter address load is a byte-aligned prefix.
    let (selector, prefix) = match sel_of_source(*src, *len) {
        Some(s) => (s, None),
        None => {
            let s = [Selector::IpSaddr, Selector::IpDaddr, Selector::Ip6Saddr, Selector::Ip6Daddr]
                .into_iter()
                .find(|s| sel_info(*s).is_some_and(|i| i.source == *src && *len < i.len))
                .ok_or_else(|| shape(object, "a compare on an unknown field"))?;
            (s, Some((*len * 8) as u8))
        }
    };
    let info = sel_info(selector).ok_or_else(|| shape(object, "unknown selector"))?;
    let mut used = 0;
    let mut mask: Option<Vec<u8>> = None;
    if let Some(Expr::Bitwise { mask: m, xor, .. }) = rest.first() {
        if xor.iter().any(|b| *b != 0) {
            return Err(shape(object, "bitwise with xor"));
        }
        mask = Some(m.clone());
        used += 1;
    }
    let mut c = Compare { selector: selector as i32, ..Default::default() };
    let (op, from, to) = match (rest.get(used), rest.get(used + 1)) {
        (Some(Expr::Cmp { op: NFT_CMP_GTE, data: f, .. }), Some(Expr::Cmp { op: NFT_CMP_LTE, data: t, .. })) => {
            used += 2;
            (NFT_CMP_EQ, f.clone(), t.clone())
        }
        (Some(Expr::Cmp { op, data, .. }), _) if *op == NFT_CMP_EQ || *op == NFT_CMP_NEQ => {
            used += 1;
            (*op, data.clone(), data.clone())
        }
        (Some(Expr::Range { op: NFT_RANGE_NEQ, from, to, .. }), _) => {
            used += 1;
            (NFT_CMP_NEQ, from.clone(), to.clone())
        }
        _ => return Err(shape(object, "an unknown compare shape")),
    };
    c.op = if op == NFT_CMP_EQ { CmpOp::Eq as i32 } else { CmpOp::Neq as i32 };
    let value = match info.ty {
        Some(NftType::Ifname) => {
            let s = from.split(|b| *b == 0).next().unwrap_or_default();
            let mut name = String::from_utf8(s.to_vec()).map_err(|_| shape(object, "interface name not UTF-8"))?;
            if from.len() < IFNAMSIZ {
                name.push('*');
            }
            Value::Ifname(name)
        }
        Some(NftType::Ipv4Addr | NftType::Ipv6Addr) => {
            let mut full = from.clone();
            full.resize(info.len as usize, 0);
            let a = addr_from_bytes(&full).ok_or_else(|| shape(object, "bad address"))?;
            let len = match (&mask, prefix) {
                (Some(m), _) => mask_len(m).ok_or_else(|| shape(object, "a non-prefix address mask"))?,
                (None, Some(p)) => p,
                (None, None) => (info.len * 8) as u8,
            };
            Value::Addr(prefix_text(a, len))
        }
        Some(NftType::InetProto) => Value::Proto(
            proto_from_byte(*from.first().unwrap_or(&0)).ok_or_else(|| shape(object, "unknown l4 protocol"))? as i32,
        ),
        Some(NftType::InetService) => {
            Value::Port(PortRange { first: u32::from(be16(object, &from)?), last: u32::from(be16(object, &to)?) })
        }
        None if selector == Selector::CtDirection => match from.as_slice() {
            [d @ (0 | 1)] => Value::Id(u32::from(*d)),
            _ => return Err(shape(object, "a ct direction other than original or reply")),
        },
        Some(NftType::Mark) | None => {
            let b: [u8; 4] = from.as_slice().try_into().map_err(|_| shape(object, "a 32-bit value of a bad length"))?;
            if let Some(m) = &mask {
                let mb: [u8; 4] = m.as_slice().try_into().map_err(|_| shape(object, "a mask of a bad length"))?;
                c.mask = u32::from_ne_bytes(mb);
            }
            if info.ty.is_some() { Value::Mark(u32::from_ne_bytes(b)) } else { Value::Id(u32::from_ne_bytes(b)) }
        }
        Some(NftType::Unspecified | NftType::Verdict) => return Err(shape(object, "unspecified type")),
    };
    if mask.is_some() && !matches!(info.ty, Some(NftType::Mark | NftType::Ipv4Addr | NftType::Ipv6Addr)) {
        return Err(shape(object, "a mask on a field kuport never masks"));
    }
    c.value = Some(NftValue { value: Some(value) });
    Ok((c, used))
}

/// A load of the TCP flags byte waits.
fn is_tcp_flags_load(pending: &[Pending]) -> bool {
    matches!(
        pending,
        [Pending::Load { slot: 0, src: Source::Payload(NFT_PAYLOAD_TRANSPORT_HEADER, TCP_FLAGS_OFFSET), len: 1 }]
    )
}

/// Decompiles `[bitwise] cmp eq` after a load of the TCP flags byte; returns how many
/// expressions from `rest` it consumed.
fn decompile_tcp_flags(object: &str, rest: &[Expr]) -> Result<(TcpFlags, usize), NftError> {
    let byte = |b: &[u8]| -> Result<u32, NftError> {
        match b {
            [x] => Ok(u32::from(*x)),
            _ => Err(shape(object, "tcp flags of a bad length")),
        }
    };
    match rest {
        [Expr::Bitwise { len: 1, mask, xor, .. }, Expr::Cmp { op: NFT_CMP_EQ, data, .. }, ..]
            if xor.iter().all(|b| *b == 0) =>
        {
            let (value, mask) = (byte(data)?, byte(mask)?);
            Ok((TcpFlags { value, mask }, 2))
        }
        [Expr::Cmp { op: NFT_CMP_EQ, data, .. }, ..] => Ok((TcpFlags { value: byte(data)?, mask: 0xff }, 1)),
        _ => Err(shape(object, "an unknown tcp flags shape")),
    }
}

/// `meta l4proto tcp` directly followed by a `th` port compare is nft's dependency of
/// `tcp dport`: fold it back.
fn fold_l4_dependencies(matches: &mut Vec<NftMatch>) {
    let mut i = 0;
    while i + 1 < matches.len() {
        let proto = match &matches[i].kind {
            Some(nft_match::Kind::Compare(c)) if c.selector == Selector::L4proto as i32 && c.op == CmpOp::Eq as i32 => {
                match c.value.as_ref().and_then(value_of) {
                    Some(Value::Proto(p)) => proto_byte("", *p).ok(),
                    _ => None,
                }
            }
            _ => None,
        };
        if proto == Some(IPPROTO_TCP) && matches!(matches[i + 1].kind, Some(nft_match::Kind::TcpFlags(_))) {
            // `tcp flags`'s own dependency.
            matches.remove(i);
            i += 1;
            continue;
        }
        let folded = match (&matches[i + 1].kind, proto) {
            (Some(nft_match::Kind::Compare(c)), Some(p)) => {
                let s = Selector::try_from(c.selector).ok();
                match (s, p) {
                    (Some(Selector::ThSport), IPPROTO_TCP) => Some(Selector::TcpSport),
                    (Some(Selector::ThDport), IPPROTO_TCP) => Some(Selector::TcpDport),
                    (Some(Selector::ThSport), IPPROTO_UDP) => Some(Selector::UdpSport),
                    (Some(Selector::ThDport), IPPROTO_UDP) => Some(Selector::UdpDport),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(s) = folded {
            if let Some(nft_match::Kind::Compare(c)) = &mut matches[i + 1].kind {
                c.selector = s as i32;
            }
            matches.remove(i);
        }
        i += 1;
    }
}
