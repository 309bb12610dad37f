//! kuport's lab: a simulated cluster in network namespaces, and the end-to-end datapath tests.
//!
//! - [`topology`]: the YAML that describes nodes, pods, Services and internet clients, and for
//!   the overlay's sites, nodes behind their own NAT routers.
//! - [`objects`]: the Kubernetes objects and NodeFacts a topology stands for (pure).
//! - [`lab`]: the topology built from namespaces, veths and bridges, with a Cilium-like CNI on
//!   each node and an echo server in each pod.
//! - [`cni`]: the CNI the lab emulates: Cilium's devices, routes, tc redirects and masquerade;
//!   or the bridge plugin with host-local IPAM, under the overlay (docs/overlay/lab.md).
//! - [`echo`]: the pods' echo server.
//! - [`plane`]: kuport's real processes programming the lab: controller replicas (on a
//!   manifest folder, or on an API server) and one executor per node, each a process a test can
//!   kill (`kuport-lab up`, the robustness and chart tests).
//! - [`process`]: starting the lab's own processes as children or detached, and ending them.
//! - [`apiserver`]: the local API server and the objects the lab registers in it.
//! - [`program`]: the in-process datapath driver (compute, then apply with the executor), for
//!   the fast datapath, lifecycle and ablation tests.
//! - [`probe`]: dial from a host; what the pod saw and where the reply came from; continuous
//!   probes with tallies.
//! - [`manifests`]: the user's PortMapClasses and PortMaps.
//! - [`sys`]: namespaces, sysctls and the `ip`, `tc` and `nft` commands the lab builds with.

// Library paths handle input: no unwrap there (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod apiserver;
pub mod cni;
pub mod echo;
pub mod lab;
pub mod manifests;
pub mod objects;
pub mod plane;
pub mod probe;
pub mod process;
pub mod program;
pub mod sys;
pub mod topology;

pub use lab::{Lab, LabOptions, Record, ServerMode};
pub use manifests::Manifests;
pub use plane::{Plane, PlaneOptions};
pub use probe::{Answer, Flow, ProbeError, Prober, Tally, Target};
pub use program::program;
pub use topology::{Protocol, Topology};
