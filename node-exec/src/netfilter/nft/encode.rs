//! The model turned into nf_tables messages, attribute for attribute as nft 1.0.6 sends them.

use kuport_proto::v1::{ChainPolicy, ChainType, Hook, NftChain, NftElement, NftFamily, NftSet, NftTable, NftType};

use super::NftError;
use super::attr::{AttrWriter, WriteNft};
use super::consts::*;
use super::expr::Expr;
use super::rule::{RuleCtx, SetRef};
use super::value::{TypeInfo, concat_id, encode_component, padded, type_info, verdict_code};
use crate::sys::netlink::consts::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL};

/// Bytes of encoded elements per message: attribute lengths are u16, so a message's element
/// list must stay below 64 KiB.
pub(crate) const MAX_ELEMS_BYTES: usize = 48 * 1024;

/// One nf_tables message of a batch, with the name of the object it writes (for errors).
#[derive(Debug, Clone)]
pub(crate) struct Msg {
    pub(crate) ty: u16,
    pub(crate) flags: u16,
    pub(crate) family: u8,
    pub(crate) attrs: Vec<u8>,
    pub(crate) object: String,
    /// Operations it counts for in a batch's budget (elements count one each).
    pub(crate) ops: usize,
}

pub(crate) fn family_code(f: i32) -> Result<u8, NftError> {
    match NftFamily::try_from(f) {
        Ok(NftFamily::Ip) => Ok(NFPROTO_IPV4),
        Ok(NftFamily::Ip6) => Ok(NFPROTO_IPV6),
        Ok(NftFamily::Inet) => Ok(NFPROTO_INET),
        _ => Err(NftError::Invalid { object: "table".into(), reason: format!("unknown family {f}") }),
    }
}

fn invalid(object: &str, reason: impl Into<String>) -> NftError {
    NftError::Invalid { object: object.to_string(), reason: reason.into() }
}

fn msg(ty: u16, flags: u16, family: u8, w: AttrWriter, object: String) -> Msg {
    Msg { ty, flags, family, attrs: w.buf, object, ops: 1 }
}

pub(crate) fn new_table(family: u8, name: &str) -> Msg {
    let mut w = AttrWriter::new();
    w.put_str(NFTA_TABLE_NAME, name);
    w.put_u32(NFTA_TABLE_FLAGS, 0);
    msg(NFT_MSG_NEWTABLE, NLM_F_CREATE, family, w, format!("table {name}"))
}

/// A table known to be absent: EEXIST, and the whole transaction refused, if it is not.
pub(crate) fn create_table(family: u8, name: &str) -> Msg {
    let mut m = new_table(family, name);
    m.flags |= NLM_F_EXCL;
    m
}

pub(crate) fn del_table(family: u8, name: &str) -> Msg {
    let mut w = AttrWriter::new();
    w.put_str(NFTA_TABLE_NAME, name);
    msg(NFT_MSG_DELTABLE, 0, family, w, format!("table {name}"))
}

pub(crate) fn hook_num(h: i32) -> Option<u32> {
    Some(match Hook::try_from(h).ok()? {
        Hook::Unspecified => return None,
        Hook::Prerouting => NF_INET_PRE_ROUTING,
        Hook::Input => NF_INET_LOCAL_IN,
        Hook::Forward => NF_INET_FORWARD,
        Hook::Output => NF_INET_LOCAL_OUT,
        Hook::Postrouting => NF_INET_POST_ROUTING,
    })
}

pub(crate) fn new_chain(family: u8, table: &str, chain: &NftChain) -> Result<Msg, NftError> {
    let object = format!("chain {}", chain.name);
    if chain.name.is_empty() {
        return Err(invalid(&object, "empty chain name"));
    }
    let mut w = AttrWriter::new();
    w.put_str(NFTA_CHAIN_TABLE, table);
    w.put_str(NFTA_CHAIN_NAME, &chain.name);
    if let Some(b) = &chain.base {
        let ty = match ChainType::try_from(b.r#type) {
            Ok(ChainType::Filter) => "filter",
            Ok(ChainType::Nat) => "nat",
            Ok(ChainType::Route) => "route",
            _ => return Err(invalid(&object, "base chain without a type")),
        };
        let hook = hook_num(b.hook).ok_or_else(|| invalid(&object, "base chain without a hook"))?;
        let policy = match ChainPolicy::try_from(b.policy) {
            Ok(ChainPolicy::Accept) => NF_ACCEPT,
            Ok(ChainPolicy::Drop) => NF_DROP,
            Err(_) => return Err(invalid(&object, "unknown policy")),
        };
        w.put_str(NFTA_CHAIN_TYPE, ty);
        w.put_u32(NFTA_CHAIN_POLICY, policy as u32);
        let h = w.begin(NFTA_CHAIN_HOOK);
        w.put_u32(NFTA_HOOK_HOOKNUM, hook);
        w.put(NFTA_HOOK_PRIORITY, &b.priority.to_be_bytes());
        w.end(h);
    }
    Ok(msg(NFT_MSG_NEWCHAIN, NLM_F_CREATE, family, w, object))
}

/// The datatypes of a set's key or data, checked.
fn types(object: &str, what: &str, ts: &[i32]) -> Result<Vec<(NftType, TypeInfo)>, NftError> {
    ts.iter()
        .map(|t| {
            let ty = NftType::try_from(*t).map_err(|_| invalid(object, format!("unknown {what} type {t}")))?;
            let info = type_info(ty).ok_or_else(|| invalid(object, format!("unspecified {what} type")))?;
            Ok((ty, info))
        })
        .collect()
}

/// (type id, length): a concatenation pads each component to whole register words.
fn type_and_len(ts: &[(NftType, TypeInfo)]) -> (u32, u32) {
    let infos: Vec<TypeInfo> = ts.iter().map(|t| t.1).collect();
    match infos.as_slice() {
        [one] => (one.id, one.len),
        many => (concat_id(many), many.iter().map(|t| padded(t.len)).sum()),
    }
}

fn udata_rec(out: &mut Vec<u8>, ty: u8, v: &[u8]) {
    out.push(ty);
    out.push(v.len() as u8);
    out.extend_from_slice(v);
}

/// nft's record for a concatenated key/data: "an EXPR_CONCAT, no sub-expressions".
fn typeof_concat() -> Vec<u8> {
    let mut v = Vec::new();
    udata_rec(&mut v, UDATA_TYPEOF_EXPR, &NFT_EXPR_CONCAT.to_ne_bytes());
    udata_rec(&mut v, UDATA_TYPEOF_DATA, &[]);
    v
}

/// The userdata nft stores with a set: byteorders (so that `nft list` prints values right)
/// and, for concatenations, the typeof records.
fn set_udata(key: &[(NftType, TypeInfo)], data: &[(NftType, TypeInfo)]) -> Vec<u8> {
    let order = |ts: &[(NftType, TypeInfo)]| if ts.len() == 1 { ts[0].1.byteorder } else { BYTEORDER_INVALID };
    let mut u = Vec::new();
    udata_rec(&mut u, UDATA_SET_KEYBYTEORDER, &order(key).to_ne_bytes());
    if !data.is_empty() {
        udata_rec(&mut u, UDATA_SET_DATABYTEORDER, &order(data).to_ne_bytes());
    }
    if key.len() > 1 {
        udata_rec(&mut u, UDATA_SET_KEY_TYPEOF, &typeof_concat());
    }
    if data.len() > 1 {
        udata_rec(&mut u, UDATA_SET_DATA_TYPEOF, &typeof_concat());
    }
    if !data.is_empty() {
        udata_rec(&mut u, UDATA_SET_DATA_INTERVAL, &0u32.to_ne_bytes());
    }
    u
}

pub(crate) fn check_set(set: &NftSet) -> Result<(), NftError> {
    let object = format!("set {}", set.name);
    if set.name.is_empty() {
        return Err(invalid(&object, "empty set name"));
    }
    if set.key.is_empty() {
        return Err(invalid(&object, "a set needs a key type"));
    }
    let key = types(&object, "key", &set.key)?;
    if single_interval(set) && !set.data.is_empty() {
        return Err(NftError::Unsupported { object, what: "interval maps with a single key component".into() });
    }
    let data = types(&object, "data", &set.data)?;
    if data.iter().any(|(t, _)| *t == NftType::Verdict) && data.len() != 1 {
        return Err(invalid(&object, "a verdict is a map's whole data"));
    }
    if key.iter().any(|(t, _)| *t == NftType::Verdict) {
        return Err(invalid(&object, "a verdict is map data, never a key"));
    }
    if set.dynamic {
        if !set.data.is_empty() || set.interval {
            return Err(NftError::Unsupported { object, what: "dynamic maps and dynamic interval sets".into() });
        }
        if !set.elements.is_empty() {
            return Err(invalid(&object, "a dynamic set's elements are the kernel's: it lists none"));
        }
    }
    Ok(())
}

/// An interval set of one key component: the kernel keeps it in an rbtree, where each interval
/// is two elements, its start and its exclusive end (flagged), as nft encodes them; a
/// concatenation (pipapo) carries explicit key ends instead.
pub(crate) fn single_interval(set: &NftSet) -> bool {
    set.interval && set.key.len() == 1
}

/// `b + 1` as a big-endian number; None past the last address.
pub(crate) fn successor(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = b.to_vec();
    for x in out.iter_mut().rev() {
        let (v, carry) = x.overflowing_add(1);
        *x = v;
        if !carry {
            return Some(out);
        }
    }
    None
}

/// The rbtree elements of `e`: its start, then its exclusive end unless it reaches the top.
/// Opens the next element of a message's element list. libnftnl numbers the list's nests
/// 1, 2, 3, ... where the kernel's dumps say NFTA_LIST_ELEM each time; the kernel reads either.
/// The number stays inside the attribute type's 14 bits (a message carries at most
/// [`MAX_ELEMS_BYTES`], far fewer elements than that).
fn element_nest(w: &mut AttrWriter, n: &mut u16) -> usize {
    *n = if *n >= 0x3fff { 1 } else { *n + 1 };
    w.begin(*n)
}

/// An interval bound as libnftnl writes it: the flags before the key.
fn put_bound(w: &mut AttrWriter, n: &mut u16, key: &[u8], end: bool) {
    let el = element_nest(w, n);
    if end {
        w.put_u32(NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
    }
    w.put_data(NFTA_SET_ELEM_KEY, key);
    w.end(el);
}

fn put_interval(w: &mut AttrWriter, n: &mut u16, set: &NftSet, ty: NftType, e: &NftElement) -> Result<(), NftError> {
    let object = format!("element {} of set {}", element_name(e), set.name);
    let [v] = &e.key[..] else {
        return Err(invalid(&object, format!("key has {} components, the set 1", e.key.len())));
    };
    let (start, last) = encode_component(&object, ty, v, true, false)?;
    put_bound(w, n, &start, false);
    if let Some(end) = successor(&last) {
        put_bound(w, n, &end, true);
    }
    Ok(())
}

/// The anonymous constant set a [`Expr::Literal`] reads, and its elements, as nft sends them
/// before the rule (NEWSET `__set%d` with flags anonymous|constant, then NEWSETELEM by id).
pub(crate) fn anon_set(
    family: u8,
    table: &str,
    key: NftType,
    values: &[kuport_proto::v1::NftValue],
    id: u32,
    rule: &str,
) -> Result<Vec<Msg>, NftError> {
    let object = format!("the literal set of {rule}");
    // A prefix makes it an interval set, as nft makes it (`ip saddr != { 192.0.2.0/24 }`).
    let mut interval = false;
    for v in values {
        let (start, end) = encode_component(&object, key, v, true, false)?;
        interval |= start != end;
    }
    let mut set = NftSet {
        name: ANON_SET.to_string(),
        key: vec![key as i32],
        elements: values.iter().map(|v| NftElement { key: vec![v.clone()], data: Vec::new() }).collect(),
        interval,
        ..Default::default()
    };
    // nft sizes it by the elements it sends: an interval's start and end, and an end at zero
    // before the first when that starts above zero.
    set.size = if interval { interval_bounds(&object, key, values)? } else { values.len() as u32 };
    let mut head = new_set_flags(family, table, &set, id, NFT_SET_ANONYMOUS | NFT_SET_CONSTANT)?;
    head.object = object;
    let elems: Vec<&NftElement> = set.elements.iter().collect();
    let mut out = vec![head];
    out.extend(set_elements(NFT_MSG_NEWSETELEM, family, table, &set, Some(id), &elems)?);
    Ok(out)
}

/// The kernel elements of a single-field interval set of `values`, as [`set_elements`] sends
/// them to a new set.
fn interval_bounds(object: &str, key: NftType, values: &[kuport_proto::v1::NftValue]) -> Result<u32, NftError> {
    let mut n = 0;
    let mut lowest: Option<Vec<u8>> = None;
    for v in values {
        let (start, last) = encode_component(object, key, v, true, false)?;
        n += if successor(&last).is_some() { 2 } else { 1 };
        if lowest.as_ref().is_none_or(|l| start < *l) {
            lowest = Some(start);
        }
    }
    Ok(n + u32::from(lowest.is_some_and(|l| l.iter().any(|b| *b != 0))))
}

pub(crate) fn new_set(family: u8, table: &str, set: &NftSet, id: u32) -> Result<Msg, NftError> {
    new_set_flags(family, table, set, id, 0)
}

fn new_set_flags(family: u8, table: &str, set: &NftSet, id: u32, extra: u32) -> Result<Msg, NftError> {
    check_set(set)?;
    let object = format!("set {}", set.name);
    let key = types(&object, "key", &set.key)?;
    let data = types(&object, "data", &set.data)?;
    let concat_interval = set.interval && key.len() > 1;
    let mut flags = extra;
    if !data.is_empty() {
        flags |= NFT_SET_MAP;
    }
    if set.interval {
        flags |= NFT_SET_INTERVAL;
    }
    if concat_interval {
        flags |= NFT_SET_CONCAT;
    }
    if set.timeout_seconds != 0 {
        flags |= NFT_SET_TIMEOUT;
    }
    if set.dynamic {
        flags |= NFT_SET_EVAL;
    }
    let (kt, kl) = type_and_len(&key);
    let mut w = AttrWriter::new();
    w.put_str(NFTA_SET_TABLE, table);
    w.put_str(NFTA_SET_NAME, &set.name);
    w.put_u32(NFTA_SET_FLAGS, flags);
    w.put_u32(NFTA_SET_KEY_TYPE, kt);
    w.put_u32(NFTA_SET_KEY_LEN, kl);
    if !data.is_empty() {
        let (dt, dl) = type_and_len(&data);
        w.put_u32(NFTA_SET_DATA_TYPE, dt);
        w.put_u32(NFTA_SET_DATA_LEN, dl);
    }
    w.put_u32(NFTA_SET_ID, id);
    if concat_interval || set.size != 0 {
        let d = w.begin(NFTA_SET_DESC);
        if set.size != 0 {
            w.put_u32(NFTA_SET_DESC_SIZE, set.size);
        }
        if concat_interval {
            let c = w.begin(NFTA_SET_DESC_CONCAT);
            for (_, info) in &key {
                let e = w.begin(NFTA_LIST_ELEM);
                w.put_u32(NFTA_SET_FIELD_LEN, info.len);
                w.end(e);
            }
            w.end(c);
        }
        w.end(d);
    }
    if set.timeout_seconds != 0 {
        w.put(NFTA_SET_TIMEOUT, &(u64::from(set.timeout_seconds) * 1000).to_be_bytes());
    }
    w.put(NFTA_SET_USERDATA, &set_udata(&key, &data));
    if set.counter {
        let e = w.begin(NFTA_SET_EXPR);
        w.put_str(NFTA_EXPR_NAME, "counter");
        let d = w.begin(NFTA_EXPR_DATA);
        w.end(d);
        w.end(e);
    }
    Ok(msg(NFT_MSG_NEWSET, NLM_F_CREATE, family, w, object))
}

/// A human name for an element (its key), used in errors and diffs.
pub(crate) fn element_name(e: &NftElement) -> String {
    use kuport_proto::v1::nft_value::Value;
    let parts: Vec<String> = e
        .key
        .iter()
        .map(|v| match &v.value {
            Some(Value::Ifname(s)) => format!("{s:?}"),
            Some(Value::Addr(s)) => s.clone(),
            Some(Value::Proto(p)) => kuport_proto::v1::L4Proto::try_from(*p)
                .map(|p| p.as_str_name().to_lowercase())
                .unwrap_or_else(|_| p.to_string()),
            Some(Value::Port(r)) if r.last > r.first => format!("{}-{}", r.first, r.last),
            Some(Value::Port(r)) => r.first.to_string(),
            Some(Value::Mark(m)) => format!("{m:#x}"),
            Some(Value::Id(i)) => i.to_string(),
            Some(Value::Verdict(v)) => format!("{v:?}"),
            None => "?".into(),
        })
        .collect();
    parts.join(" . ")
}

/// Encodes one element into `w` as a list element.
fn put_element(
    w: &mut AttrWriter,
    n: &mut u16,
    set: &NftSet,
    key: &[(NftType, TypeInfo)],
    data: &[(NftType, TypeInfo)],
    e: &NftElement,
) -> Result<(), NftError> {
    let object = format!("element {} of set {}", element_name(e), set.name);
    if e.key.len() != key.len() {
        return Err(invalid(&object, format!("key has {} components, the set {}", e.key.len(), key.len())));
    }
    if e.data.len() != data.len() {
        return Err(invalid(&object, format!("data has {} components, the set {}", e.data.len(), data.len())));
    }
    let concat = key.len() > 1;
    let hton = set.interval && concat;
    let (mut start, mut end) = (Vec::new(), Vec::new());
    for ((ty, info), v) in key.iter().zip(&e.key) {
        let (mut s, mut t) = encode_component(&object, *ty, v, set.interval, hton)?;
        if concat {
            s.resize(padded(info.len) as usize, 0);
            t.resize(padded(info.len) as usize, 0);
        }
        start.extend(s);
        end.extend(t);
    }
    if let ([(NftType::Verdict, _)], [v]) = (data, e.data.as_slice()) {
        // NFTA_SET_ELEM_DATA { NFTA_DATA_VERDICT { CODE, CHAIN } }.
        let Some(kuport_proto::v1::nft_value::Value::Verdict(v)) = &v.value else {
            return Err(invalid(&object, "a verdict map's data must be a verdict"));
        };
        let (code, chain) = verdict_code(&object, v)?;
        let el = element_nest(w, n);
        w.put_data(NFTA_SET_ELEM_KEY, &start);
        if set.interval {
            w.put_data(NFTA_SET_ELEM_KEY_END, &end);
        }
        let dn = w.begin(NFTA_SET_ELEM_DATA);
        let vn = w.begin(NFTA_DATA_VERDICT);
        w.put(NFTA_VERDICT_CODE, &code.to_be_bytes());
        if let Some(c) = chain {
            w.put_str(NFTA_VERDICT_CHAIN, &c);
        }
        w.end(vn);
        w.end(dn);
        w.end(el);
        return Ok(());
    }
    let mut d = Vec::new();
    for ((ty, info), v) in data.iter().zip(&e.data) {
        let (mut s, _) = encode_component(&object, *ty, v, false, false)?;
        if data.len() > 1 {
            s.resize(padded(info.len) as usize, 0);
        }
        d.extend(s);
    }
    let el = element_nest(w, n);
    w.put_data(NFTA_SET_ELEM_KEY, &start);
    if set.interval {
        w.put_data(NFTA_SET_ELEM_KEY_END, &end);
    }
    if !data.is_empty() {
        w.put_data(NFTA_SET_ELEM_DATA, &d);
    }
    w.end(el);
    Ok(())
}

/// NEWSETELEM (or DELSETELEM) messages for `elements`, split so each stays below
/// [`MAX_ELEMS_BYTES`]. `set_id` refers to a set created in the same batch.
pub(crate) fn set_elements(
    ty: u16,
    family: u8,
    table: &str,
    set: &NftSet,
    set_id: Option<u32>,
    elements: &[&NftElement],
) -> Result<Vec<Msg>, NftError> {
    let object = format!("set {}", set.name);
    let key = types(&object, "key", &set.key)?;
    let data = types(&object, "data", &set.data)?;
    let mut out = Vec::new();
    let mut i = 0;
    while i < elements.len() {
        let mut w = AttrWriter::new();
        w.put_str(NFTA_SET_ELEM_LIST_TABLE, table);
        w.put_str(NFTA_SET_ELEM_LIST_SET, &set.name);
        if let Some(id) = set_id {
            w.put_u32(NFTA_SET_ELEM_LIST_SET_ID, id);
        }
        let list = w.begin(NFTA_SET_ELEM_LIST_ELEMENTS);
        let mut n = 0;
        let first = i;
        let single = single_interval(set);
        // nft starts a new single-field interval set with an end at zero when no interval
        // starts there.
        if single && i == 0 && ty == NFT_MSG_NEWSETELEM && set_id.is_some() {
            let (start, _) = encode_component(&object, key[0].0, &elements[0].key[0], true, false)?;
            if start.iter().any(|b| *b != 0) {
                put_bound(&mut w, &mut n, &vec![0; start.len()], true);
            }
        }
        while i < elements.len() && w.buf.len() < MAX_ELEMS_BYTES {
            if single {
                put_interval(&mut w, &mut n, set, key[0].0, elements[i])?;
            } else {
                put_element(&mut w, &mut n, set, &key, &data, elements[i])?;
            }
            i += 1;
        }
        w.end(list);
        let what = if elements.len() == 1 {
            format!("element {} of set {}", element_name(elements[0]), set.name)
        } else {
            format!("elements of set {}", set.name)
        };
        let mut m = msg(ty, if ty == NFT_MSG_NEWSETELEM { NLM_F_CREATE } else { 0 }, family, w, what);
        m.ops = i - first;
        out.push(m);
    }
    Ok(out)
}

/// Deletes every rule of `chain` (DELRULE without a handle: nft's `flush chain`).
pub(crate) fn flush_chain(family: u8, table: &str, chain: &str) -> Msg {
    let mut w = AttrWriter::new();
    w.put_str(NFTA_RULE_TABLE, table);
    w.put_str(NFTA_RULE_CHAIN, chain);
    msg(NFT_MSG_DELRULE, 0, family, w, format!("the rules of chain {chain}"))
}

/// Deletes `chain` (and its rules); the kernel refuses it while a rule or element jumps to it.
pub(crate) fn del_chain(family: u8, table: &str, chain: &str) -> Msg {
    let mut w = AttrWriter::new();
    w.put_str(NFTA_CHAIN_TABLE, table);
    w.put_str(NFTA_CHAIN_NAME, chain);
    msg(NFT_MSG_DELCHAIN, 0, family, w, format!("chain {chain}"))
}

pub(crate) fn new_rule(family: u8, table: &str, chain: &str, exprs: &[Expr], object: String) -> Msg {
    let mut w = AttrWriter::new();
    w.put_str(NFTA_RULE_TABLE, table);
    w.put_str(NFTA_RULE_CHAIN, chain);
    let l = w.begin(NFTA_RULE_EXPRESSIONS);
    for e in exprs {
        e.encode(&mut w);
    }
    w.end(l);
    msg(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, family, w, object)
}

/// The sets rules can read; `with_ids` when the sets are created in the same batch (their
/// ids are their 1-based positions, as nft numbers them).
pub(crate) fn rule_ctx(table: &NftTable, with_ids: bool) -> RuleCtx {
    rule_ctx_at(table, with_ids.then_some(0))
}

/// [`rule_ctx`] with the sets' ids after `base` (Some) when the batch creates other tables'
/// sets before these.
pub(crate) fn rule_ctx_at(table: &NftTable, base: Option<u32>) -> RuleCtx {
    let sets = table
        .sets
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let conv = |ts: &[i32]| ts.iter().map(|t| NftType::try_from(*t).unwrap_or(NftType::Unspecified)).collect();
            let r = SetRef {
                key: conv(&s.key),
                data: conv(&s.data),
                interval: s.interval,
                dynamic: s.dynamic,
                id: base.map(|b| b + i as u32 + 1),
            };
            (s.name.clone(), r)
        })
        .collect();
    RuleCtx { family: NftFamily::try_from(table.family).unwrap_or(NftFamily::Unspecified), sets }
}

/// The name of rule `index` (0-based) of `chain`, for errors and diffs.
pub(crate) fn rule_name(chain: &str, index: usize) -> String {
    format!("rule {} of chain {chain}", index + 1)
}
