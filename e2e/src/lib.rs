//! kuport's lab: a simulated cluster in network namespaces, and the end-to-end datapath tests.
//!
//! - [`topology`]: the YAML that describes nodes, pods, Services and internet clients.
//! - [`objects`]: the Kubernetes objects and NodeFacts a topology stands for (pure).
//! - [`lab`]: the topology built from namespaces, veths and bridges, with a Cilium-like CNI on
//!   each node and an echo server in each pod.
//! - [`program`]: the datapath driver (compute, then apply with the executor), the seam the
//!   controller and executors replace later.
//! - [`probe`]: dial from a host; what the pod saw and where the reply came from.

pub mod echo;
pub mod lab;
pub mod manifests;
pub mod objects;
pub mod probe;
pub mod program;
pub mod sys;
pub mod topology;

pub use lab::{Lab, LabOptions, Record, ServerMode};
pub use manifests::Manifests;
pub use probe::{Answer, ProbeError};
pub use program::program;
pub use topology::{Protocol, Topology};
