//! Relays (docs/overlay/relays.md): which pairs of members cannot reach each other directly,
//! which member carries their pod traffic instead, and what that does to each side's peers.
//!
//! Pure: the inputs are the members (with their relay labels) and the reach each member's
//! executor reports of its peers (`Cluster.overlay_observed`). Every replica and every new
//! leader computes the same routes from the same reports.
//!
//! - A pair {A, B} is relayed only when one side reports the other unreachable. When neither
//!   does (unknown is no news) it is direct.
//! - Its relay is the candidate R with the highest [`score`] among those both reach directly
//!   (neither reports R unreachable, so neither A–R nor B–R is relayed itself). Rendezvous
//!   hashing: both sides compute the same R, pairs spread over the relays, and a relay that is
//!   added takes only the pairs that now score highest on it.
//! - With no such R the pair stays on its direct entry and is reported unreachable.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net};
use sha2::{Digest, Sha256};

use super::members::Member;
use super::{KEEPALIVE_SECONDS, overlay_address};

/// A node with this label (any value) is a relay candidate: a control-plane node is usually
/// the one with a public address that every site reaches.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// `true` makes a node a relay candidate, `false` keeps it out (a control-plane node too).
/// Any other value is as if the label were not there. Under NodeRestriction's prefix: a kubelet
/// can set neither it nor the control-plane role on its own Node, so a compromised node cannot
/// make itself a relay of other pairs (docs/overlay/relays.md, "Who may relay").
pub const RELAY_LABEL: &str = "node-restriction.kubernetes.io/kuport-relay";
/// The label relay candidacy came from before: any kubelet may set it on its own Node, so it is
/// ignored (docs/overlay/relays.md).
pub const OLD_RELAY_LABEL: &str = "kuport.wlz.li/relay";

/// The keepalive of the direct entry of a pair that is not direct (relayed, or unreachable):
/// off. The pair's direct path is what failed; keepalives toward it would keep refreshing the
/// stale, unanswered flow on the far side's NAT, so that a port forward there never takes effect
/// (docs/overlay/relays.md, "The keepalive"). The executor's probes test the path instead, in
/// bursts with quiet gaps (docs/overlay/reach.md).
pub const RELAYED_KEEPALIVE_SECONDS: u16 = 0;

/// Whether a Node's labels make it a relay candidate.
pub fn is_candidate(labels: Option<&BTreeMap<String, String>>) -> bool {
    let Some(labels) = labels else { return false };
    match labels.get(RELAY_LABEL).map(String::as_str) {
        Some("true") => true,
        Some("false") => false,
        _ => labels.contains_key(CONTROL_PLANE_LABEL),
    }
}

/// How a member's pod traffic reaches one of its peers.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum PeerRoute {
    /// Over the peer's own entry: neither side reports the other unreachable.
    #[default]
    Direct,
    /// Through this relay's entry; the peer's own entry keeps only its overlay address, the
    /// probe target.
    Via(String),
    /// One side reports the other unreachable and no relay both reach directly: the pair stays
    /// on its direct entry.
    Unreachable,
}

impl fmt::Display for PeerRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerRoute::Direct => f.write_str("direct"),
            PeerRoute::Via(r) => write!(f, "via {r}"),
            PeerRoute::Unreachable => f.write_str("unreachable"),
        }
    }
}

/// An unordered pair of members: its two names in order.
pub type Pair = (String, String);

/// The pair of `a` and `b`, in order.
pub fn pair(a: &str, b: &str) -> Pair {
    if a <= b { (a.to_string(), b.to_string()) } else { (b.to_string(), a.to_string()) }
}

/// The rendezvous score of `relay` for the pair of `a` and `b`: sha256 of the relay's name and
/// the pair's names in order, each ended by a NUL (no Kubernetes name holds one), so the two
/// sides of a pair compute the same.
pub fn score(relay: &str, a: &str, b: &str) -> [u8; 32] {
    let (first, second) = if a <= b { (a, b) } else { (b, a) };
    let mut h = Sha256::new();
    for part in [relay, first, second] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

/// Every pair's route; pairs not listed are direct.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routes {
    /// The pairs that are not direct: relayed, or unreachable.
    pub not_direct: BTreeMap<Pair, PeerRoute>,
}

impl Routes {
    /// How `a`'s pod traffic reaches `b` (the same for `b` to `a`).
    pub fn route(&self, a: &str, b: &str) -> PeerRoute {
        self.not_direct.get(&pair(a, b)).cloned().unwrap_or_default()
    }
}

/// The routes of every pair, given the relay candidates (members) and the [`broken`] pairs.
pub fn decide(relays: &BTreeSet<String>, broken: &BTreeSet<Pair>) -> Routes {
    let mut routes = Routes::default();
    for (a, b) in broken {
        // Reached directly by both: neither reports it unreachable, so A–R and B–R are direct.
        let reached =
            |r: &&String| *r != a && *r != b && !broken.contains(&pair(a, r)) && !broken.contains(&pair(b, r));
        let best = relays.iter().filter(reached).max_by_key(|r| score(r, a, b));
        let route = best.map_or(PeerRoute::Unreachable, |r| PeerRoute::Via(r.clone()));
        routes.not_direct.insert((a.clone(), b.clone()), route);
    }
    routes
}

/// What one peer entry of a member holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// In address order.
    pub allowed_ips: Vec<IpNet>,
    pub keepalive: u16,
    /// The peer's overlay address, which the executor probes through this entry.
    pub probe: Option<Ipv4Addr>,
}

/// The entries of `node`'s peers (every other member), by peer name:
/// - a direct peer's entry holds its pod CIDRs, with the keepalive;
/// - an unreachable peer's entry (no relay both reach) holds its pod CIDRs too, its only path,
///   with no keepalive ([`RELAYED_KEEPALIVE_SECONDS`]);
/// - a relayed peer's entry holds only its overlay address as a /32 (WireGuard's allowed IPs
///   are longest-prefix: probes to it test the direct path while pod traffic goes through the
///   relay), with no keepalive;
/// - a relay's entry also holds the pod CIDRs of every peer relayed through it;
/// - every entry probes its peer's overlay address.
pub fn entries<'a>(node: &str, members: &'a BTreeMap<String, Member>, routes: &Routes) -> BTreeMap<&'a str, Entry> {
    let mut out: BTreeMap<&str, Entry> = BTreeMap::new();
    let mut carried: Vec<(String, &[IpNet])> = Vec::new();
    for (peer, m) in members.iter().filter(|(n, _)| n.as_str() != node) {
        let probe = overlay_address(&m.pod_cidrs);
        let entry = match routes.route(node, peer) {
            PeerRoute::Direct => Entry { allowed_ips: m.pod_cidrs.clone(), keepalive: KEEPALIVE_SECONDS, probe },
            PeerRoute::Unreachable => {
                Entry { allowed_ips: m.pod_cidrs.clone(), keepalive: RELAYED_KEEPALIVE_SECONDS, probe }
            }
            PeerRoute::Via(relay) => {
                carried.push((relay, &m.pod_cidrs));
                let host = probe.map(|a| IpNet::V4(Ipv4Net::from(a)));
                Entry { allowed_ips: host.into_iter().collect(), keepalive: RELAYED_KEEPALIVE_SECONDS, probe }
            }
        };
        out.insert(peer.as_str(), entry);
    }
    for (relay, cidrs) in carried {
        if let Some(e) = out.get_mut(relay.as_str()) {
            e.allowed_ips.extend_from_slice(cidrs);
        }
    }
    for e in out.values_mut() {
        e.allowed_ips.sort();
        e.allowed_ips.dedup();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> BTreeSet<String> {
        n.iter().map(|s| (*s).to_string()).collect()
    }

    fn pairs(p: &[(&str, &str)]) -> BTreeSet<Pair> {
        p.iter().map(|(a, b)| pair(a, b)).collect()
    }

    fn via(r: &str) -> PeerRoute {
        PeerRoute::Via(r.into())
    }

    #[test]
    fn candidates_are_control_plane_or_relay_true_and_relay_false_keeps_out() {
        let labels = |l: &[(&str, &str)]| -> BTreeMap<String, String> {
            l.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect()
        };
        assert!(!is_candidate(None));
        assert!(!is_candidate(Some(&labels(&[]))));
        assert!(is_candidate(Some(&labels(&[(CONTROL_PLANE_LABEL, "")]))), "any value");
        assert!(is_candidate(Some(&labels(&[(CONTROL_PLANE_LABEL, "true")]))));
        assert!(is_candidate(Some(&labels(&[(RELAY_LABEL, "true")]))));
        assert!(!is_candidate(Some(&labels(&[(CONTROL_PLANE_LABEL, ""), (RELAY_LABEL, "false")]))));
        assert!(!is_candidate(Some(&labels(&[(RELAY_LABEL, "yes")]))), "neither true nor false: no label");
        assert!(is_candidate(Some(&labels(&[(CONTROL_PLANE_LABEL, ""), (RELAY_LABEL, "maybe")]))));
    }

    #[test]
    fn both_sides_score_alike_and_the_score_depends_on_every_name() {
        assert_eq!(score("r", "a", "b"), score("r", "b", "a"));
        assert_ne!(score("r", "a", "b"), score("s", "a", "b"));
        assert_ne!(score("r", "a", "b"), score("r", "a", "c"));
        // The separator: "ab" + "c" is not "a" + "bc".
        assert_ne!(score("r", "ab", "c"), score("r", "a", "bc"));
        let routes = decide(&names(&["r1", "r2", "r3"]), &pairs(&[("a", "b")]));
        assert_eq!(routes.route("a", "b"), routes.route("b", "a"));
        assert!(matches!(routes.route("a", "b"), PeerRoute::Via(_)));
    }

    /// 20 homes that reach no other home: 190 pairs over three relays, then a fourth.
    #[test]
    fn pairs_spread_over_relays_and_a_new_relay_moves_only_the_pairs_that_now_hash_to_it() {
        let homes: Vec<String> = (0..20).map(|i| format!("home-{i:02}")).collect();
        let mut broken = BTreeSet::new();
        for (i, a) in homes.iter().enumerate() {
            for b in &homes[i + 1..] {
                broken.insert(pair(a, b));
            }
        }
        let three = decide(&names(&["r1", "r2", "r3"]), &broken);
        let four = decide(&names(&["r1", "r2", "r3", "r4"]), &broken);
        let mut load: BTreeMap<String, usize> = BTreeMap::new();
        for route in three.not_direct.values() {
            let PeerRoute::Via(r) = route else { panic!("{route}") };
            *load.entry(r.clone()).or_default() += 1;
        }
        assert_eq!(load.len(), 3, "every relay carries pairs: {load:?}");
        assert!(load.values().all(|n| *n > 30), "spread: {load:?}");
        let mut moved = 0;
        for (p, before) in &three.not_direct {
            let after = &four.not_direct[p];
            if after != before {
                assert_eq!(*after, via("r4"), "{p:?} moved from {before} to {after}, not to the new relay");
                moved += 1;
            }
        }
        // About a quarter: the pairs whose highest score is now r4's.
        assert!((20..=90).contains(&moved), "{moved} of 190 moved");
        // A relay removed: only its pairs move.
        let without_r2 = decide(&names(&["r1", "r3"]), &broken);
        for (p, before) in &three.not_direct {
            if *before != via("r2") {
                assert_eq!(&without_r2.not_direct[p], before, "{p:?}");
            }
        }
    }

    #[test]
    fn a_relay_that_one_side_cannot_reach_is_not_chosen() {
        let relays = names(&["r1", "r2"]);
        let winner = match decide(&relays, &pairs(&[("a", "b")])).route("a", "b") {
            PeerRoute::Via(r) => r,
            other => panic!("{other}"),
        };
        let other = if winner == "r1" { "r2" } else { "r1" };
        // a reports the winner unreachable (or the winner reports a: the same pair).
        for cut in [("a", winner.as_str()), (winner.as_str(), "b")] {
            let routes = decide(&relays, &pairs(&[("a", "b"), cut]));
            assert_eq!(routes.route("a", "b"), via(other), "{cut:?}");
            // The cut pair itself goes through the other relay.
            assert_eq!(routes.route(cut.0, cut.1), via(other));
        }
    }

    #[test]
    fn no_common_relay_leaves_the_pair_unreachable_and_a_pair_is_never_its_own_relay() {
        // The only relay is cut from b.
        let routes = decide(&names(&["r"]), &pairs(&[("a", "b"), ("b", "r")]));
        assert_eq!(routes.route("a", "b"), PeerRoute::Unreachable);
        assert_eq!(routes.route("b", "r"), PeerRoute::Unreachable);
        assert_eq!(routes.route("a", "r"), PeerRoute::Direct);
        // No relays at all; a relay as one side of the pair.
        assert_eq!(decide(&BTreeSet::new(), &pairs(&[("a", "b")])).route("a", "b"), PeerRoute::Unreachable);
        assert_eq!(decide(&names(&["a"]), &pairs(&[("a", "b")])).route("b", "a"), PeerRoute::Unreachable);
    }

    #[test]
    fn a_pair_goes_back_to_direct_when_neither_side_reports_it_unreachable() {
        let relays = names(&["r"]);
        assert_eq!(decide(&relays, &pairs(&[("a", "b")])).route("a", "b"), via("r"));
        let routes = decide(&relays, &BTreeSet::new());
        assert_eq!(routes.route("a", "b"), PeerRoute::Direct);
        assert!(routes.not_direct.is_empty());
    }

    fn member(key: &str, cidrs: &[&str]) -> Member {
        Member {
            public_key: key.into(),
            pod_cidrs: cidrs.iter().map(|c| c.parse().expect("cidr")).collect(),
            endpoint: None,
            relay: false,
        }
    }

    #[test]
    fn a_relayed_pair_keeps_the_peers_overlay_address_on_its_entry_and_the_relay_takes_its_pod_cidrs() {
        let members = BTreeMap::from([
            ("a".to_string(), member("A", &["10.42.1.0/24"])),
            ("b".to_string(), member("B", &["10.42.2.0/24", "fd00:42:2::/64"])),
            ("r".to_string(), Member { relay: true, ..member("R", &["10.42.0.0/24"]) }),
        ]);
        let routes = decide(&names(&["r"]), &pairs(&[("a", "b")]));
        let net = |c: &str| c.parse::<IpNet>().expect("cidr");
        let on_a = entries("a", &members, &routes);
        assert_eq!(on_a["b"].allowed_ips, [net("10.42.2.0/32")]);
        assert_eq!((on_a["b"].keepalive, on_a["b"].probe), (0, Some(Ipv4Addr::new(10, 42, 2, 0))));
        assert_eq!(on_a["r"].allowed_ips, [net("10.42.0.0/24"), net("10.42.2.0/24"), net("fd00:42:2::/64")]);
        assert_eq!((on_a["r"].keepalive, on_a["r"].probe), (25, Some(Ipv4Addr::new(10, 42, 0, 0))));
        let on_b = entries("b", &members, &routes);
        assert_eq!(on_b["a"].allowed_ips, [net("10.42.1.0/32")]);
        assert_eq!(on_b["r"].allowed_ips, [net("10.42.0.0/24"), net("10.42.1.0/24")]);
        // The relay itself peers with both directly.
        let on_r = entries("r", &members, &routes);
        assert_eq!(on_r["a"].allowed_ips, [net("10.42.1.0/24")]);
        assert_eq!(on_r["b"].allowed_ips, [net("10.42.2.0/24"), net("fd00:42:2::/64")]);
        assert!(on_r.values().all(|e| e.keepalive == 25));
        // Unreachable: the direct entry keeps the pod CIDRs, without the keepalive.
        let routes = decide(&BTreeSet::new(), &pairs(&[("a", "b")]));
        let b = &entries("a", &members, &routes)["b"];
        assert_eq!(b.allowed_ips, [net("10.42.2.0/24"), net("fd00:42:2::/64")]);
        assert_eq!((b.keepalive, b.probe), (0, Some(Ipv4Addr::new(10, 42, 2, 0))));
    }
}
