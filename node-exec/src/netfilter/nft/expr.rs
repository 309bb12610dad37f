//! The nf_tables expressions kuport uses: an in-memory form, its attribute encoding (in the
//! attribute order libnftnl 1.2 writes) and its decoding from the kernel's dumps.
//!
//! Besides loads, compares, lookups, NAT and verdicts: `lookup ... dreg 0` is a verdict map
//! (`KEY vmap @m`); `ct load state` + `bitwise` + `cmp neq 0` is `ct state S`; `dynset` with a
//! `limit` (op update) or a `connlimit` (op add) is `update @s { KEY . TAG limit ... }` /
//! `add @s { KEY . TAG ct count ... }`, the tag an `immediate` into the register word after the
//! key (tests/data/guard_inet.nft has nft's own messages for each).

use super::NftError;
use super::attr::{Attr, AttrWriter, ReadNft, WriteNft, decode_err, find, need, parse};
use super::consts::*;

/// The data an `immediate` loads: a value or a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Imm {
    Value(Vec<u8>),
    Verdict { code: i32, chain: Option<String> },
}

/// The stateful expression a dynset gives each element it creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stateful {
    /// `limit rate [over] RATE/second burst BURST packets`.
    Limit { rate: u64, burst: u32, over: bool },
    /// `ct count [over] COUNT`.
    Connlimit { count: u32, over: bool },
}

/// One expression of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expr {
    Meta {
        key: u32,
        dreg: u32,
    },
    MetaSet {
        key: u32,
        sreg: u32,
    },
    Ct {
        key: u32,
        dreg: u32,
    },
    CtSet {
        key: u32,
        sreg: u32,
    },
    Payload {
        base: u32,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    /// A write into the packet (`ip daddr set ...`), with the checksum the field is part of
    /// updated as nft asks for it (`csum_type`, `csum_off`, `csum_flags`).
    PayloadSet {
        base: u32,
        offset: u32,
        len: u32,
        sreg: u32,
        csum_type: u32,
        csum_offset: u32,
        csum_flags: u32,
    },
    Cmp {
        sreg: u32,
        op: u32,
        data: Vec<u8>,
    },
    Range {
        sreg: u32,
        op: u32,
        from: Vec<u8>,
        to: Vec<u8>,
    },
    Bitwise {
        sreg: u32,
        dreg: u32,
        len: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
        /// Whether NFTA_BITWISE_OP (boolean) is sent: nft sends it for an `&` of the rule
        /// (`tcp flags`, a mark's mask), not for the mask of an address prefix. The kernel's
        /// dumps always hold it.
        with_op: bool,
    },
    Byteorder {
        sreg: u32,
        dreg: u32,
        op: u32,
        len: u32,
        size: u32,
    },
    Lookup {
        sreg: u32,
        dreg: Option<u32>,
        set: String,
        set_id: Option<u32>,
        flags: u32,
    },
    /// A lookup in the rule's own anonymous constant set (`meta l4proto { tcp, udp }`): encoded
    /// as `lookup` in `__set%d`, the set created in the same batch under `set_id`
    /// (see `encode::anon_set`). The kernel gives it back as a plain [`Expr::Lookup`].
    Literal {
        sreg: u32,
        key: kuport_proto::v1::NftType,
        values: Vec<kuport_proto::v1::NftValue>,
        negate: bool,
        set_id: Option<u32>,
    },
    Immediate {
        dreg: u32,
        data: Imm,
    },
    Nat {
        kind: u32,
        family: u32,
        addr_min: Option<u32>,
        proto_min: Option<u32>,
        proto_max: Option<u32>,
        flags: Option<u32>,
    },
    Redir {
        proto_min: Option<u32>,
        proto_max: Option<u32>,
        flags: Option<u32>,
    },
    Counter,
    /// `update @set { KEY stateful }` (op update) or `add @set { ... }` (op add): the element for
    /// the key in registers from `sreg_key` is created (or refreshed) with its own `expr`.
    Dynset {
        sreg_key: u32,
        op: u32,
        set: String,
        set_id: Option<u32>,
        expr: Stateful,
    },
    /// A routing key into a register (`rt mtu`: the route's TCP MSS).
    Rt {
        key: u32,
        dreg: u32,
    },
    /// A write into an extension header (`tcp option maxseg size set ...`): `len` bytes at
    /// `offset` inside the option of kind `ty`.
    ExthdrSet {
        op: u32,
        ty: u8,
        offset: u32,
        len: u32,
        sreg: u32,
    },
}

impl Expr {
    fn name(&self) -> &'static str {
        match self {
            Expr::Meta { .. } | Expr::MetaSet { .. } => "meta",
            Expr::Ct { .. } | Expr::CtSet { .. } => "ct",
            Expr::Payload { .. } | Expr::PayloadSet { .. } => "payload",
            Expr::Cmp { .. } => "cmp",
            Expr::Range { .. } => "range",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Byteorder { .. } => "byteorder",
            Expr::Lookup { .. } | Expr::Literal { .. } => "lookup",
            Expr::Immediate { .. } => "immediate",
            Expr::Nat { .. } => "nat",
            Expr::Redir { .. } => "redir",
            Expr::Counter => "counter",
            Expr::Dynset { .. } => "dynset",
            Expr::Rt { .. } => "rt",
            Expr::ExthdrSet { .. } => "exthdr",
        }
    }

    /// Appends `NFTA_LIST_ELEM { NAME, DATA { ... } }`.
    pub(crate) fn encode(&self, w: &mut AttrWriter) {
        let elem = w.begin(NFTA_LIST_ELEM);
        w.put_str(NFTA_EXPR_NAME, self.name());
        let data = w.begin(NFTA_EXPR_DATA);
        match self {
            Expr::Meta { key, dreg } => {
                w.put_u32(NFTA_META_KEY, *key);
                w.put_u32(NFTA_META_DREG, *dreg);
            }
            Expr::MetaSet { key, sreg } => {
                w.put_u32(NFTA_META_KEY, *key);
                w.put_u32(NFTA_META_SREG, *sreg);
            }
            Expr::Ct { key, dreg } => {
                w.put_u32(NFTA_CT_KEY, *key);
                w.put_u32(NFTA_CT_DREG, *dreg);
            }
            Expr::CtSet { key, sreg } => {
                w.put_u32(NFTA_CT_KEY, *key);
                w.put_u32(NFTA_CT_SREG, *sreg);
            }
            Expr::Payload { base, offset, len, dreg } => {
                w.put_u32(NFTA_PAYLOAD_DREG, *dreg);
                w.put_u32(NFTA_PAYLOAD_BASE, *base);
                w.put_u32(NFTA_PAYLOAD_OFFSET, *offset);
                w.put_u32(NFTA_PAYLOAD_LEN, *len);
            }
            Expr::PayloadSet { base, offset, len, sreg, csum_type, csum_offset, csum_flags } => {
                w.put_u32(NFTA_PAYLOAD_SREG, *sreg);
                w.put_u32(NFTA_PAYLOAD_BASE, *base);
                w.put_u32(NFTA_PAYLOAD_OFFSET, *offset);
                w.put_u32(NFTA_PAYLOAD_LEN, *len);
                // As libnftnl sends them: the checksum's type and offset only with an offset
                // (an IPv6 write has none), the flags only when set. The kernel dumps all three.
                if *csum_offset != 0 {
                    w.put_u32(NFTA_PAYLOAD_CSUM_TYPE, *csum_type);
                    w.put_u32(NFTA_PAYLOAD_CSUM_OFFSET, *csum_offset);
                }
                if *csum_flags != 0 {
                    w.put_u32(NFTA_PAYLOAD_CSUM_FLAGS, *csum_flags);
                }
            }
            Expr::Cmp { sreg, op, data } => {
                w.put_u32(NFTA_CMP_SREG, *sreg);
                w.put_u32(NFTA_CMP_OP, *op);
                w.put_data(NFTA_CMP_DATA, data);
            }
            Expr::Range { sreg, op, from, to } => {
                w.put_u32(NFTA_RANGE_SREG, *sreg);
                w.put_u32(NFTA_RANGE_OP, *op);
                w.put_data(NFTA_RANGE_FROM_DATA, from);
                w.put_data(NFTA_RANGE_TO_DATA, to);
            }
            Expr::Bitwise { sreg, dreg, len, mask, xor, with_op } => {
                w.put_u32(NFTA_BITWISE_SREG, *sreg);
                w.put_u32(NFTA_BITWISE_DREG, *dreg);
                if *with_op {
                    w.put_u32(NFTA_BITWISE_OP, NFT_BITWISE_BOOL);
                }
                w.put_u32(NFTA_BITWISE_LEN, *len);
                w.put_data(NFTA_BITWISE_MASK, mask);
                w.put_data(NFTA_BITWISE_XOR, xor);
            }
            Expr::Byteorder { sreg, dreg, op, len, size } => {
                w.put_u32(NFTA_BYTEORDER_SREG, *sreg);
                w.put_u32(NFTA_BYTEORDER_DREG, *dreg);
                w.put_u32(NFTA_BYTEORDER_OP, *op);
                w.put_u32(NFTA_BYTEORDER_LEN, *len);
                w.put_u32(NFTA_BYTEORDER_SIZE, *size);
            }
            Expr::Literal { sreg, negate, set_id, .. } => {
                w.put_u32(NFTA_LOOKUP_SREG, *sreg);
                w.put_str(NFTA_LOOKUP_SET, ANON_SET);
                if let Some(id) = set_id {
                    w.put_u32(NFTA_LOOKUP_SET_ID, *id);
                }
                if *negate {
                    w.put_u32(NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
                }
            }
            Expr::Lookup { sreg, dreg, set, set_id, flags } => {
                w.put_u32(NFTA_LOOKUP_SREG, *sreg);
                if let Some(d) = dreg {
                    w.put_u32(NFTA_LOOKUP_DREG, *d);
                }
                w.put_str(NFTA_LOOKUP_SET, set);
                if let Some(id) = set_id {
                    w.put_u32(NFTA_LOOKUP_SET_ID, *id);
                }
                if *flags != 0 {
                    w.put_u32(NFTA_LOOKUP_FLAGS, *flags);
                }
            }
            Expr::Immediate { dreg, data } => {
                w.put_u32(NFTA_IMMEDIATE_DREG, *dreg);
                match data {
                    Imm::Value(v) => w.put_data(NFTA_IMMEDIATE_DATA, v),
                    Imm::Verdict { code, chain } => {
                        let d = w.begin(NFTA_IMMEDIATE_DATA);
                        let v = w.begin(NFTA_DATA_VERDICT);
                        w.put(NFTA_VERDICT_CODE, &code.to_be_bytes());
                        if let Some(c) = chain {
                            w.put_str(NFTA_VERDICT_CHAIN, c);
                        }
                        w.end(v);
                        w.end(d);
                    }
                }
            }
            Expr::Nat { kind, family, addr_min, proto_min, proto_max, flags } => {
                w.put_u32(NFTA_NAT_TYPE, *kind);
                w.put_u32(NFTA_NAT_FAMILY, *family);
                put_opt(w, NFTA_NAT_REG_ADDR_MIN, *addr_min);
                put_opt(w, NFTA_NAT_REG_PROTO_MIN, *proto_min);
                put_opt(w, NFTA_NAT_REG_PROTO_MAX, *proto_max);
                put_opt(w, NFTA_NAT_FLAGS, *flags);
            }
            Expr::Redir { proto_min, proto_max, flags } => {
                put_opt(w, NFTA_REDIR_REG_PROTO_MIN, *proto_min);
                put_opt(w, NFTA_REDIR_REG_PROTO_MAX, *proto_max);
                put_opt(w, NFTA_REDIR_FLAGS, *flags);
            }
            Expr::Counter => {}
            Expr::Dynset { sreg_key, op, set, set_id, expr } => {
                // libnftnl's order: key register, op, set, its id, then the expression.
                w.put_u32(NFTA_DYNSET_SREG_KEY, *sreg_key);
                w.put_u32(NFTA_DYNSET_OP, *op);
                w.put_str(NFTA_DYNSET_SET_NAME, set);
                if let Some(id) = set_id {
                    w.put_u32(NFTA_DYNSET_SET_ID, *id);
                }
                let e = w.begin(NFTA_DYNSET_EXPR);
                match expr {
                    Stateful::Limit { rate, burst, over } => {
                        w.put_str(NFTA_EXPR_NAME, "limit");
                        let d = w.begin(NFTA_EXPR_DATA);
                        w.put(NFTA_LIMIT_RATE, &rate.to_be_bytes());
                        // Per second.
                        w.put(NFTA_LIMIT_UNIT, &1u64.to_be_bytes());
                        w.put_u32(NFTA_LIMIT_BURST, *burst);
                        w.put_u32(NFTA_LIMIT_TYPE, NFT_LIMIT_PKTS);
                        w.put_u32(NFTA_LIMIT_FLAGS, if *over { NFT_LIMIT_F_INV } else { 0 });
                        w.end(d);
                    }
                    Stateful::Connlimit { count, over } => {
                        w.put_str(NFTA_EXPR_NAME, "connlimit");
                        let d = w.begin(NFTA_EXPR_DATA);
                        w.put_u32(NFTA_CONNLIMIT_COUNT, *count);
                        w.put_u32(NFTA_CONNLIMIT_FLAGS, if *over { NFT_CONNLIMIT_F_INV } else { 0 });
                        w.end(d);
                    }
                }
                w.end(e);
            }
            Expr::Rt { key, dreg } => {
                w.put_u32(NFTA_RT_KEY, *key);
                w.put_u32(NFTA_RT_DREG, *dreg);
            }
            Expr::ExthdrSet { op, ty, offset, len, sreg } => {
                w.put_u32(NFTA_EXTHDR_SREG, *sreg);
                w.put(NFTA_EXTHDR_TYPE, &[*ty]);
                w.put_u32(NFTA_EXTHDR_OFFSET, *offset);
                w.put_u32(NFTA_EXTHDR_LEN, *len);
                w.put_u32(NFTA_EXTHDR_OP, *op);
            }
        }
        w.end(data);
        w.end(elem);
    }

    /// Decodes one `NFTA_LIST_ELEM` of a rule's expressions.
    pub(crate) fn decode(elem: &Attr<'_>) -> Result<Expr, NftError> {
        let attrs = elem.nested()?;
        let name = need(&attrs, NFTA_EXPR_NAME, "expression")?.str()?;
        let data = match find(&attrs, NFTA_EXPR_DATA) {
            Some(d) => parse(d.data)?,
            None => Vec::new(),
        };
        let d = data.as_slice();
        let u = |ty: u16| -> Result<u32, NftError> { need(d, ty, &name)?.u32() };
        let opt = |ty: u16| -> Result<Option<u32>, NftError> { find(d, ty).map(|a| a.u32()).transpose() };
        let val = |ty: u16| -> Result<Vec<u8>, NftError> { need(d, ty, &name)?.data_value() };
        Ok(match name.as_str() {
            "meta" => match opt(NFTA_META_DREG)? {
                Some(dreg) => Expr::Meta { key: u(NFTA_META_KEY)?, dreg },
                None => Expr::MetaSet { key: u(NFTA_META_KEY)?, sreg: u(NFTA_META_SREG)? },
            },
            "ct" => match opt(NFTA_CT_DREG)? {
                Some(dreg) => Expr::Ct { key: u(NFTA_CT_KEY)?, dreg },
                None => Expr::CtSet { key: u(NFTA_CT_KEY)?, sreg: u(NFTA_CT_SREG)? },
            },
            "payload" => match opt(NFTA_PAYLOAD_SREG)? {
                Some(sreg) => Expr::PayloadSet {
                    base: u(NFTA_PAYLOAD_BASE)?,
                    offset: u(NFTA_PAYLOAD_OFFSET)?,
                    len: u(NFTA_PAYLOAD_LEN)?,
                    sreg,
                    csum_type: opt(NFTA_PAYLOAD_CSUM_TYPE)?.unwrap_or(0),
                    csum_offset: opt(NFTA_PAYLOAD_CSUM_OFFSET)?.unwrap_or(0),
                    csum_flags: opt(NFTA_PAYLOAD_CSUM_FLAGS)?.unwrap_or(0),
                },
                None => Expr::Payload {
                    base: u(NFTA_PAYLOAD_BASE)?,
                    offset: u(NFTA_PAYLOAD_OFFSET)?,
                    len: u(NFTA_PAYLOAD_LEN)?,
                    dreg: u(NFTA_PAYLOAD_DREG)?,
                },
            },
            "cmp" => Expr::Cmp { sreg: u(NFTA_CMP_SREG)?, op: u(NFTA_CMP_OP)?, data: val(NFTA_CMP_DATA)? },
            "range" => Expr::Range {
                sreg: u(NFTA_RANGE_SREG)?,
                op: u(NFTA_RANGE_OP)?,
                from: val(NFTA_RANGE_FROM_DATA)?,
                to: val(NFTA_RANGE_TO_DATA)?,
            },
            "bitwise" => {
                let op = opt(NFTA_BITWISE_OP)?;
                if op.unwrap_or(NFT_BITWISE_BOOL) != NFT_BITWISE_BOOL {
                    return Err(unsupported("bitwise shift"));
                }
                Expr::Bitwise {
                    with_op: op.is_some(),
                    sreg: u(NFTA_BITWISE_SREG)?,
                    dreg: u(NFTA_BITWISE_DREG)?,
                    len: u(NFTA_BITWISE_LEN)?,
                    mask: val(NFTA_BITWISE_MASK)?,
                    xor: val(NFTA_BITWISE_XOR)?,
                }
            }
            "byteorder" => Expr::Byteorder {
                sreg: u(NFTA_BYTEORDER_SREG)?,
                dreg: u(NFTA_BYTEORDER_DREG)?,
                op: u(NFTA_BYTEORDER_OP)?,
                len: u(NFTA_BYTEORDER_LEN)?,
                size: u(NFTA_BYTEORDER_SIZE)?,
            },
            "lookup" => Expr::Lookup {
                sreg: u(NFTA_LOOKUP_SREG)?,
                dreg: opt(NFTA_LOOKUP_DREG)?,
                set: need(d, NFTA_LOOKUP_SET, "lookup")?.str()?,
                set_id: None,
                flags: opt(NFTA_LOOKUP_FLAGS)?.unwrap_or(0),
            },
            "immediate" => {
                let dreg = u(NFTA_IMMEDIATE_DREG)?;
                let data = need(d, NFTA_IMMEDIATE_DATA, "immediate")?.nested()?;
                let imm = if let Some(v) = find(&data, NFTA_DATA_VERDICT) {
                    let v = v.nested()?;
                    let code = need(&v, NFTA_VERDICT_CODE, "verdict")?.u32()? as i32;
                    let chain = find(&v, NFTA_VERDICT_CHAIN).map(|c| c.str()).transpose()?;
                    Imm::Verdict { code, chain }
                } else {
                    Imm::Value(need(&data, NFTA_DATA_VALUE, "immediate")?.data.to_vec())
                };
                Expr::Immediate { dreg, data: imm }
            }
            "nat" => {
                // The kernel dumps max = min when only min was given.
                let addr_min = opt(NFTA_NAT_REG_ADDR_MIN)?;
                if opt(NFTA_NAT_REG_ADDR_MAX)?.is_some_and(|m| Some(m) != addr_min) {
                    return Err(unsupported("nat to an address range"));
                }
                let proto_min = opt(NFTA_NAT_REG_PROTO_MIN)?;
                Expr::Nat {
                    kind: u(NFTA_NAT_TYPE)?,
                    family: u(NFTA_NAT_FAMILY)?,
                    addr_min,
                    proto_min,
                    proto_max: opt(NFTA_NAT_REG_PROTO_MAX)?.filter(|m| Some(*m) != proto_min),
                    flags: opt(NFTA_NAT_FLAGS)?,
                }
            }
            "redir" => {
                let proto_min = opt(NFTA_REDIR_REG_PROTO_MIN)?;
                Expr::Redir {
                    proto_min,
                    proto_max: opt(NFTA_REDIR_REG_PROTO_MAX)?.filter(|m| Some(*m) != proto_min),
                    flags: opt(NFTA_REDIR_FLAGS)?,
                }
            }
            "counter" => Expr::Counter,
            "dynset" => {
                // The kernel dumps a timeout (0: the set's) and flags (only `!=`) always.
                if find(d, NFTA_DYNSET_SREG_DATA).is_some() {
                    return Err(unsupported("dynset with data"));
                }
                let timeout = match find(d, NFTA_DYNSET_TIMEOUT) {
                    Some(a) => u64_of(a)?,
                    None => 0,
                };
                if timeout != 0 || opt(NFTA_DYNSET_FLAGS)?.unwrap_or(0) != 0 {
                    return Err(unsupported("dynset with its own timeout or flags"));
                }
                let e = match (find(d, NFTA_DYNSET_EXPR), find(d, NFTA_DYNSET_EXPRESSIONS)) {
                    (Some(e), None) => e.nested()?,
                    (None, Some(list)) => match list.nested()?.as_slice() {
                        [one] => one.nested()?,
                        _ => return Err(unsupported("dynset with other than one expression")),
                    },
                    _ => return Err(unsupported("dynset without one expression")),
                };
                Expr::Dynset {
                    sreg_key: u(NFTA_DYNSET_SREG_KEY)?,
                    op: u(NFTA_DYNSET_OP)?,
                    set: need(d, NFTA_DYNSET_SET_NAME, "dynset")?.str()?,
                    set_id: None,
                    expr: stateful(&e)?,
                }
            }
            "rt" => Expr::Rt { key: u(NFTA_RT_KEY)?, dreg: u(NFTA_RT_DREG)? },
            "exthdr" => {
                // A read (into a register) or flags (a presence test) is outside kuport's rules.
                if find(d, NFTA_EXTHDR_DREG).is_some() || opt(NFTA_EXTHDR_FLAGS)?.is_some_and(|f| f != 0) {
                    return Err(unsupported("exthdr read"));
                }
                let ty = match need(d, NFTA_EXTHDR_TYPE, "exthdr")?.data {
                    [t] => *t,
                    _ => return Err(decode_err("exthdr: a type that is not one byte".into())),
                };
                Expr::ExthdrSet {
                    op: opt(NFTA_EXTHDR_OP)?.unwrap_or(0),
                    ty,
                    offset: u(NFTA_EXTHDR_OFFSET)?,
                    len: u(NFTA_EXTHDR_LEN)?,
                    sreg: u(NFTA_EXTHDR_SREG)?,
                }
            }
            other => return Err(unsupported(&format!("expression {other:?}"))),
        })
    }
}

fn u64_of(a: &Attr<'_>) -> Result<u64, NftError> {
    let b: [u8; 8] = a.data.try_into().map_err(|_| decode_err(format!("attribute {} is not a u64", a.ty)))?;
    Ok(u64::from_be_bytes(b))
}

/// A dynset's expression: a packet limit per second, or a connection count.
fn stateful(attrs: &[Attr<'_>]) -> Result<Stateful, NftError> {
    let name = need(attrs, NFTA_EXPR_NAME, "dynset expression")?.str()?;
    let data = match find(attrs, NFTA_EXPR_DATA) {
        Some(d) => parse(d.data)?,
        None => Vec::new(),
    };
    let d = data.as_slice();
    let u = |ty: u16| -> Result<u32, NftError> { need(d, ty, &name)?.u32() };
    match name.as_str() {
        "limit" => {
            let flags = find(d, NFTA_LIMIT_FLAGS).map(|a| a.u32()).transpose()?.unwrap_or(0);
            let rate = u64_of(need(d, NFTA_LIMIT_RATE, "limit")?)?;
            let unit = u64_of(need(d, NFTA_LIMIT_UNIT, "limit")?)?;
            let ty = find(d, NFTA_LIMIT_TYPE).map(|a| a.u32()).transpose()?.unwrap_or(NFT_LIMIT_PKTS);
            if unit != 1 || ty != NFT_LIMIT_PKTS || flags & !NFT_LIMIT_F_INV != 0 {
                return Err(unsupported("a limit other than packets per second"));
            }
            Ok(Stateful::Limit { rate, burst: u(NFTA_LIMIT_BURST)?, over: flags & NFT_LIMIT_F_INV != 0 })
        }
        "connlimit" => {
            let flags = find(d, NFTA_CONNLIMIT_FLAGS).map(|a| a.u32()).transpose()?.unwrap_or(0);
            if flags & !NFT_CONNLIMIT_F_INV != 0 {
                return Err(unsupported("connlimit flags"));
            }
            Ok(Stateful::Connlimit { count: u(NFTA_CONNLIMIT_COUNT)?, over: flags & NFT_CONNLIMIT_F_INV != 0 })
        }
        other => Err(unsupported(&format!("dynset expression {other:?}"))),
    }
}

fn put_opt(w: &mut AttrWriter, ty: u16, v: Option<u32>) {
    if let Some(v) = v {
        w.put_u32(ty, v);
    }
}

fn unsupported(what: &str) -> NftError {
    decode_err(format!("{what} is outside kuport's vocabulary"))
}

/// Decodes NFTA_RULE_EXPRESSIONS.
pub(crate) fn decode_list(list: &Attr<'_>) -> Result<Vec<Expr>, NftError> {
    list.nested()?.iter().filter(|a| a.ty == NFTA_LIST_ELEM).map(Expr::decode).collect()
}

/// The register number nft uses for the 32-bit word `slot` of the register file: a 128-bit
/// register when the word starts one, else a 32-bit register (nft's netlink_put_register).
pub(crate) fn reg_of_slot(slot: u32) -> u32 {
    if slot.is_multiple_of(REG32_PER_REG) { NFT_REG_1 + slot / REG32_PER_REG } else { NFT_REG32_00 + slot }
}

/// The inverse of [`reg_of_slot`].
pub(crate) fn slot_of_reg(reg: u32) -> Option<u32> {
    match reg {
        NFT_REG_1..=4 => Some((reg - NFT_REG_1) * REG32_PER_REG),
        r if (NFT_REG32_00..NFT_REG32_00 + 16).contains(&r) => Some(r - NFT_REG32_00),
        _ => None,
    }
}
