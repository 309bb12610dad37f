//! The pods' echo server: every TCP connection and every UDP datagram is answered with the
//! pod's name and the source address and port the pod saw, `game-0 198.51.100.7:40211\n`.
//!
//! The sockets are made on a thread inside the pod's namespace and served by a tokio runtime
//! anywhere: a socket stays in the namespace it was made in.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, UdpSocket};
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
            let any = |p| SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, p);
            let mut listeners = Vec::new();
            for p in tcp.iter().flat_map(Ports::iter) {
                let l =
                    TcpListener::bind(any(p)).map_err(|e| std::io::Error::new(e.kind(), format!("tcp {p}: {e}")))?;
                l.set_nonblocking(true)?;
                listeners.push(l);
            }
            let mut sockets = Vec::new();
            for p in udp.iter().flat_map(Ports::iter) {
                let s = UdpSocket::bind(any(p)).map_err(|e| std::io::Error::new(e.kind(), format!("udp {p}: {e}")))?;
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

/// The answer line for a peer.
pub fn answer(pod: &str, peer: SocketAddr) -> String {
    format!("{pod} {peer}\n")
}

/// Parses an answer line into (pod, address the pod saw).
pub fn parse_answer(text: &str) -> Option<(String, SocketAddrV4)> {
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
}
