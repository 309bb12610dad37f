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
use kuport_node_exec::nft::{Applier, ApplyMode};
use kuport_proto::v1::{L4Proto, NftTable};

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
fn rule_and_chain_changes_rebuild() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let mut a = Applier::new(Some(&ns.path()));
    let mut desired = example_with_ports(10);
    a.apply(&desired).expect("cold apply");

    desired.chains[0].rules.pop();
    let r = a.apply(&desired).expect("rule removed");
    assert_eq!((r.mode.clone(), r.batches), (ApplyMode::Replaced, 1), "{:?}", r.diffs);
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
