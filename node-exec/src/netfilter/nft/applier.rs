//! An applier that remembers the table it last applied, so a small change costs a small
//! transaction and no kernel read.
//!
//! The remembered table is trusted: whoever owns the [`Applier`] must call [`Applier::forget`]
//! when the kernel may have changed under it (a drift detector does), and the next apply then
//! reads the kernel back and repairs it like [`super::apply_table`] does.
//!
//! A desired set that carries a digest (`NftSet.digest`, which `kuport_proto::canonicalize`
//! computes) equal to the digest remembered for that set, with an unchanged header, is not
//! walked at all: the digest covers its elements. In a set whose digest changed, the runs the
//! caller gave (`NftSet.runs`) that equal remembered ones at the start and at the end are not
//! walked either, so a one-element change compares a run or two of elements, not the set.
//! Sets without a digest are compared element by element. Digests and runs are remembered
//! only after a successful write, and dropped on any error (the next apply then compares
//! elements again).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};
use std::time::Instant;

use kuport_proto::canonical::common_ends;
use kuport_proto::shared::Shared;
use kuport_proto::v1::{ElementRun, NftChain, NftElement, NftSet, NftTable, nft_value::Value};

use super::NftError;
use super::consts::{NFT_MSG_DELSETELEM, NFT_MSG_NEWSETELEM};
use super::diff::{NftDiff, diff};
use super::encode::{self, Msg, element_name, family_code};
use super::socket::Socket;
use super::table::{
    ApplyMode, ApplyOptions, ApplyReport, apply_normal, assemble, chain_changes, check_jump, in_place, normalize,
    normalize_element, pack, replace_batches, send,
};

/// FNV-1a's prime, for the (unused in practice) byte path of [`PassThrough`].
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A hasher that passes an already hashed u64 key through (maps keyed by [`key_hash`]).
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(FNV_PRIME);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// The hash of an element's key, from its values as given (no allocation). SipHash with
/// fixed keys: only the changed middle of a set and a cold start hash every element, so its
/// cost matters little, while a weak mix was measured colliding on kuport's own keys.
fn key_hash(key: &[kuport_proto::v1::NftValue]) -> u64 {
    use std::hash::Hash;
    let mut h = std::hash::DefaultHasher::new();
    key.len().hash(&mut h);
    for v in key {
        match &v.value {
            None => 0u8.hash(&mut h),
            Some(Value::Ifname(s)) => (1u8, s.as_str()).hash(&mut h),
            Some(Value::Addr(s)) => (2u8, s.as_str()).hash(&mut h),
            Some(Value::Proto(p)) => (3u8, *p).hash(&mut h),
            Some(Value::Port(r)) => (4u8, r.first, r.last).hash(&mut h),
            Some(Value::Mark(m)) => (5u8, *m).hash(&mut h),
            Some(Value::Id(i)) => (6u8, *i).hash(&mut h),
            Some(Value::Verdict(v)) => (7u8, v.kind, v.chain.as_str()).hash(&mut h),
        }
    }
    h.finish()
}

/// A remembered set: its header (elements empty), its elements in normal form in the order
/// they were last desired (so an unchanged run is recognised by a sequential comparison, which
/// is several times cheaper than a hash lookup per element), the hashes of their keys, and the
/// digest and runs the caller gave for exactly these elements (empty: none, or not trusted;
/// runs only while `elems` is in the caller's order).
struct SetMemory {
    header: NftSet,
    elems: Vec<NftElement>,
    keys: KeySet,
    digest: Vec<u8>,
    runs: Vec<ElementRun>,
}

type KeySet = HashSet<u64, BuildHasherDefault<PassThrough>>;

/// The table as last applied: the normal form, plus the chains as the caller gave them (so an
/// unchanged rule set is recognised by a plain comparison, without compiling rules).
struct Memory {
    family: i32,
    name: String,
    sets: Vec<SetMemory>,
    chains: Shared<NftChain>,
    raw_chains: Shared<NftChain>,
}

/// Why the fast path cannot answer (then the table is rebuilt or read back).
enum Slow {
    /// Sets or chains differ: rebuild without reading.
    Structure,
    /// Two different keys hash alike (astronomically rare): read back, which is exact.
    Collision,
}

/// The element delta of one set.
#[derive(Default)]
struct SetDelta {
    dels: Vec<NftElement>,
    adds: Vec<NftElement>,
    /// (old, new) with the same key.
    changed: Vec<(NftElement, NftElement)>,
    /// Where the differing middle of the remembered list starts, and how long it is.
    at: usize,
    replaced: usize,
    /// The desired middle in normal form, which replaces it once written.
    middle: Vec<NftElement>,
    /// The desired set's digest, remembered once written.
    digest: Vec<u8>,
    /// The remembered runs to replace (by index) and the desired runs that replace them, once
    /// written: only the runs that differ, so an apply allocates for a run or two, not for all.
    runs: Option<(std::ops::Range<usize>, Vec<ElementRun>)>,
    /// Desired elements compared: those neither the digest nor equal runs let it skip.
    walked: usize,
}

impl SetDelta {
    fn is_empty(&self) -> bool {
        self.dels.is_empty() && self.adds.is_empty() && self.changed.is_empty()
    }
}

/// Applies one table in one network namespace, remembering what it applied.
pub struct Applier {
    netns: Option<PathBuf>,
    opts: ApplyOptions,
    sock: Option<Socket>,
    memory: Option<Memory>,
}

impl Applier {
    /// An applier for `netns` (a path such as /var/run/netns/NAME, or None for the caller's
    /// namespace), remembering nothing yet.
    pub fn new(netns: Option<&Path>) -> Self {
        Self::with_options(netns, ApplyOptions::default())
    }

    pub fn with_options(netns: Option<&Path>, opts: ApplyOptions) -> Self {
        Self { netns: netns.map(Path::to_path_buf), opts, sock: None, memory: None }
    }

    /// Drops the remembered table: the next apply reads the kernel back (call it when the
    /// kernel may have changed under this applier).
    pub fn forget(&mut self) {
        self.memory = None;
    }

    /// Whether a table is remembered (the next apply of it will not read the kernel).
    pub fn remembers(&self) -> bool {
        self.memory.is_some()
    }

    /// Remembers `desired` as applied: `want`, its normal form, was just created whole by
    /// [`super::create_and_remove`] (so the next apply is a delta, as after [`Self::apply`]).
    pub fn created(&mut self, want: NftTable, desired: &NftTable) {
        self.memory = remember(want, desired);
    }

    /// The most operations one of its transactions carries.
    pub fn budget(&self) -> usize {
        self.opts.max_ops_per_batch.max(1)
    }

    /// Makes `desired` exist exactly as given, like [`super::apply_table`]. With a remembered
    /// table of the same name, only the difference to it is written (elements in place, or a
    /// rebuild when sets or chains changed) and nothing is read; otherwise the kernel is read
    /// back. Any error forgets the remembered table, so the next apply reads back again.
    pub fn apply(&mut self, desired: &NftTable) -> Result<ApplyReport, NftError> {
        let r = self.apply_inner(desired);
        if let Err(NftError::Io { .. }) = &r {
            // The socket may be broken: open a fresh one next time.
            self.sock = None;
        }
        r
    }

    fn socket(&mut self) -> Result<&mut Socket, NftError> {
        if self.sock.is_none() {
            self.sock = Some(Socket::open_in(self.netns.as_deref())?);
        }
        self.sock.as_mut().ok_or_else(|| NftError::Io {
            op: "netlink socket",
            source: std::io::Error::other("socket vanished after opening"),
        })
    }

    fn apply_inner(&mut self, desired: &NftTable) -> Result<ApplyReport, NftError> {
        let fast = match self.memory.take() {
            Some(m) if m.family == desired.family && m.name == desired.name => Some(m),
            _ => None,
        };
        let Some(mut mem) = fast else { return self.cold(desired) };
        // On errors, the memory is kept only when nothing can have been written.
        let started = Instant::now();
        match delta(&mut mem, desired) {
            Ok((deltas, chains)) => {
                match (started.elapsed(), self.write_delta(&mem, &deltas, chains.as_deref().map(Vec::as_slice))) {
                    (compared, Ok(report)) => {
                        // Where the time goes (the benchmark's KUPORT_BENCH_TRACE=1 prints it).
                        let written = started.elapsed() - compared;
                        tracing::debug!(
                            table = %mem.name, walked = report.compared, ?compared, ?written, writes = report.writes,
                            "delta applied from memory"
                        );
                        update(&mut mem, deltas);
                        if let Some(chains) = chains {
                            mem.chains = chains;
                            mem.raw_chains = desired.chains.clone();
                        }
                        self.memory = Some(mem);
                        Ok(report)
                    }
                    (_, Err(e)) => {
                        if unwritten(&e) {
                            self.memory = Some(mem.distrusted());
                        }
                        Err(e)
                    }
                }
            }
            Err(Ok(Slow::Structure)) => {
                let r = self.rebuild(&mem, desired);
                if matches!(&r, Err(e) if unwritten(e)) {
                    self.memory = Some(mem.distrusted());
                }
                r
            }
            Err(Ok(Slow::Collision)) => self.cold(desired),
            Err(Err(e)) => {
                self.memory = Some(mem.distrusted());
                Err(e)
            }
        }
    }

    /// No memory: read back, diff, write (the [`super::apply_table`] path), then remember.
    fn cold(&mut self, desired: &NftTable) -> Result<ApplyReport, NftError> {
        let want = normalize(desired)?;
        let opts = self.opts.clone();
        let report = apply_normal(self.socket()?, &want, &opts)?;
        self.memory = remember(want, desired);
        Ok(report)
    }

    /// Sets or chains changed: rebuild the table without reading it.
    fn rebuild(&mut self, old: &Memory, desired: &NftTable) -> Result<ApplyReport, NftError> {
        let want = normalize(desired)?;
        let fam = family_code(want.family)?;
        let diffs = diff(&skeleton(&want), Some(&old.skeleton()));
        let batches = replace_batches(fam, &want, self.opts.max_ops_per_batch.max(1))?;
        let mut report = ApplyReport { mode: ApplyMode::Replaced, writes: 0, batches: 0, diffs, compared: 0 };
        send(self.socket()?, &batches, &mut report)?;
        self.memory = remember(want, desired);
        Ok(report)
    }

    /// Writes the element deltas and, when `chains` is given, the chains' changes in place
    /// around them (`super::table::chain_changes`).
    fn write_delta(
        &mut self,
        mem: &Memory,
        deltas: &[SetDelta],
        chains: Option<&[NftChain]>,
    ) -> Result<ApplyReport, NftError> {
        let compared = deltas.iter().map(|d| d.walked).sum();
        let mut report = ApplyReport { mode: ApplyMode::Unchanged, writes: 0, batches: 0, diffs: Vec::new(), compared };
        if deltas.iter().all(SetDelta::is_empty) && chains.is_none() {
            return Ok(report);
        }
        report.mode = if chains.is_some() { ApplyMode::Chains } else { ApplyMode::Elements };
        let final_chains = super::table::by_name(chains.unwrap_or(&mem.chains));
        for (s, d) in mem.sets.iter().zip(deltas) {
            for e in d.adds.iter().chain(d.changed.iter().map(|(_, n)| n)) {
                check_jump(&s.header.name, e, &final_chains)?;
            }
        }
        let fam = family_code(mem.family)?;
        let budget = self.opts.max_ops_per_batch.max(1);
        let mut dels: Vec<Vec<Msg>> = Vec::new();
        let mut adds: Vec<Vec<Msg>> = Vec::new();
        for (s, d) in mem.sets.iter().zip(deltas) {
            let set = &s.header;
            let name = || set.name.clone();
            for e in &d.dels {
                report.diffs.push(NftDiff::ExtraElement { set: name(), element: element_name(e) });
            }
            for e in &d.adds {
                report.diffs.push(NftDiff::MissingElement { set: name(), element: element_name(e) });
            }
            for (_, e) in &d.changed {
                report.diffs.push(NftDiff::ChangedElement { set: name(), element: element_name(e) });
            }
            let del_refs: Vec<&NftElement> = d.dels.iter().collect();
            for c in del_refs.chunks(budget) {
                dels.push(encode::set_elements(NFT_MSG_DELSETELEM, fam, &mem.name, set, None, c)?);
            }
            let add_refs: Vec<&NftElement> = d.adds.iter().collect();
            for c in add_refs.chunks(budget) {
                adds.push(encode::set_elements(NFT_MSG_NEWSETELEM, fam, &mem.name, set, None, c)?);
            }
            // A changed element: delete the old and add the new in one transaction.
            for (old, new) in &d.changed {
                let mut pair = encode::set_elements(NFT_MSG_DELSETELEM, fam, &mem.name, set, None, &[old])?;
                pair.extend(encode::set_elements(NFT_MSG_NEWSETELEM, fam, &mem.name, set, None, &[new])?);
                adds.push(pair);
            }
        }
        // Removals first: an interval element may only be re-added once its overlap is gone.
        dels.extend(adds);
        let batches = match chains {
            Some(chains) => {
                let want = NftTable { chains: chains.to_vec().into(), ..mem.skeleton() };
                report.diffs.extend(diff(&want, Some(&mem.skeleton())));
                let (head, tail) = chain_changes(fam, &want, &mem.chains)?;
                assemble(head, dels, tail, budget)
            }
            None => pack(Vec::new(), dels, budget),
        };
        send(self.socket()?, &batches, &mut report)?;
        Ok(report)
    }
}

impl Memory {
    /// The memory without digests and runs: after an error, every set is compared element by
    /// element on the next apply.
    fn distrusted(mut self) -> Self {
        for s in &mut self.sets {
            s.digest.clear();
            s.runs.clear();
        }
        self
    }

    /// The remembered table without elements.
    fn skeleton(&self) -> NftTable {
        NftTable {
            family: self.family,
            name: self.name.clone(),
            sets: self.sets.iter().map(|s| s.header.clone()).collect(),
            chains: self.chains.clone(),
        }
    }
}

fn skeleton(t: &NftTable) -> NftTable {
    let sets = t
        .sets
        .iter()
        .map(|s| NftSet { elements: Default::default(), digest: Vec::new(), runs: Vec::new(), ..s.clone() })
        .collect();
    NftTable { family: t.family, name: t.name.clone(), sets, chains: t.chains.clone() }
}

/// The memory of a table in normal form; None when two keys collide (then every apply reads
/// back, which stays exact).
fn remember(want: NftTable, desired: &NftTable) -> Option<Memory> {
    let mut sets = Vec::with_capacity(want.sets.len());
    for mut s in want.sets {
        let normal = std::mem::take(&mut s.elements).into_vec();
        let mut keys = KeySet::with_capacity_and_hasher(normal.len(), Default::default());
        for e in &normal {
            if !keys.insert(key_hash(&e.key)) {
                return None;
            }
        }
        let given = desired.sets.iter().find(|d| d.name == s.name);
        let digest = given.map(|d| d.digest.clone()).unwrap_or_default();
        let (elems, aligned) = in_given_order(&s, normal, given.map(|d| d.elements.as_slice()).unwrap_or(&[]));
        let runs = given.filter(|_| aligned).map(|d| d.runs.clone()).unwrap_or_default();
        s.digest.clear();
        s.runs.clear();
        sets.push(SetMemory { header: s, elems, keys, digest, runs });
    }
    Some(Memory { family: want.family, name: want.name, sets, chains: want.chains, raw_chains: desired.chains.clone() })
}

/// The normal elements in the order the caller gave them (normalizing sorts them), so that
/// the next apply of the same list compares sequentially, and whether that order is exactly
/// the caller's (one normal element for each given one: then the caller's runs describe it).
/// Elements not found as given (not in normal form) keep their sorted place at the end; that
/// only costs speed, never exactness.
fn in_given_order(set: &NftSet, normal: Vec<NftElement>, given: &[NftElement]) -> (Vec<NftElement>, bool) {
    let mut by_key: HashMap<u64, NftElement, BuildHasherDefault<PassThrough>> =
        HashMap::with_capacity_and_hasher(normal.len(), Default::default());
    for e in normal {
        by_key.insert(key_hash(&e.key), e);
    }
    let mut out = Vec::with_capacity(by_key.len());
    for g in given {
        let found = by_key.remove(&key_hash(&g.key)).or_else(|| {
            let n = normalize_element(set, g).ok()?;
            by_key.remove(&key_hash(&n.key))
        });
        out.extend(found);
    }
    let aligned = by_key.is_empty() && out.len() == given.len();
    let mut rest: Vec<NftElement> = by_key.into_values().collect();
    rest.sort_by_key(|e| format!("{:?}", e.key));
    out.extend(rest);
    (out, aligned)
}

fn same_header(a: &NftSet, b: &NftSet) -> bool {
    a.name == b.name && super::diff::header(a) == super::diff::header(b)
}

/// The element deltas from `mem` to `desired`, one per remembered set in its order. Elements
/// equal to remembered ones are trusted as valid; new or changed ones are normalized (which
/// validates them). Err(Ok(_)) when the fast path cannot answer.
/// Also the chains in normal form when they changed in a way that is written in place (chains
/// added, removed, or with other rules; a chain's hook changed rebuilds).
#[allow(clippy::type_complexity)]
fn delta(
    mem: &mut Memory,
    desired: &NftTable,
) -> Result<(Vec<SetDelta>, Option<Shared<NftChain>>), Result<Slow, NftError>> {
    if desired.sets.len() != mem.sets.len() {
        return Err(Ok(Slow::Structure));
    }
    // Match desired sets to remembered ones by name (a handful of sets: linear is fine).
    let mut order = Vec::with_capacity(mem.sets.len());
    for s in &mem.sets {
        match desired.sets.iter().find(|d| d.name == s.header.name) {
            Some(d) if same_header(d, &s.header) => order.push(d),
            _ => return Err(Ok(Slow::Structure)),
        }
    }
    let mut chains = None;
    if desired.chains != mem.raw_chains {
        // Written differently may still be the same rules: compare in normal form.
        let normal = normalize(&skeleton(desired)).map_err(Err)?;
        if normal.chains != mem.chains {
            if !in_place(&normal, &mem.skeleton()) {
                return Err(Ok(Slow::Structure));
            }
            chains = Some(normal.chains);
        } else {
            mem.raw_chains = desired.chains.clone();
        }
    }
    let mut out = Vec::with_capacity(mem.sets.len());
    for (s, d) in mem.sets.iter_mut().zip(order) {
        if !d.digest.is_empty() && d.digest == s.digest {
            // The caller's digest covers the elements: the same as remembered, not walked.
            out.push(SetDelta { digest: d.digest.clone(), ..Default::default() });
            continue;
        }
        out.push(SetDelta { digest: d.digest.clone(), ..set_delta(s, d)? });
    }
    Ok((out, chains))
}

/// Errors raised before anything is sent (validation and encoding).
fn unwritten(e: &NftError) -> bool {
    matches!(e, NftError::Invalid { .. } | NftError::Unsupported { .. })
}

fn duplicate(set: &NftSet) -> NftError {
    NftError::Invalid { object: format!("set {}", set.name), reason: "two elements with the same key".into() }
}

type Fail = Result<Slow, NftError>;

/// One remembered element of the changed middle, and whether a desired element matched it.
struct Slot {
    index: usize,
    seen: bool,
}

/// The delta of one set. The runs the caller gave that equal remembered ones at both ends are
/// skipped unseen; then the common prefix and suffix of the rest of the desired and remembered
/// element lists are compared in place (a one-mapping change leaves all but one element
/// there); only the middle is diffed by key, against a hash map of the remembered middle. A
/// middle key that the untouched prefix or suffix also holds is a duplicate (or a hash
/// collision).
fn set_delta(s: &SetMemory, d: &NftSet) -> Result<SetDelta, Fail> {
    let (want, have) = (&d.elements, &s.elems);
    let (ends, prefix, suffix) = common_ends(have, &s.runs, want, &d.runs);
    let (want_mid, have_mid) = (&want[prefix..want.len() - suffix], &have[prefix..have.len() - suffix]);
    let walked = want.len() - ends.head - ends.tail;
    let runs =
        (ends.head_runs..s.runs.len() - ends.tail_runs, d.runs[ends.head_runs..d.runs.len() - ends.tail_runs].to_vec());
    let mut out = SetDelta { at: prefix, replaced: have_mid.len(), walked, runs: Some(runs), ..Default::default() };
    if want_mid.is_empty() && have_mid.is_empty() {
        return Ok(out);
    }
    let mut slots: HashMap<u64, Slot, BuildHasherDefault<PassThrough>> =
        HashMap::with_capacity_and_hasher(have_mid.len(), Default::default());
    for (i, h) in have_mid.iter().enumerate() {
        slots.insert(key_hash(&h.key), Slot { index: i, seen: false });
    }
    let header = &s.header;
    for e in want_mid {
        // Most elements are remembered exactly as written: no normalization.
        let dup = |()| Err(duplicate(header));
        let (i, n) = match lookup(&mut slots, have_mid, e).map_err(dup)? {
            Some(i) if have_mid[i].data == e.data => {
                out.middle.push(have_mid[i].clone());
                continue;
            }
            Some(i) => (i, normalize_element(header, e).map_err(Err)?),
            None => {
                let n = normalize_element(header, e).map_err(Err)?;
                match lookup(&mut slots, have_mid, &n).map_err(dup)? {
                    Some(i) => (i, n),
                    None if s.keys.contains(&key_hash(&n.key)) => {
                        // In the untouched part: a duplicate key, or two keys hashing alike.
                        let dup = have.iter().any(|h| h.key == n.key);
                        return Err(if dup { Err(duplicate(header)) } else { Ok(Slow::Collision) });
                    }
                    None => {
                        out.adds.push(n.clone());
                        out.middle.push(n);
                        continue;
                    }
                }
            }
        };
        // Same key as remembered element i (now marked seen): same or changed data.
        if have_mid[i].data != n.data {
            out.changed.push((have_mid[i].clone(), n.clone()));
        }
        out.middle.push(n);
    }
    let mut seen_adds = KeySet::default();
    for a in &out.adds {
        if !seen_adds.insert(key_hash(&a.key)) {
            let dup = out.adds.iter().filter(|b| b.key == a.key).count() > 1;
            return Err(if dup { Err(duplicate(header)) } else { Ok(Slow::Collision) });
        }
    }
    let unseen = slots.values().filter(|x| !x.seen).map(|x| x.index);
    out.dels = unseen.map(|i| have_mid[i].clone()).collect();
    Ok(out)
}

/// The remembered middle element with `e`'s key, marked seen; Err(()) when it was seen
/// already (a duplicate key in the desired set). A different key with the same hash is
/// treated as absent, and caught later as a collision.
fn lookup(
    slots: &mut HashMap<u64, Slot, BuildHasherDefault<PassThrough>>,
    have_mid: &[NftElement],
    e: &NftElement,
) -> Result<Option<usize>, ()> {
    match slots.get_mut(&key_hash(&e.key)) {
        Some(slot) if have_mid[slot.index].key == e.key => {
            if slot.seen {
                return Err(());
            }
            slot.seen = true;
            Ok(Some(slot.index))
        }
        _ => Ok(None),
    }
}

/// Folds a written delta into the memory: the middle is replaced, in desired order.
fn update(mem: &mut Memory, deltas: Vec<SetDelta>) {
    for (s, d) in mem.sets.iter_mut().zip(deltas) {
        for e in &s.elems[d.at..d.at + d.replaced] {
            s.keys.remove(&key_hash(&e.key));
        }
        for e in &d.middle {
            s.keys.insert(key_hash(&e.key));
        }
        s.elems.splice(d.at..d.at + d.replaced, d.middle);
        s.digest = d.digest;
        if let Some((at, runs)) = d.runs {
            s.runs.splice(at, runs);
        }
    }
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier").field("netns", &self.netns).field("remembers", &self.memory.is_some()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kuport_proto::v1::{NftValue, PortRange};

    #[test]
    fn kuport_keys_do_not_collide() {
        let mut seen = std::collections::HashMap::new();
        for i in 0..50_000usize {
            let ip = format!("10.244.{}.{}", i / 250, i % 250 + 2);
            let key = vec![
                NftValue { value: Some(Value::Addr(ip.clone())) },
                NftValue { value: Some(Value::Proto(1)) },
                NftValue { value: Some(Value::Port(PortRange { first: 8080, last: 8080 })) },
            ];
            if let Some(j) = seen.insert(key_hash(&key), ip.clone()) {
                panic!("collision {ip} {j}");
            }
        }
    }
}
