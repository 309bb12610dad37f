//! The executor's side of NodeSync: one stream to the controller that brings desired states
//! down and carries acknowledgements, node facts and drift reports up.
//!
//! Fail static: the last applied state is stored on disk and kept (drift repaired) whether or
//! not the controller is reachable, across the executor's own restarts too.

pub mod bounds;
pub mod client;
pub mod facts;
pub mod fence;
mod keepers;
pub mod store;
pub mod wire;

pub use client::{Config, NodeApplier, read_counters, run};
pub use keepers::NodeKeepers;
