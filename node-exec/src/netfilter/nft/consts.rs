//! The kernel's nf_tables numbers (include/uapi/linux/netfilter/nf_tables.h) and nft 1.0.6's
//! userdata and datatype numbers, each named once. Netlink's own are in
//! [`crate::sys::netlink::consts`], nfnetlink's in [`crate::netfilter::nfnetlink`].

// --- message types (NFT_MSG_*) ------------------------------------------------------------
pub const NFT_MSG_NEWTABLE: u16 = 0;
pub const NFT_MSG_GETTABLE: u16 = 1;
pub const NFT_MSG_DELTABLE: u16 = 2;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_GETCHAIN: u16 = 4;
pub const NFT_MSG_DELCHAIN: u16 = 5;
pub const NFT_MSG_NEWRULE: u16 = 6;
pub const NFT_MSG_GETRULE: u16 = 7;
/// Without a handle: every rule of the chain (a flush).
pub const NFT_MSG_DELRULE: u16 = 8;
pub const NFT_MSG_NEWSET: u16 = 9;
pub const NFT_MSG_GETSET: u16 = 10;
pub const NFT_MSG_NEWSETELEM: u16 = 12;
pub const NFT_MSG_GETSETELEM: u16 = 13;
pub const NFT_MSG_DELSETELEM: u16 = 14;
pub const NFT_MSG_GETGEN: u16 = 16;
/// The ruleset generation in NFT_MSG_NEWGEN (u32): every committed transaction bumps it.
pub const NFTA_GEN_ID: u16 = 1;

// --- families (NFPROTO_*) -----------------------------------------------------------------
/// Family-less requests (the generation).
pub const NFPROTO_UNSPEC: u8 = 0;
pub const NFPROTO_INET: u8 = 1;
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

// --- table / chain attributes -------------------------------------------------------------
pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_TABLE_FLAGS: u16 = 2;
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_CHAIN_HOOK: u16 = 4;
pub const NFTA_CHAIN_POLICY: u16 = 5;
pub const NFTA_CHAIN_TYPE: u16 = 7;
pub const NFTA_HOOK_HOOKNUM: u16 = 1;
pub const NFTA_HOOK_PRIORITY: u16 = 2;
/// Netfilter hook numbers (NF_INET_*).
pub const NF_INET_PRE_ROUTING: u32 = 0;
pub const NF_INET_LOCAL_IN: u32 = 1;
pub const NF_INET_FORWARD: u32 = 2;
pub const NF_INET_LOCAL_OUT: u32 = 3;
pub const NF_INET_POST_ROUTING: u32 = 4;
/// Verdict codes (NF_* and NFT_*).
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;

// --- rule attributes ----------------------------------------------------------------------
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
/// A list element (rule expressions, concat descriptions, set elements).
pub const NFTA_LIST_ELEM: u16 = 1;
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;
/// A counter expression's bytes (a big-endian u64).
pub const NFTA_COUNTER_BYTES: u16 = 1;
/// A counter expression's packets (a big-endian u64).
pub const NFTA_COUNTER_PACKETS: u16 = 2;

// --- set attributes -----------------------------------------------------------------------
pub const NFTA_SET_TABLE: u16 = 1;
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_FLAGS: u16 = 3;
pub const NFTA_SET_KEY_TYPE: u16 = 4;
pub const NFTA_SET_KEY_LEN: u16 = 5;
pub const NFTA_SET_DATA_TYPE: u16 = 6;
pub const NFTA_SET_DATA_LEN: u16 = 7;
pub const NFTA_SET_DESC: u16 = 9;
pub const NFTA_SET_ID: u16 = 10;
pub const NFTA_SET_TIMEOUT: u16 = 11;
pub const NFTA_SET_USERDATA: u16 = 13;
pub const NFTA_SET_EXPR: u16 = 17;
pub const NFTA_SET_EXPRESSIONS: u16 = 18;
/// Inside NFTA_SET_DESC: the most elements (`size N`).
pub const NFTA_SET_DESC_SIZE: u16 = 1;
/// Inside NFTA_SET_DESC: the concatenation's field list.
pub const NFTA_SET_DESC_CONCAT: u16 = 2;
/// Inside a concat field: its length in bytes.
pub const NFTA_SET_FIELD_LEN: u16 = 1;
/// Set flags.
/// The name nft gives an anonymous set; the kernel fills in the number.
pub const ANON_SET: &str = "__set%d";
pub const NFT_SET_ANONYMOUS: u32 = 0x1;
pub const NFT_SET_CONSTANT: u32 = 0x2;
pub const NFT_SET_INTERVAL: u32 = 0x4;
pub const NFT_SET_MAP: u32 = 0x8;
/// `flags timeout`: elements expire.
pub const NFT_SET_TIMEOUT: u32 = 0x10;
/// `flags dynamic`: filled from the packet path (dynset).
pub const NFT_SET_EVAL: u32 = 0x20;
pub const NFT_SET_CONCAT: u32 = 0x80;

// --- set element attributes ---------------------------------------------------------------
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_DATA: u16 = 2;
pub const NFTA_SET_ELEM_KEY_END: u16 = 10;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
/// An element's one expression (its counter), when the set has one.
pub const NFTA_SET_ELEM_EXPR: u16 = 7;
/// An element's expressions, when the set has more than one.
pub const NFTA_SET_ELEM_EXPRESSIONS: u16 = 11;
/// A single-field interval set's element that ends an interval (exclusively).
pub const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;
/// Inside NFTA_*_DATA: a plain value, or a verdict.
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
/// A verdict map's data type (NFT_DATA_VERDICT), with data length 0.
pub const NFT_DATA_VERDICT_TYPE: u32 = 0xffff_ff00;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_VERDICT_CHAIN: u16 = 2;

// --- set userdata (libnftnl NFTNL_UDATA_SET_*), what `nft list` reads for type names ----------
pub const UDATA_SET_KEYBYTEORDER: u8 = 0;
pub const UDATA_SET_DATABYTEORDER: u8 = 1;
pub const UDATA_SET_KEY_TYPEOF: u8 = 3;
pub const UDATA_SET_DATA_TYPEOF: u8 = 4;
pub const UDATA_SET_DATA_INTERVAL: u8 = 6;
/// Inside a *_TYPEOF record: the expression kind, and its (here empty) data.
pub const UDATA_TYPEOF_EXPR: u8 = 0;
pub const UDATA_TYPEOF_DATA: u8 = 1;
/// nft's EXPR_CONCAT, recorded as the key's expression kind for concatenations.
pub const NFT_EXPR_CONCAT: u32 = 13;
/// nft's byteorder enum as stored in set userdata.
pub const BYTEORDER_INVALID: u32 = 0;
pub const BYTEORDER_HOST: u32 = 1;
pub const BYTEORDER_BIG: u32 = 2;

// --- nft datatype ids (TYPE_*), and how concatenations combine them -------------------------
pub const TYPE_IPADDR: u32 = 7;
pub const TYPE_IP6ADDR: u32 = 8;
pub const TYPE_INET_PROTOCOL: u32 = 12;
pub const TYPE_INET_SERVICE: u32 = 13;
pub const TYPE_MARK: u32 = 19;
pub const TYPE_IFNAME: u32 = 41;
/// A concatenation's type id is its components' ids, TYPE_BITS each, first one highest.
pub const TYPE_BITS: u32 = 6;

// --- expressions --------------------------------------------------------------------------
/// Registers: the verdict register, and the first 128-bit register.
pub const NFT_REG_VERDICT: u32 = 0;
pub const NFT_REG_1: u32 = 1;
/// The first 32-bit register (aliases the first word of NFT_REG_1).
pub const NFT_REG32_00: u32 = 8;
/// 32-bit words per 128-bit register.
pub const REG32_PER_REG: u32 = 4;

pub const NFTA_META_DREG: u16 = 1;
pub const NFTA_META_KEY: u16 = 2;
pub const NFTA_META_SREG: u16 = 3;
pub const NFT_META_MARK: u32 = 3;
pub const NFT_META_IIFNAME: u32 = 6;
pub const NFT_META_OIFNAME: u32 = 7;
pub const NFT_META_SKUID: u32 = 10;
pub const NFT_META_SKGID: u32 = 11;
/// The packet's network family (NFPROTO_IPV4/IPV6, one byte): nft's dependency of an address
/// selector in an inet table (docs/overlay/filter.md).
pub const NFT_META_NFPROTO: u32 = 15;
pub const NFT_META_L4PROTO: u32 = 16;

pub const NFTA_CT_DREG: u16 = 1;
pub const NFTA_CT_KEY: u16 = 2;
pub const NFTA_CT_SREG: u16 = 4;
pub const NFT_CT_STATE: u32 = 0;
pub const NFT_CT_DIRECTION: u32 = 1;
pub const NFT_CT_MARK: u32 = 3;

pub const NFTA_PAYLOAD_DREG: u16 = 1;
pub const NFTA_PAYLOAD_BASE: u16 = 2;
pub const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub const NFTA_PAYLOAD_LEN: u16 = 4;
pub const NFTA_PAYLOAD_SREG: u16 = 5;
pub const NFTA_PAYLOAD_CSUM_TYPE: u16 = 6;
pub const NFTA_PAYLOAD_CSUM_OFFSET: u16 = 7;
pub const NFTA_PAYLOAD_CSUM_FLAGS: u16 = 8;
/// No checksum of the field's own header (`csum_type 0`): IPv6 has none.
pub const NFT_PAYLOAD_CSUM_NONE: u32 = 0;
/// The internet checksum (`csum_type 1`).
pub const NFT_PAYLOAD_CSUM_INET: u32 = 1;
/// Also update the transport checksum's pseudo-header part (`csum_flags 0x1`).
pub const NFT_PAYLOAD_L4CSUM_PSEUDOHDR: u32 = 1;
/// Where the IPv4 header checksum sits (`csum_off 10`).
pub const IPV4_CSUM_OFFSET: u32 = 10;
pub const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;

pub const NFTA_CMP_SREG: u16 = 1;
pub const NFTA_CMP_OP: u16 = 2;
pub const NFTA_CMP_DATA: u16 = 3;
pub const NFT_CMP_EQ: u32 = 0;
pub const NFT_CMP_NEQ: u32 = 1;
pub const NFT_CMP_LTE: u32 = 3;
pub const NFT_CMP_GTE: u32 = 5;

pub const NFTA_RANGE_SREG: u16 = 1;
pub const NFTA_RANGE_OP: u16 = 2;
pub const NFTA_RANGE_FROM_DATA: u16 = 3;
pub const NFTA_RANGE_TO_DATA: u16 = 4;
pub const NFT_RANGE_NEQ: u32 = 1;

pub const NFTA_BITWISE_SREG: u16 = 1;
pub const NFTA_BITWISE_DREG: u16 = 2;
pub const NFTA_BITWISE_LEN: u16 = 3;
pub const NFTA_BITWISE_MASK: u16 = 4;
pub const NFTA_BITWISE_XOR: u16 = 5;
pub const NFTA_BITWISE_OP: u16 = 6;
/// Bitwise op: (reg & mask) ^ xor.
pub const NFT_BITWISE_BOOL: u32 = 0;

pub const NFTA_BYTEORDER_SREG: u16 = 1;
pub const NFTA_BYTEORDER_DREG: u16 = 2;
pub const NFTA_BYTEORDER_OP: u16 = 3;
pub const NFTA_BYTEORDER_LEN: u16 = 4;
pub const NFTA_BYTEORDER_SIZE: u16 = 5;
pub const NFT_BYTEORDER_HTON: u32 = 1;

pub const NFTA_LOOKUP_SET: u16 = 1;
pub const NFTA_LOOKUP_SREG: u16 = 2;
pub const NFTA_LOOKUP_DREG: u16 = 3;
pub const NFTA_LOOKUP_SET_ID: u16 = 4;
pub const NFTA_LOOKUP_FLAGS: u16 = 5;
/// Lookup flag: match when the key is NOT in the set.
pub const NFT_LOOKUP_F_INV: u32 = 1;

pub const NFTA_IMMEDIATE_DREG: u16 = 1;
pub const NFTA_IMMEDIATE_DATA: u16 = 2;

pub const NFTA_NAT_TYPE: u16 = 1;
pub const NFTA_NAT_FAMILY: u16 = 2;
pub const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
pub const NFTA_NAT_REG_ADDR_MAX: u16 = 4;
pub const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
pub const NFTA_NAT_REG_PROTO_MAX: u16 = 6;
pub const NFTA_NAT_FLAGS: u16 = 7;
pub const NFT_NAT_SNAT: u32 = 0;
pub const NFT_NAT_DNAT: u32 = 1;
/// NAT flag: a port range is given (NF_NAT_RANGE_PROTO_SPECIFIED).
pub const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 0x2;

pub const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;
pub const NFTA_REDIR_REG_PROTO_MAX: u16 = 2;
pub const NFTA_REDIR_FLAGS: u16 = 3;

pub const NFTA_RT_DREG: u16 = 1;
pub const NFTA_RT_KEY: u16 = 2;
/// rt key: the MSS the packet's route carries (its MTU less the IP and TCP headers).
pub const NFT_RT_TCPMSS: u32 = 3;

pub const NFTA_EXTHDR_DREG: u16 = 1;
pub const NFTA_EXTHDR_TYPE: u16 = 2;
pub const NFTA_EXTHDR_OFFSET: u16 = 3;
pub const NFTA_EXTHDR_LEN: u16 = 4;
pub const NFTA_EXTHDR_FLAGS: u16 = 5;
pub const NFTA_EXTHDR_OP: u16 = 6;
pub const NFTA_EXTHDR_SREG: u16 = 7;
/// exthdr op: a TCP option.
pub const NFT_EXTHDR_OP_TCPOPT: u32 = 1;
/// The TCP option kind of the MSS, and where its 2-byte value sits in the option.
pub const TCPOPT_MAXSEG: u8 = 2;
pub const TCPOPT_MAXSEG_OFFSET: u32 = 2;
pub const TCPOPT_MAXSEG_LEN: u32 = 2;

// --- packet layout ------------------------------------------------------------------------
/// Offsets of the addresses in the IPv4 and IPv6 headers, and of the ports in TCP/UDP.
pub const IPV4_SADDR_OFFSET: u32 = 12;
pub const IPV4_DADDR_OFFSET: u32 = 16;
pub const IPV6_SADDR_OFFSET: u32 = 8;
pub const IPV6_DADDR_OFFSET: u32 = 24;
pub const TH_SPORT_OFFSET: u32 = 0;
pub const TH_DPORT_OFFSET: u32 = 2;
/// The TCP header's flags byte.
pub const TCP_FLAGS_OFFSET: u32 = 13;
/// IP protocol numbers.
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
/// Interface names are IFNAMSIZ bytes, NUL included.
pub const IFNAMSIZ: usize = 16;

// --- dynset (`update @set { ... }`, `add @set { ... }`), limit and connlimit ---------------
pub const NFTA_DYNSET_SET_NAME: u16 = 1;
pub const NFTA_DYNSET_SET_ID: u16 = 2;
pub const NFTA_DYNSET_OP: u16 = 3;
pub const NFTA_DYNSET_SREG_KEY: u16 = 4;
pub const NFTA_DYNSET_SREG_DATA: u16 = 5;
pub const NFTA_DYNSET_TIMEOUT: u16 = 6;
pub const NFTA_DYNSET_EXPR: u16 = 7;
pub const NFTA_DYNSET_FLAGS: u16 = 9;
pub const NFTA_DYNSET_EXPRESSIONS: u16 = 10;
pub const NFT_DYNSET_OP_ADD: u32 = 0;
pub const NFT_DYNSET_OP_UPDATE: u32 = 1;
pub const NFTA_LIMIT_RATE: u16 = 1;
pub const NFTA_LIMIT_UNIT: u16 = 2;
pub const NFTA_LIMIT_BURST: u16 = 3;
pub const NFTA_LIMIT_TYPE: u16 = 4;
pub const NFTA_LIMIT_FLAGS: u16 = 5;
pub const NFT_LIMIT_PKTS: u32 = 0;
/// `over`: the limit matches above the rate.
pub const NFT_LIMIT_F_INV: u32 = 1;
pub const NFTA_CONNLIMIT_COUNT: u16 = 1;
pub const NFTA_CONNLIMIT_FLAGS: u16 = 2;
/// `over`: the count matches above the number.
pub const NFT_CONNLIMIT_F_INV: u32 = 1;
