//! The `sysctl` and `ip` commands that would create a namespace's non-nftables state, then the
//! `wg` commands of its WireGuard devices.

use std::fmt::Write as _;

use crate::v1::{IpRule, Link, NetnsState, Route, WireguardDevice, link};

/// The `sysctl`/`ip` commands that create a netns's non-nftables state, one per line: sysctls,
/// links (add, then mtu and up; WireGuard devices after the others), addresses, permanent
/// neighbours, routes, ip rules; then, for each WireGuard device, the `wg set` of the device and
/// one per peer. The private key is the node's own and never in a state: it shows as
/// `<node key>`.
pub fn ip_commands(ns: &NetnsState) -> String {
    let mut out = String::new();
    for s in &ns.sysctls {
        let _ = writeln!(out, "sysctl -w {}={}", s.key, s.value);
    }
    for l in &ns.links {
        link_commands(&mut out, l);
    }
    for d in &ns.wireguard_devices {
        let _ = writeln!(out, "ip link add {} type wireguard", d.name);
        let mtu = if d.mtu == 0 { String::new() } else { format!(" mtu {}", d.mtu) };
        let _ = writeln!(out, "ip link set {}{mtu} up", d.name);
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
    for d in &ns.wireguard_devices {
        wireguard_commands(&mut out, d);
    }
    out
}

/// `wg set` lines as wireguard-tools takes them: the device, then one line per peer.
fn wireguard_commands(out: &mut String, d: &WireguardDevice) {
    let mut line = format!("wg set {} private-key <node key>", d.name);
    if d.listen_port != 0 {
        let _ = write!(line, " listen-port {}", d.listen_port);
    }
    if d.fwmark != 0 {
        let _ = write!(line, " fwmark {:#x}", d.fwmark);
    }
    let _ = writeln!(out, "{line}");
    for p in &d.peers {
        let mut line = format!("wg set {} peer {}", d.name, p.public_key);
        if !p.endpoint.is_empty() {
            let _ = write!(line, " endpoint {}", p.endpoint);
        }
        let _ = write!(
            line,
            " allowed-ips {}",
            if p.allowed_ips.is_empty() { "\"\"".to_string() } else { p.allowed_ips.join(",") }
        );
        if p.persistent_keepalive_seconds != 0 {
            let _ = write!(line, " persistent-keepalive {}", p.persistent_keepalive_seconds);
        }
        let _ = writeln!(out, "{line}");
    }
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
    let ip = if r.dst.contains(':') || r.via.contains(':') { "ip -6" } else { "ip" };
    let mut s = format!("{ip} route add {}", r.dst);
    if !r.via.is_empty() {
        let _ = write!(s, " via {}", r.via);
    }
    let _ = write!(s, " dev {} table {}", r.dev, route_table(r.table));
    s
}

fn rule_command(r: &IpRule) -> String {
    let ip = if r.ipv6 { "ip -6" } else { "ip" };
    let mut s = format!("{ip} rule add pref {} fwmark {:#x}/{:#x}", r.pref, r.fwmark, r.fwmask);
    if !r.to.is_empty() {
        let _ = write!(s, " to {}", r.to);
    }
    let _ = write!(s, " lookup {}", route_table(r.table));
    s
}

fn route_table(t: u32) -> String {
    if t == 254 { "main".to_string() } else { t.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{wireguard_device, wireguard_peer};
    use crate::v1::Address;

    #[test]
    fn wireguard_devices_render_as_ip_then_wg_commands() {
        let ep = "203.0.113.7:51820".parse().ok();
        let ns = NetnsState {
            addresses: vec![Address { dev: "kup-wg".into(), cidr: "100.96.0.1/32".into() }],
            wireguard_devices: vec![crate::v1::WireguardDevice {
                fwmark: 0x6b70_0001,
                ..wireguard_device(
                    "kup-wg",
                    1420,
                    51820,
                    vec![
                        wireguard_peer(
                            "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiU=",
                            ep,
                            &["10.42.1.0/24", "100.96.0.2/32"],
                            25,
                        ),
                        wireguard_peer::<&str>("IVAkxB4FKNyQvXy5JCIGZ5hVgPzGgHETIT142MedoDg=", None, &[], 0),
                    ],
                )
            }],
            ..Default::default()
        };
        assert_eq!(
            ip_commands(&ns),
            "ip link add kup-wg type wireguard\n\
             ip link set kup-wg mtu 1420 up\n\
             ip addr add 100.96.0.1/32 dev kup-wg\n\
             wg set kup-wg private-key <node key> listen-port 51820 fwmark 0x6b700001\n\
             wg set kup-wg peer IVAkxB4FKNyQvXy5JCIGZ5hVgPzGgHETIT142MedoDg= allowed-ips \"\"\n\
             wg set kup-wg peer l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiU= endpoint 203.0.113.7:51820 allowed-ips 10.42.1.0/24,100.96.0.2/32 persistent-keepalive 25\n"
        );
    }
}
