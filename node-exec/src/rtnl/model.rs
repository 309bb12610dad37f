//! The desired state, parsed and validated from the wire types, and how each object is named.
//! Addresses, neighbours, routes and rules are of either family; VXLAN endpoints are IPv4.

use std::{
    collections::BTreeSet,
    fmt,
    net::{IpAddr, Ipv4Addr},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use kuport_proto::v1::{self, link};

use super::{
    consts::{LINK_PREFIX, RESERVED_TABLES, TABLE_MAIN, owns_link, owns_rule},
    error::Error,
};

/// A VXLAN link kuport wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    pub name: String,
    /// None leaves the kernel's choice alone.
    pub mtu: Option<u32>,
    /// None leaves the kernel's random MAC alone.
    pub mac: Option<Mac>,
    pub vxlan: VxlanSpec,
}

/// A link-layer address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// A permanent neighbour entry on one of kuport's links (ARP for IPv4, NDP for IPv6).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NeighbourSpec {
    pub dev: String,
    pub address: IpAddr,
    pub mac: Mac,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanSpec {
    pub vni: u32,
    pub local: Option<Ipv4Addr>,
    pub remote: Option<Ipv4Addr>,
    /// None leaves the kernel's default port.
    pub dstport: Option<u16>,
    /// None (0) inherits the inner packet's TTL, as the kernel does for 0.
    pub ttl: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AddressSpec {
    pub dev: String,
    /// The address with its prefix length ("169.254.77.2/31", "fd64:f5ac:e961::2/127").
    pub net: IpNet,
}

/// A route; its family is its destination's (`via`, when set, is of the same family).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RouteSpec {
    pub table: u32,
    pub dst: IpNet,
    pub via: Option<IpAddr>,
    pub dev: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RuleSpec {
    pub pref: u32,
    pub fwmark: u32,
    pub fwmask: u32,
    /// Of the rule's family when set.
    pub to: Option<IpNet>,
    pub table: u32,
    /// The rule's family: an IPv6 rule (`ip -6 rule`) when set.
    pub ipv6: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlSpec {
    pub key: String,
    pub value: String,
}

/// The link/address/route/rule/sysctl part of one `NetnsState`, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    pub links: Vec<LinkSpec>,
    pub addresses: Vec<AddressSpec>,
    pub neighbours: Vec<NeighbourSpec>,
    pub routes: Vec<RouteSpec>,
    pub rules: Vec<RuleSpec>,
    pub sysctls: Vec<SysctlSpec>,
    /// The state's WireGuard devices: links of their own step (crate::wireguard), which the
    /// link step neither creates nor removes.
    pub wireguard: Vec<crate::wireguard::DeviceSpec>,
}

impl Desired {
    /// Validates `state`: every object must be well-formed and inside what kuport owns (links
    /// named `kup-*`, addresses on them, rules at its preferences with its marks).
    pub fn from_proto(state: &v1::NetnsState) -> Result<Self, Error> {
        let mut d = Desired::default();
        for l in &state.links {
            d.links.push(parse_link(l)?);
        }
        for a in &state.addresses {
            d.addresses.push(parse_address(a)?);
        }
        for n in &state.neighbours {
            d.neighbours.push(parse_neighbour(n)?);
        }
        for r in &state.routes {
            d.routes.push(parse_route(r)?);
        }
        for r in &state.ip_rules {
            d.rules.push(parse_rule(r)?);
        }
        for s in &state.sysctls {
            d.sysctls.push(parse_sysctl(s)?);
        }
        d.wireguard = crate::wireguard::model::parse_devices(state).map_err(|e| match e {
            crate::wireguard::Error::Invalid { object, reason } => Error::Invalid { object, reason },
            other => Error::Invalid { object: "wireguard devices".into(), reason: other.to_string() },
        })?;
        d.check_unique()?;
        Ok(d)
    }

    /// Whether `name` is one of the state's WireGuard devices.
    pub(crate) fn is_wireguard(&self, name: &str) -> bool {
        self.wireguard.iter().any(|w| w.name == name)
    }

    /// Tables whose every (non-kernel) route kuport owns: those its routes and rules name, minus
    /// the reserved ones.
    pub(crate) fn tables(&self) -> BTreeSet<u32> {
        self.routes
            .iter()
            .map(|r| r.table)
            .chain(self.rules.iter().map(|r| r.table))
            .filter(|t| !RESERVED_TABLES.contains(t))
            .collect()
    }

    fn check_unique(&self) -> Result<(), Error> {
        let mut names = BTreeSet::new();
        for l in &self.links {
            if !names.insert(l.name.as_str()) {
                return Err(invalid(format!("link {}", l.name), "listed twice"));
            }
        }
        for w in &self.wireguard {
            if names.contains(w.name.as_str()) {
                return Err(invalid(format!("wireguard device {}", w.name), "a link of the same name is listed"));
            }
        }
        let mut neighbours = BTreeSet::new();
        for n in &self.neighbours {
            if !neighbours.insert((n.dev.as_str(), n.address)) {
                return Err(invalid(n, "another entry has the same link and address"));
            }
        }
        let mut routes = BTreeSet::new();
        for r in &self.routes {
            // The kernel keys a route by table and prefix (kuport never sets a metric).
            if !routes.insert((r.table, r.dst)) {
                return Err(invalid(r, "another route has the same table and destination"));
            }
        }
        let mut rules = BTreeSet::new();
        for r in &self.rules {
            if !rules.insert(r) {
                return Err(invalid(r, "listed twice"));
            }
        }
        Ok(())
    }
}

fn invalid(object: impl ToString, reason: impl ToString) -> Error {
    Error::Invalid { object: object.to_string(), reason: reason.to_string() }
}

fn parse_ip(object: &str, what: &str, text: &str) -> Result<IpAddr, Error> {
    text.parse::<IpAddr>().map_err(|_| invalid(object, format!("{what} {text:?} is not an address")))
}

fn opt_ip(object: &str, what: &str, text: &str) -> Result<Option<IpAddr>, Error> {
    if text.is_empty() { Ok(None) } else { parse_ip(object, what, text).map(Some) }
}

/// The underlay (VXLAN endpoints) stays IPv4.
fn opt_v4(object: &str, what: &str, text: &str) -> Result<Option<Ipv4Addr>, Error> {
    match opt_ip(object, what, text)? {
        None => Ok(None),
        Some(IpAddr::V4(a)) => Ok(Some(a)),
        Some(IpAddr::V6(_)) => Err(invalid(object, format!("{what} {text}: only IPv4 is supported"))),
    }
}

fn parse_net(object: &str, what: &str, text: &str) -> Result<IpNet, Error> {
    text.parse::<IpNet>().map_err(|_| invalid(object, format!("{what} {text:?} is not an IP prefix")))
}

/// A prefix without host bits (a route's or rule's destination).
fn parse_prefix(object: &str, what: &str, text: &str) -> Result<IpNet, Error> {
    let net = parse_net(object, what, text)?;
    if net.addr() != net.network() {
        return Err(invalid(object, format!("{what} {text} has host bits set")));
    }
    Ok(net)
}

/// The default route's prefix of the family `v6` says.
fn default_net(v6: bool) -> IpNet {
    if v6 { IpNet::V6(Ipv6Net::default()) } else { IpNet::V4(Ipv4Net::default()) }
}

fn family_name(v6: bool) -> &'static str {
    if v6 { "IPv6" } else { "IPv4" }
}

fn check_ifname(object: &str, name: &str) -> Result<(), Error> {
    if name.is_empty() || name.contains(['/', ' ', '\0']) {
        return Err(invalid(object, format!("{name:?} is not an interface name")));
    }
    Ok(())
}

fn parse_link(l: &v1::Link) -> Result<LinkSpec, Error> {
    let object = format!("link {}", l.name);
    check_ifname(&object, &l.name)?;
    if !owns_link(&l.name) {
        return Err(invalid(&object, format!("kuport only manages links named {LINK_PREFIX}*")));
    }
    // Over-long names are left to the kernel to refuse, so the refusal carries its reason.
    let Some(link::Kind::Vxlan(vx)) = &l.kind else {
        return Err(invalid(&object, "no link kind (only vxlan is supported)"));
    };
    let dstport = match vx.dstport {
        0 => None,
        p => Some(u16::try_from(p).map_err(|_| invalid(&object, format!("dstport {p} out of range")))?),
    };
    let ttl = match vx.ttl {
        0 => None,
        t => Some(u8::try_from(t).map_err(|_| invalid(&object, format!("ttl {t} out of range")))?),
    };
    let mac = if l.mac.is_empty() { None } else { Some(parse_mac(&object, &l.mac)?) };
    Ok(LinkSpec {
        name: l.name.clone(),
        mtu: (l.mtu != 0).then_some(l.mtu),
        mac,
        vxlan: VxlanSpec {
            vni: vx.vni,
            local: opt_v4(&object, "local", &vx.local)?,
            remote: opt_v4(&object, "remote", &vx.remote)?,
            dstport,
            ttl,
        },
    })
}

fn parse_address(a: &v1::Address) -> Result<AddressSpec, Error> {
    let object = format!("address {} dev {}", a.cidr, a.dev);
    check_ifname(&object, &a.dev)?;
    if !owns_link(&a.dev) {
        return Err(invalid(&object, format!("kuport only manages addresses on {LINK_PREFIX}* links")));
    }
    Ok(AddressSpec { dev: a.dev.clone(), net: parse_net(&object, "address", &a.cidr)? })
}

/// A unicast MAC, `xx:xx:xx:xx:xx:xx`.
fn parse_mac(object: &str, text: &str) -> Result<Mac, Error> {
    let bad = || invalid(object, format!("mac {text:?} is not six hex octets separated by colons"));
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for b in &mut mac {
        let part = parts.next().filter(|p| p.len() == 2).ok_or_else(bad)?;
        *b = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    if mac[0] & 1 != 0 || mac == [0; 6] {
        return Err(invalid(object, format!("mac {text}: not a unicast address")));
    }
    Ok(Mac(mac))
}

fn parse_neighbour(n: &v1::Neighbour) -> Result<NeighbourSpec, Error> {
    let object = format!("neighbour {} dev {}", n.address, n.dev);
    check_ifname(&object, &n.dev)?;
    if !owns_link(&n.dev) {
        return Err(invalid(&object, format!("kuport only manages neighbours on {LINK_PREFIX}* links")));
    }
    Ok(NeighbourSpec {
        dev: n.dev.clone(),
        address: parse_ip(&object, "address", &n.address)?,
        mac: parse_mac(&object, &n.mac)?,
    })
}

fn parse_route(r: &v1::Route) -> Result<RouteSpec, Error> {
    let object = format!("route {} via {} dev {} table {}", r.dst, r.via, r.dev, r.table);
    let via = opt_ip(&object, "gateway", &r.via)?;
    // "default" takes the gateway's family (IPv4 without one).
    let dst = if r.dst == "default" {
        default_net(via.is_some_and(|v| v.is_ipv6()))
    } else {
        parse_prefix(&object, "destination", &r.dst)?
    };
    if let Some(v) = via
        && v.is_ipv6() != matches!(dst, IpNet::V6(_))
    {
        return Err(invalid(&object, "the gateway and the destination are of different families"));
    }
    let dev = if r.dev.is_empty() {
        None
    } else {
        check_ifname(&object, &r.dev)?;
        Some(r.dev.clone())
    };
    if via.is_none() && dev.is_none() {
        return Err(invalid(&object, "a route needs a gateway or a device"));
    }
    if r.table == 0 || r.table == super::consts::TABLE_LOCAL {
        return Err(invalid(&object, format!("table {} is not usable", r.table)));
    }
    Ok(RouteSpec { table: r.table, dst, via, dev })
}

fn parse_rule(r: &v1::IpRule) -> Result<RuleSpec, Error> {
    let object = format!("rule pref {} fwmark {:#x}/{:#x}", r.pref, r.fwmark, r.fwmask);
    if !owns_rule(r.pref, r.fwmark) {
        return Err(invalid(&object, "kuport only manages rules at its preferences with a mark under its prefix"));
    }
    if r.fwmask == 0 || r.fwmark & !r.fwmask != 0 {
        return Err(invalid(&object, "the mark has bits outside its mask"));
    }
    let to = if r.to.is_empty() { None } else { Some(parse_prefix(&object, "to", &r.to)?) };
    if let Some(to) = to
        && matches!(to, IpNet::V6(_)) != r.ipv6
    {
        return Err(invalid(&object, format!("to {}: not an {} prefix", r.to, family_name(r.ipv6))));
    }
    if r.table == 0 {
        return Err(invalid(&object, "table 0 is not a table"));
    }
    Ok(RuleSpec { pref: r.pref, fwmark: r.fwmark, fwmask: r.fwmask, to, table: r.table, ipv6: r.ipv6 })
}

fn parse_sysctl(s: &v1::Sysctl) -> Result<SysctlSpec, Error> {
    let object = format!("sysctl {}", s.key);
    if crate::sysctl::key_path(&s.key).is_none() {
        return Err(invalid(&object, "not a sysctl key"));
    }
    if s.value.contains('\n') {
        return Err(invalid(&object, "the value spans lines"));
    }
    Ok(SysctlSpec { key: s.key.clone(), value: s.value.clone() })
}

/// `main` for 254, the number otherwise: how `ip` names a table.
pub(crate) struct TableName(pub u32);

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == TABLE_MAIN { f.write_str("main") } else { write!(f, "{}", self.0) }
    }
}

/// `default` for 0.0.0.0/0 and ::/0, the prefix otherwise.
pub(crate) struct Dst(pub IpNet);

impl fmt::Display for Dst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.prefix_len() == 0 { f.write_str("default") } else { write!(f, "{}", self.0) }
    }
}

impl fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "link {}", self.name)
    }
}

impl fmt::Display for AddressSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "address {} dev {}", self.net, self.dev)
    }
}

impl fmt::Display for NeighbourSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "neighbour {} lladdr {} dev {}", self.address, self.mac, self.dev)
    }
}

impl fmt::Display for RouteSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "route {}", Dst(self.dst))?;
        if let Some(via) = self.via {
            write!(f, " via {via}")?;
        }
        if let Some(dev) = &self.dev {
            write!(f, " dev {dev}")?;
        }
        write!(f, " table {}", TableName(self.table))
    }
}

impl fmt::Display for RuleSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} pref {} fwmark {:#x}/{:#x}", RuleWord(self.ipv6), self.pref, self.fwmark, self.fwmask)?;
        if let Some(to) = self.to {
            write!(f, " to {to}")?;
        }
        write!(f, " lookup {}", TableName(self.table))
    }
}

/// `rule` for an IPv4 rule, `rule -6` for an IPv6 one (as `ip -6 rule` would list it).
pub(crate) struct RuleWord(pub bool);

impl fmt::Display for RuleWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0 { "rule -6" } else { "rule" })
    }
}

impl fmt::Display for SysctlSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sysctl {}", self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(pref: u32, fwmark: u32) -> v1::IpRule {
        v1::IpRule { pref, fwmark, fwmask: u32::MAX, to: String::new(), table: 201, ipv6: false }
    }

    fn reason(state: &v1::NetnsState) -> String {
        Desired::from_proto(state).expect_err("invalid").to_string()
    }

    #[test]
    fn refuses_what_kuport_does_not_own() {
        let link = v1::NetnsState {
            links: vec![v1::Link {
                name: "eth0".into(),
                mtu: 0,
                kind: Some(link::Kind::Vxlan(v1::Vxlan::default())),
                mac: String::new(),
            }],
            ..Default::default()
        };
        assert!(reason(&link).starts_with("invalid link eth0: "));
        let foreign_mark = v1::NetnsState { ip_rules: vec![rule(101, 0x1234)], ..Default::default() };
        assert!(reason(&foreign_mark).starts_with("invalid rule pref 101 fwmark 0x1234/"));
        let foreign_pref = v1::NetnsState { ip_rules: vec![rule(100, 0x6b70_0001)], ..Default::default() };
        assert!(reason(&foreign_pref).starts_with("invalid rule pref 100 "));
        let addr = v1::NetnsState {
            addresses: vec![v1::Address { dev: "eth0".into(), cidr: "10.0.0.1/24".into() }],
            ..Default::default()
        };
        assert!(reason(&addr).starts_with("invalid address 10.0.0.1/24 dev eth0: "));
        let neigh = |dev: &str, mac: &str| v1::NetnsState {
            neighbours: vec![v1::Neighbour { dev: dev.into(), address: "169.254.77.3".into(), mac: mac.into() }],
            ..Default::default()
        };
        assert!(reason(&neigh("eth0", "02:00:00:00:00:01")).starts_with("invalid neighbour 169.254.77.3 dev eth0: "));
        assert!(reason(&neigh("kup-1", "02:00:00:00:01")).contains("six hex octets"));
        assert!(reason(&neigh("kup-1", "03:00:00:00:00:01")).contains("not a unicast"));
        let d = Desired::from_proto(&neigh("kup-1", "02:6B:00:00:00:01")).expect("valid");
        assert_eq!(d.neighbours[0].to_string(), "neighbour 169.254.77.3 lladdr 02:6b:00:00:00:01 dev kup-1");
    }

    #[test]
    fn parses_routes_strictly() {
        let route = |dst: &str, via: &str| v1::NetnsState {
            routes: vec![v1::Route { table: 201, dst: dst.into(), via: via.into(), dev: "kup-1".into() }].into(),
            ..Default::default()
        };
        let d = Desired::from_proto(&route("default", "169.254.77.3")).expect("valid");
        assert_eq!(d.routes[0].to_string(), "route default via 169.254.77.3 dev kup-1 table 201");
        assert!(reason(&route("10.0.0.1/8", "")).contains("host bits"));
        let d = Desired::from_proto(&route("default", "fd64:f5ac:e961::3")).expect("valid");
        assert_eq!(d.routes[0].dst.to_string(), "::/0");
        assert_eq!(d.routes[0].to_string(), "route default via fd64:f5ac:e961::3 dev kup-1 table 201");
        assert!(reason(&route("10.0.0.0/8", "fd64::1")).contains("different families"));
        assert!(reason(&route("fd64::/64", "10.0.0.1")).contains("different families"));
        assert!(reason(&route("fd64::1/64", "")).contains("host bits"));
        assert!(reason(&route("default", "nonsense")).contains("not an address"));
    }

    /// The controller drops a clash by `kuport_proto::route_identity` before it sends a state;
    /// it must be exactly what this model refuses, or a clash would still stall a node.
    #[test]
    fn refuses_two_routes_exactly_when_they_share_the_controllers_identity() {
        let r = |dst: &str, via: &str, dev: &str| v1::Route {
            table: 201,
            dst: dst.into(),
            via: via.into(),
            dev: dev.into(),
        };
        let routes = [
            r("default", "169.254.77.1", "kup-1"),
            r("0.0.0.0/0", "169.254.77.3", "kup-2"),
            r("default", "", "kup-2"),
            r("default", "fd64::1", "kup-1"),
            r("::/0", "", "kup-2"),
            r("10.0.0.0/24", "", "kup-1"),
            r("10.0.0.0/24", "169.254.77.1", "kup-2"),
            r("10.0.0.0/25", "", "kup-1"),
        ];
        for a in &routes {
            for b in &routes {
                if std::ptr::eq(a, b) {
                    continue;
                }
                let state = v1::NetnsState { routes: vec![a.clone(), b.clone()].into(), ..Default::default() };
                let refused = Desired::from_proto(&state).is_err();
                let same = kuport_proto::route_identity(a) == kuport_proto::route_identity(b);
                assert_eq!(refused, same, "{a:?} and {b:?}");
            }
        }
    }

    #[test]
    fn names_rules_like_ip() {
        let mut r = rule(101, 0x6b70_0001);
        r.to = "100.64.0.2/32".into();
        r.table = TABLE_MAIN;
        let d = Desired::from_proto(&v1::NetnsState { ip_rules: vec![r], ..Default::default() }).expect("valid");
        assert_eq!(d.rules[0].to_string(), "rule pref 101 fwmark 0x6b700001/0xffffffff to 100.64.0.2/32 lookup main");
        // Rules naming main own no table; rules naming 201 own it.
        assert!(d.tables().is_empty());

        let mut r6 = rule(102, 0x6b70_0001);
        r6.ipv6 = true;
        let d =
            Desired::from_proto(&v1::NetnsState { ip_rules: vec![r6.clone()], ..Default::default() }).expect("valid");
        assert_eq!(d.rules[0].to_string(), "rule -6 pref 102 fwmark 0x6b700001/0xffffffff lookup 201");
        r6.to = "fd64:f5ac:e961::2/127".into();
        let d =
            Desired::from_proto(&v1::NetnsState { ip_rules: vec![r6.clone()], ..Default::default() }).expect("valid");
        assert_eq!(d.rules[0].to.map(|t| t.to_string()).as_deref(), Some("fd64:f5ac:e961::2/127"));
        // The same rule in both families is two rules.
        let mut r4 = r6.clone();
        r4.ipv6 = false;
        r4.to = String::new();
        r6.to = String::new();
        assert!(
            Desired::from_proto(&v1::NetnsState { ip_rules: vec![r4.clone(), r6.clone()], ..Default::default() })
                .is_ok()
        );
        r4.to = "fd64::/64".into();
        let refused = v1::NetnsState { ip_rules: vec![r4], ..Default::default() };
        assert!(reason(&refused).contains("not an IPv4 prefix"), "{}", reason(&refused));
        r6.to = "10.0.0.0/8".into();
        let refused = v1::NetnsState { ip_rules: vec![r6], ..Default::default() };
        assert!(reason(&refused).contains("not an IPv6 prefix"));
    }

    #[test]
    fn addresses_and_neighbours_of_both_families() {
        let d = Desired::from_proto(&v1::NetnsState {
            addresses: vec![
                v1::Address { dev: "kup-1".into(), cidr: "169.254.77.2/31".into() },
                v1::Address { dev: "kup-1".into(), cidr: "fd64:f5ac:e961::2/127".into() },
            ],
            neighbours: vec![
                v1::Neighbour { dev: "kup-1".into(), address: "169.254.77.3".into(), mac: "02:6b:00:00:00:01".into() },
                v1::Neighbour {
                    dev: "kup-1".into(),
                    address: "fd64:f5ac:e961::3".into(),
                    mac: "02:6b:00:00:00:01".into(),
                },
            ],
            ..Default::default()
        })
        .expect("valid");
        assert_eq!(d.addresses[1].to_string(), "address fd64:f5ac:e961::2/127 dev kup-1");
        assert_eq!(d.neighbours[1].to_string(), "neighbour fd64:f5ac:e961::3 lladdr 02:6b:00:00:00:01 dev kup-1");
    }
}
