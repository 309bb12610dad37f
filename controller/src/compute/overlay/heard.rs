//! What the mesh's plan reads of the members' peer reports, kept report by report: the
//! endpoints each member's live sessions show for its peers (their [`members::candidates`]),
//! and the pairs one side reports unreachable ([`relays::decide`]). A new report costs its own
//! size, and only the peers whose learned endpoints it changed have their candidates made again
//! (docs/design.md, "Compute by change").

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kuport_proto::v1::Reach;

use super::members::{self, Member, SESSION_LIFE_SECONDS, silent};
use super::relays::{Pair, pair};
use crate::observe::{Cluster, ObservedPeer, SeenPeers};

/// What one member's report tells the plan, read at `at`; it holds until `until`, when the
/// first of its live sessions turns silent. Persistent maps: a new key edits every member's
/// told by one peer, in time that does not grow with the mesh.
#[derive(Clone, Debug, Default, PartialEq)]
struct Told {
    /// Per peer name, the endpoint a live session with it shows (usable, with a port).
    learned: imbl::OrdMap<String, SocketAddr>,
    /// The peers it reports unreachable.
    unreachable: imbl::OrdSet<String>,
    at: i64,
    until: Option<i64>,
}

impl Told {
    /// The peers it tells anything of (some twice).
    fn told_of(&self) -> impl Iterator<Item = &String> {
        self.learned.keys().chain(self.unreachable.iter())
    }

    fn holds(&self, now: i64) -> bool {
        now >= self.at && self.until.is_none_or(|u| now < u)
    }
}

/// What the plan has heard from every member's report, for one set of members.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Heard {
    /// Per reporter, its report as read and what it told.
    told: BTreeMap<String, (Arc<SeenPeers>, Arc<Told>)>,
    /// Per member, per reporter, the endpoint a live session with it shows.
    learned: BTreeMap<String, Arc<BTreeMap<String, SocketAddr>>>,
    /// Per pair, the sides that report the other unreachable.
    broken: BTreeMap<Pair, BTreeSet<String>>,
}

impl Heard {
    /// Hears `cluster`'s reports of `members`, keeping what each report that did not change
    /// told while it holds. Returns the members whose learned endpoints changed. `members`
    /// must be those every earlier call heard with, their keys followed by [`Heard::rekey`] (a
    /// new set of members starts a new Heard).
    pub fn hear(&mut self, cluster: &Cluster, members: &BTreeMap<String, Member>) -> BTreeSet<String> {
        let now = cluster.now.as_second();
        let reports = &cluster.overlay_observed.reports;
        let mut touched = BTreeSet::new();
        let gone: Vec<String> =
            self.told.keys().filter(|r| !members.contains_key(*r) || !reports.contains_key(*r)).cloned().collect();
        for reporter in gone {
            if let Some((_, old)) = self.told.remove(&reporter) {
                let peers: BTreeSet<&String> = old.told_of().collect();
                self.change(&reporter, (&old, &Told::default()), peers, &mut touched);
            }
        }
        let mut by_key: Option<BTreeMap<&str, &str>> = None;
        for (reporter, report) in reports.iter().filter(|(r, _)| members.contains_key(*r)) {
            let kept = self.told.get(reporter).is_some_and(|(was, t)| was == report && t.holds(now));
            if kept {
                continue;
            }
            let by_key = by_key
                .get_or_insert_with(|| members.iter().map(|(n, m)| (m.public_key.as_str(), n.as_str())).collect());
            let new = told(reporter, report, by_key, cluster.now);
            let old = self.told.get(reporter).map(|(_, t)| t.clone()).unwrap_or_default();
            let peers: BTreeSet<&String> = old.told_of().chain(new.told_of()).collect();
            self.change(reporter, (&old, &new), peers, &mut touched);
            self.told.insert(reporter.clone(), (report.clone(), Arc::new(new)));
        }
        touched
    }

    /// Replaces what `reporter` told (`old`) by `new`, noting the peers whose learned
    /// endpoints changed; those told differently of are among `peers` (each once).
    fn change<'a>(
        &mut self,
        reporter: &str,
        (old, new): (&Told, &Told),
        peers: impl IntoIterator<Item = &'a String>,
        touched: &mut BTreeSet<String>,
    ) {
        for peer in peers {
            let after = new.learned.get(peer);
            if old.learned.get(peer) != after {
                let entry = Arc::make_mut(self.learned.entry(peer.clone()).or_default());
                match after {
                    Some(e) => entry.insert(reporter.to_string(), *e),
                    None => entry.remove(reporter),
                };
                if entry.is_empty() {
                    self.learned.remove(peer);
                }
                touched.insert(peer.clone());
            }
            let p = pair(reporter, peer);
            match (old.unreachable.contains(peer), new.unreachable.contains(peer)) {
                (true, false) => {
                    if let Some(sides) = self.broken.get_mut(&p) {
                        sides.remove(reporter);
                        if sides.is_empty() {
                            self.broken.remove(&p);
                        }
                    }
                }
                (false, true) => {
                    self.broken.entry(p).or_default().insert(reporter.to_string());
                }
                _ => {}
            }
        }
    }

    /// Follows the members whose key changed from `old` to `members` (the same names): what
    /// each report told of them is read again from what it says of their new key. A report of
    /// an old key no longer tells anything, so a told's end may come sooner than the earliest of
    /// its sessions: it is then heard again, never later than it should. Returns the members
    /// whose learned endpoints changed.
    pub fn rekey(
        &mut self,
        cluster: &Cluster,
        old: &BTreeMap<String, Member>,
        members: &BTreeMap<String, Member>,
    ) -> BTreeSet<String> {
        let rekeyed: Vec<(&String, &str)> = members
            .iter()
            .filter(|(n, m)| old.get(*n).is_some_and(|o| o.public_key != m.public_key))
            .map(|(n, m)| (n, m.public_key.as_str()))
            .collect();
        let mut touched = BTreeSet::new();
        if rekeyed.is_empty() {
            return touched;
        }
        let reporters: Vec<String> = self.told.keys().cloned().collect();
        for reporter in reporters {
            let Some((report, was)) = self.told.get(&reporter).cloned() else { continue };
            // A copy in constant time: only the rekeyed peers are edited and compared.
            let mut new = Told::clone(&was);
            let peers: Vec<&String> = rekeyed.iter().filter(|(p, _)| **p != reporter).map(|(p, _)| *p).collect();
            for (peer, key) in rekeyed.iter().filter(|(p, _)| **p != reporter) {
                new.learned.remove(*peer);
                new.unreachable.remove(*peer);
                if let Some(p) = report.get(*key) {
                    tell(&mut new, peer, p, cluster.now);
                }
            }
            let same = |p: &&String| {
                was.learned.get(*p) == new.learned.get(*p)
                    && was.unreachable.contains(*p) == new.unreachable.contains(*p)
            };
            if !(peers.iter().all(same) && was.until == new.until) {
                self.change(&reporter, (&was, &new), peers, &mut touched);
                self.told.insert(reporter, (report, Arc::new(new)));
            }
        }
        touched
    }

    /// Per reporter, the endpoint a live session with `member` shows.
    pub fn learned(&self, member: &str) -> Option<&BTreeMap<String, SocketAddr>> {
        self.learned.get(member).map(|l| &**l)
    }

    /// Every pair one side of which reports the other unreachable.
    pub fn broken(&self) -> BTreeSet<Pair> {
        self.broken.keys().cloned().collect()
    }
}

/// What `reporter`'s report tells at `now`; reports of keys that are no member's, or the
/// reporter's own, tell nothing.
fn told(reporter: &str, report: &SeenPeers, by_key: &BTreeMap<&str, &str>, now: Timestamp) -> Told {
    let mut out = Told { at: now.as_second(), ..Told::default() };
    for (key, p) in report.iter() {
        let Some(peer) = by_key.get(key.as_str()).filter(|n| **n != reporter) else { continue };
        tell(&mut out, peer, p, now);
    }
    out
}

/// Adds what a report says of `peer` (`p`) at `now` to `out`.
fn tell(out: &mut Told, peer: &str, p: &ObservedPeer, now: Timestamp) {
    if p.reach == Reach::Unreachable {
        out.unreachable.insert(peer.to_string());
    }
    if silent(p, now) {
        return;
    }
    if let Some(turns) = p.last_handshake.map(|t| t.as_second().saturating_add(SESSION_LIFE_SECONDS)) {
        out.until = Some(out.until.map_or(turns, |u| u.min(turns)));
    }
    if let Some(e) = p.endpoint.filter(|e| members::usable(e.ip()) && e.port() != 0) {
        out.learned.insert(peer.to_string(), e);
    }
}
