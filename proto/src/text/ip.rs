//! The `sysctl` and `ip` commands that would create a namespace's non-nftables state.

use std::fmt::Write as _;

use crate::v1::{IpRule, Link, NetnsState, Route, link};

/// The `sysctl`/`ip` commands that create a netns's non-nftables state, one per line: sysctls,
/// links (add, then mtu and up), addresses, permanent neighbours, routes, ip rules.
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
    for n in &ns.neighbours {
        let _ = writeln!(out, "ip neigh replace {} lladdr {} dev {} nud permanent", n.address, n.mac, n.dev);
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
    let address = if l.mac.is_empty() { String::new() } else { format!(" address {}", l.mac) };
    match &l.kind {
        Some(link::Kind::Vxlan(v)) => {
            let _ = writeln!(
                out,
                "ip link add {}{address} type vxlan id {} local {} remote {} dstport {} ttl {}",
                l.name, v.vni, v.local, v.remote, v.dstport, v.ttl
            );
        }
        None => {
            let _ = writeln!(out, "ip link add {}{address} type <invalid link kind>", l.name);
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
