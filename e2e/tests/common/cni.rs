//! Scenarios on each of the lab's CNI emulations (Cilium-like, a bridge, Calico-like;
//! docs/overlay/lab.md, "The CNI emulations"): one `#[test]` per CNI runs a scenario's body,
//! which takes the CNI. kuport is given no CNI setting on any of them.

use kuport_lab::topology::{Cni, PodSpec};
use kuport_lab::{Lab, Topology};

/// `on_each_cni!(name = body)`: a module `name` with the tests `cilium`, `bridge` and `calico`,
/// each running `body(Cni::...)` as root (`cargo test ... -- name::calico`).
#[allow(unused_macros)]
macro_rules! on_each_cni {
    ($(#[$doc:meta])* $name:ident = $body:ident) => {
        $(#[$doc])*
        mod $name {
            use kuport_lab::topology::Cni;

            #[test]
            fn cilium() {
                if crate::common::root() {
                    super::$body(Cni::Cilium);
                }
            }

            #[test]
            fn bridge() {
                if crate::common::root() {
                    super::$body(Cni::Bridge);
                }
            }

            #[test]
            fn calico() {
                if crate::common::root() {
                    super::$body(Cni::Calico);
                }
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_each_cni;

/// The default topology with `cni` on every node, built.
pub fn default_lab_on(cni: Cni) -> Lab {
    Lab::up(&Topology::default_lab().with_cni(cni)).unwrap_or_else(|e| panic!("the default lab builds on {cni}: {e:#}"))
}

/// The Multi topology with `cni` on every node, built.
pub fn multi_lab_on(cni: Cni) -> Lab {
    Lab::up(&Topology::multi_lab().with_cni(cni)).unwrap_or_else(|e| panic!("the Multi lab builds on {cni}: {e:#}"))
}

/// The device the pod's node routes the pod's address through: what kuport's request claim
/// names (docs/portmap/datapath.md, "The request claim").
pub fn pod_device(cni: Cni, pod: &PodSpec) -> String {
    kuport_lab::cni::pod_device(cni, pod)
}
