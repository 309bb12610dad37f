//! Conditions: the reasons kuport gives, and how a condition keeps its transition time.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub const ACCEPTED: &str = "Accepted";
pub const PROGRAMMED: &str = "Programmed";
pub const READY: &str = "Ready";

/// Every reason kuport writes into a condition.
pub mod reason {
    // Accepted
    pub const ACCEPTED: &str = "Accepted";
    pub const CLASS_NOT_FOUND: &str = "ClassNotFound";
    pub const INVALID_PORT_RANGE: &str = "InvalidPortRange";
    pub const NAMESPACE_NOT_SELECTED: &str = "NamespaceNotSelected";
    pub const PORT_OUTSIDE_CLASS_RANGE: &str = "PortOutsideClassRange";
    pub const RESERVED_PORT: &str = "ReservedPort";
    pub const PORT_CONFLICT: &str = "PortConflict";
    pub const INTERFACE_NOT_IN_CLASS: &str = "InterfaceNotInClass";
    // Programmed
    pub const PROGRAMMED: &str = "Programmed";
    pub const NOT_ACCEPTED: &str = "NotAccepted";
    pub const NO_READY_ENDPOINT: &str = "NoReadyEndpoint";
    pub const RETURN_PATH_UNAVAILABLE: &str = "ReturnPathUnavailable";
    pub const NODE_NOT_READY: &str = "NodeNotReady";
    pub const NO_INTERFACE_ON_NODE: &str = "NoInterfaceOnNode";
    /// Computed and sent, but a node that must apply it has not acknowledged yet.
    pub const PENDING: &str = "Pending";
    // PortMapClass Ready
    pub const READY: &str = "Ready";
    pub const INVALID_SUBNET: &str = "InvalidSubnet";
    pub const VXLAN_PORT_CONFLICT: &str = "VxlanPortConflict";
    pub const INVALID_VNI: &str = "InvalidVni";
    pub const SUBNET_EXHAUSTED: &str = "SubnetExhausted";
}

/// Why a mapping is not (yet) in the datapath.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// ACCEPTED or PROGRAMMED: the condition that turns False.
    pub condition: &'static str,
    pub reason: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn accepted(reason: &'static str, message: String) -> Self {
        Refusal { condition: ACCEPTED, reason, message }
    }

    pub fn programmed(reason: &'static str, message: String) -> Self {
        Refusal { condition: PROGRAMMED, reason, message }
    }
}

/// A condition that keeps the previous transition time when its status did not change, so
/// recomputing an unchanged object writes nothing.
pub fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}
