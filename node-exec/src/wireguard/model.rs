//! The desired WireGuard devices, parsed from a state; what a device holds, as a backend reads
//! it; and the plan between them: the device's own settings that differ, and one change per
//! peer that differs (added, updated in only what differs, or removed). Never a device-wide
//! replace: a peer the plan does not name keeps its session.

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use ipnet::IpNet;
use kuport_proto::v1;

use super::Error;
use super::key::{PrivateKey, PublicKey};

/// How long a session lives without a new handshake (WireGuard's REJECT_AFTER_TIME, 180 s):
/// a peer whose last handshake is younger gets through, and keeps the endpoint WireGuard
/// learned from its packets whatever the state says.
pub const SESSION_LIFE: Duration = Duration::from_secs(180);

/// A WireGuard device kuport wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    pub name: String,
    /// None keeps the device's own.
    pub mtu: Option<u32>,
    /// None lets the device choose.
    pub listen_port: Option<u16>,
    /// 0: none.
    pub fwmark: u32,
    /// By public key, each once.
    pub peers: Vec<PeerSpec>,
}

/// A peer kuport wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    pub public_key: PublicKey,
    pub endpoint: Option<SocketAddr>,
    /// In canonical order, each once.
    pub allowed_ips: Vec<IpNet>,
    /// 0: off.
    pub keepalive: u16,
}

/// A device as a backend reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Device {
    /// The public key of its private key; None when it has none.
    pub public_key: Option<PublicKey>,
    pub listen_port: u16,
    pub fwmark: u32,
    pub peers: Vec<Peer>,
}

/// A peer as a backend reads it, with its session's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub public_key: PublicKey,
    pub endpoint: Option<SocketAddr>,
    pub allowed_ips: Vec<IpNet>,
    pub keepalive: u16,
    /// The last completed handshake, as time since the Unix epoch; None: never.
    pub last_handshake: Option<Duration>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

impl Peer {
    pub fn new(public_key: PublicKey) -> Self {
        Peer {
            public_key,
            endpoint: None,
            allowed_ips: Vec::new(),
            keepalive: 0,
            last_handshake: None,
            rx_bytes: 0,
            tx_bytes: 0,
        }
    }

    /// Whether its session is alive at `now` (a handshake within [`SESSION_LIFE`]).
    pub fn live(&self, now: SystemTime) -> bool {
        let Some(at) = self.last_handshake else { return false };
        let now = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        now.saturating_sub(at) < SESSION_LIFE
    }
}

/// The device's own settings to write; each None stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The node's key.
    pub private_key: Option<PrivateKey>,
    pub listen_port: Option<u16>,
    pub fwmark: Option<u32>,
}

impl DeviceConfig {
    pub fn is_empty(&self) -> bool {
        self.private_key.is_none() && self.listen_port.is_none() && self.fwmark.is_none()
    }

    /// As `wg set` would say it (the key as `<node key>`).
    pub fn describe(&self, device: &str) -> String {
        let mut s = format!("wg set {device}");
        if self.private_key.is_some() {
            s.push_str(" private-key <node key>");
        }
        if let Some(p) = self.listen_port {
            s.push_str(&format!(" listen-port {p}"));
        }
        if let Some(m) = self.fwmark {
            s.push_str(&format!(" fwmark {m:#x}"));
        }
        s
    }
}

/// One peer's change: it alone is touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerChange {
    /// A new peer, whole.
    Add(PeerSpec),
    /// An existing peer (update only: never creates it); each None stays as it is.
    Update {
        public_key: PublicKey,
        endpoint: Option<SocketAddr>,
        /// Replaces this peer's allowed IPs, and only this peer's.
        allowed_ips: Option<Vec<IpNet>>,
        keepalive: Option<u16>,
    },
    Remove(PublicKey),
}

impl PeerChange {
    /// As `wg set` would say it.
    pub fn describe(&self, device: &str) -> String {
        let mut s = format!("wg set {device} peer {}", self.public_key());
        let (endpoint, ips, keepalive) = match self {
            PeerChange::Remove(_) => return s + " remove",
            PeerChange::Add(p) => (p.endpoint, Some(&p.allowed_ips), Some(p.keepalive)),
            PeerChange::Update { endpoint, allowed_ips, keepalive, .. } => {
                (*endpoint, allowed_ips.as_ref(), *keepalive)
            }
        };
        if let Some(e) = endpoint {
            s.push_str(&format!(" endpoint {e}"));
        }
        if let Some(ips) = ips {
            s.push_str(&format!(" allowed-ips {}", if ips.is_empty() { "\"\"".into() } else { self::ips(ips) }));
        }
        if let Some(k) = keepalive {
            s.push_str(&format!(" persistent-keepalive {k}"));
        }
        s
    }

    pub fn public_key(&self) -> &PublicKey {
        match self {
            PeerChange::Add(p) => &p.public_key,
            PeerChange::Update { public_key, .. } | PeerChange::Remove(public_key) => public_key,
        }
    }
}

/// What makes one device as desired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevicePlan {
    /// The device does not exist: create it, then configure it whole.
    pub create: bool,
    pub config: DeviceConfig,
    /// Added and updated peers (make).
    pub peers: Vec<PeerChange>,
    /// Removed peers (break: after everything new is in).
    pub removes: Vec<PeerChange>,
    /// The differences, named (`listen-port 51820 -> 51821`), for drift reports.
    pub how: Vec<String>,
    /// Per peer: its key and what differs ("missing", "extra", "allowed-ips a -> b").
    pub peer_how: Vec<(PublicKey, String)>,
}

impl DevicePlan {
    pub fn is_empty(&self) -> bool {
        !self.create && self.config.is_empty() && self.peers.is_empty() && self.removes.is_empty()
    }
}

/// The plan for `spec` on a node whose key is `key`, against what the device holds (None: it
/// does not exist), at `now`.
pub fn plan(spec: &DeviceSpec, key: &PrivateKey, have: Option<&Device>, now: SystemTime) -> DevicePlan {
    let mut p = DevicePlan::default();
    let Some(have) = have else {
        p.create = true;
        p.config = DeviceConfig { private_key: Some(key.clone()), listen_port: spec.listen_port, fwmark: None };
        if spec.fwmark != 0 {
            p.config.fwmark = Some(spec.fwmark);
        }
        p.peers = spec.peers.iter().cloned().map(PeerChange::Add).collect();
        p.how.push("missing".into());
        return p;
    };
    if have.public_key != Some(key.public()) {
        p.config.private_key = Some(key.clone());
        p.how.push(format!("public key {} -> {}", opt(have.public_key.as_ref()), key.public()));
    }
    if let Some(port) = spec.listen_port.filter(|p| *p != have.listen_port) {
        p.config.listen_port = Some(port);
        p.how.push(format!("listen-port {} -> {port}", have.listen_port));
    }
    if have.fwmark != spec.fwmark {
        p.config.fwmark = Some(spec.fwmark);
        p.how.push(format!("fwmark {:#x} -> {:#x}", have.fwmark, spec.fwmark));
    }
    for want in &spec.peers {
        let Some(peer) = have.peers.iter().find(|h| h.public_key == want.public_key) else {
            p.peers.push(PeerChange::Add(want.clone()));
            p.peer_how.push((want.public_key, "missing".into()));
            continue;
        };
        let mut how = Vec::new();
        // A live session keeps the endpoint WireGuard learned from the peer's packets.
        let endpoint = want.endpoint.filter(|e| peer.endpoint != Some(*e) && !peer.live(now));
        if let Some(e) = endpoint {
            how.push(format!("endpoint {} -> {e}", opt(peer.endpoint.as_ref())));
        }
        let mut have_ips = peer.allowed_ips.clone();
        have_ips.sort();
        let mut want_ips = want.allowed_ips.clone();
        want_ips.sort();
        let allowed_ips = (have_ips != want_ips).then(|| want.allowed_ips.clone());
        if allowed_ips.is_some() {
            how.push(format!("allowed-ips {} -> {}", ips(&peer.allowed_ips), ips(&want.allowed_ips)));
        }
        let keepalive = (peer.keepalive != want.keepalive).then_some(want.keepalive);
        if keepalive.is_some() {
            how.push(format!("persistent-keepalive {} -> {}", peer.keepalive, want.keepalive));
        }
        if !how.is_empty() {
            p.peers.push(PeerChange::Update { public_key: want.public_key, endpoint, allowed_ips, keepalive });
            p.peer_how.push((want.public_key, how.join(", ")));
        }
    }
    for peer in &have.peers {
        if !spec.peers.iter().any(|w| w.public_key == peer.public_key) {
            p.removes.push(PeerChange::Remove(peer.public_key));
            p.peer_how.push((peer.public_key, "extra".into()));
        }
    }
    p
}

fn opt(v: Option<&impl fmt::Display>) -> String {
    v.map_or_else(|| "none".into(), ToString::to_string)
}

/// Allowed IPs as `wg` lists them: comma separated, `(none)` for none.
pub fn ips(ips: &[IpNet]) -> String {
    if ips.is_empty() { "(none)".into() } else { ips.iter().map(ToString::to_string).collect::<Vec<_>>().join(",") }
}

/// Parses the state's WireGuard devices: names under kuport's link prefix, 32-byte base64
/// keys, `IP:port` endpoints, prefixes without host bits, each peer and prefix once.
pub fn parse_devices(state: &v1::NetnsState) -> Result<Vec<DeviceSpec>, Error> {
    let mut out: Vec<DeviceSpec> = Vec::new();
    for d in &state.wireguard_devices {
        let object = format!("wireguard device {}", d.name);
        let invalid = |reason: String| Error::Invalid { object: object.clone(), reason };
        if d.name.is_empty() || d.name.len() > 15 || d.name.contains(['/', ' ', '\0', ':']) {
            return Err(invalid(format!("{:?} is not an interface name", d.name)));
        }
        if !crate::rtnl::consts::owns_link(&d.name) {
            return Err(invalid(format!("kuport only manages links named {}*", crate::rtnl::consts::LINK_PREFIX)));
        }
        if out.iter().any(|o| o.name == d.name) {
            return Err(invalid("listed twice".into()));
        }
        let listen_port = match d.listen_port {
            0 => None,
            p => Some(u16::try_from(p).map_err(|_| invalid(format!("listen port {p} out of range")))?),
        };
        // Each key once: a device's peers are a map by key, and a key has one base64 text.
        let peers = d.peers.iter().map(|p| parse_peer(&object, p)).collect::<Result<Vec<PeerSpec>, Error>>()?;
        out.push(DeviceSpec {
            name: d.name.clone(),
            mtu: (d.mtu != 0).then_some(d.mtu),
            listen_port,
            fwmark: d.fwmark,
            peers,
        });
    }
    Ok(out)
}

/// Parses one peer of a state's device (`device`: how errors name the device).
pub fn parse_peer(device: &str, p: &v1::WireguardPeer) -> Result<PeerSpec, Error> {
    let invalid = |reason: String| Error::Invalid { object: format!("{device} peer {}", p.public_key), reason };
    let public_key: PublicKey = p
        .public_key
        .parse()
        .map_err(|e: super::KeyError| Error::Invalid { object: device.to_string(), reason: e.to_string() })?;
    let endpoint = if p.endpoint.is_empty() {
        None
    } else {
        Some(
            p.endpoint
                .parse::<SocketAddr>()
                .map_err(|_| invalid(format!("endpoint {:?} is not IP:port (or [IPv6]:port)", p.endpoint)))?,
        )
    };
    let mut allowed_ips = Vec::new();
    for a in &p.allowed_ips {
        let net: IpNet = a.parse().map_err(|_| invalid(format!("allowed IP {a:?} is not a prefix")))?;
        if net.addr() != net.network() {
            return Err(invalid(format!("allowed IP {a} has host bits set")));
        }
        if !allowed_ips.contains(&net) {
            allowed_ips.push(net);
        }
    }
    let keepalive = u16::try_from(p.persistent_keepalive_seconds)
        .map_err(|_| invalid(format!("keepalive {} out of range", p.persistent_keepalive_seconds)))?;
    Ok(PeerSpec { public_key, endpoint, allowed_ips, keepalive })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> PublicKey {
        PublicKey([n; 32])
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("prefix")
    }

    fn spec(peers: Vec<PeerSpec>) -> DeviceSpec {
        DeviceSpec { name: "kup-wg".into(), mtu: Some(1420), listen_port: Some(51820), fwmark: 0, peers }
    }

    fn want(n: u8, ip: &str) -> PeerSpec {
        PeerSpec {
            public_key: key(n),
            endpoint: Some(format!("192.0.2.{n}:51820").parse().expect("endpoint")),
            allowed_ips: vec![net(ip)],
            keepalive: 25,
        }
    }

    fn have(w: &PeerSpec) -> Peer {
        Peer {
            endpoint: w.endpoint,
            allowed_ips: w.allowed_ips.clone(),
            keepalive: w.keepalive,
            ..Peer::new(w.public_key)
        }
    }

    #[test]
    fn a_missing_device_is_created_whole() {
        let node = PrivateKey::from_bytes([7; 32]);
        let p = plan(&spec(vec![want(1, "10.42.1.0/24")]), &node, None, SystemTime::now());
        assert!(p.create);
        assert_eq!(p.config.private_key.as_ref(), Some(&node));
        assert_eq!(p.config.listen_port, Some(51820));
        assert_eq!(p.peers, vec![PeerChange::Add(want(1, "10.42.1.0/24"))]);
    }

    #[test]
    fn only_the_peers_that_differ_change_and_only_in_what_differs() {
        let node = PrivateKey::from_bytes([7; 32]);
        let (a, b, c) = (want(1, "10.42.1.0/24"), want(2, "10.42.2.0/24"), want(3, "10.42.3.0/24"));
        let device = Device {
            public_key: Some(node.public()),
            listen_port: 51820,
            fwmark: 0,
            peers: vec![have(&a), have(&b), Peer::new(key(9))],
        };
        let mut b2 = b.clone();
        b2.allowed_ips.push(net("100.96.0.2/32"));
        let p = plan(&spec(vec![a.clone(), b2, c.clone()]), &node, Some(&device), SystemTime::now());
        assert!(!p.create && p.config.is_empty(), "{p:?}");
        assert_eq!(
            p.peers,
            vec![
                PeerChange::Update {
                    public_key: key(2),
                    endpoint: None,
                    allowed_ips: Some(vec![net("10.42.2.0/24"), net("100.96.0.2/32")]),
                    keepalive: None
                },
                PeerChange::Add(c),
            ]
        );
        assert_eq!(p.removes, vec![PeerChange::Remove(key(9))]);
        assert_eq!(p.peer_how[0].1, "allowed-ips 10.42.2.0/24 -> 10.42.2.0/24,100.96.0.2/32");
        // Nothing differs: nothing to do.
        let same = Device { peers: vec![have(&a)], ..device.clone() };
        assert!(plan(&spec(vec![a]), &node, Some(&same), SystemTime::now()).is_empty());
    }

    #[test]
    fn a_live_session_keeps_its_learned_endpoint() {
        let node = PrivateKey::from_bytes([7; 32]);
        let a = want(1, "10.42.1.0/24");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut roamed = have(&a);
        roamed.endpoint = Some("198.51.100.9:40000".parse().expect("endpoint"));
        roamed.last_handshake = Some(Duration::from_secs(1_000_000 - 30));
        let device = Device { public_key: Some(node.public()), listen_port: 51820, fwmark: 0, peers: vec![roamed] };
        assert!(plan(&spec(vec![a.clone()]), &node, Some(&device), now).is_empty());
        // A silent one is sent to the state's endpoint again.
        let later = now + SESSION_LIFE;
        let p = plan(&spec(vec![a.clone()]), &node, Some(&device), later);
        assert_eq!(
            p.peers,
            vec![PeerChange::Update { public_key: key(1), endpoint: a.endpoint, allowed_ips: None, keepalive: None }]
        );
    }

    #[test]
    fn another_key_port_or_mark_is_set_on_the_device_alone() {
        let node = PrivateKey::from_bytes([7; 32]);
        let device = Device { public_key: Some(key(5)), listen_port: 40000, fwmark: 9, peers: vec![] };
        let p = plan(&spec(vec![]), &node, Some(&device), SystemTime::now());
        assert_eq!(
            p.config,
            DeviceConfig { private_key: Some(node.clone()), listen_port: Some(51820), fwmark: Some(0) }
        );
        assert!(p.peers.is_empty() && p.removes.is_empty());
    }

    #[test]
    fn devices_parse_strictly() {
        let peer = |k: &str, ep: &str, ips: &[&str]| v1::WireguardPeer {
            public_key: k.into(),
            endpoint: ep.into(),
            allowed_ips: ips.iter().map(|s| s.to_string()).collect(),
            persistent_keepalive_seconds: 25,
            ..Default::default()
        };
        let state = |name: &str, peers: Vec<v1::WireguardPeer>| v1::NetnsState {
            wireguard_devices: vec![v1::WireguardDevice {
                name: name.into(),
                peers: peers.into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let k = "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiU=";
        let reason = |s: &v1::NetnsState| parse_devices(s).expect_err("invalid").to_string();
        assert!(reason(&state("wg0", vec![])).contains("kup-"));
        assert!(reason(&state("kup-wg", vec![peer("short", "", &[])])).contains("not a WireGuard key"));
        assert!(reason(&state("kup-wg", vec![peer(k, "host:51820", &[])])).contains("is not IP:port"));
        assert!(reason(&state("kup-wg", vec![peer(k, "", &["10.42.1.1/24"])])).contains("host bits"));
        let ok = parse_devices(&state("kup-wg", vec![peer(k, "[2001:db8::7]:51820", &["10.42.1.0/24", "fd00::/64"])]))
            .expect("valid");
        assert_eq!(ok[0].peers[0].endpoint, "[2001:db8::7]:51820".parse().ok());
        assert_eq!(ok[0].listen_port, None);
    }
}
