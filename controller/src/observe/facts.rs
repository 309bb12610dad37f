//! What an executor may report (docs/security.md, "What an executor may report").
//!
//! Two checks, both pure. [`check`] bounds one report on its own: a report out of bounds is
//! refused whole and the node's previous valid facts stay in use (the hub keeps them).
//! [`underlays`] judges each node's reported underlay address against the Node objects, which
//! the node's kubelet writes and its executor cannot: it must be one of the node's own
//! `status.addresses` and no other node's underlay. A refused address is not used; the node's
//! links fall back to what they would use had it never reported one (its InternalIP, else the
//! class status row), so a forged report changes no other node's state.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::core::v1::Node;
use kuport_proto::v1 as wire;

use super::{KnownFacts, KnownInterface, KnownRoute};

/// The smallest underlay MTU accepted: IPv4's minimum (no interface that carries IPv4 reports
/// less). A smaller but real MTU is the computation's to judge, and the kernel's: a link is only
/// as large as its smaller end, so a node that reports a tiny MTU shrinks just the links that end
/// at itself, which it could break anyway.
pub const MIN_UNDERLAY_MTU: u32 = 68;
/// The largest underlay MTU accepted: an IPv4 packet's largest size.
pub const MAX_UNDERLAY_MTU: u32 = 65_535;
/// The largest interface MTU accepted: Linux's loopback has 65,536. Interface MTUs have no
/// floor: the computation does not read them, and a CAN or PPP device may be far below IPv4's 68.
pub const MAX_INTERFACE_MTU: u32 = 65_536;
/// Linux's IFNAMSIZ less the terminating NUL.
pub const MAX_INTERFACE_NAME: usize = 15;
/// Interfaces per report: ten times the 110 pods a node runs by default, each with a veth.
pub const MAX_INTERFACES: usize = 1024;
/// IPv4 addresses per interface.
pub const MAX_ADDRESSES: usize = 64;
/// `uname -r` fits 64 bytes (the kernel's __NEW_UTS_LEN).
pub const MAX_KERNEL: usize = 64;
/// A WireGuard key in base64: 32 bytes take 43 characters and one `=`.
pub const WIREGUARD_KEY_LEN: usize = 44;
/// Routes per report: a node's pods, a /32 each under a Calico-like CNI, and its other routes
/// (the executor keeps the longest prefixes when it has more).
pub const MAX_ROUTES: usize = 4096;
/// VXLAN ports per report: one or two per CNI.
pub const MAX_VXLAN_PORTS: usize = 64;

/// Why a report, or a part of it, was refused.
pub mod reason {
    /// The report breaks a bound ([`super::check`]); the previous facts stay in use.
    pub const INVALID_FACTS: &str = "InvalidFacts";
    /// The underlay address is not one of the node's Node status.addresses.
    pub const UNDERLAY_NOT_NODE_ADDRESS: &str = "UnderlayNotNodeAddress";
    /// Two or more nodes would use the same underlay address: none of them does.
    pub const UNDERLAY_ADDRESS_CLASH: &str = "UnderlayAddressClash";
}

/// A refusal: the node, the field of its report, why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: node {node}: {field}: {message}")]
pub struct Refused {
    pub node: String,
    /// The report's field as the class status and the proto name it (`underlayAddress`,
    /// `interfaces[3].name`).
    pub field: String,
    /// One of [`reason`].
    pub reason: &'static str,
    pub message: String,
}

impl Refused {
    fn invalid(node: &str, field: impl Into<String>, message: String) -> Self {
        Refused { node: node.to_string(), field: field.into(), reason: reason::INVALID_FACTS, message }
    }
}

/// Whether `name` may name a Linux interface: 1 to 15 bytes, no '/', no whitespace, no NUL,
/// neither "." nor ".." (the kernel's dev_valid_name).
pub fn valid_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_INTERFACE_NAME
        && name != "."
        && name != ".."
        && !name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
}

fn name_error(name: &str) -> String {
    format!(
        "{name:?} is not a Linux interface name (1 to {MAX_INTERFACE_NAME} bytes, no '/', ':' or whitespace, not \".\" or \"..\")"
    )
}

/// An interface address: IPv4 today (sync.proto); an IPv6 one parses too, so an executor that
/// reports both is not refused whole.
fn address(node: &str, field: String, a: &str) -> Result<IpAddr, Refused> {
    let ip: IpAddr =
        a.parse().map_err(|_| Refused::invalid(node, field.clone(), format!("{a:?} is not an IP address")))?;
    if ip.is_unspecified() || ip.is_multicast() || ip == IpAddr::V4(Ipv4Addr::BROADCAST) {
        return Err(Refused::invalid(node, field, format!("{ip} cannot be a host's address")));
    }
    Ok(ip)
}

/// Whether `key` is a WireGuard key as `wg` prints it: 44 characters of standard base64 that
/// decode to exactly 32 bytes, in canonical form (the 2 bits past the 32nd byte clear), so one
/// key has one spelling and two nodes cannot hold the same key under two names.
pub fn wireguard_key(key: &str) -> Result<[u8; 32], String> {
    fn sextet(c: u8) -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    }
    let bytes = key.as_bytes();
    let bad = || format!("{key:?} is not a WireGuard key (32 bytes in base64: {WIREGUARD_KEY_LEN} characters)");
    if bytes.len() != WIREGUARD_KEY_LEN || bytes[WIREGUARD_KEY_LEN - 1] != b'=' {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    let (mut acc, mut bits, mut n) = (0u32, 0u32, 0usize);
    for &c in &bytes[..WIREGUARD_KEY_LEN - 1] {
        acc = (acc << 6) | sextet(c).ok_or_else(bad)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            let Some(slot) = out.get_mut(n) else { return Err(bad()) };
            *slot = (acc >> bits) as u8;
            n += 1;
        }
        acc &= (1 << bits) - 1;
    }
    if n != 32 || acc != 0 {
        return Err(bad());
    }
    Ok(out)
}

/// Checks `node`'s report `f` against every bound and reads it as the computation does; the
/// first broken bound refuses it whole.
pub fn check(node: &str, f: &wire::NodeFacts) -> Result<KnownFacts, Refused> {
    let underlay_address = match f.underlay_address.as_str() {
        "" => None,
        a => match address(node, "underlayAddress".into(), a)? {
            IpAddr::V4(ip) if !ip.is_loopback() => Some(ip),
            ip => {
                return Err(Refused::invalid(
                    node,
                    "underlayAddress",
                    format!("{ip} is not an IPv4 address other nodes can reach"),
                ));
            }
        },
    };
    let underlay_mtu = match f.underlay_mtu {
        0 => None,
        m if (MIN_UNDERLAY_MTU..=MAX_UNDERLAY_MTU).contains(&m) => Some(m),
        m => {
            return Err(Refused::invalid(
                node,
                "underlayMtu",
                format!("{m} is not between {MIN_UNDERLAY_MTU} and {MAX_UNDERLAY_MTU}"),
            ));
        }
    };
    if !f.underlay_interface.is_empty() && !valid_interface_name(&f.underlay_interface) {
        return Err(Refused::invalid(node, "underlayInterface", name_error(&f.underlay_interface)));
    }
    if f.kernel.len() > MAX_KERNEL || f.kernel.chars().any(char::is_control) {
        return Err(Refused::invalid(
            node,
            "kernel",
            format!(
                "{} bytes or a control character: not a kernel release (at most {MAX_KERNEL} bytes)",
                f.kernel.len()
            ),
        ));
    }
    if f.interfaces.len() > MAX_INTERFACES {
        return Err(Refused::invalid(
            node,
            "interfaces",
            format!("{} interfaces; at most {MAX_INTERFACES} are accepted", f.interfaces.len()),
        ));
    }
    let mut names = BTreeSet::new();
    let mut interfaces = Vec::with_capacity(f.interfaces.len());
    for (i, iface) in f.interfaces.iter().enumerate() {
        if !valid_interface_name(&iface.name) {
            return Err(Refused::invalid(node, format!("interfaces[{i}].name"), name_error(&iface.name)));
        }
        if !names.insert(iface.name.as_str()) {
            return Err(Refused::invalid(
                node,
                format!("interfaces[{i}].name"),
                format!("{:?} is reported twice", iface.name),
            ));
        }
        if iface.mtu > MAX_INTERFACE_MTU {
            return Err(Refused::invalid(
                node,
                format!("interfaces[{i}].mtu"),
                format!("{} is above {MAX_INTERFACE_MTU}", iface.mtu),
            ));
        }
        if iface.addresses.len() > MAX_ADDRESSES {
            return Err(Refused::invalid(
                node,
                format!("interfaces[{i}].addresses"),
                format!("{} addresses; at most {MAX_ADDRESSES} per interface are accepted", iface.addresses.len()),
            ));
        }
        let mut addresses = Vec::with_capacity(iface.addresses.len());
        for (j, a) in iface.addresses.iter().enumerate() {
            addresses.push(address(node, format!("interfaces[{i}].addresses[{j}]"), a)?.to_string());
        }
        interfaces.push(KnownInterface { name: iface.name.clone(), addresses });
    }
    let wireguard_public_key = match f.wireguard_public_key.as_str() {
        "" => None,
        k => {
            wireguard_key(k).map_err(|m| Refused::invalid(node, "wireguardPublicKey", m))?;
            Some(k.to_string())
        }
    };
    Ok(KnownFacts {
        node: node.to_string(),
        underlay_address,
        underlay_mtu,
        interfaces: Some(interfaces),
        wireguard_public_key,
        routes: Some(routes(node, &f.routes)?),
        vxlan_ports: vxlan_ports(node, &f.vxlan_ports)?,
    })
}

/// Checks the reported routes: at most [`MAX_ROUTES`], each a prefix with no host bits and a
/// valid device name, each prefix once (the executor keeps the lowest metric's), so the longest
/// prefix containing an address names one device.
fn routes(node: &str, reported: &[wire::RouteFacts]) -> Result<Vec<KnownRoute>, Refused> {
    if reported.len() > MAX_ROUTES {
        return Err(Refused::invalid(
            node,
            "routes",
            format!("{} routes; at most {MAX_ROUTES} are accepted", reported.len()),
        ));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(reported.len());
    for (i, r) in reported.iter().enumerate() {
        let dst: ipnet::IpNet = r.dst.parse().map_err(|_| {
            Refused::invalid(node, format!("routes[{i}].dst"), format!("{:?} is not an IP prefix", r.dst))
        })?;
        if dst.trunc() != dst {
            return Err(Refused::invalid(node, format!("routes[{i}].dst"), format!("{dst} has host bits set")));
        }
        if !valid_interface_name(&r.dev) {
            return Err(Refused::invalid(node, format!("routes[{i}].dev"), name_error(&r.dev)));
        }
        if !seen.insert(dst) {
            return Err(Refused::invalid(node, format!("routes[{i}].dst"), format!("{dst} is reported twice")));
        }
        out.push(KnownRoute { dst: dst.to_string(), dev: r.dev.clone() });
    }
    Ok(out)
}

/// Checks the reported VXLAN ports: at most [`MAX_VXLAN_PORTS`], each a UDP port other than 0.
fn vxlan_ports(node: &str, reported: &[u32]) -> Result<Vec<u16>, Refused> {
    if reported.len() > MAX_VXLAN_PORTS {
        return Err(Refused::invalid(
            node,
            "vxlanPorts",
            format!("{} ports; at most {MAX_VXLAN_PORTS} are accepted", reported.len()),
        ));
    }
    let mut out = Vec::with_capacity(reported.len());
    for (i, p) in reported.iter().enumerate() {
        match u16::try_from(*p) {
            Ok(port) if port != 0 => out.push(port),
            _ => {
                return Err(Refused::invalid(
                    node,
                    format!("vxlanPorts[{i}]"),
                    format!("{p} is not a UDP port (1 to 65535)"),
                ));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Every IPv4 address of a Node's status.addresses, whatever its type.
pub fn node_addresses(node: &Node) -> Vec<Ipv4Addr> {
    let mut out: Vec<Ipv4Addr> =
        node.status.iter().flat_map(|s| s.addresses.iter().flatten()).filter_map(|a| a.address.parse().ok()).collect();
    out.sort();
    out.dedup();
    out
}

/// A node's underlay as the computation uses it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Underlay {
    /// The address its links are built on; None when unknown or refused.
    pub address: Option<Ipv4Addr>,
    /// Whether its reported underlay (address and MTU) is in use.
    pub reported: bool,
    pub refused: Option<Refused>,
}

/// Judges every node's underlay. `fallback` holds, per node, the address it has without a
/// report (its InternalIP, else its class status row). A reported address is used when it is
/// one of the node's Node status.addresses; else the node keeps its fallback. Then any address
/// two or more nodes with a Node object would use is used by none of them, each told which
/// nodes clash.
pub fn underlays(
    nodes: &super::Objects<Node>,
    facts: &[KnownFacts],
    fallback: &BTreeMap<String, Ipv4Addr>,
) -> BTreeMap<String, Underlay> {
    let listed: BTreeMap<&str, Vec<Ipv4Addr>> =
        nodes.iter().filter_map(|n| Some((n.metadata.name.as_deref()?, node_addresses(n)))).collect();
    let mut out: BTreeMap<String, Underlay> =
        fallback.iter().map(|(n, a)| (n.clone(), Underlay { address: Some(*a), ..Default::default() })).collect();
    for f in facts {
        let Some(a) = f.underlay_address else { continue };
        let entry = out.entry(f.node.clone()).or_default();
        match listed.get(f.node.as_str()) {
            Some(list) if list.contains(&a) => {
                *entry = Underlay { address: Some(a), reported: true, refused: None };
            }
            list => {
                let message = match list {
                    None => format!("{a} is not used: there is no Node object {:?} to list it", f.node),
                    Some(l) => format!(
                        "{a} is not one of Node {}'s status.addresses ({}); its kubelet writes those, not its executor",
                        f.node,
                        if l.is_empty() { "none".to_string() } else { join(l) }
                    ),
                };
                entry.refused = Some(Refused {
                    node: f.node.clone(),
                    field: "underlayAddress".into(),
                    reason: reason::UNDERLAY_NOT_NODE_ADDRESS,
                    message,
                });
            }
        }
    }
    // Only nodes with a Node object count: a deleted node's row (kept while its slot is held)
    // must not take its address from the node that reuses it.
    let mut users: BTreeMap<Ipv4Addr, Vec<String>> = BTreeMap::new();
    for (n, u) in &out {
        if let Some(a) = u.address
            && listed.contains_key(n.as_str())
        {
            users.entry(a).or_default().push(n.clone());
        }
    }
    for (a, names) in users.into_iter().filter(|(_, n)| n.len() > 1) {
        for n in &names {
            let others: Vec<&str> = names.iter().filter(|o| *o != n).map(String::as_str).collect();
            let Some(u) = out.get_mut(n) else { continue };
            u.address = None;
            u.reported = false;
            u.refused = Some(Refused {
                node: n.clone(),
                field: "underlayAddress".into(),
                reason: reason::UNDERLAY_ADDRESS_CLASH,
                message: format!(
                    "{a} is also the underlay of node {}; the links of none of them use it",
                    others.join(", ")
                ),
            });
        }
    }
    out
}

fn join(list: &[Ipv4Addr]) -> String {
    list.iter().map(Ipv4Addr::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn wire(underlay: &str, mtu: u32, ifaces: &[(&str, &[&str])]) -> wire::NodeFacts {
        wire::NodeFacts {
            underlay_address: underlay.into(),
            underlay_mtu: mtu,
            underlay_interface: "eth0".into(),
            interfaces: ifaces
                .iter()
                .map(|(n, a)| wire::InterfaceFacts {
                    name: (*n).into(),
                    mtu: 1500,
                    addresses: a.iter().map(|s| (*s).into()).collect(),
                })
                .collect(),
            kernel: "6.12.0".into(),
            ..Default::default()
        }
    }

    fn route(dst: &str, dev: &str) -> wire::RouteFacts {
        wire::RouteFacts { dst: dst.into(), dev: dev.into() }
    }

    #[test]
    fn routes_and_vxlan_ports_are_bounded_and_valid() {
        let mut f = wire("", 0, &[]);
        f.routes = vec![route("10.244.2.107/32", "cali1234"), route("10.244.2.0/24", "cilium_host")];
        f.vxlan_ports = vec![8472, 4789];
        let known = check("worker-2", &f).unwrap();
        let routes: Vec<(&str, &str)> =
            known.routes.iter().flatten().map(|r| (r.dst.as_str(), r.dev.as_str())).collect();
        assert_eq!(routes, [("10.244.2.107/32", "cali1234"), ("10.244.2.0/24", "cilium_host")]);
        assert_eq!(known.vxlan_ports, [4789, 8472]);
        // A report always says its routes, if none: known to be none, not unknown.
        assert_eq!(check("worker-2", &wire("", 0, &[])).unwrap().routes, Some(vec![]));
        let long = "x".repeat(16);
        let cases: Vec<(Vec<wire::RouteFacts>, Vec<u32>, &str)> = vec![
            (vec![route("10.244.2.107", "cali1")], vec![], "routes[0].dst"),
            (vec![route("10.244.2.0/33", "cali1")], vec![], "routes[0].dst"),
            (vec![route("10.244.2.1/24", "cni0")], vec![], "routes[0].dst"),
            (vec![route("cni0", "cni0")], vec![], "routes[0].dst"),
            (vec![route("10.244.2.0/24", "")], vec![], "routes[0].dev"),
            (vec![route("10.244.2.0/24", &long)], vec![], "routes[0].dev"),
            (vec![route("10.244.2.0/24", "a/b")], vec![], "routes[0].dev"),
            (vec![route("10.244.2.0/24", "cni0"), route("10.244.2.0/24", "cni1")], vec![], "routes[1].dst"),
            (vec![], vec![0], "vxlanPorts[0]"),
            (vec![], vec![8472, 65_536], "vxlanPorts[1]"),
        ];
        for (routes, ports, field) in cases {
            let mut f = wire("", 0, &[]);
            (f.routes, f.vxlan_ports) = (routes, ports);
            let e = check("worker-2", &f).expect_err(field);
            assert_eq!((e.field.as_str(), e.reason), (field, reason::INVALID_FACTS), "{e}");
            assert!(e.to_string().contains("node worker-2"), "{e}");
        }
        let mut f = wire("", 0, &[]);
        f.routes = (0..=MAX_ROUTES as u32)
            .map(|i| route(&format!("{}/32", Ipv4Addr::from(0x0af4_0000 + i)), "cali0"))
            .collect();
        assert_eq!(check("worker-2", &f).unwrap_err().field, "routes");
        f.routes.pop();
        assert!(check("worker-2", &f).is_ok(), "exactly {MAX_ROUTES} routes are accepted");
        f.vxlan_ports = (1..=MAX_VXLAN_PORTS as u32 + 1).collect();
        assert_eq!(check("worker-2", &f).unwrap_err().field, "vxlanPorts");
    }

    fn node(name: &str, addresses: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            status: Some(NodeStatus {
                addresses: Some(
                    addresses.iter().map(|(t, a)| NodeAddress { type_: (*t).into(), address: (*a).into() }).collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn reported(name: &str, a: &str) -> KnownFacts {
        KnownFacts { node: name.into(), underlay_address: Some(a.parse().unwrap()), ..Default::default() }
    }

    #[test]
    fn a_report_within_bounds_reads_as_the_computation_reads_it() {
        let f = check("edge-a", &wire("10.0.0.1", 1420, &[("eth0", &["10.0.0.1"]), ("lxc12ab", &[])])).unwrap();
        assert_eq!(f.underlay_address, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(f.underlay_mtu, Some(1420));
        assert_eq!(f.interfaces.unwrap().len(), 2);
        // Nothing reported yet: no underlay, no MTU.
        let f = check("edge-a", &wire("", 0, &[])).unwrap();
        assert_eq!((f.underlay_address, f.underlay_mtu), (None, None));
    }

    #[test]
    fn every_bound_refuses_the_whole_report_naming_the_field() {
        let long = "x".repeat(16);
        let many: Vec<String> = (0..=MAX_ADDRESSES).map(|i| format!("10.0.{}.{}", i / 256, i % 256)).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let cases: Vec<(wire::NodeFacts, &str)> = vec![
            (wire("10.0.0.1", 67, &[]), "underlayMtu"),
            (wire("10.0.0.1", 65_536, &[]), "underlayMtu"),
            (wire("10.0.0.300", 1500, &[]), "underlayAddress"),
            (wire("0.0.0.0", 1500, &[]), "underlayAddress"),
            (wire("127.0.0.1", 1500, &[]), "underlayAddress"),
            (wire("10.0.0.1/24", 1500, &[]), "underlayAddress"),
            (wire("", 0, &[("", &[])]), "interfaces[0].name"),
            (wire("", 0, &[("eth0", &[]), (&long, &[])]), "interfaces[1].name"),
            (wire("", 0, &[("a/b", &[])]), "interfaces[0].name"),
            (wire("", 0, &[("a b", &[])]), "interfaces[0].name"),
            (wire("", 0, &[(".", &[])]), "interfaces[0].name"),
            (wire("", 0, &[("..", &[])]), "interfaces[0].name"),
            (wire("", 0, &[("eth0", &[]), ("eth0", &[])]), "interfaces[1].name"),
            (wire("", 0, &[("eth0", &["10.0.0.1/24"])]), "interfaces[0].addresses[0]"),
            (wire("", 0, &[("eth0", &["10.0.0.1", "eth0"])]), "interfaces[0].addresses[1]"),
            (wire("", 0, &[("eth0", &["224.0.0.1"])]), "interfaces[0].addresses[0]"),
            (wire("fe80::1", 0, &[]), "underlayAddress"),
            (wire("", 0, &[("eth0", &many)]), "interfaces[0].addresses"),
        ];
        for (f, field) in cases {
            let e = check("edge-a", &f).expect_err(field);
            assert_eq!((e.field.as_str(), e.reason), (field, reason::INVALID_FACTS), "{e}");
            assert!(e.to_string().contains("node edge-a"), "{e}");
        }
        let mut f = wire("", 0, &[]);
        f.interfaces = (0..=MAX_INTERFACES)
            .map(|i| wire::InterfaceFacts { name: format!("v{i}"), ..Default::default() })
            .collect();
        assert_eq!(check("edge-a", &f).unwrap_err().field, "interfaces");
        f.interfaces.pop();
        assert!(check("edge-a", &f).is_ok(), "exactly {MAX_INTERFACES} interfaces are accepted");
        let mut f = wire("", 0, &[]);
        f.kernel = "6.12\n".into();
        assert_eq!(check("edge-a", &f).unwrap_err().field, "kernel");
    }

    #[test]
    fn a_wireguard_key_is_32_bytes_of_canonical_base64() {
        // From `wg genkey | wg pubkey`, and the all-zero and all-ones keys.
        for ok in [
            "IVAkxB4FKNyQvXy5JCIGZ5hVgPzGgHETIT142MedoDg=",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "//////////////////////////////////////////8=",
        ] {
            assert!(wireguard_key(ok).is_ok(), "{ok}");
        }
        assert_eq!(wireguard_key("//////////////////////////////////////////8=").unwrap(), [0xff; 32]);
        for bad in [
            "",
            "IVAkxB4FKNyQvXy5JCIGZ5hVgPzGgHETIT142MedoDg",   // no padding
            "IVAkxB4FKNyQvXy5JCIGZ5hVgPzGgHETIT142MedoDg==", // 45 characters
            "IVAkxB4FKNyQvXy5JCIGZ5hVgPzGgHETIT142Medo-g=",  // URL-safe alphabet
            "IVAkxB4FKNyQvXy5JCIGZ5hVgPzGgHETIT142MedoDh=",  // trailing bits set
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==",  // 31 bytes
            "IVAkxB4FKNyQvXy5JCIGZ5hVgPzGgHETIT142MedoD é",
        ] {
            assert!(wireguard_key(bad).is_err(), "{bad:?}");
        }
        let mut f = wire("", 0, &[]);
        f.wireguard_public_key = "IVAkxB4FKNyQvXy5JCIGZ5hVgPzGgHETIT142MedoDg=".into();
        let known = check("edge-a", &f).unwrap();
        assert_eq!(known.wireguard_public_key.as_deref(), Some(f.wireguard_public_key.as_str()));
        assert_eq!(check("edge-a", &wire("", 0, &[])).unwrap().wireguard_public_key, None);
        f.wireguard_public_key = "not a key".into();
        let e = check("edge-a", &f).unwrap_err();
        assert_eq!((e.field.as_str(), e.reason), ("wireguardPublicKey", reason::INVALID_FACTS));
        assert!(e.to_string().contains("node edge-a") && e.message.contains("not a WireGuard key"), "{e}");
    }

    #[test]
    fn interface_names_follow_the_kernel() {
        for ok in ["eth0", "enp1s0", "lxc_health", "a", "123456789012345", "kup-0a1b2c3d", "wg0.100"] {
            assert!(valid_interface_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "1234567890123456", "a/b", "a b", "a\tb", "eth0:1", "é\u{0}"] {
            assert!(!valid_interface_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn an_underlay_must_be_one_of_the_nodes_own_addresses() {
        let nodes = [
            node("edge-a", &[("InternalIP", "100.64.93.143"), ("ExternalIP", "203.0.113.9"), ("Hostname", "edge-a")]),
            node("worker-2", &[("InternalIP", "100.64.0.12")]),
        ];
        let fallback: BTreeMap<String, Ipv4Addr> =
            [("edge-a".into(), "100.64.93.143".parse().unwrap()), ("worker-2".into(), "100.64.0.12".parse().unwrap())]
                .into();
        // Any of the Node's addresses, whatever its type.
        let u = underlays(&nodes.to_vec().into(), &[reported("edge-a", "203.0.113.9")], &fallback);
        assert_eq!(
            u["edge-a"],
            Underlay { address: Some("203.0.113.9".parse().unwrap()), reported: true, refused: None }
        );
        // Another node's address: refused; edge-a keeps its InternalIP and worker-2 is untouched.
        for forged in ["100.64.0.12", "100.64.0.66"] {
            let u = underlays(
                &nodes.to_vec().into(),
                &[reported("worker-2", "100.64.0.12"), reported("edge-a", forged)],
                &fallback,
            );
            let r = u["edge-a"].refused.clone().unwrap();
            assert_eq!((r.field.as_str(), r.reason), ("underlayAddress", reason::UNDERLAY_NOT_NODE_ADDRESS));
            assert!(r.message.contains(forged) && r.message.contains("100.64.93.143, 203.0.113.9"), "{r}");
            assert_eq!(u["edge-a"].address, Some("100.64.93.143".parse().unwrap()));
            assert!(!u["edge-a"].reported);
            assert_eq!(
                u["worker-2"],
                Underlay { address: Some("100.64.0.12".parse().unwrap()), reported: true, refused: None }
            );
        }
        // No Node object: nothing lists the address.
        let u = underlays(&nodes.to_vec().into(), &[reported("ghost", "100.64.0.77")], &fallback);
        assert_eq!(u["ghost"].address, None);
        assert!(u["ghost"].refused.as_ref().unwrap().message.contains("no Node object"));
    }

    #[test]
    fn nodes_sharing_an_underlay_use_it_none_and_are_named() {
        // Two homes behind NAT, both listing the same private address.
        let nodes = [
            node("home-1", &[("InternalIP", "192.168.1.10")]),
            node("home-2", &[("InternalIP", "192.168.1.10")]),
            node("edge-a", &[("InternalIP", "100.64.93.143")]),
        ];
        let fallback: BTreeMap<String, Ipv4Addr> = [
            ("home-1".into(), "192.168.1.10".parse().unwrap()),
            ("home-2".into(), "192.168.1.10".parse().unwrap()),
            ("edge-a".into(), "100.64.93.143".parse().unwrap()),
        ]
        .into();
        let u = underlays(&nodes.to_vec().into(), &[reported("home-1", "192.168.1.10")], &fallback);
        for (n, other) in [("home-1", "home-2"), ("home-2", "home-1")] {
            let r = u[n].refused.clone().unwrap();
            assert_eq!(u[n].address, None);
            assert_eq!(r.reason, reason::UNDERLAY_ADDRESS_CLASH);
            assert!(r.message.contains(other), "{r}");
        }
        assert_eq!(u["edge-a"].address, Some("100.64.93.143".parse().unwrap()));
        assert!(u["edge-a"].refused.is_none());
        // A deleted node's remembered address does not clash with the node that reuses it.
        let mut fallback = fallback;
        fallback.insert("gone".into(), "100.64.93.143".parse().unwrap());
        let u = underlays(&nodes.to_vec().into(), &[], &fallback);
        assert!(u["edge-a"].refused.is_none() && u["edge-a"].address.is_some());
    }
}
