//! Addresses: IPv4 and IPv6 addresses on kuport's links, one per link and prefix.
//!
//! IPv6 addresses are added with IFA_F_NODAD, usable at once (duplicate address detection would
//! hold a rebuilt link's address tentative for a second or more, and its far end is computed,
//! not discovered). The kernel's own IPv6 link-local address (fe80::/10) on a link is never
//! kuport's. A link whose `disable_ipv6` is 1 (new links inherit `default.disable_ipv6`) refuses
//! IPv6 addresses; kuport owns its links, so it sets their `disable_ipv6` to 0 before adding one.

use ipnet::IpNet;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};

use super::{
    KindPlan,
    consts::owns_link,
    diff::{Change, Difference},
    error::{Error, Op},
    model::{AddressSpec, Desired, SysctlSpec},
    observe::{Observed, ObservedAddress},
    session::Session,
};

/// What making and breaking the addresses takes.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub adds: Vec<AddressSpec>,
    /// Addresses on kuport's links the desired state does not name.
    pub dels: Vec<ObservedAddress>,
}

impl KindPlan for Plan {
    fn new(desired: &Desired, observed: &Observed) -> Plan {
        let has = |a: &AddressSpec| observed.addresses.iter().any(|o| o.dev == a.dev && o.net == a.net);
        Plan {
            adds: desired.addresses.iter().filter(|a| !has(a)).cloned().collect(),
            dels: observed
                .addresses
                .iter()
                .filter(|o| owns_link(&o.dev) && !kernel_link_local(&o.net))
                .filter(|o| !desired.addresses.iter().any(|a| a.dev == o.dev && a.net == o.net))
                .cloned()
                .collect(),
        }
    }

    fn missing(&self, out: &mut Vec<Difference>) {
        for a in &self.adds {
            out.push(Difference { object: a.to_string(), change: Change::Missing });
        }
    }

    fn extra(&self, out: &mut Vec<Difference>) {
        for a in &self.dels {
            out.push(Difference { object: name(a), change: Change::Extra });
        }
    }

    /// Adds the missing addresses, on the links as last observed.
    fn make(&self, s: &mut Session) {
        for a in &self.adds {
            let Some(index) = s.index(a, &a.dev) else { continue };
            let mut req = s.handle().address().add(index, a.net.addr(), a.net.prefix_len());
            if let IpNet::V6(_) = a.net {
                if !enable_ipv6(s, a) {
                    continue;
                }
                let msg = req.message_mut();
                msg.header.flags |= AddressHeaderFlags::Nodad;
                msg.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
            s.write(Op::Add, a.to_string(), req.execute());
        }
    }

    /// Deletes the addresses no longer desired; false at the first refusal.
    fn brk(&self, s: &mut Session) -> bool {
        for a in &self.dels {
            let req = s.handle().address().del(a.msg.clone()).execute();
            if !s.write(Op::Delete, name(a), req) {
                return false;
            }
        }
        true
    }
}

/// The link-local address the kernel gives every IPv6 link: never kuport's to remove.
fn kernel_link_local(net: &IpNet) -> bool {
    matches!(net, IpNet::V6(n) if n.addr().is_unicast_link_local())
}

/// Makes sure IPv6 is enabled on the link of `a` (`net.ipv6.conf.<dev>.disable_ipv6` 0)
/// before `a` is added, recording the write when it had to set it; false (the refusal recorded)
/// when it could not. A link without that sysctl has no IPv6 at all (an MTU below 1280, or a
/// kernel without IPv6), which the kernel would only answer with EINVAL: say so instead.
fn enable_ipv6(s: &mut Session, a: &AddressSpec) -> bool {
    // The slash form, so a dot in a link name stays inside its component.
    let spec = SysctlSpec { key: format!("net/ipv6/conf/{}/disable_ipv6", a.dev), value: "0".into() };
    match crate::sysctl::ensure(&spec) {
        Ok(false) => true,
        Ok(true) => s.record(Ok(format!("set {spec} = 0"))),
        Err(Error::Sysctl { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            let reason = format!("link {} has no IPv6 (its MTU is below 1280, or the kernel runs without IPv6)", a.dev);
            s.record(Err(Error::Invalid { object: a.to_string(), reason }))
        }
        Err(e) => s.record(Err(e)),
    }
}

fn name(a: &ObservedAddress) -> String {
    format!("address {} dev {}", a.net, a.dev)
}
