//! The canonical text of a node state: nftables exactly as `nft -s list table` prints them once
//! loaded, then the `ip` commands that would create the rest. Golden tests compare this text.
//!
//! - [`nft`]: tables, sets, chains and rules in nft 1.0.6's listing syntax ([`nft_table`]).
//! - [`normalize`]: what nft changes on the way through the kernel (element order, protocol
//!   dependencies, merged ports, prefix and mask forms, priority names), which the listing
//!   reproduces; its module doc lists each normalisation and the combinations nft refuses.
//! - [`ip`]: the `sysctl` and `ip` commands for the rest of a namespace ([`ip_commands`]).
//!
//! Nonsense in the model (unspecified enums, values of the wrong kind, unknown sets) renders as
//! a visible `<invalid ...>` marker instead of panicking.

use std::fmt::Write as _;

use crate::v1::NodeState;

mod ip;
mod nft;
mod normalize;

pub use ip::ip_commands;
pub use nft::{nft_table, set_element};

/// Renders a whole node state: for each netns in order a `# netns <host|PATH|pod NS/NAME UID>`
/// header, its tables as [`nft_table`] prints them, then its [`ip_commands`]. Netns sections are
/// separated by a blank line.
pub fn node_state(state: &NodeState) -> String {
    let mut out = String::new();
    for (i, ns) in state.netns.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "# netns {}", ns.describe());
        for table in &ns.nft_tables {
            out.push_str(&nft_table(table));
        }
        out.push_str(&ip_commands(ns));
    }
    out
}
