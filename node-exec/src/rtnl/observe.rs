//! Reading back what the kernel has, through rtnetlink dumps.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use futures::TryStreamExt;
use ipnet::IpNet;
use kuport_proto::v1::LinkCounters;
use netlink_packet_route::{
    AddressFamily,
    address::{AddressAttribute, AddressMessage},
    link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType},
    rule::{RuleAction, RuleAttribute, RuleMessage},
};
use rtnetlink::{Handle, IpVersion, RouteMessageBuilder};

use super::{
    error::{Error, Op},
    model::Desired,
    session::session,
};

/// A link as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedLink {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    /// Administratively up (IFF_UP).
    pub admin_up: bool,
    /// The operational state as `ip` prints it (UNKNOWN, UP, DOWN, ...).
    pub oper_state: String,
    /// The link kind (`vxlan`, `veth`, ...), None for kindless links such as `lo`.
    pub kind: Option<String>,
    pub vxlan: Option<ObservedVxlan>,
    /// The device's link-layer address (IFLA_ADDRESS).
    pub mac: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedVxlan {
    pub vni: u32,
    pub local: Option<Ipv4Addr>,
    pub remote: Option<Ipv4Addr>,
    pub dstport: u16,
    pub ttl: u8,
}

/// An address (IPv4 or IPv6) on a link.
#[derive(Debug, Clone)]
pub struct ObservedAddress {
    pub index: u32,
    pub dev: String,
    pub net: IpNet,
    pub(crate) msg: AddressMessage,
}

/// A neighbour entry (ARP or NDP).
#[derive(Debug, Clone)]
pub struct ObservedNeighbour {
    pub index: u32,
    pub dev: String,
    pub address: IpAddr,
    pub mac: Option<Vec<u8>>,
    /// NUD_PERMANENT: set by someone, never aged or resolved by the kernel.
    pub permanent: bool,
    pub(crate) msg: NeighbourMessage,
}

/// A route (IPv4 or IPv6) outside the kernel-managed `local` table.
#[derive(Debug, Clone)]
pub struct ObservedRoute {
    pub table: u32,
    /// Its family is the route's.
    pub dst: IpNet,
    pub via: Option<IpAddr>,
    pub dev: Option<String>,
    /// The metric; kuport's routes have the family's default (0 for IPv4, 1024 for IPv6).
    pub priority: u32,
    /// Installed by the kernel for an address (`proto kernel`): never kuport's to remove.
    pub kernel: bool,
    /// Nothing beyond what kuport models (a plain unicast route with one next hop).
    pub plain: bool,
    pub(crate) msg: RouteMessage,
}

/// A policy rule of either family.
#[derive(Debug, Clone)]
pub struct ObservedRule {
    pub pref: u32,
    pub fwmark: u32,
    pub fwmask: u32,
    pub to: Option<IpNet>,
    pub table: u32,
    /// An IPv6 rule (`ip -6 rule`).
    pub ipv6: bool,
    /// Nothing beyond what kuport models (`fwmark`, `to`, `lookup`).
    pub plain: bool,
    pub(crate) msg: RuleMessage,
}

/// Everything the kernel has in one namespace that kuport's objects live among (foreign ones
/// included; [`super::diff`] applies ownership), plus the sysctls a desired state names.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub links: Vec<ObservedLink>,
    pub addresses: Vec<ObservedAddress>,
    /// Neighbour entries on `kup-*` links only (a host's other entries churn and are never ours).
    pub neighbours: Vec<ObservedNeighbour>,
    pub routes: Vec<ObservedRoute>,
    pub rules: Vec<ObservedRule>,
    /// Current values of the desired sysctls, by key.
    pub sysctls: BTreeMap<String, String>,
}

impl Observed {
    pub fn link(&self, name: &str) -> Option<&ObservedLink> {
        self.links.iter().find(|l| l.name == name)
    }
}

/// Reads the namespace `netns` (None: the caller's): links, addresses, neighbours on kuport's
/// links, routes and rules (IPv4 and IPv6), and the sysctls `desired` names.
pub fn read(netns: Option<&Path>, desired: &Desired) -> Result<Observed, Error> {
    session(netns, |s| {
        let mut observed = s.take_observed()?;
        observed.sysctls = crate::sysctl::read_all(&desired.sysctls)?;
        Ok(observed)
    })?
}

/// Every address (IPv4 and IPv6) on a link other than loopback in `netns`, with its link's
/// name: what identifies a pod's namespace.
pub fn addresses(netns: Option<&Path>) -> Result<Vec<(String, IpAddr)>, Error> {
    session(netns, |s| {
        let handle = s.handle();
        s.block_on(async move {
            let links: Vec<LinkMessage> =
                handle.link().get().execute().try_collect().await.map_err(dump_err("links"))?;
            let addresses: Vec<AddressMessage> =
                handle.address().get().execute().try_collect().await.map_err(dump_err("addresses"))?;
            let name = |index: u32| {
                let link = links.iter().find(|l| l.header.index == index)?;
                if link.header.flags.contains(LinkFlags::Loopback) {
                    return None;
                }
                link.attributes.iter().find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some(n.clone()),
                    _ => None,
                })
            };
            Ok(addresses
                .iter()
                .filter_map(|m| {
                    let addr = m.attributes.iter().find_map(|a| match a {
                        AddressAttribute::Local(a) => Some(*a),
                        _ => None,
                    });
                    let addr = addr.or_else(|| {
                        m.attributes.iter().find_map(|a| match a {
                            AddressAttribute::Address(a) => Some(*a),
                            _ => None,
                        })
                    })?;
                    Some((name(m.header.index)?, addr))
                })
                .collect())
        })
    })?
}

/// The statistics of the links named `names` in `netns` (None: the caller's), as the kernel
/// counts them now (IFLA_STATS64, what `ip -s link show` prints), in `names`' order; a name the
/// kernel has no link of is left out. One dump, nothing written (docs/operations/counters.md).
pub fn link_counters(netns: Option<&Path>, names: &[String]) -> Result<Vec<LinkCounters>, Error> {
    session(netns, |s| {
        let handle = s.handle();
        let links: Vec<LinkMessage> =
            s.block_on(async move { handle.link().get().execute().try_collect().await.map_err(dump_err("links")) })?;
        let mut by_name: BTreeMap<String, LinkCounters> =
            links.iter().map(counted_link).map(|c| (c.name.clone(), c)).collect();
        Ok(names.iter().filter_map(|n| by_name.remove(n)).collect())
    })?
}

/// A link message's name, MTU, IFF_UP and statistics (the 64-bit ones; the 32-bit ones only on a
/// kernel that sends no others).
fn counted_link(m: &LinkMessage) -> LinkCounters {
    let mut out = LinkCounters { up: m.header.flags.contains(LinkFlags::Up), ..Default::default() };
    let mut have64 = false;
    for attr in &m.attributes {
        match attr {
            LinkAttribute::IfName(n) => out.name = n.clone(),
            LinkAttribute::Mtu(mtu) => out.mtu = *mtu,
            LinkAttribute::Stats64(s) => {
                have64 = true;
                (out.rx_packets, out.rx_bytes, out.rx_errors, out.rx_dropped) =
                    (s.rx_packets, s.rx_bytes, s.rx_errors, s.rx_dropped);
                (out.tx_packets, out.tx_bytes, out.tx_errors, out.tx_dropped) =
                    (s.tx_packets, s.tx_bytes, s.tx_errors, s.tx_dropped);
            }
            LinkAttribute::Stats(s) if !have64 => {
                (out.rx_packets, out.rx_bytes, out.rx_errors, out.rx_dropped) =
                    (s.rx_packets.into(), s.rx_bytes.into(), s.rx_errors.into(), s.rx_dropped.into());
                (out.tx_packets, out.tx_bytes, out.tx_errors, out.tx_dropped) =
                    (s.tx_packets.into(), s.tx_bytes.into(), s.tx_errors.into(), s.tx_dropped.into());
            }
            _ => {}
        }
    }
    out
}

fn dump_err(what: &'static str) -> impl Fn(rtnetlink::Error) -> Error {
    move |e| Error::kernel(Op::Dump, what, e)
}

/// Dumps links, addresses, neighbours, routes and rules of both families on `handle`'s namespace.
pub(crate) async fn dump(handle: &Handle) -> Result<Observed, Error> {
    let links: Vec<LinkMessage> = handle.link().get().execute().try_collect().await.map_err(dump_err("links"))?;
    let links: Vec<ObservedLink> = links.iter().filter_map(parse_link).collect();
    let name_of = |index: u32| links.iter().find(|l| l.index == index).map(|l| l.name.clone());

    let addresses: Vec<AddressMessage> =
        handle.address().get().execute().try_collect().await.map_err(dump_err("addresses"))?;
    let addresses = addresses.into_iter().filter_map(|m| parse_address(m, &name_of)).collect();

    // One dump per family: an unspecified family would also list other tables' entries.
    let mut neighbours = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let dumped: Vec<NeighbourMessage> = handle
            .neighbours()
            .get()
            .set_address_family(family)
            .execute()
            .try_collect()
            .await
            .map_err(dump_err("neighbours"))?;
        neighbours.extend(dumped.into_iter().filter_map(|m| parse_neighbour(m, &name_of)));
    }

    // A non-strict dump returns every table; the header's table is not a filter.
    let mut routes: Vec<RouteMessage> = handle
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(dump_err("routes"))?;
    let routes6: Vec<RouteMessage> = handle
        .route()
        .get(RouteMessageBuilder::<Ipv6Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(dump_err("routes"))?;
    routes.extend(routes6);
    let routes = routes.into_iter().filter_map(|m| parse_route(m, &name_of)).collect();

    let mut rules: Vec<RuleMessage> =
        handle.rule().get(IpVersion::V4).execute().try_collect().await.map_err(dump_err("rules"))?;
    let rules6: Vec<RuleMessage> =
        handle.rule().get(IpVersion::V6).execute().try_collect().await.map_err(dump_err("rules"))?;
    rules.extend(rules6);
    let rules = rules.into_iter().filter_map(parse_rule).collect();

    Ok(Observed { links, addresses, neighbours, routes, rules, sysctls: BTreeMap::new() })
}

fn parse_link(m: &LinkMessage) -> Option<ObservedLink> {
    let mut link = ObservedLink {
        index: m.header.index,
        name: String::new(),
        mtu: 0,
        admin_up: m.header.flags.contains(LinkFlags::Up),
        oper_state: String::new(),
        kind: None,
        vxlan: None,
        mac: None,
    };
    for attr in &m.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Address(a) => link.mac = Some(a.clone()),
            LinkAttribute::Mtu(mtu) => link.mtu = *mtu,
            LinkAttribute::OperState(s) => link.oper_state = format!("{s:?}").to_uppercase(),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(k) => link.kind = Some(kind_name(k)),
                        LinkInfo::Data(InfoData::Vxlan(v)) => link.vxlan = Some(parse_vxlan(v)),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    (!link.name.is_empty()).then_some(link)
}

fn kind_name(k: &InfoKind) -> String {
    match k {
        InfoKind::Vxlan => "vxlan".into(),
        InfoKind::Veth => "veth".into(),
        InfoKind::Other(s) => s.clone(),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn parse_vxlan(attrs: &[InfoVxlan]) -> ObservedVxlan {
    let mut v = ObservedVxlan::default();
    for a in attrs {
        match a {
            InfoVxlan::Id(id) => v.vni = *id,
            InfoVxlan::Local(l) if !l.is_unspecified() => v.local = Some(*l),
            InfoVxlan::Group(g) if !g.is_unspecified() => v.remote = Some(*g),
            InfoVxlan::Port(p) => v.dstport = *p,
            InfoVxlan::Ttl(t) => v.ttl = *t,
            _ => {}
        }
    }
    v
}

fn parse_address(m: AddressMessage, name_of: &impl Fn(u32) -> Option<String>) -> Option<ObservedAddress> {
    let v6 = match m.header.family {
        AddressFamily::Inet => false,
        AddressFamily::Inet6 => true,
        _ => return None,
    };
    let of_family = |a: &IpAddr| a.is_ipv6() == v6;
    // IFA_LOCAL is the interface's own address; IFA_ADDRESS differs from it only on point-to-point
    // (IPv6 addresses carry IFA_ADDRESS alone).
    let local = m.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(a) if of_family(a) => Some(*a),
        _ => None,
    });
    let addr = local.or_else(|| {
        m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(a) if of_family(a) => Some(*a),
            _ => None,
        })
    })?;
    let net = IpNet::new(addr, m.header.prefix_len).ok()?;
    Some(ObservedAddress { index: m.header.index, dev: name_of(m.header.index).unwrap_or_default(), net, msg: m })
}

fn parse_neighbour(m: NeighbourMessage, name_of: &impl Fn(u32) -> Option<String>) -> Option<ObservedNeighbour> {
    if !matches!(m.header.family, AddressFamily::Inet | AddressFamily::Inet6) {
        return None;
    }
    let dev = name_of(m.header.ifindex).filter(|d| super::consts::owns_link(d))?;
    let mut address = None;
    let mut mac = None;
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(d)) => address = Some(IpAddr::V4(*d)),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(d)) => address = Some(IpAddr::V6(*d)),
            NeighbourAttribute::LinkLayerAddress(l) => mac = Some(l.clone()),
            _ => {}
        }
    }
    Some(ObservedNeighbour {
        index: m.header.ifindex,
        dev,
        address: address?,
        mac,
        permanent: m.header.state == NeighbourState::Permanent,
        msg: m,
    })
}

/// Attributes of a route that kuport's own routes carry, or that the kernel adds to any route.
fn plain_route_attr(a: &RouteAttribute) -> bool {
    matches!(
        a,
        RouteAttribute::Destination(_)
            | RouteAttribute::Gateway(_)
            | RouteAttribute::Oif(_)
            | RouteAttribute::Table(_)
            | RouteAttribute::Priority(_)
            | RouteAttribute::CacheInfo(_)
            // IPv6 routes always carry their router preference (RFC 4191); kuport leaves it alone.
            | RouteAttribute::Preference(_)
    )
}

/// A route or rule address as an `IpAddr`, when it is one of the family `v6` says.
fn route_addr(a: &RouteAddress, v6: bool) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(a) if !v6 => Some(IpAddr::V4(*a)),
        RouteAddress::Inet6(a) if v6 => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

fn parse_route(m: RouteMessage, name_of: &impl Fn(u32) -> Option<String>) -> Option<ObservedRoute> {
    let v6 = match m.header.address_family {
        AddressFamily::Inet => false,
        AddressFamily::Inet6 => true,
        _ => return None,
    };
    let mut table = u32::from(m.header.table);
    let mut dst = if v6 { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { IpAddr::V4(Ipv4Addr::UNSPECIFIED) };
    let mut via = None;
    let mut oif = None;
    let mut priority = 0;
    for a in &m.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(d) => dst = route_addr(d, v6).unwrap_or(dst),
            RouteAttribute::Gateway(g) => via = route_addr(g, v6).or(via),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Priority(p) => priority = *p,
            _ => {}
        }
    }
    if table == super::consts::TABLE_LOCAL {
        return None;
    }
    let dst = IpNet::new(dst, m.header.destination_prefix_length).ok()?;
    let plain = m.header.kind == RouteType::Unicast
        && m.header.tos == 0
        && m.header.source_prefix_length == 0
        && m.attributes.iter().all(plain_route_attr);
    Some(ObservedRoute {
        table,
        dst,
        via,
        dev: oif.and_then(name_of),
        priority,
        kernel: m.header.protocol == RouteProtocol::Kernel,
        plain,
        msg: m,
    })
}

/// The kernel reports an unset suppressor as all ones.
const SUPPRESS_UNSET: u32 = u32::MAX;

/// Attributes of a rule that kuport's own rules carry, or that the kernel adds to any rule.
fn plain_rule_attr(a: &RuleAttribute) -> bool {
    matches!(
        a,
        RuleAttribute::Priority(_)
            | RuleAttribute::FwMark(_)
            | RuleAttribute::FwMask(_)
            | RuleAttribute::Destination(_)
            | RuleAttribute::Table(_)
            | RuleAttribute::Protocol(_)
            | RuleAttribute::SuppressPrefixLen(SUPPRESS_UNSET)
            | RuleAttribute::SuppressIfGroup(SUPPRESS_UNSET)
    )
}

fn parse_rule(m: RuleMessage) -> Option<ObservedRule> {
    let ipv6 = match m.header.family {
        AddressFamily::Inet => false,
        AddressFamily::Inet6 => true,
        _ => return None,
    };
    let mut rule = ObservedRule {
        pref: 0,
        fwmark: 0,
        fwmask: 0,
        to: None,
        table: u32::from(m.header.table),
        ipv6,
        plain: false,
        msg: RuleMessage::default(),
    };
    for a in &m.attributes {
        match a {
            RuleAttribute::Priority(p) => rule.pref = *p,
            RuleAttribute::FwMark(v) => rule.fwmark = *v,
            RuleAttribute::FwMask(v) => rule.fwmask = *v,
            RuleAttribute::Table(t) => rule.table = *t,
            RuleAttribute::Destination(d) if d.is_ipv6() == ipv6 => {
                rule.to = IpNet::new(*d, m.header.dst_len).ok();
            }
            _ => {}
        }
    }
    rule.plain = m.header.action == RuleAction::ToTable
        && m.header.tos == 0
        && m.header.src_len == 0
        && m.header.flags.is_empty()
        && m.attributes.iter().all(plain_rule_attr);
    rule.msg = m;
    Some(rule)
}
