//! The probe: dial an address from inside a host's namespace and report what the pod saw and
//! where the answer came from.
//!
//! TCP: the connection's peer is by definition the address dialed (the kernel matches the
//! SYN-ACK to it), so a reply from anywhere else shows as a connection that never completes.
//! UDP: the socket is not connected, so a reply from any source is received and reported as
//! it came.

use std::fmt;
use std::io::{self, Read as _};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::echo::parse_answer;
use crate::sys::in_netns;
use crate::topology::Protocol;

/// What a probe that got an answer saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub protocol: Protocol,
    /// Where the probe was sent.
    pub dialed: SocketAddrV4,
    /// The pod that answered.
    pub pod: String,
    /// The source address and port the pod saw.
    pub seen: SocketAddrV4,
    /// The source of the reply.
    pub reply_from: SocketAddrV4,
    /// The probe's own socket: its port is what the pod should see (its address is 0.0.0.0
    /// for UDP, whose socket is unbound).
    pub local: SocketAddrV4,
    pub elapsed: Duration,
}

impl fmt::Display for Answer {
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
    in_netns(netns, || Ok(probe_here(to, protocol, timeout))).unwrap_or_else(|e| Err(ProbeError::Io(e.to_string())))
}

fn v4(a: SocketAddr) -> SocketAddrV4 {
    match a {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => SocketAddrV4::new(a.ip().to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED), a.port()),
    }
}

fn probe_here(to: SocketAddrV4, protocol: Protocol, timeout: Duration) -> Result<Answer, ProbeError> {
    let start = Instant::now();
    let io_err = |e: io::Error| match e.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => {
            ProbeError::Refused { after: start.elapsed() }
        }
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ProbeError::NoAnswer { waited: start.elapsed() },
        _ => match e.raw_os_error() {
            // Host or network unreachable: an ICMP error answered.
            Some(libc::EHOSTUNREACH | libc::ENETUNREACH) => ProbeError::Refused { after: start.elapsed() },
            _ => ProbeError::Io(e.to_string()),
        },
    };
    let (text, reply_from, local) = match protocol {
        Protocol::Tcp => {
            let mut s = TcpStream::connect_timeout(&to.into(), timeout).map_err(io_err)?;
            let left = timeout.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
            s.set_read_timeout(Some(left)).map_err(io_err)?;
            let mut text = String::new();
            s.read_to_string(&mut text).map_err(io_err)?;
            (text, v4(s.peer_addr().map_err(io_err)?), v4(s.local_addr().map_err(io_err)?))
        }
        Protocol::Udp => {
            let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)).map_err(io_err)?;
            s.set_read_timeout(Some(timeout)).map_err(io_err)?;
            s.send_to(b"probe\n", to).map_err(io_err)?;
            let mut buf = [0u8; 512];
            let (n, from) = s.recv_from(&mut buf).map_err(io_err)?;
            (String::from_utf8_lossy(&buf[..n]).into_owned(), v4(from), v4(s.local_addr().map_err(io_err)?))
        }
    };
    let (pod, seen) = parse_answer(&text).ok_or_else(|| ProbeError::Garbled(text.clone()))?;
    Ok(Answer { protocol, dialed: to, pod, seen, reply_from, local, elapsed: start.elapsed() })
}
