//! Reading back what the kernel has, through rtnetlink dumps.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use futures::TryStreamExt;
use ipnet::Ipv4Net;
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

/// An IPv4 address on a link.
#[derive(Debug, Clone)]
pub struct ObservedAddress {
    pub index: u32,
    pub dev: String,
    pub net: Ipv4Net,
    pub(crate) msg: AddressMessage,
}

/// An IPv4 neighbour entry.
#[derive(Debug, Clone)]
pub struct ObservedNeighbour {
    pub index: u32,
    pub dev: String,
    pub address: Ipv4Addr,
    pub mac: Option<Vec<u8>>,
    /// NUD_PERMANENT: set by someone, never aged or resolved by the kernel.
    pub permanent: bool,
    pub(crate) msg: NeighbourMessage,
}

/// An IPv4 route outside the kernel-managed `local` table.
#[derive(Debug, Clone)]
pub struct ObservedRoute {
    pub table: u32,
    pub dst: Ipv4Net,
    pub via: Option<Ipv4Addr>,
    pub dev: Option<String>,
    /// The metric; kuport's routes have 0.
    pub priority: u32,
    /// Installed by the kernel for an address (`proto kernel`): never kuport's to remove.
    pub kernel: bool,
    /// Nothing beyond what kuport models (a plain unicast route with one next hop).
    pub plain: bool,
    pub(crate) msg: RouteMessage,
}

/// An IPv4 policy rule.
#[derive(Debug, Clone)]
pub struct ObservedRule {
    pub pref: u32,
    pub fwmark: u32,
    pub fwmask: u32,
    pub to: Option<Ipv4Net>,
    pub table: u32,
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

/// Reads the namespace `netns` (None: the caller's): links, IPv4 addresses, neighbours on
/// kuport's links, routes and rules, and
/// the sysctls `desired` names.
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

fn dump_err(what: &'static str) -> impl Fn(rtnetlink::Error) -> Error {
    move |e| Error::kernel(Op::Dump, what, e)
}

/// Dumps links, addresses, routes and rules on `handle`'s namespace.
pub(crate) async fn dump(handle: &Handle) -> Result<Observed, Error> {
    let links: Vec<LinkMessage> = handle.link().get().execute().try_collect().await.map_err(dump_err("links"))?;
    let links: Vec<ObservedLink> = links.iter().filter_map(parse_link).collect();
    let name_of = |index: u32| links.iter().find(|l| l.index == index).map(|l| l.name.clone());

    let addresses: Vec<AddressMessage> =
        handle.address().get().execute().try_collect().await.map_err(dump_err("addresses"))?;
    let addresses = addresses.into_iter().filter_map(|m| parse_address(m, &name_of)).collect();

    let neighbours: Vec<NeighbourMessage> = handle
        .neighbours()
        .get()
        .set_address_family(AddressFamily::Inet)
        .execute()
        .try_collect()
        .await
        .map_err(dump_err("neighbours"))?;
    let neighbours = neighbours.into_iter().filter_map(|m| parse_neighbour(m, &name_of)).collect();

    // A non-strict dump returns every table; the header's table is not a filter.
    let routes: Vec<RouteMessage> = handle
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(dump_err("routes"))?;
    let routes = routes.into_iter().filter_map(|m| parse_route(m, &name_of)).collect();

    let rules: Vec<RuleMessage> =
        handle.rule().get(IpVersion::V4).execute().try_collect().await.map_err(dump_err("rules"))?;
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
    if m.header.family != AddressFamily::Inet {
        return None;
    }
    // IFA_LOCAL is the interface's own address; IFA_ADDRESS differs from it only on point-to-point.
    let local = m.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(IpAddr::V4(v)) => Some(*v),
        _ => None,
    });
    let addr = local.or_else(|| {
        m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(IpAddr::V4(v)) => Some(*v),
            _ => None,
        })
    })?;
    let net = Ipv4Net::new(addr, m.header.prefix_len).ok()?;
    Some(ObservedAddress { index: m.header.index, dev: name_of(m.header.index).unwrap_or_default(), net, msg: m })
}

fn parse_neighbour(m: NeighbourMessage, name_of: &impl Fn(u32) -> Option<String>) -> Option<ObservedNeighbour> {
    if m.header.family != AddressFamily::Inet {
        return None;
    }
    let dev = name_of(m.header.ifindex).filter(|d| super::consts::owns_link(d))?;
    let mut address = None;
    let mut mac = None;
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(d)) => address = Some(*d),
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
    )
}

fn parse_route(m: RouteMessage, name_of: &impl Fn(u32) -> Option<String>) -> Option<ObservedRoute> {
    if m.header.address_family != AddressFamily::Inet {
        return None;
    }
    let mut table = u32::from(m.header.table);
    let mut dst = Ipv4Addr::UNSPECIFIED;
    let mut via = None;
    let mut oif = None;
    let mut priority = 0;
    for a in &m.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = *d,
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => via = Some(*g),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Priority(p) => priority = *p,
            _ => {}
        }
    }
    if table == super::consts::TABLE_LOCAL {
        return None;
    }
    let dst = Ipv4Net::new(dst, m.header.destination_prefix_length).ok()?;
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
    if m.header.family != AddressFamily::Inet {
        return None;
    }
    let mut rule = ObservedRule {
        pref: 0,
        fwmark: 0,
        fwmask: 0,
        to: None,
        table: u32::from(m.header.table),
        plain: false,
        msg: RuleMessage::default(),
    };
    for a in &m.attributes {
        match a {
            RuleAttribute::Priority(p) => rule.pref = *p,
            RuleAttribute::FwMark(v) => rule.fwmark = *v,
            RuleAttribute::FwMask(v) => rule.fwmask = *v,
            RuleAttribute::Table(t) => rule.table = *t,
            RuleAttribute::Destination(IpAddr::V4(d)) => {
                rule.to = Ipv4Net::new(*d, m.header.dst_len).ok();
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
