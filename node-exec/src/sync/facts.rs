//! What the executor tells the controller about its node: the underlay (the address and MTU
//! other nodes reach it at, IPv4), every interface with its IPv4 and global IPv6 addresses, how
//! the main table routes IPv4 (which device reaches which prefix: how the controller learns a
//! local pod's device) and the
//! UDP ports of the CNI's VXLAN devices (docs/portmap/datapath.md, "The request claim";
//! docs/portmap/links.md, "UDP port").

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use kuport_proto::v1::{InterfaceFacts, NodeFacts, RouteFacts};
use netlink_packet_route::route::RouteType;

use crate::rtnl::{self, ObservedAddress, ObservedLink, ObservedRoute};

/// Routes per report at most (the controller refuses more): the longest prefixes are kept,
/// since a local pod's route is at least as specific as any route that contains it.
pub const MAX_ROUTES: usize = 4096;

/// Reads the facts of `netns` (None: the caller's). The underlay interface is `underlay` when
/// given, else the one the main table's default route leaves through.
pub fn read(netns: Option<&Path>, underlay: Option<&str>) -> Result<NodeFacts, rtnl::Error> {
    let observed = rtnl::read(netns, &rtnl::Desired::default())?;
    Ok(from_observed(&observed.links, &observed.addresses, &observed.routes, underlay))
}

fn from_observed(
    links: &[ObservedLink],
    addresses: &[ObservedAddress],
    routes: &[ObservedRoute],
    underlay: Option<&str>,
) -> NodeFacts {
    let mut interfaces: Vec<InterfaceFacts> = links
        .iter()
        .filter(|l| l.name != "lo" && !rtnl::consts::owns_link(&l.name))
        .map(|l| InterfaceFacts {
            name: l.name.clone(),
            mtu: l.mtu,
            addresses: interface_addresses(addresses, l.index),
        })
        .collect();
    interfaces.sort_by(|a, b| a.name.cmp(&b.name));
    let underlay = underlay.map(str::to_string).or_else(|| {
        // The underlay is IPv4: its device is the IPv4 default route's.
        routes
            .iter()
            .filter(|r| r.table == rtnl::consts::TABLE_MAIN && r.dst.prefix_len() == 0 && r.dst.addr().is_ipv4())
            .min_by_key(|r| r.priority)
            .and_then(|r| r.dev.clone())
    });
    let mut facts = NodeFacts {
        interfaces,
        kernel: kernel_release(),
        routes: main_routes(routes, underlay.as_deref()),
        vxlan_ports: vxlan_ports(links),
        ..Default::default()
    };
    if let Some(name) = underlay
        && let Some(i) = facts.interfaces.iter().find(|i| i.name == name)
    {
        // The first IPv4 address (IPv4 ones come first).
        facts.underlay_address =
            i.addresses.iter().find(|a| a.parse::<Ipv4Addr>().is_ok()).cloned().unwrap_or_default();
        facts.underlay_mtu = i.mtu;
        facts.underlay_interface = name;
    }
    facts
}

/// The addresses of the link `index`: IPv4 ones, then IPv6 ones other than link-local
/// (fe80::/10, which every IPv6 link has and no other node can reach), each family sorted.
fn interface_addresses(addresses: &[ObservedAddress], index: u32) -> Vec<String> {
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for a in addresses.iter().filter(|a| a.index == index) {
        match a.net.addr() {
            IpAddr::V4(v) => v4.push(v.to_string()),
            IpAddr::V6(v) if v.is_unicast_link_local() => {}
            IpAddr::V6(v) => v6.push(v.to_string()),
        }
    }
    // As text, as before IPv6 was reported, so the first IPv4 address (the underlay's) is the same.
    v4.sort();
    v6.sort();
    v4.extend(v6);
    v4
}

/// The main table's IPv4 unicast routes with one device, except default routes, kuport's own links
/// and routes through a gateway on the underlay (they lead to other nodes, and a BGP CNI may
/// import many). One per prefix, the lowest metric's (the one the kernel uses); at most
/// [`MAX_ROUTES`], the longest prefixes first; sorted by prefix.
fn main_routes(routes: &[ObservedRoute], underlay: Option<&str>) -> Vec<RouteFacts> {
    let mut best: BTreeMap<_, (u32, &str)> = BTreeMap::new();
    for r in routes {
        let Some(dev) = r.dev.as_deref() else { continue };
        let remote = r.via.is_some() && Some(dev) == underlay;
        if r.table != rtnl::consts::TABLE_MAIN
            || !r.dst.addr().is_ipv4()
            || r.msg.header.kind != RouteType::Unicast
            || r.dst.prefix_len() == 0
            || rtnl::consts::owns_link(dev)
            || remote
        {
            continue;
        }
        let entry = best.entry(r.dst).or_insert((r.priority, dev));
        if r.priority < entry.0 {
            *entry = (r.priority, dev);
        }
    }
    let mut kept: Vec<_> = best.into_iter().collect();
    if kept.len() > MAX_ROUTES {
        kept.sort_by_key(|(dst, _)| std::cmp::Reverse(dst.prefix_len()));
        kept.truncate(MAX_ROUTES);
        kept.sort_by_key(|(dst, _)| *dst);
    }
    kept.into_iter().map(|(dst, (_, dev))| RouteFacts { dst: dst.to_string(), dev: dev.to_string() }).collect()
}

/// The destination ports of VXLAN devices other than kuport's, sorted and each once.
fn vxlan_ports(links: &[ObservedLink]) -> Vec<u32> {
    let ports: BTreeSet<u32> = links
        .iter()
        .filter(|l| !rtnl::consts::owns_link(&l.name))
        .filter_map(|l| l.vxlan.as_ref())
        .map(|v| u32::from(v.dstport))
        .filter(|p| *p != 0)
        .collect();
    ports.into_iter().collect()
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtnl::ObservedVxlan;

    fn route(dst: &str, via: Option<&str>, dev: &str, priority: u32) -> ObservedRoute {
        let mut msg = netlink_packet_route::route::RouteMessage::default();
        msg.header.kind = RouteType::Unicast;
        ObservedRoute {
            table: rtnl::consts::TABLE_MAIN,
            dst: dst.parse().expect("prefix"),
            via: via.map(|v| v.parse().expect("address")),
            dev: Some(dev.into()),
            priority,
            kernel: false,
            plain: true,
            msg,
        }
    }

    fn link(name: &str, dstport: Option<u16>) -> ObservedLink {
        ObservedLink {
            index: 1,
            name: name.into(),
            mtu: 1500,
            admin_up: true,
            oper_state: "UP".into(),
            kind: dstport.map(|_| "vxlan".into()),
            vxlan: dstport.map(|dstport| ObservedVxlan { vni: 1, dstport, ..Default::default() }),
            mac: None,
        }
    }

    #[test]
    fn routes_leave_out_defaults_kuport_links_and_remote_gateways() {
        let mut other_table = route("10.9.0.0/16", None, "eth0", 0);
        other_table.table = 201;
        let routes = [
            route("0.0.0.0/0", Some("100.64.0.1"), "eth0", 0),
            route("10.244.2.107/32", None, "cali1234", 0),
            route("10.244.2.0/24", Some("10.244.2.1"), "cilium_host", 0),
            route("10.244.3.0/24", Some("100.64.0.13"), "eth0", 0),
            route("100.64.0.0/24", None, "eth0", 0),
            route("169.254.77.2/31", None, "kup-dcc4266d", 0),
            // The same prefix twice: the lower metric wins.
            route("10.244.9.0/24", None, "cni1", 20),
            route("10.244.9.0/24", None, "cni0", 10),
            other_table,
        ];
        let got: Vec<(String, String)> =
            main_routes(&routes, Some("eth0")).into_iter().map(|r| (r.dst, r.dev)).collect();
        let want = [
            ("10.244.2.0/24", "cilium_host"),
            ("10.244.2.107/32", "cali1234"),
            ("10.244.9.0/24", "cni0"),
            ("100.64.0.0/24", "eth0"),
        ];
        assert_eq!(got, want.map(|(a, b)| (a.to_string(), b.to_string())));
    }

    #[test]
    fn over_the_bound_the_longest_prefixes_stay() {
        let mut routes: Vec<ObservedRoute> = (0..MAX_ROUTES as u32)
            .map(|i| route(&format!("{}/32", std::net::Ipv4Addr::from(0x0af4_0000 + i)), None, "cali0", 0))
            .collect();
        routes.push(route("10.0.0.0/8", None, "cni0", 0));
        let got = main_routes(&routes, None);
        assert_eq!(got.len(), MAX_ROUTES);
        assert!(got.iter().all(|r| r.dst.ends_with("/32")));
    }

    fn address(index: u32, net: &str) -> ObservedAddress {
        ObservedAddress { index, dev: String::new(), net: net.parse().expect("prefix"), msg: Default::default() }
    }

    #[test]
    fn addresses_list_ipv4_then_global_ipv6_each_sorted() {
        let addresses = [
            address(1, "fd00::b/64"),
            address(1, "fe80::1/64"),
            address(1, "192.168.1.20/24"),
            address(1, "2001:db8::9/64"),
            address(1, "192.168.1.10/24"),
            address(2, "10.0.0.1/8"),
        ];
        assert_eq!(interface_addresses(&addresses, 1), ["192.168.1.10", "192.168.1.20", "2001:db8::9", "fd00::b"]);
        assert_eq!(interface_addresses(&addresses, 3), Vec::<String>::new());
    }

    #[test]
    fn the_underlay_is_the_ipv4_default_routes_device_and_its_first_ipv4_address() {
        let links = [ObservedLink { index: 2, ..link("eth0", None) }, ObservedLink { index: 3, ..link("eth1", None) }];
        let addresses = [address(2, "2001:db8::2/64"), address(2, "100.64.0.2/24"), address(3, "100.65.0.2/24")];
        // An IPv6 default route through eth1 with a lower metric does not make eth1 the underlay.
        let mut v6_default = route("::/0", Some("2001:db8::1"), "eth1", 0);
        v6_default.priority = 0;
        let routes = [
            v6_default,
            route("0.0.0.0/0", Some("100.64.0.1"), "eth0", 100),
            route("2001:db8::/64", None, "eth0", 256),
        ];
        let f = from_observed(&links, &addresses, &routes, None);
        assert_eq!((f.underlay_interface.as_str(), f.underlay_address.as_str()), ("eth0", "100.64.0.2"));
        assert_eq!(f.interfaces[0].addresses, ["100.64.0.2", "2001:db8::2"]);
        // IPv6 routes are not reported.
        assert!(f.routes.iter().all(|r| !r.dst.contains(':')), "{:?}", f.routes);
    }

    #[test]
    fn vxlan_ports_are_the_cnis_not_kuports() {
        let links = [
            link("eth0", None),
            link("cilium_vxlan", Some(8472)),
            link("flannel.1", Some(8472)),
            link("vxlan.calico", Some(4789)),
            link("kup-dcc4266d", Some(4790)),
        ];
        assert_eq!(vxlan_ports(&links), vec![4789, 8472]);
    }
}
