//! The kernel interfaces under the typed layers: network namespaces (open, enter, run work
//! inside one) and raw netlink sockets of any family (send, receive, dumps, acks with the
//! kernel's extended-ack text).
//!
//! This is the only module with `unsafe`: every libc call that needs it is made here, each
//! unsafe block with the reason it is sound, and the rest of the crate (and its tests and
//! benchmarks) calls the safe functions below.
#![allow(unsafe_code)]

mod error;
pub mod netlink;
pub mod netns;
pub mod userns;

pub use error::Error;

/// Whether the process runs as root (effective uid 0): the root tests and benchmarks need
/// network namespaces and nf_tables.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
