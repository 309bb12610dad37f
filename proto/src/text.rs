//! The canonical text of a node state: nftables exactly as `nft -s list table` prints them once
//! loaded, then the `ip` commands that would create the rest. Golden tests compare this text.

use crate::v1::NodeState;

/// Renders a whole node state.
pub fn node_state(_state: &NodeState) -> String {
    String::new()
}
