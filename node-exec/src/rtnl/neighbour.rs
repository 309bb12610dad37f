//! Neighbours: permanent entries on kuport's links, one per link and address, resolving the
//! far end of each link to its computed MAC so no ARP stands between a rebuilt link and
//! traffic (docs/portmap/links.md). Only permanent entries on `kup-*` links are kuport's: the
//! kernel's own (resolved by ARP) are replaced when they hold a desired address, never removed.
//! IPv6 entries are the same (NDP instead of ARP), one path for both families.

use netlink_packet_route::neighbour::NeighbourState;

use super::{
    KindPlan,
    diff::{Change, Difference},
    error::Op,
    model::{Desired, NeighbourSpec},
    observe::{Observed, ObservedNeighbour},
    session::Session,
};

/// What making and breaking the neighbour entries takes.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Absent, or present with another MAC or state: written with NLM_F_REPLACE.
    pub replaces: Vec<(NeighbourSpec, Option<String>)>,
    /// kuport's permanent entries the desired state does not name.
    pub dels: Vec<ObservedNeighbour>,
}

impl KindPlan for Plan {
    fn new(desired: &Desired, observed: &Observed) -> Plan {
        let mut plan = Plan::default();
        for n in &desired.neighbours {
            let have = observed.neighbours.iter().find(|o| o.dev == n.dev && o.address == n.address);
            match have {
                None => plan.replaces.push((n.clone(), None)),
                Some(o) => {
                    let mut how = Vec::new();
                    if o.mac.as_deref() != Some(&n.mac.0[..]) {
                        how.push(format!("lladdr {} -> {}", mac_text(o.mac.as_deref()), n.mac));
                    }
                    if !o.permanent {
                        how.push(format!("nud {:?} -> permanent", o.msg.header.state).to_lowercase());
                    }
                    if !how.is_empty() {
                        plan.replaces.push((n.clone(), Some(how.join(", "))));
                    }
                }
            }
        }
        plan.dels = observed
            .neighbours
            .iter()
            .filter(|o| o.permanent)
            .filter(|o| !desired.neighbours.iter().any(|n| n.dev == o.dev && n.address == o.address))
            .cloned()
            .collect();
        plan
    }

    fn missing(&self, out: &mut Vec<Difference>) {
        for (n, how) in &self.replaces {
            let change = match how {
                None => Change::Missing,
                Some(how) => Change::Changed(how.clone()),
            };
            out.push(Difference { object: n.to_string(), change });
        }
    }

    fn extra(&self, out: &mut Vec<Difference>) {
        for o in &self.dels {
            out.push(Difference { object: name(o), change: Change::Extra });
        }
    }

    /// Writes each missing or differing entry as permanent, on the links as last observed.
    fn make(&self, s: &mut Session) {
        for (n, _) in &self.replaces {
            let Some(index) = s.index(n, &n.dev) else { continue };
            let req = s
                .handle()
                .neighbours()
                .add(index, n.address)
                .state(NeighbourState::Permanent)
                .link_layer_address(&n.mac.0)
                .replace()
                .execute();
            s.write(Op::Add, n.to_string(), req);
        }
    }

    /// Deletes kuport's entries no longer desired; false at the first refusal.
    fn brk(&self, s: &mut Session) -> bool {
        for o in &self.dels {
            let req = s.handle().neighbours().del(o.msg.clone()).execute();
            if !s.write(Op::Delete, name(o), req) {
                return false;
            }
        }
        true
    }
}

fn mac_text(mac: Option<&[u8]>) -> String {
    match mac {
        None => "none".into(),
        Some(m) => m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"),
    }
}

fn name(o: &ObservedNeighbour) -> String {
    format!("neighbour {} lladdr {} dev {}", o.address, mac_text(o.mac.as_deref()), o.dev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtnl::model::Mac;
    use netlink_packet_route::neighbour::NeighbourMessage;

    fn observed(mac: [u8; 6], state: NeighbourState) -> ObservedNeighbour {
        let mut msg = NeighbourMessage::default();
        msg.header.state = state;
        ObservedNeighbour {
            index: 2,
            dev: "kup-1".into(),
            address: "169.254.77.3".parse().expect("addr"),
            mac: Some(mac.to_vec()),
            permanent: state == NeighbourState::Permanent,
            msg,
        }
    }

    #[test]
    fn a_learned_or_changed_entry_is_replaced_and_a_stray_permanent_one_removed() {
        let want = NeighbourSpec {
            dev: "kup-1".into(),
            address: "169.254.77.3".parse().expect("addr"),
            mac: Mac([2, 0, 0, 0, 0, 1]),
        };
        let desired = Desired { neighbours: vec![want.clone()], ..Default::default() };
        let same = Observed { neighbours: vec![observed(want.mac.0, NeighbourState::Permanent)], ..Default::default() };
        let p = Plan::new(&desired, &same);
        assert!(p.replaces.is_empty() && p.dels.is_empty(), "{p:?}");

        let learned =
            Observed { neighbours: vec![observed([2, 0, 0, 0, 0, 9], NeighbourState::Stale)], ..Default::default() };
        let mut d = Vec::new();
        Plan::new(&desired, &learned).missing(&mut d);
        assert_eq!(
            d[0].to_string(),
            "changed neighbour 169.254.77.3 lladdr 02:00:00:00:00:01 dev kup-1: \
             lladdr 02:00:00:00:00:09 -> 02:00:00:00:00:01, nud stale -> permanent"
        );

        let p = Plan::new(&Desired::default(), &same);
        assert_eq!(p.dels.len(), 1);
        // A learned entry is the kernel's, never removed.
        assert!(Plan::new(&Desired::default(), &learned).dels.is_empty());
    }
}
