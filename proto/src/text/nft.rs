//! Tables, sets, chains and rules in the syntax `nft -s list table` prints (nft 1.0.6), in the
//! forms [`super::normalize`] says nft lists them in.

use std::fmt::Write as _;
use std::net::IpAddr;

use super::normalize::{
    Addr, AddrFamily, KStmt, Listed, MaskForm, Proto, kernel_form, listing, mark_mask, nat_family_listed, nft_type,
    ordered_elements, parse_addr, standard_priority,
};
use crate::v1::{
    BaseChain, ChainPolicy, ChainType, CmpOp, Compare, Hook, L4Proto, LiteralSet, MapLookup, Nat, NatKind, NftChain,
    NftElement, NftFamily, NftMatch, NftRule, NftSet, NftStatement, NftTable, NftType, NftValue, PortRange, Selector,
    SetLookup, SetMark, SetUpdate, TcpFlags, Verdict, VerdictKind, nat, nft_match, nft_statement, nft_value, redirect,
    set_mark, set_update,
};

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

fn type_name(t: i32) -> &'static str {
    match nft_type(t) {
        Some(NftType::Ifname) => "ifname",
        Some(NftType::Ipv4Addr) => "ipv4_addr",
        Some(NftType::Ipv6Addr) => "ipv6_addr",
        Some(NftType::InetProto) => "inet_proto",
        Some(NftType::InetService) => "inet_service",
        Some(NftType::Mark) => "mark",
        Some(NftType::Verdict) => "verdict",
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
    if set.size != 0 {
        let _ = writeln!(out, "\t\tsize {}", set.size);
    }
    // nft's order: constant, interval, dynamic, timeout.
    let flags: Vec<&str> =
        [(set.interval, "interval"), (set.dynamic, "dynamic"), (set.timeout_seconds != 0, "timeout")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect();
    if !flags.is_empty() {
        let _ = writeln!(out, "\t\tflags {}", flags.join(","));
    }
    if set.timeout_seconds != 0 {
        let _ = writeln!(out, "\t\ttimeout {}", duration_text(set.timeout_seconds));
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

/// One element of `set` as nft lists it, for an error to name it.
pub fn set_element(set: &NftSet, e: &NftElement) -> String {
    let mut out = String::new();
    element_text(&mut out, set, e);
    out
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
        (Some(NftType::Verdict), Some(Value::Verdict(v))) => verdict_text(v),
        (Some(_), _) => format!("<invalid {} value>", type_name(t)),
        (None, _) => "<invalid value>".to_string(),
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

/// A chain priority as nft 1.0.6 prints it: by a standard name and offset where one is near.
fn priority_text(family: NftFamily, hook: Hook, prio: i32) -> String {
    match standard_priority(family, hook, prio) {
        Some((name, 0)) => name.to_string(),
        Some((name, o)) if o > 0 => format!("{name} + {o}"),
        Some((name, o)) => format!("{name} - {}", -o),
        None => prio.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------------------------

fn rule_text(table: &NftTable, family: NftFamily, rule: &NftRule) -> String {
    let kernel = kernel_form(rule);
    let text = listing(&kernel).iter().map(|l| listed_text(table, family, l)).collect::<Vec<_>>().join(" ");
    if text.is_empty() { "<empty rule>".to_string() } else { text }
}

fn listed_text(table: &NftTable, family: NftFamily, l: &Listed<'_, '_>) -> String {
    match l.stmt {
        KStmt::ImplicitDep(p) => format!("meta l4proto {}", p.name()),
        KStmt::MergedPorts { sport, dport } => match l.ctx {
            Some(p) => {
                let p = p.name();
                format!("{p} sport {sport} {p} dport {dport}")
            }
            None => format!("@th,0,32 {:#x}", (sport << 16) | dport),
        },
        KStmt::Match(m) => match_text(table, l.ctx, m),
        KStmt::Stmt(s) => statement_text(table, family, l.ctx, s),
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
        Ok(Selector::CtDirection) => "ct direction".into(),
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
        Some(nft_match::Kind::Literal(l)) => literal_text(ctx, l),
        Some(nft_match::Kind::TcpFlags(f)) => tcp_flags_text(f),
        Some(nft_match::Kind::CtState(c)) => ct_state_text(c.states),
        None => "<invalid match>".into(),
    }
}

fn lookup_text(table: &NftTable, ctx: Option<Proto>, l: &SetLookup) -> String {
    let op = if l.negate { "!= " } else { "" };
    format!("{} {op}{}", selectors_text(&l.key, ctx), set_ref(table, &l.set))
}

/// `sel { a, b }`: each value as a compare on `sel` would print it.
fn literal_text(ctx: Option<Proto>, l: &LiteralSet) -> String {
    let values: Vec<String> = l
        .values
        .iter()
        .map(|v| {
            let c = Compare { selector: l.selector, op: CmpOp::Eq as i32, value: Some(v.clone()), mask: 0 };
            let sel = selector_text(l.selector, ctx);
            let text = compare_text(ctx, &c);
            text.strip_prefix(&sel).map(|t| t.trim_start().to_string()).unwrap_or(text)
        })
        .collect();
    let op = if l.negate { "!= " } else { "" };
    if values.is_empty() {
        return format!("{} {op}<invalid empty literal set>", selector_text(l.selector, ctx));
    }
    format!("{} {op}{{ {} }}", selector_text(l.selector, ctx), values.join(", "))
}

/// `tcp flags ...` in the form nft 1.0.6 lists the flags byte under a mask: a full mask is a
/// plain equality (one flag by name, more as hex), a zero value is `! MASK`, a single flag that
/// must be set is spelled out as `& F == F`, anything else is `VALUE / MASK`.
fn tcp_flags_text(f: &TcpFlags) -> String {
    let (value, mask) = (f.value, f.mask);
    if mask == 0 || mask > 0xff || value & !mask != 0 {
        return format!("tcp flags <invalid tcp flags {value:#x} / {mask:#x}>");
    }
    if mask == 0xff {
        return if value.count_ones() == 1 {
            format!("tcp flags == {}", tcp_flag_names(value))
        } else {
            format!("tcp flags == {value:#x}")
        };
    }
    if value == 0 {
        return format!("tcp flags ! {}", tcp_flag_names(mask));
    }
    if value == mask && value.count_ones() == 1 {
        let f = tcp_flag_names(value);
        return format!("tcp flags & {f} == {f}");
    }
    format!("tcp flags {} / {}", tcp_flag_names(value), tcp_flag_names(mask))
}

/// `ct state NAMES`: the state bits by name, lowest first, comma-separated, as nft lists them.
fn ct_state_text(states: u32) -> String {
    const NAMES: [(u32, &str); 5] =
        [(0x01, "invalid"), (0x02, "established"), (0x04, "related"), (0x08, "new"), (0x40, "untracked")];
    let known: u32 = NAMES.iter().map(|(b, _)| b).sum();
    if states == 0 || states & !known != 0 {
        return format!("ct state <invalid ct state {states:#x}>");
    }
    let names: Vec<&str> = NAMES.iter().filter(|(b, _)| states & b != 0).map(|(_, n)| *n).collect();
    format!("ct state {}", names.join(","))
}

/// The set bits of a flags byte by name, lowest first, comma-separated (nft's `syn,rst`).
fn tcp_flag_names(bits: u32) -> String {
    const NAMES: [&str; 8] = ["fin", "syn", "rst", "psh", "ack", "urg", "ecn", "cwr"];
    NAMES.iter().enumerate().filter(|(i, _)| bits & (1 << i) != 0).map(|(_, n)| *n).collect::<Vec<_>>().join(",")
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
        (Selector::CtDirection, Some(Value::Id(0))) => "original".into(),
        (Selector::CtDirection, Some(Value::Id(1))) => "reply".into(),
        _ => "<invalid value>".into(),
    };
    format!("{sel} {op}{v}")
}

/// A mark compare as nft lists it: a mask of leading ones becomes `value/len`, a full mask
/// A mark compare as nft lists it: a mask of leading ones becomes `value/len`, a full mask
/// disappears, any other mask stays an explicit `&`.
fn mark_compare_text(sel: &str, neq: bool, mask: u32, value: u32) -> String {
    let op = if neq { "!= " } else { "" };
    match mark_mask(mask) {
        MaskForm::Full => format!("{sel} {op}{}", mark_text(value)),
        MaskForm::Prefix(len) => format!("{sel} {op}{}/{len}", mark_text(value)),
        MaskForm::Explicit => {
            let op = if neq { "!=" } else { "==" };
            format!("{sel} & {} {op} {}", mark_text(mask), mark_text(value))
        }
    }
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
        Some(nft_statement::Kind::TcpMssClamp(_)) => "tcp option maxseg size set rt mtu".into(),
        Some(nft_statement::Kind::AddressSet(a)) => match &a.map {
            Some(m) => format!("{} set {}", selector_text(a.selector, ctx), map_text(table, ctx, m)),
            None => "<invalid address set>".into(),
        },
        Some(nft_statement::Kind::VerdictMap(m)) => {
            format!("{} vmap {}", selectors_text(&m.key, ctx), set_ref(table, &m.map))
        }
        Some(nft_statement::Kind::SetUpdate(u)) => set_update_text(table, ctx, u),
        None => "<invalid statement>".into(),
    }
}

/// `update @s { KEY . TAG limit rate over R/second burst B packets }` or
/// `add @s { KEY . TAG ct count over N }`: nft omits the default burst of 5.
fn set_update_text(table: &NftTable, ctx: Option<Proto>, u: &SetUpdate) -> String {
    let mut key = selectors_text(&u.key, ctx);
    if let Some(tag) = u.tag {
        key = format!("{key} . {}", mark_text(tag));
    }
    let over = |o: bool| if o { "over " } else { "" };
    let (op, stateful) = match &u.stateful {
        Some(set_update::Stateful::Limit(l)) => {
            let burst = if l.burst == 5 { String::new() } else { format!(" burst {} packets", l.burst) };
            ("update", format!("limit rate {}{}/second{burst}", over(l.over), l.rate))
        }
        Some(set_update::Stateful::CtCount(c)) => ("add", format!("ct count {}{}", over(c.over), c.count)),
        None => ("update", "<invalid stateful expression>".to_string()),
    };
    format!("{op} {} {{ {key} {stateful} }}", set_ref(table, &u.set))
}

/// A duration as nft lists it: `1m30s`, `1h`, `2d3h`.
fn duration_text(seconds: u32) -> String {
    let mut out = String::new();
    let mut left = seconds;
    for (unit, name) in [(86_400, 'd'), (3_600, 'h'), (60, 'm'), (1, 's')] {
        if left >= unit {
            out.push_str(&format!("{}{name}", left / unit));
            left %= unit;
        }
    }
    out
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
    let family_word = |concat: bool| -> String {
        match (nat_family_listed(family, nat_family, concat), nat_family) {
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
    fn literal_sets() {
        use crate::build::{in_literal, proto};
        let m = in_literal(Selector::L4proto, vec![proto(L4Proto::Udp), proto(L4Proto::Tcp)]);
        let Some(nft_match::Kind::Literal(mut l)) = m.kind else { panic!("a literal") };
        assert_eq!(literal_text(None, &l), "meta l4proto { tcp, udp }");
        l.negate = true;
        assert_eq!(literal_text(None, &l), "meta l4proto != { tcp, udp }");
        l.values.clear();
        assert_eq!(literal_text(None, &l), "meta l4proto != <invalid empty literal set>");
    }

    #[test]
    fn tcp_flags_list_as_nft_lists_them() {
        let t = |value, mask| tcp_flags_text(&TcpFlags { value, mask });
        assert_eq!(t(0x02, 0x06), "tcp flags syn / syn,rst");
        assert_eq!(t(0x12, 0x12), "tcp flags syn,ack / syn,ack");
        assert_eq!(t(0x02, 0x02), "tcp flags & syn == syn");
        assert_eq!(t(0x00, 0x06), "tcp flags ! syn,rst");
        assert_eq!(t(0x02, 0xff), "tcp flags == syn");
        assert_eq!(t(0x12, 0xff), "tcp flags == 0x12");
        assert_eq!(t(0x00, 0xff), "tcp flags == 0x0");
        assert_eq!(t(0x02, 0x7f), "tcp flags syn / fin,syn,rst,psh,ack,urg,ecn");
        assert_eq!(t(0x02, 0), "tcp flags <invalid tcp flags 0x2 / 0x0>");
        assert_eq!(t(0x04, 0x02), "tcp flags <invalid tcp flags 0x4 / 0x2>");
    }

    #[test]
    fn ct_states_list_lowest_bit_first() {
        assert_eq!(ct_state_text(0x08), "ct state new");
        assert_eq!(ct_state_text(0x06), "ct state established,related");
        assert_eq!(ct_state_text(0x0f), "ct state invalid,established,related,new");
        assert_eq!(ct_state_text(0x40), "ct state untracked");
        assert_eq!(ct_state_text(0), "ct state <invalid ct state 0x0>");
        assert_eq!(ct_state_text(0x10), "ct state <invalid ct state 0x10>");
    }

    #[test]
    fn set_updates_and_dynamic_sets_list_as_nft_lists_them() {
        use crate::build::{ct_count, dynamic_set, limit, set_update};
        let t = crate::build::table(
            NftFamily::Inet,
            "t",
            vec![dynamic_set("rl4", &[NftType::Ipv4Addr, NftType::Mark], 65536, 90)],
            vec![],
        );
        let text = |s: NftStatement| statement_text(&t, NftFamily::Inet, None, &s);
        assert_eq!(
            text(set_update(&[Selector::IpSaddr], Some(42), "rl4", limit(100, 200, true))),
            "update @rl4 { ip saddr . 0x0000002a limit rate over 100/second burst 200 packets }"
        );
        // nft omits its default burst of 5.
        assert_eq!(
            text(set_update(&[Selector::IpSaddr], Some(1), "rl4", limit(5, 5, false))),
            "update @rl4 { ip saddr . 0x00000001 limit rate 5/second }"
        );
        assert_eq!(
            text(set_update(&[Selector::IpSaddr], None, "rl4", ct_count(3, true))),
            "add @rl4 { ip saddr ct count over 3 }"
        );
        let mut out = String::new();
        set_text(&mut out, &t.sets[0]);
        assert_eq!(
            out,
            "\tset rl4 {\n\t\ttype ipv4_addr . mark\n\t\tsize 65536\n\t\tflags dynamic,timeout\n\t\ttimeout 1m30s\n\t}\n"
        );
        assert_eq!(duration_text(60), "1m");
        assert_eq!(duration_text(90_061), "1d1h1m1s");
    }

    #[test]
    fn ports() {
        assert_eq!(port_text(&PortRange { first: 80, last: 80 }), "80");
        assert_eq!(port_text(&PortRange { first: 80, last: 90 }), "80-90");
        assert_eq!(port_text(&PortRange { first: 90, last: 80 }), "<invalid port range 90-80>");
        assert_eq!(port_text(&PortRange { first: 70000, last: 70000 }), "<invalid port range 70000-70000>");
    }
}
