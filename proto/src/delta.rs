//! A namespace's change from a version the executor holds (docs/design.md, "Deltas"): what the
//! controller sends instead of a whole namespace the executor holds an older version of, and
//! how the executor rebuilds the whole from it.
//!
//! [`diff`] takes two canonical namespaces; [`apply`] gives back the new one, canonical, and
//! only if its version is the one the controller computed: the two sides agree on the result
//! by version, never by trusting the delta.

use std::collections::{HashMap, HashSet};

use prost::Message;

use crate::canonical::{element_order, element_runs, netns_version, order_beside_elements, runs_after_edit};
use crate::v1::{
    NetnsDelta, NetnsItems, NetnsState, NftChain, NftElement, NftSet, NftTable, PeerDelta, SetDelta, TableDelta,
    WireguardDevice,
};

/// How an executor's refusal ends when it refused a namespace sent as a stub or a delta because
/// it holds another version: the controller sends the state again, whole.
pub const SEND_WHOLE: &str = "send it whole";

/// Whether a refusal's `reason` asks for the state whole ([`SEND_WHOLE`]).
pub fn asks_whole(reason: &str) -> bool {
    reason.ends_with(SEND_WHOLE)
}

/// Why a delta does not give the namespace it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    #[error("the delta applies to version {base}, and the namespace here is at {held}")]
    Base { base: String, held: String },
    #[error("the delta removes {0}, which the namespace here does not hold")]
    Missing(String),
    #[error("the delta gives version {got}, not {want}")]
    Mismatch { got: String, want: String },
}

/// The change from `base` to `new`, both canonical ([`crate::canonicalize`]): as a namespace
/// sent on the stream, with `new`'s target and version and only the delta as content.
pub fn diff(base: &NetnsState, new: &NetnsState) -> NetnsState {
    // Destructured without `..`: a new list does not compile until it travels in a delta.
    let NetnsState {
        target,
        version,
        held: _,
        sysctls,
        nft_tables,
        links,
        addresses,
        routes,
        ip_rules,
        neighbours,
        wireguard_devices,
        delta: _,
    } = new;
    let mut d = NetnsDelta { base: base.version.clone(), ..Default::default() };
    let (removed, added) = (d.removed.get_or_insert_default(), d.added.get_or_insert_default());
    list_diff(&base.sysctls, sysctls, &mut removed.sysctls, &mut added.sysctls);
    list_diff(&base.links, links, &mut removed.links, &mut added.links);
    list_diff(&base.addresses, addresses, &mut removed.addresses, &mut added.addresses);
    list_diff(&base.routes, routes, &mut removed.routes, &mut added.routes);
    list_diff(&base.ip_rules, ip_rules, &mut removed.ip_rules, &mut added.ip_rules);
    list_diff(&base.neighbours, neighbours, &mut removed.neighbours, &mut added.neighbours);

    let tables = |ts: &'_ [NftTable]| -> HashMap<(i32, String), usize> {
        ts.iter().enumerate().map(|(i, t)| ((t.family, t.name.clone()), i)).collect()
    };
    let (old_tables, new_tables) = (tables(&base.nft_tables), tables(nft_tables));
    for t in &base.nft_tables {
        if !new_tables.contains_key(&(t.family, t.name.clone())) {
            removed.nft_tables.push(table_id(t));
        }
    }
    for t in nft_tables {
        let Some(old) = old_tables.get(&(t.family, t.name.clone())).map(|&i| &base.nft_tables[i]) else {
            added.nft_tables.push(bare_table(t));
            continue;
        };
        if old != t {
            d.tables.push(table_delta(old, t));
        }
    }

    let devices = |ds: &'_ [WireguardDevice]| -> HashMap<String, usize> {
        ds.iter().enumerate().map(|(i, d)| (d.name.clone(), i)).collect()
    };
    let (old_devices, new_devices) = (devices(&base.wireguard_devices), devices(wireguard_devices));
    for dev in &base.wireguard_devices {
        if !new_devices.contains_key(&dev.name) {
            removed.wireguard_devices.push(device_id(dev));
        }
    }
    for dev in wireguard_devices {
        let Some(old) = old_devices.get(&dev.name).map(|&i| &base.wireguard_devices[i]) else {
            added.wireguard_devices.push(dev.clone());
            continue;
        };
        if old == dev {
            continue;
        }
        if same_settings(old, dev) {
            d.peers.push(peer_delta(old, dev));
        } else {
            removed.wireguard_devices.push(device_id(old));
            added.wireguard_devices.push(dev.clone());
        }
    }
    NetnsState { target: target.clone(), version: version.clone(), delta: Some(d), ..Default::default() }
}

/// The namespace `delta` (a namespace [`diff`] made) gives from `base`, canonical, with the
/// version the delta names.
pub fn apply(base: &NetnsState, delta: NetnsState) -> Result<NetnsState, DeltaError> {
    let NetnsState { target, version, delta: d, .. } = delta;
    let d = d.unwrap_or_default();
    if d.base != base.version {
        return Err(DeltaError::Base { base: d.base, held: base.version.clone() });
    }
    let mut ns = NetnsState { target, held: false, delta: None, ..base.clone() };
    let (removed, added) = (d.removed.unwrap_or_default(), d.added.unwrap_or_default());
    // Destructured without `..`, like `diff`.
    let NetnsItems { sysctls, nft_tables, links, addresses, routes, ip_rules, neighbours, wireguard_devices } = removed;
    remove_items(&mut ns.sysctls, sysctls, "a sysctl")?;
    remove_items(&mut ns.links, links, "a link")?;
    remove_items(&mut ns.addresses, addresses, "an address")?;
    remove_items(&mut ns.routes, routes, "a route")?;
    remove_items(&mut ns.ip_rules, ip_rules, "an ip rule")?;
    remove_items(&mut ns.neighbours, neighbours, "a neighbour")?;
    for t in nft_tables {
        let i = ns
            .nft_tables
            .iter()
            .position(|o| (o.family, &o.name) == (t.family, &t.name))
            .ok_or_else(|| DeltaError::Missing(format!("table {}", t.name)))?;
        ns.nft_tables.swap_remove(i);
    }
    for dev in wireguard_devices {
        let i = ns
            .wireguard_devices
            .iter()
            .position(|o| o.name == dev.name)
            .ok_or_else(|| DeltaError::Missing(format!("WireGuard device {}", dev.name)))?;
        ns.wireguard_devices.swap_remove(i);
    }
    for t in d.tables {
        let table = ns
            .nft_tables
            .iter_mut()
            .find(|x| (x.family, &x.name) == (t.family, &t.table))
            .ok_or_else(|| DeltaError::Missing(format!("table {}", t.table)))?;
        apply_table(table, t)?;
    }
    for p in d.peers {
        let dev = ns
            .wireguard_devices
            .iter_mut()
            .find(|x| x.name == p.device)
            .ok_or_else(|| DeltaError::Missing(format!("WireGuard device {}", p.device)))?;
        for key in p.removed {
            dev.peers.remove(&key).ok_or_else(|| DeltaError::Missing(format!("peer {key}")))?;
        }
        for peer in p.put {
            dev.peers.insert(peer);
        }
    }
    let NetnsItems { sysctls, nft_tables, links, addresses, routes, ip_rules, neighbours, wireguard_devices } = added;
    ns.sysctls.extend(sysctls);
    ns.nft_tables
        .extend(nft_tables.into_iter().map(|t| NftTable { sets: t.sets.into_iter().map(sent_whole).collect(), ..t }));
    ns.links.extend(links);
    ns.addresses.extend(addresses);
    ns.routes.extend(routes);
    ns.ip_rules.extend(ip_rules);
    ns.neighbours.extend(neighbours);
    ns.wireguard_devices.extend(wireguard_devices);
    // Sets edited by element kept their order and runs; only those that came whole (no digest)
    // are ordered and digested here.
    order_beside_elements(&mut ns);
    for set in ns.nft_tables.iter_mut().flat_map(|t| t.sets.iter_mut()).filter(|s| s.digest.is_empty()) {
        set.elements.sort_by_cached_key(element_order);
        set.elements.dedup();
        (set.runs, set.digest) = element_runs(&set.elements);
    }
    ns.version = netns_version(&ns);
    if ns.version != version {
        return Err(DeltaError::Mismatch { got: ns.version, want: version });
    }
    Ok(ns)
}

/// The items of `old` not in `new` and of `new` not in `old`, counting repeats. Both lists are
/// in canonical order, so their equal ends are skipped by comparison alone.
fn list_diff<T: Message + PartialEq + Clone>(old: &[T], new: &[T], removed: &mut Vec<T>, added: &mut Vec<T>) {
    let start = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let (old, new) = (&old[start..], &new[start..]);
    let end = old.iter().rev().zip(new.iter().rev()).take_while(|(a, b)| a == b).count();
    let (old, new) = (&old[..old.len() - end], &new[..new.len() - end]);
    let mut count: HashMap<Vec<u8>, isize> = HashMap::with_capacity(old.len() + new.len());
    for x in new {
        *count.entry(x.encode_to_vec()).or_default() += 1;
    }
    for x in old {
        *count.entry(x.encode_to_vec()).or_default() -= 1;
    }
    for x in old {
        if let Some(c) = count.get_mut(&x.encode_to_vec()).filter(|c| **c < 0) {
            *c += 1;
            removed.push(x.clone());
        }
    }
    for x in new {
        if let Some(c) = count.get_mut(&x.encode_to_vec()).filter(|c| **c > 0) {
            *c -= 1;
            added.push(x.clone());
        }
    }
}

/// Removes each of `removed` from `items` (equal as encoded), or says which is missing.
fn remove_items<T: Message + Clone>(items: &mut Vec<T>, removed: Vec<T>, what: &str) -> Result<(), DeltaError> {
    if removed.is_empty() {
        return Ok(());
    }
    let mut count: HashMap<Vec<u8>, usize> = HashMap::with_capacity(removed.len());
    for x in &removed {
        *count.entry(x.encode_to_vec()).or_default() += 1;
    }
    let mut left = removed.len();
    items.retain(|x| {
        if left == 0 {
            return true;
        }
        match count.get_mut(&x.encode_to_vec()).filter(|c| **c > 0) {
            Some(c) => {
                *c -= 1;
                left -= 1;
                false
            }
            None => true,
        }
    });
    if left > 0 {
        return Err(DeltaError::Missing(what.to_string()));
    }
    Ok(())
}

/// The change from one version of a table to another: chains and sets by name, and the
/// elements of each set whose declaration stayed.
fn table_delta(old: &NftTable, new: &NftTable) -> TableDelta {
    let mut d = TableDelta { family: new.family, table: new.name.clone(), ..Default::default() };
    let old_chains: HashMap<&str, &NftChain> = old.chains.iter().map(|c| (c.name.as_str(), c)).collect();
    let new_chains: HashSet<&str> = new.chains.iter().map(|c| c.name.as_str()).collect();
    d.chains_removed =
        old.chains.iter().filter(|c| !new_chains.contains(c.name.as_str())).map(|c| c.name.clone()).collect();
    d.chains_put = new.chains.iter().filter(|c| old_chains.get(c.name.as_str()) != Some(c)).cloned().collect();
    let old_sets: HashMap<&str, &NftSet> = old.sets.iter().map(|s| (s.name.as_str(), s)).collect();
    let new_sets: HashSet<&str> = new.sets.iter().map(|s| s.name.as_str()).collect();
    d.sets_removed = old.sets.iter().filter(|s| !new_sets.contains(s.name.as_str())).map(|s| s.name.clone()).collect();
    for set in &new.sets {
        match old_sets.get(set.name.as_str()) {
            Some(o) if same_declaration(o, set) => {
                if o.elements != set.elements {
                    let mut e = SetDelta { set: set.name.clone(), ..Default::default() };
                    list_diff(&o.elements, &set.elements, &mut e.removed, &mut e.added);
                    d.sets.push(e);
                }
            }
            _ => d.sets_put.push(bare_set(set)),
        }
    }
    d
}

fn apply_table(table: &mut NftTable, d: TableDelta) -> Result<(), DeltaError> {
    let TableDelta { family: _, table: name, chains_removed, chains_put, sets_removed, sets_put, sets } = d;
    let missing = |what: &str, n: &str| DeltaError::Missing(format!("{what} {n} of table {name}"));
    for c in chains_removed {
        let i = table.chains.iter().position(|x| x.name == c).ok_or_else(|| missing("chain", &c))?;
        table.chains.swap_remove(i);
    }
    for c in chains_put {
        match table.chains.iter_mut().find(|x| x.name == c.name) {
            Some(x) => *x = c,
            None => table.chains.push(c),
        }
    }
    for s in sets_removed {
        let i = table.sets.iter().position(|x| x.name == s).ok_or_else(|| missing("set", &s))?;
        table.sets.swap_remove(i);
    }
    for s in sets_put {
        let s = sent_whole(s);
        match table.sets.iter_mut().find(|x| x.name == s.name) {
            Some(x) => *x = s,
            None => table.sets.push(s),
        }
    }
    for e in sets {
        let set = table.sets.iter_mut().find(|x| x.name == e.set).ok_or_else(|| missing("set", &e.set))?;
        if set.digest.is_empty() {
            // Ordered and digested whole once the delta is in.
            remove_items(&mut set.elements, e.removed, "an element")?;
            set.elements.extend(e.added);
        } else {
            edit_set(set, e.removed, e.added)
                .map_err(|element| missing("element", &format!("{element} of set {}", e.set)))?;
        }
    }
    Ok(())
}

/// A set sent whole: its digest and runs are the executor's to make, never taken as sent.
fn sent_whole(s: NftSet) -> NftSet {
    NftSet { digest: Vec::new(), runs: Vec::new(), ..s }
}

/// Removes `removed` from a canonical set and puts `added` in their places, each found by
/// its order in time logarithmic in the set, then digests again only the runs they fall in:
/// the set stays canonical. An added element already there stays once; a removed one that is
/// not there is named.
fn edit_set(set: &mut NftSet, removed: Vec<NftElement>, added: Vec<NftElement>) -> Result<(), String> {
    let old = std::mem::take(&mut set.elements);
    // The first place at or after which an element of `e`'s order stands, and where `e` is.
    let find = |e: &NftElement| {
        let order = element_order(e);
        let first = old.partition_point(|x| element_order(x) < order);
        let at = old[first..].iter().take_while(|x| element_order(x) == order).position(|x| x == e).map(|i| first + i);
        (order, first, at)
    };
    let mut gone = Vec::with_capacity(removed.len());
    for e in &removed {
        match find(e) {
            (_, _, Some(at)) => gone.push(at),
            _ => {
                set.elements = old;
                return Err(crate::text::set_element(set, e));
            }
        }
    }
    gone.sort_unstable();
    if let Some(w) = gone.windows(2).find(|w| w[0] == w[1]) {
        let twice = crate::text::set_element(set, &old[w[0]]);
        set.elements = old;
        return Err(twice);
    }
    let mut put: Vec<(usize, NftElement)> = Vec::with_capacity(added.len());
    for e in added {
        match find(&e) {
            // Removed and added again: it stays.
            (_, _, Some(at)) => {
                if let Ok(i) = gone.binary_search(&at) {
                    gone.remove(i);
                }
            }
            (order, first, None) => {
                let after = first + old[first..].iter().take_while(|x| element_order(x) == order).count();
                put.push((after, e));
            }
        }
    }
    put.sort_by_cached_key(|(at, e)| (*at, element_order(e)));
    put.dedup_by(|a, b| a == b);
    let old_len = old.len();
    let before: Vec<usize> = put.iter().map(|(at, _)| *at).collect();
    // Each removed position is one of the old elements, once.
    let mut elements = Vec::with_capacity(old_len - gone.len() + put.len());
    let (mut g, mut p) = (gone.iter().copied().peekable(), put.into_iter().peekable());
    for (i, e) in old.into_iter().enumerate() {
        while let Some((_, x)) = p.next_if(|(at, _)| *at == i) {
            elements.push(x);
        }
        if g.next_if_eq(&i).is_none() {
            elements.push(e);
        }
    }
    elements.extend(p.map(|(_, x)| x));
    (set.runs, set.digest) = runs_after_edit(&set.runs, old_len, &gone, &before, &elements);
    set.elements = elements.into();
    Ok(())
}

/// A table to send: its sets' digests and runs left out, as the executor computes them.
fn bare_table(t: &NftTable) -> NftTable {
    NftTable { sets: t.sets.iter().map(bare_set).collect(), ..t.clone() }
}

fn bare_set(s: &NftSet) -> NftSet {
    NftSet { digest: Vec::new(), runs: Vec::new(), ..s.clone() }
}

/// A set's declaration: everything but its elements (and their digests, which follow them).
fn same_declaration(a: &NftSet, b: &NftSet) -> bool {
    let NftSet {
        name,
        key,
        data,
        interval,
        counter,
        elements: _,
        digest: _,
        runs: _,
        udp_flows,
        dynamic,
        size,
        timeout_seconds,
    } = a;
    (name, key, data, interval, counter, udp_flows, dynamic, size, timeout_seconds)
        == (&b.name, &b.key, &b.data, &b.interval, &b.counter, &b.udp_flows, &b.dynamic, &b.size, &b.timeout_seconds)
}

/// Costs what differs: the parts of the peer maps the two devices share are skipped.
fn peer_delta(old: &WireguardDevice, new: &WireguardDevice) -> PeerDelta {
    let (removed, put) = old.peers.changes(&new.peers);
    PeerDelta {
        device: new.name.clone(),
        removed: removed.into_iter().map(|p| p.public_key.clone()).collect(),
        put: put.into_iter().cloned().collect(),
    }
}

/// A device's settings: everything but its peers.
fn same_settings(a: &WireguardDevice, b: &WireguardDevice) -> bool {
    let WireguardDevice { name, mtu, listen_port, fwmark, peers: _ } = a;
    (name, mtu, listen_port, fwmark) == (&b.name, &b.mtu, &b.listen_port, &b.fwmark)
}

fn table_id(t: &NftTable) -> NftTable {
    NftTable { family: t.family, name: t.name.clone(), ..Default::default() }
}

fn device_id(d: &WireguardDevice) -> WireguardDevice {
    WireguardDevice { name: d.name.clone(), ..Default::default() }
}

#[cfg(test)]
mod tests;
