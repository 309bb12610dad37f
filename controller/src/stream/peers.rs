//! The executors' peer reports (docs/overlay/status.md): what each node's WireGuard holds of
//! its peers, checked and moved to the controller's clock as they arrive, and the little of it
//! that changes a computed state (which peers are silent, where live ones' packets come from,
//! which are reachable directly).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kuport_proto::v1::{PeerReport, PeerStatus, Reach};

use crate::compute::overlay::members;
use crate::observe::facts;
use crate::observe::{ObservedPeer, SeenPeers};

/// Peers per report: twice the 5,000 nodes kuport is sized for. At about 100 bytes a peer the
/// largest report is 1 MB, within the 4 MiB an executor may send (docs/security.md).
pub const MAX_PEERS: usize = 10_000;

/// One node's latest report, checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reported {
    /// As reported, by public key, with handshakes on the controller's clock (Debug, metrics).
    pub statuses: Vec<PeerStatus>,
    /// What the endpoint choice reads, by public key; shared with every compute that reads it.
    pub observed: Arc<SeenPeers>,
    /// Bytes the node relayed between two of its peers (its relay rule's counter, as reported;
    /// docs/overlay/relays.md): metrics only, never a recompute.
    pub relayed_bytes: u64,
}

/// What of a report a computed state depends on, per peer key: silent, or live and where
/// WireGuard sends to it; and whether the direct path works (its reach: an unreachable peer makes
/// the pair relayed, docs/overlay/relays.md). A report that changes only bytes or handshake
/// times leaves it alone and recomputes nothing.
pub type Digest = BTreeMap<String, (bool, Option<SocketAddr>, Reach)>;

/// Checks `report` (received at `now`): at most [`MAX_PEERS`], keys of 32 bytes of base64 each
/// once, endpoints that parse. Handshakes move to the controller's clock by the difference of
/// the two clocks at the read, so an executor's clock need not agree with the controller's.
/// Err: why it is refused whole (the previous report stays in use).
pub fn check(report: &PeerReport, now: Timestamp) -> Result<Reported, String> {
    if report.peers.len() > MAX_PEERS {
        return Err(format!("{} peers: at most {MAX_PEERS}", report.peers.len()));
    }
    let now_s = now.as_second();
    let offset = match i64::try_from(report.read_unix_seconds) {
        Ok(0) | Err(_) => 0,
        Ok(read) => now_s.saturating_sub(read),
    };
    let mut out = Reported { relayed_bytes: report.relayed_bytes, ..Reported::default() };
    let mut observed = SeenPeers::new();
    for (i, p) in report.peers.iter().enumerate() {
        facts::wireguard_key(&p.public_key).map_err(|m| format!("peers[{i}].publicKey: {m}"))?;
        let endpoint = match p.endpoint.as_str() {
            "" => None,
            e => Some(e.parse::<SocketAddr>().map_err(|_| format!("peers[{i}].endpoint: {e:?} is not IP:port"))?),
        };
        let handshake = match i64::try_from(p.last_handshake_unix_seconds) {
            Ok(0) => None,
            // Never in the future: a handshake the executor read cannot be later than now.
            Ok(t) => Some(t.saturating_add(offset).min(now_s).max(0)),
            Err(_) => Some(now_s),
        };
        let last_handshake = handshake.and_then(|t| Timestamp::from_second(t).ok());
        // A value this controller does not know (a newer executor's) is no news: unknown.
        let reach = Reach::try_from(p.reach).unwrap_or(Reach::Unknown);
        if observed.insert(p.public_key.clone(), ObservedPeer { endpoint, last_handshake, reach }).is_some() {
            return Err(format!("peers[{i}].publicKey: {} is listed twice", p.public_key));
        }
        out.statuses.push(PeerStatus {
            last_handshake_unix_seconds: handshake.and_then(|t| u64::try_from(t).ok()).unwrap_or(0),
            ..p.clone()
        });
    }
    out.statuses.sort_by(|a, b| a.public_key.cmp(&b.public_key));
    out.observed = Arc::new(observed);
    Ok(out)
}

/// The [`Digest`] of `observed` at `now`, over the members' keys only.
pub fn digest(observed: &BTreeMap<String, ObservedPeer>, keys: &BTreeSet<String>, now: Timestamp) -> Digest {
    observed
        .iter()
        .filter(|(k, _)| keys.contains(*k))
        .map(|(k, p)| {
            let silent = members::silent(p, now);
            (k.clone(), (silent, if silent { None } else { p.endpoint }, p.reach))
        })
        .collect()
}

/// Whether any peer in `d` is silent and has more than one candidate (its key in `rotating`):
/// the rotation then needs a recompute every period. A silent peer with one candidate gets
/// the same endpoint in every period.
pub fn any_rotating(d: &Digest, rotating: &BTreeSet<String>) -> bool {
    d.iter().any(|(k, (silent, _, _))| *silent && rotating.contains(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "kOzLDlGv6e2AmDVfmJC7dRGCU8vMC9RcrxDBB4Y+uiM=";

    fn status(handshake: u64, endpoint: &str) -> PeerStatus {
        PeerStatus {
            public_key: KEY.into(),
            endpoint: endpoint.into(),
            last_handshake_unix_seconds: handshake,
            receive_bytes: 10,
            transmit_bytes: 20,
            ..Default::default()
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("timestamp")
    }

    #[test]
    fn handshakes_move_to_the_controllers_clock() {
        // The executor's clock is 1000 s behind: its handshake 30 s before its read is 30 s
        // before the controller's now.
        let r =
            PeerReport { peers: vec![status(8_970, "192.0.2.1:51820")], read_unix_seconds: 9_000, relayed_bytes: 77 };
        let c = check(&r, at(10_000)).expect("valid");
        assert_eq!(c.relayed_bytes, 77, "carried for the metrics");
        assert_eq!(c.statuses[0].last_handshake_unix_seconds, 9_970);
        assert_eq!(c.observed[KEY].last_handshake, Some(at(9_970)));
        assert_eq!(c.observed[KEY].endpoint, "192.0.2.1:51820".parse().ok());
        let never =
            check(&PeerReport { peers: vec![status(0, "")], read_unix_seconds: 9_000, relayed_bytes: 0 }, at(10_000));
        assert_eq!(never.expect("valid").observed[KEY], ObservedPeer::default());
    }

    #[test]
    fn a_bad_report_is_refused_naming_the_field() {
        let bad = |p: PeerStatus| {
            check(&PeerReport { peers: vec![p], read_unix_seconds: 0, relayed_bytes: 0 }, at(0)).unwrap_err()
        };
        assert!(bad(PeerStatus { public_key: "short".into(), ..status(0, "") }).starts_with("peers[0].publicKey"));
        assert!(bad(status(0, "host:1")).starts_with("peers[0].endpoint"));
        let twice = PeerReport { peers: vec![status(0, ""), status(0, "")], read_unix_seconds: 0, relayed_bytes: 0 };
        assert!(check(&twice, at(0)).unwrap_err().contains("twice"));
        let many = PeerReport { peers: vec![status(0, ""); MAX_PEERS + 1], read_unix_seconds: 0, relayed_bytes: 0 };
        assert!(check(&many, at(0)).unwrap_err().contains("at most"));
    }

    proptest::proptest! {
        /// Any report is checked without panicking; an accepted one's handshakes are never
        /// later than now.
        #[test]
        fn arbitrary_reports_never_panic(
            peers in proptest::collection::vec(
                (
                    proptest::prop_oneof![proptest::strategy::Just(KEY.to_string()), ".{0,50}"],
                    proptest::prop_oneof![proptest::strategy::Just("192.0.2.1:1".to_string()), ".{0,30}"],
                    proptest::prelude::any::<u64>(),
                    proptest::prelude::any::<u64>(),
                ),
                0..4,
            ),
            read in proptest::prelude::any::<u64>(),
            now in 0i64..4_000_000_000,
        ) {
            let peers = peers
                .into_iter()
                .map(|(public_key, endpoint, last_handshake_unix_seconds, receive_bytes)| PeerStatus {
                    public_key,
                    endpoint,
                    last_handshake_unix_seconds,
                    receive_bytes,
                    transmit_bytes: 0,
                    ..Default::default()
                })
                .collect();
            if let Ok(c) = check(&PeerReport { peers, read_unix_seconds: read, relayed_bytes: 0 }, at(now)) {
                for p in c.observed.values() {
                    proptest::prop_assert!(p.last_handshake.is_none_or(|t| t <= at(now)));
                }
                let _ = digest(&c.observed, &BTreeSet::from([KEY.to_string()]), at(now));
            }
        }
    }

    #[test]
    fn the_digest_changes_with_silence_and_live_endpoints_only() {
        let keys = BTreeSet::from([KEY.to_string()]);
        let of = |handshake: u64, endpoint: &str, rx: u64| {
            let p = PeerStatus { receive_bytes: rx, ..status(handshake, endpoint) };
            let c = check(&PeerReport { peers: vec![p], read_unix_seconds: 1_000, relayed_bytes: 0 }, at(1_000))
                .expect("valid");
            digest(&c.observed, &keys, at(1_000))
        };
        assert_eq!(of(990, "192.0.2.1:1", 1), of(995, "192.0.2.1:1", 99), "bytes and a newer handshake");
        assert_ne!(of(990, "192.0.2.1:1", 1), of(990, "192.0.2.2:1", 1), "a live peer's packets moved");
        assert!(any_rotating(&of(0, "192.0.2.1:1", 1), &keys), "never");
        assert!(any_rotating(&of(1_000 - 180, "192.0.2.1:1", 1), &keys), "180 s ago");
        assert!(!any_rotating(&of(1_000 - 179, "192.0.2.1:1", 1), &keys));
        assert!(!any_rotating(&of(0, "192.0.2.1:1", 1), &BTreeSet::new()), "one candidate: nothing moves");
        assert_eq!(of(0, "192.0.2.1:1", 1), of(0, "192.0.2.9:1", 1), "a silent peer's endpoint is ours");
        assert!(digest(&BTreeMap::from([(KEY.into(), ObservedPeer::default())]), &BTreeSet::new(), at(0)).is_empty());
    }

    /// A change of a peer's reach recomputes (it may relay the pair, docs/overlay/relays.md);
    /// bytes beside the same reach still do not; an unknown value is no news.
    #[test]
    fn the_digest_changes_with_reach() {
        let keys = BTreeSet::from([KEY.to_string()]);
        let of = |reach: i32, rx: u64| {
            let p = PeerStatus { receive_bytes: rx, reach, ..status(990, "192.0.2.1:1") };
            let c = check(&PeerReport { peers: vec![p], read_unix_seconds: 1_000, relayed_bytes: 0 }, at(1_000))
                .expect("valid");
            (c.observed[KEY].reach, digest(&c.observed, &keys, at(1_000)))
        };
        let (direct, unreachable, unknown) = (Reach::Direct as i32, Reach::Unreachable as i32, Reach::Unknown as i32);
        assert_eq!(of(direct, 1).0, Reach::Direct);
        assert_eq!(of(unreachable, 1).0, Reach::Unreachable);
        assert_eq!(of(99, 1).0, Reach::Unknown, "a value from a newer executor");
        assert_ne!(of(direct, 1).1, of(unreachable, 1).1);
        assert_ne!(of(direct, 1).1, of(unknown, 1).1);
        assert_eq!(of(unreachable, 1).1, of(unreachable, 99).1, "bytes alone");
    }
}
