//! Rules: the model's typed matches and statements compiled to expressions the way nft 1.0.6
//! compiles the equivalent text ([`compile`]), and expressions decompiled back into the model
//! ([`decompile`]).
//!
//! `decompile(compile(r))` is the canonical form of `r` (e.g. `meta l4proto tcp` followed by
//! `th dport 80` is `tcp dport 80`); the applier compares canonical forms.

mod compile;
mod decompile;

pub(crate) use compile::{RuleCtx, SetRef, compile};
pub(crate) use decompile::decompile;
