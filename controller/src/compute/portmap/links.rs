//! VXLAN links between node pairs: slots, and every number derived from a slot
//! (docs/portmap/links.md).
//!
//! A slot is claimed in the class's status the first time a pair needs a link and never changes
//! while the pair uses it. A link's slot is a slot of both its nodes, drawn from the node-scoped
//! allocator ([`numbers`]), which makes its mark and routing table unique on each node; its VNI,
//! /31 and /127 are checked unique per node here.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use sha2::{Digest, Sha256};

use super::status::reason;
use crate::api::{LinkSlot, PortMapClass, PortMapClassStatus};
use crate::compute::numbers::{self, MAX_SLOT, Numbers, Runs, Slot};
use crate::observe::index::View;

/// Bytes VXLAN adds: outer IPv4 20, UDP 8, VXLAN 8, inner Ethernet 14.
pub const VXLAN_OVERHEAD: u32 = 50;
/// The outer header's TTL.
pub const VXLAN_TTL: u32 = 64;
/// The highest VNI (24 bits).
pub const MAX_VNI: u32 = 0x00ff_ffff;
/// An unused pair keeps its slot this long, so a pod moving back finds the same numbers.
pub const RELEASE_AFTER_SECONDS: i64 = 24 * 60 * 60;
/// Where the steering's IPv6 stand-ins live (docs/portmap/firewall.md): no link may end there.
const STAND_IN_NET6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfd6b, 0x7570, 0, 0, 0, 0, 0, 0), 96);

/// A class's link settings, checked.
#[derive(Clone, Debug)]
pub struct ClassVxlan {
    pub vni: u32,
    pub port: u16,
    pub subnet: Ipv4Net,
    pub subnet6: Ipv6Net,
}

/// Checks a class's spec.returnPath.vxlan. The error is (reason, message).
pub fn class_vxlan(class: &PortMapClass, _view: &View) -> Result<ClassVxlan, (&'static str, String)> {
    let v = &class.spec.return_path.vxlan;
    let subnet: Ipv4Net = v.subnet.parse().map_err(|_| {
        (reason::INVALID_SUBNET, format!("spec.returnPath.vxlan.subnet: {:?} is not an IPv4 prefix", v.subnet))
    })?;
    if subnet.prefix_len() > 30 {
        return Err((
            reason::INVALID_SUBNET,
            format!("spec.returnPath.vxlan.subnet: {subnet} has no room for a /31 besides slot 0, which is never used"),
        ));
    }
    // A link end inside the stand-ins' network could hold another address's stand-in
    // (docs/portmap/firewall.md).
    let [a, b, c] = super::steer::STAND_IN_NET;
    let stand_ins = Ipv4Net::new(std::net::Ipv4Addr::new(a, b, c, 0), 24).unwrap_or_default();
    if subnet.contains(&stand_ins.network()) || stand_ins.contains(&subnet.network()) {
        return Err((
            reason::INVALID_SUBNET,
            format!(
                "spec.returnPath.vxlan.subnet: {subnet} overlaps {stand_ins}, where kuport's steering takes its stand-ins"
            ),
        ));
    }
    let subnet6 = class_subnet6(&v.subnet6, subnet)?;
    if v.port == 0 {
        return Err((reason::VXLAN_PORT_CONFLICT, "spec.returnPath.vxlan.port: 0 is not a UDP port".into()));
    }
    // A node that reports this port for its CNI's VXLAN device loses only its own links
    // (`super::vxlan_port_clash`): what one node reports bounds only that node.
    if v.vni == 0 || v.vni > MAX_VNI {
        return Err((
            reason::INVALID_VNI,
            format!("spec.returnPath.vxlan.vni: {} is not between 1 and {MAX_VNI}", v.vni),
        ));
    }
    Ok(ClassVxlan {
        vni: v.vni,
        port: v.port,
        subnet: Ipv4Net::new(subnet.network(), subnet.prefix_len()).unwrap_or(subnet),
        subnet6,
    })
}

/// Checks spec.returnPath.vxlan.subnet6 against its IPv4 `subnet`: an IPv6 prefix with a /127
/// for every /31 (the same slot indexes both), outside the IPv6 stand-ins' network.
fn class_subnet6(text: &str, subnet: Ipv4Net) -> Result<Ipv6Net, (&'static str, String)> {
    let field = "spec.returnPath.vxlan.subnet6";
    let subnet6: Ipv6Net =
        text.parse().map_err(|_| (reason::INVALID_SUBNET, format!("{field}: {text:?} is not an IPv6 prefix")))?;
    let subnet6 = subnet6.trunc();
    let (p4, p6) = (u32::from(subnet.prefix_len()), u32::from(subnet6.prefix_len()));
    if 128 - p6 < 32 - p4 {
        return Err((
            reason::INVALID_SUBNET,
            format!(
                "{field}: {subnet6} has fewer /127s than spec.returnPath.vxlan.subnet {subnet} has /31s (a prefix length of at most {} is needed)",
                96 + p4
            ),
        ));
    }
    if subnet6.contains(&STAND_IN_NET6.network()) || STAND_IN_NET6.contains(&subnet6.network()) {
        return Err((
            reason::INVALID_SUBNET,
            format!("{field}: {subnet6} overlaps {STAND_IN_NET6}, where kuport's steering takes its IPv6 stand-ins"),
        ));
    }
    Ok(subnet6)
}

/// A link: one class, one node pair (sorted).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkKey {
    pub class: String,
    pub pair: (String, String),
}

impl LinkKey {
    pub fn new(class: &str, a: &str, b: &str) -> Self {
        let pair = if a <= b { (a.to_string(), b.to_string()) } else { (b.to_string(), a.to_string()) };
        LinkKey { class: class.to_string(), pair }
    }

    pub fn peer_of(&self, node: &str) -> &str {
        if self.pair.0 == node { &self.pair.1 } else { &self.pair.0 }
    }
}

/// The numbers of one link, the same at both ends.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LinkNumbers {
    pub slot: u32,
    pub vni: u32,
    pub port: u16,
    /// The pair's /31; the first node of the pair takes the lower address.
    pub net: Ipv4Net,
    /// The pair's /127, at the same slot and taken the same way.
    pub net6: Ipv6Net,
}

impl LinkNumbers {
    pub fn mark(&self) -> u32 {
        Slot(self.slot).mark()
    }

    pub fn table(&self) -> u32 {
        Slot(self.slot).table()
    }

    /// The link address of `node` on link `key`.
    pub fn address_of(&self, key: &LinkKey, node: &str) -> Ipv4Addr {
        let low = self.net.network();
        if key.pair.0 == node { low } else { Ipv4Addr::from(u32::from(low) + 1) }
    }

    /// The IPv6 link address of `node` on link `key`.
    pub fn address6_of(&self, key: &LinkKey, node: &str) -> Ipv6Addr {
        let low = self.net6.network();
        if key.pair.0 == node { low } else { Ipv6Addr::from(u128::from(low) + 1) }
    }
}

/// The /127 of `slot` in `subnet6`: its network plus twice the slot, as the /31 in the IPv4
/// subnet. None past the subnet's end.
pub fn slot_net6(subnet6: Ipv6Net, slot: u32) -> Option<Ipv6Net> {
    let low = u128::from(subnet6.network()).checked_add(2 * u128::from(slot))?;
    let net = Ipv6Net::new(Ipv6Addr::from(low), 127).ok()?;
    subnet6.contains(&net).then_some(net)
}

/// The device name of a link on one node: kup- and 8 hex digits of sha256 over the class and
/// the peer, so two classes over one node pair never collide.
pub fn device_name(class: &str, peer: &str) -> String {
    let digest = Sha256::digest(format!("{class}/{peer}").as_bytes());
    format!("kup-{}", &hex::encode(digest)[..8])
}

/// The MAC of `node`'s end of its link of `class` to `peer`: six bytes of sha256 over the
/// class and the ordered pair, first octet made locally administered unicast. Both ends compute
/// both MACs from names alone, so a rebuilt device gets its old MAC back and the peer's
/// permanent neighbour entry stays right (docs/portmap/links.md).
pub fn link_mac(class: &str, node: &str, peer: &str) -> [u8; 6] {
    let digest = Sha256::digest(format!("mac/{class}/{node}/{peer}").as_bytes());
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&digest[..6]);
    // Locally administered (0x02 set), unicast (0x01 clear).
    mac[0] = (mac[0] & !0x01) | 0x02;
    mac
}

/// A MAC as `ip` prints it: `02:6b:...`.
pub fn mac_text(mac: [u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// The slot claims after this pass.
#[derive(Debug, Default)]
pub struct Allocation {
    /// Numbers for every link that is needed now, or why it cannot be built.
    pub needed: BTreeMap<LinkKey, Result<LinkNumbers, (&'static str, String)>>,
    /// Each class's status rows: links in use, and unused ones still held.
    pub rows: BTreeMap<String, Vec<LinkSlot>>,
}

/// The VNIs, /31s and /127s one node's links already use, across classes (their slots are in
/// the node's [`Numbers`]).
#[derive(Default)]
struct NodeUse {
    vnis: BTreeSet<u32>,
    /// The /31s (and /32s) in use, by their /31's network address: a candidate /31 overlaps
    /// one of them exactly when the address is the same.
    nets31: BTreeSet<u32>,
    /// Wider subnets (only from hand-edited status rows): checked one by one.
    wider: Vec<Ipv4Net>,
    /// The same for the /127s.
    nets127: BTreeSet<u128>,
    wider6: Vec<Ipv6Net>,
}

impl NodeUse {
    fn add_net(&mut self, net: Ipv4Net, net6: Ipv6Net) {
        if net.prefix_len() >= 31 {
            self.nets31.insert(u32::from(net.network()) & !1);
        } else {
            self.wider.push(net);
        }
        if net6.prefix_len() >= 127 {
            self.nets127.insert(u128::from(net6.network()) & !1);
        } else {
            self.wider6.push(net6);
        }
    }

    fn net_free(&self, net: &Ipv4Net, net6: &Ipv6Net) -> bool {
        !self.nets31.contains(&u32::from(net.network()))
            && !self.wider.iter().any(|n| n.contains(net) || net.contains(n))
            && !self.nets127.contains(&u128::from(net6.network()))
            && !self.wider6.iter().any(|n| n.contains(net6) || net6.contains(n))
    }
}

/// When the first unused link of `classes` (as computed) is released by the clock alone: the
/// compute's result holds until then (`compute::by_change`).
pub fn horizon(classes: &BTreeMap<String, PortMapClassStatus>) -> Option<Timestamp> {
    classes
        .values()
        .flat_map(|c| &c.links)
        .filter_map(|row| row.unused_since.as_ref())
        .filter_map(|t| Timestamp::from_second(t.0.as_second().saturating_add(RELEASE_AFTER_SECONDS)).ok())
        .min()
}

/// Keeps existing claims, releases those unused for a day (at once when a node of the pair is
/// no Node: `is_node`), and claims slots for new links, taking each link's slot on both its
/// nodes in `numbers`.
pub fn allocate(
    is_node: &dyn Fn(&str) -> bool,
    classes: &BTreeMap<String, &PortMapClass>,
    vxlan: &BTreeMap<String, Result<ClassVxlan, (&'static str, String)>>,
    needed: &BTreeSet<LinkKey>,
    now: Timestamp,
    numbers: &mut Numbers,
) -> Allocation {
    let mut alloc = Allocation::default();
    let mut per_node: BTreeMap<String, NodeUse> = BTreeMap::new();
    let mut class_slots: BTreeMap<String, Runs> = BTreeMap::new();
    let mut existing: BTreeMap<LinkKey, LinkNumbers> = BTreeMap::new();

    for (name, class) in classes {
        let mut rows: Vec<&LinkSlot> = class.status.iter().flat_map(|s| &s.links).collect();
        rows.sort_by_key(|r| r.slot);
        for row in rows {
            let [a, b] = row.pair.as_slice() else { continue };
            let key = LinkKey::new(name, a, b);
            let Ok(net) = row.subnet.parse::<Ipv4Net>() else { continue };
            if existing.contains_key(&key) || row.slot == 0 {
                continue;
            }
            // A row written before dual-stack has no /127: its slot's, in the class's subnet6
            // (the checked one, else the spec's text).
            let subnet6 = vxlan
                .get(name)
                .and_then(|v| v.as_ref().ok())
                .map(|v| v.subnet6)
                .or_else(|| class.spec.return_path.vxlan.subnet6.parse::<Ipv6Net>().ok().map(|n| n.trunc()));
            let net6 = if row.subnet6.is_empty() {
                subnet6.and_then(|s| slot_net6(s, row.slot))
            } else {
                row.subnet6.parse::<Ipv6Net>().ok()
            };
            let Some(net6) = net6 else { continue };
            let unused_since = if needed.contains(&key) {
                None
            } else if !is_node(a) || !is_node(b) {
                // A name that is no Node holds no slot (a forged or deleted node).
                continue;
            } else {
                let since = row.unused_since.as_ref().map(|t| t.0).unwrap_or(now);
                if now.as_second() - since.as_second() >= RELEASE_AFTER_SECONDS {
                    continue;
                }
                Some(Time(since))
            };
            let base = vxlan
                .get(name)
                .and_then(|v| v.as_ref().ok())
                .map(|v| v.vni)
                .unwrap_or(class.spec.return_path.vxlan.vni);
            let link = LinkNumbers {
                slot: row.slot,
                vni: base.saturating_add(row.slot),
                port: class.spec.return_path.vxlan.port,
                net,
                net6,
            };
            record(&mut per_node, numbers, &mut class_slots, &key, &link);
            alloc.rows.entry(name.clone()).or_default().push(LinkSlot {
                pair: vec![key.pair.0.clone(), key.pair.1.clone()],
                slot: row.slot,
                subnet: net.to_string(),
                subnet6: net6.to_string(),
                unused_since,
            });
            existing.insert(key, link);
        }
    }

    for key in needed {
        if let Some(n) = existing.get(key) {
            alloc.needed.insert(key.clone(), Ok(n.clone()));
            continue;
        }
        let result = match vxlan.get(&key.class) {
            None => Err((reason::RETURN_PATH_UNAVAILABLE, format!("PortMapClass {:?} does not exist", key.class))),
            Some(Err(e)) => Err(e.clone()),
            Some(Ok(v)) => claim(key, v, &per_node, numbers, class_slots.get(&key.class)).ok_or_else(|| {
                (
                    reason::SUBNET_EXHAUSTED,
                    format!(
                        "PortMapClass {:?} spec.returnPath.vxlan.subnet {} has no free /31 for {} and {}",
                        key.class, v.subnet, key.pair.0, key.pair.1
                    ),
                )
            }),
        };
        if let Ok(n) = &result {
            record(&mut per_node, numbers, &mut class_slots, key, n);
            alloc.rows.entry(key.class.clone()).or_default().push(LinkSlot {
                pair: vec![key.pair.0.clone(), key.pair.1.clone()],
                slot: n.slot,
                subnet: n.net.to_string(),
                subnet6: n.net6.to_string(),
                unused_since: None,
            });
        }
        alloc.needed.insert(key.clone(), result);
    }
    for rows in alloc.rows.values_mut() {
        rows.sort_by(|a, b| (a.slot, &a.pair).cmp(&(b.slot, &b.pair)));
    }
    alloc
}

fn record(
    per_node: &mut BTreeMap<String, NodeUse>,
    numbers: &mut Numbers,
    class_slots: &mut BTreeMap<String, Runs>,
    key: &LinkKey,
    n: &LinkNumbers,
) {
    for node in [&key.pair.0, &key.pair.1] {
        numbers.take(node, Slot(n.slot));
        let u = per_node.entry(node.clone()).or_default();
        u.vnis.insert(n.vni);
        u.add_net(n.net, n.net6);
    }
    class_slots.entry(key.class.clone()).or_default().insert(n.slot);
}

/// The lowest slot that collides with nothing on either node or in the class.
fn claim(
    key: &LinkKey,
    v: &ClassVxlan,
    per_node: &BTreeMap<String, NodeUse>,
    numbers: &Numbers,
    taken: Option<&Runs>,
) -> Option<LinkNumbers> {
    let capacity = 1u64 << (31 - u32::from(v.subnet.prefix_len()));
    let last = u32::try_from(capacity - 1).unwrap_or(u32::MAX).min(MAX_SLOT);
    let empty = NodeUse::default();
    let no_runs = Runs::default();
    let a = per_node.get(&key.pair.0).unwrap_or(&empty);
    let b = per_node.get(&key.pair.1).unwrap_or(&empty);
    let taken = taken.unwrap_or(&no_runs);
    let nodes = [numbers.on(&key.pair.0), numbers.on(&key.pair.1)];
    let mut slot = 1;
    loop {
        // Skip to a slot free in the class and on both nodes; repeat until none moves it.
        let next = numbers::next_free(&nodes, taken.next_free(slot));
        if next != slot {
            slot = next;
            continue;
        }
        if slot > last {
            return None;
        }
        let vni = v.vni.checked_add(slot).filter(|x| *x <= MAX_VNI)?;
        let low = u32::from(v.subnet.network()).checked_add(2 * slot)?;
        let net = Ipv4Net::new(Ipv4Addr::from(low), 31).ok()?;
        // The class check leaves a /127 for every /31.
        let net6 = slot_net6(v.subnet6, slot)?;
        let free = [a, b].iter().all(|u| !u.vnis.contains(&vni) && u.net_free(&net, &net6));
        if free {
            return Some(LinkNumbers { slot, vni, port: v.port, net, net6 });
        }
        slot += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn both_ends_compute_the_same_locally_administered_macs_distinct_per_pair() {
        let nodes = ["edge-a", "worker-1", "worker-2", "worker-3"];
        let mut seen = BTreeSet::new();
        for class in ["public", "intranet"] {
            for a in nodes {
                for b in nodes.iter().filter(|b| **b != a) {
                    let mac = link_mac(class, a, b);
                    // Locally administered, unicast.
                    assert_eq!(mac[0] & 0x03, 0x02, "{class} {a} {b}: {}", mac_text(mac));
                    // Deterministic: what a's end holds is what b's neighbour entry names.
                    assert_eq!(mac, link_mac(class, a, b));
                    assert_ne!(mac, link_mac(class, b, a), "{class} {a} {b}: both ends share a MAC");
                    assert!(seen.insert(mac), "{class} {a} {b}: {} used twice", mac_text(mac));
                }
            }
        }
        assert_eq!(seen.len(), 2 * 4 * 3);
        assert_eq!(mac_text([2, 0x6b, 0, 0xa, 0xff, 1]), "02:6b:00:0a:ff:01");
    }
}
