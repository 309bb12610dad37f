//! The large lists of a namespace's state, shared between the states that hold them until one
//! of them changes its copy (copy on write): a namespace's tables and routes, a table's sets and
//! chains, a set's elements. The controller keeps each node's parts and its assembled state,
//! the last result and the new one, and every member of a mesh holds the same filter table;
//! a copy of any of them now costs a reference count per list instead of a string per element
//! (docs/decisions.md, "A namespace's lists shared between states").
//!
//! The types are declared here, field for field as `state.proto` has them, because prost
//! generates a `Vec` for a repeated field; their encoding is prost's own (derived), as a
//! [`Shared`] list reads as a `Vec`.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::v1::{
    Address, ElementRun, IpRule, Link, Neighbour, NetnsDelta, NetnsRef, NftChain, NftElement, NftFamily, NftType,
    Route, Sysctl, UdpFlows,
};

/// A list that copies share until one changes: reading it reads the `Vec`; changing it
/// (through `&mut`) copies it first when another holds it too.
pub struct Shared<T>(Arc<Vec<T>>);

impl<T> Shared<T> {
    /// Whether the two are one list, not a copy: then they are equal without a look inside.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl<T: Clone> Shared<T> {
    /// The list itself, copied only when another holds it too.
    pub fn into_vec(self) -> Vec<T> {
        Arc::unwrap_or_clone(self.0)
    }

    /// Appends `more`; an empty list becomes `more` itself, still shared.
    pub fn append(&mut self, more: Shared<T>) {
        if self.is_empty() {
            *self = more;
        } else {
            self.extend(more);
        }
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<T> Default for Shared<T> {
    fn default() -> Self {
        Shared(Arc::new(Vec::new()))
    }
}

impl<T> Deref for Shared<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

impl<T: Clone> DerefMut for Shared<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        Arc::make_mut(&mut self.0)
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        Shared::ptr_eq(self, other) || *self.0 == *other.0
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: PartialEq> PartialEq<Vec<T>> for Shared<T> {
    fn eq(&self, other: &Vec<T>) -> bool {
        *self.0 == *other
    }
}

impl<T: PartialEq> PartialEq<Shared<T>> for Vec<T> {
    fn eq(&self, other: &Shared<T>) -> bool {
        *self == *other.0
    }
}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T> From<Vec<T>> for Shared<T> {
    fn from(v: Vec<T>) -> Self {
        Shared(Arc::new(v))
    }
}

impl<T> FromIterator<T> for Shared<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Shared(Arc::new(iter.into_iter().collect()))
    }
}

impl<'a, T> IntoIterator for &'a Shared<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'a, T: Clone> IntoIterator for &'a mut Shared<T> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        Arc::make_mut(&mut self.0).iter_mut()
    }
}

impl<T: Clone> IntoIterator for Shared<T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;
    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Shared<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Vec::<T>::deserialize(d)?.into())
    }
}

/// `kuport.v1.NetnsState`: one network namespace's part of a node state (state.proto documents
/// every field).
#[derive(Serialize, Deserialize, Clone, PartialEq, prost::Message)]
#[serde(rename_all = "camelCase")]
pub struct NetnsState {
    /// Which namespace this is; absent for the node's own (host) namespace.
    #[prost(message, optional, tag = "8")]
    pub target: Option<NetnsRef>,
    /// The sha256 (hex) of this namespace's canonical encoding with `version` and `held` cleared.
    #[prost(string, tag = "9")]
    pub version: String,
    /// On the stream only: the executor keeps what it holds at `version`.
    #[prost(bool, tag = "10")]
    pub held: bool,
    #[prost(message, repeated, tag = "2")]
    pub sysctls: Vec<Sysctl>,
    #[prost(message, repeated, tag = "3")]
    pub nft_tables: Shared<NftTable>,
    #[prost(message, repeated, tag = "4")]
    pub links: Vec<Link>,
    #[prost(message, repeated, tag = "5")]
    pub addresses: Vec<Address>,
    #[prost(message, repeated, tag = "6")]
    pub routes: Shared<Route>,
    #[prost(message, repeated, tag = "7")]
    pub ip_rules: Vec<IpRule>,
    /// Permanent neighbour entries for the far end of each link.
    #[prost(message, repeated, tag = "11")]
    pub neighbours: Vec<Neighbour>,
    /// WireGuard interfaces, after the links in an apply.
    #[prost(message, repeated, tag = "12")]
    pub wireguard_devices: Vec<crate::wireguard::WireguardDevice>,
    /// On the stream only: this namespace as a change to the version the executor holds.
    #[prost(message, optional, tag = "13")]
    pub delta: Option<NetnsDelta>,
}

/// `kuport.v1.NftTable`.
#[derive(Serialize, Deserialize, Clone, PartialEq, prost::Message)]
#[serde(rename_all = "camelCase")]
pub struct NftTable {
    #[prost(enumeration = "NftFamily", tag = "1")]
    pub family: i32,
    #[prost(string, tag = "2")]
    pub name: String,
    /// Sets and maps, by name.
    #[prost(message, repeated, tag = "3")]
    pub sets: Shared<NftSet>,
    /// Chains, by name.
    #[prost(message, repeated, tag = "4")]
    pub chains: Shared<NftChain>,
}

/// `kuport.v1.NftSet`.
#[derive(Serialize, Deserialize, Clone, PartialEq, prost::Message)]
#[serde(rename_all = "camelCase")]
pub struct NftSet {
    #[prost(string, tag = "1")]
    pub name: String,
    /// The key's components in concatenation order.
    #[prost(enumeration = "NftType", repeated, tag = "2")]
    pub key: Vec<i32>,
    /// Empty for a set; the data's components for a map.
    #[prost(enumeration = "NftType", repeated, tag = "3")]
    pub data: Vec<i32>,
    /// `flags interval`.
    #[prost(bool, tag = "4")]
    pub interval: bool,
    /// Per-element counters.
    #[prost(bool, tag = "5")]
    pub counter: bool,
    /// Elements in canonical order.
    #[prost(message, repeated, tag = "6")]
    pub elements: Shared<NftElement>,
    /// The sha256 of the set's runs (`crate::canonical`).
    #[prost(bytes = "vec", tag = "7")]
    pub digest: Vec<u8>,
    /// The elements in canonical order cut into runs, each with its length and sha256.
    #[prost(message, repeated, tag = "8")]
    pub runs: Vec<ElementRun>,
    /// Which UDP flows a change of the elements leaves on a wrong path.
    #[prost(enumeration = "UdpFlows", tag = "9")]
    pub udp_flows: i32,
    /// `flags dynamic`: the packet path fills it; no elements listed.
    #[prost(bool, tag = "10")]
    pub dynamic: bool,
    /// `size N`: the most elements the kernel holds (0: no bound).
    #[prost(uint32, tag = "11")]
    pub size: u32,
    /// `flags timeout` and `timeout Ns` (0: no timeout).
    #[prost(uint32, tag = "12")]
    pub timeout_seconds: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{NftValue, nft_value};
    use prost::Message;

    /// The generated types these stand in for (`state.proto`), with plain lists.
    mod generated {
        use crate::v1::{ElementRun, NftChain, NftElement, Route};

        #[derive(Clone, PartialEq, prost::Message)]
        pub struct NetnsState {
            #[prost(string, tag = "9")]
            pub version: String,
            #[prost(message, repeated, tag = "3")]
            pub nft_tables: Vec<NftTable>,
            #[prost(message, repeated, tag = "6")]
            pub routes: Vec<Route>,
        }

        #[derive(Clone, PartialEq, prost::Message)]
        pub struct NftTable {
            #[prost(int32, tag = "1")]
            pub family: i32,
            #[prost(string, tag = "2")]
            pub name: String,
            #[prost(message, repeated, tag = "3")]
            pub sets: Vec<NftSet>,
            #[prost(message, repeated, tag = "4")]
            pub chains: Vec<NftChain>,
        }

        #[derive(Clone, PartialEq, prost::Message)]
        pub struct NftSet {
            #[prost(string, tag = "1")]
            pub name: String,
            #[prost(int32, repeated, tag = "2")]
            pub key: Vec<i32>,
            #[prost(message, repeated, tag = "6")]
            pub elements: Vec<NftElement>,
            #[prost(message, repeated, tag = "8")]
            pub runs: Vec<ElementRun>,
        }
    }

    fn element(s: &str) -> NftElement {
        NftElement { key: vec![NftValue { value: Some(nft_value::Value::Addr(s.into())) }], data: vec![] }
    }

    #[test]
    fn encodes_as_plain_lists_do_and_decodes_back() {
        let elements = vec![element("10.0.0.0/8"), element("192.0.2.0/24")];
        let runs = vec![ElementRun { elements: 2, digest: vec![7; 32] }];
        let route = Route { table: 254, dst: "10.0.0.0/8".into(), via: String::new(), dev: "kup-wg".into() };
        let ours = NetnsState {
            version: "v".into(),
            nft_tables: vec![NftTable {
                family: NftFamily::Inet as i32,
                name: "kuport".into(),
                sets: vec![NftSet {
                    name: "pods".into(),
                    key: vec![NftType::Ipv4Addr as i32],
                    elements: elements.clone().into(),
                    runs: runs.clone(),
                    ..Default::default()
                }]
                .into(),
                chains: Shared::default(),
            }]
            .into(),
            routes: vec![route.clone()].into(),
            ..Default::default()
        };
        let theirs = generated::NetnsState {
            version: "v".into(),
            nft_tables: vec![generated::NftTable {
                family: NftFamily::Inet as i32,
                name: "kuport".into(),
                sets: vec![generated::NftSet {
                    name: "pods".into(),
                    key: vec![NftType::Ipv4Addr as i32],
                    elements,
                    runs,
                }],
                chains: vec![],
            }],
            routes: vec![route],
        };
        assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec());
        assert_eq!(ours.encoded_len(), theirs.encoded_len());
        assert_eq!(NetnsState::decode(theirs.encode_to_vec().as_slice()).expect("decodes"), ours);
        let json = serde_json::to_string(&ours).expect("json");
        assert!(json.contains(r#""elements":[{"key""#), "{json}");
        assert_eq!(serde_json::from_str::<NetnsState>(&json).expect("json"), ours);
    }

    #[test]
    fn a_copy_shares_its_lists_until_it_changes_one() {
        let a: Shared<NftElement> = vec![element("10.0.0.0/8")].into();
        let mut b = a.clone();
        assert!(Shared::ptr_eq(&a, &b));
        b.push(element("192.0.2.0/24"));
        assert!(!Shared::ptr_eq(&a, &b));
        assert_eq!(a.len(), 1, "the list the copy came from is unchanged");
        assert_eq!(b.len(), 2);
        assert_ne!(a, b);
        assert_eq!(b.clone().into_vec(), *b);
        let mut c = Shared::default();
        c.append(a.clone());
        assert!(Shared::ptr_eq(&a, &c), "appended to nothing: the same list");
        c.append(b.clone());
        assert_eq!(c.len(), 3);
    }
}
