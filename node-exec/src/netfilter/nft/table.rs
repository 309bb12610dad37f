//! One table, one shot: reading it from the kernel, making it equal to a desired one, removing
//! it, and its normal form. [`super::Applier`] builds on this and remembers what it applied.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use kuport_proto::v1::{
    ChainCounters, ElementCount, NetnsState, NftChain, NftElement, NftFamily, NftRule, NftSet, NftTable, NodeState,
    RuleCount, SetCounters, TableCounters,
};

use super::attr::{self, AttrWriter, ReadNft, decode_err};
use super::consts::*;
use super::diff::{NftDiff, by_key, diff, header};
use super::encode::{self, Msg, family_code, rule_name};
use super::expr::Expr;
use super::rule::{compile, decompile};
use super::socket::{KernelError, Socket};
use super::value::{decode_component, encode_component, verdict_code, verdict_of};
use super::{NftError, decode};
use crate::sys::netlink::reason;

/// Knobs of [`apply_table_with`].
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Most operations (objects, elements) per transaction, as kube-proxy bounds its own so
    /// that one commit never holds the nf_tables commit mutex for long.
    pub max_ops_per_batch: usize,
}

impl Default for ApplyOptions {
    fn default() -> Self {
        Self { max_ops_per_batch: 1000 }
    }
}

/// What an apply did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyMode {
    /// The kernel already matched: nothing written.
    Unchanged,
    /// Only elements differed: they were added/removed in place.
    Elements,
    /// The table was (re)built whole.
    Replaced,
    /// Chains were added, removed or had their rules rewritten in place, with the elements that
    /// changed; the sets were kept (with what the kernel holds in dynamic ones).
    Chains,
}

#[derive(Debug, Clone)]
pub struct ApplyReport {
    pub mode: ApplyMode,
    /// nf_tables messages written (batch begin/end not counted); 0 when unchanged.
    pub writes: usize,
    /// Transactions committed.
    pub batches: usize,
    /// What differed before the apply.
    pub diffs: Vec<NftDiff>,
    /// Desired elements an [`super::Applier`] compared with remembered ones (0 on other paths):
    /// what digests and runs did not let it skip.
    pub compared: usize,
}

/// Sorts a table the canonical way (kuport_proto::canonicalize), without set digests and
/// without what the executor alone reads (`udp_flows`): a table read back has neither, so
/// comparing it with a normal form never reports them.
fn canonical(table: NftTable) -> NftTable {
    let mut st = NodeState {
        node: String::new(),
        netns: vec![NetnsState { nft_tables: vec![table].into(), ..Default::default() }],
    };
    kuport_proto::canonical::order(&mut st);
    let mut table = st.netns.pop().and_then(|mut n| n.nft_tables.pop()).unwrap_or_default();
    for s in &mut table.sets {
        s.udp_flows = kuport_proto::v1::UdpFlows::Kept as i32;
    }
    table
}

/// The normal form of a table: canonical order, every element and rule in the form the kernel
/// gives back (`10.0.0.1/32` is `10.0.0.1`, `meta l4proto tcp th dport 80` is `tcp dport 80`).
/// Validates the table on the way.
pub fn normalize(table: &NftTable) -> Result<NftTable, NftError> {
    family_code(table.family)?;
    if table.name.is_empty() {
        return Err(NftError::Invalid { object: "table".into(), reason: "empty table name".into() });
    }
    let mut t = canonical(table.clone());
    for s in &mut t.sets {
        encode::check_set(s)?;
        let elems = std::mem::take(&mut s.elements);
        let normal = elems.iter().map(|e| normalize_element(s, e)).collect::<Result<Vec<_>, _>>()?;
        s.elements = normal.into();
    }
    check_jumps(&t)?;
    let ctx = encode::rule_ctx(&t, false);
    for c in &mut t.chains {
        for (i, r) in c.rules.iter_mut().enumerate() {
            let object = rule_name(&c.name, i);
            *r = decompile(&compile(r, &ctx, &object)?, ctx.family, &object)?;
        }
    }
    let mut t = canonical(t);
    for s in &mut t.sets {
        let before = s.elements.len();
        if by_key(s).len() != before {
            return Err(NftError::Invalid {
                object: format!("set {}", s.name),
                reason: "two elements with the same key".into(),
            });
        }
    }
    Ok(t)
}

/// Every jump and goto of a verdict map names a regular chain of the table: the kernel refuses
/// a jump to a base chain or to a chain that does not exist, and would refuse the whole
/// transaction.
fn check_jumps(t: &NftTable) -> Result<(), NftError> {
    let chains = by_name(&t.chains);
    for s in &t.sets {
        for e in &s.elements {
            check_jump(&s.name, e, &chains)?;
        }
    }
    Ok(())
}

/// Chains by name: a table may hold a chain per limited mapping, tens of thousands, so every
/// comparison of two tables' chains goes through an index.
pub(crate) fn by_name(chains: &[NftChain]) -> HashMap<&str, &NftChain> {
    chains.iter().map(|c| (c.name.as_str(), c)).collect()
}

/// [`check_jumps`] for one element of set `set`, against the table's `chains`.
pub(crate) fn check_jump(set: &str, e: &NftElement, chains: &HashMap<&str, &NftChain>) -> Result<(), NftError> {
    use kuport_proto::v1::{VerdictKind, nft_value::Value};
    for v in &e.data {
        let Some(Value::Verdict(v)) = &v.value else { continue };
        if !matches!(VerdictKind::try_from(v.kind), Ok(VerdictKind::Jump | VerdictKind::Goto)) {
            continue;
        }
        match chains.get(v.chain.as_str()) {
            Some(c) if c.base.is_none() => {}
            found => {
                let why = if found.is_some() { "is a base chain" } else { "does not exist" };
                return Err(NftError::Invalid {
                    object: format!("element {} of set {set}", encode::element_name(e)),
                    reason: format!("jumps to chain {}, which {why}: only a regular chain of the table", v.chain),
                });
            }
        }
    }
    Ok(())
}

/// Whether `have` becomes `want` in place: the same sets (names and declarations), and every
/// chain both hold on the same hook. Then chains are added, removed and rewritten and elements
/// changed without rebuilding the table, so a dynamic set keeps what the kernel holds in it.
pub(crate) fn in_place(want: &NftTable, have: &NftTable) -> bool {
    let same_set = |w: &NftSet| have.sets.iter().any(|h| h.name == w.name && header(h) == header(w));
    want.sets.len() == have.sets.len() && want.sets.iter().all(same_set) && {
        let have = by_name(&have.chains);
        want.chains.iter().all(|w| have.get(w.name.as_str()).is_none_or(|h| h.base == w.base))
    }
}

/// The messages that turn chains `have` into `want`'s in place, as (head, tail). The head creates
/// the added chains, then flushes each changed chain and writes the rules of the added and
/// changed ones: once it is committed, a rule or element may jump to a new chain. The tail
/// flushes the removed chains, then deletes them: it goes last, after the elements and rules
/// that jumped to them are gone (the kernel refuses a chain something still jumps to, EBUSY).
pub(crate) fn chain_changes(fam: u8, want: &NftTable, have: &[NftChain]) -> Result<(Vec<Msg>, Vec<Msg>), NftError> {
    let mut head = Vec::new();
    let (had, wanted) = (by_name(have), by_name(&want.chains));
    let added: Vec<&NftChain> = want.chains.iter().filter(|w| !had.contains_key(w.name.as_str())).collect();
    for c in &added {
        head.push(encode::new_chain(fam, &want.name, c)?);
    }
    let ctx = encode::rule_ctx(want, false);
    let mut next_id = 1;
    for c in &want.chains {
        let old = had.get(c.name.as_str());
        match old {
            Some(h) if h.rules == c.rules => continue,
            Some(_) => head.push(encode::flush_chain(fam, &want.name, &c.name)),
            None => {}
        }
        for (i, r) in c.rules.iter().enumerate() {
            let object = rule_name(&c.name, i);
            let mut exprs = compile(r, &ctx, &object)?;
            for e in &mut exprs {
                if let Expr::Literal { key, values, set_id, .. } = e {
                    head.extend(encode::anon_set(fam, &want.name, *key, values, next_id, &object)?);
                    *set_id = Some(next_id);
                    next_id += 1;
                }
            }
            head.push(encode::new_rule(fam, &want.name, &c.name, &exprs, object));
        }
    }
    let removed: Vec<&NftChain> = have.iter().filter(|h| !wanted.contains_key(h.name.as_str())).collect();
    let mut tail: Vec<Msg> = removed.iter().map(|c| encode::flush_chain(fam, &want.name, &c.name)).collect();
    tail.extend(removed.iter().map(|c| encode::del_chain(fam, &want.name, &c.name)));
    Ok((head, tail))
}

/// The head, then the element groups packed into transactions, then the tail in the last one.
pub(crate) fn assemble(head: Vec<Msg>, groups: Vec<Vec<Msg>>, tail: Vec<Msg>, budget: usize) -> Vec<Vec<Msg>> {
    let mut batches = pack(head, groups, budget);
    match batches.last_mut() {
        Some(last) => last.extend(tail),
        None if !tail.is_empty() => batches.push(tail),
        None => {}
    }
    batches
}

pub(crate) fn normalize_element(set: &NftSet, e: &NftElement) -> Result<NftElement, NftError> {
    let object = format!("element {} of set {}", encode::element_name(e), set.name);
    let bad = |reason: &str| NftError::Invalid { object: object.clone(), reason: reason.into() };
    if e.key.len() != set.key.len() || e.data.len() != set.data.len() {
        return Err(bad("wrong number of components"));
    }
    let hton = set.interval && set.key.len() > 1;
    let mut out = NftElement::default();
    for (t, v) in set.key.iter().zip(&e.key) {
        let ty = kuport_proto::v1::NftType::try_from(*t).map_err(|_| bad("unknown type"))?;
        let (s, end) = encode_component(&object, ty, v, set.interval, hton)?;
        out.key.push(decode_component(ty, &s, &end, hton)?);
    }
    for (t, v) in set.data.iter().zip(&e.data) {
        let ty = kuport_proto::v1::NftType::try_from(*t).map_err(|_| bad("unknown type"))?;
        if ty == kuport_proto::v1::NftType::Verdict {
            let Some(kuport_proto::v1::nft_value::Value::Verdict(verdict)) = &v.value else {
                return Err(bad("a verdict map's data must be a verdict"));
            };
            let (code, chain) = verdict_code(&object, verdict)?;
            let normal = verdict_of(code, chain.as_deref()).ok_or_else(|| bad("unknown verdict"))?;
            out.data
                .push(kuport_proto::v1::NftValue { value: Some(kuport_proto::v1::nft_value::Value::Verdict(normal)) });
            continue;
        }
        let (s, _) = encode_component(&object, ty, v, false, false)?;
        out.data.push(decode_component(ty, &s, &s, false)?);
    }
    Ok(out)
}

fn name_attr(ty: u16, name: &str) -> Vec<u8> {
    let mut w = AttrWriter::new();
    w.put_str(ty, name);
    w.buf
}

/// Reads table `name` of `family` from the kernel, or None when it does not exist.
pub fn read_table(netns: Option<&Path>, family: NftFamily, name: &str) -> Result<Option<NftTable>, NftError> {
    let mut sock = Socket::open_in(netns)?;
    read_with(&mut sock, family, name)
}

/// How often a read is repeated because a transaction committed while it ran.
const READ_ATTEMPTS: usize = 10;

/// Reads the table consistently: its chains, sets and rules come in separate dumps, so a
/// transaction committed between them (a repair replacing the table) could pair one version's
/// rules with another's chains. The read is repeated until the ruleset generation is the same
/// before and after it.
fn read_with(sock: &mut Socket, family: NftFamily, name: &str) -> Result<Option<NftTable>, NftError> {
    let mut last = None;
    for _ in 0..READ_ATTEMPTS {
        let before = generation(sock)?;
        let read = read_once(sock, family, name);
        if generation(sock)? == before {
            return read;
        }
        last = Some(read);
    }
    last.unwrap_or(Ok(None))
}

/// The ruleset's generation id.
fn generation(sock: &mut Socket) -> Result<u32, NftError> {
    let answers = sock.request(NFT_MSG_GETGEN, NFPROTO_UNSPEC, &[], false)?;
    let payload = answers.first().ok_or_else(|| decode_err("no answer to NFT_MSG_GETGEN".into()))?;
    let attrs = attr::parse(payload)?;
    attr::find(&attrs, NFTA_GEN_ID).ok_or_else(|| decode_err("NFT_MSG_NEWGEN without an id".into()))?.u32()
}

fn read_once(sock: &mut Socket, family: NftFamily, name: &str) -> Result<Option<NftTable>, NftError> {
    let fam = family_code(family as i32)?;
    if sock.request(NFT_MSG_GETTABLE, fam, &name_attr(NFTA_TABLE_NAME, name), false)?.is_empty() {
        return Ok(None);
    }
    let mut table = NftTable { family: family as i32, name: name.to_string(), ..Default::default() };
    for p in sock.request(NFT_MSG_GETCHAIN, fam, &name_attr(NFTA_CHAIN_TABLE, name), true)? {
        let (t, c) = decode::chain(&p)?;
        if t == name {
            table.chains.push(c);
        }
    }
    // A rule's literal sets (`meta l4proto { tcp, udp }`), by their kernel names.
    let mut anonymous: BTreeMap<String, NftSet> = BTreeMap::new();
    for p in sock.request(NFT_MSG_GETSET, fam, &name_attr(NFTA_SET_TABLE, name), true)? {
        let (t, mut s, flags) = decode::set(&p)?;
        if t != name {
            continue;
        }
        let mut w = AttrWriter::new();
        w.put_str(NFTA_SET_ELEM_LIST_TABLE, name);
        w.put_str(NFTA_SET_ELEM_LIST_SET, &s.name);
        if s.dynamic {
            // Its elements are the kernel's (per-source state): never read, never compared.
        } else if encode::single_interval(&s) {
            let mut bounds = Vec::new();
            for e in sock.request(NFT_MSG_GETSETELEM, fam, &w.buf, true)? {
                decode::interval_bounds(&e, &mut bounds)?;
            }
            decode::interval_elements(bounds, &mut s)?;
        } else {
            for e in sock.request(NFT_MSG_GETSETELEM, fam, &w.buf, true)? {
                decode::elements(&e, &mut s)?;
            }
        }
        if flags & NFT_SET_ANONYMOUS != 0 {
            anonymous.insert(s.name.clone(), s);
        } else {
            table.sets.push(s);
        }
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let position: HashMap<String, usize> = table.chains.iter().enumerate().map(|(i, c)| (c.name.clone(), i)).collect();
    for p in sock.request(NFT_MSG_GETRULE, fam, &name_attr(NFTA_RULE_TABLE, name), true)? {
        let (t, chain, r) = decode::rule(&p, family, |c| counts.get(c).copied().unwrap_or(0))?;
        if t != name {
            continue;
        }
        *counts.entry(chain.clone()).or_default() += 1;
        let r = inline_literals(r, &anonymous)?;
        match position.get(&chain) {
            Some(&i) => table.chains[i].rules.push(r),
            None => return Err(NftError::Decode { what: format!("rule of unknown chain {chain}") }),
        }
    }
    Ok(Some(canonical(table)))
}

/// Puts back each lookup in an anonymous set as the literal set it was written as.
pub(crate) fn inline_literals(mut r: NftRule, anonymous: &BTreeMap<String, NftSet>) -> Result<NftRule, NftError> {
    use kuport_proto::v1::{LiteralSet, nft_match};
    for m in &mut r.matches {
        let Some(nft_match::Kind::Lookup(l)) = &m.kind else { continue };
        let Some(set) = anonymous.get(&l.set) else { continue };
        let [selector] = l.key[..] else {
            return Err(decode_err(format!("literal set {} with a concatenated key", l.set)));
        };
        let mut values: Vec<_> = set.elements.iter().filter_map(|e| e.key.first().cloned()).collect();
        kuport_proto::canonical::sort_values(&mut values);
        m.kind = Some(nft_match::Kind::Literal(LiteralSet { selector, values, negate: l.negate }));
    }
    Ok(r)
}

/// Makes table `desired` exist exactly as given in `netns`, with default options.
pub fn apply_table(netns: Option<&Path>, desired: &NftTable) -> Result<ApplyReport, NftError> {
    apply_table_with(netns, desired, &ApplyOptions::default())
}

/// Makes table `desired` exist exactly as given. Only that table is read or written.
///
/// The kernel's table is read back and compared first: when it already matches, nothing is
/// written. A table that does not decode (something outside kuport's vocabulary or shapes,
/// written by hand) is rebuilt. When only set/map elements differ, they are removed/added in place, in
/// transactions of at most `max_ops_per_batch` elements (an element whose data changes is
/// deleted and re-added in the same transaction, so it never disappears). Otherwise the
/// table is rebuilt: one transaction adds, deletes and re-adds the table with its chains,
/// sets and rules, so the kernel swaps old for new atomically and a refusal leaves the old
/// table untouched; an absent table is only created.
///
/// Atomicity trade-off: that first transaction also carries as many elements as the budget
/// allows; the rest follow in further transactions. A table rebuilt with more elements than
/// the budget is briefly visible with part of its elements (new connections to the missing
/// ones are not translated until the last chunk commits, a few milliseconds later), which is
/// what bounding the commit-lock hold time costs. If a later chunk is refused, the error says
/// so and the next apply (which diffs again) completes it element by element.
pub fn apply_table_with(
    netns: Option<&Path>,
    desired: &NftTable,
    opts: &ApplyOptions,
) -> Result<ApplyReport, NftError> {
    let want = normalize(desired)?;
    let mut sock = Socket::open_in(netns)?;
    apply_normal(&mut sock, &want, opts)
}

/// The read-back apply of a table already in normal form, on an open socket.
pub(crate) fn apply_normal(sock: &mut Socket, want: &NftTable, opts: &ApplyOptions) -> Result<ApplyReport, NftError> {
    let fam = family_code(want.family)?;
    let family = NftFamily::try_from(want.family).unwrap_or(NftFamily::Unspecified);
    // A table that does not decode is not kuport's table as it wrote it (a hand-made change
    // outside the model's vocabulary or shapes): it is rebuilt whole.
    let (have, unreadable) = match read_with(sock, family, &want.name) {
        Ok(have) => (have, None),
        Err(NftError::Decode { what }) => (None, Some(what)),
        Err(e) => return Err(e),
    };
    let diffs = match &unreadable {
        Some(what) => vec![NftDiff::Unreadable(what.clone())],
        None => diff(want, have.as_ref()),
    };
    let budget = opts.max_ops_per_batch.max(1);
    let mut report =
        ApplyReport { mode: ApplyMode::Unchanged, writes: 0, batches: 0, diffs: diffs.clone(), compared: 0 };
    if diffs.is_empty() {
        return Ok(report);
    }
    let batches = match &have {
        Some(have) if diffs.iter().all(NftDiff::is_element) => {
            report.mode = ApplyMode::Elements;
            let (mut dels, adds) = element_groups(fam, want, have, budget)?;
            dels.extend(adds);
            pack(Vec::new(), dels, budget)
        }
        Some(have) if in_place(want, have) => {
            report.mode = ApplyMode::Chains;
            let (mut dels, adds) = element_groups(fam, want, have, budget)?;
            dels.extend(adds);
            let (head, tail) = chain_changes(fam, want, &have.chains)?;
            assemble(head, dels, tail, budget)
        }
        _ => {
            report.mode = ApplyMode::Replaced;
            // Read just now: an absent table is created without the delete (below).
            replace_batches_at(fam, want, budget, 0, have.is_none() && unreadable.is_none())?.0
        }
    };
    send(sock, &batches, &mut report)?;
    Ok(report)
}

/// Commits `batches` in order, counting them and their messages in `report`.
pub(crate) fn send(sock: &mut Socket, batches: &[Vec<Msg>], report: &mut ApplyReport) -> Result<(), NftError> {
    for (i, b) in batches.iter().enumerate() {
        sock.batch(b).map_err(|errs| refused(errs, i, batches.len()))?;
        report.batches += 1;
        report.writes += b.len();
    }
    Ok(())
}

fn refused(errs: Vec<KernelError>, index: usize, total: usize) -> NftError {
    let mut it = errs.into_iter();
    let Some(first) = it.next() else {
        return NftError::Kernel { object: "batch".into(), errno: 0, reason: "refused without a reason".into() };
    };
    let mut why = reason(first.errno, first.message.as_deref());
    let rest: Vec<String> = it.map(|e| format!("{}: {}", e.object, reason(e.errno, e.message.as_deref()))).collect();
    if !rest.is_empty() {
        why = format!("{why}; also {}", rest.join("; "));
    }
    if total > 1 {
        why = format!("{why} (transaction {} of {total}; the earlier ones are committed)", index + 1);
    }
    NftError::Kernel { object: first.object, errno: first.errno, reason: why }
}

/// Packs messages into batches of at most `budget` operations; `head` stays whole.
pub(crate) fn pack(head: Vec<Msg>, rest: Vec<Vec<Msg>>, budget: usize) -> Vec<Vec<Msg>> {
    let mut out = Vec::new();
    let mut cur = head;
    let mut ops: usize =
        cur.iter().filter(|m| m.ty == NFT_MSG_NEWSETELEM || m.ty == NFT_MSG_DELSETELEM).map(|m| m.ops).sum();
    for group in rest {
        let n: usize = group.iter().map(|m| m.ops).sum();
        if ops + n > budget && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
            ops = 0;
        }
        ops += n;
        cur.extend(group);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Elements in groups of at most `budget`.
fn chunks<'a>(elems: &'a [&'a NftElement], budget: usize) -> impl Iterator<Item = &'a [&'a NftElement]> {
    elems.chunks(budget)
}

pub(crate) fn replace_batches(fam: u8, t: &NftTable, budget: usize) -> Result<Vec<Vec<Msg>>, NftError> {
    Ok(replace_batches_at(fam, t, budget, 0, false)?.0)
}

/// [`replace_batches`] numbering the table's sets (named, then anonymous) after `base`, so that
/// several tables share one transaction; also the last id used. `absent`: the table is known
/// not to exist, so it is only created (exclusively): a table deleted in a transaction makes
/// its commit wait for an RCU grace period, which doubled the cost of a cold apply
/// (docs/performance.md, "Interception: 100 pods on one node").
fn replace_batches_at(
    fam: u8,
    t: &NftTable,
    budget: usize,
    base: u32,
    absent: bool,
) -> Result<(Vec<Vec<Msg>>, u32), NftError> {
    let mut head = if absent {
        vec![encode::create_table(fam, &t.name)]
    } else {
        // Adding before deleting makes the delete valid whether or not the table exists.
        vec![encode::new_table(fam, &t.name), encode::del_table(fam, &t.name), encode::new_table(fam, &t.name)]
    };
    for c in &t.chains {
        head.push(encode::new_chain(fam, &t.name, c)?);
    }
    let mut left = budget;
    let mut later: Vec<Vec<Msg>> = Vec::new();
    for (i, s) in t.sets.iter().enumerate() {
        let id = base + i as u32 + 1;
        head.push(encode::new_set(fam, &t.name, s, id)?);
        let elems: Vec<&NftElement> = s.elements.iter().collect();
        let now = elems.len().min(left);
        if now > 0 {
            head.extend(encode::set_elements(NFT_MSG_NEWSETELEM, fam, &t.name, s, Some(id), &elems[..now])?);
            left -= now;
        }
        for c in chunks(&elems[now..], budget) {
            later.push(encode::set_elements(NFT_MSG_NEWSETELEM, fam, &t.name, s, None, c)?);
        }
    }
    let ctx = encode::rule_ctx_at(t, Some(base));
    // Anonymous sets take the ids after the named ones.
    let mut next_id = base + t.sets.len() as u32 + 1;
    for c in &t.chains {
        for (i, r) in c.rules.iter().enumerate() {
            let object = rule_name(&c.name, i);
            let mut exprs = compile(r, &ctx, &object)?;
            for e in &mut exprs {
                if let Expr::Literal { key, values, set_id, .. } = e {
                    head.extend(encode::anon_set(fam, &t.name, *key, values, next_id, &object)?);
                    *set_id = Some(next_id);
                    next_id += 1;
                }
            }
            head.push(encode::new_rule(fam, &t.name, &c.name, &exprs, object));
        }
    }
    Ok((pack(head, later, budget), next_id - 1))
}

/// Tables created whole and tables removed, in one transaction on `sock`: the kernel commits
/// them in one generation or refuses them all (docs/intercept/table.md, lifecycle). `creates`
/// are in normal form ([`normalize`]) and known absent; `removes` are kuport's. Ok(None),
/// nothing sent, when their elements exceed one transaction's `budget` (the caller then applies
/// them one by one).
pub fn create_and_remove(
    netns: Option<&Path>,
    creates: &[&NftTable],
    removes: &[(NftFamily, String)],
    budget: usize,
) -> Result<Option<ApplyReport>, NftError> {
    let elements: usize = creates.iter().flat_map(|t| &t.sets).map(|s| s.elements.len()).sum();
    if elements > budget {
        return Ok(None);
    }
    let mut msgs = Vec::new();
    let mut diffs = Vec::new();
    let mut last_id = 0;
    for t in creates {
        let (batches, last) = replace_batches_at(family_code(t.family)?, t, budget, last_id, true)?;
        last_id = last;
        msgs.extend(batches.into_iter().flatten());
        diffs.extend(diff(t, None));
    }
    for (family, name) in removes {
        let fam = family_code(*family as i32)?;
        // Add-then-delete is valid whether or not the table still exists.
        msgs.extend([encode::new_table(fam, name), encode::del_table(fam, name)]);
    }
    let mut report = ApplyReport { mode: ApplyMode::Replaced, writes: 0, batches: 0, diffs, compared: 0 };
    if !msgs.is_empty() {
        send(&mut Socket::open_in(netns)?, &[msgs], &mut report)?;
    }
    Ok(Some(report))
}

/// The element changes from `have` to `want`: (removals, additions and changes), each a group of
/// messages for one transaction. Removals go first: an interval element may only be re-added
/// once its overlap is gone.
#[allow(clippy::type_complexity)]
fn element_groups(
    fam: u8,
    want: &NftTable,
    have: &NftTable,
    budget: usize,
) -> Result<(Vec<Vec<Msg>>, Vec<Vec<Msg>>), NftError> {
    let mut dels: Vec<Vec<Msg>> = Vec::new();
    let mut adds: Vec<Vec<Msg>> = Vec::new();
    for s in &want.sets {
        let Some(h) = have.sets.iter().find(|x| x.name == s.name) else { continue };
        let (w, hv) = (by_key(s), by_key(h));
        let extra: Vec<&NftElement> = hv.iter().filter(|(k, _)| !w.contains_key(*k)).map(|(_, e)| *e).collect();
        let missing: Vec<&NftElement> = w.iter().filter(|(k, _)| !hv.contains_key(*k)).map(|(_, e)| *e).collect();
        for c in chunks(&extra, budget) {
            dels.push(encode::set_elements(NFT_MSG_DELSETELEM, fam, &want.name, s, None, c)?);
        }
        for c in chunks(&missing, budget) {
            adds.push(encode::set_elements(NFT_MSG_NEWSETELEM, fam, &want.name, s, None, c)?);
        }
        // A changed element: delete the old and add the new in one transaction.
        for (k, e) in &w {
            if let Some(old) = hv.get(k).filter(|old| old.data != e.data) {
                let mut pair = encode::set_elements(NFT_MSG_DELSETELEM, fam, &want.name, s, None, &[*old])?;
                pair.extend(encode::set_elements(NFT_MSG_NEWSETELEM, fam, &want.name, s, None, &[*e])?);
                adds.push(pair);
            }
        }
    }
    Ok((dels, adds))
}

/// Deletes table `name` of `family` (one kuport owns); Ok(false) when it did not exist.
pub fn remove_table(netns: Option<&Path>, family: NftFamily, name: &str) -> Result<bool, NftError> {
    let fam = family_code(family as i32)?;
    let mut sock = Socket::open_in(netns)?;
    if sock.request(NFT_MSG_GETTABLE, fam, &name_attr(NFTA_TABLE_NAME, name), false)?.is_empty() {
        return Ok(false);
    }
    // Add-then-delete is valid even if the table vanished since the read.
    let msgs = vec![encode::new_table(fam, name), encode::del_table(fam, name)];
    sock.batch(&msgs).map_err(|e| refused(e, 0, 1))?;
    Ok(true)
}

/// The bytes counted by the rules of table `name` that look up one of `sets` and accept: the
/// sum of their counters' bytes, read over netlink (the relay's accept rule, whose counter
/// counts what a relay forwarded between two peers: docs/overlay/reach.md, "Relayed bytes").
/// 0 when the table does not exist. A rule outside kuport's vocabulary is no such rule.
pub fn accepted_bytes(netns: Option<&Path>, family: NftFamily, name: &str, sets: &[&str]) -> Result<u64, NftError> {
    let mut sock = Socket::open_in(netns)?;
    let fam = family_code(family as i32)?;
    if sock.request(NFT_MSG_GETTABLE, fam, &name_attr(NFTA_TABLE_NAME, name), false)?.is_empty() {
        return Ok(0);
    }
    let mut total = 0u64;
    for p in sock.request(NFT_MSG_GETRULE, fam, &name_attr(NFTA_RULE_TABLE, name), true)? {
        let attrs = attr::parse(&p)?;
        if attr::find(&attrs, NFTA_RULE_TABLE).map(|t| t.str()).transpose()?.as_deref() != Some(name) {
            continue;
        }
        let Some(list) = attr::find(&attrs, NFTA_RULE_EXPRESSIONS) else { continue };
        let Ok(exprs) = super::expr::decode_list(list) else { continue };
        let looks_up = exprs.iter().any(|e| matches!(e, Expr::Lookup { set, .. } if sets.contains(&set.as_str())));
        let accepts = exprs
            .iter()
            .any(|e| matches!(e, Expr::Immediate { dreg: 0, data: super::expr::Imm::Verdict { code: NF_ACCEPT, .. } }));
        if looks_up && accepts {
            total = total.saturating_add(rule_counter(list)?.1);
        }
    }
    Ok(total)
}

/// The (packets, bytes) of the counter expressions in a rule's expression list.
fn rule_counter(list: &attr::Attr<'_>) -> Result<(u64, u64), NftError> {
    let mut total = (0u64, 0u64);
    for elem in list.nested()?.iter().filter(|a| a.ty == NFTA_LIST_ELEM) {
        let (p, b) = decode::counter_of(&elem.nested()?)?;
        total = (total.0.saturating_add(p), total.1.saturating_add(b));
    }
    Ok(total)
}

/// The counters of table `name` of `family` in `netns` as the kernel holds them now
/// (docs/operations/counters.md): each counted element of its named sets and maps, and each
/// rule's counter, by chain and position; those at 0 are left out. None when the table does not
/// exist. A dynamic set's elements (per-source state) and single-field interval sets are not
/// read: kuport counts in neither.
pub fn read_counters(netns: Option<&Path>, family: NftFamily, name: &str) -> Result<Option<TableCounters>, NftError> {
    let mut sock = Socket::open_in(netns)?;
    let fam = family_code(family as i32)?;
    if sock.request(NFT_MSG_GETTABLE, fam, &name_attr(NFTA_TABLE_NAME, name), false)?.is_empty() {
        return Ok(None);
    }
    let mut out = TableCounters { family: family as i32, name: name.to_string(), ..Default::default() };
    for p in sock.request(NFT_MSG_GETSET, fam, &name_attr(NFTA_SET_TABLE, name), true)? {
        let (t, s, flags) = decode::set(&p)?;
        if t != name || !s.counter || s.dynamic || flags & NFT_SET_ANONYMOUS != 0 || encode::single_interval(&s) {
            continue;
        }
        let mut w = AttrWriter::new();
        w.put_str(NFTA_SET_ELEM_LIST_TABLE, name);
        w.put_str(NFTA_SET_ELEM_LIST_SET, &s.name);
        let mut elements = Vec::new();
        for e in sock.request(NFT_MSG_GETSETELEM, fam, &w.buf, true)? {
            for (el, (packets, bytes)) in decode::counted_elements(&e, &s)? {
                if packets > 0 {
                    elements.push(ElementCount { key: el.key, packets, bytes });
                }
            }
        }
        if !elements.is_empty() {
            out.sets.push(SetCounters { name: s.name, elements });
        }
    }
    let mut chains: BTreeMap<String, ChainCounters> = BTreeMap::new();
    let mut position: HashMap<String, u32> = HashMap::new();
    for p in sock.request(NFT_MSG_GETRULE, fam, &name_attr(NFTA_RULE_TABLE, name), true)? {
        let attrs = attr::parse(&p)?;
        if attr::find(&attrs, NFTA_RULE_TABLE).map(|t| t.str()).transpose()?.as_deref() != Some(name) {
            continue;
        }
        let chain = attr::need(&attrs, NFTA_RULE_CHAIN, "rule")?.str()?;
        // Rules come in chain order: a rule's position is how many of its chain came before.
        let index = position.entry(chain.clone()).or_default();
        let here = *index;
        *index += 1;
        let Some(list) = attr::find(&attrs, NFTA_RULE_EXPRESSIONS) else { continue };
        let (packets, bytes) = rule_counter(list)?;
        if packets > 0 {
            let c = chains.entry(chain.clone()).or_insert_with(|| ChainCounters { name: chain, rules: Vec::new() });
            c.rules.push(RuleCount { index: here, packets, bytes });
        }
    }
    out.chains = chains.into_values().collect();
    Ok(Some(out))
}

/// Every table of the families kuport writes (ip, ip6, inet) in `netns`, by family and name: what
/// finds the tables kuport owns by their name's prefix.
pub fn list_tables(netns: Option<&Path>) -> Result<Vec<(NftFamily, String)>, NftError> {
    let mut sock = Socket::open_in(netns)?;
    let mut out = Vec::new();
    // One dump per family: the answer's family sits in the header the socket strips.
    for family in [NftFamily::Ip, NftFamily::Ip6, NftFamily::Inet] {
        for p in sock.request(NFT_MSG_GETTABLE, family_code(family as i32)?, &[], true)? {
            let attrs = attr::parse(&p)?;
            out.push((family, attr::need(&attrs, NFTA_TABLE_NAME, "table name")?.str()?));
        }
    }
    Ok(out)
}
