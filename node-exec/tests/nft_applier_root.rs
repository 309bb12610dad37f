//! Root tests of the remembering [`Applier`] in scratch network namespaces, with the `nft`
//! CLI and the text renderer as oracles. They fail when not run as root unless
//! KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
use host::{root, run};

mod common {
    include!("common/example.rs");
}

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use kuport_node_exec::nft::{Applier, ApplyMode, apply_table, diff, normalize, read_table};
use kuport_proto::v1::{L4Proto, NetnsState, NftFamily, NftTable, NodeState};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A scratch network namespace, deleted on drop.
struct Netns(String);

impl Netns {
    fn new() -> Self {
        let name = format!("kuport-applier-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        run("ip", &["netns", "add", &name]);
        Netns(name)
    }
    fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.0)
    }
    fn nft(&self, args: &[&str]) -> String {
        let mut a = vec!["netns", "exec", &self.0, "nft"];
        a.extend_from_slice(args);
        run("ip", &a)
    }
    fn list(&self) -> String {
        self.nft(&["-s", "list", "table", "ip", "kuport"])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn set_mut<'a>(t: &'a mut NftTable, name: &str) -> &'a mut kuport_proto::v1::NftSet {
    t.sets.iter_mut().find(|s| s.name == name).unwrap_or_else(|| panic!("no set {name}"))
}

/// The example with `n` published ports, so the deltas below are small against a real table.
fn example_with_ports(n: u32) -> NftTable {
    let mut t = kuport_example();
    let publish = set_mut(&mut t, "publish_port");
    for i in 0..n {
        publish.elements.push(elem(
            vec![ifname("enp1s0"), proto(L4Proto::Tcp), port(10_000 + i, 10_000 + i)],
            vec![addr("10.244.18.7"), port(3000, 3000)],
        ));
    }
    t
}

fn assert_lists(ns: &Netns, desired: &NftTable) {
    assert_eq!(ns.list(), kuport_proto::text::nft_table(desired));
}

#[test]
fn one_element_changes_send_exactly_that_delta() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let mut a = Applier::new(Some(&ns.path()));
    let mut desired = example_with_ports(100);
    let r = a.apply(&desired).expect("cold apply");
    assert_eq!(r.mode, ApplyMode::Replaced);
    assert!(a.remembers());
    assert_lists(&ns, &desired);

    // Add one element to an interval map (listed in insertion order: appended last).
    set_mut(&mut desired, "return_mark")
        .elements
        .push(elem(vec![addr("10.244.18.9"), proto(L4Proto::Udp), port(53, 53)], vec![mark(0x6b70_0002)]));
    let r = a.apply(&desired).expect("add");
    assert_eq!((r.mode.clone(), r.writes, r.batches), (ApplyMode::Elements, 1, 1), "{:?}", r.diffs);
    assert_eq!(r.diffs.len(), 1, "{:?}", r.diffs);
    assert_lists(&ns, &desired);

    // Add one element in the middle of a hashed map.
    let publish = set_mut(&mut desired, "publish_port");
    publish.elements.insert(
        50,
        elem(vec![ifname("enp1s0"), proto(L4Proto::Udp), port(9_999, 9_999)], vec![addr("10.244.18.8"), port(53, 53)]),
    );
    let r = a.apply(&desired).expect("add in the middle");
    assert_eq!((r.mode.clone(), r.writes, r.batches), (ApplyMode::Elements, 1, 1), "{:?}", r.diffs);
    assert_lists(&ns, &desired);

    // Remove one.
    set_mut(&mut desired, "publish_port").elements.remove(10);
    let r = a.apply(&desired).expect("remove");
    assert_eq!((r.mode.clone(), r.writes, r.batches), (ApplyMode::Elements, 1, 1), "{:?}", r.diffs);
    assert_lists(&ns, &desired);

    // Change one element's data: a delete and an add of that key, in one transaction.
    set_mut(&mut desired, "publish_port").elements[20].data[0] = addr("10.244.18.99");
    let r = a.apply(&desired).expect("change");
    assert_eq!((r.mode.clone(), r.writes, r.batches), (ApplyMode::Elements, 2, 1), "{:?}", r.diffs);
    assert_lists(&ns, &desired);

    // Nothing changed: nothing written.
    let r = a.apply(&desired).expect("no-op");
    assert_eq!((r.mode, r.writes, r.batches), (ApplyMode::Unchanged, 0, 0));
}

#[test]
fn rule_changes_are_written_in_place_and_hook_changes_rebuild() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let mut a = Applier::new(Some(&ns.path()));
    let mut desired = example_with_ports(10);
    a.apply(&desired).expect("cold apply");

    desired.chains[0].rules.pop();
    // The chain is flushed and its rules written again, in one transaction; the sets stay.
    let r = a.apply(&desired).expect("rule removed");
    assert_eq!((r.mode.clone(), r.batches), (ApplyMode::Chains, 1), "{:?}", r.diffs);
    assert_lists(&ns, &desired);

    if let Some(b) = desired.chains[1].base.as_mut() {
        b.priority += 1;
    }
    let r = a.apply(&desired).expect("chain changed");
    assert_eq!(r.mode, ApplyMode::Replaced, "{:?}", r.diffs);
    assert_lists(&ns, &desired);

    let r = a.apply(&desired).expect("no-op");
    assert_eq!((r.mode, r.writes), (ApplyMode::Unchanged, 0));
}

#[test]
fn forget_reads_back_and_repairs_outside_changes() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let mut a = Applier::new(Some(&ns.path()));
    let desired = example_with_ports(10);
    a.apply(&desired).expect("cold apply");

    ns.nft(&["delete", "element", "ip", "kuport", "ct_mark", "{ \"kup-aaaa\" }"]);
    // Trusting its memory, the applier does not see the change...
    let r = a.apply(&desired).expect("trusted no-op");
    assert_eq!(r.writes, 0);
    // ...until told the kernel may have changed.
    a.forget();
    assert!(!a.remembers());
    let r = a.apply(&desired).expect("repair");
    assert_eq!((r.mode.clone(), r.writes, r.batches), (ApplyMode::Elements, 1, 1), "{:?}", r.diffs);
    assert_lists(&ns, &desired);
    assert!(a.remembers());

    ns.nft(&["delete", "table", "ip", "kuport"]);
    a.forget();
    let r = a.apply(&desired).expect("rebuild");
    assert_eq!(r.mode, ApplyMode::Replaced);
    assert_lists(&ns, &desired);
}

#[test]
fn invalid_desired_state_keeps_the_memory() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let mut a = Applier::new(Some(&ns.path()));
    let desired = example_with_ports(10);
    a.apply(&desired).expect("cold apply");
    let mut bad = desired.clone();
    let dup = set_mut(&mut bad, "publish_port").elements[3].clone();
    set_mut(&mut bad, "publish_port").elements.push(dup);
    let err = a.apply(&bad).expect_err("a duplicate key is refused");
    assert!(err.to_string().contains("two elements with the same key"), "{err}");
    assert!(a.remembers(), "nothing was written, so the memory still holds");
    let r = a.apply(&desired).expect("no-op");
    assert_eq!(r.writes, 0);
    assert_lists(&ns, &desired);
}

/// `t` as the controller sends it: canonical order and every set's digest
/// (`kuport_proto::canonicalize`).
fn canonical(t: NftTable) -> NftTable {
    let mut st =
        NodeState { node: "n".into(), netns: vec![NetnsState { nft_tables: vec![t].into(), ..Default::default() }] };
    kuport_proto::canonicalize(&mut st);
    st.netns.pop().and_then(|mut n| n.nft_tables.pop()).expect("the table")
}

fn digest_of(t: &NftTable, set: &str) -> Vec<u8> {
    t.sets.iter().find(|s| s.name == set).map(|s| s.digest.clone()).unwrap_or_default()
}

#[test]
fn an_unchanged_digest_skips_the_set_and_a_changed_one_sends_the_delta() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let mut a = Applier::new(Some(&ns.path()));
    let desired = canonical(example_with_ports(100));
    assert!(!digest_of(&desired, "publish_port").is_empty());
    a.apply(&desired).expect("cold apply");
    // Digests change nothing of what is written or listed.
    assert_lists(&ns, &desired);

    // One more element, digests recomputed: exactly that delta.
    let mut plus = desired.clone();
    set_mut(&mut plus, "publish_port").elements.push(elem(
        vec![ifname("enp1s0"), proto(L4Proto::Udp), port(9_999, 9_999)],
        vec![addr("10.244.18.8"), port(53, 53)],
    ));
    let plus = canonical(plus);
    assert_ne!(digest_of(&plus, "publish_port"), digest_of(&desired, "publish_port"));
    assert_eq!(digest_of(&plus, "claim"), digest_of(&desired, "claim"));
    let r = a.apply(&plus).expect("add");
    assert_eq!((r.mode.clone(), r.writes, r.batches), (ApplyMode::Elements, 1, 1), "{:?}", r.diffs);
    assert_lists(&ns, &plus);
    let r = a.apply(&desired).expect("remove");
    assert_eq!((r.mode.clone(), r.writes, r.batches), (ApplyMode::Elements, 1, 1), "{:?}", r.diffs);
    assert_lists(&ns, &desired);

    // A set whose digest equals the remembered one is not walked: elements changed behind a
    // stale digest (which canonicalize never produces) are not seen. This shows the skip.
    let mut stale = desired.clone();
    set_mut(&mut stale, "publish_port").elements.remove(3);
    let r = a.apply(&stale).expect("stale digest");
    assert_eq!((r.mode.clone(), r.writes), (ApplyMode::Unchanged, 0), "{:?}", r.diffs);
    // Without a digest the same set is compared element by element.
    let mut plain = stale.clone();
    set_mut(&mut plain, "publish_port").digest.clear();
    set_mut(&mut plain, "publish_port").runs.clear();
    let r = a.apply(&plain).expect("no digest");
    assert_eq!((r.mode.clone(), r.writes, r.batches), (ApplyMode::Elements, 1, 1), "{:?}", r.diffs);
    assert_eq!(r.compared, set_mut(&mut plain, "publish_port").elements.len());
    assert_lists(&ns, &plain);
    // The memory holds no digest for that set now, so even the stale digest is compared.
    let r = a.apply(&desired).expect("back");
    assert_eq!((r.mode.clone(), r.writes), (ApplyMode::Elements, 1), "{:?}", r.diffs);
    assert_lists(&ns, &desired);

    // After forget() nothing remembered is trusted: the kernel is read back.
    ns.nft(&["delete", "element", "ip", "kuport", "publish_port", "{ \"enp1s0\" . tcp . 10005 }"]);
    a.forget();
    let r = a.apply(&desired).expect("repair");
    assert_eq!((r.mode.clone(), r.writes), (ApplyMode::Elements, 1), "{:?}", r.diffs);
    assert_lists(&ns, &desired);
}

#[test]
fn equal_runs_at_both_ends_are_not_walked() {
    if !root() {
        return;
    }
    const PORTS: u32 = 20_000;
    let ns = Netns::new();
    let mut a = Applier::new(Some(&ns.path()));
    let desired = canonical(example_with_ports(PORTS));
    let runs = |t: &NftTable| t.sets.iter().find(|s| s.name == "publish_port").map(|s| s.runs.len()).unwrap_or(0);
    assert!(runs(&desired) > 20, "{} runs", runs(&desired));
    a.apply(&desired).expect("cold apply");

    // One element more in the middle of 20,000: the elements of a run or two are compared.
    let mut plus = desired.clone();
    set_mut(&mut plus, "publish_port").elements.push(elem(
        vec![ifname("enp1s0"), proto(L4Proto::Tcp), port(10_000 + PORTS / 2, 10_000 + PORTS / 2)],
        vec![addr("10.244.18.9"), port(80, 80)],
    ));
    // (the port is taken: give the new element another interface, so its key is new)
    let added = set_mut(&mut plus, "publish_port").elements.last_mut().expect("pushed");
    added.key[0] = ifname("wt0");
    let plus = canonical(plus);
    let r = a.apply(&plus).expect("add");
    assert_eq!((r.mode.clone(), r.writes, r.batches), (ApplyMode::Elements, 1, 1), "{:?}", r.diffs);
    assert!(r.compared < 2_000, "compared {} of {} elements", r.compared, PORTS);
    assert_lists(&ns, &plus);
    let r = a.apply(&desired).expect("remove");
    assert_eq!((r.mode.clone(), r.writes, r.batches), (ApplyMode::Elements, 1, 1), "{:?}", r.diffs);
    assert!(r.compared < 2_000, "compared {} of {} elements", r.compared, PORTS);
    assert_lists(&ns, &desired);

    // The runs are trusted like the digest: an element changed inside a run whose digest was
    // copied unchanged (which canonicalize never produces) goes unseen, while the added element,
    // where the runs differ, is written.
    let mut stale = plus.clone();
    let set = set_mut(&mut stale, "publish_port");
    let first = set.elements.iter().position(|e| e.key[2] == port(10_000, 10_000)).expect("port 10000");
    set.elements[first].data[0] = addr("10.244.18.10");
    let r = a.apply(&stale).expect("stale run");
    assert_eq!((r.mode.clone(), r.writes), (ApplyMode::Elements, 1), "{:?}", r.diffs);
    assert!(ns.list().contains("tcp . 10000 counter : 10.244.18.7 . 3000"), "port 10000 was rewritten");
    // Without digest and runs the whole set is compared, and that element is rewritten too.
    let mut plain = stale.clone();
    let set = set_mut(&mut plain, "publish_port");
    (set.digest, set.runs) = (Vec::new(), Vec::new());
    let total = set.elements.len();
    let r = a.apply(&plain).expect("no runs");
    assert_eq!(r.compared, total);
    assert_eq!((r.mode.clone(), r.writes), (ApplyMode::Elements, 2), "{:?}", r.diffs);
    assert_lists(&ns, &plain);
}

#[test]
fn no_digest_is_trusted_after_an_error() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let mut a = Applier::new(Some(&ns.path()));
    let desired = canonical(example_with_ports(10));
    a.apply(&desired).expect("cold apply");
    // A refused apply (a duplicate key in another set): nothing is written, the memory stays...
    let mut bad = desired.clone();
    let dup = set_mut(&mut bad, "return_mark").elements[0].clone();
    set_mut(&mut bad, "return_mark").elements.push(dup);
    set_mut(&mut bad, "return_mark").digest.clear();
    a.apply(&bad).expect_err("a duplicate key is refused");
    assert!(a.remembers());
    // ...but its digests do not: a stale digest equal to the one remembered before the error
    // no longer skips the set.
    let mut stale = desired.clone();
    set_mut(&mut stale, "publish_port").elements.remove(3);
    let r = a.apply(&stale).expect("compared element by element");
    assert_eq!((r.mode.clone(), r.writes, r.batches), (ApplyMode::Elements, 1, 1), "{:?}", r.diffs);
}

#[test]
fn read_back_tables_carry_no_digest() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let desired = canonical(example_with_ports(10));
    Applier::new(Some(&ns.path())).apply(&desired).expect("apply");
    let have = read_table(Some(&ns.path()), NftFamily::Ip, "kuport").expect("read").expect("the table");
    assert!(have.sets.iter().all(|s| s.digest.is_empty()));
    let want = normalize(&desired).expect("normalize");
    assert!(want.sets.iter().all(|s| s.digest.is_empty()));
    assert_eq!(diff(&want, Some(&have)), vec![]);
    // A stale applier's fresh read-back path (apply_table) sees nothing to do either.
    let r = apply_table(Some(&ns.path()), &desired).expect("apply_table");
    assert_eq!((r.mode, r.writes), (ApplyMode::Unchanged, 0));
}
