//! Report: what the executors did, told back. The leader's [`status`] writer (Programmed once
//! acknowledged, Pending until then) and its [`events`]; the [`debug`] service behind kuportctl,
//! served by every replica; Prometheus [`metrics`].

pub mod counters;
pub mod debug;
pub mod events;
pub mod metrics;
pub mod status;
pub mod trace;
