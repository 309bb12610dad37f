//! Reach: whether each peer's direct path works (docs/overlay/reach.md).
//!
//! For every peer entry whose state names a probe address (the peer's overlay address), the
//! executor sends a small UDP datagram through the entry to an unused port of that address. The
//! peer's kernel answers with an ICMP port unreachable, back through WireGuard, so the entry's
//! receive counter rises. [`Watch`] is the pure state machine of one peer: its inputs are the
//! probes sent, the entry's receive counter and last handshake over time; its output is
//! [`Reach`]. [`Prober`] holds the watches of a namespace and its probe sockets, made on a
//! thread inside that namespace.
//!
//! The cadence: a probe every [`PROBE_EVERY`] while the path works or is not known yet. Once it
//! is unreachable, a burst of [`BURST`] probes, then nothing from us for [`QUIET`]: each probe
//! to a peer without a session makes WireGuard retry its handshake every 5 s for 90 s, and a
//! NAT forgets a flow only after 30 s of silence (the stale flow would otherwise keep a new
//! port forward from taking effect). The measurements are in docs/overlay/reach.md.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use kuport_proto::v1::Reach;

use super::model::SESSION_LIFE;

/// The port probes go to on the peer's overlay address: the discard port, which nothing
/// listens on, so the peer's kernel answers with an ICMP port unreachable. A listener there
/// would take the probe and answer nothing; the peer's WireGuard then still answers the data
/// with a keepalive within 10 s, which is slower but still evidence.
pub const PROBE_PORT: u16 = 9;
/// How often the loop reads the counters and sends the probes that are due.
pub const TICK: Duration = Duration::from_millis(500);
/// A probe this often while the path works or is not known yet.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A path that worked is unreachable once probes went unanswered this long since the first
/// of them...
pub const BREAK_AFTER: Duration = Duration::from_secs(3);
/// ...and at least this many of them.
pub const BREAK_PROBES: u32 = 3;
/// A path never seen working is unreachable after this long of unanswered probes: longer than
/// WireGuard's 5 s handshake retry (REKEY_TIMEOUT), so one lost handshake does not count.
pub const FIRST_AFTER: Duration = Duration::from_secs(7);
/// Probes per burst while the path is unreachable, [`PROBE_EVERY`] apart. The first burst
/// follows the break at once, so a short flap is seen ending within a second.
pub const BURST: u32 = 5;
/// How long WireGuard keeps sending after the last probe it was given for a peer that does not
/// answer: with a live session, 15 s of waiting for an answer (KEEPALIVE_TIMEOUT and
/// REKEY_TIMEOUT), then handshake retries every 5 s for 20 attempts, about 100 s. Measured
/// with wireguard-go: the last initiation 98.6 s after a probe without a session, the first one
/// 15.3 s after a probe on a session (docs/overlay/reach.md).
pub const RETRY_WINDOW: Duration = Duration::from_secs(120);
/// The silence a NAT needs to forget a flow: its UDP timeout (30 s on Linux) and a margin.
pub const NAT_FORGETS: Duration = Duration::from_secs(35);
/// From a burst's last probe to the next burst's first: WireGuard's retries, then a silence
/// long enough for a NAT on the way to forget the flow.
pub const QUIET: Duration = Duration::from_secs(RETRY_WINDOW.as_secs() + NAT_FORGETS.as_secs());
/// Observations further apart than this (the loop stopped, the stream was down) do not
/// continue each other: the unanswered probes before the gap are forgotten.
pub const CONTINUITY: Duration = Duration::from_secs(3);

/// One peer's direct path, watched.
#[derive(Debug, Clone)]
pub struct Watch {
    reach: Reach,
    /// The receive counter and last handshake at the previous observation.
    rx: Option<u64>,
    observed: Option<Instant>,
    /// The first probe sent since something last arrived, and how many since.
    unanswered_since: Option<Instant>,
    unanswered: u32,
    /// Whether the path was ever seen working (which threshold applies).
    worked: bool,
    next_probe: Instant,
    /// Probes of the current burst (unreachable only).
    burst: u32,
}

impl Watch {
    /// A peer first watched at `now`: unknown, a probe due at once.
    pub fn new(now: Instant) -> Self {
        Watch {
            reach: Reach::Unknown,
            rx: None,
            observed: None,
            unanswered_since: None,
            unanswered: 0,
            worked: false,
            next_probe: now,
            burst: 0,
        }
    }

    pub fn reach(&self) -> Reach {
        self.reach
    }

    /// Whether a probe is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_probe
    }

    /// When the next probe is due.
    pub fn next_probe(&self) -> Instant {
        self.next_probe
    }

    /// A probe went out at `now`.
    pub fn sent(&mut self, now: Instant) {
        if self.unanswered_since.is_none() {
            self.unanswered_since = Some(now);
        }
        self.unanswered = self.unanswered.saturating_add(1);
        self.next_probe = now + PROBE_EVERY;
        if self.reach == Reach::Unreachable {
            self.burst += 1;
            if self.burst >= BURST {
                self.burst = 0;
                self.next_probe = now + QUIET;
            }
        }
    }

    /// The entry read at `now` (`wall`: the same moment on the Unix clock): its receive counter
    /// and last handshake (since the Unix epoch). True when the reach changed.
    pub fn observe(&mut self, now: Instant, wall: SystemTime, rx: u64, last_handshake: Option<Duration>) -> bool {
        let before = self.reach;
        let continued = self.observed.is_some_and(|at| now.saturating_duration_since(at) <= CONTINUITY);
        if !continued {
            // Nothing to compare with: a baseline, and the count of unanswered probes starts
            // again (they were not watched through).
            self.unanswered_since = None;
            self.unanswered = 0;
        }
        let wall = wall.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let live = last_handshake.is_some_and(|at| wall.saturating_sub(at) < SESSION_LIFE);
        // A counter that went back is an entry made anew: no arrival, a new baseline.
        let arrived = continued && self.rx.is_some_and(|prev| rx > prev) && live;
        self.rx = Some(rx);
        self.observed = Some(now);
        if arrived {
            self.unanswered_since = None;
            self.unanswered = 0;
            self.worked = true;
            if self.reach != Reach::Direct {
                self.reach = Reach::Direct;
                self.burst = 0;
                self.next_probe = self.next_probe.min(now + PROBE_EVERY);
            }
        } else if self.reach != Reach::Unreachable
            && let Some(since) = self.unanswered_since
        {
            let (after, probes) = if self.worked { (BREAK_AFTER, BREAK_PROBES) } else { (FIRST_AFTER, 2) };
            if self.unanswered >= probes && now.saturating_duration_since(since) >= after {
                self.reach = Reach::Unreachable;
                // The first burst starts now, at the probe cadence.
                self.burst = 0;
            }
        }
        self.reach != before
    }
}

/// What to probe in one device: each peer's public key and probe address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Targets {
    pub device: String,
    pub peers: Vec<(String, IpAddr)>,
}

/// The probe address of a state's peer: None when it has none or it does not parse (the
/// executor then reports the peer's reach as unknown).
pub fn probe_address(s: &str) -> Option<IpAddr> {
    if s.is_empty() {
        return None;
    }
    match s.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            tracing::debug!(probe_address = s, "not an address; the peer is not probed");
            None
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Netns(#[from] crate::sys::Error),
    #[error("probe socket: {0}")]
    Socket(#[from] std::io::Error),
}

struct Watched {
    probe: IpAddr,
    watch: Watch,
}

/// The watches of one namespace's WireGuard peers and the sockets that probe them.
pub struct Prober {
    netns: Option<PathBuf>,
    watches: BTreeMap<(String, String), Watched>,
    v4: Option<UdpSocket>,
    v6: Option<UdpSocket>,
}

impl Prober {
    /// For the devices in `netns` (None: the caller's namespace).
    pub fn new(netns: Option<PathBuf>) -> Self {
        Prober { netns, watches: BTreeMap::new(), v4: None, v6: None }
    }

    /// The reach of `device`'s peer `key`: unknown when it is not watched.
    pub fn reach(&self, device: &str, key: &str) -> Reach {
        self.watches.get(&(device.to_string(), key.to_string())).map_or(Reach::Unknown, |w| w.watch.reach())
    }

    /// Whether anything is watched.
    pub fn is_empty(&self) -> bool {
        self.watches.is_empty()
    }

    /// One round at `now`: reads each device's peers, updates their watches, and sends the
    /// probes that are due. Peers no longer in `targets` are forgotten; a peer whose probe
    /// address changed is watched anew. True when some peer's reach changed.
    pub fn round(&mut self, wg: &super::Wireguard, targets: &[Targets]) -> bool {
        let mut changed = false;
        let mut keep = std::collections::BTreeSet::new();
        for t in targets {
            let device = match super::show(wg, self.netns.as_deref(), &t.device) {
                Ok(d) => d,
                Err(e) => {
                    tracing::debug!(device = %t.device, error = %e, "reading WireGuard peers to probe");
                    None
                }
            };
            let (now, wall) = (Instant::now(), SystemTime::now());
            for (key, probe) in &t.peers {
                let id = (t.device.clone(), key.clone());
                keep.insert(id.clone());
                let w = self.watches.entry(id).or_insert_with(|| Watched { probe: *probe, watch: Watch::new(now) });
                if w.probe != *probe {
                    *w = Watched { probe: *probe, watch: Watch::new(now) };
                }
                // An entry missing from the device is observed as silent: its probes go nowhere.
                let peer = device.as_ref().and_then(|d| d.peers.iter().find(|p| p.public_key.to_string() == *key));
                let (rx, handshake) = peer.map_or((0, None), |p| (p.rx_bytes, p.last_handshake));
                if w.watch.observe(now, wall, rx, handshake) {
                    changed = true;
                    tracing::info!(device = %t.device, peer = %key, reach = ?w.watch.reach(), "direct path");
                }
            }
        }
        self.watches.retain(|id, _| keep.contains(id));
        let now = Instant::now();
        let due: Vec<IpAddr> = self.watches.values().filter(|w| w.watch.due(now)).map(|w| w.probe).collect();
        for probe in due {
            if let Err(e) = self.send(probe) {
                tracing::debug!(%probe, error = %e, "sending a probe");
            }
        }
        for w in self.watches.values_mut().filter(|w| w.watch.due(now)) {
            // Counted even when the send failed here: the path does not work from this node.
            w.watch.sent(now);
        }
        changed
    }

    /// Sends one probe to `address`, on a socket made inside the namespace (a socket belongs
    /// to the namespace of the thread that made it).
    fn send(&mut self, address: IpAddr) -> Result<(), ProbeError> {
        let slot = if address.is_ipv4() { &mut self.v4 } else { &mut self.v6 };
        if slot.is_none() {
            *slot = Some(socket(self.netns.as_deref(), address.is_ipv4())?);
        }
        if let Some(s) = slot.as_ref() {
            s.send_to(b"kuport reach probe", SocketAddr::new(address, PROBE_PORT))?;
        }
        Ok(())
    }
}

/// An unbound, non-blocking UDP socket of `netns`. Ordinary UDP: no capability needed.
fn socket(netns: Option<&Path>, v4: bool) -> Result<UdpSocket, ProbeError> {
    crate::sys::netns::within(netns, || {
        let any: SocketAddr = if v4 { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
        let s = UdpSocket::bind(any)?;
        s.set_nonblocking(true)?;
        Ok::<_, ProbeError>(s)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated peer: a clock, a wall clock, the entry's counters, and whether the path
    /// answers. Each tick observes first, then sends what is due, like [`Prober::round`].
    struct Sim {
        start: Instant,
        now: Instant,
        wall: SystemTime,
        rx: u64,
        handshake: Option<Duration>,
        up: bool,
        w: Watch,
        /// Probes sent whose answer arrives at the next tick (if the path is up then).
        in_flight: u32,
        sent: Vec<Duration>,
        changes: Vec<(Duration, Reach)>,
    }

    impl Sim {
        fn new(up: bool) -> Self {
            let now = Instant::now();
            Sim {
                start: now,
                now,
                wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000),
                rx: 0,
                handshake: None,
                up,
                w: Watch::new(now),
                in_flight: 0,
                sent: vec![],
                changes: vec![],
            }
        }

        fn at(&self) -> Duration {
            self.now - self.start
        }

        fn unix(&self) -> Duration {
            self.wall.duration_since(SystemTime::UNIX_EPOCH).expect("clock")
        }

        fn tick(&mut self) {
            if self.up && self.in_flight > 0 {
                // The answer (and, with no session, the handshake that carried it) arrived.
                if self.handshake.is_none_or(|h| self.unix().saturating_sub(h) >= Duration::from_secs(120)) {
                    self.handshake = Some(self.unix());
                }
                self.rx += 96 * u64::from(self.in_flight);
            }
            self.in_flight = 0;
            if self.w.observe(self.now, self.wall, self.rx, self.handshake) {
                self.changes.push((self.at(), self.w.reach()));
            }
            if self.w.due(self.now) {
                self.w.sent(self.now);
                self.sent.push(self.at());
                self.in_flight += 1;
            }
        }

        fn run(&mut self, d: Duration) {
            let end = self.now + d;
            while self.now < end {
                self.tick();
                self.now += TICK;
                self.wall += TICK;
            }
        }
    }

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    #[test]
    fn a_working_path_is_direct_after_the_first_answer() {
        let mut sim = Sim::new(true);
        sim.run(s(10.0));
        assert_eq!(sim.w.reach(), Reach::Direct);
        // The first probe at 0, its answer seen at the next tick.
        assert_eq!(sim.changes, vec![(s(0.5), Reach::Direct)]);
        assert_eq!(sim.sent.len(), 10, "one probe a second: {:?}", sim.sent);
    }

    #[test]
    fn a_path_is_unknown_until_watched_long_enough() {
        let mut sim = Sim::new(false);
        sim.run(FIRST_AFTER - s(0.5));
        assert_eq!(sim.w.reach(), Reach::Unknown, "{:?}", sim.changes);
        sim.run(s(1.0));
        assert_eq!(sim.changes, vec![(FIRST_AFTER, Reach::Unreachable)]);
    }

    #[test]
    fn a_break_is_unreachable_within_the_bound_and_a_return_direct_at_the_next_answer() {
        let mut sim = Sim::new(true);
        sim.run(s(10.0));
        // Cut at a probe: the worst case is just after an answer, a probe later.
        sim.up = false;
        let cut = sim.at();
        while sim.w.reach() != Reach::Unreachable && sim.at() < cut + s(10.0) {
            sim.run(TICK);
        }
        let (at, reach) = sim.changes[1];
        assert_eq!(reach, Reach::Unreachable);
        let took = at - cut;
        assert!(took <= BREAK_AFTER + PROBE_EVERY + TICK, "unreachable {took:?} after the cut");
        assert!(took <= s(5.0), "the goal: within about 5 s ({took:?})");
        // A flap: back during the first burst, direct at the next answer.
        sim.up = true;
        let back = sim.at();
        sim.run(s(5.0));
        let (at, reach) = sim.changes[2];
        assert_eq!(reach, Reach::Direct);
        assert!(at - back <= PROBE_EVERY + TICK, "direct {:?} after the return", at - back);
        // Back in the quiet: our next burst finds it (in a real network WireGuard's own
        // retries and the peer's keepalives find it sooner).
        sim.up = false;
        sim.run(s(20.0));
        assert_eq!(sim.w.reach(), Reach::Unreachable);
        sim.up = true;
        let back = sim.at();
        sim.run(QUIET + s(5.0));
        let (at, reach) = sim.changes[4];
        assert_eq!(reach, Reach::Direct);
        assert!(at - back <= QUIET, "direct {:?} after the return", at - back);
    }

    #[test]
    fn a_peers_own_packets_make_it_direct_at_once_whatever_the_cadence() {
        let mut sim = Sim::new(true);
        sim.run(s(5.0));
        sim.up = false;
        sim.run(s(10.0));
        assert_eq!(sim.w.reach(), Reach::Unreachable);
        // The path returns in the quiet: the peer's handshake and keepalive arrive (its own
        // WireGuard retries every 5 s), no probe of ours needed.
        sim.run(s(20.0));
        let probes = sim.sent.len();
        sim.handshake = Some(sim.unix());
        sim.rx += 92 + 32;
        sim.run(s(0.5));
        assert_eq!(sim.w.reach(), Reach::Direct);
        // Back to a probe a second.
        sim.up = true;
        sim.run(s(3.0));
        assert!(sim.sent.len() >= probes + 2, "probing again every second: {:?}", sim.sent);
    }

    #[test]
    fn the_last_known_state_is_kept_until_new_evidence() {
        let mut sim = Sim::new(true);
        sim.run(s(5.0));
        assert_eq!(sim.w.reach(), Reach::Direct);
        // A counter that goes back (the entry made anew) is no evidence either way.
        sim.rx = 0;
        sim.run(s(0.5));
        assert_eq!(sim.w.reach(), Reach::Direct);
        // A gap in the watching (the loop stopped): nothing after it counts as unanswered
        // before fresh probes do.
        sim.up = false;
        sim.now += s(60.0);
        sim.wall += s(60.0);
        sim.run(s(1.0));
        assert_eq!(sim.w.reach(), Reach::Direct, "kept across the gap");
        sim.run(s(5.0));
        assert_eq!(sim.w.reach(), Reach::Unreachable, "fresh probes unanswered");
        // Unreachable is kept through the quiet, whatever the counters do without a live session.
        sim.handshake = None;
        sim.rx += 148;
        sim.run(s(30.0));
        assert_eq!(sim.w.reach(), Reach::Unreachable, "a handshake initiation alone is not a working path");
    }

    #[test]
    fn an_expired_session_is_not_direct_even_if_bytes_arrive() {
        let mut sim = Sim::new(false);
        sim.handshake = Some(sim.unix() - SESSION_LIFE);
        sim.run(s(1.0));
        sim.rx += 148;
        sim.run(s(0.5));
        assert_eq!(sim.w.reach(), Reach::Unknown);
    }

    #[test]
    fn an_unreachable_path_is_probed_in_bursts_with_quiet_gaps_longer_than_retries_and_nat() {
        let mut sim = Sim::new(false);
        sim.run(s(600.0));
        assert_eq!(sim.w.reach(), Reach::Unreachable);
        let broke = sim.changes[0].0;
        let after: Vec<Duration> = sim.sent.iter().copied().filter(|t| *t >= broke).collect();
        assert!(!after.is_empty());
        // Bursts of BURST probes PROBE_EVERY apart, the first right after the break; between
        // bursts nothing for QUIET: WireGuard's retries after the last probe, then a NAT's 30 s
        // UDP timeout.
        let mut gaps: Vec<Duration> = after.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.sort();
        gaps.dedup();
        assert_eq!(gaps, vec![PROBE_EVERY, QUIET], "{after:?}");
        assert!(QUIET >= Duration::from_secs(15 + 100 + 30), "{QUIET:?}");
        assert!(after[0] - broke <= PROBE_EVERY, "{broke:?} -> {:?}", after[0]);
        let bursts: Vec<&[Duration]> = after.chunks(BURST as usize).collect();
        assert!(bursts.len() >= 3, "{after:?}");
        for burst in &bursts[..bursts.len() - 1] {
            assert_eq!(burst.len(), BURST as usize);
            assert!(burst.windows(2).all(|w| w[1] - w[0] == PROBE_EVERY), "{burst:?}");
        }
    }

    #[test]
    fn probe_addresses_parse_or_are_none() {
        assert_eq!(probe_address(""), None);
        assert_eq!(probe_address("10.42.2.0"), Some("10.42.2.0".parse().expect("ip")));
        assert_eq!(probe_address("fd00::1"), Some("fd00::1".parse().expect("ip")));
        assert_eq!(probe_address("10.42.2.0/32"), None);
    }
}
