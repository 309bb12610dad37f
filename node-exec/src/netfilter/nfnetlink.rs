//! nfnetlink, the netlink family nf_tables and conntrack share (linux/netfilter/nfnetlink.h):
//! its numbers, its fixed message header, and a socket of it.

use crate::sys::{self, netlink};

/// Length of struct nfgenmsg.
pub const NFGENMSG_LEN: usize = 4;
/// nfgenmsg version.
pub const NFNETLINK_V0: u8 = 0;
/// Starts a batch (transaction).
pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
/// Ends (commits) a batch.
pub const NFNL_MSG_BATCH_END: u16 = 0x11;
/// Subsystem of connection tracking.
pub const NFNL_SUBSYS_CTNETLINK: u16 = 1;
/// Subsystem of nf_tables; also a batch's res_id.
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// The multicast group nf_tables announces its committed changes to.
pub const NFNLGRP_NFTABLES: u32 = 7;

/// struct nfgenmsg: the address family the message is about, the version, and `res_id` (big
/// endian; a batch names its subsystem there).
pub const fn nfgenmsg(family: u8, res_id: u16) -> [u8; NFGENMSG_LEN] {
    let [hi, lo] = res_id.to_be_bytes();
    [family, NFNETLINK_V0, hi, lo]
}

/// A subsystem's message type.
pub const fn msg_type(subsys: u16, msg: u16) -> u16 {
    (subsys << 8) | msg
}

/// An nfnetlink socket in the calling thread's namespace, asking for extended acks.
pub fn socket() -> Result<netlink::Socket, sys::Error> {
    let sock = netlink::Socket::open(netlink::consts::NETLINK_NETFILTER)?;
    sock.ask_extended_acks();
    Ok(sock)
}
