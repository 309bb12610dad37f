//! kuport's API, group kuport.wlz.li, version v1alpha1: the custom resources, one module per
//! capability, and the CustomResourceDefinitions generated from them.

pub mod crds;
mod intercept;
mod portmap;

pub use intercept::*;
pub use portmap::*;

/// The API group.
pub const GROUP: &str = "kuport.wlz.li";
