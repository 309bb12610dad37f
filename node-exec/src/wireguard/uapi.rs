//! WireGuard's cross-platform UAPI text protocol (wireguard.com/xplatform), which wireguard-go
//! serves on `/var/run/wireguard/IFACE.sock`: a `set=1` or `get=1` line, `key=value` lines, an
//! empty line; the answer ends with `errno=N` and an empty line. Keys are hex on the wire.
//!
//! A set names each peer by `public_key=` and then says only what changes for it:
//! `update_only=true` for a peer that must already exist, `replace_allowed_ips=true` before
//! its new list (this peer's alone), `remove=true`. `replace_peers=true` (the device-wide
//! replace) is never sent.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;

use super::key::{KEY_LEN, PrivateKey, PublicKey};
use super::model::{Device, DeviceConfig, Peer, PeerChange};

/// How long a request may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The `get=1` request.
pub const GET: &str = "get=1\n\n";

/// The `set=1` request for `config` and `changes` (either may be empty).
pub fn set_request(config: &DeviceConfig, changes: &[PeerChange]) -> String {
    let mut s = String::from("set=1\n");
    if let Some(k) = &config.private_key {
        s.push_str(&format!("private_key={}\n", hex::encode(k.bytes())));
    }
    if let Some(p) = config.listen_port {
        s.push_str(&format!("listen_port={p}\n"));
    }
    if let Some(m) = config.fwmark {
        s.push_str(&format!("fwmark={m}\n"));
    }
    for c in changes {
        s.push_str(&format!("public_key={}\n", hex::encode(c.public_key().bytes())));
        match c {
            PeerChange::Add(p) => {
                if let Some(e) = p.endpoint {
                    s.push_str(&format!("endpoint={e}\n"));
                }
                s.push_str(&format!("persistent_keepalive_interval={}\n", p.keepalive));
                allowed_ips(&mut s, &p.allowed_ips);
            }
            PeerChange::Update { endpoint, allowed_ips: ips, keepalive, .. } => {
                s.push_str("update_only=true\n");
                if let Some(e) = endpoint {
                    s.push_str(&format!("endpoint={e}\n"));
                }
                if let Some(k) = keepalive {
                    s.push_str(&format!("persistent_keepalive_interval={k}\n"));
                }
                if let Some(ips) = ips {
                    allowed_ips(&mut s, ips);
                }
            }
            PeerChange::Remove(_) => s.push_str("remove=true\n"),
        }
    }
    s.push('\n');
    s
}

fn allowed_ips(s: &mut String, ips: &[IpNet]) {
    s.push_str("replace_allowed_ips=true\n");
    for ip in ips {
        s.push_str(&format!("allowed_ip={ip}\n"));
    }
}

/// What an answer said: the device (for a get), or the errno of a refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("refused with errno {0}")]
    Errno(i32),
    #[error("malformed answer: {0}")]
    Malformed(String),
}

/// The errno of an answer (0: done).
pub fn errno(answer: &str) -> Result<i32, AnswerError> {
    answer
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("errno="))
        .ok_or_else(|| AnswerError::Malformed("no errno line".into()))?
        .parse::<i32>()
        .map(i32::abs)
        .map_err(|_| AnswerError::Malformed("errno is not a number".into()))
}

/// Parses a `get=1` answer into a [`Device`] (the private key only as its public key).
pub fn parse_get(answer: &str) -> Result<Device, AnswerError> {
    let e = errno(answer)?;
    if e != 0 {
        return Err(AnswerError::Errno(e));
    }
    let bad = |l: &str| AnswerError::Malformed(format!("line {l:?}"));
    let mut d = Device::default();
    let mut peer: Option<Peer> = None;
    let mut secs: Option<u64> = None;
    for line in answer.lines() {
        if line.is_empty() {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| bad(line))?;
        let num = |v: &str| v.parse::<u64>().map_err(|_| bad(line));
        match (k, peer.as_mut()) {
            ("private_key", None) => {
                let key = PrivateKey::from_bytes(hex_key(v).ok_or_else(|| bad("private_key=..."))?);
                d.public_key = Some(key.public());
            }
            ("listen_port", None) => d.listen_port = u16::try_from(num(v)?).map_err(|_| bad(line))?,
            ("fwmark", None) => d.fwmark = u32::try_from(num(v)?).map_err(|_| bad(line))?,
            ("public_key", _) => {
                d.peers.extend(peer.take());
                peer = Some(Peer::new(PublicKey(hex_key(v).ok_or_else(|| bad(line))?)));
                secs = None;
            }
            ("endpoint", Some(p)) => p.endpoint = Some(v.parse::<SocketAddr>().map_err(|_| bad(line))?),
            ("allowed_ip", Some(p)) => p.allowed_ips.push(v.parse::<IpNet>().map_err(|_| bad(line))?),
            ("persistent_keepalive_interval", Some(p)) => {
                p.keepalive = u16::try_from(num(v)?).map_err(|_| bad(line))?;
            }
            ("rx_bytes", Some(p)) => p.rx_bytes = num(v)?,
            ("tx_bytes", Some(p)) => p.tx_bytes = num(v)?,
            ("last_handshake_time_sec", Some(_)) => secs = Some(num(v)?),
            ("last_handshake_time_nsec", Some(p)) => {
                let nanos = num(v)?;
                p.last_handshake = match secs.unwrap_or(0) {
                    0 if nanos == 0 => None,
                    s => Some(Duration::from_secs(s) + Duration::from_nanos(nanos)),
                };
            }
            // protocol_version, preshared_key, errno and what later versions add.
            _ => {}
        }
    }
    d.peers.extend(peer);
    Ok(d)
}

fn hex_key(v: &str) -> Option<[u8; KEY_LEN]> {
    let bytes = hex::decode(v).ok()?;
    bytes.try_into().ok()
}

/// Sends one request on a connection of its own and returns the whole answer (up to its empty
/// last line).
pub fn exchange(socket: &Path, request: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    s.write_all(request.as_bytes())?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.ends_with(b"\n\n") {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(answer).map_err(|_| std::io::Error::other("the answer is not text"))
}

#[cfg(test)]
mod tests {
    use super::super::model::PeerSpec;
    use super::*;

    fn key(n: u8) -> PublicKey {
        PublicKey([n; 32])
    }

    #[test]
    fn a_set_names_each_peer_and_only_what_changes() {
        let config = DeviceConfig {
            private_key: Some(PrivateKey::from_bytes([0xe8; 32])),
            listen_port: Some(51820),
            fwmark: None,
        };
        let add = PeerChange::Add(PeerSpec {
            public_key: key(1),
            endpoint: "192.0.2.1:51820".parse().ok(),
            allowed_ips: vec!["10.42.1.0/24".parse().expect("net"), "fd00::/64".parse().expect("net")],
            keepalive: 25,
        });
        let update =
            PeerChange::Update { public_key: key(2), endpoint: None, allowed_ips: Some(vec![]), keepalive: Some(0) };
        let text = set_request(&config, &[add, update, PeerChange::Remove(key(3))]);
        let h = |n: u8| hex::encode([n; 32]);
        assert_eq!(
            text,
            format!(
                "set=1\nprivate_key={}\nlisten_port=51820\n\
                 public_key={}\nendpoint=192.0.2.1:51820\npersistent_keepalive_interval=25\n\
                 replace_allowed_ips=true\nallowed_ip=10.42.1.0/24\nallowed_ip=fd00::/64\n\
                 public_key={}\nupdate_only=true\npersistent_keepalive_interval=0\nreplace_allowed_ips=true\n\
                 public_key={}\nremove=true\n\n",
                h(0xe8),
                h(1),
                h(2),
                h(3)
            )
        );
        assert!(!text.contains("replace_peers"));
        assert_eq!(set_request(&DeviceConfig::default(), &[]), "set=1\n\n");
    }

    /// A reset ([`super::super::Backend::reset_peer`]): the peer removed, then a new one of the
    /// same key, whole, in one request (wireguard-go creates a peer it no longer finds).
    #[test]
    fn a_reset_removes_then_adds_the_same_peer_in_one_request() {
        let spec = PeerSpec {
            public_key: key(4),
            endpoint: "192.0.2.4:51820".parse().ok(),
            allowed_ips: vec!["10.42.4.0/32".parse().expect("net")],
            keepalive: 0,
        };
        let text = set_request(&DeviceConfig::default(), &[PeerChange::Remove(key(4)), PeerChange::Add(spec)]);
        let h = hex::encode([4u8; 32]);
        assert_eq!(
            text,
            format!(
                "set=1\npublic_key={h}\nremove=true\n\
                 public_key={h}\nendpoint=192.0.2.4:51820\npersistent_keepalive_interval=0\n\
                 replace_allowed_ips=true\nallowed_ip=10.42.4.0/32\n\n"
            )
        );
    }

    #[test]
    fn a_get_answer_parses_into_the_device() {
        // The protocol's own example (wireguard.com/xplatform, "get=1"), as wireguard-go sends it.
        let answer = "private_key=e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a\n\
            listen_port=12912\n\
            public_key=b85996fecc9c7f1fc6d2572a76eda11d59bcd20be8e543b15ce4bd85a8e75a33\n\
            preshared_key=188515093e952f5f22e865cef3012e72f8b5f0b598ac0309d5dacce3b70fcf52\n\
            allowed_ip=192.168.4.4/32\n\
            endpoint=[abcd:23::33]:51820\n\
            last_handshake_time_sec=1700000000\n\
            last_handshake_time_nsec=5\n\
            public_key=58402e695ba1772b1cc9309755f043251ea77fdcf10fbe63989ceb7e19321376\n\
            tx_bytes=38333\n\
            rx_bytes=2224\n\
            allowed_ip=192.168.4.6/32\n\
            persistent_keepalive_interval=111\n\
            endpoint=182.122.22.19:3233\n\
            last_handshake_time_sec=0\n\
            last_handshake_time_nsec=0\n\
            protocol_version=1\n\
            errno=0\n\n";
        let d = parse_get(answer).expect("device");
        assert_eq!(d.listen_port, 12912);
        assert!(d.public_key.is_some());
        assert_eq!(d.peers.len(), 2);
        assert_eq!(d.peers[0].allowed_ips, vec!["192.168.4.4/32".parse::<IpNet>().expect("net")]);
        assert_eq!(d.peers[0].last_handshake, Some(Duration::new(1_700_000_000, 5)));
        let p = &d.peers[1];
        assert_eq!(
            hex::encode(p.public_key.bytes()),
            "58402e695ba1772b1cc9309755f043251ea77fdcf10fbe63989ceb7e19321376"
        );
        assert_eq!((p.tx_bytes, p.rx_bytes, p.keepalive, p.last_handshake), (38333, 2224, 111, None));
        assert_eq!(p.endpoint, "182.122.22.19:3233".parse().ok());
    }

    #[test]
    fn refusals_and_garbage_are_errors() {
        assert_eq!(parse_get("errno=-22\n\n"), Err(AnswerError::Errno(22)));
        assert_eq!(errno("errno=0\n\n"), Ok(0));
        assert!(matches!(parse_get("listen_port\nerrno=0\n\n"), Err(AnswerError::Malformed(_))));
        assert!(matches!(parse_get("listen_port=1\n"), Err(AnswerError::Malformed(_))));
    }
}
