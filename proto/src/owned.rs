//! What kuport owns on a node: the numbers the controller assigns and the executor recognises as
//! its own. Each is named once, here.

/// Prefix of every link kuport creates; the executor never touches another link.
pub const LINK_PREFIX: &str = "kup-";
/// kuport's nftables table (family ip).
pub const NFT_TABLE: &str = "kuport";
/// kuport owns every nftables table whose name starts with this, in any family (`kuport`,
/// `kuport-intercept`, ...), as it owns its `kup-` links: one that leaves a state is removed.
pub const NFT_TABLE_PREFIX: &str = "kuport";
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

// The DNAT maps; the executor reads them too, to find the UDP flows a moved target strands.

/// Published single ports: (iifname, the node address's stand-in, proto, port) to (address, port).
pub const MAP_PUBLISH_PORT: &str = "publish_port";
/// Published ranges: (ports, iifname, stand-in, proto) to the address; the port is kept. Every
/// interval set's key starts with its ports (see the controller's datapath module).
pub const MAP_PUBLISH_RANGE: &str = "publish_range";
/// Link arrivals, single ports: (iifname, this end, proto, port) to (pod, port).
pub const MAP_LINK_PORT: &str = "link_port";
/// Link arrivals, ranges: (ports, iifname, this end, proto) to the pod.
pub const MAP_LINK_RANGE: &str = "link_range";
