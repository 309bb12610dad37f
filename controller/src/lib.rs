//! kuport's controller: observe the cluster, compute every node's desired state, stream it.

pub mod api;
pub mod compute;
pub mod crds;
pub mod ctl;
pub mod render;
pub mod serve;
