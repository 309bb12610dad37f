//! The steering chain's `ip daddr set ... map @m` (docs/portmap/firewall.md) through kuport's
//! own nf_tables codec, with the `nft` CLI as the oracle, in scratch network namespaces: our
//! apply of the controller's chain lists exactly like `nft -f` of tests/data/steer.nft and as
//! the renderer prints it, nft's own table decompiles to the same model (so our decompiler
//! accepts exactly nft's payload write with its checksum fields), a re-apply writes nothing,
//! and a steering rule deleted by hand is put back. They fail when not run as root unless
//! KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
#[path = "common/netns.rs"]
mod netns;
use host::root;
use netns::Netns;

use kuport_controller::compute::portmap::datapath::Family;
use kuport_controller::compute::portmap::steer::{CHAIN_STEER, Published, Steering, accepting, steering};
use kuport_node_exec::nft::{ApplyMode, apply_table, normalize, read_table};
use kuport_proto::build::table;
use kuport_proto::v1::{L4Proto, NftFamily, NftTable};

/// `nft -s list table ip kuport` in `ns`.
fn list(ns: &Netns) -> String {
    ns.nft(&["-s", "list", "table", "ip", "kuport"])
}

/// The controller's steering for the lab's edge-a: TCP 3000 on both interfaces, the UDP range
/// on enp1s0.
fn desired() -> NftTable {
    let published: Published = [
        (("enp1s0".to_string(), L4Proto::Tcp), vec![(3000, 3000)]),
        (("wt0".to_string(), L4Proto::Tcp), vec![(3000, 3000)]),
        (("enp1s0".to_string(), L4Proto::Udp), vec![(27015, 27115)]),
    ]
    .into();
    let (enp, wt) = (vec!["203.0.113.9/24".to_string()], vec!["100.64.93.143/32".to_string()]);
    let to_node = accepting(&published, Family::V4, |i| if i == "wt0" { wt.as_slice() } else { enp.as_slice() });
    let Steering { sets, chain, .. } = steering(&to_node, &Default::default(), &Default::default()).expect("steering");
    assert_eq!(chain.name, CHAIN_STEER);
    table(NftFamily::Ip, "kuport", sets, vec![chain])
}

#[test]
fn steering_lists_like_nft_reads_back_and_is_repaired() {
    if !root() {
        return;
    }
    let desired = desired();
    let (ours, theirs) = (Netns::new("steer", "ours"), Netns::new("steer", "theirs"));
    let r = apply_table(Some(&ours.path()), &desired).expect("apply");
    assert_eq!(r.mode, ApplyMode::Replaced);
    theirs.nft(&["-f", &format!("{}/tests/data/steer.nft", env!("CARGO_MANIFEST_DIR"))]);
    let want = list(&theirs);
    assert_eq!(list(&ours), want);
    assert_eq!(list(&ours), kuport_proto::text::nft_table(&desired), "the renderer prints what nft lists");

    let again = apply_table(Some(&ours.path()), &desired).expect("re-apply");
    assert_eq!((again.mode, again.writes, again.batches), (ApplyMode::Unchanged, 0, 0), "{:?}", again.diffs);
    let back = read_table(Some(&ours.path()), NftFamily::Ip, "kuport").expect("read").expect("exists");
    assert_eq!(back, normalize(&desired).expect("normalize"));
    let theirs_back = read_table(Some(&theirs.path()), NftFamily::Ip, "kuport").expect("read").expect("exists");
    assert_eq!(theirs_back, back, "nft's own expressions decompile to the same statement");

    // Drift: the range's rule deleted by hand comes back.
    let handles = ours.nft(&["-a", "list", "chain", "ip", "kuport", CHAIN_STEER]);
    let handle = handles
        .lines()
        .find(|l| l.contains("@steer_range"))
        .and_then(|l| l.rsplit("# handle ").next())
        .expect("the rule's handle")
        .trim()
        .to_string();
    ours.nft(&["delete", "rule", "ip", "kuport", CHAIN_STEER, "handle", &handle]);
    assert_ne!(list(&ours), want);
    let r = apply_table(Some(&ours.path()), &desired).expect("repair");
    assert!(r.writes > 0, "{:?}", r.diffs);
    assert_eq!(list(&ours), want);

    // Drift in an element: a stand-in changed by hand is put back.
    ours.nft(&["delete", "element", "ip", "kuport", "steer_port", "{ \"wt0\" . 100.64.93.143 . tcp . 3000 }"]);
    ours.nft(&[
        "add",
        "element",
        "ip",
        "kuport",
        "steer_port",
        "{ \"wt0\" . 100.64.93.143 . tcp . 3000 : 169.254.76.254 }",
    ]);
    let r = apply_table(Some(&ours.path()), &desired).expect("repair element");
    assert!(r.writes > 0, "{:?}", r.diffs);
    assert_eq!(list(&ours), want);
}
