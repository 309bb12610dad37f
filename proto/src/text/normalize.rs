//! What nft 1.0.6 (x86_64, little-endian) changes between the model kuport sends and the text
//! it lists back, so that [`super::nft`] prints the listing and not the model. Each
//! normalisation known of:
//!
//! - Sets and maps are listed in model order, chains after them, also in model order (nft lists
//!   both in creation order). Elements are not: hash sets are sorted by nft's 1.0.6 merge sort
//!   (see [`element_sort_key`]), single-field interval sets by value, and concatenated interval
//!   sets (pipapo) keep insertion order ([`ordered_elements`]).
//! - Prefixes lose their host bits (`10.0.0.1/8` lists as `10.0.0.0/8`) and full-length prefixes
//!   print as plain addresses ([`parse_addr`]).
//! - Marks print as `0x%08x`; a compare under a mask of leading ones prints as `value/len`
//!   ([`mark_mask`]).
//! - A `meta l4proto tcp|udp` match sets the protocol context: later `th` selectors list as
//!   `tcp`/`udp`, and the match itself disappears when the next transport-header payload in a
//!   match, a nat map key or a mark map key consumes it as its dependency (nft's
//!   "dependency kill", [`listing`]). `tcp`/`udp` selectors get that dependency implicitly
//!   ([`kernel_form`]).
//! - `tcp flags` is a TCP header field like `tcp dport`: it gets `meta l4proto tcp` as its
//!   dependency and consumes one given before it. Its value and mask list in one of four forms
//!   (`super::nft`'s `tcp_flags_text`).
//! - In an `inet` table an address selector (`ip saddr`, `ip6 daddr`, in a compare, a set key
//!   or a nat source) gets `meta nfproto ipv4|ipv6` as its dependency, once per rule, before the
//!   first address load. nft never lists it, so the renderer prints nothing for it
//!   (docs/overlay/filter.md). nft refuses `ip` and `ip6` selectors in one rule.
//! - An equality on a source port directly followed (in header order) by one on a destination
//!   port is merged into one 32-bit compare; it lists as `tcp sport S tcp dport D` under a
//!   protocol context and as the raw `@th,0,32 0x...` without one.
//! - `dnat ip to ADDR` lists without the family in `ip`/`ip6` tables; the family stays in `inet`
//!   tables and with `addr . port` maps ([`nat_family_listed`]).
//! - Chain priorities within 10 of a standard one print by its name ([`standard_priority`]).
//! - `ct state` lists its bits lowest first (`invalid,established,related,new`); a limit's burst
//!   of 5 (nft's default) is not listed; a tag in an `update`/`add` key lists as a mark
//!   (`0x0000002a`); a set's timeout lists in nft's units (`1m30s`); its flags in nft's order
//!   (`interval,dynamic,timeout`), after `size`.
//! - nft lists chains in the order they were created: a chain the executor adds in place to a
//!   table lists after the others until the table is rebuilt (the renderer keeps model order).
//!
//! Combinations that nft 1.0.6 refuses to load, so no round trip can check them:
//! a NAT or redirect port without an earlier `meta l4proto`/`tcp`/`udp` match in the rule
//! ("transport protocol mapping is only valid after transport protocol match"), `redirect` via a
//! map whose key uses `tcp`/`udp` without such a match, a dnat port-only target with a family
//! (`dnat ip to :80` is a syntax error, so port-only targets always print `dnat to :80`), and
//! prefixes or ranges in sets without `interval`. For these the renderer still prints what nft
//! would list if it accepted them. Note that nft lists a redirect via a map as
//! `redirect to :KEY map @m`; that is what is printed.
//!
//! One accepted combination lists in a form that nft would not list the same way again: two
//! `meta l4proto` equalities before a transport selector. Only the second is consumed, so the
//! listing keeps one (`meta l4proto tcp tcp dport 80`), and loading that text back leaves none.
//! The renderer prints the first listing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::v1::{
    AddressSet, CmpOp, Compare, Hook, L4Proto, Nat, NftElement, NftFamily, NftMatch, NftRule, NftSet, NftStatement,
    NftType, NftValue, Redirect, Selector, SetMark, nat, nft_match, nft_statement, nft_value, redirect, set_mark,
};

pub(super) fn nft_type(t: i32) -> Option<NftType> {
    NftType::try_from(t).ok().filter(|t| *t != NftType::Unspecified)
}

// ---------------------------------------------------------------------------------------------
// Element order
// ---------------------------------------------------------------------------------------------

/// The elements in the order nft lists them.
pub(super) fn ordered_elements(set: &NftSet) -> Vec<&NftElement> {
    let mut elems: Vec<&NftElement> = set.elements.iter().collect();
    if set.interval && set.key.len() > 1 {
        // Concatenated ranges live in pipapo, which dumps in insertion order, and nft's
        // concat_range_aggregate keeps that order.
        return elems;
    }
    // Stable, like nft's merge sort: equal keys keep their model order.
    elems.sort_by_cached_key(|e| element_sort_key(set, e));
    elems
}

/// What nft 1.0.6 sorts a listed element by, as bytes compared lexicographically.
///
/// Single-field interval sets go through interval_map_decompose, which orders by value. Other
/// sets go through list_expr_sort: a single value compares as its numeric value (for a string
/// that is the host-endian, here little-endian, reading of its 16 bytes), while a
/// concatenation exports each component in its own byte order, joins them and reads the whole
/// as one little-endian number, so the last byte weighs most.
fn element_sort_key(set: &NftSet, e: &NftElement) -> Vec<u8> {
    let component = |i: usize| -> Vec<u8> {
        let t = set.key.get(i).copied().and_then(nft_type);
        value_bytes(t, e.key.get(i))
    };
    if set.key.len() > 1 {
        let mut bytes: Vec<u8> = (0..set.key.len()).flat_map(component).collect();
        bytes.reverse();
        return bytes;
    }
    let mut bytes = component(0);
    let t = set.key.first().copied().and_then(nft_type);
    match t {
        Some(NftType::Ifname) if !set.interval => bytes.reverse(),
        // A mark is stored host-endian; its numeric order is its big-endian byte order.
        Some(NftType::Mark) => bytes.reverse(),
        _ => {}
    }
    bytes
}

/// A key component as nft stores it: ifnames as 16 raw bytes, addresses and ports big-endian,
/// the protocol as one byte, marks host-endian (little-endian). Invalid values sort as zeros.
fn value_bytes(t: Option<NftType>, v: Option<&NftValue>) -> Vec<u8> {
    use nft_value::Value;
    let value = v.and_then(|v| v.value.as_ref());
    match t {
        Some(NftType::Ifname) => {
            let mut b = vec![0u8; 16];
            if let Some(Value::Ifname(s)) = value {
                for (dst, src) in b.iter_mut().zip(s.bytes()) {
                    *dst = src;
                }
            }
            b
        }
        Some(NftType::Ipv4Addr) => match value.and_then(addr_of) {
            Some(Addr { ip: IpAddr::V4(a), .. }) => a.octets().to_vec(),
            _ => vec![0; 4],
        },
        Some(NftType::Ipv6Addr) => match value.and_then(addr_of) {
            Some(Addr { ip: IpAddr::V6(a), .. }) => a.octets().to_vec(),
            _ => vec![0; 16],
        },
        Some(NftType::InetProto) => match value {
            Some(Value::Proto(p)) => vec![u8::try_from(*p).unwrap_or(0)],
            _ => vec![0],
        },
        Some(NftType::InetService) => match value {
            Some(Value::Port(r)) => u16::try_from(r.first).unwrap_or(0).to_be_bytes().to_vec(),
            _ => vec![0; 2],
        },
        Some(NftType::Mark) => match value {
            Some(Value::Mark(m)) => m.to_le_bytes().to_vec(),
            _ => vec![0; 4],
        },
        // Map data only: never part of a key.
        Some(NftType::Verdict | NftType::Unspecified) | None => Vec::new(),
    }
}

fn addr_of(v: &nft_value::Value) -> Option<Addr> {
    match v {
        nft_value::Value::Addr(a) => parse_addr(a),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Rules: protocol dependencies and merged ports
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub(super) fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// A statement as the kernel holds it after nft has evaluated the rule.
pub(super) enum KStmt<'a> {
    Match(&'a NftMatch),
    /// The `meta l4proto` match nft inserts before a `tcp`/`udp` selector used without one.
    ImplicitDep(Proto),
    /// A source and a destination port equality merged into one 32-bit compare.
    MergedPorts {
        sport: u32,
        dport: u32,
    },
    Stmt(&'a NftStatement),
}

/// The statements the kernel holds for a rule once nft has evaluated it.
pub(super) fn kernel_form(rule: &NftRule) -> Vec<KStmt<'_>> {
    merge_ports(evaluate(rule))
}

/// The protocol a selector needs as a dependency.
fn selector_proto(sel: i32) -> Option<Proto> {
    match Selector::try_from(sel) {
        Ok(Selector::TcpSport | Selector::TcpDport) => Some(Proto::Tcp),
        Ok(Selector::UdpSport | Selector::UdpDport) => Some(Proto::Udp),
        _ => None,
    }
}

fn is_transport(sel: i32) -> bool {
    matches!(
        Selector::try_from(sel),
        Ok(Selector::ThSport
            | Selector::ThDport
            | Selector::TcpSport
            | Selector::TcpDport
            | Selector::UdpSport
            | Selector::UdpDport)
    )
}

/// A `meta l4proto tcp|udp` equality: it sets the protocol context and can be a dependency.
fn l4proto_eq(c: &Compare) -> Option<Proto> {
    if Selector::try_from(c.selector) != Ok(Selector::L4proto) || CmpOp::try_from(c.op) != Ok(CmpOp::Eq) || c.mask != 0
    {
        return None;
    }
    match c.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(nft_value::Value::Proto(p)) => match L4Proto::try_from(*p) {
            Ok(L4Proto::Tcp) => Some(Proto::Tcp),
            Ok(L4Proto::Udp) => Some(Proto::Udp),
            _ => None,
        },
        _ => None,
    }
}

/// A `tcp flags` match: a TCP header field, with `meta l4proto tcp` as its dependency.
fn is_tcp_flags(m: &NftMatch) -> bool {
    matches!(m.kind, Some(nft_match::Kind::TcpFlags(_)))
}

/// The selectors a match reads.
fn match_selectors(m: &NftMatch) -> &[i32] {
    match &m.kind {
        Some(nft_match::Kind::Compare(c)) => std::slice::from_ref(&c.selector),
        Some(nft_match::Kind::Lookup(l)) => &l.key,
        Some(nft_match::Kind::Literal(l)) => std::slice::from_ref(&l.selector),
        Some(nft_match::Kind::TcpFlags(_) | nft_match::Kind::CtState(_)) | None => &[],
    }
}

/// The map key selectors a statement reads, and whether a transport payload among them
/// consumes a pending `meta l4proto` dependency (nat and mark maps do, redirect does not).
fn statement_keys(s: &NftStatement) -> (&[i32], bool) {
    match &s.kind {
        Some(nft_statement::Kind::Nat(Nat { to: Some(nat::To::Map(m)), .. })) => (&m.key, true),
        Some(nft_statement::Kind::Redirect(Redirect { to: Some(redirect::To::Map(m)) })) => (&m.key, false),
        Some(
            nft_statement::Kind::MetaMarkSet(SetMark { from: Some(set_mark::From::Map(m)) })
            | nft_statement::Kind::CtMarkSet(SetMark { from: Some(set_mark::From::Map(m)) }),
        ) => (&m.key, true),
        Some(nft_statement::Kind::AddressSet(AddressSet { map: Some(m), .. })) => (&m.key, true),
        Some(nft_statement::Kind::VerdictMap(m)) => (&m.key, true),
        Some(nft_statement::Kind::SetUpdate(u)) => (&u.key, true),
        _ => (&[], false),
    }
}

/// What nft's evaluation sends: the rule's matches and statements, with a `meta l4proto`
/// dependency in front of each `tcp`/`udp` selector the protocol context does not yet imply.
fn evaluate(rule: &NftRule) -> Vec<KStmt<'_>> {
    let mut ctx: Option<Proto> = None;
    let mut out = Vec::new();
    for m in &rule.matches {
        if let Some(nft_match::Kind::Compare(c)) = &m.kind
            && let Some(p) = l4proto_eq(c)
        {
            ctx = Some(p);
        } else if is_tcp_flags(m) {
            need(&[Selector::TcpDport as i32], &mut ctx, &mut out);
        } else {
            need(match_selectors(m), &mut ctx, &mut out);
        }
        out.push(KStmt::Match(m));
    }
    for s in &rule.statements {
        need(statement_keys(s).0, &mut ctx, &mut out);
        out.push(KStmt::Stmt(s));
    }
    out
}

/// Inserts the `meta l4proto` dependency `sels` need when the context does not imply one yet.
fn need(sels: &[i32], ctx: &mut Option<Proto>, out: &mut Vec<KStmt<'_>>) {
    if ctx.is_none()
        && let Some(p) = sels.iter().find_map(|s| selector_proto(*s))
    {
        out.push(KStmt::ImplicitDep(p));
        *ctx = Some(p);
    }
}

/// A single-port equality on a port selector: (is source port, port).
fn mergeable_port(k: &KStmt<'_>) -> Option<(bool, u32)> {
    let KStmt::Match(NftMatch { kind: Some(nft_match::Kind::Compare(c)) }) = k else {
        return None;
    };
    if CmpOp::try_from(c.op) != Ok(CmpOp::Eq) || c.mask != 0 {
        return None;
    }
    let sport = match Selector::try_from(c.selector) {
        Ok(Selector::ThSport | Selector::TcpSport | Selector::UdpSport) => true,
        Ok(Selector::ThDport | Selector::TcpDport | Selector::UdpDport) => false,
        _ => return None,
    };
    match c.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(nft_value::Value::Port(r)) if r.first == r.last && r.first <= 0xffff => Some((sport, r.first)),
        _ => None,
    }
}

/// nft's payload merge: equalities on adjacent header fields before the first non-match
/// statement are sorted by offset and joined while the result fits 32 bits. Among kuport's
/// selectors only a source port (offset 0) and a destination port (offset 16) qualify, so the
/// last sport equality absorbs the first dport equality, in the sport's place.
fn merge_ports(mut k: Vec<KStmt<'_>>) -> Vec<KStmt<'_>> {
    let run_end = k.iter().position(|s| matches!(s, KStmt::Stmt(_))).unwrap_or(k.len());
    let ports: Vec<(usize, bool, u32)> =
        k[..run_end].iter().enumerate().filter_map(|(i, s)| mergeable_port(s).map(|(sp, p)| (i, sp, p))).collect();
    let last_sport = ports.iter().rev().find(|(_, sp, _)| *sp);
    let first_dport = ports.iter().find(|(_, sp, _)| !*sp);
    if let (Some(&(si, _, sport)), Some(&(di, _, dport))) = (last_sport, first_dport) {
        k[si] = KStmt::MergedPorts { sport, dport };
        k.remove(di);
    }
    k
}

/// What nft prints for the kernel's statements: a protocol context follows the `meta l4proto`
/// equalities, and the last such equality is dropped when a transport payload consumes it.
/// One kernel statement in a listing, with the protocol context in force where it stands.
pub(super) struct Listed<'k, 'a> {
    pub stmt: &'k KStmt<'a>,
    pub ctx: Option<Proto>,
}

/// What nft lists of the kernel's statements: a protocol context follows the `meta l4proto`
/// equalities, and the last such equality is dropped when a transport payload consumes it.
pub(super) fn listing<'k, 'a>(kernel: &'k [KStmt<'a>]) -> Vec<Listed<'k, 'a>> {
    let mut out: Vec<Option<Listed<'k, 'a>>> = Vec::new();
    let mut ctx: Option<Proto> = None;
    let mut pending: Option<usize> = None;
    for k in kernel {
        // Each statement lists under the context before it.
        let at = ctx;
        match k {
            KStmt::ImplicitDep(p) => {
                ctx = Some(*p);
                pending = Some(out.len());
            }
            KStmt::MergedPorts { .. } => {
                if ctx.is_some() {
                    kill(&mut out, &mut pending);
                }
            }
            KStmt::Match(m) => {
                if let Some(nft_match::Kind::Compare(c)) = &m.kind
                    && let Some(p) = l4proto_eq(c)
                {
                    ctx = Some(p);
                    pending = Some(out.len());
                } else if is_tcp_flags(m) || match_selectors(m).iter().any(|s| is_transport(*s)) {
                    kill(&mut out, &mut pending);
                }
            }
            KStmt::Stmt(s) => {
                let (keys, kills) = statement_keys(s);
                if kills && keys.iter().any(|s| is_transport(*s)) {
                    kill(&mut out, &mut pending);
                }
                // Any statement other than a match ends the dependency's reach.
                pending = None;
            }
        }
        out.push(Some(Listed { stmt: k, ctx: at }));
    }
    out.into_iter().flatten().collect()
}

fn kill<T>(out: &mut [Option<T>], pending: &mut Option<usize>) {
    if let Some(i) = pending.take()
        && let Some(slot) = out.get_mut(i)
    {
        *slot = None;
    }
}

// ---------------------------------------------------------------------------------------------
// Forms of values, priorities and nat families
// ---------------------------------------------------------------------------------------------

/// How nft lists a mark compare's mask.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum MaskForm {
    /// No mask or a full one: it disappears.
    Full,
    /// Leading ones: `value/len`.
    Prefix(u32),
    /// Anything else: an explicit `& mask`.
    Explicit,
}

pub(super) fn mark_mask(mask: u32) -> MaskForm {
    if mask == 0 || mask == u32::MAX {
        return MaskForm::Full;
    }
    let len = mask.leading_ones();
    if len > 0 && u32::MAX.checked_shl(32 - len) == Some(mask) { MaskForm::Prefix(len) } else { MaskForm::Explicit }
}

/// nft's prio2str: the first standard priority within 10 of `prio`, with the offset from it,
/// names it; None when that name does not belong to this family and hook, or none is near, and
/// the number is printed.
pub(super) fn standard_priority(family: NftFamily, hook: Hook, prio: i32) -> Option<(&'static str, i64)> {
    const STD: [(i64, &str); 6] =
        [(-300, "raw"), (-150, "mangle"), (-100, "dstnat"), (0, "filter"), (50, "security"), (100, "srcnat")];
    let ip_family = matches!(family, NftFamily::Ip | NftFamily::Ip6 | NftFamily::Inet);
    for (value, name) in STD {
        let offset = i64::from(prio) - value;
        if offset.abs() > 10 {
            continue;
        }
        // nft 1.0.6 allows dstnat only in prerouting and srcnat only in postrouting.
        let compatible = ip_family
            && match name {
                "dstnat" => hook == Hook::Prerouting,
                "srcnat" => hook == Hook::Postrouting,
                _ => true,
            };
        return compatible.then_some((name, offset));
    }
    None
}

/// Whether nft lists a nat statement's family: only where it cannot be implied, in inet
/// tables, with a map whose data is `addr . port`, or (nonsense) when it contradicts the table.
pub(super) fn nat_family_listed(table: NftFamily, nat: NftFamily, concat_map: bool) -> bool {
    table == NftFamily::Inet || concat_map || nat != table
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum AddrFamily {
    V4,
    V6,
}

pub(super) struct Addr {
    pub ip: IpAddr,
    /// The prefix length; the full length for a plain address.
    pub len: u32,
}

/// Parses "a.b.c.d", "a.b.c.d/len" or their IPv6 forms, masking the host bits off a prefix.
pub(super) fn parse_addr(s: &str) -> Option<Addr> {
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l.parse::<u32>().ok()?)),
        None => (s, None),
    };
    let ip: IpAddr = a.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    if len > max {
        return None;
    }
    let ip = match ip {
        IpAddr::V4(v) => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v) & mask))
        }
        IpAddr::V6(v) => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v) & mask))
        }
    };
    Some(Addr { ip, len })
}
