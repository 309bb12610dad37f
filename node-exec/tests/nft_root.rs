//! Root tests of the nf_tables applier in scratch network namespaces, with the `nft` CLI as
//! the oracle. They fail when not run as root unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
use host::{root, run};

mod common {
    include!("common/example.rs");
}

include!("data/overlay_relay.rs");

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use common::*;
use kuport_node_exec::nft::{
    ApplyMode, ApplyOptions, NftError, apply_table, apply_table_with, create_and_remove, normalize, read_table,
    remove_table,
};
use kuport_proto::v1::{L4Proto, NftFamily, Verdict, VerdictKind, nft_statement};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A scratch network namespace, deleted on drop.
struct Netns(String);

impl Netns {
    fn new() -> Self {
        let name = format!("kuport-nft-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
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
    fn list(&self, table: &str) -> String {
        self.nft(&["-s", "list", "table", "ip", table])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn example_file() -> String {
    format!("{}/tests/data/kuport_example.nft", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn example_lists_exactly_like_nft_and_reapplies_without_writes() {
    if !root() {
        return;
    }
    let (ours, theirs) = (Netns::new(), Netns::new());
    let desired = kuport_example();
    let r = apply_table(Some(&ours.path()), &desired).expect("apply");
    assert_eq!(r.mode, ApplyMode::Replaced);
    assert_eq!(r.batches, 1);
    theirs.nft(&["-f", &example_file()]);
    assert_eq!(ours.list("kuport"), theirs.list("kuport"));

    let again = apply_table(Some(&ours.path()), &desired).expect("re-apply");
    assert_eq!((again.mode, again.writes, again.batches), (ApplyMode::Unchanged, 0, 0), "{:?}", again.diffs);

    let back = read_table(Some(&ours.path()), NftFamily::Ip, "kuport").expect("read").expect("exists");
    assert_eq!(back, normalize(&desired).expect("normalize"));
    // nft's own table reads back the same way.
    let theirs_back = read_table(Some(&theirs.path()), NftFamily::Ip, "kuport").expect("read").expect("exists");
    assert_eq!(theirs_back, back);
    assert!(read_table(Some(&ours.path()), NftFamily::Ip, "absent").expect("read").is_none());
}

/// A table created as known absent (`create_and_remove`) is created exclusively: one that
/// appeared since the executor listed the namespace makes the whole transaction fail with
/// EEXIST and stays untouched, instead of being half merged.
#[test]
fn a_known_absent_table_that_exists_is_refused_whole() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    ns.nft(&["add", "table", "ip", "kuport"]);
    ns.nft(&["add", "chain", "ip", "kuport", "theirs"]);
    let before = ns.list("kuport");
    let want = normalize(&kuport_example()).expect("normalize");
    let err = create_and_remove(Some(&ns.path()), &[&want], &[], 10_000).expect_err("the table exists");
    match &err {
        NftError::Kernel { errno, .. } => assert_eq!(*errno, libc::EEXIST, "{err}"),
        other => panic!("expected a kernel refusal, got {other}"),
    }
    assert_eq!(ns.list("kuport"), before, "the existing table is untouched");
    // Absent, the same call creates it whole, as nft -f would.
    ns.nft(&["delete", "table", "ip", "kuport"]);
    create_and_remove(Some(&ns.path()), &[&want], &[], 10_000).expect("create").expect("within the budget");
    let theirs = Netns::new();
    theirs.nft(&["-f", &example_file()]);
    assert_eq!(ns.list("kuport"), theirs.list("kuport"));
}

#[test]
fn refused_change_keeps_the_old_table_and_names_the_rule() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let desired = kuport_example();
    apply_table(Some(&ns.path()), &desired).expect("apply");
    let before = ns.list("kuport");

    let mut bad = desired.clone();
    let jump = st(nft_statement::Kind::Verdict(Verdict { kind: VerdictKind::Jump as i32, chain: "missing".into() }));
    bad.chains[2].rules.push(rule(vec![], vec![jump]));
    let err = apply_table(Some(&ns.path()), &bad).expect_err("the kernel must refuse a jump to a missing chain");
    match &err {
        NftError::Kernel { object, errno, reason } => {
            assert_eq!(object, "rule 4 of chain kup-pre", "{err}");
            assert_eq!(*errno, libc::ENOENT, "{err}");
            assert!(reason.contains("No such file or directory"), "{err}");
        }
        other => panic!("expected a kernel refusal, got {other}"),
    }
    assert_eq!(ns.list("kuport"), before, "a refused batch must leave the old table");

    let mut bad = desired.clone();
    bad.sets[1].elements[0].key[0] = ifname("a-name-longer-than-15");
    let err = apply_table(Some(&ns.path()), &bad).expect_err("bad interface name");
    assert!(err.to_string().contains("of set ct_mark"), "{err}");
    assert_eq!(ns.list("kuport"), before);
}

#[test]
fn drift_is_repaired() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let desired = kuport_example();
    apply_table(Some(&ns.path()), &desired).expect("apply");
    let want = ns.list("kuport");

    ns.nft(&["delete", "element", "ip", "kuport", "ct_mark", "{ \"kup-aaaa\" }"]);
    ns.nft(&["add", "element", "ip", "kuport", "ct_mark", "{ \"kup-zzzz\" : 0x1 }"]);
    let r = apply_table(Some(&ns.path()), &desired).expect("repair elements");
    assert_eq!((r.mode, r.writes, r.batches), (ApplyMode::Elements, 2, 1), "{:?}", r.diffs);
    assert_eq!(ns.list("kuport"), want);

    ns.nft(&["delete", "table", "ip", "kuport"]);
    let r = apply_table(Some(&ns.path()), &desired).expect("repair table");
    assert_eq!(r.mode, ApplyMode::Replaced);
    assert_eq!(ns.list("kuport"), want);

    ns.nft(&["add", "table", "ip", "other"]);
    assert!(remove_table(Some(&ns.path()), NftFamily::Ip, "kuport").expect("remove"));
    assert!(!remove_table(Some(&ns.path()), NftFamily::Ip, "kuport").expect("remove again"));
    assert!(ns.nft(&["list", "tables"]).contains("table ip other"), "only kuport's table is removed");
}

#[test]
fn large_maps_go_in_bounded_transactions() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let mut desired = kuport_example();
    let n = 10_000u32;
    let publish = desired.sets.iter_mut().find(|s| s.name == "publish_port").expect("publish_port");
    publish.elements = (0..n)
        .map(|i| {
            elem(
                vec![ifname("enp1s0"), proto(L4Proto::Tcp), port(10_000 + i, 10_000 + i)],
                vec![addr("10.244.18.7"), port(3000, 3000)],
            )
        })
        .collect();
    let opts = ApplyOptions::default();
    let t = Instant::now();
    let r = apply_table_with(Some(&ns.path()), &desired, &opts).expect("apply");
    let cold = t.elapsed();
    // 6 other elements + 10,000: 11 transactions of at most 1,000 elements.
    assert_eq!(r.batches, 11, "{r:?}");
    let listed = ns.nft(&["-s", "list", "map", "ip", "kuport", "publish_port"]);
    assert_eq!(listed.matches(" : 10.244.18.7 . 3000").count(), n as usize);

    let t = Instant::now();
    let same = apply_table_with(Some(&ns.path()), &desired, &opts).expect("re-apply");
    let noop = t.elapsed();
    assert_eq!(same.writes, 0);

    let publish = desired.sets.iter_mut().find(|s| s.name == "publish_port").expect("publish_port");
    publish.elements[5].data[0] = addr("10.244.18.8");
    publish.elements.pop();
    let t = Instant::now();
    let delta = apply_table_with(Some(&ns.path()), &desired, &opts).expect("delta");
    let small = t.elapsed();
    assert_eq!((delta.mode, delta.batches), (ApplyMode::Elements, 1));
    assert_eq!(delta.writes, 3, "one delete, and a delete+add for the changed element");
    let back = read_table(Some(&ns.path()), NftFamily::Ip, "kuport").expect("read").expect("exists");
    assert_eq!(back, normalize(&desired).expect("normalize"));
    eprintln!("MEASURE 10k-element cold apply {cold:?}, no-op re-apply {noop:?}, 2-element delta {small:?}");
}

/// The model of tests/data/vocabulary.nft: the rest of the proto's vocabulary.
fn vocabulary() -> kuport_proto::v1::NftTable {
    use kuport_proto::v1::{
        ChainPolicy, ChainType, CmpOp::*, Counter, Hook, MapLookup, Nat, NatKind, NatTarget, NftChain, NftTable,
        NftType, PortRange, Redirect, Selector as S, SetMark, nat, nft_value::Value, redirect, set_mark,
    };
    let v = |kind, chain: &str| st(nft_statement::Kind::Verdict(Verdict { kind: kind as i32, chain: chain.into() }));
    let id = |i| kuport_proto::v1::NftValue { value: Some(Value::Id(i)) };
    let meta_set = |f| st(nft_statement::Kind::MetaMarkSet(SetMark { from: Some(f) }));
    let ct_set = |f| st(nft_statement::Kind::CtMarkSet(SetMark { from: Some(f) }));
    let target = |kind: NatKind, a: &str, p: Option<(u32, u32)>| {
        st(nft_statement::Kind::Nat(Nat {
            kind: kind as i32,
            family: NftFamily::Ip as i32,
            to: Some(nat::To::Target(NatTarget {
                addr: a.into(),
                port: p.map(|(first, last)| PortRange { first, last }),
            })),
        }))
    };
    let m = |s, op, val| rule(vec![cmp(s, op, val, 0)], vec![]);
    let mut filter = base(ChainType::Filter, Hook::Input, 0);
    if let Some(b) = &mut filter {
        b.policy = ChainPolicy::Drop as i32;
    }
    let c = NftChain {
        name: "c".into(),
        base: filter,
        rules: vec![
            rule(
                vec![cmp(S::Iifname, Eq, ifname("wt0"), 0)],
                vec![st(nft_statement::Kind::Counter(Counter {})), v(VerdictKind::Accept, "")],
            ),
            rule(vec![cmp(S::Oifname, Neq, ifname("eth0"), 0)], vec![v(VerdictKind::Drop, "")]),
            rule(vec![cmp(S::Iifname, Eq, ifname("lxc*"), 0)], vec![v(VerdictKind::Return, "")]),
            rule(vec![cmp(S::L4proto, Eq, proto(L4Proto::Tcp), 0)], vec![v(VerdictKind::Jump, "sub")]),
            rule(vec![cmp(S::L4proto, Neq, proto(L4Proto::Udp), 0)], vec![v(VerdictKind::Goto, "sub")]),
            m(S::IpSaddr, Eq, addr("10.0.0.1")),
            m(S::IpDaddr, Eq, addr("10.0.0.0/8")),
            m(S::IpDaddr, Neq, addr("10.1.0.0/16")),
            m(S::IpSaddr, Eq, addr("10.2.3.0/25")),
            m(S::TcpDport, Eq, port(80, 80)),
            m(S::TcpSport, Neq, port(80, 80)),
            m(S::UdpDport, Eq, port(27015, 27115)),
            m(S::UdpSport, Neq, port(1000, 2000)),
            m(S::ThDport, Eq, port(53, 53)),
            m(S::MetaMark, Eq, mark(0x10)),
            rule(vec![cmp(S::MetaMark, Eq, mark(0x100), 0xff00)], vec![]),
            m(S::CtMark, Neq, mark(5)),
            m(S::MetaSkuid, Eq, id(1000)),
            m(S::MetaSkgid, Neq, id(1001)),
            // Multi's restore (docs/portmap/datapath.md): the replies of kuport's connections.
            rule(
                vec![cmp(S::CtDirection, Eq, id(1), 0), cmp(S::CtMark, Eq, mark(0x6b70_0000), 0xffff_0000)],
                vec![meta_set(set_mark::From::Selector(S::CtMark as i32))],
            ),
            m(S::CtDirection, Neq, id(0)),
            rule(vec![lookup(&[S::IpSaddr], "s4", false)], vec![]),
            rule(vec![lookup(&[S::IpSaddr], "s4", true)], vec![]),
            rule(vec![lookup(&[S::Iifname], "sif", false)], vec![]),
            rule(vec![], vec![meta_set(set_mark::From::Value(0x6b70_0001))]),
            rule(vec![], vec![ct_set(set_mark::From::Value(1))]),
            rule(vec![], vec![meta_set(set_mark::From::Selector(S::CtMark as i32))]),
            rule(vec![], vec![ct_set(set_mark::From::Selector(S::MetaMark as i32))]),
        ],
    };
    let tcp = || cmp(S::L4proto, Eq, proto(L4Proto::Tcp), 0);
    let n = NftChain {
        name: "n".into(),
        base: base(ChainType::Nat, Hook::Output, -100),
        rules: vec![
            rule(vec![], vec![target(NatKind::Dnat, "10.0.0.1", None)]),
            rule(vec![tcp()], vec![target(NatKind::Dnat, "10.0.0.1", Some((80, 80)))]),
            rule(
                vec![cmp(S::L4proto, Eq, proto(L4Proto::Udp), 0)],
                vec![target(NatKind::Dnat, "10.0.0.1", Some((80, 90)))],
            ),
        ],
    };
    let p = NftChain {
        name: "p".into(),
        base: base(ChainType::Nat, Hook::Postrouting, 100),
        rules: vec![
            rule(vec![], vec![target(NatKind::Snat, "10.0.0.2", None)]),
            rule(vec![], vec![nat_sel(NatKind::Snat, S::IpDaddr)]),
        ],
    };
    let redirect_to = |to| st(nft_statement::Kind::Redirect(Redirect { to: Some(to) }));
    let r = NftChain {
        name: "r".into(),
        base: base(ChainType::Nat, Hook::Prerouting, -100),
        rules: vec![
            rule(
                vec![cmp(S::TcpDport, Eq, port(80, 80), 0)],
                vec![redirect_to(redirect::To::Port(PortRange { first: 8080, last: 8080 }))],
            ),
            rule(
                vec![tcp()],
                vec![redirect_to(redirect::To::Map(MapLookup { key: sels(&[S::TcpDport]), map: "pm".into() }))],
            ),
        ],
    };
    let sub = NftChain { name: "sub".into(), base: None, rules: vec![] };
    NftTable {
        family: NftFamily::Ip as i32,
        name: "w".into(),
        sets: vec![
            set(
                "pm",
                &[NftType::InetService],
                &[NftType::InetService],
                false,
                false,
                vec![elem(vec![port(80, 80)], vec![port(8080, 8080)])],
            ),
            set("s4", &[NftType::Ipv4Addr], &[], false, false, vec![elem(vec![addr("10.0.0.1")], vec![])]),
            set("sif", &[NftType::Ifname], &[], false, false, vec![]),
        ]
        .into(),
        chains: vec![c, n, p, r, sub].into(),
    }
}

#[test]
fn vocabulary_lists_exactly_like_nft() {
    if !root() {
        return;
    }
    let (ours, theirs) = (Netns::new(), Netns::new());
    let desired = vocabulary();
    apply_table(Some(&ours.path()), &desired).expect("apply");
    theirs.nft(&["-f", &format!("{}/tests/data/vocabulary.nft", env!("CARGO_MANIFEST_DIR"))]);
    assert_eq!(ours.list("w"), theirs.list("w"));
    let again = apply_table(Some(&ours.path()), &desired).expect("re-apply");
    assert_eq!(again.writes, 0, "{:?}", again.diffs);
    let back = read_table(Some(&theirs.path()), NftFamily::Ip, "w").expect("read").expect("exists");
    assert_eq!(back, normalize(&desired).expect("normalize"));
}

/// The text renderer of kuport_proto agrees: `nft -f` of its text lists like our apply.
#[test]
fn rendered_text_lists_like_our_apply() {
    if !root() {
        return;
    }
    for desired in [kuport_example(), vocabulary()] {
        let (ours, theirs) = (Netns::new(), Netns::new());
        apply_table(Some(&ours.path()), &desired).expect("apply");
        let file = std::env::temp_dir().join(format!("{}.nft", theirs.0));
        std::fs::write(&file, kuport_proto::text::nft_table(&desired)).expect("write");
        theirs.nft(&["-f", &file.to_string_lossy()]);
        let _ = std::fs::remove_file(&file);
        assert_eq!(ours.list(&desired.name), theirs.list(&desired.name));
    }
}

/// The overlay's forward chain (docs/overlay/filter.md) with more `tcp flags` forms and the MSS
/// clamp: our apply lists like `nft -f` of tests/data/overlay_filter.nft, reads back equal (a
/// re-apply writes nothing, nft's own table reads back the same), and a rule deleted by hand is
/// put back.
#[test]
fn overlay_filter_lists_like_nft_reapplies_without_writes_and_is_repaired() {
    use kuport_proto::build::{accept, eq, proto, rule, tcp_flag::*, tcp_flags, tcp_mss_clamp};
    use kuport_proto::v1::Selector as S;
    if !root() {
        return;
    }
    // The controller's table, and the other forms of `tcp flags` nft lists.
    let cidrs: Vec<ipnet::IpNet> = ["10.42.1.0/24", "10.42.2.0/24"].map(|c| c.parse().expect("a CIDR")).to_vec();
    let mut desired = kuport_controller::compute::overlay::filter_table("kup-wg", &cidrs);
    desired.chains[0].rules.extend([
        rule(vec![tcp_flags(0, SYN | RST)], vec![accept()]),
        rule(vec![tcp_flags(SYN, 0xff)], vec![accept()]),
        rule(vec![eq(S::L4proto, proto(L4Proto::Tcp)), tcp_flags(SYN | ACK, SYN | ACK)], vec![accept()]),
        rule(vec![eq(S::L4proto, proto(L4Proto::Tcp))], vec![tcp_mss_clamp()]),
    ]);
    let list = |ns: &Netns| ns.nft(&["-s", "list", "table", "inet", "kuport-overlay"]);
    let (ours, theirs) = (Netns::new(), Netns::new());
    let r = apply_table(Some(&ours.path()), &desired).expect("apply");
    assert_eq!(r.mode, ApplyMode::Replaced);
    theirs.nft(&["-f", &format!("{}/tests/data/overlay_filter.nft", env!("CARGO_MANIFEST_DIR"))]);
    let want = list(&theirs);
    assert_eq!(list(&ours), want);
    assert_eq!(list(&ours), kuport_proto::text::nft_table(&desired), "the renderer prints what nft lists");

    let again = apply_table(Some(&ours.path()), &desired).expect("re-apply");
    assert_eq!((again.mode, again.writes, again.batches), (ApplyMode::Unchanged, 0, 0), "{:?}", again.diffs);
    let back = read_table(Some(&ours.path()), NftFamily::Inet, "kuport-overlay").expect("read").expect("exists");
    assert_eq!(back, normalize(&desired).expect("normalize"));
    let theirs_back =
        read_table(Some(&theirs.path()), NftFamily::Inet, "kuport-overlay").expect("read").expect("exists");
    assert_eq!(theirs_back, back);

    // Drift: the clamp deleted by hand comes back, and the table lists as before.
    let handles = ours.nft(&["-a", "list", "chain", "inet", "kuport-overlay", "forward"]);
    let handle = handles
        .lines()
        .find(|l| l.contains("maxseg") && l.contains("oifname"))
        .and_then(|l| l.rsplit("# handle ").next())
        .expect("the clamp's handle")
        .trim()
        .to_string();
    ours.nft(&["delete", "rule", "inet", "kuport-overlay", "forward", "handle", &handle]);
    assert_ne!(list(&ours), want);
    let r = apply_table(Some(&ours.path()), &desired).expect("repair");
    assert!(r.writes > 0, "{:?}", r.diffs);
    assert_eq!(list(&ours), want);
    let again = apply_table(Some(&ours.path()), &desired).expect("re-apply");
    assert_eq!(again.writes, 0, "{:?}", again.diffs);
}

/// A relay's forward chain (docs/overlay/filter.md) and the other address shapes of an inet
/// table: our apply lists like `nft -f` of tests/data/overlay_relay.nft and as the renderer
/// prints it, holds nft's own expressions (the `meta nfproto` dependency included), reads back
/// equal (a re-apply writes nothing, nft's own table reads back the same), and a relay accept
/// deleted by hand is put back.
#[test]
fn relay_accepts_list_like_nft_reapply_without_writes_and_are_repaired() {
    if !root() {
        return;
    }
    let desired = overlay_relay_table();
    let list = |ns: &Netns| ns.nft(&["-s", "list", "table", "inet", "kuport-overlay"]);
    let (ours, theirs) = (Netns::new(), Netns::new());
    let r = apply_table(Some(&ours.path()), &desired).expect("apply");
    assert_eq!(r.mode, ApplyMode::Replaced);
    theirs.nft(&["-f", &format!("{}/tests/data/overlay_relay.nft", env!("CARGO_MANIFEST_DIR"))]);
    let want = list(&theirs);
    assert_eq!(list(&ours), want);
    assert_eq!(list(&ours), kuport_proto::text::nft_table(&desired), "the renderer prints what nft lists");
    // The kernel holds the same expressions, dependencies and all: one `meta nfproto` per rule
    // with addresses (the two relay accepts and the six rules of `selectors`).
    let exprs = |ns: &Netns| ns.nft(&["--debug=netlink", "list", "table", "inet", "kuport-overlay"]);
    let held = exprs(&ours);
    assert_eq!(held, exprs(&theirs));
    assert_eq!(held.matches("[ meta load nfproto => reg 1 ]").count(), 8, "{held}");

    let again = apply_table(Some(&ours.path()), &desired).expect("re-apply");
    assert_eq!((again.mode, again.writes, again.batches), (ApplyMode::Unchanged, 0, 0), "{:?}", again.diffs);
    let back = read_table(Some(&ours.path()), NftFamily::Inet, "kuport-overlay").expect("read").expect("exists");
    assert_eq!(back, normalize(&desired).expect("normalize"));
    let theirs_back =
        read_table(Some(&theirs.path()), NftFamily::Inet, "kuport-overlay").expect("read").expect("exists");
    assert_eq!(theirs_back, back);

    // Drift: the IPv4 relay accept deleted by hand comes back, and the table lists as before.
    let handles = ours.nft(&["-a", "list", "chain", "inet", "kuport-overlay", "forward"]);
    let handle = handles
        .lines()
        .find(|l| l.contains("ip saddr @relay_v4"))
        .and_then(|l| l.rsplit("# handle ").next())
        .expect("the relay accept's handle")
        .trim()
        .to_string();
    ours.nft(&["delete", "rule", "inet", "kuport-overlay", "forward", "handle", &handle]);
    assert_ne!(list(&ours), want);
    let r = apply_table(Some(&ours.path()), &desired).expect("repair");
    assert!(r.writes > 0, "{:?}", r.diffs);
    assert!(r.diffs.iter().any(|d| d.to_string().contains("forward")), "{:?}", r.diffs);
    assert_eq!(list(&ours), want);
    let again = apply_table(Some(&ours.path()), &desired).expect("re-apply");
    assert_eq!(again.writes, 0, "{:?}", again.diffs);

    // A `meta nfproto` that guards no address (a hand-made rule) does not read as kuport's: the
    // read names it, and the apply rebuilds the table.
    ours.nft(&["add", "rule", "inet", "kuport-overlay", "selectors", "meta", "nfproto", "ipv4", "accept"]);
    let err = read_table(Some(&ours.path()), NftFamily::Inet, "kuport-overlay").expect_err("unreadable");
    assert!(err.to_string().contains("meta nfproto"), "{err}");
    let r = apply_table(Some(&ours.path()), &desired).expect("rebuild");
    assert_eq!(r.mode, ApplyMode::Replaced, "{:?}", r.diffs);
    assert!(r.diffs.iter().any(|d| d.to_string().contains("unreadable")), "{:?}", r.diffs);
    assert_eq!(list(&ours), want);
    let again = apply_table(Some(&ours.path()), &desired).expect("re-apply");
    assert_eq!(again.writes, 0, "{:?}", again.diffs);
}
