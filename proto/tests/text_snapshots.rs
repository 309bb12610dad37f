//! Golden renderings. Each fixture's text is also checked against nft itself by
//! nft_roundtrip.rs, so these snapshots are the nft listings, kept for review and diffs.

mod common;

use common::*;
use kuport_proto::text::{ip_commands, nft_table, node_state};
use kuport_proto::v1::{
    Address, ChainPolicy, ChainType, CmpOp, Hook, IpRule, Link, Neighbour, NetnsState, NftChain, NftFamily, NftMatch,
    NftRule, NftStatement, NftValue, NodeState, Route, Selector, Sysctl, Vxlan, link,
};

#[test]
fn kuport() {
    insta::assert_snapshot!(nft_table(&kuport_table()));
}

#[test]
fn matches() {
    insta::assert_snapshot!(nft_table(&matches_table()));
}

#[test]
fn statements() {
    insta::assert_snapshot!(nft_table(&statements_table()));
}

#[test]
fn sets() {
    insta::assert_snapshot!(nft_table(&sets_table()));
}

#[test]
fn ip6() {
    insta::assert_snapshot!(nft_table(&ip6_table()));
}

#[test]
fn unstable() {
    insta::assert_snapshot!(nft_table(&unstable_table()));
}

#[test]
fn inet() {
    insta::assert_snapshot!(nft_table(&inet_table()));
}

#[test]
fn overlay_filter() {
    insta::assert_snapshot!(nft_table(&overlay_filter_table()));
}

#[test]
fn overlay_relay() {
    insta::assert_snapshot!(nft_table(&overlay_relay_table()));
}

fn host_netns() -> NetnsState {
    NetnsState {
        target: kuport_proto::netns::host(),
        sysctls: vec![Sysctl { key: "net.ipv4.ip_forward".into(), value: "1".into() }],
        nft_tables: vec![kuport_table()].into(),
        links: vec![Link {
            name: "kup-wt0".into(),
            mtu: 1450,
            kind: Some(link::Kind::Vxlan(Vxlan {
                vni: 7,
                local: "192.168.1.10".into(),
                remote: "192.168.1.11".into(),
                dstport: 4789,
                ttl: 64,
            })),
            mac: "02:6b:75:00:00:01".into(),
        }],
        addresses: vec![Address { dev: "kup-wt0".into(), cidr: "169.254.77.2/31".into() }],
        neighbours: vec![Neighbour {
            dev: "kup-wt0".into(),
            address: "169.254.77.3".into(),
            mac: "02:6b:75:00:00:02".into(),
        }],
        routes: vec![
            Route { table: 100, dst: "default".into(), via: "169.254.77.3".into(), dev: "kup-wt0".into() },
            Route { table: 254, dst: "100.64.0.0/10".into(), via: String::new(), dev: "kup-wt0".into() },
        ]
        .into(),
        ip_rules: vec![
            IpRule {
                pref: 101,
                fwmark: 0x6b70_0001,
                fwmask: 0xffff_ffff,
                to: "100.64.0.2/32".into(),
                table: 254,
                ipv6: false,
            },
            IpRule { pref: 102, fwmark: 0x6b70_0000, fwmask: 0xffff_0000, to: String::new(), table: 100, ipv6: false },
        ],
        ..NetnsState::default()
    }
}

#[test]
fn ip_commands_of_a_netns() {
    insta::assert_snapshot!(ip_commands(&host_netns()));
}

#[test]
fn whole_node_state() {
    let pod = NetnsState {
        target: kuport_proto::netns::path("/var/run/netns/cni-1234"),
        sysctls: vec![Sysctl { key: "net.ipv4.conf.all.rp_filter".into(), value: "0".into() }],
        nft_tables: vec![table(NftFamily::Ip, "nothing", vec![], vec![])].into(),
        ..NetnsState::default()
    };
    let state = NodeState { node: "node-a".into(), netns: vec![host_netns(), pod] };
    insta::assert_snapshot!(node_state(&state));
}

/// Nonsense in the model renders as visible markers, never a panic.
#[test]
fn invalid_model() {
    let bad_match = |sel: i32, op: i32, value: Option<NftValue>, mask: u32| NftMatch {
        kind: Some(kuport_proto::v1::nft_match::Kind::Compare(kuport_proto::v1::Compare {
            selector: sel,
            op,
            value,
            mask,
        })),
    };
    let rules = vec![
        NftRule::default(),
        rule(vec![NftMatch::default()], vec![NftStatement::default()]),
        rule(vec![bad_match(0, 0, Some(port(1)), 0)], vec![accept()]),
        rule(vec![bad_match(99, 7, None, 0)], vec![accept()]),
        rule(vec![eq(Selector::IpSaddr, ifname("eth0"))], vec![accept()]),
        rule(vec![eq(Selector::IpSaddr, addr("fd00::1"))], vec![accept()]),
        rule(vec![eq(Selector::Ip6Saddr, addr("not an address"))], vec![accept()]),
        rule(vec![eq(Selector::ThDport, ports(90, 80))], vec![accept()]),
        rule(
            vec![eq(Selector::L4proto, NftValue { value: Some(kuport_proto::v1::nft_value::Value::Proto(3)) })],
            vec![accept()],
        ),
        rule(vec![bad_match(Selector::MetaSkuid as i32, CmpOp::Eq as i32, Some(id(1)), 0xff)], vec![accept()]),
        rule(vec![eq(Selector::MetaMark, id(1))], vec![accept()]),
        rule(vec![lookup(&[], "nowhere")], vec![verdict(kuport_proto::v1::VerdictKind::Jump, "")]),
        rule(
            vec![],
            vec![nat_to_map(
                kuport_proto::v1::NatKind::Unspecified,
                NftFamily::Unspecified,
                &[Selector::Iifname],
                "nowhere",
            )],
        ),
        rule(vec![], vec![nat_to_addr(kuport_proto::v1::NatKind::Dnat, NftFamily::Ip, "", None)]),
        rule(vec![], vec![verdict(kuport_proto::v1::VerdictKind::Unspecified, "")]),
    ];
    let mut bad_chain = base_chain("bad", ChainType::Unspecified, Hook::Unspecified, 0, ChainPolicy::Accept, rules);
    if let Some(base) = bad_chain.base.as_mut() {
        base.policy = 9;
    }
    let bad_set = set(
        "bad_set",
        &[kuport_proto::v1::NftType::Unspecified, kuport_proto::v1::NftType::Ipv4Addr],
        &[kuport_proto::v1::NftType::Mark],
        false,
        false,
        vec![element(vec![port(1)], vec![mark(1), mark(2)]), element(vec![], vec![])],
    );
    let mut t = table(
        NftFamily::Unspecified,
        "bad",
        vec![bad_set, set("no_key", &[], &[], false, false, vec![])],
        vec![bad_chain, NftChain::default()],
    );
    t.family = 42;
    let ns = NetnsState {
        links: vec![Link { name: "x".into(), mtu: 0, kind: None, mac: String::new() }],
        ..NetnsState::default()
    };
    insta::assert_snapshot!(format!("{}{}", nft_table(&t), ip_commands(&ns)));
}
