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
//! is unreachable, a burst of [`BURST`] probes, then silence long enough for a NAT to forget
//! the flow (30 s; the stale flow would otherwise keep a new port forward from taking effect).
//! Each probe makes WireGuard retry its handshake for about 100 s, so on a non-direct pair's
//! entry (no keepalive) the executor resets the entry right after an unanswered burst (removed
//! and added again as the state has it: no session, nothing staged) and waits [`NAT_FORGETS`];
//! on any other entry it waits [`QUIET`], past WireGuard's retries. A non-direct pair's entry
//! whose path worked probes every second for [`AFTER_BREAK`] after the break before that. A new
//! endpoint in the state is a new path: it starts a burst at once. The measurements are in
//! docs/overlay/reach.md.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use kuport_proto::v1::{self, Reach};

use super::model::{PeerSpec, SESSION_LIFE};

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
/// From a burst's last probe to the next burst's first on an entry the executor does not reset
/// (one with a keepalive: a direct pair's, which the controller has not turned off yet):
/// WireGuard's retries, then a silence long enough for a NAT on the way to forget the flow. A
/// reset entry waits [`NAT_FORGETS`] from its reset instead.
pub const QUIET: Duration = Duration::from_secs(RETRY_WINDOW.as_secs() + NAT_FORGETS.as_secs());
/// On a non-direct pair's entry, the two sides take turns of this long by the wall clock
/// (docs/overlay/reach.md, "Turns"): one side probes through its turn while the other is silent
/// toward it. Longer than a NAT's memory ([`NAT_FORGETS`]) with 5 s for the two clocks to differ.
pub const TURN: Duration = Duration::from_secs(NAT_FORGETS.as_secs() + 5);
/// After a path that worked breaks, a non-direct pair's entry goes on probing every second this
/// long before it takes turns (docs/overlay/reach.md, "Right after a break"): a cut path comes
/// back on the NAT mappings it worked on, with no stale flow to wait out, so the side that can
/// reopen it finds it within a second or two. Only a port forward removed and added again during
/// these 120 s waits for the turns' silence after them.
pub const AFTER_BREAK: Duration = Duration::from_secs(120);

/// Whether the turn at `wall` (since the Unix epoch) is the side's whose turns are the even ones
/// (`even`) or the odd ones.
pub fn own_turn(wall: Duration, even: bool) -> bool {
    (wall.as_secs() / TURN.as_secs()).is_multiple_of(2) == even
}

/// From `wall` to the start of the side's next turn.
pub fn until_own_turn(wall: Duration, even: bool) -> Duration {
    let slot = wall.as_secs() / TURN.as_secs();
    let next = if own_turn(Duration::from_secs((slot + 1) * TURN.as_secs()), even) { slot + 1 } else { slot + 2 };
    Duration::from_secs(next * TURN.as_secs()).saturating_sub(wall)
}

/// The overlay's nftables table (inet), whose relay rule counts what this node relayed.
pub const OVERLAY_TABLE: &str = kuport_proto::owned::OVERLAY_TABLE;
/// The sets the relay's accept rule looks up (docs/overlay/relays.md, "The relay's filter").
pub const RELAY_SETS: [&str; 2] = [kuport_proto::owned::OVERLAY_PODS_V4, kuport_proto::owned::OVERLAY_PODS_V6];

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
    /// When a path that worked was last found unreachable ([`AFTER_BREAK`]).
    broke_at: Option<Instant>,
    next_probe: Instant,
    /// Probes of the current burst (unreachable only).
    burst: u32,
    /// Whether the entry may be reset after an unanswered burst (a non-direct pair's entry).
    resettable: bool,
    /// When the reset of the entry is due: the tick after a burst's last probe.
    reset_at: Option<Instant>,
    /// On a resettable entry, whether this side's turns are the even ones (None: no turns, the
    /// entry probes in bursts).
    turn: Option<bool>,
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
            broke_at: None,
            next_probe: now,
            burst: 0,
            resettable: false,
            reset_at: None,
            turn: None,
        }
    }

    /// The side's turns on a resettable entry: even or odd (docs/overlay/reach.md, "Turns").
    pub fn set_turn(&mut self, even: Option<bool>) {
        self.turn = even;
    }

    /// Whether the entry may be reset after an unanswered burst: the state's entry is a
    /// non-direct pair's, with no keepalive (docs/overlay/reach.md, "The reset").
    pub fn set_resettable(&mut self, resettable: bool) {
        self.resettable = resettable;
        if !resettable {
            self.reset_at = None;
        }
    }

    /// Whether the entry's reset is due at `now`: a burst went unanswered, and the path is still
    /// unreachable.
    pub fn reset_due(&self, now: Instant) -> bool {
        self.resettable
            && self.reach == Reach::Unreachable
            && self.reset_at.is_some_and(|at| now >= at)
            && !self.just_broke(now)
    }

    /// The entry was reset at `now` (`done`), or the reset failed. Done: nothing from the entry
    /// until [`NAT_FORGETS`] from now, and the next read is a new baseline (the counters start
    /// again at 0). Failed: the next burst after [`QUIET`], as on an entry not reset.
    pub fn was_reset(&mut self, now: Instant, done: bool) {
        self.reset_at = None;
        if done {
            // With turns the next probe waits for this side's next turn, already set.
            if self.turns().is_none() {
                self.next_probe = now + NAT_FORGETS;
            }
            self.rx = None;
        }
    }

    /// The state gave the entry a new endpoint at `now`: a new path, so an unreachable entry
    /// starts a burst at once instead of waiting out its quiet gap (the NAT holds no stale flow
    /// toward an endpoint it never saw). A working or unknown one is probed every second anyway.
    pub fn endpoint_changed(&mut self, now: Instant) {
        if self.reach == Reach::Unreachable {
            self.burst = 0;
            self.reset_at = None;
            self.next_probe = now;
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

    /// Whether the entry is a non-direct pair's whose path worked and broke less than
    /// [`AFTER_BREAK`] before `now`: probed every second, never reset.
    fn just_broke(&self, now: Instant) -> bool {
        self.resettable
            && self.reach == Reach::Unreachable
            && self.broke_at.is_some_and(|at| now.saturating_duration_since(at) < AFTER_BREAK)
    }

    /// Whether the entry takes turns now: unreachable, resettable, with its side's turns set.
    fn turns(&self) -> Option<bool> {
        self.turn.filter(|_| self.resettable && self.reach == Reach::Unreachable)
    }

    /// A probe went out at `now` (`wall`: the same moment on the Unix clock).
    pub fn sent(&mut self, now: Instant, wall: SystemTime) {
        if self.unanswered_since.is_none() {
            self.unanswered_since = Some(now);
        }
        self.unanswered = self.unanswered.saturating_add(1);
        self.next_probe = now + PROBE_EVERY;
        if self.just_broke(now) {
            self.burst = 0;
            return;
        }
        if let Some(even) = self.turns() {
            // Probes every second through this side's turn; at its end the entry is reset and
            // nothing goes out until the next one.
            let next = wall.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default() + PROBE_EVERY;
            if !own_turn(next, even) {
                self.reset_at = Some(now + TICK);
                self.next_probe = now + PROBE_EVERY + until_own_turn(next, even);
            }
            return;
        }
        if self.reach == Reach::Unreachable {
            self.burst += 1;
            if self.burst >= BURST {
                self.burst = 0;
                self.next_probe = now + QUIET;
                if self.resettable {
                    // Once the last probe had a tick for its answer.
                    self.reset_at = Some(now + TICK);
                }
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
            self.broke_at = None;
            self.reset_at = None;
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
                self.broke_at = self.worked.then_some(now);
                // The first burst starts now, at the probe cadence.
                self.burst = 0;
            }
        }
        // The entry became a non-direct pair's after its burst had ended: back to a probe a
        // second, and no reset, until AFTER_BREAK has passed.
        if self.just_broke(now) && self.next_probe > now + PROBE_EVERY {
            self.next_probe = now;
            self.reset_at = None;
        }
        self.reach != before
    }
}

/// What to probe in one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Targets {
    pub device: String,
    pub peers: Vec<Target>,
}

/// One peer to probe, as the state has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its public key, as the state writes it.
    pub key: String,
    pub probe: IpAddr,
    /// The state's endpoint: a change starts a burst ([`Watch::endpoint_changed`]).
    pub endpoint: Option<SocketAddr>,
    /// The state's entry when it is a non-direct pair's (no keepalive): what the entry is made
    /// again with after an unanswered burst. None: never reset.
    pub reset: Option<PeerSpec>,
}

impl Target {
    /// The target of a state's peer of `device`: None when it has no probe address.
    pub fn of(device: &str, p: &v1::WireguardPeer) -> Option<Target> {
        let probe = probe_address(&p.probe_address)?;
        let spec = super::model::parse_peer(device, p).ok();
        Some(Target {
            key: p.public_key.clone(),
            probe,
            endpoint: spec.as_ref().and_then(|s| s.endpoint),
            reset: spec.filter(|s| s.keepalive == 0),
        })
    }
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
    endpoint: Option<SocketAddr>,
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

    /// One round at `now`: reads each device's peers, updates their watches, resets the entries
    /// whose burst went unanswered, and sends the probes that are due. Peers no longer in
    /// `targets` are forgotten; a peer whose probe address changed is watched anew; one whose
    /// endpoint changed starts a burst. True when some peer's reach changed.
    pub fn round(&mut self, wg: &super::Wireguard, targets: &[Targets]) -> bool {
        let mut changed = false;
        let mut keep = std::collections::BTreeSet::new();
        let mut resets: Vec<(String, String, PeerSpec)> = Vec::new();
        for t in targets {
            let device = match super::show(wg, self.netns.as_deref(), &t.device) {
                Ok(d) => d,
                Err(e) => {
                    tracing::debug!(device = %t.device, error = %e, "reading WireGuard peers to probe");
                    None
                }
            };
            let (now, wall) = (Instant::now(), SystemTime::now());
            for target in &t.peers {
                let key = &target.key;
                let id = (t.device.clone(), key.clone());
                keep.insert(id.clone());
                let fresh = || Watched { probe: target.probe, endpoint: target.endpoint, watch: Watch::new(now) };
                let w = self.watches.entry(id).or_insert_with(fresh);
                if w.probe != target.probe {
                    *w = fresh();
                }
                w.watch.set_resettable(target.reset.is_some());
                // The side whose key sorts first takes the even turns, the other the odd ones.
                let own = device.as_ref().and_then(|d| d.public_key.as_ref()).map(|k| k.to_string());
                w.watch.set_turn(own.map(|own| own < *key));
                if w.endpoint != target.endpoint {
                    w.endpoint = target.endpoint;
                    w.watch.endpoint_changed(now);
                    tracing::debug!(device = %t.device, peer = %key, endpoint = ?target.endpoint, "new endpoint; probing it");
                }
                // An entry missing from the device is observed as silent: its probes go nowhere.
                let peer = device.as_ref().and_then(|d| d.peers.iter().find(|p| p.public_key.to_string() == *key));
                let (rx, handshake) = peer.map_or((0, None), |p| (p.rx_bytes, p.last_handshake));
                if w.watch.observe(now, wall, rx, handshake) {
                    changed = true;
                    tracing::info!(device = %t.device, peer = %key, reach = ?w.watch.reach(), "direct path");
                }
                if w.watch.reset_due(now)
                    && let Some(spec) = &target.reset
                {
                    resets.push((t.device.clone(), key.clone(), spec.clone()));
                }
            }
        }
        self.watches.retain(|id, _| keep.contains(id));
        for (device, key, spec) in resets {
            let done = match super::reset(wg, self.netns.as_deref(), &device, &spec) {
                Ok(done) => done,
                Err(e) => {
                    tracing::warn!(%device, peer = %spec.public_key, error = %e, "resetting an unreachable entry");
                    false
                }
            };
            if done {
                tracing::debug!(%device, peer = %spec.public_key, "unreachable entry reset: quiet until the next burst");
            }
            if let Some(w) = self.watches.get_mut(&(device, key)) {
                w.watch.was_reset(Instant::now(), done);
            }
        }
        let now = Instant::now();
        let due: Vec<IpAddr> = self.watches.values().filter(|w| w.watch.due(now)).map(|w| w.probe).collect();
        for probe in due {
            if let Err(e) = self.send(probe) {
                tracing::debug!(%probe, error = %e, "sending a probe");
            }
        }
        for w in self.watches.values_mut().filter(|w| w.watch.due(now)) {
            // Counted even when the send failed here: the path does not work from this node.
            w.watch.sent(now, SystemTime::now());
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
        /// When the entry was reset (made anew: counters at 0, no session).
        resets: Vec<Duration>,
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
                resets: vec![],
            }
        }

        fn resettable(up: bool) -> Self {
            let mut sim = Sim::new(up);
            sim.w.set_resettable(true);
            sim
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
            if self.w.reset_due(self.now) {
                self.w.was_reset(self.now, true);
                self.resets.push(self.at());
                (self.rx, self.handshake, self.in_flight) = (0, None, 0);
            }
            if self.w.due(self.now) {
                self.w.sent(self.now, self.wall);
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
    fn a_non_direct_entry_is_reset_after_each_unanswered_burst_and_quiet_until_a_nat_forgets() {
        let mut sim = Sim::resettable(false);
        sim.run(s(200.0));
        assert_eq!(sim.w.reach(), Reach::Unreachable);
        let broke = sim.changes[0].0;
        let after: Vec<Duration> = sim.sent.iter().copied().filter(|t| *t >= broke).collect();
        let bursts: Vec<&[Duration]> = after.chunks(BURST as usize).collect();
        assert!(bursts.len() >= 4, "{after:?}");
        // One reset per full burst, a tick after its last probe; the next burst NAT_FORGETS after
        // the reset. The cycle is a burst, a tick and NAT_FORGETS: about 40 s, not 160 s.
        assert_eq!(sim.resets.len(), bursts.iter().filter(|b| b.len() == BURST as usize).count(), "{:?}", sim.resets);
        for (i, reset) in sim.resets.iter().enumerate() {
            let last = bursts[i][BURST as usize - 1];
            assert_eq!(*reset, last + TICK, "burst {i}: {:?}", bursts[i]);
            if let Some(next) = bursts.get(i + 1) {
                assert_eq!(next[0], *reset + NAT_FORGETS, "burst {}", i + 1);
            }
        }
        let cycle = bursts[2][0] - bursts[1][0];
        assert_eq!(cycle, PROBE_EVERY * (BURST - 1) + TICK + NAT_FORGETS);
        assert!(cycle < s(45.0), "{cycle:?}");
    }

    #[test]
    fn a_path_restored_in_the_quiet_of_a_reset_entry_is_direct_within_one_cycle() {
        let mut sim = Sim::resettable(true);
        sim.run(s(5.0));
        sim.up = false;
        // The first reset comes once AFTER_BREAK has passed.
        while sim.resets.is_empty() && sim.at() < AFTER_BREAK + s(30.0) {
            sim.run(TICK);
        }
        assert_eq!(sim.w.reach(), Reach::Unreachable);
        assert_eq!(sim.resets.len(), 1, "{:?}", sim.resets);
        // Restored just after the reset: the worst case, a whole quiet gap to wait.
        sim.up = true;
        let back = sim.at();
        sim.run(s(60.0));
        let (at, reach) = *sim.changes.last().expect("changes");
        assert_eq!(reach, Reach::Direct);
        assert!(at - back <= NAT_FORGETS + TICK, "direct {:?} after the return", at - back);
        assert_eq!(sim.resets.len(), 1, "a working entry is never reset: {:?}", sim.resets);
    }

    /// Right after a break (docs/overlay/reach.md): a non-direct pair's entry whose path worked
    /// probes every second and is never reset for AFTER_BREAK, so a cut path that comes back in
    /// that time is direct within two seconds, whosever turn it is; after AFTER_BREAK it takes
    /// turns, with a NAT's silence between them.
    #[test]
    fn a_broken_path_is_probed_every_second_for_a_while_and_then_in_turns() {
        let mut sim = Sim::resettable(true);
        sim.w.set_turn(Some(true));
        sim.run(s(5.0));
        sim.up = false;
        sim.run(s(10.0));
        assert_eq!(sim.w.reach(), Reach::Unreachable);
        let broke = sim.changes[1].0;
        sim.run(AFTER_BREAK - s(12.0));
        let during: Vec<Duration> = sim.sent.iter().copied().filter(|t| *t >= broke).collect();
        assert!(during.windows(2).all(|w| w[1] - w[0] == PROBE_EVERY), "a probe a second: {during:?}");
        assert!(sim.resets.is_empty(), "no reset while just broken: {:?}", sim.resets);
        // Restored late in the window, in either side's turn: direct at the next probe.
        sim.up = true;
        let back = sim.at();
        sim.run(s(3.0));
        let (at, reach) = *sim.changes.last().expect("a change");
        assert_eq!(reach, Reach::Direct);
        assert!(at - back <= s(2.0), "direct {:?} after the return", at - back);
        // Broken again: a new window from the new break, then turns.
        sim.up = false;
        sim.run(AFTER_BREAK + s(200.0));
        let again = sim.changes.last().expect("a change").0;
        let later: Vec<Duration> = sim.sent.iter().copied().filter(|t| *t > again + AFTER_BREAK + s(1.0)).collect();
        let gaps: Vec<Duration> = later.windows(2).map(|w| w[1] - w[0]).filter(|g| *g > s(1.5)).collect();
        assert!(!gaps.is_empty() && gaps.iter().all(|g| *g >= NAT_FORGETS), "turns after the window: {gaps:?}");
        assert!(!sim.resets.is_empty() && sim.resets[0] >= again + AFTER_BREAK, "{:?}", sim.resets);
    }

    #[test]
    fn only_an_unreachable_resettable_entry_is_reset() {
        // Working: never reset, whatever its state entry.
        let mut sim = Sim::resettable(true);
        sim.run(s(60.0));
        assert!(sim.resets.is_empty() && sim.w.reach() == Reach::Direct);
        // Unreachable with a keepalive (not resettable): never reset, bursts QUIET apart.
        let mut sim = Sim::new(false);
        sim.run(s(60.0));
        assert!(sim.resets.is_empty() && sim.w.reach() == Reach::Unreachable);
        // Made not resettable while a reset is due (the state turned the keepalive on): none.
        let mut sim = Sim::resettable(false);
        while sim.w.reset_at.is_none() && sim.at() < s(30.0) {
            sim.run(TICK);
        }
        assert!(sim.w.reset_at.is_some() && sim.resets.is_empty(), "{:?}", sim.sent);
        sim.w.set_resettable(false);
        sim.run(s(10.0));
        assert!(sim.resets.is_empty());
    }

    #[test]
    fn a_new_endpoint_starts_a_burst_at_once() {
        let mut sim = Sim::resettable(false);
        sim.run(s(20.0));
        assert_eq!(sim.resets.len(), 1);
        let probes = sim.sent.len();
        // In the quiet: the state announces a new endpoint (a port forward), a new path.
        sim.w.endpoint_changed(sim.now);
        let changed = sim.at();
        sim.up = true;
        sim.run(s(2.0));
        assert_eq!(sim.sent[probes], changed, "probed at once: {:?}", &sim.sent[probes..]);
        let (at, reach) = *sim.changes.last().expect("changes");
        assert_eq!(reach, Reach::Direct);
        assert!(at - changed <= PROBE_EVERY, "direct {:?} after the new endpoint", at - changed);
        // A working entry's new endpoint changes nothing: probed every second anyway.
        let next = sim.w.next_probe();
        sim.w.endpoint_changed(sim.now);
        assert_eq!(sim.w.next_probe(), next);
    }

    #[test]
    fn turns_alternate_and_each_sides_silence_outlasts_a_nat() {
        assert_eq!(TURN, s(40.0));
        assert!(own_turn(s(0.0), true) && !own_turn(s(0.0), false));
        assert!(own_turn(s(39.9), true) && !own_turn(s(40.0), true) && own_turn(s(40.0), false));
        assert_eq!(until_own_turn(s(10.0), true), s(70.0), "the even side's next turn starts at 80 s");
        assert_eq!(until_own_turn(s(10.0), false), s(30.0));
        assert_eq!(until_own_turn(s(40.0), false), s(80.0), "in its own turn: the next one");
        // An unreachable entry taking turns: probes only in its own turns, a reset at each end,
        // and between the last probe of a turn and the first of the next at least a NAT's memory.
        let mut sim = Sim::resettable(false);
        sim.w.set_turn(Some(true));
        sim.run(s(300.0));
        assert_eq!(sim.w.reach(), Reach::Unreachable);
        let turn_of = |at: Duration| (sim.unix() - sim.at() + at).as_secs() / 40 % 2;
        let after = sim.changes[0].0;
        let later: Vec<Duration> = sim.sent.iter().copied().filter(|t| *t > after + s(1.0)).collect();
        assert!(later.iter().all(|t| turn_of(*t) == 0), "probes only in the even turns: {later:?}");
        let gaps: Vec<Duration> = later.windows(2).map(|w| w[1] - w[0]).filter(|g| *g > s(1.5)).collect();
        assert!(!gaps.is_empty() && gaps.iter().all(|g| *g >= NAT_FORGETS), "silences {gaps:?}");
        assert!(sim.resets.len() >= 3, "a reset at the end of each turn: {:?}", sim.resets);
    }

    #[test]
    fn a_path_restored_in_this_sides_turn_is_direct_within_two_seconds() {
        let mut sim = Sim::resettable(false);
        sim.w.set_turn(Some(true));
        sim.run(s(100.0));
        assert_eq!(sim.w.reach(), Reach::Unreachable);
        // Run to the middle of the next even turn, then restore.
        while !(sim.unix().as_secs() / 40).is_multiple_of(2) || sim.unix().as_secs() % 40 < 10 {
            sim.run(TICK);
        }
        sim.up = true;
        let back = sim.at();
        sim.run(s(5.0));
        let (at, reach) = *sim.changes.last().expect("a change");
        assert_eq!(reach, Reach::Direct);
        assert!(at - back <= s(2.0), "direct {:?} after the return", at - back);
    }

    #[test]
    fn probe_addresses_parse_or_are_none() {
        assert_eq!(probe_address(""), None);
        assert_eq!(probe_address("10.42.2.0"), Some("10.42.2.0".parse().expect("ip")));
        assert_eq!(probe_address("fd00::1"), Some("fd00::1".parse().expect("ip")));
        assert_eq!(probe_address("10.42.2.0/32"), None);
    }
}
