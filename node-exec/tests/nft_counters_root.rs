//! The counter read (docs/operations/counters.md) against counters `nft` itself sets: a table
//! loaded by `nft -f tests/data/counters_inet.nft` with elements and rules whose counters start
//! at given values reads back exactly those, by element key and by rule position, leaving out
//! what is at 0. Fails when not run as root unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
#[path = "common/netns.rs"]
mod netns;
use host::root;
use netns::Netns;

use kuport_node_exec::nft::read_counters;
use kuport_proto::build::{addr, ifname, port, ports, proto};
use kuport_proto::v1::{ChainCounters, ElementCount, L4Proto, NftFamily, RuleCount, SetCounters};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/counters_inet.nft");

#[test]
fn counters_read_back_as_nft_set_them() {
    if !root() {
        return;
    }
    let ns = Netns::new("counters", "read");
    assert_eq!(read_counters(Some(&ns.path()), NftFamily::Inet, "kuport-count").expect("read"), None, "no table yet");
    ns.nft(&["-f", FILE]);
    let read = read_counters(Some(&ns.path()), NftFamily::Inet, "kuport-count").expect("read").expect("the table");
    let a: std::net::IpAddr = "203.0.113.9".parse().expect("address");
    let single =
        ElementCount { key: vec![ifname("eth0"), addr(a), proto(L4Proto::Tcp), port(3000)], packets: 5, bytes: 300 };
    let range = ElementCount {
        key: vec![ports(27015, 27115), ifname("eth0"), addr(a), proto(L4Proto::Udp)],
        packets: 9,
        bytes: 900,
    };
    assert_eq!(
        read.sets,
        vec![
            SetCounters { name: "steer_port".into(), elements: vec![single] },
            SetCounters { name: "steer_range".into(), elements: vec![range] },
        ],
        "port 3001's element is at 0 and left out"
    );
    assert_eq!(
        read.chains,
        vec![ChainCounters {
            name: "kup-limit-bb8".into(),
            rules: vec![RuleCount { index: 1, packets: 7, bytes: 70 }]
        }],
        "the second rule, by position; the first is at 0, the third has no counter"
    );
}
