//! kuport's node executor: makes a node's kernel match the desired state the controller streams,
//! keeps it so, and reports what it did.
//!
//! - [`sync`]: the stream to the controller (fencing, the stored state, facts), one keeper per
//!   network namespace of the state;
//! - [`executor`]: one namespace's apply as ordered steps (make before break), the drift loop,
//!   the keeper thread;
//! - [`rtnl`] (links, addresses, routes, rules), `sysctl`, [`netfilter`] (nftables tables,
//!   conntrack): one module per kind of kernel object;
//! - [`wireguard`]: the node's WireGuard key and devices (kernel or wireguard-go), programmed
//!   peer by peer;
//! - [`podns`]: a pod's network namespace, found on the node by reference;
//! - [`sys`]: entering namespaces and raw netlink sockets, the only `unsafe` in kuport.

// Library paths handle input: no unwrap there (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod executor;
pub mod netfilter;
pub mod podns;
pub mod rtnl;
pub mod sync;
pub mod sys;
mod sysctl;
pub mod wireguard;

/// The paths the executor and the tests use.
pub use netfilter::{conntrack, nft};
