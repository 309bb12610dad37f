//! kuport's controller, one folder per stage: [`observe`] the cluster, [`compute`] every node's
//! desired state and every status (one module per capability), [`stream`] the states to the
//! executors, [`report`] what they did. [`serve`] wires the stages into a running controller.

// Library paths handle input: no unwrap there (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod api;
pub mod compute;
pub mod ctl;
pub mod observe;
pub mod render;
pub mod report;
pub mod serve;
pub mod stream;
pub mod trust;
