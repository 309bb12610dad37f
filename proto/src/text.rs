//! The canonical text of a node state: nftables exactly as `nft -s list table` prints them once
//! loaded, then the `ip` commands that would create the rest. Golden tests compare this text.
//!
//! The model says what kuport sends; this module prints what nft 1.0.6 (x86_64, little-endian)
//! lists back. nft normalises on the way through the kernel, and this renderer reproduces each
//! normalisation it knows of:
//!
//! - Sets and maps are listed in model order, chains after them, also in model order (nft lists
//!   both in creation order). Elements are not: hash sets are sorted by nft's 1.0.6 merge sort
//!   (see [`element_sort_key`]), single-field interval sets by value, and concatenated interval
//!   sets (pipapo) keep insertion order.
//! - Prefixes lose their host bits (`10.0.0.1/8` lists as `10.0.0.0/8`) and full-length prefixes
//!   print as plain addresses.
//! - Marks print as `0x%08x`; a compare under a mask of leading ones prints as `value/len`.
//! - A `meta l4proto tcp|udp` match sets the protocol context: later `th` selectors list as
//!   `tcp`/`udp`, and the match itself disappears when the next transport-header payload in a
//!   match, a nat map key or a mark map key consumes it as its dependency (nft's
//!   "dependency kill"). `tcp`/`udp` selectors get that dependency implicitly.
//! - An equality on a source port directly followed (in header order) by one on a destination
//!   port is merged into one 32-bit compare; it lists as `tcp sport S tcp dport D` under a
//!   protocol context and as the raw `@th,0,32 0x...` without one.
//! - `dnat ip to ADDR` lists without the family in `ip`/`ip6` tables; the family stays in `inet`
//!   tables and with `addr . port` maps.
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
//!
//! Nonsense in the model (unspecified enums, values of the wrong kind, unknown sets) renders as
//! a visible `<invalid ...>` marker instead of panicking.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::v1::{
    BaseChain, ChainPolicy, ChainType, CmpOp, Compare, Hook, IpRule, L4Proto, Link, MapLookup, Nat, NatKind,
    NetnsState, NftChain, NftElement, NftFamily, NftMatch, NftRule, NftSet, NftStatement, NftTable, NftType, NftValue,
    NodeState, PortRange, Redirect, Route, Selector, SetLookup, SetMark, Verdict, VerdictKind, link, nat, nft_match,
    nft_statement, nft_value, redirect, set_mark,
};

/// Renders a whole node state: for each netns in order a `# netns <path|host>` header, its
/// tables as [`nft_table`] prints them, then its [`ip_commands`]. Netns sections are separated
/// by a blank line.
pub fn node_state(state: &NodeState) -> String {
    let mut out = String::new();
    for (i, ns) in state.netns.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let path = if ns.path.is_empty() { "host" } else { ns.path.as_str() };
        let _ = writeln!(out, "# netns {path}");
        for table in &ns.nft_tables {
            out.push_str(&nft_table(table));
        }
        out.push_str(&ip_commands(ns));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// ip commands
// ---------------------------------------------------------------------------------------------

/// The `sysctl`/`ip` commands that create a netns's non-nftables state, one per line: sysctls,
/// links (add, then mtu and up), addresses, routes, ip rules.
pub fn ip_commands(ns: &NetnsState) -> String {
    let mut out = String::new();
    for s in &ns.sysctls {
        let _ = writeln!(out, "sysctl -w {}={}", s.key, s.value);
    }
    for l in &ns.links {
        link_commands(&mut out, l);
    }
    for a in &ns.addresses {
        let _ = writeln!(out, "ip addr add {} dev {}", a.cidr, a.dev);
    }
    for r in &ns.routes {
        let _ = writeln!(out, "{}", route_command(r));
    }
    for r in &ns.ip_rules {
        let _ = writeln!(out, "{}", rule_command(r));
    }
    out
}

fn link_commands(out: &mut String, l: &Link) {
    match &l.kind {
        Some(link::Kind::Vxlan(v)) => {
            let _ = writeln!(
                out,
                "ip link add {} type vxlan id {} local {} remote {} dstport {} ttl {}",
                l.name, v.vni, v.local, v.remote, v.dstport, v.ttl
            );
        }
        None => {
            let _ = writeln!(out, "ip link add {} type <invalid link kind>", l.name);
        }
    }
    let _ = writeln!(out, "ip link set {} mtu {} up", l.name, l.mtu);
}

fn route_command(r: &Route) -> String {
    let mut s = format!("ip route add {}", r.dst);
    if !r.via.is_empty() {
        let _ = write!(s, " via {}", r.via);
    }
    let _ = write!(s, " dev {} table {}", r.dev, route_table(r.table));
    s
}

fn rule_command(r: &IpRule) -> String {
    let mut s = format!("ip rule add pref {} fwmark {:#x}/{:#x}", r.pref, r.fwmark, r.fwmask);
    if !r.to.is_empty() {
        let _ = write!(s, " to {}", r.to);
    }
    let _ = write!(s, " lookup {}", route_table(r.table));
    s
}

fn route_table(t: u32) -> String {
    if t == 254 { "main".to_string() } else { t.to_string() }
}

// ---------------------------------------------------------------------------------------------
// Tables, sets, chains
// ---------------------------------------------------------------------------------------------

/// The text `nft -s list table <family> <name>` prints once `t` is loaded (nft 1.0.6).
pub fn nft_table(t: &NftTable) -> String {
    let family = NftFamily::try_from(t.family).unwrap_or(NftFamily::Unspecified);
    let mut out = format!("table {} {} {{\n", family_name(family), name_text(&t.name));
    let mut delim = "";
    for set in &t.sets {
        out.push_str(delim);
        set_text(&mut out, set);
        delim = "\n";
    }
    for chain in &t.chains {
        out.push_str(delim);
        chain_text(&mut out, t, family, chain);
        delim = "\n";
    }
    out.push_str("}\n");
    out
}

fn family_name(f: NftFamily) -> &'static str {
    match f {
        NftFamily::Ip => "ip",
        NftFamily::Ip6 => "ip6",
        NftFamily::Inet => "inet",
        NftFamily::Unspecified => "<invalid family>",
    }
}

fn nft_type(t: i32) -> Option<NftType> {
    NftType::try_from(t).ok().filter(|t| *t != NftType::Unspecified)
}

fn type_name(t: i32) -> &'static str {
    match nft_type(t) {
        Some(NftType::Ifname) => "ifname",
        Some(NftType::Ipv4Addr) => "ipv4_addr",
        Some(NftType::Ipv6Addr) => "ipv6_addr",
        Some(NftType::InetProto) => "inet_proto",
        Some(NftType::InetService) => "inet_service",
        Some(NftType::Mark) => "mark",
        Some(NftType::Unspecified) | None => "<invalid type>",
    }
}

fn type_list(types: &[i32]) -> String {
    if types.is_empty() {
        return "<invalid type>".to_string();
    }
    types.iter().map(|t| type_name(*t)).collect::<Vec<_>>().join(" . ")
}

fn set_text(out: &mut String, set: &NftSet) {
    let is_map = !set.data.is_empty();
    let kind = if is_map { "map" } else { "set" };
    let _ = writeln!(out, "\t{kind} {} {{", name_text(&set.name));
    let _ = write!(out, "\t\ttype {}", type_list(&set.key));
    if is_map {
        let _ = write!(out, " : {}", type_list(&set.data));
    }
    out.push('\n');
    if set.interval {
        out.push_str("\t\tflags interval\n");
    }
    if set.counter {
        out.push_str("\t\tcounter\n");
    }
    if !set.elements.is_empty() {
        out.push_str("\t\telements = { ");
        // nft's calculate_delim: how many elements of the key's type share a line.
        let per_line = match set.key.as_slice() {
            [t] => match nft_type(*t) {
                Some(NftType::InetProto | NftType::InetService | NftType::Mark) => 5,
                Some(NftType::Ipv4Addr) => 2,
                _ => 1,
            },
            _ => 1,
        };
        let mut count = 0;
        for (i, e) in ordered_elements(set).into_iter().enumerate() {
            if i > 0 {
                if count < per_line {
                    out.push_str(", ");
                } else {
                    count = 0;
                    out.push_str(",\n\t\t\t     ");
                }
            }
            element_text(out, set, e);
            count += 1;
        }
        out.push_str(" }\n");
    }
    out.push_str("\t}\n");
}

fn element_text(out: &mut String, set: &NftSet, e: &NftElement) {
    out.push_str(&values_text(&set.key, &e.key));
    if set.counter {
        out.push_str(" counter");
    }
    if !set.data.is_empty() || !e.data.is_empty() {
        out.push_str(" : ");
        out.push_str(&values_text(&set.data, &e.data));
    }
}

/// One element's key or data: one value per declared component.
fn values_text(types: &[i32], values: &[NftValue]) -> String {
    let n = types.len().max(values.len());
    (0..n)
        .map(|i| match (types.get(i), values.get(i)) {
            (Some(t), Some(v)) => typed_value_text(*t, v),
            (None, Some(_)) => "<extra value>".to_string(),
            _ => "<missing value>".to_string(),
        })
        .collect::<Vec<_>>()
        .join(" . ")
}

fn typed_value_text(t: i32, v: &NftValue) -> String {
    use nft_value::Value;
    match (nft_type(t), &v.value) {
        (Some(NftType::Ifname), Some(Value::Ifname(s))) => quoted(s),
        (Some(NftType::Ipv4Addr), Some(Value::Addr(a))) => addr_text(a, Some(AddrFamily::V4)),
        (Some(NftType::Ipv6Addr), Some(Value::Addr(a))) => addr_text(a, Some(AddrFamily::V6)),
        (Some(NftType::InetProto), Some(Value::Proto(p))) => proto_name(*p).to_string(),
        (Some(NftType::InetService), Some(Value::Port(r))) => port_text(r),
        (Some(NftType::Mark), Some(Value::Mark(m))) => mark_text(*m),
        (Some(_), _) => format!("<invalid {} value>", type_name(t)),
        (None, _) => "<invalid value>".to_string(),
    }
}

/// The elements in the order nft lists them.
fn ordered_elements(set: &NftSet) -> Vec<&NftElement> {
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
        Some(NftType::Unspecified) | None => Vec::new(),
    }
}

fn addr_of(v: &nft_value::Value) -> Option<Addr> {
    match v {
        nft_value::Value::Addr(a) => parse_addr(a),
        _ => None,
    }
}

fn chain_text(out: &mut String, table: &NftTable, family: NftFamily, chain: &NftChain) {
    let _ = writeln!(out, "\tchain {} {{", name_text(&chain.name));
    if let Some(base) = &chain.base {
        let _ = writeln!(out, "\t\t{}", base_chain_text(family, base));
    }
    for rule in &chain.rules {
        let _ = writeln!(out, "\t\t{}", rule_text(table, family, rule));
    }
    out.push_str("\t}\n");
}

fn base_chain_text(family: NftFamily, base: &BaseChain) -> String {
    let ty = match ChainType::try_from(base.r#type) {
        Ok(ChainType::Filter) => "filter",
        Ok(ChainType::Nat) => "nat",
        Ok(ChainType::Route) => "route",
        _ => "<invalid chain type>",
    };
    let hook = Hook::try_from(base.hook).unwrap_or(Hook::Unspecified);
    let hook_name = match hook {
        Hook::Prerouting => "prerouting",
        Hook::Input => "input",
        Hook::Forward => "forward",
        Hook::Output => "output",
        Hook::Postrouting => "postrouting",
        Hook::Unspecified => "<invalid hook>",
    };
    let policy = match ChainPolicy::try_from(base.policy) {
        Ok(ChainPolicy::Accept) => "accept",
        Ok(ChainPolicy::Drop) => "drop",
        Err(_) => "<invalid policy>",
    };
    format!("type {ty} hook {hook_name} priority {}; policy {policy};", priority_text(family, hook, base.priority))
}

/// nft's prio2str: the first standard priority within 10 of `prio` names it, unless that name
/// does not belong to this family and hook, in which case the number is printed.
fn priority_text(family: NftFamily, hook: Hook, prio: i32) -> String {
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
        if !compatible {
            break;
        }
        return match offset {
            0 => name.to_string(),
            o if o > 0 => format!("{name} + {o}"),
            o => format!("{name} - {}", -o),
        };
    }
    prio.to_string()
}

// ---------------------------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// A statement as the kernel holds it after nft has evaluated the rule.
enum KStmt<'a> {
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

fn rule_text(table: &NftTable, family: NftFamily, rule: &NftRule) -> String {
    let kernel = merge_ports(evaluate(rule));
    let text = list(table, family, &kernel);
    if text.is_empty() { "<empty rule>".to_string() } else { text }
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

/// The selectors a match reads.
fn match_selectors(m: &NftMatch) -> &[i32] {
    match &m.kind {
        Some(nft_match::Kind::Compare(c)) => std::slice::from_ref(&c.selector),
        Some(nft_match::Kind::Lookup(l)) => &l.key,
        None => &[],
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
fn list(table: &NftTable, family: NftFamily, kernel: &[KStmt<'_>]) -> String {
    let mut out: Vec<Option<String>> = Vec::new();
    let mut ctx: Option<Proto> = None;
    let mut pending: Option<usize> = None;
    for k in kernel {
        match k {
            KStmt::ImplicitDep(p) => {
                ctx = Some(*p);
                pending = Some(out.len());
                out.push(Some(format!("meta l4proto {}", p.name())));
            }
            KStmt::MergedPorts { sport, dport } => match ctx {
                Some(p) => {
                    kill(&mut out, &mut pending);
                    let p = p.name();
                    out.push(Some(format!("{p} sport {sport} {p} dport {dport}")));
                }
                None => out.push(Some(format!("@th,0,32 {:#x}", (sport << 16) | dport))),
            },
            KStmt::Match(m) => {
                let text = match_text(table, ctx, m);
                if let Some(nft_match::Kind::Compare(c)) = &m.kind
                    && let Some(p) = l4proto_eq(c)
                {
                    ctx = Some(p);
                    pending = Some(out.len());
                } else if match_selectors(m).iter().any(|s| is_transport(*s)) {
                    kill(&mut out, &mut pending);
                }
                out.push(Some(text));
            }
            KStmt::Stmt(s) => {
                let (keys, kills) = statement_keys(s);
                if kills && keys.iter().any(|s| is_transport(*s)) {
                    kill(&mut out, &mut pending);
                }
                out.push(Some(statement_text(table, family, ctx, s)));
                // Any statement other than a match ends the dependency's reach.
                pending = None;
            }
        }
    }
    out.into_iter().flatten().collect::<Vec<_>>().join(" ")
}

fn kill(out: &mut [Option<String>], pending: &mut Option<usize>) {
    if let Some(i) = pending.take()
        && let Some(slot) = out.get_mut(i)
    {
        *slot = None;
    }
}

fn selector_text(sel: i32, ctx: Option<Proto>) -> String {
    let transport = |field: &str, own: &str| match ctx {
        Some(p) => format!("{} {field}", p.name()),
        None => format!("{own} {field}"),
    };
    match Selector::try_from(sel) {
        Ok(Selector::Iifname) => "iifname".into(),
        Ok(Selector::Oifname) => "oifname".into(),
        Ok(Selector::L4proto) => "meta l4proto".into(),
        Ok(Selector::IpSaddr) => "ip saddr".into(),
        Ok(Selector::IpDaddr) => "ip daddr".into(),
        Ok(Selector::Ip6Saddr) => "ip6 saddr".into(),
        Ok(Selector::Ip6Daddr) => "ip6 daddr".into(),
        Ok(Selector::ThSport) => transport("sport", "th"),
        Ok(Selector::ThDport) => transport("dport", "th"),
        Ok(Selector::TcpSport) => transport("sport", "tcp"),
        Ok(Selector::TcpDport) => transport("dport", "tcp"),
        Ok(Selector::UdpSport) => transport("sport", "udp"),
        Ok(Selector::UdpDport) => transport("dport", "udp"),
        Ok(Selector::MetaMark) => "meta mark".into(),
        Ok(Selector::CtMark) => "ct mark".into(),
        Ok(Selector::MetaSkuid) => "meta skuid".into(),
        Ok(Selector::MetaSkgid) => "meta skgid".into(),
        Ok(Selector::Unspecified) | Err(_) => "<invalid selector>".into(),
    }
}

fn selectors_text(sels: &[i32], ctx: Option<Proto>) -> String {
    if sels.is_empty() {
        return "<invalid empty key>".into();
    }
    sels.iter().map(|s| selector_text(*s, ctx)).collect::<Vec<_>>().join(" . ")
}

fn set_ref(table: &NftTable, name: &str) -> String {
    if table.sets.iter().any(|s| s.name == name) { format!("@{name}") } else { format!("@{name} <unknown set>") }
}

fn match_text(table: &NftTable, ctx: Option<Proto>, m: &NftMatch) -> String {
    match &m.kind {
        Some(nft_match::Kind::Compare(c)) => compare_text(ctx, c),
        Some(nft_match::Kind::Lookup(l)) => lookup_text(table, ctx, l),
        None => "<invalid match>".into(),
    }
}

fn lookup_text(table: &NftTable, ctx: Option<Proto>, l: &SetLookup) -> String {
    let op = if l.negate { "!= " } else { "" };
    format!("{} {op}{}", selectors_text(&l.key, ctx), set_ref(table, &l.set))
}

fn compare_text(ctx: Option<Proto>, c: &Compare) -> String {
    use nft_value::Value;
    let sel = selector_text(c.selector, ctx);
    let neq = match CmpOp::try_from(c.op) {
        Ok(CmpOp::Eq) => false,
        Ok(CmpOp::Neq) => true,
        Err(_) => return format!("{sel} <invalid op>"),
    };
    let op = if neq { "!= " } else { "" };
    let selector = Selector::try_from(c.selector).unwrap_or(Selector::Unspecified);
    let value = c.value.as_ref().and_then(|v| v.value.as_ref());
    if matches!(selector, Selector::MetaMark | Selector::CtMark) {
        let Some(Value::Mark(v)) = value else {
            return format!("{sel} {op}<invalid mark value>");
        };
        return mark_compare_text(&sel, neq, c.mask, *v);
    }
    if c.mask != 0 {
        return format!("{sel} {op}<invalid mask on a non-mark selector>");
    }
    let v = match (selector, value) {
        (Selector::Iifname | Selector::Oifname, Some(Value::Ifname(s))) => quoted(s),
        (Selector::L4proto, Some(Value::Proto(p))) => proto_name(*p).to_string(),
        (Selector::IpSaddr | Selector::IpDaddr, Some(Value::Addr(a))) => addr_text(a, Some(AddrFamily::V4)),
        (Selector::Ip6Saddr | Selector::Ip6Daddr, Some(Value::Addr(a))) => addr_text(a, Some(AddrFamily::V6)),
        (
            Selector::ThSport
            | Selector::ThDport
            | Selector::TcpSport
            | Selector::TcpDport
            | Selector::UdpSport
            | Selector::UdpDport,
            Some(Value::Port(r)),
        ) => port_text(r),
        (Selector::MetaSkuid | Selector::MetaSkgid, Some(Value::Id(i))) => i.to_string(),
        _ => "<invalid value>".into(),
    };
    format!("{sel} {op}{v}")
}

/// A mark compare as nft lists it: a mask of leading ones becomes `value/len`, a full mask
/// disappears, any other mask stays an explicit `&`.
fn mark_compare_text(sel: &str, neq: bool, mask: u32, value: u32) -> String {
    let op = if neq { "!= " } else { "" };
    if mask == 0 || mask == u32::MAX {
        return format!("{sel} {op}{}", mark_text(value));
    }
    let len = mask.leading_ones();
    if len > 0 && u32::MAX.checked_shl(32 - len) == Some(mask) {
        return format!("{sel} {op}{}/{len}", mark_text(value));
    }
    let op = if neq { "!=" } else { "==" };
    format!("{sel} & {} {op} {}", mark_text(mask), mark_text(value))
}

fn statement_text(table: &NftTable, family: NftFamily, ctx: Option<Proto>, s: &NftStatement) -> String {
    match &s.kind {
        Some(nft_statement::Kind::Counter(_)) => "counter".into(),
        Some(nft_statement::Kind::Nat(n)) => nat_text(table, family, ctx, n),
        Some(nft_statement::Kind::Redirect(r)) => match &r.to {
            Some(redirect::To::Port(p)) => format!("redirect to :{}", port_text(p)),
            Some(redirect::To::Map(m)) => format!("redirect to :{}", map_text(table, ctx, m)),
            None => "redirect to <invalid redirect target>".into(),
        },
        Some(nft_statement::Kind::MetaMarkSet(m)) => {
            format!("meta mark set {}", set_mark_text(table, ctx, m))
        }
        Some(nft_statement::Kind::CtMarkSet(m)) => {
            format!("ct mark set {}", set_mark_text(table, ctx, m))
        }
        Some(nft_statement::Kind::Verdict(v)) => verdict_text(v),
        None => "<invalid statement>".into(),
    }
}

fn map_text(table: &NftTable, ctx: Option<Proto>, m: &MapLookup) -> String {
    format!("{} map {}", selectors_text(&m.key, ctx), set_ref(table, &m.map))
}

fn set_mark_text(table: &NftTable, ctx: Option<Proto>, m: &SetMark) -> String {
    match &m.from {
        Some(set_mark::From::Value(v)) => mark_text(*v),
        Some(set_mark::From::Map(map)) => map_text(table, ctx, map),
        Some(set_mark::From::Selector(sel)) => selector_text(*sel, ctx),
        None => "<invalid mark source>".into(),
    }
}

fn nat_text(table: &NftTable, family: NftFamily, ctx: Option<Proto>, n: &Nat) -> String {
    let kind = match NatKind::try_from(n.kind) {
        Ok(NatKind::Snat) => "snat",
        Ok(NatKind::Dnat) => "dnat",
        _ => "<invalid nat kind>",
    };
    let nat_family = NftFamily::try_from(n.family).unwrap_or(NftFamily::Unspecified);
    // nft lists the family only where it cannot be implied: in inet tables, with a map whose
    // data is `addr . port`, or (nonsense) when it contradicts the table.
    let family_word = |concat: bool| -> String {
        let needed = family == NftFamily::Inet || concat || nat_family != family;
        match (needed, nat_family) {
            (false, _) => String::new(),
            (true, NftFamily::Ip) => " ip".into(),
            (true, NftFamily::Ip6) => " ip6".into(),
            (true, _) => " <invalid nat family>".into(),
        }
    };
    match &n.to {
        Some(nat::To::Target(t)) => {
            let port = t.port.as_ref().map(port_text);
            match (t.addr.is_empty(), port) {
                // `dnat ip to :80` does not parse in nft 1.0.6; a port alone never has a family.
                (true, Some(p)) => format!("{kind} to :{p}"),
                (true, None) => format!("{kind} to <invalid empty nat target>"),
                (false, None) => {
                    format!("{kind}{} to {}", family_word(false), addr_text(&t.addr, None))
                }
                (false, Some(p)) => {
                    let a = addr_text(&t.addr, None);
                    let a = match parse_addr(&t.addr) {
                        Some(Addr { ip: IpAddr::V6(_), .. }) => format!("[{a}]"),
                        _ => a,
                    };
                    format!("{kind}{} to {a}:{p}", family_word(false))
                }
            }
        }
        Some(nat::To::Selector(sel)) => {
            format!("{kind}{} to {}", family_word(false), selector_text(*sel, ctx))
        }
        Some(nat::To::Map(m)) => {
            let concat = table.sets.iter().find(|s| s.name == m.map).is_some_and(|s| s.data.len() > 1);
            format!("{kind}{} to {}", family_word(concat), map_text(table, ctx, m))
        }
        None => format!("{kind} to <invalid nat target>"),
    }
}

fn verdict_text(v: &Verdict) -> String {
    match VerdictKind::try_from(v.kind) {
        Ok(VerdictKind::Accept) => "accept".into(),
        Ok(VerdictKind::Drop) => "drop".into(),
        Ok(VerdictKind::Return) => "return".into(),
        Ok(VerdictKind::Jump) => format!("jump {}", name_text(&v.chain)),
        Ok(VerdictKind::Goto) => format!("goto {}", name_text(&v.chain)),
        _ => "<invalid verdict>".into(),
    }
}

/// A table, set or chain name; nft has no empty names.
fn name_text(name: &str) -> &str {
    if name.is_empty() { "<invalid empty name>" } else { name }
}

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

fn quoted(s: &str) -> String {
    format!("\"{s}\"")
}

fn proto_name(p: i32) -> &'static str {
    match L4Proto::try_from(p) {
        Ok(L4Proto::Tcp) => "tcp",
        Ok(L4Proto::Udp) => "udp",
        _ => "<invalid l4proto>",
    }
}

/// nft prints every mark as eight hex digits.
fn mark_text(m: u32) -> String {
    format!("{m:#010x}")
}

fn port_text(r: &PortRange) -> String {
    if r.first > 0xffff || r.last > 0xffff || r.first > r.last {
        return format!("<invalid port range {}-{}>", r.first, r.last);
    }
    if r.first == r.last { r.first.to_string() } else { format!("{}-{}", r.first, r.last) }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum AddrFamily {
    V4,
    V6,
}

struct Addr {
    ip: IpAddr,
    /// The prefix length; the full length for a plain address.
    len: u32,
}

/// Parses "a.b.c.d", "a.b.c.d/len" or their IPv6 forms, masking the host bits off a prefix.
fn parse_addr(s: &str) -> Option<Addr> {
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

/// An address or prefix as nft lists it: host bits cleared, full-length prefixes plain.
fn addr_text(s: &str, want: Option<AddrFamily>) -> String {
    let Some(a) = parse_addr(s) else {
        return format!("<invalid address {}>", quoted(s));
    };
    let (fam, max) = match a.ip {
        IpAddr::V4(_) => (AddrFamily::V4, 32),
        IpAddr::V6(_) => (AddrFamily::V6, 128),
    };
    if want.is_some_and(|w| w != fam) {
        return format!("<wrong address family {}>", quoted(s));
    }
    if a.len == max { a.ip.to_string() } else { format!("{}/{}", a.ip, a.len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_are_symbolic_near_standard_values() {
        let ip = NftFamily::Ip;
        assert_eq!(priority_text(ip, Hook::Prerouting, -110), "dstnat - 10");
        assert_eq!(priority_text(ip, Hook::Postrouting, 90), "srcnat - 10");
        assert_eq!(priority_text(ip, Hook::Prerouting, -140), "mangle + 10");
        assert_eq!(priority_text(ip, Hook::Input, 0), "filter");
        assert_eq!(priority_text(ip, Hook::Prerouting, -300), "raw");
        assert_eq!(priority_text(ip, Hook::Forward, 50), "security");
        // dstnat belongs to prerouting only in nft 1.0.6, and nothing is within 10 of -200.
        assert_eq!(priority_text(ip, Hook::Output, -101), "-101");
        assert_eq!(priority_text(ip, Hook::Prerouting, -200), "-200");
        assert_eq!(priority_text(ip, Hook::Output, 17), "17");
        assert_eq!(priority_text(NftFamily::Unspecified, Hook::Input, 0), "0");
    }

    #[test]
    fn mark_masks() {
        assert_eq!(mark_compare_text("ct mark", false, 0xffff_0000, 0x6b70_0000), "ct mark 0x6b700000/16");
        assert_eq!(mark_compare_text("ct mark", true, 0xffff_0000, 0x6b70_0000), "ct mark != 0x6b700000/16");
        assert_eq!(mark_compare_text("meta mark", false, 0xffff_ffff, 1), "meta mark 0x00000001");
        assert_eq!(mark_compare_text("meta mark", false, 0x8000_0000, 0x8000_0000), "meta mark 0x80000000/1");
        assert_eq!(mark_compare_text("meta mark", false, 0xff, 1), "meta mark & 0x000000ff == 0x00000001");
        assert_eq!(
            mark_compare_text("meta mark", true, 0xff00_ff00, 0x6b00_0000),
            "meta mark & 0xff00ff00 != 0x6b000000"
        );
    }

    #[test]
    fn addresses_are_normalised() {
        assert_eq!(addr_text("10.0.0.1/8", None), "10.0.0.0/8");
        assert_eq!(addr_text("10.0.0.1/32", None), "10.0.0.1");
        assert_eq!(addr_text("0.0.0.0/0", None), "0.0.0.0/0");
        assert_eq!(addr_text("fd00::1/64", None), "fd00::/64");
        assert_eq!(addr_text("fd00::5/128", None), "fd00::5");
        assert_eq!(addr_text("10.0.0.1/33", None), "<invalid address \"10.0.0.1/33\">");
        assert_eq!(addr_text("nonsense", None), "<invalid address \"nonsense\">");
        assert_eq!(addr_text("fd00::1", Some(AddrFamily::V4)), "<wrong address family \"fd00::1\">");
    }

    #[test]
    fn ports() {
        assert_eq!(port_text(&PortRange { first: 80, last: 80 }), "80");
        assert_eq!(port_text(&PortRange { first: 80, last: 90 }), "80-90");
        assert_eq!(port_text(&PortRange { first: 90, last: 80 }), "<invalid port range 90-80>");
        assert_eq!(port_text(&PortRange { first: 70000, last: 70000 }), "<invalid port range 70000-70000>");
    }
}
