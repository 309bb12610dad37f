//! What kuport owns on a node: the numbers the controller assigns and the executor recognises as
//! its own. Each is named once, here.

/// Prefix of every link kuport creates; the executor never touches another link.
pub const LINK_PREFIX: &str = "kup-";
/// kuport's nftables table (family ip).
pub const NFT_TABLE: &str = "kuport";
/// kuport's prefix in packet and conntrack marks ("kp"): a mark carries it exactly when it names
/// one of kuport's links.
pub const MARK_PREFIX: u32 = 0x6b70_0000;
/// The part of a mark that holds the prefix.
pub const MARK_PREFIX_MASK: u32 = 0xffff_0000;
/// The loop guard: a marked packet bound for the peer's underlay address (the encapsulated
/// packet, which inherits the mark) is routed by main instead of back into the link.
pub const PREF_LOOP_GUARD: u32 = 101;
/// Diverts marked replies into the link's table. It must sort before the mesh's rules (netbird
/// resolves at 105 and catches everything unmarked at 110), or the reply has left already.
pub const PREF_DIVERT: u32 = 102;
/// The kernel's main routing table.
pub const MAIN_TABLE: u32 = 254;
/// Tables the kernel reserves: unspec, default, main, local.
pub const RESERVED_TABLES: [u32; 4] = [0, 253, MAIN_TABLE, 255];
