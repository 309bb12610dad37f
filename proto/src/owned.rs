//! What kuport owns on a node: the numbers the controller assigns and the executor recognises as
//! its own. Each is named once, here.

/// Prefix of every link kuport creates; the executor never touches another link.
pub const LINK_PREFIX: &str = "kup-";
/// kuport's nftables table (family ip).
pub const NFT_TABLE: &str = "kuport";
/// kuport owns every nftables table whose name starts with this, in any family (`kuport`,
/// `kuport-intercept`, ...), as it owns its `kup-` links: one that leaves a state is removed.
pub const NFT_TABLE_PREFIX: &str = "kuport";
/// The overlay's table (inet) on every mesh member (docs/overlay/filter.md). The executor reads
/// its pod sets and its relay counter.
pub const OVERLAY_TABLE: &str = "kuport-overlay";
/// The members' IPv4 pod CIDRs in the overlay's table: the only addresses what arrives through
/// the device may be forwarded to, and on a relay the only ones it forwards between.
pub const OVERLAY_PODS_V4: &str = "pods_v4";
/// Their IPv6 pod CIDRs, when some member has one.
pub const OVERLAY_PODS_V6: &str = "pods_v6";
/// Interception's table in a pod's namespace, in both families.
pub const INTERCEPT_TABLE: &str = "kuport-intercept";
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

// What a state may name, the executor's own line (docs/design.md, "What the executor refuses"):
// the controller computes nothing outside these, and the executor refuses a state that does.

/// Slot n's routing table is this plus n (slot 1 uses table 201).
pub const TABLE_BASE: u32 = 200;
/// The highest slot whose mark still fits under the prefix.
pub const MAX_SLOT: u32 = 0xffff;

/// Whether `table` is a slot's table (TABLE_BASE + 1 to TABLE_BASE + MAX_SLOT, the kernel's
/// reserved ones excepted): the only tables whose routes kuport owns whole.
pub fn is_slot_table(table: u32) -> bool {
    table > TABLE_BASE && table - TABLE_BASE <= MAX_SLOT && !RESERVED_TABLES.contains(&table)
}

/// Whether a route in `table` leaving through `dev` is one kuport may place: in a slot's table,
/// or in main on one of kuport's own links (the overlay's pod routes on `kup-wg`).
pub fn route_allowed(table: u32, dev: &str) -> bool {
    is_slot_table(table) || (table == MAIN_TABLE && dev.starts_with(LINK_PREFIX))
}

/// Whether an ip rule may look up `table`: a slot's table, or main (the loop guard).
pub fn rule_table_allowed(table: u32) -> bool {
    is_slot_table(table) || table == MAIN_TABLE
}

/// IPv4 forwarding, which every datapath kuport computes needs.
pub const SYSCTL_FORWARDING: &str = "net.ipv4.ip_forward";
/// IPv6 forwarding, for a node with IPv6 pods or an IPv6 mapping.
pub const SYSCTL_FORWARDING6: &str = "net.ipv6.conf.all.forwarding";
/// Every sysctl kuport computes; the executor sets no other.
pub const SYSCTLS: [&str; 2] = [SYSCTL_FORWARDING, SYSCTL_FORWARDING6];

/// The directories a state's namespace files may be in: where `ip netns` (and the lab) puts them.
pub const NETNS_DIRS: [&str; 2] = ["/run/netns/", "/var/run/netns/"];

/// Whether `path` names a namespace file kuport may enter: one name directly under one of
/// [`NETNS_DIRS`], never `.` or `..`. Empty is the host's namespace.
pub fn netns_path_allowed(path: &str) -> bool {
    path.is_empty()
        || NETNS_DIRS.iter().any(|dir| {
            path.strip_prefix(dir)
                .is_some_and(|name| !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0']))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_slot_tables_main_on_own_links_and_lab_namespaces() {
        assert!(is_slot_table(201) && is_slot_table(TABLE_BASE + MAX_SLOT) && is_slot_table(256));
        for t in [0, 100, 200, 253, 254, 255, TABLE_BASE + MAX_SLOT + 1, u32::MAX] {
            assert!(!is_slot_table(t), "{t}");
        }
        assert!(route_allowed(MAIN_TABLE, "kup-wg") && !route_allowed(MAIN_TABLE, "eth0"));
        assert!(!route_allowed(100, "kup-1") && route_allowed(201, "eth0"));
        assert!(rule_table_allowed(MAIN_TABLE) && !rule_table_allowed(255) && !rule_table_allowed(100));
        assert!(
            netns_path_allowed("/run/netns/node-1") && netns_path_allowed("/var/run/netns/x") && netns_path_allowed("")
        );
        for p in [
            "/proc/1/ns/net",
            "/etc/passwd",
            "/run/netns/../../etc/passwd",
            "/run/netns/",
            "/run/netns/..",
            "/run/netns/a/b",
            "run/netns/a",
        ] {
            assert!(!netns_path_allowed(p), "{p}");
        }
    }
}
