//! nf_tables over netlink, natively: kuport's tables encoded the way nft 1.0.6 encodes them
//! (so `nft list` prints them exactly as it prints the same text loaded with `nft -f`),
//! applied in transactions, and read back for diffing.
//!
//! The `nft` binary is never run here; libnftnl/libmnl bindings are not used either, as they
//! lack maps with concatenations, interval sets, NAT ranges and read-back.
//!
//! Layout: `consts` (every nf_tables number, named once), `attr` (nf_tables' reading of
//! netlink attributes), `expr` (expressions), `value` (datatypes, values, selectors), `rule`
//! (model rule -> expressions and back), `encode` (model -> messages), `decode` (dumps ->
//! model), `socket` (transactions and dumps on an nfnetlink socket), `diff`, `table` (one-shot
//! read, apply and removal of a table, and its normal form), `applier` (remembers the last
//! applied table, so a small change is a small transaction without a kernel read), `watch`.

mod applier;
mod attr;
mod consts;
mod decode;
mod diff;
mod encode;
mod expr;
mod rule;
mod socket;
mod table;
mod value;
pub mod watch;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use applier::Applier;
pub use diff::{NftDiff, diff};
pub use table::{
    ApplyMode, ApplyOptions, ApplyReport, accepted_bytes, apply_table, apply_table_with, create_and_remove,
    list_tables, normalize, read_counters, read_table, remove_table,
};

/// Everything that can go wrong reading or writing nf_tables.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("entering network namespace {}: {source}", path.display())]
    Netns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kernel refused a transaction; `object` is the set, element, chain or rule it
    /// refused, `reason` its errno text (and extended-ack message).
    #[error("the kernel refused {object}: {reason}")]
    Kernel { object: String, errno: i32, reason: String },
    /// The desired state cannot be encoded.
    #[error("{object}: {reason}")]
    Invalid { object: String, reason: String },
    /// Valid nft, but outside what this codec encodes yet.
    #[error("{object}: {what} is not supported")]
    Unsupported { object: String, what: String },
    /// The kernel's answer does not decode into the model.
    #[error("decoding the kernel's table: {what}")]
    Decode { what: String },
}
