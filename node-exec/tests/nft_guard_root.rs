//! Verdict maps, `ct state` and dynamic sets through kuport's own nf_tables codec, with the `nft`
//! CLI as the oracle, in scratch network namespaces: tests/data/guard_inet.rs applied lists
//! exactly as the canonical text renders it and as `nft -f tests/data/guard_inet.nft` lists,
//! reads back equal, and a re-apply writes nothing, also when the kernel has filled the dynamic
//! sets (their elements are the kernel's). A mapping's chain and the verdict-map element that
//! jumps to it come and go together in one incremental apply (the chain exists before the
//! element jumps to it, and goes only once nothing refers to it), and the dynamic sets keep
//! their state through it. They fail when not run as root unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
#[path = "common/netns.rs"]
mod netns;
use host::{root, run};
use netns::Netns;

include!("data/guard_inet.rs");

use kuport_node_exec::nft::{Applier, ApplyMode, apply_table, normalize, read_table};
use kuport_proto::build::{accept, addr, chain, counter, element, ifname, jump_to, port, proto, rule};
use kuport_proto::v1::{L4Proto, NftFamily, NftTable};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/guard_inet.nft");
const TABLE: &str = "kuport-guard";

fn list(ns: &Netns) -> String {
    ns.nft(&["-s", "list", "table", "inet", TABLE])
}

/// The listing the canonical text promises for `t`.
fn text(t: &NftTable) -> String {
    kuport_proto::text::nft_table(t)
}

#[test]
fn guard_table_lists_like_nft_and_reads_back() {
    if !root() {
        return;
    }
    let desired = guard_inet_table();
    let (ours, theirs) = (Netns::new("guard", "ours"), Netns::new("guard", "theirs"));
    let r = apply_table(Some(&ours.path()), &desired).expect("apply");
    assert_eq!(r.mode, ApplyMode::Replaced);
    assert_eq!(list(&ours), text(&desired), "our apply lists as the canonical text");
    theirs.nft(&["-f", FILE]);
    assert_eq!(list(&theirs), text(&desired), "nft -f of the file lists as the canonical text");
    // The rules' expressions (the hash map's elements dump in the kernel's hash order, seeded
    // per set, so they are compared in the listing instead).
    let exprs = |ns: &Netns| -> String {
        let all = ns.nft(&["--debug=netlink", "list", "table", "inet", TABLE]);
        all.lines().filter(|l| !l.starts_with("\telement")).map(|l| format!("{l}\n")).collect()
    };
    assert_eq!(exprs(&ours), exprs(&theirs), "the kernel holds nft's own expressions");

    let again = apply_table(Some(&ours.path()), &desired).expect("re-apply");
    assert_eq!((again.mode, again.writes), (ApplyMode::Unchanged, 0), "{:?}", again.diffs);
    let back = read_table(Some(&ours.path()), NftFamily::Inet, TABLE).expect("read").expect("exists");
    assert_eq!(back, normalize(&desired).expect("normalize"));
    let theirs_back = read_table(Some(&theirs.path()), NftFamily::Inet, TABLE).expect("read").expect("exists");
    assert_eq!(theirs_back, back, "nft's own table decompiles to the same model");

    // The kernel's elements in the dynamic sets are not drift: nothing is written, they stay.
    ours.nft(&["add", "element", "inet", TABLE, "rl4", "{ 192.0.2.1 . 0x2a limit rate over 10/second }"]);
    ours.nft(&["add", "element", "inet", TABLE, "cc4", "{ 192.0.2.1 . 0x2a }"]);
    let again = apply_table(Some(&ours.path()), &desired).expect("apply with kernel elements");
    assert_eq!((again.mode, again.writes), (ApplyMode::Unchanged, 0), "{:?}", again.diffs);
    assert!(ours.nft(&["list", "set", "inet", TABLE, "rl4"]).contains("192.0.2.1 . 0x0000002a"));

    // A changed declaration (another timeout) recreates the set: its state goes with it.
    let mut longer = desired.clone();
    longer.sets[1].timeout_seconds = 120;
    let r = apply_table(Some(&ours.path()), &longer).expect("another timeout");
    assert_eq!(r.mode, ApplyMode::Replaced, "{:?}", r.diffs);
    assert_eq!(list(&ours), text(&longer));
    apply_table(Some(&ours.path()), &desired).expect("back");

    // A jump to a chain that is missing, or to a base chain, is refused before the kernel.
    let mut bad = desired.clone();
    bad.sets[3].elements[0].data = vec![jump_to("g-9")];
    let e = apply_table(Some(&ours.path()), &bad).expect_err("a jump to a missing chain");
    assert!(e.to_string().contains("jumps to chain g-9, which does not exist"), "{e}");
    bad.sets[3].elements[0].data = vec![jump_to("pre")];
    let e = apply_table(Some(&ours.path()), &bad).expect_err("a jump to a base chain");
    assert!(e.to_string().contains("which is a base chain"), "{e}");
}

/// The listing less the line of the element the test put in @rl4 as the kernel would (the
/// canonical text has none: the kernel's elements are not the state's).
fn ours(ns: &Netns) -> String {
    list(ns).lines().filter(|l| !l.contains("192.0.2.1 . 0x0000002a")).map(|l| format!("{l}\n")).collect()
}

/// A listing's sets and chains, each its own block, sorted: nft lists chains in the order they
/// were created, so a chain added in place lists last, while the canonical text sorts them.
fn blocks(listing: &str) -> Vec<String> {
    let body = listing.split_once("{\n").map(|(_, b)| b).unwrap_or(listing);
    let body = body.strip_suffix("}\n").unwrap_or(body);
    let mut out: Vec<String> = body.split("\n\n").map(|b| b.trim_end().to_string()).collect();
    out.sort();
    out
}

/// `desired` with one more mapping: chain g-3 and the element of @vm that jumps to it.
fn with_mapping(desired: &NftTable) -> NftTable {
    let mut t = desired.clone();
    t.chains.insert(2, chain("g-3", vec![rule(vec![], vec![counter(), accept()])]));
    t.sets[3]
        .elements
        .push(element(vec![ifname("veth0"), addr("10.0.0.3"), proto(L4Proto::Tcp), port(443)], vec![jump_to("g-3")]));
    t
}

#[test]
fn a_mapping_chain_and_its_jump_come_and_go_together() {
    if !root() {
        return;
    }
    let desired = guard_inet_table();
    let ns = Netns::new("guard", "mapping");
    let mut applier = Applier::new(Some(&ns.path()));
    applier.apply(&desired).expect("apply");
    ns.nft(&["add", "element", "inet", TABLE, "rl4", "{ 192.0.2.1 . 0x2a limit rate over 10/second }"]);
    let kernel_state = |ns: &Netns| ns.nft(&["list", "set", "inet", TABLE, "rl4"]).contains("192.0.2.1 . 0x0000002a");

    // Adding: the chain first, then the element that jumps to it, in one transaction (the kernel
    // refuses an element jumping to a chain that does not exist yet).
    let more = with_mapping(&desired);
    let r = applier.apply(&more).expect("add the chain and the element jumping to it");
    assert_eq!((r.mode.clone(), r.batches), (ApplyMode::Chains, 1), "{:?}", r.diffs);
    assert_eq!(blocks(&ours(&ns)), blocks(&text(&more)));
    assert!(kernel_state(&ns), "the dynamic set kept its state: {:?}", r.diffs);
    let again = applier.apply(&more).expect("re-apply");
    assert_eq!(again.writes, 0, "{:?}", again.diffs);

    // Removing: the element first, the chain after it (EBUSY while the element jumps to it).
    let r = applier.apply(&desired).expect("remove the element and the chain it jumps to");
    assert_eq!((r.mode.clone(), r.batches), (ApplyMode::Chains, 1), "{:?}", r.diffs);
    assert_eq!(ours(&ns), text(&desired));
    assert!(kernel_state(&ns), "the dynamic set kept its state: {:?}", r.diffs);

    // The same from a cold applier, which reads the kernel back and diffs.
    let mut cold = Applier::new(Some(&ns.path()));
    let r = cold.apply(&more).expect("cold add");
    assert_eq!(r.mode, ApplyMode::Chains, "{:?}", r.diffs);
    assert_eq!(blocks(&ours(&ns)), blocks(&text(&more)));
    assert!(kernel_state(&ns), "the dynamic set kept its state (cold)");
    let mut cold = Applier::new(Some(&ns.path()));
    let r = cold.apply(&desired).expect("cold remove");
    assert_eq!(r.mode, ApplyMode::Chains, "{:?}", r.diffs);
    assert_eq!(ours(&ns), text(&desired));
    assert!(kernel_state(&ns), "the dynamic set kept its state (cold)");
    let again = cold.apply(&desired).expect("re-apply");
    assert_eq!(again.writes, 0, "{:?}", again.diffs);

    // A changed base chain (another rule) is rewritten in place too; the rule jumps to g-3.
    let mut jump = with_mapping(&desired);
    jump.chains[3].rules.push(rule(vec![], vec![kuport_proto::build::jump("g-3")]));
    let r = applier.apply(&jump).expect("a base chain's rules and a new chain");
    assert_eq!(r.mode, ApplyMode::Chains, "{:?}", r.diffs);
    assert_eq!(blocks(&ours(&ns)), blocks(&text(&jump)));
    let r = applier.apply(&desired).expect("back");
    assert_eq!(r.mode, ApplyMode::Chains, "{:?}", r.diffs);
    assert_eq!(ours(&ns), text(&desired));
    assert!(kernel_state(&ns), "the dynamic set kept its state");

    // Interval map elements: one added jumping to the new chain, one changed to jump elsewhere
    // (deleted and re-added in the transaction), then both back.
    let mut ranges = with_mapping(&desired);
    ranges.sets[4].elements.push(element(
        vec![kuport_proto::build::ports(28000, 28010), ifname("veth0"), addr("10.0.0.1"), proto(L4Proto::Tcp)],
        vec![jump_to("g-3")],
    ));
    ranges.sets[4].elements[0].data = vec![jump_to("g-1")];
    let r = applier.apply(&ranges).expect("interval elements with a new chain");
    assert_eq!(r.mode, ApplyMode::Chains, "{:?}", r.diffs);
    // A concatenated interval map lists in insertion order (pipapo): compared as the model.
    let back = read_table(Some(&ns.path()), NftFamily::Inet, TABLE).expect("read").expect("exists");
    assert_eq!(back, normalize(&ranges).expect("normalize"));
    let listed = ours(&ns);
    assert!(listed.contains("28000-28010 . \"veth0\" . 10.0.0.1 . tcp : jump g-3"), "{listed}");
    assert!(listed.contains("27015-27115 . \"veth0\" . 10.0.0.1 . udp : jump g-1"), "{listed}");
    let r = applier.apply(&desired).expect("back");
    assert_eq!(r.mode, ApplyMode::Chains, "{:?}", r.diffs);
    assert_eq!(ours(&ns), text(&desired));
    let mut cold = Applier::new(Some(&ns.path()));
    assert_eq!(cold.apply(&desired).expect("read back").writes, 0);

    // An element that jumps to a chain the state lacks is refused before the kernel.
    let mut bad = desired.clone();
    bad.sets[3].elements[0].data = vec![jump_to("g-9")];
    let e = applier.apply(&bad).expect_err("a jump to a missing chain");
    assert!(e.to_string().contains("jumps to chain g-9, which does not exist"), "{e}");
    assert_eq!(ours(&ns), text(&desired));
}

/// New UDP flows to 127.0.0.1:`port` from one source (a fresh socket, so a fresh source port,
/// for each of `n` datagrams, sent back to back): how many a receiver in `ns` got.
fn received(ns: &Netns, port: u16, n: usize) -> usize {
    let script = format!(
        "import socket\n\
         r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); r.bind(('127.0.0.1', {port})); r.settimeout(0.5)\n\
         for i in range({n}):\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('127.0.0.1', {port})); s.close()\n\
         got = 0\n\
         try:\n    while True:\n        r.recv(16); got += 1\n\
         except socket.timeout:\n    pass\n\
         print(got)\n"
    );
    let out = run("ip", &["netns", "exec", &ns.name, "python3", "-c", &script]);
    out.trim().parse().unwrap_or_else(|_| panic!("a count, not {out:?}"))
}

/// The codec's verdict map and dynset hold real traffic to the limit: 20 new UDP flows from one
/// source, dispatched by `iifname . ip daddr . meta l4proto . th dport vmap` to a chain whose
/// `ct state new update @rl4 { ip saddr . TAG limit rate over 1/second burst 5 packets } drop`
/// passes the burst of 5 (one more token a second: the 20 are sent well within one); a second mapping (another tag, another port) has its own budget in the
/// same set. Ablation: without the update rule all 20 arrive.
#[test]
fn the_limit_holds_new_flows_from_one_source() {
    use kuport_proto::build::{base_chain, ct_state, drop, dynamic_set, limit, set, set_update, table, verdict_map};
    use kuport_proto::v1::{ChainPolicy, ChainType, Hook, NftType::*, Selector as S};
    if !root() {
        return;
    }
    let limited = |tag: u32| {
        vec![
            rule(
                vec![ct_state(kuport_proto::build::ct_state::NEW)],
                vec![set_update(&[S::IpSaddr], Some(tag), "rl4", limit(1, 5, true)), counter(), drop()],
            ),
            rule(vec![], vec![accept()]),
        ]
    };
    let guarded = |g1: Vec<kuport_proto::v1::NftRule>| {
        let vm = set(
            "vm",
            &[Ifname, Ipv4Addr, InetProto, InetService],
            &[Verdict],
            vec![
                element(vec![ifname("lo"), addr("127.0.0.1"), proto(L4Proto::Udp), port(5001)], vec![jump_to("g-1")]),
                element(vec![ifname("lo"), addr("127.0.0.1"), proto(L4Proto::Udp), port(5002)], vec![jump_to("g-2")]),
            ],
        );
        let pre = base_chain(
            "pre",
            ChainType::Filter,
            Hook::Prerouting,
            -120,
            ChainPolicy::Accept,
            vec![rule(vec![], vec![verdict_map(&[S::Iifname, S::IpDaddr, S::L4proto, S::ThDport], "vm")])],
        );
        let sets = vec![dynamic_set("rl4", &[Ipv4Addr, Mark], 65536, 60), vm];
        table(NftFamily::Inet, TABLE, sets, vec![chain("g-1", g1), chain("g-2", limited(2)), pre])
    };
    let ns = Netns::new("guard", "limit");
    let mut applier = Applier::new(Some(&ns.path()));
    applier.apply(&guarded(limited(1))).expect("apply");
    assert_eq!(received(&ns, 5001, 20), 5, "the burst of 5 passes, the rest is over the limit");
    assert_eq!(received(&ns, 5002, 20), 5, "the second mapping's own budget");
    let set = ns.nft(&["list", "set", "inet", TABLE, "rl4"]);
    assert!(set.contains("127.0.0.1 . 0x00000001") && set.contains("127.0.0.1 . 0x00000002"), "{set}");

    // Ablation: g-1 without its limit.
    applier.apply(&guarded(vec![rule(vec![], vec![accept()])])).expect("apply without the limit");
    assert_eq!(received(&ns, 5001, 20), 20, "without the update rule every flow arrives");
}

/// A table of 40,000 limit chains, each with its dynamic-set rule, and a verdict map jumping to
/// each (docs/portmap/guard.md, "Rate limits": 40,000 limited mappings on one node). The
/// transaction that creates them is over the 8 MiB send buffer (EMSGSIZE before the buffers
/// grew to fit) with 80,000 acknowledgements; a re-apply reads them back and writes nothing
/// (80 s before the chains were compared through an index, under a second after).
#[test]
fn forty_thousand_limit_chains_apply_in_one_table() {
    use kuport_proto::build::{ct_state, drop, dynamic_set, limit, set, set_update, table, verdict_map};
    use kuport_proto::v1::{ChainPolicy, ChainType, Hook, NftType, Selector};
    if !root() {
        return;
    }
    let ns = Netns::new("guard", "chains");
    const N: u32 = 40_000;
    let name = |i: u32| format!("kup-limit-{i:x}");
    let mut chains: Vec<_> = (0..N)
        .map(|i| {
            let update = set_update(&[Selector::IpSaddr], Some(i), "rate", limit(1_000_000, 1_000_000, true));
            chain(&name(i), vec![rule(vec![ct_state(8)], vec![update, counter(), drop()])])
        })
        .collect();
    let key = [NftType::Ifname, NftType::Ipv4Addr, NftType::InetProto, NftType::InetService];
    let elements = (0..N)
        .map(|i| element(vec![ifname("eth0"), addr("10.0.0.1"), proto(L4Proto::Tcp), port(i)], vec![jump_to(&name(i))]))
        .collect();
    let sets = vec![
        dynamic_set("rate", &[NftType::Ipv4Addr, NftType::Mark], 65_536, 60),
        set("limit_port", &key, &[NftType::Verdict], elements),
    ];
    let sel = [Selector::Iifname, Selector::IpDaddr, Selector::L4proto, Selector::ThDport];
    chains.push(kuport_proto::build::base_chain(
        "pre",
        ChainType::Filter,
        Hook::Prerouting,
        -120,
        ChainPolicy::Accept,
        vec![rule(vec![ct_state(8)], vec![verdict_map(&sel, "limit_port")])],
    ));
    let desired = table(NftFamily::Inet, TABLE, sets, chains);
    let r = apply_table(Some(&ns.path()), &desired).expect("the table applies");
    assert_eq!(r.mode, ApplyMode::Replaced, "{:?}", r.diffs.len());
    // Read back equal: every chain, rule and element is in the kernel.
    let again = apply_table(Some(&ns.path()), &desired).expect("the table re-applies");
    assert_eq!((again.mode, again.writes), (ApplyMode::Unchanged, 0));
}
