//! The numbers that define what kuport owns. Each is named once here.

pub use kuport_proto::owned::{
    LINK_PREFIX, MAIN_TABLE as TABLE_MAIN, MARK_PREFIX, MARK_PREFIX_MASK, PREF_DIVERT as PREF_TUNNEL,
    PREF_LOOP_GUARD as PREF_DIRECT, RESERVED_TABLES,
};

/// The preferences at which kuport owns rules (together with a kuport mark).
pub const OWNED_PREFS: [u32; 2] = [PREF_DIRECT, PREF_TUNNEL];

/// The kernel's `local` table (RT_TABLE_LOCAL): kernel-managed, never read or written.
pub const TABLE_LOCAL: u32 = 255;

/// Whether `name` is a link kuport owns.
pub fn owns_link(name: &str) -> bool {
    name.starts_with(LINK_PREFIX)
}

/// Whether a rule at `pref` with firewall mark `mark` is kuport's.
pub fn owns_rule(pref: u32, mark: u32) -> bool {
    OWNED_PREFS.contains(&pref) && mark & MARK_PREFIX_MASK == MARK_PREFIX
}
