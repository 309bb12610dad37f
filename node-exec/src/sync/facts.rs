//! What the executor tells the controller about its node: the underlay (the address and MTU
//! other nodes reach it at) and every interface with its IPv4 addresses.

use std::path::Path;

use kuport_proto::v1::{InterfaceFacts, NodeFacts};

use crate::rtnl::{self, ObservedAddress, ObservedLink, ObservedRoute};

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
        .map(|l| {
            let mut addresses: Vec<String> =
                addresses.iter().filter(|a| a.index == l.index).map(|a| a.net.addr().to_string()).collect();
            addresses.sort();
            InterfaceFacts { name: l.name.clone(), mtu: l.mtu, addresses }
        })
        .collect();
    interfaces.sort_by(|a, b| a.name.cmp(&b.name));
    let underlay = underlay.map(str::to_string).or_else(|| {
        routes
            .iter()
            .filter(|r| r.table == rtnl::consts::TABLE_MAIN && r.dst.prefix_len() == 0)
            .min_by_key(|r| r.priority)
            .and_then(|r| r.dev.clone())
    });
    let mut facts = NodeFacts { interfaces, kernel: kernel_release(), ..Default::default() };
    if let Some(name) = underlay
        && let Some(i) = facts.interfaces.iter().find(|i| i.name == name)
    {
        facts.underlay_address = i.addresses.first().cloned().unwrap_or_default();
        facts.underlay_mtu = i.mtu;
        facts.underlay_interface = name;
    }
    facts
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}
