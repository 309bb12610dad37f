//! Typed constructors for the nftables part of a node state: values, elements, sets, matches,
//! statements, rules, chains and tables; and for WireGuard devices and peers. The generated types hold enums as `i32` and every
//! oneof behind an `Option`; these take the enums and the plain values, so that whoever builds a
//! table (the controller's datapath, the lab, benchmarks, tests) writes `eq(Selector::IpDaddr,
//! addr(a))` instead of the nesting, and gets the same message as everyone else.

use std::fmt::Display;

use crate::v1::{
    BaseChain, ChainPolicy, ChainType, CmpOp, Compare, ConnLimit, Counter, CtState, Hook, L4Proto, Limit, LiteralSet,
    MapLookup, Nat, NatKind, NatTarget, NftChain, NftElement, NftFamily, NftMatch, NftRule, NftSet, NftStatement,
    NftTable, NftType, NftValue, PortRange, Redirect, Selector, SetLookup, SetMark, SetUpdate, TcpFlags, TcpMssClamp,
    Verdict, VerdictKind, VerdictMap, WireguardDevice, WireguardPeer, nat, nft_match, nft_statement, nft_value,
    redirect, set_mark, set_update,
};

// ---- values ----------------------------------------------------------------------------------

fn value(v: nft_value::Value) -> NftValue {
    NftValue { value: Some(v) }
}

/// An interface name (`cilium_*` style wildcards included).
pub fn ifname(name: &str) -> NftValue {
    value(nft_value::Value::Ifname(name.to_string()))
}

/// An address or prefix: `10.0.0.1`, `10.0.0.0/8`, an `Ipv4Addr`, an `Ipv4Net`.
pub fn addr(a: impl Display) -> NftValue {
    value(nft_value::Value::Addr(a.to_string()))
}

pub fn proto(p: L4Proto) -> NftValue {
    value(nft_value::Value::Proto(p as i32))
}

/// One port.
pub fn port(p: u32) -> NftValue {
    ports(p, p)
}

/// An inclusive port range.
pub fn ports(first: u32, last: u32) -> NftValue {
    value(nft_value::Value::Port(port_range(first, last)))
}

pub fn port_range(first: u32, last: u32) -> PortRange {
    PortRange { first, last }
}

pub fn mark(m: u32) -> NftValue {
    value(nft_value::Value::Mark(m))
}

/// A user or group id (`meta skuid`, `meta skgid`).
pub fn id(i: u32) -> NftValue {
    value(nft_value::Value::Id(i))
}

/// A verdict map's data (`jump g-1`); `chain` only for jump and goto.
pub fn verdict_value(kind: VerdictKind, chain: &str) -> NftValue {
    value(nft_value::Value::Verdict(Verdict { kind: kind as i32, chain: chain.to_string() }))
}

/// `jump CHAIN` as a verdict map's data.
pub fn jump_to(chain: &str) -> NftValue {
    verdict_value(VerdictKind::Jump, chain)
}

// ---- sets ------------------------------------------------------------------------------------

/// A map element: its key and its data.
pub fn element(key: Vec<NftValue>, data: Vec<NftValue>) -> NftElement {
    NftElement { key, data }
}

/// A set element: a key without data.
pub fn member(key: Vec<NftValue>) -> NftElement {
    NftElement { key, data: Vec::new() }
}

pub fn types(types: &[NftType]) -> Vec<i32> {
    types.iter().map(|t| *t as i32).collect()
}

pub fn selectors(selectors: &[Selector]) -> Vec<i32> {
    selectors.iter().map(|s| *s as i32).collect()
}

/// A hash set (no `data`) or map, without flags or counter; set those with struct update,
/// `NftSet { interval: true, ..set(...) }`.
pub fn set(name: &str, key: &[NftType], data: &[NftType], elements: Vec<NftElement>) -> NftSet {
    NftSet {
        name: name.to_string(),
        key: types(key),
        data: types(data),
        elements: elements.into(),
        ..NftSet::default()
    }
}

/// A dynamic set (`flags dynamic`, and `flags timeout` with `timeout Ns` when `timeout_seconds`
/// is not 0) of at most `size` elements, filled by [`set_update`] statements; it lists no
/// elements. Prefer a `size` that is a multiple of 65536: the kernel sizes its table from the
/// low 16 bits (docs/decisions.md).
pub fn dynamic_set(name: &str, key: &[NftType], size: u32, timeout_seconds: u32) -> NftSet {
    NftSet { dynamic: true, size, timeout_seconds, ..set(name, key, &[], Vec::new()) }
}

// ---- matches ---------------------------------------------------------------------------------

/// `sel [!=] value`, under `mask` (0: none; marks only).
pub fn compare(sel: Selector, op: CmpOp, value: NftValue, mask: u32) -> NftMatch {
    let c = Compare { selector: sel as i32, op: op as i32, value: Some(value), mask };
    NftMatch { kind: Some(nft_match::Kind::Compare(c)) }
}

/// `sel value`.
pub fn eq(sel: Selector, value: NftValue) -> NftMatch {
    compare(sel, CmpOp::Eq, value, 0)
}

/// `sel != value`.
pub fn ne(sel: Selector, value: NftValue) -> NftMatch {
    compare(sel, CmpOp::Neq, value, 0)
}

/// `key @set`.
pub fn lookup(key: &[Selector], set: &str) -> NftMatch {
    set_lookup(key, set, false)
}

/// `key != @set`.
pub fn not_lookup(key: &[Selector], set: &str) -> NftMatch {
    set_lookup(key, set, true)
}

/// `sel { v, v }`: a literal (anonymous, constant) set; the values are sorted as nft lists them.
pub fn in_literal(sel: Selector, mut values: Vec<NftValue>) -> NftMatch {
    crate::canonical::sort_values(&mut values);
    let l = LiteralSet { selector: sel as i32, values, negate: false };
    NftMatch { kind: Some(nft_match::Kind::Literal(l)) }
}

/// `sel != { v, v }`: the negated literal set.
pub fn not_in_literal(sel: Selector, values: Vec<NftValue>) -> NftMatch {
    let mut m = in_literal(sel, values);
    if let Some(nft_match::Kind::Literal(l)) = &mut m.kind {
        l.negate = true;
    }
    m
}

/// The TCP flag bits, as nft names them (`tcp flags`).
pub mod tcp_flag {
    pub const FIN: u32 = 0x01;
    pub const SYN: u32 = 0x02;
    pub const RST: u32 = 0x04;
    pub const PSH: u32 = 0x08;
    pub const ACK: u32 = 0x10;
    pub const URG: u32 = 0x20;
    pub const ECN: u32 = 0x40;
    pub const CWR: u32 = 0x80;
}

/// `tcp flags VALUE / MASK`: the flags under `mask` equal `value` (`tcp flags syn / syn,rst`
/// is `tcp_flags(SYN, SYN | RST)`: a SYN or a SYN-ACK, not a reset).
pub fn tcp_flags(value: u32, mask: u32) -> NftMatch {
    NftMatch { kind: Some(nft_match::Kind::TcpFlags(TcpFlags { value, mask })) }
}

/// The `ct state` bits, as nft names them.
pub mod ct_state {
    pub const INVALID: u32 = 0x01;
    pub const ESTABLISHED: u32 = 0x02;
    pub const RELATED: u32 = 0x04;
    pub const NEW: u32 = 0x08;
    pub const UNTRACKED: u32 = 0x40;
}

/// `ct state S[,S]`: the connection's state is one of `states` ([`ct_state`] bits).
pub fn ct_state(states: u32) -> NftMatch {
    NftMatch { kind: Some(nft_match::Kind::CtState(CtState { states })) }
}

fn set_lookup(key: &[Selector], set: &str, negate: bool) -> NftMatch {
    let l = SetLookup { key: selectors(key), set: set.to_string(), negate };
    NftMatch { kind: Some(nft_match::Kind::Lookup(l)) }
}

// ---- statements ------------------------------------------------------------------------------

fn statement(kind: nft_statement::Kind) -> NftStatement {
    NftStatement { kind: Some(kind) }
}

pub fn counter() -> NftStatement {
    statement(nft_statement::Kind::Counter(Counter {}))
}

/// A verdict; `chain` only for jump and goto.
pub fn verdict(kind: VerdictKind, chain: &str) -> NftStatement {
    statement(nft_statement::Kind::Verdict(Verdict { kind: kind as i32, chain: chain.to_string() }))
}

pub fn accept() -> NftStatement {
    verdict(VerdictKind::Accept, "")
}

pub fn drop() -> NftStatement {
    verdict(VerdictKind::Drop, "")
}

pub fn jump(chain: &str) -> NftStatement {
    verdict(VerdictKind::Jump, chain)
}

pub fn goto(chain: &str) -> NftStatement {
    verdict(VerdictKind::Goto, chain)
}

/// `key vmap @map`: the verdict a verdict map holds for the key.
pub fn verdict_map(key: &[Selector], map: &str) -> NftStatement {
    statement(nft_statement::Kind::VerdictMap(VerdictMap { key: selectors(key), map: map.to_string() }))
}

/// `limit rate [over] RATE/second [burst BURST packets]`.
pub fn limit(rate: u64, burst: u32, over: bool) -> set_update::Stateful {
    set_update::Stateful::Limit(Limit { rate, burst, over })
}

/// `ct count [over] COUNT`.
pub fn ct_count(count: u32, over: bool) -> set_update::Stateful {
    set_update::Stateful::CtCount(ConnLimit { count, over })
}

/// `update @set { KEY [. TAG] limit ... }` or `add @set { KEY [. TAG] ct count ... }` (the
/// operation follows the stateful expression, as nft writes them).
pub fn set_update(key: &[Selector], tag: Option<u32>, set: &str, stateful: set_update::Stateful) -> NftStatement {
    let u = SetUpdate { key: selectors(key), tag, set: set.to_string(), stateful: Some(stateful) };
    statement(nft_statement::Kind::SetUpdate(u))
}

/// `key map @map`, the source of a nat, redirect or mark statement.
pub fn map_lookup(key: &[Selector], map: &str) -> MapLookup {
    MapLookup { key: selectors(key), map: map.to_string() }
}

pub fn nat(kind: NatKind, family: NftFamily, to: nat::To) -> NftStatement {
    statement(nft_statement::Kind::Nat(Nat { kind: kind as i32, family: family as i32, to: Some(to) }))
}

/// `snat|dnat [family] to ADDR[:PORT]`; an empty `addr` with a port is `to :PORT`.
pub fn nat_to_addr(kind: NatKind, family: NftFamily, addr: &str, port: Option<PortRange>) -> NftStatement {
    nat(kind, family, nat::To::Target(NatTarget { addr: addr.to_string(), port }))
}

/// `snat|dnat [family] to SELECTOR` (`snat ip to ip saddr`).
pub fn nat_to_selector(kind: NatKind, family: NftFamily, sel: Selector) -> NftStatement {
    nat(kind, family, nat::To::Selector(sel as i32))
}

/// `snat|dnat [family] to KEY map @map`.
pub fn nat_to_map(kind: NatKind, family: NftFamily, key: &[Selector], map: &str) -> NftStatement {
    nat(kind, family, nat::To::Map(map_lookup(key, map)))
}

/// `redirect to :FIRST[-LAST]`.
pub fn redirect_to_port(first: u32, last: u32) -> NftStatement {
    statement(nft_statement::Kind::Redirect(Redirect { to: Some(redirect::To::Port(port_range(first, last))) }))
}

/// `redirect to :KEY map @map`.
pub fn redirect_to_map(key: &[Selector], map: &str) -> NftStatement {
    statement(nft_statement::Kind::Redirect(Redirect { to: Some(redirect::To::Map(map_lookup(key, map))) }))
}

/// `meta mark set FROM`.
pub fn meta_mark_set(from: set_mark::From) -> NftStatement {
    statement(nft_statement::Kind::MetaMarkSet(SetMark { from: Some(from) }))
}

/// `ct mark set FROM`.
pub fn ct_mark_set(from: set_mark::From) -> NftStatement {
    statement(nft_statement::Kind::CtMarkSet(SetMark { from: Some(from) }))
}

/// `tcp option maxseg size set rt mtu`: the MSS option clamped to the route's MTU.
/// `ip daddr set K map @m`: the destination rewritten to the map's address, checksums updated.
pub fn ip_daddr_set_map(key: &[Selector], map: &str) -> NftStatement {
    let a = crate::v1::AddressSet { selector: Selector::IpDaddr as i32, map: Some(map_lookup(key, map)) };
    statement(nft_statement::Kind::AddressSet(a))
}

pub fn tcp_mss_clamp() -> NftStatement {
    statement(nft_statement::Kind::TcpMssClamp(TcpMssClamp {}))
}

// ---- rules, chains, tables -------------------------------------------------------------------

pub fn rule(matches: Vec<NftMatch>, statements: Vec<NftStatement>) -> NftRule {
    NftRule { matches, statements }
}

/// A regular chain (no hook).
pub fn chain(name: &str, rules: Vec<NftRule>) -> NftChain {
    NftChain { name: name.to_string(), base: None, rules }
}

/// A base chain on `hook` at `priority`.
pub fn base_chain(
    name: &str,
    ty: ChainType,
    hook: Hook,
    priority: i32,
    policy: ChainPolicy,
    rules: Vec<NftRule>,
) -> NftChain {
    let base = BaseChain { r#type: ty as i32, hook: hook as i32, priority, policy: policy as i32 };
    NftChain { name: name.to_string(), base: Some(base), rules }
}

pub fn table(family: NftFamily, name: &str, sets: Vec<NftSet>, chains: Vec<NftChain>) -> NftTable {
    NftTable { family: family as i32, name: name.to_string(), sets: sets.into(), chains: chains.into() }
}

// ---- WireGuard -------------------------------------------------------------------------------

/// A WireGuard device `name` (mtu 0 keeps the device's own; listen port 0 lets it choose), no
/// fwmark; set `fwmark` with struct update.
pub fn wireguard_device(
    name: &str,
    mtu: u32,
    listen_port: u16,
    peers: impl Into<crate::wireguard::Peers>,
) -> WireguardDevice {
    WireguardDevice { name: name.to_string(), mtu, listen_port: u32::from(listen_port), fwmark: 0, peers: peers.into() }
}

/// A peer by its base64 public key; `endpoint` None for none; keepalive 0 for off. Allowed IPs
/// are any prefixes (`Ipv4Net`, `"10.42.1.0/24"`).
pub fn wireguard_peer<P: Display>(
    public_key: &str,
    endpoint: Option<std::net::SocketAddr>,
    allowed_ips: &[P],
    keepalive_seconds: u16,
) -> WireguardPeer {
    WireguardPeer {
        public_key: public_key.to_string(),
        endpoint: endpoint.map(|e| e.to_string()).unwrap_or_default(),
        allowed_ips: allowed_ips.iter().map(ToString::to_string).collect(),
        persistent_keepalive_seconds: u32::from(keepalive_seconds),
        probe_address: String::new(),
    }
}
