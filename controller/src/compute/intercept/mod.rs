//! Interception: the nftables tables kuport programs into a pod's own network namespace so the
//! pod's traffic for an intercepted port reaches an agent in the pod, with a service mesh in the
//! same pod left in charge of everything else. docs/intercept/table.md describes every chain,
//! rule, map and set, its hook and priority, and the test that proves it.
//!
//! Pure: [`tables`] maps an [`InterceptSpec`] (what the Intercept resource will carry, and the
//! pod's addresses) to one table per address family the pod has, and reports the intercepts it
//! refused.

use std::net::IpAddr;

use ipnet::IpNet;
use kuport_proto::build::{
    addr, base_chain, element, eq, id, in_literal, mark, member, nat_to_addr, nat_to_selector, ne, not_lookup, port,
    port_range, proto, redirect_to_map, rule, set, table,
};
use kuport_proto::v1::{
    ChainPolicy, ChainType, Hook, L4Proto, NatKind, NftFamily, NftMatch, NftRule, NftSet, NftTable, NftType, Selector,
};

pub mod pods;
#[cfg(test)]
mod tests;

/// The table's name in both families: kuport-prefixed, so the executor removes it when it leaves
/// the state (`kuport_proto::owned::NFT_TABLE_PREFIX`).
pub const TABLE: &str = kuport_proto::owned::INTERCEPT_TABLE;
/// The map from protocol . container port to agent port.
pub const REDIRECT_PORTS: &str = "redirect_ports";
/// The interval set of the mesh's dial subnets.
pub const MESH_DIAL_SUBNETS: &str = "mesh_dial_subnets";
/// The agent group of the design (Telepresence's traffic agent).
pub const DEFAULT_AGENT_GID: u32 = 7439;
/// Prerouting runs just after the standard destination NAT (dstnat, -100), so a mesh's inbound
/// redirect runs first.
pub const PREROUTING_PRIORITY: i32 = -100 + 10;
/// Output runs just before it, so the agent's NAT decisions claim a connection before a mesh's
/// outbound redirect (nft 1.0.6 refuses the `dstnat` keyword at the output hook: numeric).
pub const OUTPUT_PRIORITY: i32 = -110;
/// DNS stays with the mesh even for the agent's own sockets.
const DNS_PORT: u32 = 53;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    fn l4(self) -> L4Proto {
        match self {
            Protocol::Tcp => L4Proto::Tcp,
            Protocol::Udp => L4Proto::Udp,
        }
    }

    fn dport(self) -> Selector {
        match self {
            Protocol::Tcp => Selector::TcpDport,
            Protocol::Udp => Selector::UdpDport,
        }
    }
}

/// One intercepted port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intercept {
    pub protocol: Protocol,
    /// The port the application listens on.
    pub container_port: u32,
    /// The port the agent's forwarder listens on.
    pub agent_port: u32,
    /// For a numeric target: the port the agent dials on the pod's address to reach the
    /// application without being redirected back to itself.
    pub proxy_port: Option<u32>,
}

/// How the table tells the agent's sockets from everyone else's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentIdentity {
    /// `meta skgid`: the agent runs under a group no other container uses.
    Group(u32),
    /// `meta skuid`.
    User(u32),
    /// `meta mark`: for sockets whose owner cannot be matched (SO_MARK set by the agent).
    Mark(u32),
}

impl Default for AgentIdentity {
    fn default() -> Self {
        AgentIdentity::Group(DEFAULT_AGENT_GID)
    }
}

/// Everything the tables are computed from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterceptSpec {
    pub intercepts: Vec<Intercept>,
    pub identity: AgentIdentity,
    /// Destinations only the mesh can route: the agent's own traffic to them stays with the mesh.
    pub mesh_dial_subnets: Vec<IpNet>,
    /// The pod's addresses (status.podIPs): one table per family present.
    pub pod_addresses: Vec<IpAddr>,
}

/// Which port of an intercept a refusal names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortField {
    ContainerPort,
    AgentPort,
    ProxyPort,
}

impl PortField {
    pub fn name(self) -> &'static str {
        match self {
            PortField::ContainerPort => "containerPort",
            PortField::AgentPort => "agentPort",
            PortField::ProxyPort => "proxyPort",
        }
    }
}

/// An intercept left out of the tables, and why; `index` is its position in the spec.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("intercepts[{index}].{}: {value} is not a port (1-65535)", field.name())]
    PortOutOfRange { index: usize, field: PortField, value: u32 },
    #[error(
        "intercepts[{index}]: {protocol:?} port {container_port} is already intercepted by intercepts[{kept}] \
         (agent port {kept_agent_port}); the first agent port wins"
    )]
    DuplicatePort { index: usize, protocol: Protocol, container_port: u32, kept: usize, kept_agent_port: u32 },
    #[error("intercepts[{index}].proxyPort: {proxy_port} is also an intercepted {protocol:?} container port")]
    ProxyPortIntercepted { index: usize, protocol: Protocol, proxy_port: u32 },
    #[error(
        "intercepts[{index}].proxyPort: {protocol:?} proxy port {proxy_port} is already used by intercepts[{kept}]"
    )]
    DuplicateProxyPort { index: usize, protocol: Protocol, proxy_port: u32, kept: usize },
}

/// Why no table can be computed at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("pod addresses: none (a pod without an address has no namespace to find)")]
    NoPodAddress,
    #[error("intercepts: none accepted")]
    NoIntercept,
}

/// The tables, and what was left out of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Computed {
    /// `ip` then `ip6`, for the families the pod has.
    pub tables: Vec<NftTable>,
    pub refusals: Vec<Refusal>,
}

fn in_range(p: u32) -> bool {
    (1..=65535).contains(&p)
}

/// The intercepts that go into the tables, in spec order, and the refusals.
fn accept(spec: &InterceptSpec) -> (Vec<&Intercept>, Vec<Refusal>) {
    let mut kept: Vec<(usize, &Intercept)> = Vec::new();
    let mut refusals = Vec::new();
    for (index, i) in spec.intercepts.iter().enumerate() {
        let ports = [(PortField::ContainerPort, Some(i.container_port)), (PortField::AgentPort, Some(i.agent_port))];
        let ports = ports.into_iter().chain([(PortField::ProxyPort, i.proxy_port)]);
        if let Some((field, value)) = ports.filter_map(|(f, v)| v.map(|v| (f, v))).find(|(_, v)| !in_range(*v)) {
            refusals.push(Refusal::PortOutOfRange { index, field, value });
            continue;
        }
        let same = |k: &Intercept| k.protocol == i.protocol;
        if let Some((k, first)) = kept.iter().find(|(_, k)| same(k) && k.container_port == i.container_port) {
            refusals.push(Refusal::DuplicatePort {
                index,
                protocol: i.protocol,
                container_port: i.container_port,
                kept: *k,
                kept_agent_port: first.agent_port,
            });
            continue;
        }
        if let Some(p) = i.proxy_port {
            if let Some((k, _)) = kept.iter().find(|(_, k)| same(k) && k.proxy_port == Some(p)) {
                refusals.push(Refusal::DuplicateProxyPort { index, protocol: i.protocol, proxy_port: p, kept: *k });
                continue;
            }
            if spec.intercepts.iter().any(|k| same(k) && k.container_port == p) {
                refusals.push(Refusal::ProxyPortIntercepted { index, protocol: i.protocol, proxy_port: p });
                continue;
            }
        }
        kept.push((index, i));
    }
    (kept.into_iter().map(|(_, i)| i).collect(), refusals)
}

/// The pod namespace's tables for `spec`, exactly as docs/intercept/table.md lays them out.
pub fn tables(spec: &InterceptSpec) -> Result<Computed, SpecError> {
    if spec.pod_addresses.is_empty() {
        return Err(SpecError::NoPodAddress);
    }
    let (kept, refusals) = accept(spec);
    if kept.is_empty() {
        return Err(SpecError::NoIntercept);
    }
    let mut tables = Vec::new();
    for family in [Family::V4, Family::V6] {
        let pod: Vec<IpAddr> = spec.pod_addresses.iter().copied().filter(|a| family.holds(a)).collect();
        if !pod.is_empty() {
            tables.push(family_table(family, spec, &kept, &pod));
        }
    }
    Ok(Computed { tables, refusals })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn holds(self, a: &IpAddr) -> bool {
        matches!((self, a), (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_)))
    }
    fn nft(self) -> NftFamily {
        match self {
            Family::V4 => NftFamily::Ip,
            Family::V6 => NftFamily::Ip6,
        }
    }
    fn daddr(self) -> Selector {
        match self {
            Family::V4 => Selector::IpDaddr,
            Family::V6 => Selector::Ip6Daddr,
        }
    }
    fn addr_type(self) -> NftType {
        match self {
            Family::V4 => NftType::Ipv4Addr,
            Family::V6 => NftType::Ipv6Addr,
        }
    }
    fn loopback(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.1",
            Family::V6 => "::1",
        }
    }
}

fn agent(identity: AgentIdentity) -> NftMatch {
    match identity {
        AgentIdentity::Group(g) => eq(Selector::MetaSkgid, id(g)),
        AgentIdentity::User(u) => eq(Selector::MetaSkuid, id(u)),
        AgentIdentity::Mark(m) => eq(Selector::MetaMark, mark(m)),
    }
}

fn not_agent(identity: AgentIdentity) -> NftMatch {
    match identity {
        AgentIdentity::Group(g) => ne(Selector::MetaSkgid, id(g)),
        AgentIdentity::User(u) => ne(Selector::MetaSkuid, id(u)),
        AgentIdentity::Mark(m) => ne(Selector::MetaMark, mark(m)),
    }
}

/// `meta l4proto { tcp, udp } redirect to :meta l4proto . th dport map @redirect_ports`, after
/// `gates`: nft 1.0.6 takes the port-mapping redirect only after a transport match.
fn redirect(mut gates: Vec<NftMatch>) -> NftRule {
    gates.push(in_literal(Selector::L4proto, vec![proto(L4Proto::Tcp), proto(L4Proto::Udp)]));
    rule(gates, vec![redirect_to_map(&[Selector::L4proto, Selector::ThDport], REDIRECT_PORTS)])
}

fn family_table(family: Family, spec: &InterceptSpec, kept: &[&Intercept], pod: &[IpAddr]) -> NftTable {
    let ports: Vec<_> = kept
        .iter()
        .map(|i| element(vec![proto(i.protocol.l4()), port(i.container_port)], vec![port(i.agent_port)]))
        .collect();
    // Counted per element: `kuportctl trace intercept` shows the connections each port
    // redirected (docs/operations/trace.md).
    let map = NftSet {
        counter: true,
        ..set(REDIRECT_PORTS, &[NftType::InetProto, NftType::InetService], &[NftType::InetService], ports)
    };
    let subnets: Vec<_> = spec
        .mesh_dial_subnets
        .iter()
        .filter(|n| family.holds(&n.addr()))
        .map(|n| member(vec![addr(n.trunc())]))
        .collect();
    let dial = NftSet { interval: true, ..set(MESH_DIAL_SUBNETS, &[family.addr_type()], &[], subnets) };
    let lo = || eq(Selector::Oifname, kuport_proto::build::ifname("lo"));
    let daddr = family.daddr();

    let prerouting = vec![redirect(vec![])];
    let mut output = Vec::new();
    // 1: loopback traffic that is not the agent's (a mesh proxy dialing the application).
    output.push(redirect(vec![lo(), not_agent(spec.identity)]));
    // 2: traffic to the pod's address, whoever sends it.
    for a in pod {
        output.push(redirect(vec![eq(daddr, addr(a))]));
    }
    // 3: the agent's own loopback traffic to anything but localhost (intercept by address).
    output.push(redirect(vec![lo(), ne(daddr, addr(family.loopback())), agent(spec.identity)]));
    // Pass-through: the proxy port on the pod's address is the container port, not redirected.
    for i in kept {
        let Some(proxy) = i.proxy_port else { continue };
        for a in pod {
            let to = nat_to_addr(
                NatKind::Dnat,
                family.nft(),
                &a.to_string(),
                Some(port_range(i.container_port, i.container_port)),
            );
            output.push(rule(vec![eq(daddr, addr(a)), eq(i.protocol.dport(), port(proxy))], vec![to]));
        }
    }
    // The mesh bypass: the agent's own sockets get an identity DNAT, which claims the
    // connection before the mesh's redirect; DNS and the dial subnets stay with the mesh.
    output.push(rule(
        vec![agent(spec.identity), ne(Selector::ThDport, port(DNS_PORT)), not_lookup(&[daddr], MESH_DIAL_SUBNETS)],
        vec![nat_to_selector(NatKind::Dnat, family.nft(), daddr)],
    ));

    let chains = vec![
        base_chain(
            "prerouting",
            ChainType::Nat,
            Hook::Prerouting,
            PREROUTING_PRIORITY,
            ChainPolicy::Accept,
            prerouting,
        ),
        base_chain("output", ChainType::Nat, Hook::Output, OUTPUT_PRIORITY, ChainPolicy::Accept, output),
    ];
    table(family.nft(), TABLE, vec![dial, map], chains)
}
