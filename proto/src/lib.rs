//! kuport's wire types and what every component needs to agree on about them: the canonical
//! order of a node state, its version, and its canonical text; and typed constructors for
//! whoever builds one ([`build`]).

// Library paths handle input: no unwrap there (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod build;
pub mod canonical;
pub mod channel;
pub mod delta;
pub mod netns;
pub mod owned;
pub mod shared;
pub mod text;
pub mod wireguard;

/// The generated types of package kuport.v1.
pub mod v1 {
    tonic::include_proto!("kuport.v1");

    pub use crate::shared::{NetnsState, NftSet, NftTable};
    pub use crate::wireguard::WireguardDevice;

    /// The encoded descriptors of package kuport.v1, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("kuport_descriptor");
}

pub use canonical::{canonical_version, canonicalize, canonicalize_after, route_identity, version};
