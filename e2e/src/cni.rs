//! The CNI the lab emulates on each node: Cilium as it sets a node up, as far as kuport's rules
//! care.
//!
//! - `cilium_host`/`cilium_net`, a veth pair, with the router address (the pod CIDR's first) on
//!   `cilium_host`;
//! - per pod, a veth `lxc<hash>` whose peer is the pod's `eth0`. Traffic to a pod leaves
//!   through `cilium_host` (route `POD/32 dev cilium_host`, a permanent neighbour entry for the
//!   pod's MAC), and a tc clsact egress u32 filter on `cilium_host` redirects it to the pod's
//!   `lxc` device. The pod's replies arrive on `lxc*`; its default route is the router address;
//! - the CNI's masquerade in nftables table `ip nat` (see [`nat_ruleset`]).
//!
//! These are the `ip` and `tc` batch lines and the ruleset; [`crate::lab`] runs them.
//!
//! IPv6 (a node with `podCidr6`): each emulation routes the pods' IPv6 addresses as it routes
//! their IPv4 ones: the IPv6 router address on `cilium_host`, a /128 route and a permanent
//! neighbour per pod on it and a tc redirect per pod; the bridge's /64 on `cni0`; Calico's
//! per-pod /128 routes on the `cali` devices with the pods' gateway at the `cali` device's
//! link-local address (`fe80::ecee:eeff:feee:eeee`, from its MAC, as Calico has it). The NAT:
//! the Cilium and bridge rulesets have their IPv6 twins in `table ip6 nat` (both CNIs write
//! their rules for each family enabled); Calico's has none (an IPv6 pool's `natOutgoing` is
//! off by default).
//!
//! With `cni: bridge` (the sites topology, docs/overlay/lab.md) the node is set up as the bridge
//! plugin with host-local IPAM sets it up instead (the [`bridge`] module, Flannel's and k3s' pod
//! network): what the overlay needs of a CNI, which routes nothing between nodes itself. With
//! `cni: calico`, as Calico does (the [`calico`] module). kuport is given no setting for any of
//! them: it learns the pod devices from the node's routes (docs/overlay/lab.md).

use std::net::{Ipv4Addr, Ipv6Addr};

use sha2::{Digest as _, Sha256};

use crate::topology::{Cni, NodeSpec, PodSpec, router, router6};

/// Where a pod's IPv6 tc redirect on `cilium_host` sits: its IPv4 filter's priority plus this
/// (tc keeps one protocol per priority).
pub const V6_PRIO_OFFSET: u32 = 1000;

/// The device `cni`'s node routes `pod`'s address through, as the node's executor reports it
/// (`ip route get POD`): what kuport's request claim names (docs/portmap/datapath.md).
pub fn pod_device(cni: Cni, pod: &PodSpec) -> String {
    match cni {
        Cni::Cilium => "cilium_host".into(),
        Cni::Bridge => bridge::DEVICE.into(),
        Cni::Calico => calico::cali_name(pod),
    }
}

/// The UDP ports of `cni`'s own VXLAN devices on a node (the Cilium emulation has none; Calico's
/// `vxlan.calico` is on 4789).
pub fn vxlan_ports(cni: Cni) -> Vec<u16> {
    match cni {
        Cni::Cilium | Cni::Bridge => Vec::new(),
        Cni::Calico => vec![calico::VXLAN_PORT],
    }
}

/// The host-side device of a pod's veth, as Cilium names them: `lxc` and 12 hex digits.
pub fn lxc_name(pod: &PodSpec) -> String {
    let hash = Sha256::digest(format!("{}/{}", pod.namespace, pod.name));
    format!("lxc{}", &hex::encode(hash)[..12])
}

fn mac(first: u8, a: Ipv4Addr) -> String {
    let o = a.octets();
    format!("{first:02x}:4c:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
}

/// The pod's `eth0` MAC and its host-side `lxc` MAC (locally administered, from the address).
fn pod_macs(pod: &PodSpec) -> (String, String) {
    (mac(0x02, pod.address), mac(0x06, pod.address))
}

/// The CNI's NAT rules on a node, in their own table (never kuport's): what kuport's claims
/// must beat.
///
/// - Cilium's host-to-cluster SNAT, `oifname "cilium_host" ip saddr != <pod cidr> ip daddr !=
///   <pod cidr>`, as Cilium writes it (to the router address); it never matches traffic *to* a
///   pod.
/// - The masquerade measured on the project's lab (docs/portmap/datapath.md, "The request
///   claim"), `oifname "cilium_host" ip saddr != <pod cidr> masquerade`, rewrites every
///   forwarded packet entering the pod network: without kuport's request claim a pod sees the
///   node's router address as the client.
/// - Pod traffic leaving the node by a non-CNI device (for anywhere outside the cluster's pod
///   CIDRs) is masqueraded to the node's address.
pub fn nat_ruleset(node: &NodeSpec, all_pod_cidrs: &[String]) -> String {
    let cidr = node.pod_cidr.0.trunc();
    let router = router(node);
    let cluster = all_pod_cidrs.join(", ");
    format!(
        "table ip nat {{
	chain POSTROUTING {{
		type nat hook postrouting priority srcnat; policy accept;
		counter jump CILIUM_POST_nat
	}}
	chain CILIUM_POST_nat {{
		oifname \"cilium_host\" ip saddr != {cidr} ip daddr != {cidr} counter snat ip to {router} comment \"cilium host->cluster masquerade\"
		oifname \"cilium_host\" ip saddr != {cidr} counter masquerade comment \"lab: forwarded traffic entering the pod network\"
		ip saddr {cidr} ip daddr != {{ {cluster} }} oifname != \"cilium_*\" counter masquerade comment \"cilium masquerade non-cluster\"
	}}
}}
"
    )
}

/// The IPv6 twin of [`nat_ruleset`] in `table ip6 nat`, for the cluster's IPv6 pod prefixes;
/// None when the node has no IPv6 pod prefix.
pub fn nat6_ruleset(node: &NodeSpec, all_pod_cidrs6: &[String]) -> Option<String> {
    let cidr = node.pod_cidr6?.0.trunc();
    let router = router6(node)?;
    let cluster = all_pod_cidrs6.join(", ");
    Some(format!(
        "table ip6 nat {{
	chain POSTROUTING {{
		type nat hook postrouting priority srcnat; policy accept;
		counter jump CILIUM_POST_nat
	}}
	chain CILIUM_POST_nat {{
		oifname \"cilium_host\" ip6 saddr != {cidr} ip6 daddr != {cidr} counter snat to {router} comment \"cilium host->cluster masquerade\"
		oifname \"cilium_host\" ip6 saddr != {cidr} counter masquerade comment \"lab: forwarded traffic entering the pod network\"
		ip6 saddr {cidr} ip6 daddr != {{ {cluster} }} oifname != \"cilium_*\" counter masquerade comment \"cilium masquerade non-cluster\"
	}}
}}
"
    ))
}

/// The node's `cilium_host`/`cilium_net` pair, the router address on `cilium_host` (and the
/// IPv6 one).
pub fn host_lines(node: &NodeSpec) -> Vec<String> {
    let mut lines = vec![
        "link add cilium_host type veth peer name cilium_net".into(),
        format!("addr add {}/32 dev cilium_host", router(node)),
    ];
    lines.extend(router6(node).map(|r| format!("addr add {r}/128 dev cilium_host nodad")));
    lines.extend(["link set cilium_net up".into(), "link set cilium_host up".into()]);
    lines
}

/// The node-side lines of one pod whose namespace is `pod_netns`: its veth and the route and
/// neighbour through `cilium_host`, for its IPv6 address `address6` too.
pub fn pod_lines_on_node(pod: &PodSpec, address6: Option<Ipv6Addr>, pod_netns: &str) -> Vec<String> {
    let (eth0, lxc_mac) = pod_macs(pod);
    let lxc = lxc_name(pod);
    let mut lines = vec![
        format!("link add {lxc} address {lxc_mac} type veth peer name eth0 address {eth0} netns {pod_netns}"),
        format!("link set {lxc} up"),
        format!("route add {}/32 dev cilium_host", pod.address),
        format!("neigh add {} lladdr {eth0} dev cilium_host nud permanent", pod.address),
    ];
    if let Some(a6) = address6 {
        lines.push(format!("route add {a6}/128 dev cilium_host"));
        lines.push(format!("neigh add {a6} lladdr {eth0} dev cilium_host nud permanent"));
    }
    lines
}

/// The lines inside the pod's own namespace: its address, the router on `node` as default
/// route; the same for IPv6 when the node has an IPv6 pod prefix.
pub fn pod_lines(pod: &PodSpec, node: &NodeSpec) -> Vec<String> {
    let (_, lxc_mac) = pod_macs(pod);
    let r = router(node);
    let mut lines = vec![
        "link set lo up".into(),
        format!("addr add {}/32 dev eth0", pod.address),
        "link set eth0 up".into(),
        format!("route add {r}/32 dev eth0 scope link"),
        format!("route add default via {r} dev eth0"),
        format!("neigh add {r} lladdr {lxc_mac} dev eth0 nud permanent"),
    ];
    if let (Some(a6), Some(r6)) = (node.pod_address6(pod), router6(node)) {
        lines.extend([
            format!("addr add {a6}/128 dev eth0 nodad"),
            format!("route add {r6}/128 dev eth0"),
            format!("route add default via {r6} dev eth0"),
            format!("neigh add {r6} lladdr {lxc_mac} dev eth0 nud permanent"),
        ]);
    }
    lines
}

/// The `tc` lines that rewrite `cilium_host`'s egress filters: one redirect per pod of `pods`
/// (the node's, each with its priority and IPv6 address), and one more at the priority plus
/// [`V6_PRIO_OFFSET`] for its IPv6 address. `has_qdisc`: the clsact qdisc is there already,
/// its filters are replaced.
pub fn tc_lines<'a>(
    has_qdisc: bool,
    present: &std::collections::BTreeSet<u32>,
    pods: impl Iterator<Item = (u32, &'a PodSpec, Option<Ipv6Addr>)>,
) -> Vec<String> {
    let mut lines = Vec::new();
    if !has_qdisc {
        lines.push("qdisc add dev cilium_host clsact".to_string());
    }
    // One filter per pod at a priority of its own: a change adds and deletes only the filters
    // of the pods that came and went, so the others' traffic never misses its redirect.
    let mut wanted = std::collections::BTreeSet::new();
    for (prio, pod, address6) in pods {
        wanted.insert(prio);
        if !present.contains(&prio) {
            lines.push(format!(
                "filter add dev cilium_host egress protocol ip prio {prio} u32 match ip dst {}/32 action mirred egress redirect dev {}",
                pod.address,
                lxc_name(pod)
            ));
        }
        let Some(a6) = address6 else { continue };
        let prio6 = prio + V6_PRIO_OFFSET;
        wanted.insert(prio6);
        if !present.contains(&prio6) {
            lines.push(format!(
                "filter add dev cilium_host egress protocol ipv6 prio {prio6} u32 match ip6 dst {a6}/128 action mirred egress redirect dev {}",
                lxc_name(pod)
            ));
        }
    }
    for prio in present.difference(&wanted) {
        lines.push(format!("filter del dev cilium_host egress prio {prio}"));
    }
    lines
}

/// The priorities of the egress filters on `cilium_host`, from `tc filter show` (`pref N`).
pub fn tc_prios(shown: &str) -> std::collections::BTreeSet<u32> {
    shown.lines().filter_map(|l| l.split_whitespace().skip_while(|w| *w != "pref").nth(1)?.parse().ok()).collect()
}

/// The bridge plugin with host-local IPAM from the Node's pod CIDR, as the overlay's CNI
/// (docs/overlay/lab.md):
///
/// - a bridge `cni0` with the pod CIDR's first host (the gateway, [`router`]) and its prefix;
/// - per pod a veth `veth<hash>` on the bridge whose peer is the pod's `eth0`, with the pod's
///   address and prefix, and a default route via the gateway;
/// - no masquerade between nodes: only pod traffic for outside every pod CIDR leaves
///   masqueraded (the plugin's `ipMasq` would masquerade traffic to other nodes' pods too, and
///   the overlay carries pods' real addresses).
///
/// Pods are reached through the bridge, and their packets arrive on it; kuport learns `cni0`
/// from the node's route to the pod CIDR.
pub mod bridge {
    use sha2::{Digest as _, Sha256};

    use crate::topology::{NodeSpec, PodSpec, router, router6};

    /// The bridge, the device kuport's rules name for the pod network.
    pub const DEVICE: &str = "cni0";

    /// The host-side device of a pod's veth: `veth` and 8 hex digits.
    pub fn veth_name(pod: &PodSpec) -> String {
        let hash = Sha256::digest(format!("{}/{}", pod.namespace, pod.name));
        format!("veth{}", &hex::encode(hash)[..8])
    }

    /// The bridge with the gateway's address of each family.
    pub fn host_lines(node: &NodeSpec) -> Vec<String> {
        let len = node.pod_cidr.0.prefix_len();
        let mut lines =
            vec![format!("link add {DEVICE} type bridge"), format!("addr add {}/{len} dev {DEVICE}", router(node))];
        if let (Some(r6), Some(c6)) = (router6(node), node.pod_cidr6) {
            lines.push(format!("addr add {r6}/{} dev {DEVICE} nodad", c6.0.prefix_len()));
        }
        lines.push(format!("link set {DEVICE} up"));
        lines
    }

    pub fn pod_lines_on_node(pod: &PodSpec, pod_netns: &str) -> Vec<String> {
        let veth = veth_name(pod);
        vec![
            format!("link add {veth} type veth peer name eth0 netns {pod_netns}"),
            format!("link set {veth} master {DEVICE} up"),
        ]
    }

    /// Inside the pod: each family's address with the pod prefix's length and a default
    /// route via the gateway.
    pub fn pod_lines(pod: &PodSpec, node: &NodeSpec) -> Vec<String> {
        let len = node.pod_cidr.0.prefix_len();
        let mut lines = vec![
            "link set lo up".into(),
            format!("addr add {}/{len} dev eth0", pod.address),
            "link set eth0 up".into(),
            format!("route add default via {}", router(node)),
        ];
        if let (Some(a6), Some(r6), Some(c6)) = (node.pod_address6(pod), router6(node), node.pod_cidr6) {
            lines.push(format!("addr add {a6}/{} dev eth0 nodad", c6.0.prefix_len()));
            lines.push(format!("route add default via {r6}"));
        }
        lines
    }

    /// Pod traffic to outside the cluster's pod CIDRs leaves masqueraded; nothing else.
    pub fn nat_ruleset(node: &NodeSpec, all_pod_cidrs: &[String]) -> String {
        let cidr = node.pod_cidr.0.trunc();
        let cluster = all_pod_cidrs.join(", ");
        format!(
            "table ip nat {{
	chain POSTROUTING {{
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr {cidr} ip daddr != {{ {cluster} }} oifname != \"{DEVICE}\" counter masquerade comment \"bridge plugin: pods to the outside\"
	}}
}}
"
        )
    }

    /// The IPv6 twin of [`nat_ruleset`] in `table ip6 nat`; None without an IPv6 pod prefix.
    pub fn nat6_ruleset(node: &NodeSpec, all_pod_cidrs6: &[String]) -> Option<String> {
        let cidr = node.pod_cidr6?.0.trunc();
        let cluster = all_pod_cidrs6.join(", ");
        Some(format!(
            "table ip6 nat {{
	chain POSTROUTING {{
		type nat hook postrouting priority srcnat; policy accept;
		ip6 saddr {cidr} ip6 daddr != {{ {cluster} }} oifname != \"{DEVICE}\" counter masquerade comment \"bridge plugin: pods to the outside\"
	}}
}}
"
        ))
    }
}

/// Calico as it sets a node up (docs/overlay/lab.md, "The CNI emulations"), as far as kuport's
/// rules care:
///
/// - per pod a veth `cali<11 hex>` (MAC `ee:ee:ee:ee:ee:ee`, as Calico sets it) whose peer is
///   the pod's `eth0`, and the pod's route `POD/32 dev caliXXX scope link` on the node: no host
///   device, no bridge, no node address in the pod network;
/// - inside the pod, the address as a /32 and `default via 169.254.1.1 dev eth0 onlink`: the
///   gateway is an address nobody has, answered by proxy ARP on the node's `cali` device
///   (`proxy_arp=1`, `proxy_delay=0`, [`sysctls`]; the node routes `169.254.1.1` to `lo`, see
///   [`host_lines`]);
/// - Calico's `natOutgoing` in its own table (see [`nat_ruleset`]);
/// - its VXLAN device `vxlan.calico` (VNI 4096, port 4789) on the underlay, which routes
///   nothing in the lab: it is there for kuport to learn the CNI's VXLAN port from.
pub mod calico {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use sha2::{Digest as _, Sha256};

    use crate::topology::{NodeSpec, PodSpec};

    /// The pods' default gateway: link-local, on no device; the node answers for it.
    pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
    /// The pods' IPv6 gateway: the link-local address every `cali` device derives from its MAC
    /// `ee:ee:ee:ee:ee:ee` (EUI-64), as Calico routes IPv6 pods.
    pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0xecee, 0xeeff, 0xfeee, 0xeeee);
    /// The MAC Calico gives every node-side `cali` device.
    pub const MAC: &str = "ee:ee:ee:ee:ee:ee";
    pub const VXLAN: &str = "vxlan.calico";
    pub const VXLAN_PORT: u16 = 4789;
    /// The table of Calico's NAT (Calico writes iptables chains `cali-*`; the lab, nftables).
    pub const NAT_TABLE: &str = "calico_nat";

    /// The host-side device of a pod's veth, as Calico names them: `cali` and 11 hex digits.
    pub fn cali_name(pod: &PodSpec) -> String {
        let hash = Sha256::digest(format!("{}/{}", pod.namespace, pod.name));
        format!("cali{}", &hex::encode(hash)[..11])
    }

    /// The node's `vxlan.calico` on its underlay, and a route for the gateway. Proxy ARP
    /// answers only for an address the node routes out of another device; a real node's default
    /// route covers `169.254.1.1`, the lab's nodes have none, so the route stands in for it.
    pub fn host_lines(node: &NodeSpec) -> Vec<String> {
        let u = &node.underlay;
        vec![
            format!("route add {GATEWAY}/32 dev lo"),
            format!(
                "link add {VXLAN} type vxlan id 4096 dstport {VXLAN_PORT} local {} dev {} nolearning",
                u.address.addr(),
                u.interface
            ),
            format!("link set {VXLAN} up"),
        ]
    }

    /// The node-side lines of one pod: its veth and its /32 route on it (and the /128 of its
    /// IPv6 address `address6`).
    pub fn pod_lines_on_node(pod: &PodSpec, address6: Option<Ipv6Addr>, pod_netns: &str) -> Vec<String> {
        let cali = cali_name(pod);
        let mut lines = vec![
            format!("link add {cali} address {MAC} type veth peer name eth0 netns {pod_netns}"),
            format!("link set {cali} up"),
            format!("route add {}/32 dev {cali} scope link", pod.address),
        ];
        lines.extend(address6.map(|a6| format!("route add {a6}/128 dev {cali}")));
        lines
    }

    /// The node's settings of a pod's `cali` device: it answers ARP for any address it routes
    /// elsewhere (the gateway), at once.
    pub fn sysctls(pod: &PodSpec) -> Vec<(String, String)> {
        let cali = cali_name(pod);
        vec![
            (format!("net.ipv4.conf.{cali}.proxy_arp"), "1".into()),
            (format!("net.ipv4.neigh.{cali}.proxy_delay"), "0".into()),
            (format!("net.ipv4.conf.{cali}.forwarding"), "1".into()),
        ]
    }

    /// The lines inside the pod: its /32 and the link-local gateway; its IPv6 /128 and the
    /// `cali` device's link-local address as IPv6 gateway.
    pub fn pod_lines(pod: &PodSpec, address6: Option<Ipv6Addr>) -> Vec<String> {
        let mut lines = vec![
            "link set lo up".into(),
            format!("addr add {}/32 dev eth0", pod.address),
            "link set eth0 up".into(),
            format!("route add default via {GATEWAY} dev eth0 onlink"),
        ];
        if let Some(a6) = address6 {
            lines.push(format!("addr add {a6}/128 dev eth0 nodad"));
            lines.push(format!("route add default via {GATEWAY6} dev eth0"));
        }
        lines
    }

    /// Calico's `natOutgoing`: pod traffic for outside every pool (the cluster's pod CIDRs)
    /// leaves masqueraded, whatever the device; nothing else.
    pub fn nat_ruleset(all_pod_cidrs: &[String]) -> String {
        let pools = all_pod_cidrs.join(", ");
        format!(
            "table ip {NAT_TABLE} {{
	chain cali-POSTROUTING {{
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr {{ {pools} }} ip daddr != {{ {pools} }} counter masquerade comment \"calico natOutgoing\"
	}}
}}
"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tc_change_adds_and_deletes_only_the_pods_that_came_and_went() {
        let shown = "filter protocol ip pref 2 u32 chain 0 \nfilter protocol ip pref 2 u32 chain 0 fh 800: ht divisor 1 \nfilter protocol ip pref 4 u32 chain 0 fh 801::800 order 2048 key ht 801 bkt 0 terminal flowid not_in_hw \n";
        let present = tc_prios(shown);
        assert_eq!(present, [2, 4].into());
        let topology = crate::Topology::default_lab();
        let api = topology.pod("api-0").expect("api-0").clone();
        let echo = topology.pod("echo-0").expect("echo-0").clone();
        // api-0 stays at 2, echo-0 arrives at 3, whatever was at 4 left.
        let lines = tc_lines(true, &present, [(2, &api, None), (3, &echo, None)].into_iter());
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0]
                .starts_with("filter add dev cilium_host egress protocol ip prio 3 u32 match ip dst 10.244.1.20/32")
        );
        assert_eq!(lines[1], "filter del dev cilium_host egress prio 4");
        assert_eq!(tc_lines(false, &Default::default(), std::iter::empty())[0], "qdisc add dev cilium_host clsact");
    }

    #[test]
    fn calico_devices_are_named_as_calico_names_them() {
        let topology = crate::Topology::default_lab();
        let game = topology.pod("game-0").expect("game-0");
        let cali = calico::cali_name(game);
        assert!(cali.starts_with("cali") && cali.len() == 15, "cali and 11 hex, the longest name Linux takes: {cali}");
        let lines = calico::pod_lines_on_node(game, topology.pod_address6(game), "ns");
        assert_eq!(lines[2], format!("route add 10.244.2.107/32 dev {cali} scope link"));
        assert_eq!(lines[3], format!("route add fd10:244:2::6b/128 dev {cali}"));
        assert_eq!(pod_device(Cni::Calico, game), cali);
        let inside = calico::pod_lines(game, topology.pod_address6(game));
        assert_eq!(inside[3], "route add default via 169.254.1.1 dev eth0 onlink");
        assert_eq!(inside[5], "route add default via fe80::ecee:eeff:feee:eeee dev eth0");
        assert_eq!(vxlan_ports(Cni::Calico), [4789]);
    }
}
