//! A WireGuard device as the wire carries it, with its peers in a persistent map: every
//! member of a mesh holds a peer for every other, so the controller's node states share the
//! entries they have in common instead of each holding its own copy, and a change copies only
//! the path to the entries it touched (docs/decisions.md, "Peers shared between states").
//!
//! The encoding is the one `state.proto` declares (`WireguardDevice`); the type is written here
//! because prost can only generate a `Vec` for a repeated field.

use std::fmt;
use std::sync::Arc;

use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, message, skip_field, string, uint32};
use prost::{DecodeError, Message};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::v1::WireguardPeer;

/// A device and its peers (`kuport.v1.WireguardDevice`).
#[derive(Clone, Default, PartialEq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireguardDevice {
    /// The interface name, under kuport's link prefix (`kup-wg`).
    pub name: String,
    /// 0 keeps the device's own (1420).
    pub mtu: u32,
    /// The UDP port it listens on; 0 lets the device choose.
    pub listen_port: u32,
    /// The firewall mark of its encrypted packets; 0 for none.
    pub fwmark: u32,
    pub peers: Peers,
}

/// A device's peers by public key, each once (a key listed twice on the wire keeps its last
/// entry, as protobuf's maps do), in canonical order (by key; each peer's allowed
/// IPs ordered and without repeats), shared: a clone costs a pointer. Their digest
/// ([`Peers::digest`]) is kept as they change.
#[derive(Clone, Default, Eq)]
pub struct Peers {
    /// Keys shared too: a change copies the path to its entry, and a copied node's keys cost
    /// a reference count each, not a string.
    map: imbl::OrdMap<Arc<str>, Arc<WireguardPeer>>,
    sum: Sum,
}

impl PartialEq for Peers {
    /// The digests first: two maps that differ almost always differ there.
    fn eq(&self, other: &Self) -> bool {
        self.sum == other.sum && self.map == other.map
    }
}

/// The sum of the peers' digests, in four 64-bit lanes, each modulo 2^64: a peer in or out
/// adds or takes away its own, so the digest follows a change in its size.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct Sum([u64; 4]);

impl Sum {
    fn of(peer: &WireguardPeer) -> [u64; 4] {
        use sha2::{Digest, Sha256};
        let d = Sha256::digest(peer.encode_to_vec());
        std::array::from_fn(|i| {
            let mut lane = [0u8; 8];
            lane.copy_from_slice(&d[i * 8..i * 8 + 8]);
            u64::from_le_bytes(lane)
        })
    }

    fn add(&mut self, peer: &WireguardPeer) {
        for (s, d) in self.0.iter_mut().zip(Sum::of(peer)) {
            *s = s.wrapping_add(d);
        }
    }

    fn sub(&mut self, peer: &WireguardPeer) {
        for (s, d) in self.0.iter_mut().zip(Sum::of(peer)) {
            *s = s.wrapping_sub(d);
        }
    }
}

impl Peers {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// A digest of every peer: the sum of each one's sha256 (of its encoding), modulo 2^64 lane
    /// by lane. A namespace's version reads it instead of the peers (`canonical::netns_version`),
    /// so a version costs what the namespace holds beside its peers. The sum is commutative, so
    /// it needs no order, and kept by every insert and removal; it detects any difference
    /// between what two honest ends hold, which is all a version is for (the executor trusts the
    /// controller's stream already).
    pub fn digest(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (chunk, lane) in out.chunks_exact_mut(8).zip(self.sum.0) {
            chunk.copy_from_slice(&lane.to_le_bytes());
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// In key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &WireguardPeer> + ExactSizeIterator {
        self.map.values().map(|p| &**p)
    }

    pub fn get(&self, public_key: &str) -> Option<&WireguardPeer> {
        self.map.get(public_key).map(|p| &**p)
    }

    /// The entry as held, to share with another device.
    pub fn get_shared(&self, public_key: &str) -> Option<&Arc<WireguardPeer>> {
        self.map.get(public_key)
    }

    /// Puts `peer` in canonical form and holds it, in place of one with the same key.
    pub fn insert(&mut self, mut peer: WireguardPeer) -> Option<Arc<WireguardPeer>> {
        crate::canonical::order_prefixes(&mut peer.allowed_ips);
        self.insert_shared(Arc::new(peer))
    }

    /// Holds an entry another device holds too; it must be canonical, as [`Peers::insert`]
    /// makes it.
    pub fn insert_shared(&mut self, peer: Arc<WireguardPeer>) -> Option<Arc<WireguardPeer>> {
        self.sum.add(&peer);
        let old = self.map.insert(Arc::from(peer.public_key.as_str()), peer);
        if let Some(old) = &old {
            self.sum.sub(old);
        }
        old
    }

    pub fn remove(&mut self, public_key: &str) -> Option<Arc<WireguardPeer>> {
        let old = self.map.remove(public_key)?;
        self.sum.sub(&old);
        Some(old)
    }

    /// Edits the peer held under `public_key` (a copy, when another device shares it), and
    /// holds it again in canonical form, under its key after the edit. False when none is held.
    pub fn update(&mut self, public_key: &str, edit: impl FnOnce(&mut WireguardPeer)) -> bool {
        let Some(entry) = self.remove(public_key) else { return false };
        let mut peer = Arc::unwrap_or_clone(entry);
        edit(&mut peer);
        self.insert(peer);
        true
    }

    /// Keeps only the peers `keep` says to.
    pub fn retain(&mut self, mut keep: impl FnMut(&WireguardPeer) -> bool) {
        let gone: Vec<Arc<str>> = self.map.iter().filter(|(_, p)| !keep(p)).map(|(k, _)| k.clone()).collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// The entries that differ between `self` and `new`: those only `self` holds, and those
    /// `new` holds that `self` does not hold the same. It skips the parts the two share, so it
    /// costs what differs, not what they hold.
    pub fn changes<'a>(&'a self, new: &'a Peers) -> (Vec<&'a WireguardPeer>, Vec<&'a WireguardPeer>) {
        use imbl::ordmap::DiffItem;
        let (mut removed, mut put) = (Vec::new(), Vec::new());
        for d in self.map.diff(&new.map) {
            match d {
                DiffItem::Add(_, p) => put.push(&**p),
                DiffItem::Update { new: (_, p), .. } => put.push(&**p),
                DiffItem::Remove(_, p) => removed.push(&**p),
            }
        }
        (removed, put)
    }
}

impl fmt::Debug for Peers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl FromIterator<WireguardPeer> for Peers {
    /// A later peer with a key already held replaces the earlier.
    fn from_iter<I: IntoIterator<Item = WireguardPeer>>(iter: I) -> Self {
        let mut peers = Peers::default();
        for p in iter {
            peers.insert(p);
        }
        peers
    }
}

impl From<Vec<WireguardPeer>> for Peers {
    fn from(v: Vec<WireguardPeer>) -> Self {
        v.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a Peers {
    type Item = &'a WireguardPeer;
    type IntoIter = Box<dyn Iterator<Item = &'a WireguardPeer> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl Serialize for Peers {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Peers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Vec::<WireguardPeer>::deserialize(d)?.into_iter().collect())
    }
}

const NAME: u32 = 1;
const MTU: u32 = 2;
const LISTEN_PORT: u32 = 3;
const FWMARK: u32 = 4;
const PEERS: u32 = 5;

impl Message for WireguardDevice {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.name.is_empty() {
            string::encode(NAME, &self.name, buf);
        }
        if self.mtu != 0 {
            uint32::encode(MTU, &self.mtu, buf);
        }
        if self.listen_port != 0 {
            uint32::encode(LISTEN_PORT, &self.listen_port, buf);
        }
        if self.fwmark != 0 {
            uint32::encode(FWMARK, &self.fwmark, buf);
        }
        for p in self.peers.iter() {
            message::encode(PEERS, p, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            NAME => string::merge(wire_type, &mut self.name, buf, ctx),
            MTU => uint32::merge(wire_type, &mut self.mtu, buf, ctx),
            LISTEN_PORT => uint32::merge(wire_type, &mut self.listen_port, buf, ctx),
            FWMARK => uint32::merge(wire_type, &mut self.fwmark, buf, ctx),
            PEERS => {
                let mut peer = WireguardPeer::default();
                message::merge(wire_type, &mut peer, buf, ctx)?;
                // A key listed twice keeps its last entry, as protobuf's maps do.
                self.peers.insert(peer);
                Ok(())
            }
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let scalar = |tag: u32, v: u32| if v == 0 { 0 } else { uint32::encoded_len(tag, &v) };
        let name = if self.name.is_empty() { 0 } else { string::encoded_len(NAME, &self.name) };
        name + scalar(MTU, self.mtu)
            + scalar(LISTEN_PORT, self.listen_port)
            + scalar(FWMARK, self.fwmark)
            + self.peers.iter().map(|p| message::encoded_len(PEERS, p)).sum::<usize>()
    }

    fn clear(&mut self) {
        *self = WireguardDevice::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generated type this one stands in for, field for field (`state.proto`).
    #[derive(Clone, PartialEq, prost::Message)]
    struct Generated {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(uint32, tag = "2")]
        mtu: u32,
        #[prost(uint32, tag = "3")]
        listen_port: u32,
        #[prost(uint32, tag = "4")]
        fwmark: u32,
        #[prost(message, repeated, tag = "5")]
        peers: Vec<WireguardPeer>,
    }

    fn peer(key: &str, ips: &[&str]) -> WireguardPeer {
        WireguardPeer {
            public_key: key.into(),
            endpoint: "192.0.2.1:51820".into(),
            allowed_ips: ips.iter().map(|s| (*s).to_string()).collect(),
            persistent_keepalive_seconds: 25,
            probe_address: "10.42.1.0".into(),
        }
    }

    #[test]
    fn encodes_as_the_generated_type_does_and_decodes_back() {
        let peers = vec![peer("a", &["10.42.1.0/24"]), peer("b", &["10.42.2.0/24", "10.42.9.1/32"])];
        let ours = WireguardDevice {
            name: "kup-wg".into(),
            mtu: 1420,
            listen_port: 51820,
            fwmark: 7,
            peers: peers.clone().into(),
        };
        let theirs = Generated { name: "kup-wg".into(), mtu: 1420, listen_port: 51820, fwmark: 7, peers };
        assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec());
        assert_eq!(ours.encoded_len(), theirs.encoded_len());
        assert_eq!(WireguardDevice::decode(theirs.encode_to_vec().as_slice()).expect("decodes"), ours);
        let empty = WireguardDevice::default();
        assert_eq!(empty.encode_to_vec(), Generated::default().encode_to_vec());
    }

    #[test]
    fn a_key_listed_twice_keeps_its_last_entry() {
        let (first, last) = (peer("a", &["10.42.1.0/24"]), peer("a", &["10.42.2.0/24"]));
        let twice = Generated { name: "kup-wg".into(), peers: vec![first.clone(), last.clone()], ..Default::default() };
        let d = WireguardDevice::decode(twice.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(d.peers.iter().collect::<Vec<_>>(), [&last]);
        let json = serde_json::to_string(&twice.peers).expect("json");
        let d: Peers = serde_json::from_str(&json).expect("json");
        assert_eq!(d.iter().collect::<Vec<_>>(), [&last]);
    }

    #[test]
    fn peers_are_held_canonical_and_a_change_costs_what_differs() {
        let mut a: Peers = vec![peer("b", &["10.42.10.0/24", "10.42.2.0/24", "10.42.2.0/24"]), peer("a", &[])].into();
        assert_eq!(a.iter().map(|p| p.public_key.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(
            a.get("b").map(|p| p.allowed_ips.clone()),
            Some(vec!["10.42.2.0/24".into(), "10.42.10.0/24".into()])
        );
        let before = a.clone();
        a.remove("a");
        a.insert(peer("c", &[]));
        let (removed, put) = before.changes(&a);
        assert_eq!(removed.iter().map(|p| p.public_key.as_str()).collect::<Vec<_>>(), ["a"]);
        assert_eq!(put.iter().map(|p| p.public_key.as_str()).collect::<Vec<_>>(), ["c"]);
        assert_eq!(before.changes(&before.clone()), (vec![], vec![]));
    }

    #[test]
    fn the_digest_follows_every_edit_and_reads_no_order() {
        let (a, b, c) = (peer("a", &["10.42.1.0/24"]), peer("b", &[]), peer("c", &[]));
        let whole: Peers = vec![a.clone(), b.clone(), c.clone()].into();
        let mut edited: Peers = vec![c.clone(), peer("d", &[]), peer("a", &["10.42.9.0/24"])].into();
        assert_ne!(edited.digest(), whole.digest());
        edited.remove("d");
        edited.insert(b.clone());
        assert!(edited.update("a", |p| p.allowed_ips = vec!["10.42.1.0/24".into()]));
        assert_eq!(edited.digest(), whole.digest());
        assert_eq!(edited, whole);
        edited.retain(|p| p.public_key != "b");
        assert_eq!(edited.digest(), Peers::from(vec![a.clone(), c.clone()]).digest());
        let mut moved = whole.clone();
        moved.update("c", |p| p.endpoint = "192.0.2.9:51820".into());
        assert_ne!(moved.digest(), whole.digest());
        assert_eq!(Peers::default().digest(), [0; 32]);
    }
}
