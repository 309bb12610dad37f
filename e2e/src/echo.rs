//! The pods' echo server: every TCP connection and every UDP datagram is answered with the
//! pod's name and the source address and port the pod saw, `game-0 198.51.100.7:40211\n`.
//!
//! The sockets are made on a thread inside the pod's namespace and served by a tokio runtime
//! anywhere: a socket stays in the namespace it was made in.
//!
//! Both families on one socket per port: IPv6 sockets on `[::]` with `IPV6_V6ONLY` off, so
//! IPv4 peers arrive as IPv4-mapped addresses; the answer names them as IPv4
//! (`198.51.100.7:40211`, never `[::ffff:198.51.100.7]:40211`), IPv6 peers as
//! `[2001:db8:100::7]:40211`. Where the kernel has no IPv6, IPv4 sockets as before.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener, UdpSocket};
use std::os::fd::OwnedFd;
use std::path::Path;

use anyhow::Context as _;
use tokio::io::AsyncWriteExt as _;
use tokio::task::JoinSet;

use crate::sys::in_netns;
use crate::topology::Ports;

/// One pod's server; dropping it stops it and closes its sockets.
pub struct PodServer {
    tasks: JoinSet<()>,
}

impl PodServer {
    /// Binds every port in the namespace at `netns` and serves them on `rt`.
    pub fn start(
        rt: &tokio::runtime::Handle,
        netns: &Path,
        pod: &str,
        tcp: &[Ports],
        udp: &[Ports],
    ) -> anyhow::Result<PodServer> {
        let (listeners, sockets) = in_netns(netns, || {
            let mut listeners = Vec::new();
            for p in tcp.iter().flat_map(Ports::iter) {
                let l = TcpListener::from(
                    dual_socket(SocketType::STREAM, p)
                        .map_err(|e| std::io::Error::new(e.kind(), format!("tcp {p}: {e}")))?,
                );
                l.set_nonblocking(true)?;
                listeners.push(l);
            }
            let mut sockets = Vec::new();
            for p in udp.iter().flat_map(Ports::iter) {
                let s = UdpSocket::from(
                    dual_socket(SocketType::DGRAM, p)
                        .map_err(|e| std::io::Error::new(e.kind(), format!("udp {p}: {e}")))?,
                );
                s.set_nonblocking(true)?;
                sockets.push(s);
            }
            Ok((listeners, sockets))
        })
        .with_context(|| format!("echo server of pod {pod}"))?;
        let _guard = rt.enter();
        let mut tasks = JoinSet::new();
        for l in listeners {
            let l = tokio::net::TcpListener::from_std(l).context("registering a listener")?;
            let pod = pod.to_string();
            tasks.spawn_on(
                async move {
                    while let Ok((mut stream, peer)) = l.accept().await {
                        let line = answer(&pod, peer);
                        let _ = stream.write_all(line.as_bytes()).await;
                        let _ = stream.shutdown().await;
                    }
                },
                rt,
            );
        }
        for s in sockets {
            let s = tokio::net::UdpSocket::from_std(s).context("registering a socket")?;
            let pod = pod.to_string();
            tasks.spawn_on(
                async move {
                    let mut buf = [0u8; 2048];
                    loop {
                        match s.recv_from(&mut buf).await {
                            Ok((_, peer)) => {
                                let _ = s.send_to(answer(&pod, peer).as_bytes(), peer).await;
                            }
                            // ICMP errors surface here on some kernels; keep serving.
                            Err(_) => tokio::task::yield_now().await,
                        }
                    }
                },
                rt,
            );
        }
        Ok(PodServer { tasks })
    }

    /// Stops serving (also on drop).
    pub fn stop(mut self) {
        self.tasks.abort_all();
    }
}

use rustix::net::SocketType;

/// A socket bound to port `port` of both families (listening, for a stream): IPv6 on `[::]`
/// with `IPV6_V6ONLY` off; IPv4 on `0.0.0.0` where the kernel has no IPv6.
fn dual_socket(kind: SocketType, port: u16) -> std::io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, bind, listen, socket, sockopt};
    let (fd, v6) = match socket(AddressFamily::INET6, kind, None) {
        Ok(fd) => (fd, true),
        Err(rustix::io::Errno::AFNOSUPPORT) => (socket(AddressFamily::INET, kind, None)?, false),
        Err(e) => return Err(e.into()),
    };
    if kind == SocketType::STREAM {
        // As std's TcpListener::bind: a restarted server binds while old connections linger.
        sockopt::set_socket_reuseaddr(&fd, true)?;
    }
    if v6 {
        sockopt::set_ipv6_v6only(&fd, false)?;
        bind(&fd, &SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0))?;
    } else {
        bind(&fd, &SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))?;
    }
    if kind == SocketType::STREAM {
        listen(&fd, 128)?;
    }
    Ok(fd)
}

/// A peer as the answer names it: IPv4-mapped IPv6 addresses as the IPv4 ones they carry.
pub fn unmapped(peer: SocketAddr) -> SocketAddr {
    match peer {
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddrV4::new(v4, a.port()).into(),
            None => peer,
        },
        SocketAddr::V4(_) => peer,
    }
}

/// The answer line for a peer.
pub fn answer(pod: &str, peer: SocketAddr) -> String {
    format!("{pod} {}\n", unmapped(peer))
}

/// Parses an answer line into (pod, IPv4 address the pod saw); None for an IPv6 one.
pub fn parse_answer(text: &str) -> Option<(String, SocketAddrV4)> {
    let mut words = text.split_whitespace();
    let pod = words.next()?.to_string();
    let seen = words.next()?.parse().ok()?;
    words.next().is_none().then_some((pod, seen))
}

/// Parses an answer line into (pod, address of either family the pod saw).
pub fn parse_answer_any(text: &str) -> Option<(String, SocketAddr)> {
    let mut words = text.split_whitespace();
    let pod = words.next()?.to_string();
    let seen = words.next()?.parse().ok()?;
    words.next().is_none().then_some((pod, seen))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip() {
        let peer: SocketAddr = "198.51.100.7:40211".parse().unwrap();
        let line = answer("game-0", peer);
        assert_eq!(line, "game-0 198.51.100.7:40211\n");
        assert_eq!(parse_answer(&line), Some(("game-0".into(), "198.51.100.7:40211".parse().unwrap())));
        assert_eq!(parse_answer("x"), None);
    }

    #[test]
    fn answers_name_ipv4_peers_unmapped_and_ipv6_in_brackets() {
        let mapped: SocketAddr = "[::ffff:198.51.100.7]:40211".parse().unwrap();
        assert_eq!(answer("game-0", mapped), "game-0 198.51.100.7:40211\n");
        let v6: SocketAddr = "[2001:db8:100::7]:40211".parse().unwrap();
        let line = answer("game-0", v6);
        assert_eq!(line, "game-0 [2001:db8:100::7]:40211\n");
        assert_eq!(parse_answer_any(&line), Some(("game-0".into(), v6)));
        assert_eq!(parse_answer(&line), None, "the IPv4 parser takes no IPv6 answer");
        assert_eq!(parse_answer_any("game-0 198.51.100.7:40211\n"), Some(("game-0".into(), unmapped(mapped))));
    }
}
