//! Netlink's own numbers (include/uapi/linux/netlink.h), each named once; a family's numbers
//! live with the code that speaks it.

/// Netlink protocol of nfnetlink (nf_tables, conntrack).
pub const NETLINK_NETFILTER: i32 = 12;

// --- message flags (NLM_F_*) ----------------------------------------------------------------
/// A request.
pub const NLM_F_REQUEST: u16 = 0x1;
/// Ask for an ack (an NLMSG_ERROR with error 0).
pub const NLM_F_ACK: u16 = 0x4;
/// A dump was interrupted by a concurrent change; it must be restarted.
pub const NLM_F_DUMP_INTR: u16 = 0x10;
/// A dump request (NLM_F_ROOT | NLM_F_MATCH).
pub const NLM_F_DUMP: u16 = 0x300;
/// Create the object if it does not exist.
pub const NLM_F_CREATE: u16 = 0x400;
/// With NLM_F_CREATE: fail with EEXIST if the object exists.
pub const NLM_F_EXCL: u16 = 0x200;
/// Add at the end of the object's list (a rule at the end of its chain).
pub const NLM_F_APPEND: u16 = 0x800;
/// On an NLMSG_ERROR: the request was cut to its header (NETLINK_CAP_ACK).
pub const NLM_F_CAPPED: u16 = 0x100;
/// On an NLMSG_ERROR: extended-ack attributes follow.
pub const NLM_F_ACK_TLVS: u16 = 0x200;

// --- message types ------------------------------------------------------------------------
/// An error or an ack.
pub const NLMSG_ERROR: u16 = 0x2;
/// The end of a dump.
pub const NLMSG_DONE: u16 = 0x3;
/// Extended-ack attribute: the kernel's text.
pub const NLMSGERR_ATTR_MSG: u16 = 1;

// --- socket options -----------------------------------------------------------------------
/// Socket option level of netlink.
pub const SOL_NETLINK: i32 = 270;
/// Join a multicast group.
pub const NETLINK_ADD_MEMBERSHIP: i32 = 1;
/// Acks echo only the header of the request, not all of it.
pub const NETLINK_CAP_ACK: i32 = 10;
/// Extended acks (a reason text) on errors.
pub const NETLINK_EXT_ACK: i32 = 11;

// --- layout -------------------------------------------------------------------------------
/// Length of struct nlmsghdr.
pub const NLMSG_HDRLEN: usize = 16;
/// Attribute type bit of nested attributes.
pub const NLA_F_NESTED: u16 = 0x8000;
/// Mask of an attribute's type bits.
pub const NLA_TYPE_MASK: u16 = 0x3fff;
