//! The probe: dial an address from inside a host's namespace and report what the pod saw and
//! where the answer came from.
//!
//! TCP: the connection's peer is by definition the address dialed (the kernel matches the
//! SYN-ACK to it), so a reply from anywhere else shows as a connection that never completes.
//! UDP: the socket is not connected, so a reply from any source is received and reported as
//! it came.
//!
//! Either family: [`probe_any`] dials an IPv4 or an IPv6 address (`[2001:db8::9]:27015`, see
//! [`parse_target`]); [`probe`] and the continuous probes dial IPv4.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read as _};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use kuport_node_exec::sys::netns::Netns;

use crate::echo::{parse_answer, parse_answer_any};
use crate::sys::in_netns;
use crate::topology::Protocol;

/// What a probe that got an answer saw: IPv4 addresses (`A` = [`SocketAddrV4`], what [`probe`]
/// answers), or either family ([`SocketAddr`], what [`probe_any`] answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer<A = SocketAddrV4> {
    pub protocol: Protocol,
    /// Where the probe was sent.
    pub dialed: A,
    /// The pod that answered.
    pub pod: String,
    /// The source address and port the pod saw.
    pub seen: A,
    /// The source of the reply.
    pub reply_from: A,
    /// The probe's own socket: its port is what the pod should see (its address is 0.0.0.0
    /// or :: for UDP, whose socket is unbound).
    pub local: A,
    pub elapsed: Duration,
}

impl Answer<SocketAddr> {
    /// The same answer with IPv4 addresses (IPv4-mapped IPv6 ones unmapped, any other IPv6
    /// address 0.0.0.0).
    pub fn into_v4(self) -> Answer {
        Answer {
            protocol: self.protocol,
            dialed: v4(self.dialed),
            pod: self.pod,
            seen: v4(self.seen),
            reply_from: v4(self.reply_from),
            local: v4(self.local),
            elapsed: self.elapsed,
        }
    }

    /// The pod saw `client` and the probe's own port, and the reply came from the address
    /// dialed.
    pub fn intact(&self, client: std::net::IpAddr) -> bool {
        self.seen.ip() == client && self.seen.port() == self.local.port() && self.reply_from == self.dialed
    }
}

impl<A: fmt::Display> fmt::Display for Answer<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}: pod {} saw {}; reply from {} ({:.1} ms)",
            self.dialed,
            self.protocol,
            self.pod,
            self.seen,
            self.reply_from,
            self.elapsed.as_secs_f64() * 1e3
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// A TCP reset or an ICMP error answered.
    #[error("refused after {:.1} ms", .after.as_secs_f64() * 1e3)]
    Refused { after: Duration },
    /// Nothing (that the socket accepts) came back in time.
    #[error("no answer within {:.0} ms", .waited.as_secs_f64() * 1e3)]
    NoAnswer { waited: Duration },
    #[error("unreadable answer {0:?}")]
    Garbled(String),
    #[error("{0}")]
    Io(String),
}

/// Sends one probe from the namespace at `netns`.
pub fn probe(netns: &Path, to: SocketAddrV4, protocol: Protocol, timeout: Duration) -> Result<Answer, ProbeError> {
    probe_any(netns, to.into(), protocol, timeout).map(Answer::into_v4)
}

/// Sends one probe to an IPv4 or IPv6 address from the namespace at `netns`.
pub fn probe_any(
    netns: &Path,
    to: SocketAddr,
    protocol: Protocol,
    timeout: Duration,
) -> Result<Answer<SocketAddr>, ProbeError> {
    in_netns(netns, || Ok(probe_here(to, protocol, timeout, None)))
        .unwrap_or_else(|e| Err(ProbeError::Io(e.to_string())))
}

/// [`probe_any`] from source port `port`, for a test that means two flows to share one.
pub fn probe_any_from(
    netns: &Path,
    to: SocketAddr,
    protocol: Protocol,
    timeout: Duration,
    port: u16,
) -> Result<Answer<SocketAddr>, ProbeError> {
    in_netns(netns, || Ok(probe_here(to, protocol, timeout, Some(port))))
        .unwrap_or_else(|e| Err(ProbeError::Io(e.to_string())))
}

/// The first source port probes take; they count up from here to just below the kernel's
/// ephemeral range (32768), which no other socket of a client takes.
const FIRST_SOURCE_PORT: u16 = 20_000;

/// A socket bound to a source port no probe in this network namespace took before (until
/// 12,768 later). Two flows from one client to one pod through two accepting nodes, on one
/// source port, have one reply tuple at the pod's node, and its conntrack gives the second
/// another source port (docs/portmap/modes.md): with ports the kernel picks at random, that
/// happened to a probe. Counted per namespace, a port comes back minutes later, after the
/// conntrack entries of its last flow are gone.
fn bound_fresh<S>(bind: impl Fn(u16) -> io::Result<S>) -> io::Result<S> {
    use std::os::unix::fs::MetadataExt as _;
    static TAKEN: std::sync::Mutex<BTreeMap<u64, u16>> = std::sync::Mutex::new(BTreeMap::new());
    let span = 32_768 - FIRST_SOURCE_PORT;
    let netns = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
    let mut tries = 0;
    loop {
        let offset = {
            let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
            let next = taken.entry(netns).or_default();
            let offset = *next;
            *next = (offset + 1) % span;
            offset
        };
        match bind(FIRST_SOURCE_PORT + offset) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < 64 => tries += 1,
            bound => return bound,
        }
    }
}

fn unspecified(like: SocketAddr, port: u16) -> SocketAddr {
    match like {
        SocketAddr::V4(_) => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, port).into(),
    }
}

/// A TCP connection to `to` from source port `port`, waiting at most `timeout`.
fn connect_from(to: SocketAddr, port: u16, timeout: Duration) -> io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketType, bind, connect, socket, sockopt};
    let family = if to.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let fd = socket(family, SocketType::STREAM, None)?;
    bind(&fd, &unspecified(to, port))?;
    // A blocking connect waits no longer than the send timeout, then fails with EINPROGRESS.
    sockopt::set_socket_timeout(&fd, sockopt::Timeout::Send, Some(timeout))?;
    match connect(&fd, &to) {
        Ok(()) => Ok(TcpStream::from(fd)),
        Err(rustix::io::Errno::INPROGRESS) => Err(io::ErrorKind::TimedOut.into()),
        Err(e) => Err(e.into()),
    }
}

/// A probe's target as the CLI takes it: `203.0.113.9:27015`, or an IPv6 literal in brackets,
/// `[2001:db8::9]:27015`.
pub fn parse_target(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>().map_err(|_| {
        if s.parse::<std::net::Ipv6Addr>().is_ok() || (s.matches(':').count() > 1 && !s.starts_with('[')) {
            format!("{s:?}: write an IPv6 address in brackets with its port, as [2001:db8::9]:27015")
        } else {
            format!("{s:?} is not ADDRESS:PORT (203.0.113.9:27015 or [2001:db8::9]:27015)")
        }
    })
}

fn v4(a: SocketAddr) -> SocketAddrV4 {
    match a {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => SocketAddrV4::new(a.ip().to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED), a.port()),
    }
}

/// One probe from source port `port`, or from one no probe took before.
fn probe_here(
    to: SocketAddr,
    protocol: Protocol,
    timeout: Duration,
    port: Option<u16>,
) -> Result<Answer<SocketAddr>, ProbeError> {
    let start = Instant::now();
    let io_err = |e: io::Error| match e.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => {
            ProbeError::Refused { after: start.elapsed() }
        }
        // Host or network unreachable: an ICMP error answered.
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
            ProbeError::Refused { after: start.elapsed() }
        }
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ProbeError::NoAnswer { waited: start.elapsed() },
        _ => ProbeError::Io(e.to_string()),
    };
    let (text, reply_from, local) = match protocol {
        Protocol::Tcp => {
            let connect = |port| connect_from(to, port, timeout);
            let mut s = port.map_or_else(|| bound_fresh(connect), connect).map_err(io_err)?;
            let left = timeout.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
            s.set_read_timeout(Some(left)).map_err(io_err)?;
            let mut text = String::new();
            s.read_to_string(&mut text).map_err(io_err)?;
            (text, s.peer_addr().map_err(io_err)?, s.local_addr().map_err(io_err)?)
        }
        Protocol::Udp => {
            let bind = |port| UdpSocket::bind(unspecified(to, port));
            let s = port.map_or_else(|| bound_fresh(bind), bind).map_err(io_err)?;
            s.set_read_timeout(Some(timeout)).map_err(io_err)?;
            s.send_to(b"probe\n", to).map_err(io_err)?;
            let mut buf = [0u8; 512];
            let (n, from) = s.recv_from(&mut buf).map_err(io_err)?;
            (String::from_utf8_lossy(&buf[..n]).into_owned(), from, s.local_addr().map_err(io_err)?)
        }
    };
    let (pod, seen) = parse_answer_any(&text).ok_or_else(|| ProbeError::Garbled(text.clone()))?;
    Ok(Answer { protocol, dialed: to, pod, seen, reply_from, local, elapsed: start.elapsed() })
}

/// How a continuous probe dials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// One UDP socket (one source port) for the whole run: one conntrack entry on every node,
    /// the flow a game client keeps.
    Established,
    /// A new socket, so a new source port and a new flow, for every probe (UDP or TCP).
    New,
}

/// One stream of probes: from a host's namespace to a published address, answered by `pod`.
#[derive(Debug, Clone)]
pub struct Target {
    /// Names the stream in tallies.
    pub label: String,
    /// The client's namespace.
    pub from: std::path::PathBuf,
    /// The client's address: what the pod must see.
    pub client: Ipv4Addr,
    pub to: SocketAddrV4,
    pub protocol: Protocol,
    pub flow: Flow,
    pub pod: String,
}

/// What one probe of a stream got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The pod saw the client's real address and port, and the reply came from the address
    /// dialed.
    Answered,
    /// An answer, but a wrong one (another pod, a rewritten source, a reply from elsewhere).
    Wrong(String),
    /// No answer in time, or refused.
    Lost(String),
}

#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was sent, from the prober's start.
    pub sent: Duration,
    pub outcome: Outcome,
}

/// Counts of a stream's outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub answered: usize,
    pub wrong: usize,
    pub lost: usize,
}

impl Tally {
    pub fn failed(&self) -> usize {
        self.wrong + self.lost
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} answered, {} lost, {} wrong", self.answered, self.lost, self.wrong)
    }
}

struct Stream {
    target: Target,
    samples: std::sync::Arc<std::sync::Mutex<Vec<Sample>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Probes running continuously, each stream on its own thread inside its client's namespace:
/// one probe every `interval` (the next one waits while a probe waits for its answer).
pub struct Prober {
    started: Instant,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    streams: Vec<Stream>,
}

impl Prober {
    pub fn start(targets: Vec<Target>, interval: Duration, timeout: Duration) -> Prober {
        let started = Instant::now();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let streams = targets
            .into_iter()
            .map(|target| {
                let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
                let (t, s, halt) = (target.clone(), samples.clone(), stop.clone());
                let thread = std::thread::Builder::new()
                    .name(format!("probe {}", target.label))
                    .spawn(move || run_stream(&t, &s, &halt, started, interval, timeout))
                    .expect("a probe thread starts");
                Stream { target, samples, thread: Some(thread) }
            })
            .collect();
        Prober { started, stop, streams }
    }

    /// Now, on the prober's clock (what [`Sample::sent`] counts from).
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    fn samples(&self, label: &str) -> Vec<Sample> {
        self.streams
            .iter()
            .find(|s| s.target.label == label)
            .map(|s| s.samples.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_default()
    }

    /// The labels of the streams.
    pub fn labels(&self) -> Vec<String> {
        self.streams.iter().map(|s| s.target.label.clone()).collect()
    }

    /// A stream's outcomes for probes sent in `[from, to)`.
    pub fn tally(&self, label: &str, from: Duration, to: Duration) -> Tally {
        let mut t = Tally::default();
        for s in self.samples(label).iter().filter(|s| s.sent >= from && s.sent < to) {
            match s.outcome {
                Outcome::Answered => t.answered += 1,
                Outcome::Wrong(_) => t.wrong += 1,
                Outcome::Lost(_) => t.lost += 1,
            }
        }
        t
    }

    /// Every stream's tally over `[from, to)`, one line each.
    pub fn report(&self, from: Duration, to: Duration) -> String {
        self.labels().iter().map(|l| format!("  {l}: {}\n", self.tally(l, from, to))).collect()
    }

    /// The first failed probe of a stream sent in `[from, to)`, with what went wrong.
    pub fn first_failure(&self, label: &str, from: Duration, to: Duration) -> Option<Sample> {
        self.samples(label).into_iter().find(|s| s.sent >= from && s.sent < to && s.outcome != Outcome::Answered)
    }

    /// When the first probe sent at or after `from` was answered (None: none yet).
    pub fn first_answer(&self, label: &str, from: Duration) -> Option<Duration> {
        self.samples(label).iter().find(|s| s.sent >= from && s.outcome == Outcome::Answered).map(|s| s.sent)
    }

    /// Waits until every stream has a probe answered that was sent at or after `from`; false
    /// after `timeout`.
    pub fn wait_answered(&self, from: Duration, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.labels().iter().all(|l| self.first_answer(l, from).is_some()) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Waits until stream `label` has a probe answered that was sent at or after `from`; false
    /// after `timeout`.
    pub fn wait_answered_one(&self, label: &str, from: Duration, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.first_answer(label, from).is_some() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops every stream (each finishes its probe in flight).
    pub fn stop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for s in &mut self.streams {
            if let Some(t) = s.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run_stream(
    target: &Target,
    samples: &std::sync::Mutex<Vec<Sample>>,
    stop: &std::sync::atomic::AtomicBool,
    started: Instant,
    interval: Duration,
    timeout: Duration,
) {
    let push = |sent: Duration, outcome: Outcome| {
        samples.lock().unwrap_or_else(|e| e.into_inner()).push(Sample { sent, outcome });
    };
    // This thread probes from the client's namespace for as long as the stream runs.
    if let Err(e) = Netns::open(&target.from).and_then(|ns| ns.enter()) {
        push(started.elapsed(), Outcome::Lost(e.to_string()));
        return;
    }
    let mut kept: Option<UdpSocket> = None;
    let mut next = Instant::now();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next = Instant::now().max(next) + interval;
        let sent = started.elapsed();
        let result = match (target.flow, target.protocol) {
            (Flow::Established, Protocol::Udp) => established(&mut kept, target.to, timeout),
            (Flow::Established, Protocol::Tcp) => Err(ProbeError::Io("an established TCP stream is not probed".into())),
            (Flow::New, p) => probe_here(target.to.into(), p, timeout, None).map(Answer::into_v4),
        };
        let outcome = match result {
            Ok(a) => {
                let intact = a.pod == target.pod
                    && *a.seen.ip() == target.client
                    && a.seen.port() == a.local.port()
                    && a.reply_from == a.dialed;
                if intact { Outcome::Answered } else { Outcome::Wrong(a.to_string()) }
            }
            Err(e) => Outcome::Lost(e.to_string()),
        };
        push(sent, outcome);
    }
}

/// One probe on the stream's kept UDP socket (made on first use). Answers that arrived late
/// for an earlier probe are discarded first.
fn established(kept: &mut Option<UdpSocket>, to: SocketAddrV4, timeout: Duration) -> Result<Answer, ProbeError> {
    let io = |e: io::Error| ProbeError::Io(e.to_string());
    if kept.is_none() {
        let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)).map_err(io)?;
        *kept = Some(s);
    }
    let s = kept.as_ref().ok_or_else(|| ProbeError::Io("no socket".into()))?;
    let mut buf = [0u8; 512];
    s.set_nonblocking(true).map_err(io)?;
    while s.recv_from(&mut buf).is_ok() {}
    s.set_nonblocking(false).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    let start = Instant::now();
    s.send_to(b"probe\n", to).map_err(io)?;
    let (n, from) = s.recv_from(&mut buf).map_err(|e| match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ProbeError::NoAnswer { waited: start.elapsed() },
        _ => io(e),
    })?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    let (pod, seen) = parse_answer(&text).ok_or_else(|| ProbeError::Garbled(text.clone()))?;
    let local = v4(s.local_addr().map_err(io)?);
    Ok(Answer { protocol: Protocol::Udp, dialed: to, pod, seen, reply_from: v4(from), local, elapsed: start.elapsed() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_in_one_namespace_take_ports_below_the_ephemeral_range_one_after_another() {
        let bind = |port| UdpSocket::bind((Ipv4Addr::LOCALHOST, port));
        let ports: Vec<u16> =
            (0..3).map(|_| bound_fresh(bind).and_then(|s| s.local_addr()).map(|a| a.port()).unwrap()).collect();
        assert!(ports.iter().all(|p| (FIRST_SOURCE_PORT..32_768).contains(p)), "{ports:?}");
        assert!(ports[0] != ports[1] && ports[1] != ports[2] && ports[0] != ports[2], "{ports:?}");
    }

    #[test]
    fn targets_of_either_family_parse() {
        assert_eq!(parse_target("203.0.113.9:27015"), Ok("203.0.113.9:27015".parse().unwrap()));
        let v6 = parse_target("[2001:db8::9]:27015").unwrap();
        assert_eq!((v6.ip().to_string(), v6.port()), ("2001:db8::9".to_string(), 27015));
        assert!(v6.is_ipv6());
        let e = parse_target("2001:db8::9:27015").unwrap_err();
        assert!(e.contains("in brackets"), "{e}");
        let e = parse_target("2001:db8::9").unwrap_err();
        assert!(e.contains("in brackets"), "{e}");
        assert!(parse_target("203.0.113.9").unwrap_err().contains("is not ADDRESS:PORT"));
        assert!(parse_target("[2001:db8::9]").is_err());
        assert!(parse_target("[2001:db8::9]:70000").is_err());
    }

    #[test]
    fn answers_keep_their_family_and_unmap_for_ipv4() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let answer = Answer {
            protocol: Protocol::Udp,
            dialed: a("[2001:db8::9]:27015"),
            pod: "game-0".into(),
            seen: a("[2001:db8:100::7]:40000"),
            reply_from: a("[2001:db8::9]:27015"),
            local: a("[::]:40000"),
            elapsed: Duration::from_millis(2),
        };
        assert!(answer.intact("2001:db8:100::7".parse().unwrap()));
        assert!(!answer.intact("198.51.100.7".parse().unwrap()));
        assert_eq!(
            answer.to_string(),
            "[2001:db8::9]:27015/UDP: pod game-0 saw [2001:db8:100::7]:40000; reply from [2001:db8::9]:27015 (2.0 ms)"
        );
        let mapped = Answer { dialed: a("203.0.113.9:27015"), seen: a("[::ffff:198.51.100.7]:40000"), ..answer };
        let four = mapped.into_v4();
        assert_eq!(
            (four.dialed, four.seen),
            ("203.0.113.9:27015".parse().unwrap(), "198.51.100.7:40000".parse().unwrap())
        );
    }
}
