//! The kernel's dumps decoded back into the model.

use kuport_proto::v1::{
    BaseChain, ChainPolicy, ChainType, Hook, NftChain, NftElement, NftSet, NftType, NftValue, nft_value::Value,
};

use super::NftError;
use super::attr::{Attr, ReadNft, decode_err, find, need, parse};
use super::consts::*;
use super::expr::decode_list;
use super::rule::decompile;
use super::value::{decode_component, padded, split_concat_id, type_from_id, type_info, verdict_of};

fn types_of(id: u32, what: &str) -> Result<Vec<NftType>, NftError> {
    type_from_id(id)
        .map(|t| vec![t])
        .or_else(|| split_concat_id(id))
        .ok_or_else(|| decode_err(format!("{what}: datatype {id:#x} is outside kuport's vocabulary")))
}

/// A chain of a GETCHAIN answer: (table, chain).
pub(crate) fn chain(payload: &[u8]) -> Result<(String, NftChain), NftError> {
    let a = parse(payload)?;
    let table = need(&a, NFTA_CHAIN_TABLE, "chain")?.str()?;
    let name = need(&a, NFTA_CHAIN_NAME, "chain")?.str()?;
    let object = format!("chain {name}");
    let base = match find(&a, NFTA_CHAIN_HOOK) {
        None => None,
        Some(h) => {
            let h = h.nested()?;
            let num = need(&h, NFTA_HOOK_HOOKNUM, &object)?.u32()?;
            let prio = need(&h, NFTA_HOOK_PRIORITY, &object)?.u32()? as i32;
            let hook = match num {
                NF_INET_PRE_ROUTING => Hook::Prerouting,
                NF_INET_LOCAL_IN => Hook::Input,
                NF_INET_FORWARD => Hook::Forward,
                NF_INET_LOCAL_OUT => Hook::Output,
                NF_INET_POST_ROUTING => Hook::Postrouting,
                n => return Err(decode_err(format!("{object}: hook {n}"))),
            };
            let ty = match need(&a, NFTA_CHAIN_TYPE, &object)?.str()?.as_str() {
                "filter" => ChainType::Filter,
                "nat" => ChainType::Nat,
                "route" => ChainType::Route,
                t => return Err(decode_err(format!("{object}: chain type {t}"))),
            };
            let policy = match find(&a, NFTA_CHAIN_POLICY).map(|p| p.u32()).transpose()?.map(|p| p as i32) {
                Some(NF_DROP) => ChainPolicy::Drop,
                _ => ChainPolicy::Accept,
            };
            Some(BaseChain { r#type: ty as i32, hook: hook as i32, priority: prio, policy: policy as i32 })
        }
    };
    Ok((table, NftChain { name, base, rules: Vec::new() }))
}

/// A set of a GETSET answer, without elements: (table, set).
/// A set of a GETSET answer: (table, set, its flags).
pub(crate) fn set(payload: &[u8]) -> Result<(String, NftSet, u32), NftError> {
    let a = parse(payload)?;
    let table = need(&a, NFTA_SET_TABLE, "set")?.str()?;
    let name = need(&a, NFTA_SET_NAME, "set")?.str()?;
    let object = format!("set {name}");
    let flags = find(&a, NFTA_SET_FLAGS).map(|f| f.u32()).transpose()?.unwrap_or(0);
    let key = types_of(need(&a, NFTA_SET_KEY_TYPE, &object)?.u32()?, &object)?;
    let data = if flags & NFT_SET_MAP != 0 {
        types_of(need(&a, NFTA_SET_DATA_TYPE, &object)?.u32()?, &object)?
    } else {
        Vec::new()
    };
    let counter = has_counter(&a)?;
    let size = match find(&a, NFTA_SET_DESC) {
        Some(d) => find(&d.nested()?, NFTA_SET_DESC_SIZE).map(|s| s.u32()).transpose()?.unwrap_or(0),
        None => 0,
    };
    let timeout_ms = match find(&a, NFTA_SET_TIMEOUT) {
        Some(t) => {
            let b: [u8; 8] = t.data.try_into().map_err(|_| decode_err(format!("{object}: timeout is not a u64")))?;
            u64::from_be_bytes(b)
        }
        None => 0,
    };
    // kuport writes whole seconds; anything else reads as a different set.
    let timeout_seconds =
        if timeout_ms % 1000 == 0 { u32::try_from(timeout_ms / 1000).unwrap_or(u32::MAX) } else { u32::MAX };
    Ok((
        table,
        NftSet {
            name,
            key: key.iter().map(|t| *t as i32).collect(),
            data: data.iter().map(|t| *t as i32).collect(),
            interval: flags & NFT_SET_INTERVAL != 0,
            counter,
            elements: Default::default(),
            digest: Vec::new(),
            runs: Vec::new(),
            // What conntrack flushes is the state's word; the kernel does not hold it.
            udp_flows: kuport_proto::v1::UdpFlows::Kept as i32,
            dynamic: flags & NFT_SET_EVAL != 0,
            size,
            timeout_seconds,
        },
        flags,
    ))
}

fn has_counter(a: &[Attr<'_>]) -> Result<bool, NftError> {
    let is_counter = |e: &Attr<'_>| -> Result<bool, NftError> {
        Ok(find(&e.nested()?, NFTA_EXPR_NAME).map(|n| n.str()).transpose()?.as_deref() == Some("counter"))
    };
    if let Some(e) = find(a, NFTA_SET_EXPR) {
        return is_counter(e);
    }
    if let Some(list) = find(a, NFTA_SET_EXPRESSIONS) {
        for e in list.nested()? {
            if is_counter(&e)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Splits a key into its components' bytes.
fn components<'a>(bytes: &'a [u8], types: &[NftType]) -> Result<Vec<&'a [u8]>, NftError> {
    if types.len() == 1 {
        return Ok(vec![bytes]);
    }
    let mut out = Vec::new();
    let mut at = 0usize;
    for t in types {
        let len = type_info(*t).map(|i| padded(i.len) as usize).unwrap_or(0);
        out.push(
            bytes
                .get(at..at + len)
                .ok_or_else(|| decode_err(format!("element of {} bytes is too short", bytes.len())))?,
        );
        at += len;
    }
    Ok(out)
}

/// The bounds of a single-field interval set's GETSETELEM answer: (key, ends an interval).
pub(crate) fn interval_bounds(payload: &[u8], out: &mut Vec<(Vec<u8>, bool)>) -> Result<(), NftError> {
    let a = parse(payload)?;
    let Some(list) = find(&a, NFTA_SET_ELEM_LIST_ELEMENTS) else { return Ok(()) };
    for el in list.nested()? {
        let e = el.nested()?;
        let key = need(&e, NFTA_SET_ELEM_KEY, "element")?.data_value()?;
        let flags = find(&e, NFTA_SET_ELEM_FLAGS).map(|f| f.u32()).transpose()?.unwrap_or(0);
        out.push((key, flags & NFT_SET_ELEM_INTERVAL_END != 0));
    }
    Ok(())
}

/// A single-field interval set's elements from its bounds: each start with the end after it
/// (the last address when none follows); an end with no start before it is nft's leading zero.
pub(crate) fn interval_elements(mut bounds: Vec<(Vec<u8>, bool)>, set: &mut NftSet) -> Result<(), NftError> {
    let ty = set.key.first().and_then(|t| NftType::try_from(*t).ok()).unwrap_or(NftType::Unspecified);
    // At one key an end sorts before a start: adjacent intervals.
    bounds.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut open: Option<Vec<u8>> = None;
    let push = |start: &[u8], last: &[u8], set: &mut NftSet| -> Result<(), NftError> {
        set.elements.push(NftElement { key: vec![decode_component(ty, start, last, false)?], data: Vec::new() });
        Ok(())
    };
    for (key, end) in bounds {
        match (end, open.take()) {
            (false, Some(s)) => {
                return Err(decode_err(format!("set {}: interval {s:02x?} has no end before {key:02x?}", set.name)));
            }
            (false, None) => open = Some(key),
            (true, Some(s)) => {
                let last = predecessor(&key)
                    .ok_or_else(|| decode_err(format!("set {}: an interval ends at zero", set.name)))?;
                push(&s, &last, set)?;
            }
            (true, None) => {}
        }
    }
    if let Some(s) = open {
        let top = vec![0xff; s.len()];
        push(&s, &top, set)?;
    }
    Ok(())
}

fn predecessor(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = b.to_vec();
    for x in out.iter_mut().rev() {
        let (v, borrow) = x.overflowing_sub(1);
        *x = v;
        if !borrow {
            return Some(out);
        }
    }
    None
}

/// The elements of a GETSETELEM answer, appended to `set`.
pub(crate) fn elements(payload: &[u8], set: &mut NftSet) -> Result<(), NftError> {
    let decoded = each_element(payload, set, |_| Ok(()))?;
    set.elements.extend(decoded.into_iter().map(|(e, ())| e));
    Ok(())
}

/// A counter's (packets, bytes).
pub(crate) type Count = (u64, u64);

/// The elements of a GETSETELEM answer with their counters; (0, 0) for an element without one.
pub(crate) fn counted_elements(payload: &[u8], set: &NftSet) -> Result<Vec<(NftElement, Count)>, NftError> {
    each_element(payload, set, |e| {
        if let Some(expr) = find(e, NFTA_SET_ELEM_EXPR) {
            return counter_of(&expr.nested()?);
        }
        let mut total = (0, 0);
        if let Some(list) = find(e, NFTA_SET_ELEM_EXPRESSIONS) {
            for expr in list.nested()? {
                let (p, b) = counter_of(&expr.nested()?)?;
                total = (total.0 + p, total.1 + b);
            }
        }
        Ok(total)
    })
}

/// A counter expression's (packets, bytes); (0, 0) for another expression.
pub(crate) fn counter_of(expr: &[Attr<'_>]) -> Result<Count, NftError> {
    if find(expr, NFTA_EXPR_NAME).map(|n| n.str()).transpose()?.as_deref() != Some("counter") {
        return Ok((0, 0));
    }
    let Some(data) = find(expr, NFTA_EXPR_DATA) else { return Ok((0, 0)) };
    let data = parse(data.data)?;
    let u64_of = |ty| -> Result<u64, NftError> {
        match find(&data, ty) {
            None => Ok(0),
            Some(a) => {
                let b: [u8; 8] = a.data.try_into().map_err(|_| decode_err("a counter is not a u64".into()))?;
                Ok(u64::from_be_bytes(b))
            }
        }
    };
    Ok((u64_of(NFTA_COUNTER_PACKETS)?, u64_of(NFTA_COUNTER_BYTES)?))
}

/// Each element of a GETSETELEM answer of `set`, with what `extra` reads of its attributes.
fn each_element<T>(
    payload: &[u8],
    set: &NftSet,
    extra: impl Fn(&[Attr<'_>]) -> Result<T, NftError>,
) -> Result<Vec<(NftElement, T)>, NftError> {
    let a = parse(payload)?;
    let Some(list) = find(&a, NFTA_SET_ELEM_LIST_ELEMENTS) else { return Ok(Vec::new()) };
    let key: Vec<NftType> = set.key.iter().map(|t| NftType::try_from(*t).unwrap_or(NftType::Unspecified)).collect();
    let data: Vec<NftType> = set.data.iter().map(|t| NftType::try_from(*t).unwrap_or(NftType::Unspecified)).collect();
    let hton = set.interval && key.len() > 1;
    let mut decoded = Vec::new();
    for el in list.nested()? {
        let e = el.nested()?;
        let start = need(&e, NFTA_SET_ELEM_KEY, "element")?.data_value()?;
        let end = match find(&e, NFTA_SET_ELEM_KEY_END) {
            Some(k) => k.data_value()?,
            None => start.clone(),
        };
        let (s, t) = (components(&start, &key)?, components(&end, &key)?);
        let mut out = NftElement::default();
        for ((ty, s), t) in key.iter().zip(s).zip(t) {
            out.key.push(decode_component(*ty, s, t, hton)?);
        }
        if data == [NftType::Verdict] {
            let d = need(&e, NFTA_SET_ELEM_DATA, "map element")?.nested()?;
            let v = need(&d, NFTA_DATA_VERDICT, "verdict map element")?.nested()?;
            let code = need(&v, NFTA_VERDICT_CODE, "verdict")?.u32()? as i32;
            let chain = find(&v, NFTA_VERDICT_CHAIN).map(|c| c.str()).transpose()?;
            let verdict = verdict_of(code, chain.as_deref()).ok_or_else(|| {
                decode_err(format!("set {}: verdict {code} is outside kuport's vocabulary", set.name))
            })?;
            out.data.push(NftValue { value: Some(Value::Verdict(verdict)) });
        } else if !data.is_empty() {
            let d = need(&e, NFTA_SET_ELEM_DATA, "map element")?.data_value()?;
            for (ty, b) in data.iter().zip(components(&d, &data)?) {
                out.data.push(decode_component(*ty, b, b, false)?);
            }
        }
        let x = extra(&e)?;
        decoded.push((out, x));
    }
    Ok(decoded)
}

/// A rule of a GETRULE answer: (table, chain, rule).
pub(crate) fn rule(
    payload: &[u8],
    family: kuport_proto::v1::NftFamily,
    index_in_chain: impl Fn(&str) -> usize,
) -> Result<(String, String, kuport_proto::v1::NftRule), NftError> {
    let a = parse(payload)?;
    let table = need(&a, NFTA_RULE_TABLE, "rule")?.str()?;
    let chain = need(&a, NFTA_RULE_CHAIN, "rule")?.str()?;
    let object = super::encode::rule_name(&chain, index_in_chain(&chain));
    let exprs = match find(&a, NFTA_RULE_EXPRESSIONS) {
        Some(l) => decode_list(l)?,
        None => Vec::new(),
    };
    let r = decompile(&exprs, family, &object)?;
    Ok((table, chain, r))
}

#[cfg(test)]
mod interval_tests {
    use super::*;
    use kuport_proto::build::set;

    fn v4(set_: &mut NftSet, bounds: &[([u8; 4], bool)]) -> Vec<String> {
        interval_elements(bounds.iter().map(|(k, e)| (k.to_vec(), *e)).collect(), set_).unwrap();
        set_.elements
            .iter()
            .map(|e| match &e.key[0].value {
                Some(kuport_proto::v1::nft_value::Value::Addr(a)) => a.clone(),
                v => format!("{v:?}"),
            })
            .collect()
    }

    /// nft's bounds: a leading end at zero, then each start and its exclusive end, in the
    /// kernel's (descending) dump order; an interval that reaches the top has no end.
    #[test]
    fn bounds_pair_into_prefixes() {
        let mut s = NftSet { interval: true, ..set("s", &[NftType::Ipv4Addr], &[], vec![]) };
        let got = v4(
            &mut s,
            &[
                ([255, 255, 255, 0], false),
                ([240, 241, 0, 0], true),
                ([240, 240, 0, 0], false),
                ([11, 0, 0, 0], true),
                ([10, 0, 0, 0], false),
                ([0, 0, 0, 0], true),
            ],
        );
        assert_eq!(got, ["10.0.0.0/8", "240.240.0.0/16", "255.255.255.0/24"]);
        // Adjacent intervals: an end and a start at one key.
        let mut s = NftSet { interval: true, ..set("s", &[NftType::Ipv4Addr], &[], vec![]) };
        let got = v4(
            &mut s,
            &[([10, 0, 0, 0], false), ([10, 0, 0, 128], true), ([10, 0, 0, 128], false), ([10, 0, 1, 0], true)],
        );
        assert_eq!(got, ["10.0.0.0/25", "10.0.0.128/25"]);
    }

    #[test]
    fn bounds_that_are_no_prefix_or_no_end_are_refused() {
        let mut s = NftSet { interval: true, ..set("s", &[NftType::Ipv4Addr], &[], vec![]) };
        let b = vec![(vec![10, 0, 0, 1], false), (vec![10, 0, 0, 4], true)];
        assert!(interval_elements(b, &mut s).is_err());
        let b = vec![(vec![10, 0, 0, 0], false), (vec![11, 0, 0, 0], false)];
        assert!(interval_elements(b, &mut s).is_err());
    }
}
