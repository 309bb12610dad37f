//! The kernel backend: the link made with rtnetlink (`RTM_NEWLINK`, kind `wireguard`) and
//! configured through the generic-netlink family "wireguard" (include/uapi/linux/wireguard.h):
//! `WG_CMD_GET_DEVICE` (a dump: a device's peers may span messages, and one peer's allowed IPs
//! too) and `WG_CMD_SET_DEVICE`. Peers change one by one: `WGPEER_F_UPDATE_ONLY` for an
//! update, `WGPEER_F_REPLACE_ALLOWEDIPS` before a peer's new list (its own only),
//! `WGPEER_F_REMOVE_ME`; `WGDEVICE_F_REPLACE_PEERS` is never sent.
//!
//! The messages are written with the crate's own netlink codec ([`crate::sys::netlink`]), as
//! nf_tables' are, and unit-tested byte for byte against the header's layout. This machine has
//! no WireGuard module: the root tests meet the real one in Debian's kernel under QEMU
//! (e2e/vm/wireguard.sh, docs/overlay/node.md, "Proven in a real kernel").

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;

use super::key::{KEY_LEN, PublicKey};
use super::model::{Device, DeviceConfig, Peer, PeerChange};
use super::{Backend, BackendKind, Error};
use crate::sys::netlink::attr::{self, Attr, AttrWriter};
use crate::sys::netlink::consts::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use crate::sys::netlink::{Request, Socket};

// --- include/uapi/linux/netlink.h, rtnetlink.h, if_link.h, genetlink.h ----------------------
pub const NETLINK_ROUTE: i32 = 0;
pub const NETLINK_GENERIC: i32 = 16;
pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_GETLINK: u16 = 18;
pub const IFLA_IFNAME: u16 = 3;
pub const IFLA_LINKINFO: u16 = 18;
pub const IFLA_INFO_KIND: u16 = 1;
pub const GENL_ID_CTRL: u16 = 0x10;
pub const CTRL_CMD_GETFAMILY: u8 = 3;
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;

// --- include/uapi/linux/wireguard.h -------------------------------------------------------
pub const WG_GENL_NAME: &str = "wireguard";
pub const WG_GENL_VERSION: u8 = 1;
pub const WG_CMD_GET_DEVICE: u8 = 0;
pub const WG_CMD_SET_DEVICE: u8 = 1;
pub const WGDEVICE_A_IFINDEX: u16 = 1;
pub const WGDEVICE_A_IFNAME: u16 = 2;
pub const WGDEVICE_A_PRIVATE_KEY: u16 = 3;
pub const WGDEVICE_A_PUBLIC_KEY: u16 = 4;
pub const WGDEVICE_A_FLAGS: u16 = 5;
pub const WGDEVICE_A_LISTEN_PORT: u16 = 6;
pub const WGDEVICE_A_FWMARK: u16 = 7;
pub const WGDEVICE_A_PEERS: u16 = 8;
pub const WGDEVICE_F_REPLACE_PEERS: u32 = 1 << 0;
pub const WGPEER_A_PUBLIC_KEY: u16 = 1;
pub const WGPEER_A_PRESHARED_KEY: u16 = 2;
pub const WGPEER_A_FLAGS: u16 = 3;
pub const WGPEER_A_ENDPOINT: u16 = 4;
pub const WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL: u16 = 5;
pub const WGPEER_A_LAST_HANDSHAKE_TIME: u16 = 6;
pub const WGPEER_A_RX_BYTES: u16 = 7;
pub const WGPEER_A_TX_BYTES: u16 = 8;
pub const WGPEER_A_ALLOWEDIPS: u16 = 9;
pub const WGPEER_A_PROTOCOL_VERSION: u16 = 10;
pub const WGPEER_F_REMOVE_ME: u32 = 1 << 0;
pub const WGPEER_F_REPLACE_ALLOWEDIPS: u32 = 1 << 1;
pub const WGPEER_F_UPDATE_ONLY: u32 = 1 << 2;
pub const WGALLOWEDIP_A_FAMILY: u16 = 1;
pub const WGALLOWEDIP_A_IPADDR: u16 = 2;
pub const WGALLOWEDIP_A_CIDR_MASK: u16 = 3;

/// A set message's attributes stay under this (a nest's length is 16 bits; wg cuts at a page).
pub const MESSAGE_BUDGET: usize = 16 * 1024;
/// A peer's allowed IPs per message; more continue in the next, appended (update only).
const IPS_PER_CHUNK: usize = 256;

/// The generic-netlink header (struct genlmsghdr): command, version, reserved.
pub fn genl_header(cmd: u8, version: u8) -> [u8; 4] {
    [cmd, version, 0, 0]
}

/// struct ifinfomsg for a link named by its attributes: family, type, index, flags, change 0.
pub const IFINFOMSG: [u8; 16] = [0; 16];

/// RTM_NEWLINK's attributes for a WireGuard link `name` (created down; the executor sets its
/// MTU and brings it up).
pub fn newlink_attrs(name: &str) -> Vec<u8> {
    let mut w = AttrWriter::new();
    w.put_str(IFLA_IFNAME, name);
    let info = w.begin(IFLA_LINKINFO);
    w.put_str(IFLA_INFO_KIND, WG_GENL_NAME);
    w.end(info);
    w.buf
}

/// RTM_DELLINK's attributes for link `name`.
pub fn dellink_attrs(name: &str) -> Vec<u8> {
    let mut w = AttrWriter::new();
    w.put_str(IFLA_IFNAME, name);
    w.buf
}

/// CTRL_CMD_GETFAMILY's attributes for the WireGuard family.
pub fn getfamily_attrs() -> Vec<u8> {
    let mut w = AttrWriter::new();
    w.put_str(CTRL_ATTR_FAMILY_NAME, WG_GENL_NAME);
    w.buf
}

/// WG_CMD_GET_DEVICE's attributes for device `name`.
pub fn get_attrs(name: &str) -> Vec<u8> {
    let mut w = AttrWriter::new();
    w.put_str(WGDEVICE_A_IFNAME, name);
    w.buf
}

/// struct sockaddr_in / sockaddr_in6: the family in host order, the port in network order.
pub fn sockaddr(e: &SocketAddr) -> Vec<u8> {
    let mut b = Vec::with_capacity(28);
    match e {
        SocketAddr::V4(a) => {
            b.extend_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            b.extend_from_slice(&port_bytes(a.port()));
            b.extend_from_slice(&a.ip().octets());
            b.extend_from_slice(&[0; 8]);
        }
        SocketAddr::V6(a) => {
            b.extend_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            b.extend_from_slice(&port_bytes(a.port()));
            b.extend_from_slice(&a.flowinfo().to_be_bytes());
            b.extend_from_slice(&a.ip().octets());
            b.extend_from_slice(&a.scope_id().to_ne_bytes());
        }
    }
    b
}

/// A sockaddr's port: network byte order.
#[cfg(not(feature = "wireguard-ablation"))]
fn port_bytes(port: u16) -> [u8; 2] {
    port.to_be_bytes()
}

/// The ablation (feature `wireguard-ablation`, e2e/vm/wireguard.sh only): host byte order, so
/// every peer's endpoint is wrong and the VM's tests must fail.
#[cfg(feature = "wireguard-ablation")]
fn port_bytes(port: u16) -> [u8; 2] {
    port.to_ne_bytes()
}

fn parse_sockaddr(d: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes(d.get(..2)?.try_into().ok()?));
    let port = u16::from_be_bytes(d.get(2..4)?.try_into().ok()?);
    match family {
        libc::AF_INET => {
            let ip: [u8; 4] = d.get(4..8)?.try_into().ok()?;
            Some(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port)))
        }
        libc::AF_INET6 => {
            let flow = u32::from_be_bytes(d.get(4..8)?.try_into().ok()?);
            let ip: [u8; 16] = d.get(8..24)?.try_into().ok()?;
            let scope = u32::from_ne_bytes(d.get(24..28)?.try_into().ok()?);
            Some(SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, flow, scope)))
        }
        _ => None,
    }
}

/// One peer nest: the key, the flags, then what `put` adds, then the allowed IPs given.
fn peer_nest(
    w: &mut AttrWriter,
    key: &PublicKey,
    flags: u32,
    put: impl FnOnce(&mut AttrWriter),
    ips: Option<&[IpNet]>,
) {
    let peer = w.begin(0);
    w.put(WGPEER_A_PUBLIC_KEY, key.bytes());
    w.put(WGPEER_A_FLAGS, &flags.to_ne_bytes());
    put(w);
    if let Some(ips) = ips {
        let list = w.begin(WGPEER_A_ALLOWEDIPS);
        for ip in ips {
            let one = w.begin(0);
            match ip.addr() {
                IpAddr::V4(a) => {
                    w.put(WGALLOWEDIP_A_FAMILY, &(libc::AF_INET as u16).to_ne_bytes());
                    w.put(WGALLOWEDIP_A_IPADDR, &a.octets());
                }
                IpAddr::V6(a) => {
                    w.put(WGALLOWEDIP_A_FAMILY, &(libc::AF_INET6 as u16).to_ne_bytes());
                    w.put(WGALLOWEDIP_A_IPADDR, &a.octets());
                }
            }
            w.put(WGALLOWEDIP_A_CIDR_MASK, &[ip.prefix_len()]);
            w.end(one);
        }
        w.end(list);
    }
    w.end(peer);
}

/// The peer nests of one change, each under [`IPS_PER_CHUNK`] allowed IPs: the first replaces
/// the peer's list (when it changes), the next ones append to it (update only).
fn peer_blobs(c: &PeerChange) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let (key, mut flags, endpoint, keepalive, ips) = match c {
        PeerChange::Add(p) => {
            (p.public_key, WGPEER_F_REPLACE_ALLOWEDIPS, p.endpoint, Some(p.keepalive), Some(&p.allowed_ips[..]))
        }
        PeerChange::Update { public_key, endpoint, allowed_ips, keepalive } => {
            let replace = if allowed_ips.is_some() { WGPEER_F_REPLACE_ALLOWEDIPS } else { 0 };
            (*public_key, WGPEER_F_UPDATE_ONLY | replace, *endpoint, *keepalive, allowed_ips.as_deref())
        }
        PeerChange::Remove(k) => {
            let mut w = AttrWriter::new();
            peer_nest(&mut w, k, WGPEER_F_REMOVE_ME, |_| {}, None);
            return vec![w.buf];
        }
    };
    let mut chunks: Vec<Option<&[IpNet]>> = match ips {
        None => vec![None],
        Some([]) => vec![Some(&[][..])],
        Some(ips) => ips.chunks(IPS_PER_CHUNK).map(Some).collect(),
    };
    let first = chunks.remove(0);
    let mut w = AttrWriter::new();
    peer_nest(
        &mut w,
        &key,
        flags,
        |w| {
            if let Some(e) = endpoint {
                w.put(WGPEER_A_ENDPOINT, &sockaddr(&e));
            }
            if let Some(k) = keepalive {
                w.put(WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL, &k.to_ne_bytes());
            }
        },
        first,
    );
    out.push(w.buf);
    flags = WGPEER_F_UPDATE_ONLY;
    for more in chunks {
        let mut w = AttrWriter::new();
        peer_nest(&mut w, &key, flags, |_| {}, more);
        out.push(w.buf);
    }
    out
}

/// WG_CMD_SET_DEVICE's attributes, cut into messages of at most `budget` bytes: each names the
/// device; the first carries `config`; the peers follow in order, each in its own nest.
pub fn set_attrs(name: &str, config: &DeviceConfig, changes: &[PeerChange], budget: usize) -> Vec<Vec<u8>> {
    let head = |config: Option<&DeviceConfig>| {
        let mut w = AttrWriter::new();
        w.put_str(WGDEVICE_A_IFNAME, name);
        if let Some(c) = config {
            if let Some(k) = &c.private_key {
                w.put(WGDEVICE_A_PRIVATE_KEY, k.bytes());
            }
            if let Some(p) = c.listen_port {
                w.put(WGDEVICE_A_LISTEN_PORT, &p.to_ne_bytes());
            }
            if let Some(m) = c.fwmark {
                w.put(WGDEVICE_A_FWMARK, &m.to_ne_bytes());
            }
        }
        w
    };
    let mut messages = Vec::new();
    let mut w = head(Some(config));
    let mut peers: Option<usize> = None;
    for blob in changes.iter().flat_map(peer_blobs) {
        if peers.is_some() && w.buf.len() + blob.len() > budget {
            if let Some(at) = peers.take() {
                w.end(at);
            }
            messages.push(std::mem::take(&mut w.buf));
            w = head(None);
        }
        let at = *peers.get_or_insert_with(|| w.begin(WGDEVICE_A_PEERS));
        let _ = at;
        w.buf.extend_from_slice(&blob);
    }
    if let Some(at) = peers {
        w.end(at);
    }
    messages.push(w.buf);
    messages
}

fn u16_of(a: &Attr<'_>) -> Option<u16> {
    Some(u16::from_ne_bytes(a.data.get(..2)?.try_into().ok()?))
}
fn u32_of(a: &Attr<'_>) -> Option<u32> {
    Some(u32::from_ne_bytes(a.data.get(..4)?.try_into().ok()?))
}
fn u64_of(a: &Attr<'_>) -> Option<u64> {
    Some(u64::from_ne_bytes(a.data.get(..8)?.try_into().ok()?))
}
fn key_of(a: &Attr<'_>) -> Option<[u8; KEY_LEN]> {
    a.data.get(..KEY_LEN)?.try_into().ok()
}

/// The device in a WG_CMD_GET_DEVICE dump: each payload a genlmsghdr and attributes. A peer
/// whose key repeats the last one's continues it (its allowed IPs spanned messages).
pub fn parse_get(payloads: &[Vec<u8>]) -> Result<Device, String> {
    let mut d = Device::default();
    for p in payloads {
        let attrs = attr::parse(p.get(4..).unwrap_or_default()).map_err(|e| e.to_string())?;
        for a in &attrs {
            match a.ty {
                WGDEVICE_A_PUBLIC_KEY => {
                    d.public_key = key_of(a).filter(|k| *k != [0; KEY_LEN]).map(PublicKey);
                }
                WGDEVICE_A_LISTEN_PORT => d.listen_port = u16_of(a).ok_or("short listen port")?,
                WGDEVICE_A_FWMARK => d.fwmark = u32_of(a).ok_or("short fwmark")?,
                WGDEVICE_A_PEERS => {
                    for nest in attr::parse(a.data).map_err(|e| e.to_string())? {
                        let peer = parse_peer(nest.data)?;
                        match d.peers.last_mut() {
                            Some(last) if last.public_key == peer.public_key => {
                                last.allowed_ips.extend(peer.allowed_ips)
                            }
                            _ => d.peers.push(peer),
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(d)
}

fn parse_peer(data: &[u8]) -> Result<Peer, String> {
    let attrs = attr::parse(data).map_err(|e| e.to_string())?;
    let key = attr::find(&attrs, WGPEER_A_PUBLIC_KEY).and_then(key_of).ok_or("a peer without a public key")?;
    let mut p = Peer::new(PublicKey(key));
    for a in &attrs {
        match a.ty {
            WGPEER_A_ENDPOINT => p.endpoint = parse_sockaddr(a.data),
            WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL => p.keepalive = u16_of(a).ok_or("short keepalive")?,
            WGPEER_A_LAST_HANDSHAKE_TIME => {
                let secs = u64_of(a).ok_or("short handshake time")?;
                let nanos = a.data.get(8..16).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes).unwrap_or(0);
                p.last_handshake =
                    (secs != 0 || nanos != 0).then(|| Duration::from_secs(secs) + Duration::from_nanos(nanos));
            }
            WGPEER_A_RX_BYTES => p.rx_bytes = u64_of(a).ok_or("short rx bytes")?,
            WGPEER_A_TX_BYTES => p.tx_bytes = u64_of(a).ok_or("short tx bytes")?,
            WGPEER_A_ALLOWEDIPS => {
                for ip in attr::parse(a.data).map_err(|e| e.to_string())? {
                    let ip = attr::parse(ip.data).map_err(|e| e.to_string())?;
                    let mask = attr::find(&ip, WGALLOWEDIP_A_CIDR_MASK).and_then(|m| m.data.first().copied());
                    let addr = attr::find(&ip, WGALLOWEDIP_A_IPADDR).map(|a| a.data);
                    let net = match (addr, mask) {
                        (Some(b), Some(m)) if b.len() == 4 => {
                            let o: [u8; 4] = b.try_into().map_err(|_| "address")?;
                            IpNet::new(IpAddr::from(o), m).ok()
                        }
                        (Some(b), Some(m)) if b.len() == 16 => {
                            let o: [u8; 16] = b.try_into().map_err(|_| "address")?;
                            IpNet::new(IpAddr::from(o), m).ok()
                        }
                        _ => None,
                    };
                    p.allowed_ips.push(net.ok_or("a malformed allowed IP")?);
                }
            }
            _ => {}
        }
    }
    Ok(p)
}

fn kernel_err(name: &str, op: &'static str, e: crate::sys::Error) -> Error {
    Error::device(name, op, e)
}

/// Deletes link `name` in the calling thread's namespace (RTM_DELLINK by name); a link already
/// gone is done.
pub fn delete_link(name: &str) -> Result<(), Error> {
    let mut s = Socket::open(NETLINK_ROUTE).map_err(|e| kernel_err(name, "delete link", e))?;
    s.ask_extended_acks();
    let attrs = dellink_attrs(name);
    match s.ack(Request { ty: RTM_DELLINK, flags: 0, family_header: &IFINFOMSG, attrs: &attrs }) {
        Ok(()) => Ok(()),
        Err(e) if e.errno() == Some(libc::ENODEV) => Ok(()),
        Err(e) => Err(kernel_err(name, "delete link", e)),
    }
}

/// The kind of link `name` in the calling thread's namespace (`IFLA_INFO_KIND`: `wireguard`,
/// `tun`, ...), asked for that link alone (RTM_GETLINK by name); None when there is no such
/// link, Some("") for one without a kind. What the probe loop asks twice a second: one link,
/// not a dump of the namespace's links.
pub fn link_kind(name: &str) -> Result<Option<String>, Error> {
    let mut s = Socket::open(NETLINK_ROUTE).map_err(|e| kernel_err(name, "get link", e))?;
    s.ask_extended_acks();
    let attrs = dellink_attrs(name);
    let req = Request { ty: RTM_GETLINK, flags: 0, family_header: &IFINFOMSG, attrs: &attrs };
    let got = s.dump(req, || None, |kind: &mut Option<String>, payload| *kind = Some(kind_of(payload)));
    match got {
        Ok(kind) => Ok(kind),
        Err(e) if e.errno() == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(kernel_err(name, "get link", e)),
    }
}

/// The `IFLA_INFO_KIND` of an RTM_NEWLINK payload (its ifinfomsg, then its attributes).
fn kind_of(payload: &[u8]) -> String {
    let attrs = attr::parse(payload.get(IFINFOMSG.len()..).unwrap_or_default()).unwrap_or_default();
    let info = attr::find(&attrs, IFLA_LINKINFO).and_then(|i| attr::parse(i.data).ok()).unwrap_or_default();
    attr::find(&info, IFLA_INFO_KIND)
        .map(|k| String::from_utf8_lossy(k.data.split(|b| *b == 0).next().unwrap_or_default()).into_owned())
        .unwrap_or_default()
}

/// The kernel's WireGuard.
#[derive(Debug, Default)]
pub struct Kernel;

impl Kernel {
    /// The family id of "wireguard" and a socket to talk to it, in the calling thread's
    /// namespace.
    fn family(name: &str) -> Result<(Socket, u16), Error> {
        let mut s = Socket::open(NETLINK_GENERIC).map_err(|e| kernel_err(name, "generic netlink", e))?;
        s.ask_extended_acks();
        let attrs = getfamily_attrs();
        let req =
            Request { ty: GENL_ID_CTRL, flags: 0, family_header: &genl_header(CTRL_CMD_GETFAMILY, 1), attrs: &attrs };
        let id = s.dump(
            req,
            || None,
            |id: &mut Option<u16>, payload| {
                if let Ok(attrs) = attr::parse(payload.get(4..).unwrap_or_default()) {
                    *id = attr::find(&attrs, CTRL_ATTR_FAMILY_ID).and_then(u16_of).or(*id);
                }
            },
        );
        match id {
            Ok(Some(id)) => Ok((s, id)),
            Ok(None) => Err(Error::device(name, "resolving the wireguard family", "no family id in the answer")),
            Err(e) if e.errno() == Some(libc::ENOENT) => Err(Error::Unsupported { device: name.to_string() }),
            Err(e) => Err(kernel_err(name, "resolving the wireguard family", e)),
        }
    }

    fn set(&self, name: &str, config: &DeviceConfig, changes: &[PeerChange]) -> Result<(), Error> {
        let (mut s, family) = Kernel::family(name)?;
        let header = genl_header(WG_CMD_SET_DEVICE, WG_GENL_VERSION);
        for attrs in set_attrs(name, config, changes, MESSAGE_BUDGET) {
            s.ack(Request { ty: family, flags: 0, family_header: &header, attrs: &attrs })
                .map_err(|e| kernel_err(name, "set device", e))?;
        }
        Ok(())
    }
}

impl Backend for Kernel {
    fn kind(&self) -> BackendKind {
        BackendKind::Kernel
    }

    fn create(&self, _netns: Option<&Path>, name: &str) -> Result<(), Error> {
        let mut s = Socket::open(NETLINK_ROUTE).map_err(|e| kernel_err(name, "add link", e))?;
        s.ask_extended_acks();
        let attrs = newlink_attrs(name);
        let req =
            Request { ty: RTM_NEWLINK, flags: NLM_F_CREATE | NLM_F_EXCL, family_header: &IFINFOMSG, attrs: &attrs };
        match s.ack(req) {
            Ok(()) => Ok(()),
            Err(e) if e.errno() == Some(libc::EOPNOTSUPP) => Err(Error::Unsupported { device: name.to_string() }),
            Err(e) => Err(kernel_err(name, "add link", e)),
        }
    }

    fn read(&self, name: &str) -> Result<Option<Device>, Error> {
        let (mut s, family) = match Kernel::family(name) {
            Ok(f) => f,
            Err(Error::Unsupported { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let attrs = get_attrs(name);
        let header = genl_header(WG_CMD_GET_DEVICE, WG_GENL_VERSION);
        let req = Request { ty: family, flags: NLM_F_DUMP, family_header: &header, attrs: &attrs };
        match s.dump(req, Vec::new, |all: &mut Vec<Vec<u8>>, p| all.push(p.to_vec())) {
            Ok(payloads) => parse_get(&payloads).map(Some).map_err(|e| Error::device(name, "get device", e)),
            Err(e) if e.errno() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(kernel_err(name, "get device", e)),
        }
    }

    fn configure(&self, name: &str, config: &DeviceConfig) -> Result<(), Error> {
        if config.is_empty() {
            return Ok(());
        }
        self.set(name, config, &[])
    }

    fn apply_peers(&self, name: &str, changes: &[PeerChange]) -> Result<(), Error> {
        if changes.is_empty() {
            return Ok(());
        }
        self.set(name, &DeviceConfig::default(), changes)
    }

    fn delete(&self, name: &str) -> Result<(), Error> {
        delete_link(name)
    }
}

// The expected bytes below are written from include/uapi/linux/wireguard.h and netlink's
// attribute layout (struct nlattr: u16 length, u16 type; NLA_F_NESTED 0x8000; 4-byte padding),
// in this machine's byte order (little endian) for the host-order integers.
#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::super::PrivateKey;
    use super::super::model::PeerSpec;
    use super::*;

    fn name_attr(ty: u8) -> Vec<u8> {
        // "kup-wg\0": 4 + 7 = 11 bytes, padded to 12.
        vec![0x0b, 0, ty, 0, b'k', b'u', b'p', b'-', b'w', b'g', 0, 0]
    }

    #[test]
    fn the_link_is_created_with_kind_wireguard() {
        let mut want = name_attr(IFLA_IFNAME as u8);
        // IFLA_LINKINFO (18), nested, 20 bytes: IFLA_INFO_KIND (1) "wireguard\0", 14 bytes + 2 pad.
        want.extend_from_slice(&[0x14, 0, 0x12, 0x80, 0x0e, 0, 0x01, 0]);
        want.extend_from_slice(b"wireguard\0\0\0");
        assert_eq!(newlink_attrs("kup-wg"), want);
        assert_eq!(dellink_attrs("kup-wg"), name_attr(IFLA_IFNAME as u8));
        let mut family = vec![0x0e, 0, 0x02, 0];
        family.extend_from_slice(b"wireguard\0\0\0");
        assert_eq!(getfamily_attrs(), family);
        assert_eq!(get_attrs("kup-wg"), name_attr(WGDEVICE_A_IFNAME as u8));
        assert_eq!(genl_header(WG_CMD_SET_DEVICE, WG_GENL_VERSION), [1, 1, 0, 0]);
    }

    fn key(n: u8) -> PublicKey {
        PublicKey([n; 32])
    }

    fn add_one() -> PeerChange {
        PeerChange::Add(PeerSpec {
            public_key: key(1),
            endpoint: "192.0.2.1:51820".parse().ok(),
            allowed_ips: vec!["10.42.1.0/24".parse().expect("net")],
            keepalive: 25,
        })
    }

    #[test]
    fn a_set_carries_each_peer_in_its_own_nest_with_its_flags() {
        let config = DeviceConfig { private_key: None, listen_port: Some(51820), fwmark: None };
        let got = set_attrs("kup-wg", &config, &[add_one(), PeerChange::Remove(key(3))], MESSAGE_BUDGET);
        let mut want = name_attr(WGDEVICE_A_IFNAME as u8);
        // WGDEVICE_A_LISTEN_PORT (6), u16 51820 = 0xca6c.
        want.extend_from_slice(&[0x06, 0, 0x06, 0, 0x6c, 0xca, 0, 0]);
        // WGDEVICE_A_PEERS (8), nested, 160 bytes.
        want.extend_from_slice(&[0xa0, 0, 0x08, 0x80]);
        // Peer 1, nested (type 0), 108 bytes.
        want.extend_from_slice(&[0x6c, 0, 0x00, 0x80]);
        // WGPEER_A_PUBLIC_KEY (1), 32 bytes.
        want.extend_from_slice(&[0x24, 0, 0x01, 0]);
        want.extend_from_slice(&[1; 32]);
        // WGPEER_A_FLAGS (3) = WGPEER_F_REPLACE_ALLOWEDIPS.
        want.extend_from_slice(&[0x08, 0, 0x03, 0, 0x02, 0, 0, 0]);
        // WGPEER_A_ENDPOINT (4): struct sockaddr_in, AF_INET 2, port 51820 big endian, 192.0.2.1.
        want.extend_from_slice(&[0x14, 0, 0x04, 0, 0x02, 0, 0xca, 0x6c, 192, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        // WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL (5), u16 25.
        want.extend_from_slice(&[0x06, 0, 0x05, 0, 25, 0, 0, 0]);
        // WGPEER_A_ALLOWEDIPS (9), nested, 32 bytes; one allowed IP (type 0), nested, 28 bytes.
        want.extend_from_slice(&[0x20, 0, 0x09, 0x80, 0x1c, 0, 0x00, 0x80]);
        // WGALLOWEDIP_A_FAMILY (1) AF_INET, WGALLOWEDIP_A_IPADDR (2) 10.42.1.0, _CIDR_MASK (3) 24.
        want.extend_from_slice(&[0x06, 0, 0x01, 0, 0x02, 0, 0, 0]);
        want.extend_from_slice(&[0x08, 0, 0x02, 0, 10, 42, 1, 0]);
        want.extend_from_slice(&[0x05, 0, 0x03, 0, 24, 0, 0, 0]);
        // Peer 2, 48 bytes: its key and WGPEER_F_REMOVE_ME, nothing else.
        want.extend_from_slice(&[0x30, 0, 0x00, 0x80, 0x24, 0, 0x01, 0]);
        want.extend_from_slice(&[3; 32]);
        want.extend_from_slice(&[0x08, 0, 0x03, 0, 0x01, 0, 0, 0]);
        assert_eq!(got, vec![want]);
    }

    #[test]
    fn an_update_is_update_only_and_says_only_what_changes() {
        let only_keepalive =
            PeerChange::Update { public_key: key(2), endpoint: None, allowed_ips: None, keepalive: Some(0) };
        let got = set_attrs("kup-wg", &DeviceConfig::default(), &[only_keepalive], MESSAGE_BUDGET);
        let mut want = name_attr(WGDEVICE_A_IFNAME as u8);
        // WGDEVICE_A_PEERS, 60 bytes; the peer, 56: key 36, flags 8, keepalive 8.
        want.extend_from_slice(&[0x3c, 0, 0x08, 0x80, 0x38, 0, 0x00, 0x80, 0x24, 0, 0x01, 0]);
        want.extend_from_slice(&[2; 32]);
        // WGPEER_F_UPDATE_ONLY (4), no WGPEER_F_REPLACE_ALLOWEDIPS, no allowed IPs nest.
        want.extend_from_slice(&[0x08, 0, 0x03, 0, 0x04, 0, 0, 0]);
        want.extend_from_slice(&[0x06, 0, 0x05, 0, 0, 0, 0, 0]);
        assert_eq!(got, vec![want]);

        // The node's key: WGDEVICE_A_PRIVATE_KEY (3), 32 bytes; WGDEVICE_A_FWMARK (7), u32.
        let config = DeviceConfig {
            private_key: Some(PrivateKey::from_bytes([9; 32])),
            listen_port: None,
            fwmark: Some(0x6b70_0001),
        };
        let got = set_attrs("kup-wg", &config, &[], MESSAGE_BUDGET);
        let mut want = name_attr(WGDEVICE_A_IFNAME as u8);
        want.extend_from_slice(&[0x24, 0, 0x03, 0]);
        want.extend_from_slice(&[9; 32]);
        want.extend_from_slice(&[0x08, 0, 0x07, 0, 0x01, 0, 0x70, 0x6b]);
        assert_eq!(got, vec![want]);
        // Never a device-wide replace.
        assert!(!got[0].windows(4).any(|w| w == [0x08, 0, WGDEVICE_A_FLAGS as u8, 0]));
    }

    #[test]
    fn large_sets_are_cut_into_messages_and_long_lists_continue_appended() {
        let many: Vec<IpNet> = (0..600u32)
            .map(|i| IpNet::new(IpAddr::from(Ipv4Addr::from(0x0a00_0000 + (i << 8))), 24).expect("net"))
            .collect();
        let change =
            PeerChange::Add(PeerSpec { public_key: key(5), endpoint: None, allowed_ips: many.clone(), keepalive: 25 });
        let messages = set_attrs("kup-wg", &DeviceConfig::default(), &[change, add_one()], 8 * 1024);
        assert!(messages.len() >= 3, "{} messages", messages.len());
        for m in &messages {
            assert!(m.len() <= 8 * 1024 && m.starts_with(&name_attr(WGDEVICE_A_IFNAME as u8)));
        }
        // Read back as a dump would be: the pieces of peer 1 join up.
        let payloads: Vec<Vec<u8>> = messages.iter().map(|m| [&[0u8, 1, 0, 0][..], m].concat()).collect();
        let d = parse_get(&payloads).expect("parsed");
        assert_eq!(d.peers.len(), 2);
        assert_eq!(d.peers[0].allowed_ips, many);
        // The first piece replaces the list, the next ones only append to the same peer.
        let flags: Vec<u32> = messages
            .iter()
            .flat_map(|m| {
                let attrs = attr::parse(m).expect("attrs");
                let peers = attr::find(&attrs, WGDEVICE_A_PEERS).map(|a| a.data.to_vec()).unwrap_or_default();
                attr::parse(&peers)
                    .expect("peers")
                    .iter()
                    .filter_map(|p| {
                        attr::parse(p.data).ok().and_then(|a| attr::find(&a, WGPEER_A_FLAGS).and_then(u32_of))
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(flags[0], WGPEER_F_REPLACE_ALLOWEDIPS);
        assert!(flags[1..flags.len() - 1].iter().all(|f| *f == WGPEER_F_UPDATE_ONLY), "{flags:?}");
    }

    /// A reset ([`Backend::reset_peer`]) is one message: the peer removed, then the same key
    /// added whole, in that order (the kernel takes a message's peers in order, and no longer
    /// finds the removed one, so it creates it anew).
    #[test]
    fn a_reset_removes_then_adds_the_same_peer_in_one_message() {
        let PeerChange::Add(spec) = add_one() else { unreachable!() };
        let changes = [PeerChange::Remove(spec.public_key), PeerChange::Add(spec.clone())];
        let messages = set_attrs("kup-wg", &DeviceConfig::default(), &changes, MESSAGE_BUDGET);
        assert_eq!(messages.len(), 1);
        let attrs = attr::parse(&messages[0]).expect("attrs");
        let peers = attr::find(&attrs, WGDEVICE_A_PEERS).map(|a| a.data.to_vec()).expect("peers");
        let nests: Vec<(Vec<u8>, u32)> = attr::parse(&peers)
            .expect("peers")
            .iter()
            .map(|p| {
                let a = attr::parse(p.data).expect("peer");
                let key = attr::find(&a, WGPEER_A_PUBLIC_KEY).map(|k| k.data.to_vec()).expect("key");
                (key, attr::find(&a, WGPEER_A_FLAGS).and_then(u32_of).expect("flags"))
            })
            .collect();
        assert_eq!(nests, vec![(vec![1; 32], WGPEER_F_REMOVE_ME), (vec![1; 32], WGPEER_F_REPLACE_ALLOWEDIPS)]);
    }

    #[test]
    fn a_links_kind_is_read_from_its_link_info() {
        let mut w = AttrWriter::new();
        w.put_str(IFLA_IFNAME, "kup-wg");
        let info = w.begin(IFLA_LINKINFO);
        w.put_str(IFLA_INFO_KIND, "tun");
        w.end(info);
        assert_eq!(kind_of(&[&IFINFOMSG[..], &w.buf].concat()), "tun");
        assert_eq!(kind_of(&[&IFINFOMSG[..], &name_attr(IFLA_IFNAME as u8)].concat()), "");
        assert_eq!(kind_of(&[]), "");
    }

    #[test]
    fn a_get_dump_parses_into_the_device() {
        let mut w = AttrWriter::new();
        w.put(WGDEVICE_A_IFINDEX, &7u32.to_ne_bytes());
        w.put_str(WGDEVICE_A_IFNAME, "kup-wg");
        w.put(WGDEVICE_A_PRIVATE_KEY, &[9; 32]);
        w.put(WGDEVICE_A_PUBLIC_KEY, &[8; 32]);
        w.put(WGDEVICE_A_LISTEN_PORT, &51820u16.to_ne_bytes());
        w.put(WGDEVICE_A_FWMARK, &0u32.to_ne_bytes());
        let peers = w.begin(WGDEVICE_A_PEERS);
        let peer = w.begin(0);
        w.put(WGPEER_A_PUBLIC_KEY, &[1; 32]);
        w.put(WGPEER_A_PRESHARED_KEY, &[0; 32]);
        w.put(WGPEER_A_ENDPOINT, &sockaddr(&"[2001:db8::1]:51820".parse().expect("ep")));
        w.put(WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL, &25u16.to_ne_bytes());
        // struct __kernel_timespec: s64 seconds, s64 nanoseconds.
        w.put(WGPEER_A_LAST_HANDSHAKE_TIME, &[1_700_000_000i64.to_ne_bytes(), 5i64.to_ne_bytes()].concat());
        w.put(WGPEER_A_RX_BYTES, &2224u64.to_ne_bytes());
        w.put(WGPEER_A_TX_BYTES, &38333u64.to_ne_bytes());
        let ips = w.begin(WGPEER_A_ALLOWEDIPS);
        let ip = w.begin(0);
        w.put(WGALLOWEDIP_A_FAMILY, &(libc::AF_INET6 as u16).to_ne_bytes());
        w.put(WGALLOWEDIP_A_IPADDR, &"fd00::".parse::<Ipv6Addr>().expect("v6").octets());
        w.put(WGALLOWEDIP_A_CIDR_MASK, &[64]);
        w.end(ip);
        w.end(ips);
        w.put(WGPEER_A_PROTOCOL_VERSION, &1u32.to_ne_bytes());
        w.end(peer);
        w.end(peers);
        let payload = [&genl_header(WG_CMD_GET_DEVICE, 1)[..], &w.buf].concat();
        let d = parse_get(&[payload]).expect("device");
        assert_eq!((d.public_key, d.listen_port, d.fwmark), (Some(key(8)), 51820, 0));
        let p = &d.peers[0];
        assert_eq!(p.public_key, key(1));
        assert_eq!(p.endpoint, "[2001:db8::1]:51820".parse().ok());
        assert_eq!((p.keepalive, p.rx_bytes, p.tx_bytes), (25, 2224, 38333));
        assert_eq!(p.last_handshake, Some(Duration::new(1_700_000_000, 5)));
        assert_eq!(p.allowed_ips, vec!["fd00::/64".parse::<IpNet>().expect("net")]);
    }
}
