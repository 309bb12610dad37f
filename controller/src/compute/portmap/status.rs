//! The port map's conditions (PortMap Accepted and Programmed, PortMapClass Ready) and every
//! reason they give; docs/portmap/modes.md explains each.

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
    /// The namespace already holds as many PortMaps or ports of the class as its spec.limits
    /// allow; older ones keep theirs.
    pub const NAMESPACE_LIMIT_EXCEEDED: &str = "NamespaceLimitExceeded";
    /// A spec.sourceRanges entry (the PortMap's, or its class's) is no CIDR.
    pub const INVALID_SOURCE_RANGE: &str = "InvalidSourceRange";
    /// The class pins its spec.sourceRanges and the PortMap names a prefix outside them.
    pub const SOURCE_RANGE_OUTSIDE_CLASS: &str = "SourceRangeOutsideClass";
    /// A spec.rateLimit number is 0.
    pub const INVALID_RATE_LIMIT: &str = "InvalidRateLimit";
    // Programmed
    pub const PROGRAMMED: &str = "Programmed";
    pub const NOT_ACCEPTED: &str = "NotAccepted";
    pub const NO_READY_ENDPOINT: &str = "NoReadyEndpoint";
    /// Every ready endpoint is one Kubernetes does not vouch for: no Pod of the PortMap's
    /// namespace holds its address on its node, nor does the class's spec.externalEndpoints
    /// contain it (docs/portmap/modes.md, "Which endpoints are believed").
    pub const ENDPOINT_NOT_VOUCHED: &str = "EndpointNotVouched";
    pub const RETURN_PATH_UNAVAILABLE: &str = "ReturnPathUnavailable";
    pub const NODE_NOT_READY: &str = "NodeNotReady";
    pub const NO_INTERFACE_ON_NODE: &str = "NoInterfaceOnNode";
    /// The pod's node reported routes, none containing the pod's address: the request claim
    /// there is left out, the rest is built (docs/portmap/datapath.md, "Which device reaches the
    /// pod").
    pub const POD_ROUTE_UNKNOWN: &str = "PodRouteUnknown";
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
