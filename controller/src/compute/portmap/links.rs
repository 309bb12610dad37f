//! VXLAN links between node pairs: slots, and every number derived from a slot
//! (docs/portmap/links.md).
//!
//! A slot is claimed in the class's status the first time a pair needs a link and never changes
//! while the pair uses it. A link's slot is a slot of both its nodes, drawn from the node-scoped
//! allocator ([`numbers`]), which makes its mark and routing table unique on each node; its VNI,
//! /31 and /127 are checked unique per node here.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use sha2::{Digest, Sha256};

use super::status::reason;
use crate::api::{LinkSlot, PortMapClass, PortMapClassStatus};
use crate::compute::Shared;
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

/// A class's checked link settings, or why its links cannot be built.
pub type ClassVxlans = BTreeMap<String, Result<ClassVxlan, (&'static str, String)>>;

/// The slot claims after this pass, and what a further claim reads.
#[derive(Clone, Debug, Default)]
pub struct Allocation {
    /// Numbers for every link that is needed now, or why it cannot be built.
    pub needed: Shared<LinkKey, Result<LinkNumbers, (&'static str, String)>>,
    /// Each class's status rows: links in use, and unused ones still held. A change copies
    /// only the rows of the classes it moves.
    pub rows: BTreeMap<String, Arc<Vec<LinkSlot>>>,
    /// Every link a row holds, in use or not.
    held: Shared<LinkKey, LinkNumbers>,
    taken: Taken,
}

/// What the held links take: a claim must collide with none of it.
#[derive(Clone, Debug, Default)]
struct Taken {
    per_node: Shared<String, NodeUse>,
    numbers: Numbers,
    class_slots: Shared<String, Runs>,
}

impl Taken {
    fn record(&mut self, key: &LinkKey, n: &LinkNumbers) {
        for node in [&key.pair.0, &key.pair.1] {
            self.numbers.take(node, Slot(n.slot));
            let u = self.per_node.entry(node.clone()).or_default();
            u.vnis.insert(n.vni);
            u.add_net(n.net, n.net6);
        }
        self.class_slots.entry(key.class.clone()).or_default().insert(n.slot);
    }
}

impl Allocation {
    /// Numbers `key`: its held slot, else a claim (recorded, with a row in use).
    fn need(&mut self, key: &LinkKey, vxlan: &ClassVxlans) {
        if let Some(n) = self.held.get(key) {
            self.needed.insert(key.clone(), Ok(n.clone()));
            return;
        }
        let result = match vxlan.get(&key.class) {
            None => Err((reason::RETURN_PATH_UNAVAILABLE, format!("PortMapClass {:?} does not exist", key.class))),
            Some(Err(e)) => Err(e.clone()),
            Some(Ok(v)) => claim(key, v, &self.taken).ok_or_else(|| {
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
            self.taken.record(key, n);
            Arc::make_mut(self.rows.entry(key.class.clone()).or_default()).push(LinkSlot {
                pair: vec![key.pair.0.clone(), key.pair.1.clone()],
                slot: n.slot,
                subnet: n.net.to_string(),
                subnet6: n.net6.to_string(),
                unused_since: None,
            });
            self.held.insert(key.clone(), n.clone());
        }
        self.needed.insert(key.clone(), result);
    }

    fn row_mut(&mut self, key: &LinkKey) -> Option<&mut LinkSlot> {
        let rows = Arc::make_mut(self.rows.get_mut(&key.class)?);
        rows.iter_mut().find(|r| matches!(r.pair.as_slice(), [a, b] if *a == key.pair.0 && *b == key.pair.1))
    }

    /// This allocation with the links of `came` needed too and those of `went` no longer, as
    /// [`allocate`] makes it from the rows this one made: a link that came takes its held slot
    /// or claims one, in key order after every held link is recorded; a link that went keeps
    /// its slot, unused since `now`. None where the two could differ: some link this one could
    /// not number (allocate tries it again, in key order among the claims), or one that went
    /// ends on a name that is no Node (allocate drops its row).
    pub fn changed(
        &self,
        is_node: &dyn Fn(&str) -> bool,
        vxlan: &ClassVxlans,
        came: &BTreeSet<LinkKey>,
        went: &BTreeSet<LinkKey>,
        now: Timestamp,
    ) -> Option<Allocation> {
        if self.needed.values().any(Result::is_err) {
            return None;
        }
        let mut a = self.clone();
        for key in went {
            if !is_node(&key.pair.0) || !is_node(&key.pair.1) {
                return None;
            }
            a.needed.remove(key)?.ok()?;
            a.row_mut(key)?.unused_since = Some(Time(now));
        }
        for key in came {
            if a.held.contains_key(key) {
                a.row_mut(key)?.unused_since = None;
            }
            a.need(key, vxlan);
        }
        for class in came.iter().map(|k| &k.class).collect::<BTreeSet<_>>() {
            if let Some(rows) = a.rows.get_mut(class) {
                sort_rows(Arc::make_mut(rows).as_mut_slice());
            }
        }
        Some(a)
    }
}

fn sort_rows(rows: &mut [LinkSlot]) {
    rows.sort_by(|a, b| (a.slot, &a.pair).cmp(&(b.slot, &b.pair)));
}

/// The VNIs, /31s and /127s one node's links already use, across classes (their slots are in
/// the node's [`Numbers`]).
#[derive(Clone, Debug, Default)]
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
/// nodes in the allocation's [`Numbers`] (kept, for the claims of a change).
pub fn allocate(
    is_node: &dyn Fn(&str) -> bool,
    classes: &BTreeMap<String, &PortMapClass>,
    vxlan: &ClassVxlans,
    needed: &BTreeSet<LinkKey>,
    now: Timestamp,
) -> Allocation {
    let mut alloc = Allocation::default();

    for (name, class) in classes {
        let mut rows: Vec<&LinkSlot> = class.status.iter().flat_map(|s| &s.links).collect();
        rows.sort_by_key(|r| r.slot);
        for row in rows {
            let [a, b] = row.pair.as_slice() else { continue };
            let key = LinkKey::new(name, a, b);
            let Ok(net) = row.subnet.parse::<Ipv4Net>() else { continue };
            if alloc.held.contains_key(&key) || row.slot == 0 {
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
            alloc.taken.record(&key, &link);
            Arc::make_mut(alloc.rows.entry(name.clone()).or_default()).push(LinkSlot {
                pair: vec![key.pair.0.clone(), key.pair.1.clone()],
                slot: row.slot,
                subnet: net.to_string(),
                subnet6: net6.to_string(),
                unused_since,
            });
            alloc.held.insert(key, link);
        }
    }

    for key in needed {
        alloc.need(key, vxlan);
    }
    for rows in alloc.rows.values_mut() {
        sort_rows(Arc::make_mut(rows).as_mut_slice());
    }
    alloc
}

/// The lowest slot that collides with nothing on either node or in the class.
fn claim(key: &LinkKey, v: &ClassVxlan, t: &Taken) -> Option<LinkNumbers> {
    let (per_node, numbers, taken) = (&t.per_node, &t.numbers, t.class_slots.get(&key.class));
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
    use crate::api::{PortMapClassStatus, ReturnPathMode, ServingMode};
    use crate::compute::testkit::{World, now};

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

    fn key(a: &str, b: &str) -> LinkKey {
        LinkKey::new("public", a, b)
    }

    fn keys(pairs: &[(&str, &str)]) -> BTreeSet<LinkKey> {
        pairs.iter().map(|(a, b)| key(a, b)).collect()
    }

    /// A change's allocation equals the one a whole compute makes from the rows the compute
    /// before made: a link that comes takes the lowest free slot (here a released link's, below
    /// the held ones, so its row is sorted in), one that went keeps its slot unused, and one
    /// needed again takes its held slot.
    #[test]
    fn a_changed_allocation_is_the_one_the_rows_made_give() {
        let class = World::new().class("public", ServingMode::Single, ReturnPathMode::Vxlan, &[]).c.classes[0].clone();
        let v = &class.spec.return_path.vxlan;
        let checked = ClassVxlan {
            vni: v.vni,
            port: v.port,
            subnet: v.subnet.parse().expect("default subnet"),
            subnet6: v.subnet6.parse().expect("default subnet6"),
        };
        let vxlan: ClassVxlans = BTreeMap::from([("public".to_string(), Ok(checked))]);
        let is_node = |_: &str| true;
        let whole = |rows: &[LinkSlot], needed: &BTreeSet<LinkKey>| {
            let mut c = class.clone();
            c.status = Some(PortMapClassStatus { links: rows.to_vec(), ..Default::default() });
            let classes = BTreeMap::from([("public".to_string(), &c)]);
            allocate(&is_node, &classes, &vxlan, needed, now())
        };
        // a-b, a-c and b-c take slots 1, 2 and 3; a-c's row is then released.
        let first = whole(&[], &keys(&[("a", "b"), ("a", "c"), ("b", "c")]));
        let slots: Vec<u32> = first.rows["public"].iter().map(|r| r.slot).collect();
        assert_eq!(slots, [1, 2, 3]);
        let rows: Vec<LinkSlot> = first.rows["public"].iter().filter(|r| r.slot != 2).cloned().collect();
        let base = whole(&rows, &keys(&[("a", "b"), ("b", "c")]));

        // a-d and c-d come, a-b goes.
        let changed = base
            .changed(&is_node, &vxlan, &keys(&[("a", "d"), ("c", "d")]), &keys(&[("a", "b")]), now())
            .expect("numbered");
        let expected = whole(&base.rows["public"], &keys(&[("b", "c"), ("a", "d"), ("c", "d")]));
        assert_eq!(changed.needed, expected.needed);
        assert_eq!(changed.rows, expected.rows);
        assert_eq!(changed.needed[&key("a", "d")].as_ref().map(|n| n.slot), Ok(2));
        assert!(changed.rows["public"].iter().any(|r| r.pair == ["a", "b"] && r.unused_since.is_some()));

        // a-b needed again: its held slot, in use again.
        let again = changed.changed(&is_node, &vxlan, &keys(&[("a", "b")]), &BTreeSet::new(), now()).expect("held");
        let expected = whole(&changed.rows["public"], &keys(&[("a", "b"), ("b", "c"), ("a", "d"), ("c", "d")]));
        assert_eq!(again.needed, expected.needed);
        assert_eq!(again.rows, expected.rows);
        assert_eq!(again.needed[&key("a", "b")].as_ref().map(|n| n.slot), Ok(1));

        // A link that went to a name that is no Node: a whole compute drops its row.
        assert!(again.changed(&|n| n != "d", &vxlan, &BTreeSet::new(), &keys(&[("a", "d")]), now()).is_none());
    }
}
