//! The canonical order of a node state, its sets' digests, and its version.
//!
//! Two controllers that compute the same state must send the same bytes, so that an executor can
//! compare versions instead of states. Every repeated field whose order carries no meaning is
//! sorted here; rule order inside a chain carries meaning and is kept.
//!
//! Each nftables set also gets a digest of its elements and of runs of them ([`element_runs`]),
//! so that an executor that remembers what it applied can skip an unchanged set without walking
//! its elements, and find a one-element change in a 50,000-element set by comparing a few
//! hundred run digests.

use std::net::IpAddr;

use prost::Message;
use sha2::{Digest, Sha256};

use crate::shared::Shared;
use crate::v1::{ElementRun, NetnsState, NftElement, NftSet, NftTable, NftValue, NodeState, Route, nft_value};

/// A run ends after an element whose encoding hashes to 0 modulo this: runs of 128 elements on
/// average. Smaller runs make a one-element change cheaper to locate and the state larger (36
/// bytes a run, under 1 % of a set's encoding).
pub const RUN_SPAN: u64 = 128;

/// Sorts every order-free list in `state` into its canonical order (and drops exact
/// duplicates), then sets every nftables set's `runs` and `digest` ([`element_runs`]).
pub fn canonicalize(state: &mut NodeState) {
    canonicalize_after(state, None);
}

/// [`canonicalize`] of a state that follows `last` (the same node's, canonical): a set whose
/// elements are in canonical order already is not sorted again, and a set of the namespace and
/// table `last` holds too has only the runs its edit falls in digested again
/// ([`runs_after_edit`]). The same state as [`canonicalize`], in time that follows the change
/// rather than the sets' size, beside one walk of each set.
pub fn canonicalize_after(state: &mut NodeState, last: Option<&NodeState>) {
    state.netns.sort_by(|a, b| netns_order(a).cmp(&netns_order(b)));
    for ns in &mut state.netns {
        let was = last.and_then(|l| l.netns.iter().find(|w| netns_order(w) == netns_order(ns)));
        canonicalize_netns_after(ns, was);
    }
}

/// [`canonicalize_after`] for one namespace, following `was` (the same namespace before). It
/// reads before it writes: a list shared with another state is copied only where it changes
/// (`crate::shared`).
fn canonicalize_netns_after(ns: &mut NetnsState, was: Option<&NetnsState>) {
    order_beside_elements(ns);
    for t in 0..ns.nft_tables.len() {
        let table = &ns.nft_tables[t];
        let was = was.and_then(|w| w.nft_tables.iter().find(|o| (o.family, &o.name) == (table.family, &table.name)));
        for i in 0..table.sets.len() {
            let set = &ns.nft_tables[t].sets[i];
            let old = was.and_then(|o| o.sets.iter().find(|o| o.name == set.name));
            // Elements the last state held, as they were: canonical, and their runs are its.
            let kept = old.filter(|o| Shared::ptr_eq(&o.elements, &set.elements) && !o.digest.is_empty());
            let ordered = kept.is_some() || set.elements.is_sorted_by(|a, b| element_cmp(a, b).is_le());
            let repeats = kept.is_none() && set.elements.windows(2).any(|w| w[0] == w[1]);
            let (runs, digest) = match (ordered && !repeats, kept, old) {
                (true, Some(o), _) if (&set.runs, &set.digest) == (&o.runs, &o.digest) => continue,
                (true, Some(o), _) => (o.runs.clone(), o.digest.clone()),
                (true, None, Some(o)) => runs_after(o, &set.elements),
                (true, None, None) => element_runs(&set.elements),
                (false, ..) => {
                    let elements = &mut ns.nft_tables[t].sets[i].elements;
                    if !ordered {
                        elements.sort_by_cached_key(element_order);
                    }
                    elements.dedup();
                    match old {
                        Some(o) => runs_after(o, elements),
                        None => element_runs(elements),
                    }
                }
            };
            let set = &ns.nft_tables[t].sets[i];
            if (&set.runs, &set.digest) != (&runs, &digest) {
                let set = &mut ns.nft_tables[t].sets[i];
                (set.runs, set.digest) = (runs, digest);
            }
        }
    }
    ns.version = netns_version(ns);
}

/// The runs of `elements` (canonical) as an edit of `old`'s (canonical, with its runs): the
/// positions removed and inserted found by one walk of both lists.
fn runs_after(old: &NftSet, elements: &[NftElement]) -> (Vec<ElementRun>, Vec<u8>) {
    let (was, mut removed_at, mut inserted_before) = (&old.elements, Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < was.len() || j < elements.len() {
        match (was.get(i), elements.get(j)) {
            (Some(a), Some(b)) if a == b => (i, j) = (i + 1, j + 1),
            (Some(a), Some(b)) if element_cmp(a, b).is_lt() => {
                removed_at.push(i);
                i += 1;
            }
            (Some(_), None) => {
                removed_at.push(i);
                i += 1;
            }
            _ => {
                inserted_before.push(i);
                j += 1;
            }
        }
    }
    if removed_at.is_empty() && inserted_before.is_empty() && !old.digest.is_empty() {
        return (old.runs.clone(), old.digest.clone());
    }
    runs_after_edit(&old.runs, was.len(), &removed_at, &inserted_before, elements)
}

/// [`canonicalize`] for one namespace: ordered, its sets digested, its version set.
pub fn canonicalize_netns_whole(ns: &mut NetnsState) {
    canonicalize_netns_after(ns, None);
}

/// The version of one namespace: the hex sha256 of its canonical encoding with `version` and
/// `held` cleared and each set's elements and runs left out, its digest standing for them
/// (computed here for a set that has none), and each WireGuard device's peers left out, their
/// kept digest ([`crate::wireguard::Peers::digest`], in device order after the encoding)
/// standing for them. So a version costs what the namespace holds beside its elements and
/// peers, and an executor that edited a set's runs needs no pass over its elements
/// (docs/decisions.md, "A version reads set digests; a delta edits a set where it changed",
/// and "Peers shared between states"). [`canonicalize`] sets it.
pub fn netns_version(ns: &NetnsState) -> String {
    // Destructured without `..`: a new field does not compile until the version covers it.
    let NetnsState {
        target,
        version: _,
        held: _,
        sysctls,
        nft_tables,
        links,
        addresses,
        routes,
        ip_rules,
        neighbours,
        wireguard_devices,
        delta,
    } = ns;
    let outline = NetnsState {
        target: target.clone(),
        version: String::new(),
        held: false,
        sysctls: sysctls.clone(),
        nft_tables: nft_tables.iter().map(table_outline).collect(),
        links: links.clone(),
        addresses: addresses.clone(),
        routes: routes.clone(),
        ip_rules: ip_rules.clone(),
        neighbours: neighbours.clone(),
        wireguard_devices: wireguard_devices
            .iter()
            .map(|d| crate::v1::WireguardDevice { peers: Default::default(), ..d.clone() })
            .collect(),
        delta: delta.clone(),
    };
    let mut h = Sha256::new();
    h.update(outline.encode_to_vec());
    for d in wireguard_devices {
        h.update(d.peers.digest());
    }
    hex::encode(h.finalize())
}

/// A table as its version reads it: each set's digest instead of its elements and runs.
fn table_outline(t: &NftTable) -> NftTable {
    let NftTable { family, name, sets, chains } = t;
    let sets = sets
        .iter()
        .map(|s| {
            let NftSet {
                name,
                key,
                data,
                interval,
                counter,
                elements,
                digest,
                runs: _,
                udp_flows,
                dynamic,
                size,
                timeout_seconds,
            } = s;
            NftSet {
                name: name.clone(),
                key: key.clone(),
                data: data.clone(),
                interval: *interval,
                counter: *counter,
                elements: Default::default(),
                digest: if digest.is_empty() { set_digest(elements) } else { digest.clone() },
                runs: Vec::new(),
                udp_flows: *udp_flows,
                dynamic: *dynamic,
                size: *size,
                timeout_seconds: *timeout_seconds,
            }
        })
        .collect();
    NftTable { family: *family, name: name.clone(), sets, chains: chains.clone() }
}

/// A route's identity, the kernel's key for it: its table and destination, "default" being the
/// zero prefix of its gateway's family (IPv4 without one). kuport sets no metric, TOS or type,
/// so two routes of one identity that differ in device or gateway cannot both be programmed; the
/// executor refuses a state holding both (node-exec's route model keys its routes the same way).
pub fn route_identity(r: &Route) -> (u32, &str) {
    let dst = match r.dst.as_str() {
        "default" if r.via.contains(':') => "::/0",
        "default" => "0.0.0.0/0",
        dst => dst,
    };
    (r.table, dst)
}

/// The order of namespaces in a state: the host first, then paths, then pods.
pub fn netns_order(ns: &NetnsState) -> (u8, &str, &str, &str) {
    use crate::v1::netns_ref::Kind;
    match ns.target.as_ref().and_then(|t| t.kind.as_ref()) {
        None => (0, "", "", ""),
        Some(Kind::Path(p)) => (1, p.as_str(), "", ""),
        Some(Kind::Pod(p)) => (2, p.namespace.as_str(), p.name.as_str(), p.uid.as_str()),
    }
}

/// The canonical order alone: sorts like [`canonicalize`] but clears every set's digest and
/// runs instead of computing them. For tables that are compared rather than sent (a normal
/// form, a table read back from the kernel), where a digest would only cost time or differ
/// spuriously.
pub fn order(state: &mut NodeState) {
    state.netns.sort_by(|a, b| netns_order(a).cmp(&netns_order(b)));
    for ns in &mut state.netns {
        canonicalize_netns(ns);
    }
}

/// The digest of a set's elements, in the order given (canonical once sorted): see
/// [`element_runs`]. 32 bytes, also for an empty set.
pub fn set_digest(elements: &[NftElement]) -> Vec<u8> {
    element_runs(elements).1
}

/// Cuts `elements` (in the order given) into runs and digests them. Each element is hashed as
/// its protobuf encoding prefixed with its length as a varint (prost's
/// `encode_length_delimited`), so two different lists never concatenate to the same bytes. A
/// run ends after an element whose encoding's [`boundary_hash`] is 0 modulo [`RUN_SPAN`], and
/// after the last element: where runs end depends only on the elements there, so an insertion
/// or removal leaves every other run as it was. The set's digest is the sha256 of every run's
/// length (a varint) and digest, concatenated.
pub fn element_runs(elements: &[NftElement]) -> (Vec<ElementRun>, Vec<u8>) {
    let mut runs = Vec::with_capacity(elements.len() / RUN_SPAN as usize + 1);
    cut_runs(elements, &mut runs);
    let digest = runs_digest(&runs);
    (runs, digest)
}

/// Appends the runs of `elements` to `runs`: each ends after a boundary element, the last after
/// the last element.
fn cut_runs(elements: &[NftElement], runs: &mut Vec<ElementRun>) {
    let mut run = Sha256::new();
    let mut count = 0u32;
    let mut buf = Vec::with_capacity(128);
    for e in elements {
        buf.clear();
        // Encoding into a Vec cannot fail: it grows as needed.
        if e.encode_length_delimited(&mut buf).is_ok() {
            run.update(&buf);
        }
        count += 1;
        if boundary_hash(&buf).is_multiple_of(RUN_SPAN) {
            runs.push(ElementRun { elements: count, digest: run.finalize_reset().to_vec() });
            count = 0;
        }
    }
    if count > 0 {
        runs.push(ElementRun { elements: count, digest: run.finalize_reset().to_vec() });
    }
}

/// A set's digest from its runs: the sha256 of each run's length (a varint) and digest.
fn runs_digest(runs: &[ElementRun]) -> Vec<u8> {
    let mut set = Sha256::new();
    let mut buf = Vec::with_capacity(10);
    for r in runs {
        buf.clear();
        prost::encoding::encode_varint(u64::from(r.elements), &mut buf);
        set.update(&buf);
        set.update(&r.digest);
    }
    set.finalize().to_vec()
}

/// [`element_runs`] of a set's elements after an edit, digesting again only the runs the edit
/// falls in: runs end where their elements say, so every other run is as it was. `old_runs`
/// cover the `old_len` elements before the edit; `removed_at` are the old positions removed and
/// `inserted_before` the old position each new element was put before (`old_len`: after the
/// last), both ascending; `elements` are the elements after. Runs that do not cover the old
/// elements are made again whole.
pub fn runs_after_edit(
    old_runs: &[ElementRun],
    old_len: usize,
    removed_at: &[usize],
    inserted_before: &[usize],
    elements: &[NftElement],
) -> (Vec<ElementRun>, Vec<u8>) {
    let m = old_runs.len();
    let mut starts = Vec::with_capacity(m + 1);
    let mut at = 0usize;
    starts.push(0);
    for r in old_runs {
        at += r.elements as usize;
        starts.push(at);
    }
    let moved = removed_at.len() as isize - inserted_before.len() as isize;
    if m == 0 || at != old_len || old_len as isize - moved != elements.len() as isize {
        return element_runs(elements);
    }
    // The run holding old position q (the last run for q = old_len).
    let run_of = |q: usize| (starts.partition_point(|&s| s <= q) - 1).min(m - 1);
    let mut dirty = vec![false; m];
    for &q in removed_at {
        let r = run_of(q);
        dirty[r] = true;
        // The run's last element ended it: without it the run goes on into the next.
        if q + 1 == starts[r + 1] && r + 1 < m {
            dirty[r + 1] = true;
        }
    }
    for &q in inserted_before {
        dirty[run_of(q)] = true;
    }
    // Where old position s (a run's start) is after the edit.
    let new_at = |s: usize| s - removed_at.partition_point(|&q| q < s) + inserted_before.partition_point(|&q| q < s);
    let mut runs = Vec::with_capacity(m + inserted_before.len());
    let mut i = 0;
    while i < m {
        if !dirty[i] {
            runs.push(old_runs[i].clone());
            i += 1;
            continue;
        }
        let mut j = i;
        while j + 1 < m && dirty[j + 1] {
            j += 1;
        }
        let to = if j + 1 == m { elements.len() } else { new_at(starts[j + 1]) };
        cut_runs(&elements[new_at(starts[i])..to], &mut runs);
        i = j + 1;
    }
    let digest = runs_digest(&runs);
    (runs, digest)
}

/// What two versions of a set share at their start and at their end, by their runs alone (not
/// overlapping): so many runs, holding so many elements. All zero when either list of runs does
/// not cover exactly its elements (no runs, or not computed for these elements).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedEnds {
    pub head_runs: usize,
    pub tail_runs: usize,
    pub head: usize,
    pub tail: usize,
}

/// The [`SharedEnds`] of a set's `old` and `new` runs, whose lists hold `old_len` and `new_len`
/// elements.
pub fn unchanged_ends(old: &[ElementRun], old_len: usize, new: &[ElementRun], new_len: usize) -> SharedEnds {
    let count = |runs: &[ElementRun]| runs.iter().map(|r| r.elements as usize).sum::<usize>();
    if old.is_empty() || new.is_empty() || count(old) != old_len || count(new) != new_len {
        return SharedEnds::default();
    }
    let head_runs = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let tail_runs =
        old[head_runs..].iter().rev().zip(new[head_runs..].iter().rev()).take_while(|(a, b)| a == b).count();
    SharedEnds { head_runs, tail_runs, head: count(&new[..head_runs]), tail: count(&new[new.len() - tail_runs..]) }
}

/// How many elements two versions of a set share at their start and at their end (`prefix`,
/// `suffix`, not overlapping): the equal runs at both ends ([`unchanged_ends`]) unseen, then
/// the elements after and before them compared one by one. The elements between differ.
pub fn common_ends(
    old: &[NftElement],
    old_runs: &[ElementRun],
    new: &[NftElement],
    new_runs: &[ElementRun],
) -> (SharedEnds, usize, usize) {
    let ends = unchanged_ends(old_runs, old.len(), new_runs, new.len());
    let (o, n) = (&old[..old.len() - ends.tail], &new[..new.len() - ends.tail]);
    let prefix = ends.head + o[ends.head..].iter().zip(&n[ends.head..]).take_while(|(a, b)| a == b).count();
    let suffix = ends.tail + o[prefix..].iter().rev().zip(n[prefix..].iter().rev()).take_while(|(a, b)| a == b).count();
    (ends, prefix, suffix)
}

/// FNV-1a over the bytes, then splitmix64's finalizer, whose low bits depend on every input
/// bit (FNV-1a's own low bits see only the low bits of each byte).
fn boundary_hash(bytes: &[u8]) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = bytes.iter().fold(FNV_OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME));
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Every list of a namespace in canonical order, its sets' elements too; their digests and runs
/// cleared.
fn canonicalize_netns(ns: &mut NetnsState) {
    order_beside_elements(ns);
    for set in ns.nft_tables.iter_mut().flat_map(|t| t.sets.iter_mut()) {
        set.elements.sort_by_cached_key(element_order);
        set.elements.dedup();
        set.digest.clear();
        set.runs.clear();
    }
}

/// Every list of a namespace in canonical order but its sets' elements, which a delta edits in
/// place. Destructured without `..`, so a new kind of object does not compile until it is
/// ordered here.
pub fn order_beside_elements(ns: &mut NetnsState) {
    let NetnsState {
        target: _,
        version: _,
        held: _,
        sysctls: _,
        nft_tables: _,
        links: _,
        addresses: _,
        routes: _,
        ip_rules: _,
        neighbours: _,
        wireguard_devices: _,
        delta: _,
    } = ns;
    ns.sysctls.sort_by(|a, b| a.key.cmp(&b.key));
    ns.sysctls.dedup_by(|a, b| a.key == b.key);
    // The shared lists are sorted only when they are not in order, so that a copy keeps
    // sharing them (`crate::shared`).
    let table_order = |a: &NftTable, b: &NftTable| (a.family, &a.name).cmp(&(b.family, &b.name));
    sort_shared(&mut ns.nft_tables, table_order);
    let in_order =
        |t: &NftTable| t.sets.is_sorted_by(|a, b| a.name <= b.name) && t.chains.is_sorted_by(|a, b| a.name <= b.name);
    if !ns.nft_tables.iter().all(in_order) {
        for table in &mut ns.nft_tables {
            sort_shared(&mut table.sets, |a, b| a.name.cmp(&b.name));
            sort_shared(&mut table.chains, |a, b| a.name.cmp(&b.name));
        }
    }
    ns.links.sort_by(|a, b| a.name.cmp(&b.name));
    ns.addresses.sort_by(|a, b| (&a.dev, &a.cidr).cmp(&(&b.dev, &b.cidr)));
    ns.addresses.dedup();
    // A route is its four fields: strictly in order is sorted and without repeats.
    let route_order = |a: &Route, b: &Route| (a.table, &a.dst, &a.dev, &a.via).cmp(&(b.table, &b.dst, &b.dev, &b.via));
    if !ns.routes.is_sorted_by(|a, b| route_order(a, b).is_lt()) {
        ns.routes.sort_by(route_order);
        ns.routes.dedup();
    }
    ns.ip_rules.sort_by(|a, b| {
        (a.ipv6, a.pref, a.fwmark, a.fwmask, &a.to, a.table).cmp(&(b.ipv6, b.pref, b.fwmark, b.fwmask, &b.to, b.table))
    });
    ns.ip_rules.dedup();
    ns.neighbours.sort_by(|a, b| (&a.dev, &a.address).cmp(&(&b.dev, &b.address)));
    ns.neighbours.dedup();
    // A device's peers are canonical as held (`crate::wireguard::Peers`).
    ns.wireguard_devices.sort_by(|a, b| a.name.cmp(&b.name));
}

/// Sorts `list` by `cmp` (stably) unless it is in order already: a list shared with another
/// state stays shared then.
fn sort_shared<T: Clone>(list: &mut Shared<T>, cmp: impl Fn(&T, &T) -> std::cmp::Ordering) {
    if !list.is_sorted_by(|a, b| cmp(a, b).is_le()) {
        list.sort_by(cmp);
    }
}

/// A peer's allowed IPs in canonical order ([`prefix_order`]), each once.
pub fn order_prefixes(prefixes: &mut Vec<String>) {
    if !prefixes.is_sorted_by_key(|p| prefix_order(p)) {
        prefixes.sort_by_cached_key(|p| prefix_order(p));
    }
    prefixes.dedup();
}

/// Orders prefixes the way a reader expects: IPv4 before IPv6, each by address then length,
/// numerically (10.42.2.0/24 before 10.42.10.0/24); what does not parse sorts last, as text.
fn prefix_order(p: &str) -> (u8, u128, u32, String) {
    let (addr, len) = p.split_once('/').unwrap_or((p, ""));
    let len = len.parse().unwrap_or(u32::MAX);
    match addr.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => (0, u128::from(u32::from(a)), len, String::new()),
        Ok(IpAddr::V6(a)) => (1, u128::from(a), len, String::new()),
        Err(_) => (2, 0, len, p.to_string()),
    }
}

/// Orders elements the way a reader expects: addresses and ports numerically, not as text.
pub fn element_order(e: &NftElement) -> Vec<(u8, u128, u32, String)> {
    e.key.iter().chain(&e.data).map(value_order).collect()
}

/// Compares two elements in [`element_order`], without making either's.
fn element_cmp(a: &NftElement, b: &NftElement) -> std::cmp::Ordering {
    a.key.iter().chain(&a.data).map(value_key).cmp(b.key.iter().chain(&b.data).map(value_key))
}

/// Sorts the values of a literal set (`meta l4proto { tcp, udp }`) as nft lists them.
pub fn sort_values(values: &mut [NftValue]) {
    values.sort_by_cached_key(value_order);
}

fn value_order(v: &NftValue) -> (u8, u128, u32, String) {
    let (kind, n, m, text) = value_key(v);
    (kind, n, m, text.to_string())
}

/// [`value_order`], borrowing the value's text.
fn value_key(v: &NftValue) -> (u8, u128, u32, &str) {
    match &v.value {
        None => (0, 0, 0, ""),
        Some(nft_value::Value::Ifname(s)) => (1, 0, 0, s),
        Some(nft_value::Value::Addr(s)) => {
            let (addr, len) = s.split_once('/').unwrap_or((s.as_str(), ""));
            let n = match addr.parse::<IpAddr>() {
                Ok(IpAddr::V4(a)) => u128::from(u32::from(a)),
                Ok(IpAddr::V6(a)) => u128::from(a),
                Err(_) => u128::MAX,
            };
            (2, n, len.parse().unwrap_or(u32::MAX), s)
        }
        Some(nft_value::Value::Proto(p)) => (3, *p as u128, 0, ""),
        Some(nft_value::Value::Port(r)) => (4, u128::from(r.first), r.last, ""),
        Some(nft_value::Value::Mark(m)) => (5, u128::from(*m), 0, ""),
        Some(nft_value::Value::Id(i)) => (6, u128::from(*i), 0, ""),
        Some(nft_value::Value::Verdict(v)) => (7, v.kind as u128, 0, &v.chain),
    }
}

/// The version of a state: the hex sha256 of its node name and of each namespace's version
/// ([`netns_version`], which covers its digests, a function of the elements), in canonical order.
pub fn version(state: &NodeState) -> String {
    let mut canonical = state.clone();
    canonicalize(&mut canonical);
    canonical_version(&canonical)
}

/// [`version`] of a state [`canonicalize`] already ordered (as every state the controller
/// computes is): no copy, no second sort, no second set digest. A namespace sent `held` counts
/// by the version it names, so a state keeps its version on the stream.
pub fn canonical_version(state: &NodeState) -> String {
    let mut h = Sha256::new();
    let mut buf = Vec::new();
    prost::encoding::encode_varint(state.node.len() as u64, &mut buf);
    h.update(&buf);
    h.update(state.node.as_bytes());
    for ns in &state.netns {
        if ns.version.is_empty() {
            h.update(netns_version(ns).as_bytes());
        } else {
            h.update(ns.version.as_bytes());
        }
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{NftSet, NftTable, PortRange};

    fn port(first: u32) -> NftValue {
        NftValue { value: Some(nft_value::Value::Port(PortRange { first, last: first })) }
    }

    fn state(ports: &[u32]) -> NodeState {
        let elements = ports.iter().map(|p| NftElement { key: vec![port(*p)], data: vec![] }).collect();
        NodeState {
            node: "n".into(),
            netns: vec![NetnsState {
                nft_tables: vec![NftTable {
                    name: "kuport".into(),
                    sets: vec![NftSet { name: "s".into(), elements, ..Default::default() }].into(),
                    ..Default::default()
                }]
                .into(),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn version_ignores_element_order() {
        assert_eq!(version(&state(&[9, 80, 443])), version(&state(&[443, 9, 80])));
        assert_ne!(version(&state(&[9, 80])), version(&state(&[9, 81])));
    }

    fn digest_of(s: &NodeState) -> Vec<u8> {
        s.netns[0].nft_tables[0].sets[0].digest.clone()
    }

    #[test]
    fn canonicalize_fills_digests_and_order_clears_them() {
        let mut s = state(&[443, 9, 80]);
        canonicalize(&mut s);
        assert_eq!(digest_of(&s), set_digest(&s.netns[0].nft_tables[0].sets[0].elements));
        assert_eq!(digest_of(&s).len(), 32);
        let mut sorted = state(&[80, 9, 443]);
        canonicalize(&mut sorted);
        assert_eq!(digest_of(&s), digest_of(&sorted));
        order(&mut s);
        assert!(digest_of(&s).is_empty());
        // A duplicate is dropped before the digest is taken.
        let mut dup = state(&[9, 443, 80, 9]);
        canonicalize(&mut dup);
        assert_eq!(digest_of(&dup), digest_of(&sorted));
    }

    #[test]
    fn unchanged_ends_need_runs_that_cover_the_elements() {
        let run = |n: u32, d: u8| ElementRun { elements: n, digest: vec![d] };
        let old = [run(2, 1), run(3, 2), run(1, 3)];
        let ends = |e: SharedEnds| (e.head_runs, e.tail_runs, e.head, e.tail);
        assert_eq!(ends(unchanged_ends(&old, 6, &[run(2, 1), run(4, 9), run(1, 3)], 7)), (1, 1, 2, 1));
        assert_eq!(ends(unchanged_ends(&old, 6, &old, 6)), (3, 0, 6, 0));
        assert_eq!(unchanged_ends(&old, 6, &[], 6), SharedEnds::default(), "no runs");
        assert_eq!(unchanged_ends(&old, 7, &old, 6), SharedEnds::default(), "runs of other elements");
    }

    #[test]
    fn wireguard_devices_peers_and_allowed_ips_sort_and_version() {
        use crate::v1::{WireguardDevice, WireguardPeer};
        let peer = |k: &str, ips: &[&str]| WireguardPeer {
            public_key: k.into(),
            allowed_ips: ips.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let dev = |peers: Vec<WireguardPeer>| NodeState {
            node: "n".into(),
            netns: vec![NetnsState {
                wireguard_devices: vec![WireguardDevice {
                    name: "kup-wg".into(),
                    peers: peers.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let mut a = dev(vec![peer("b", &["fd00::/64", "10.42.10.0/24", "10.42.2.0/24"]), peer("a", &["10.0.0.1/32"])]);
        let b = dev(vec![peer("a", &["10.0.0.1/32"]), peer("b", &["10.42.2.0/24", "fd00::/64", "10.42.10.0/24"])]);
        assert_eq!(version(&a), version(&b));
        canonicalize(&mut a);
        let d = &a.netns[0].wireguard_devices[0];
        let peers: Vec<&WireguardPeer> = d.peers.iter().collect();
        assert_eq!(peers[0].public_key, "a");
        assert_eq!(peers[1].allowed_ips, ["10.42.2.0/24", "10.42.10.0/24", "fd00::/64"]);
        assert_ne!(version(&a), version(&dev(vec![peer("a", &["10.0.0.2/32"])])));
    }

    proptest::proptest! {
        /// An edit's runs, made again only where it falls, are those of the edited elements made
        /// whole: over sets of up to 2,000 elements (about 16 runs), edits anywhere, at run
        /// ends included, and runs that do not cover the elements.
        #[test]
        fn runs_after_an_edit_are_the_whole_runs(
            old in proptest::collection::btree_set(0u32..4000, 0..2000),
            removals in proptest::collection::vec(proptest::prelude::any::<proptest::sample::Index>(), 0..6),
            added in proptest::collection::btree_set(4000u32..4100, 0..4),
            inserted in proptest::collection::btree_set(0u32..4000, 0..4),
            stale in proptest::prelude::any::<bool>(),
        ) {
            let element = |p: u32| NftElement { key: vec![port(p)], data: vec![] };
            let old: Vec<u32> = old.into_iter().collect();
            let mut gone: Vec<usize> =
                if old.is_empty() { vec![] } else { removals.iter().map(|i| i.index(old.len())).collect() };
            gone.sort_unstable();
            gone.dedup();
            let new: std::collections::BTreeSet<u32> = old
                .iter()
                .enumerate()
                .filter(|(i, _)| gone.binary_search(i).is_err())
                .map(|(_, p)| *p)
                .chain(added.iter().copied())
                .chain(inserted.iter().copied().filter(|p| old.binary_search(p).is_err()))
                .collect();
            let before: Vec<usize> = new
                .iter()
                .filter(|p| old.binary_search(p).is_err())
                .map(|p| old.partition_point(|o| o < p))
                .collect();
            let old_elements: Vec<NftElement> = old.iter().map(|p| element(*p)).collect();
            let new_elements: Vec<NftElement> = new.iter().map(|p| element(*p)).collect();
            let (mut old_runs, _) = element_runs(&old_elements);
            if stale && !old_runs.is_empty() {
                old_runs[0].elements += 1;
            }
            let edited = runs_after_edit(&old_runs, old.len(), &gone, &before, &new_elements);
            proptest::prop_assert_eq!(edited, element_runs(&new_elements));
        }
    }

    /// An element of the sets below: interface, address (text, ordered as a number) and port.
    fn element3((dev, host, p): (u8, u8, u32)) -> NftElement {
        let value = |v| NftValue { value: Some(v) };
        let key = vec![
            value(nft_value::Value::Ifname(format!("kup-{dev}"))),
            value(nft_value::Value::Addr(format!("10.0.{host}.1"))),
            port(p),
        ];
        NftElement { key, data: vec![] }
    }

    /// A state of two sets, `a` and `b`, whose elements are in the order given.
    fn state3(a: &[(u8, u8, u32)], b: &[(u8, u8, u32)]) -> NodeState {
        let mut s = state(&[]);
        s.netns[0].nft_tables[0].sets = [("b", b), ("a", a)]
            .into_iter()
            .map(|(name, e)| NftSet {
                name: name.into(),
                elements: e.iter().copied().map(element3).collect(),
                ..Default::default()
            })
            .collect();
        s
    }

    proptest::proptest! {
        /// A state canonical after the last one is the state made canonical alone: sets given
        /// in any order or sorted, edited anywhere, duplicates included, one set new (`b` when
        /// `last` had none), a last state without runs.
        #[test]
        fn canonical_after_the_last_state_is_canonical(
            old in proptest::collection::vec((0u8..3, 0u8..20, 0u32..300), 0..600),
            keep in proptest::collection::vec(proptest::prelude::any::<bool>(), 600),
            added in proptest::collection::vec((0u8..3, 0u8..20, 0u32..300), 0..8),
            shuffled in proptest::prelude::any::<bool>(),
            b_new in proptest::prelude::any::<bool>(),
            stale in proptest::prelude::any::<bool>(),
            shared in proptest::prelude::any::<bool>(),
        ) {
            let mut last = state3(&old, if b_new { &[] } else { &old[..old.len() / 2] });
            if b_new {
                last.netns[0].nft_tables[0].sets.retain(|s| s.name != "b");
            }
            canonicalize(&mut last);
            if stale {
                last.netns[0].nft_tables[0].sets.iter_mut().for_each(|s| (s.runs, s.digest) = (vec![], vec![]));
            }
            let mut new: Vec<_> = old.iter().zip(&keep).filter(|(_, k)| **k).map(|(e, _)| *e).chain(added).collect();
            if !shuffled {
                new.sort_by(|a, b| element_cmp(&element3(*a), &element3(*b)));
            } else {
                new.reverse();
            }
            let mut after = state3(&new, &new[..new.len() / 3]);
            if shared {
                // Set `a` as the last state holds it, its list shared.
                let a = |s: &NodeState| s.netns[0].nft_tables[0].sets.iter().position(|s| s.name == "a");
                if let (Some(i), Some(j)) = (a(&after), a(&last)) {
                    after.netns[0].nft_tables[0].sets[i].elements = last.netns[0].nft_tables[0].sets[j].elements.clone();
                }
            }
            let mut whole = after.clone();
            canonicalize_after(&mut after, Some(&last));
            canonicalize(&mut whole);
            proptest::prop_assert_eq!(after, whole);
        }
    }

    #[test]
    fn a_canonical_state_made_canonical_again_keeps_sharing_its_lists() {
        let mut last = state3(&[(0, 9, 80), (1, 2, 443)], &[(0, 1, 22)]);
        last.netns[0].routes = vec![Route { table: 254, dst: "10.42.0.0/16".into(), ..Default::default() }].into();
        canonicalize(&mut last);
        let mut again = last.clone();
        canonicalize_after(&mut again, Some(&last));
        assert_eq!(again, last);
        let (a, b) = (&again.netns[0], &last.netns[0]);
        assert!(Shared::ptr_eq(&a.nft_tables, &b.nft_tables), "tables copied");
        assert!(Shared::ptr_eq(&a.routes, &b.routes), "routes copied");
        let mut alone = last.clone();
        canonicalize(&mut alone);
        assert!(Shared::ptr_eq(&alone.netns[0].nft_tables, &b.nft_tables), "in order and digested: not copied");
    }

    #[test]
    fn a_version_reads_a_sets_digest_not_its_elements_again() {
        let mut s = state(&[443, 9, 80]);
        canonicalize(&mut s);
        let ns = &s.netns[0];
        let mut no_digest = ns.clone();
        no_digest.nft_tables[0].sets[0].digest.clear();
        assert_eq!(netns_version(ns), netns_version(&no_digest), "a set without a digest is digested");
        let mut other = ns.clone();
        other.nft_tables[0].sets[0].elements.pop();
        canonicalize_netns_whole(&mut other);
        assert_ne!(ns.version, other.version, "its elements count through the digest");
    }

    #[test]
    fn ports_sort_numerically() {
        let mut s = state(&[443, 9, 80]);
        canonicalize(&mut s);
        let firsts: Vec<u32> = s.netns[0].nft_tables[0].sets[0]
            .elements
            .iter()
            .filter_map(|e| match &e.key[0].value {
                Some(nft_value::Value::Port(r)) => Some(r.first),
                _ => None,
            })
            .collect();
        assert_eq!(firsts, vec![9, 80, 443]);
    }
}
