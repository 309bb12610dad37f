//! Fixture tables shared by the snapshot and nft round-trip tests, built with
//! [`kuport_proto::build`]. The fixtures together cover the whole rule and set vocabulary of
//! kuport.v1, in forms nft 1.0.6 loads.
#![allow(dead_code)]

pub use kuport_proto::build::{
    accept, addr, base_chain, chain, compare, counter, ct_mark_set, drop, element, eq, goto, id, ifname, jump, lookup,
    map_lookup, mark, member, meta_mark_set, nat_to_addr, nat_to_map, nat_to_selector, ne, not_lookup, port,
    port_range, ports, proto, redirect_to_map, redirect_to_port, rule, table, verdict,
};
use kuport_proto::v1::{
    ChainPolicy, ChainType, CmpOp, Hook, L4Proto, NatKind, NftElement, NftFamily, NftMatch, NftSet, NftTable, NftType,
    Selector, VerdictKind, set_mark,
};

use L4Proto::{Tcp, Udp};
use NftType as T;
use Selector as S;

/// A set or map with its flags (the fixtures set each explicitly).
pub fn set(
    name: &str,
    key: &[NftType],
    data: &[NftType],
    interval: bool,
    counter: bool,
    elements: Vec<NftElement>,
) -> NftSet {
    NftSet { interval, counter, ..kuport_proto::build::set(name, key, data, elements) }
}

// ---- fixtures ----------------------------------------------------------------------------------

const IP: NftFamily = NftFamily::Ip;
const KEY4: [Selector; 4] = [S::Iifname, S::IpDaddr, S::L4proto, S::ThDport];
const PUBLISH_KEY: [Selector; 3] = [S::Iifname, S::L4proto, S::ThDport];

/// The shape of kuport's own table.
pub fn kuport_table() -> NftTable {
    let publish_port = set(
        "publish_port",
        &[T::Ifname, T::InetProto, T::InetService],
        &[T::Ipv4Addr, T::InetService],
        false,
        true,
        vec![
            element(vec![ifname("enp1s0"), proto(Udp), port(27015)], vec![addr("10.244.18.107"), port(27015)]),
            element(vec![ifname("enp1s0"), proto(Tcp), port(80)], vec![addr("10.244.1.2"), port(8080)]),
            element(vec![ifname("eth0"), proto(Tcp), port(443)], vec![addr("10.0.0.1"), port(443)]),
            element(vec![ifname("wt0"), proto(Udp), port(5353)], vec![addr("10.244.3.4"), port(53)]),
        ],
    );
    let publish_range = set(
        "publish_range",
        &[T::Ifname, T::InetProto, T::InetService],
        &[T::Ipv4Addr],
        true,
        true,
        vec![
            element(vec![ifname("enp1s0"), proto(Udp), ports(27015, 27115)], vec![addr("10.244.18.107")]),
            element(vec![ifname("enp1s0"), proto(Tcp), ports(30000, 30010)], vec![addr("10.244.1.1")]),
            element(vec![ifname("eth0"), proto(Tcp), port(8443)], vec![addr("10.244.1.9")]),
        ],
    );
    let link_range = set(
        "link_range",
        &[T::Ifname, T::Ipv4Addr, T::InetProto, T::InetService],
        &[T::Ipv4Addr],
        true,
        true,
        vec![element(
            vec![ifname("wt0"), addr("100.64.0.2"), proto(Udp), ports(27015, 27115)],
            vec![addr("10.244.18.107")],
        )],
    );
    let link_port = set(
        "link_port",
        &[T::Ifname, T::Ipv4Addr, T::InetProto, T::InetService],
        &[T::Ipv4Addr, T::InetService],
        false,
        true,
        vec![
            element(
                vec![ifname("wt0"), addr("100.64.0.2"), proto(Tcp), port(80)],
                vec![addr("10.244.1.2"), port(8080)],
            ),
            element(
                vec![ifname("wt0"), addr("100.64.0.3"), proto(Tcp), port(80)],
                vec![addr("10.244.1.3"), port(8080)],
            ),
        ],
    );
    let claim = set(
        "claim",
        &[T::Ifname, T::Ipv4Addr, T::InetProto, T::InetService],
        &[],
        true,
        true,
        vec![
            member(vec![ifname("enp1s0"), addr("192.168.1.10"), proto(Udp), ports(27015, 27115)]),
            member(vec![ifname("enp1s0"), addr("192.168.1.10"), proto(Tcp), port(80)]),
            member(vec![ifname("wt0"), addr("100.64.0.0/10"), proto(Tcp), ports(1, 65535)]),
        ],
    );
    let reply_claim = set(
        "reply_claim",
        &[T::Ipv4Addr, T::InetProto, T::InetService],
        &[],
        false,
        false,
        vec![
            member(vec![addr("10.244.18.107"), proto(Udp), port(27015)]),
            member(vec![addr("10.244.1.2"), proto(Tcp), port(8080)]),
            member(vec![addr("10.244.1.2"), proto(Tcp), port(8081)]),
        ],
    );
    let return_mark = set(
        "return_mark",
        &[T::Ipv4Addr, T::InetProto, T::InetService],
        &[T::Mark],
        true,
        true,
        vec![
            element(vec![addr("10.244.18.107"), proto(Udp), ports(27015, 27115)], vec![mark(0x6b70_0001)]),
            element(vec![addr("10.244.1.2"), proto(Tcp), port(8080)], vec![mark(0x6b70_0002)]),
        ],
    );
    let ct_mark = set(
        "ct_mark",
        &[T::Ifname],
        &[T::Mark],
        false,
        false,
        vec![
            element(vec![ifname("enp1s0")], vec![mark(0x6b70_0001)]),
            element(vec![ifname("wt0")], vec![mark(0x6b70_0002)]),
        ],
    );
    let pre = base_chain(
        "kup-pre",
        ChainType::Nat,
        Hook::Prerouting,
        -110,
        ChainPolicy::Accept,
        vec![
            rule(vec![], vec![nat_to_map(NatKind::Dnat, IP, &PUBLISH_KEY, "publish_port")]),
            rule(vec![], vec![nat_to_map(NatKind::Dnat, IP, &PUBLISH_KEY, "publish_range")]),
            rule(vec![], vec![nat_to_map(NatKind::Dnat, IP, &KEY4, "link_port")]),
            rule(vec![], vec![nat_to_map(NatKind::Dnat, IP, &KEY4, "link_range")]),
        ],
    );
    let post = base_chain(
        "kup-post",
        ChainType::Nat,
        Hook::Postrouting,
        90,
        ChainPolicy::Accept,
        vec![
            rule(
                vec![compare(S::CtMark, CmpOp::Eq, mark(0x6b70_0000), 0xffff_0000)],
                vec![counter(), nat_to_selector(NatKind::Snat, IP, S::IpSaddr)],
            ),
            rule(vec![lookup(&[S::IpSaddr, S::L4proto, S::ThSport], "reply_claim")], vec![counter(), accept()]),
        ],
    );
    let mangle = base_chain(
        "kup-mangle",
        ChainType::Filter,
        Hook::Prerouting,
        -140,
        ChainPolicy::Accept,
        vec![
            rule(
                vec![lookup(&KEY4, "claim")],
                vec![ct_mark_set(set_mark::From::Map(map_lookup(&[S::Iifname], "ct_mark")))],
            ),
            rule(
                vec![compare(S::CtMark, CmpOp::Eq, mark(0x6b70_0000), 0xffff_0000)],
                vec![meta_mark_set(set_mark::From::Selector(S::CtMark as i32))],
            ),
            rule(
                vec![],
                vec![meta_mark_set(set_mark::From::Map(map_lookup(
                    &[S::IpSaddr, S::L4proto, S::ThSport],
                    "return_mark",
                )))],
            ),
        ],
    );
    table(
        IP,
        "kuport",
        vec![publish_port, publish_range, link_range, link_port, claim, reply_claim, return_mark, ct_mark],
        vec![pre, post, mangle],
    )
}

/// Every match: interfaces, protocols, addresses, ports, marks, ids, lookups, verdicts, and the
/// normalisations nft applies to them (dependency kill, port merge, prefix and mask forms).
pub fn matches_table() -> NftTable {
    let a = |ms: Vec<NftMatch>| rule(ms, vec![accept()]);
    let ports3 = set("ports3", &[T::Ipv4Addr, T::InetProto, T::InetService], &[], false, false, vec![]);
    let pp = set("pp", &[T::InetProto, T::InetService], &[], false, false, vec![]);
    let marks = set("marks", &[T::Mark], &[], false, false, vec![member(vec![mark(1)])]);
    let protos = set("protos", &[T::InetProto], &[], false, false, vec![member(vec![proto(Tcp)])]);
    let c = chain(
        "matches",
        vec![
            a(vec![eq(S::Iifname, ifname("eth0"))]),
            a(vec![ne(S::Iifname, ifname("eth0"))]),
            a(vec![eq(S::Iifname, ifname("cilium_*"))]),
            a(vec![ne(S::Oifname, ifname("lxc*"))]),
            a(vec![eq(S::Oifname, ifname("wt0"))]),
            a(vec![eq(S::L4proto, proto(Tcp))]),
            a(vec![ne(S::L4proto, proto(Udp))]),
            a(vec![eq(S::IpSaddr, addr("10.0.0.1"))]),
            a(vec![ne(S::IpSaddr, addr("10.0.0.0/8"))]),
            a(vec![eq(S::IpDaddr, addr("10.1.2.3/16"))]),
            a(vec![eq(S::IpDaddr, addr("10.1.2.3/32"))]),
            a(vec![eq(S::TcpSport, port(80))]),
            a(vec![eq(S::TcpDport, ports(80, 90))]),
            a(vec![ne(S::TcpDport, port(80))]),
            a(vec![eq(S::UdpSport, port(53))]),
            a(vec![ne(S::UdpDport, ports(1000, 2000))]),
            a(vec![eq(S::ThSport, port(1))]),
            a(vec![eq(S::ThDport, ports(2, 3))]),
            a(vec![ne(S::ThDport, port(4))]),
            // The explicit protocol match is the th selector's dependency and disappears.
            a(vec![eq(S::L4proto, proto(Tcp)), eq(S::ThDport, port(80))]),
            a(vec![eq(S::L4proto, proto(Udp)), eq(S::IpDaddr, addr("1.2.3.4")), ne(S::ThDport, port(53))]),
            a(vec![eq(S::L4proto, proto(Tcp)), eq(S::TcpDport, port(80))]),
            a(vec![ne(S::L4proto, proto(Tcp)), eq(S::ThDport, port(80))]),
            a(vec![eq(S::ThDport, port(80)), eq(S::L4proto, proto(Tcp))]),
            // Port merges.
            a(vec![eq(S::ThDport, port(80)), eq(S::ThSport, port(1))]),
            a(vec![eq(S::L4proto, proto(Udp)), eq(S::ThDport, port(80)), eq(S::ThSport, port(1))]),
            a(vec![eq(S::TcpDport, port(80)), eq(S::ThSport, port(1))]),
            a(vec![eq(S::ThSport, port(1)), eq(S::TcpDport, port(80))]),
            a(vec![eq(S::UdpSport, port(1)), eq(S::IpDaddr, addr("1.2.3.4")), eq(S::ThDport, port(2))]),
            a(vec![eq(S::IpDaddr, addr("1.1.1.1")), eq(S::IpSaddr, addr("2.2.2.2"))]),
            // Marks and ids.
            a(vec![eq(S::MetaMark, mark(1))]),
            a(vec![ne(S::MetaMark, mark(0x6b70_0001))]),
            a(vec![compare(S::MetaMark, CmpOp::Eq, mark(0x6b70_0000), 0xffff_0000)]),
            a(vec![compare(S::CtMark, CmpOp::Neq, mark(0x6b70_0000), 0xffff_0000)]),
            a(vec![compare(S::CtMark, CmpOp::Eq, mark(0x6b00_0000), 0xff00_ff00)]),
            a(vec![compare(S::CtMark, CmpOp::Neq, mark(0x6b00_0000), 0xff00_ff00)]),
            a(vec![compare(S::MetaMark, CmpOp::Eq, mark(1), 0xffff_ffff)]),
            a(vec![compare(S::MetaMark, CmpOp::Eq, mark(0x8000_0000), 0x8000_0000)]),
            a(vec![eq(S::CtMark, mark(0))]),
            a(vec![eq(S::MetaSkuid, id(1000))]),
            a(vec![ne(S::MetaSkuid, id(0))]),
            a(vec![eq(S::MetaSkgid, id(100))]),
            // Lookups.
            a(vec![lookup(&[S::MetaMark], "marks")]),
            a(vec![not_lookup(&[S::L4proto], "protos")]),
            a(vec![lookup(&[S::IpDaddr, S::L4proto, S::ThDport], "ports3")]),
            a(vec![not_lookup(&[S::IpSaddr, S::L4proto, S::TcpDport], "ports3")]),
            a(vec![eq(S::L4proto, proto(Tcp)), lookup(&[S::IpDaddr, S::L4proto, S::ThDport], "ports3")]),
            a(vec![eq(S::L4proto, proto(Udp)), lookup(&[S::L4proto, S::ThDport], "pp")]),
            // Verdicts and regular chains.
            rule(vec![eq(S::Iifname, ifname("eth1"))], vec![counter()]),
            rule(vec![], vec![counter(), accept()]),
            rule(vec![eq(S::Iifname, ifname("eth2"))], vec![jump("sub")]),
            rule(vec![eq(S::Iifname, ifname("eth3"))], vec![goto("sub")]),
            rule(vec![], vec![counter(), drop()]),
        ],
    );
    let sub = chain(
        "sub",
        vec![
            rule(vec![eq(S::Oifname, ifname("eth0"))], vec![verdict(VerdictKind::Return, "")]),
            rule(vec![], vec![drop()]),
        ],
    );
    let empty = chain("empty", vec![]);
    let input = base_chain(
        "input",
        ChainType::Filter,
        Hook::Input,
        0,
        ChainPolicy::Drop,
        vec![rule(vec![], vec![jump("matches")])],
    );
    table(IP, "vocab_matches", vec![ports3, pp, marks, protos], vec![c, sub, empty, input])
}

/// Every nat, redirect and mark statement, and chain priorities near and far from the named
/// ones.
pub fn statements_table() -> NftTable {
    use NatKind::{Dnat, Snat};
    let tcp = || eq(S::L4proto, proto(Tcp));
    let by_port = set(
        "by_port",
        &[T::InetService],
        &[T::Ipv4Addr],
        false,
        false,
        vec![element(vec![port(80)], vec![addr("10.0.0.1")])],
    );
    let by_key =
        set("by_key", &[T::Ifname, T::InetProto, T::InetService], &[T::Ipv4Addr, T::InetService], false, false, vec![]);
    let redir = set(
        "redir",
        &[T::InetProto, T::InetService],
        &[T::InetService],
        false,
        false,
        vec![element(vec![proto(Tcp), port(80)], vec![port(8080)])],
    );
    let mark_by_if = set(
        "mark_by_if",
        &[T::Ifname, T::Ipv4Addr],
        &[T::Mark],
        false,
        false,
        vec![
            element(vec![ifname("eth0"), addr("10.0.0.1")], vec![mark(1)]),
            element(vec![ifname("eth0"), addr("10.0.0.2")], vec![mark(2)]),
            element(vec![ifname("wt0"), addr("10.0.0.1")], vec![mark(3)]),
        ],
    );
    let mark_by_port = set("mark_by_port", &[T::InetService], &[T::Mark], false, false, vec![]);
    let pre = base_chain(
        "pre",
        ChainType::Nat,
        Hook::Prerouting,
        -100,
        ChainPolicy::Accept,
        vec![
            rule(vec![], vec![nat_to_addr(Dnat, IP, "10.0.0.1", None)]),
            rule(vec![tcp()], vec![nat_to_addr(Dnat, IP, "10.0.0.1", Some(port_range(80, 80)))]),
            rule(vec![tcp()], vec![nat_to_addr(Dnat, IP, "10.0.0.1", Some(port_range(80, 90)))]),
            rule(vec![tcp()], vec![nat_to_addr(Dnat, IP, "", Some(port_range(80, 80)))]),
            rule(vec![eq(S::UdpDport, port(53))], vec![nat_to_addr(Dnat, IP, "", Some(port_range(5300, 5310)))]),
            rule(vec![], vec![nat_to_selector(Dnat, IP, S::IpDaddr)]),
            rule(vec![], vec![nat_to_map(Dnat, IP, &[S::ThDport], "by_port")]),
            rule(vec![tcp()], vec![nat_to_map(Dnat, IP, &[S::ThDport], "by_port")]),
            rule(vec![], vec![nat_to_map(Dnat, IP, &[S::TcpDport], "by_port")]),
            rule(vec![tcp()], vec![counter(), nat_to_map(Dnat, IP, &[S::ThDport], "by_port")]),
            rule(vec![], vec![nat_to_map(Dnat, IP, &[S::Iifname, S::L4proto, S::ThDport], "by_key")]),
            rule(vec![tcp()], vec![redirect_to_port(8080, 8080)]),
            rule(vec![eq(S::TcpDport, port(80))], vec![redirect_to_port(8080, 8090)]),
            rule(vec![tcp()], vec![redirect_to_map(&[S::L4proto, S::ThDport], "redir")]),
        ],
    );
    let post = base_chain(
        "post",
        ChainType::Nat,
        Hook::Postrouting,
        110,
        ChainPolicy::Accept,
        vec![
            rule(vec![], vec![nat_to_addr(Snat, IP, "10.0.0.1", None)]),
            rule(vec![tcp()], vec![nat_to_addr(Snat, IP, "10.0.0.1", Some(port_range(1000, 2000)))]),
            rule(vec![], vec![nat_to_selector(Snat, IP, S::IpSaddr)]),
        ],
    );
    let marks = base_chain(
        "marks",
        ChainType::Filter,
        Hook::Forward,
        -5,
        ChainPolicy::Drop,
        vec![
            rule(vec![], vec![meta_mark_set(set_mark::From::Value(1))]),
            rule(vec![], vec![meta_mark_set(set_mark::From::Value(0x6b70_0001))]),
            rule(vec![], vec![meta_mark_set(set_mark::From::Selector(S::CtMark as i32))]),
            rule(vec![], vec![meta_mark_set(set_mark::From::Map(map_lookup(&[S::Iifname, S::IpSaddr], "mark_by_if")))]),
            rule(vec![], vec![ct_mark_set(set_mark::From::Value(0x6b70_0000))]),
            rule(vec![], vec![ct_mark_set(set_mark::From::Selector(S::MetaMark as i32))]),
            rule(vec![], vec![ct_mark_set(set_mark::From::Map(map_lookup(&[S::Iifname, S::IpSaddr], "mark_by_if")))]),
            rule(
                vec![eq(S::L4proto, proto(Udp))],
                vec![ct_mark_set(set_mark::From::Map(map_lookup(&[S::ThDport], "mark_by_port")))],
            ),
            rule(vec![], vec![meta_mark_set(set_mark::From::Map(map_lookup(&[S::UdpDport], "mark_by_port")))]),
        ],
    );
    let prio =
        |name: &str, ty: ChainType, hook: Hook, p: i32| base_chain(name, ty, hook, p, ChainPolicy::Accept, vec![]);
    table(
        IP,
        "vocab_statements",
        vec![by_port, by_key, redir, mark_by_if, mark_by_port],
        vec![
            pre,
            post,
            marks,
            prio("prio_raw", ChainType::Filter, Hook::Prerouting, -300),
            prio("prio_mangle", ChainType::Route, Hook::Output, -150),
            prio("prio_security", ChainType::Filter, Hook::Input, 60),
            prio("prio_17", ChainType::Filter, Hook::Output, 17),
            prio("prio_far", ChainType::Filter, Hook::Prerouting, -200),
            prio("nat_output", ChainType::Nat, Hook::Output, -101),
            prio("nat_input", ChainType::Nat, Hook::Input, 100),
        ],
    )
}

/// Element order and line wrapping for every key type, interval or not.
pub fn sets_table() -> NftTable {
    let addrs4: Vec<_> =
        [9, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12].iter().map(|i| member(vec![addr(format!("10.0.0.{i}"))])).collect();
    let services: Vec<_> = (1..=12).rev().map(|p| member(vec![port(p * 100)])).collect();
    let marks: Vec<_> = [7, 0x6b70_0001, 1, 2, 3, 0x100, 5].iter().map(|m| member(vec![mark(*m)])).collect();
    let ifnames: Vec<_> = ["eth0", "wt0", "enp1s0", "a", "lo"].iter().map(|n| member(vec![ifname(n)])).collect();
    let ifnames_i = ifnames.clone();
    table(
        IP,
        "vocab_sets",
        vec![
            set("a4", &[T::Ipv4Addr], &[], false, false, addrs4),
            set(
                "a4i",
                &[T::Ipv4Addr],
                &[],
                true,
                true,
                vec![
                    member(vec![addr("192.168.0.0/24")]),
                    member(vec![addr("10.0.0.9")]),
                    member(vec![addr("10.1.2.3/16")]),
                    member(vec![addr("10.0.0.1/32")]),
                    member(vec![addr("10.3.0.0/31")]),
                ],
            ),
            set("svc", &[T::InetService], &[], false, false, services),
            set(
                "svci",
                &[T::InetService],
                &[],
                true,
                false,
                vec![
                    member(vec![port(8080)]),
                    member(vec![ports(1024, 2047)]),
                    member(vec![ports(0, 79)]),
                    member(vec![port(81)]),
                    member(vec![ports(27015, 27115)]),
                    member(vec![ports(3000, 3001)]),
                ],
            ),
            set("marks", &[T::Mark], &[], false, true, marks),
            set("protos", &[T::InetProto], &[], false, false, vec![member(vec![proto(Udp)]), member(vec![proto(Tcp)])]),
            set("ifs", &[T::Ifname], &[], false, false, ifnames),
            set("ifsi", &[T::Ifname], &[], true, false, ifnames_i),
            set(
                "by_addr",
                &[T::Ipv4Addr],
                &[T::Mark],
                true,
                true,
                vec![
                    element(vec![addr("192.168.0.0/16")], vec![mark(0x6b70_0000)]),
                    element(vec![addr("10.0.0.0/8")], vec![mark(1)]),
                    element(vec![addr("9.0.0.1")], vec![mark(2)]),
                ],
            ),
            set("mark_map", &[T::Mark], &[T::Mark], false, false, vec![element(vec![mark(1)], vec![mark(2)])]),
            set(
                "port_map",
                &[T::InetService],
                &[T::Ipv4Addr],
                false,
                false,
                vec![element(vec![port(443)], vec![addr("10.0.0.2")]), element(vec![port(80)], vec![addr("10.0.0.1")])],
            ),
            set(
                "triples",
                &[T::Ipv4Addr, T::InetProto, T::InetService],
                &[],
                false,
                false,
                vec![
                    member(vec![addr("10.0.0.2"), proto(Tcp), port(80)]),
                    member(vec![addr("10.0.0.1"), proto(Tcp), port(80)]),
                    member(vec![addr("10.0.0.1"), proto(Udp), port(80)]),
                    member(vec![addr("10.0.0.1"), proto(Tcp), port(81)]),
                    member(vec![addr("9.0.0.1"), proto(Tcp), port(256)]),
                    member(vec![addr("10.0.0.1"), proto(Tcp), port(1)]),
                ],
            ),
            set(
                "ranges",
                &[T::Ipv4Addr, T::InetService],
                &[],
                true,
                false,
                vec![
                    member(vec![addr("10.0.0.0/24"), ports(1024, 2047)]),
                    member(vec![addr("10.0.0.1"), ports(0, 65535)]),
                    member(vec![addr("10.9.0.0/16"), port(5)]),
                    member(vec![addr("10.0.0.7/8"), port(6)]),
                ],
            ),
            set(
                "if_marks",
                &[T::Ifname, T::Mark],
                &[],
                false,
                true,
                vec![
                    member(vec![ifname("eth0"), mark(2)]),
                    member(vec![ifname("eth0"), mark(0x100)]),
                    member(vec![ifname("eth1"), mark(1)]),
                ],
            ),
            set("empty", &[T::Ipv4Addr], &[], false, false, vec![]),
            set("empty_counted", &[T::Ipv4Addr, T::InetService], &[T::Mark], true, true, vec![]),
        ],
        vec![],
    )
}

/// IPv6: addresses, prefixes, sets and nat.
pub fn ip6_table() -> NftTable {
    use NatKind::{Dnat, Snat};
    const IP6: NftFamily = NftFamily::Ip6;
    table(
        IP6,
        "six",
        vec![
            set(
                "a6",
                &[T::Ipv6Addr],
                &[],
                false,
                false,
                vec![
                    member(vec![addr("fd00::3")]),
                    member(vec![addr("fd00::1")]),
                    member(vec![addr("::1")]),
                    member(vec![addr("fd00::2")]),
                ],
            ),
            set(
                "a6i",
                &[T::Ipv6Addr],
                &[],
                true,
                false,
                vec![
                    member(vec![addr("fd00::1/64")]),
                    member(vec![addr("::ffff:1.2.3.4")]),
                    member(vec![addr("fd01::5/128")]),
                ],
            ),
            set(
                "pub6",
                &[T::Ifname, T::InetProto, T::InetService],
                &[T::Ipv6Addr, T::InetService],
                false,
                true,
                vec![element(vec![ifname("eth0"), proto(Tcp), port(80)], vec![addr("fd00::10"), port(8080)])],
            ),
            set("by_if6", &[T::Ifname], &[T::Ipv6Addr], false, false, vec![]),
            set(
                "claim6",
                &[T::Ipv6Addr, T::InetProto, T::InetService],
                &[],
                true,
                false,
                vec![member(vec![addr("fd00::/64"), proto(Udp), ports(27015, 27115)])],
            ),
        ],
        vec![
            base_chain(
                "pre",
                ChainType::Nat,
                Hook::Prerouting,
                -90,
                ChainPolicy::Accept,
                vec![
                    rule(vec![eq(S::Ip6Saddr, addr("fd00::1/64"))], vec![nat_to_addr(Dnat, IP6, "fd00::1", None)]),
                    rule(
                        vec![eq(S::Ip6Daddr, addr("fd00::5/128")), eq(S::L4proto, proto(Tcp))],
                        vec![nat_to_addr(Dnat, IP6, "fd00::1", Some(port_range(80, 90)))],
                    ),
                    rule(vec![], vec![nat_to_map(Dnat, IP6, &[S::Iifname, S::L4proto, S::ThDport], "pub6")]),
                    rule(vec![], vec![nat_to_map(Dnat, IP6, &[S::Iifname], "by_if6")]),
                    rule(vec![ne(S::Ip6Daddr, addr("::ffff:1.2.3.4"))], vec![nat_to_selector(Dnat, IP6, S::Ip6Daddr)]),
                    rule(vec![lookup(&[S::Ip6Daddr, S::L4proto, S::ThDport], "claim6")], vec![accept()]),
                ],
            ),
            base_chain(
                "post",
                ChainType::Nat,
                Hook::Postrouting,
                100,
                ChainPolicy::Accept,
                vec![rule(vec![eq(S::Ip6Saddr, addr("fd00::1"))], vec![nat_to_selector(Snat, IP6, S::Ip6Saddr)])],
            ),
        ],
    )
}

/// The inet family: both address families in one table, and nat with its family printed.
pub fn inet_table() -> NftTable {
    use NatKind::{Dnat, Snat};
    const IP6: NftFamily = NftFamily::Ip6;
    table(
        NftFamily::Inet,
        "both",
        vec![
            set("a4", &[T::Ifname], &[T::Ipv4Addr], false, false, vec![]),
            set(
                "pub4",
                &[T::Ifname, T::InetProto, T::InetService],
                &[T::Ipv4Addr, T::InetService],
                false,
                false,
                vec![],
            ),
            set("s6", &[T::Ipv6Addr, T::InetProto, T::InetService], &[], false, false, vec![]),
        ],
        vec![
            base_chain(
                "filter",
                ChainType::Filter,
                Hook::Forward,
                0,
                ChainPolicy::Accept,
                vec![
                    rule(vec![eq(S::IpSaddr, addr("1.1.1.1")), eq(S::IpDaddr, addr("2.2.2.2"))], vec![accept()]),
                    rule(vec![eq(S::Ip6Saddr, addr("fd00::1")), eq(S::Ip6Daddr, addr("fd00::/64"))], vec![accept()]),
                    rule(vec![eq(S::L4proto, proto(Tcp)), eq(S::ThDport, port(80))], vec![accept()]),
                    rule(
                        vec![eq(S::L4proto, proto(Tcp)), lookup(&[S::Ip6Daddr, S::L4proto, S::ThDport], "s6")],
                        vec![accept()],
                    ),
                    rule(vec![eq(S::Iifname, ifname("x")), eq(S::IpSaddr, addr("1.1.1.1"))], vec![drop()]),
                ],
            ),
            base_chain(
                "pre",
                ChainType::Nat,
                Hook::Prerouting,
                -100,
                ChainPolicy::Accept,
                vec![
                    rule(vec![], vec![nat_to_addr(Dnat, IP, "10.0.0.1", None)]),
                    rule(vec![], vec![nat_to_addr(Dnat, IP6, "fd00::1", None)]),
                    rule(
                        vec![eq(S::L4proto, proto(Tcp))],
                        vec![nat_to_addr(Dnat, IP, "10.0.0.1", Some(port_range(80, 80)))],
                    ),
                    rule(
                        vec![eq(S::L4proto, proto(Tcp))],
                        vec![nat_to_addr(Dnat, IP6, "fd00::1", Some(port_range(80, 90)))],
                    ),
                    rule(vec![eq(S::L4proto, proto(Tcp))], vec![nat_to_addr(Dnat, IP, "", Some(port_range(80, 80)))]),
                    rule(vec![], vec![nat_to_map(Dnat, IP, &[S::Iifname, S::L4proto, S::ThDport], "pub4")]),
                    rule(vec![], vec![nat_to_map(Dnat, IP, &[S::Iifname], "a4")]),
                    rule(vec![], vec![nat_to_selector(Dnat, IP, S::IpDaddr)]),
                ],
            ),
            base_chain(
                "post",
                ChainType::Nat,
                Hook::Postrouting,
                100,
                ChainPolicy::Accept,
                vec![
                    rule(vec![], vec![nat_to_selector(Snat, IP, S::IpSaddr)]),
                    rule(vec![], vec![nat_to_selector(Snat, IP6, S::Ip6Saddr)]),
                ],
            ),
        ],
    )
}

/// The overlay's forward chain (docs/overlay/filter.md) and the other forms of `tcp flags`:
/// each value and mask lists in one of nft's four spellings; `tcp flags` consumes an explicit
/// `meta l4proto tcp`, the MSS clamp does not.
pub fn overlay_filter_table() -> NftTable {
    use kuport_proto::build::{tcp_flag::*, tcp_flags, tcp_mss_clamp};
    let wg = || ifname("kup-wg");
    let m = |ms: Vec<NftMatch>| rule(ms, vec![accept()]);
    table(
        NftFamily::Inet,
        "kuport-overlay",
        vec![],
        vec![base_chain(
            "forward",
            ChainType::Filter,
            Hook::Forward,
            0,
            ChainPolicy::Accept,
            vec![
                rule(vec![eq(S::Oifname, wg()), tcp_flags(SYN, SYN | RST)], vec![tcp_mss_clamp()]),
                rule(vec![eq(S::Iifname, wg()), eq(S::Oifname, wg())], vec![counter(), drop()]),
                m(vec![tcp_flags(0, SYN | RST)]),
                m(vec![tcp_flags(SYN, 0xff)]),
                m(vec![tcp_flags(SYN | ACK, 0xff)]),
                m(vec![tcp_flags(0, 0xff)]),
                m(vec![tcp_flags(SYN, SYN)]),
                m(vec![eq(S::L4proto, proto(Tcp)), tcp_flags(SYN | ACK, SYN | ACK)]),
                m(vec![tcp_flags(SYN, 0x7f), eq(S::TcpDport, port(80))]),
                m(vec![tcp_flags(FIN | PSH | URG | ECN | CWR, 0xfd)]),
                rule(vec![], vec![tcp_mss_clamp()]),
                rule(vec![eq(S::L4proto, proto(Tcp))], vec![tcp_mss_clamp()]),
                rule(vec![eq(S::TcpDport, port(443))], vec![counter(), tcp_mss_clamp(), accept()]),
            ],
        )],
    )
}

/// A relay's forward chain (docs/overlay/filter.md): the accept between peers of the relay's
/// prefixes, for each family, between the MSS clamp and the drop; then the other address shapes
/// of an inet table. nft gives each an implicit `meta nfproto` and never lists it.
pub fn overlay_relay_table() -> NftTable {
    use kuport_proto::build::{in_literal, tcp_flag::*, tcp_flags, tcp_mss_clamp};
    let wg = || ifname("kup-wg");
    let on_wg = || vec![eq(S::Iifname, wg()), eq(S::Oifname, wg())];
    let relay = |saddr: Selector, daddr: Selector, set: &str| {
        let mut m = on_wg();
        m.extend([lookup(&[saddr], set), lookup(&[daddr], set)]);
        rule(m, vec![counter(), accept()])
    };
    let a = |ms: Vec<NftMatch>| rule(ms, vec![accept()]);
    let prefixes = |ps: &[&str]| ps.iter().map(|p| member(vec![addr(p)])).collect::<Vec<_>>();
    table(
        NftFamily::Inet,
        "kuport-overlay",
        vec![
            set(
                "relay_v4",
                &[T::Ipv4Addr],
                &[],
                true,
                false,
                prefixes(&["10.42.2.0/24", "10.42.1.0/24", "10.42.3.0/24"]),
            ),
            set("relay_v6", &[T::Ipv6Addr], &[], true, false, prefixes(&["fd00:42:1::/64", "fd00:42:2::/64"])),
            set("svc4", &[T::Ipv4Addr, T::InetService], &[], false, false, vec![]),
            set("svc6", &[T::InetService, T::Ipv6Addr], &[], false, false, vec![]),
        ],
        vec![
            base_chain(
                "forward",
                ChainType::Filter,
                Hook::Forward,
                0,
                ChainPolicy::Accept,
                vec![
                    rule(vec![eq(S::Oifname, wg()), tcp_flags(SYN, SYN | RST)], vec![tcp_mss_clamp()]),
                    relay(S::IpSaddr, S::IpDaddr, "relay_v4"),
                    relay(S::Ip6Saddr, S::Ip6Daddr, "relay_v6"),
                    rule(on_wg(), vec![counter(), drop()]),
                ],
            ),
            chain(
                "selectors",
                vec![
                    a(vec![eq(S::IpSaddr, addr("10.42.0.0/16"))]),
                    a(vec![eq(S::Ip6Daddr, addr("fd00::/64"))]),
                    rule(vec![eq(S::IpSaddr, addr("10.42.0.1")), ne(S::IpDaddr, addr("10.42.1.0/25"))], vec![drop()]),
                    a(vec![ne(S::IpSaddr, addr("10.0.0.0/8"))]),
                    a(vec![eq(S::Ip6Saddr, addr("fd00::/60")), eq(S::Ip6Daddr, addr("fd00::1"))]),
                    a(vec![eq(S::TcpDport, port(80)), eq(S::Ip6Saddr, addr("fd00::1"))]),
                    a(vec![eq(S::L4proto, proto(Tcp)), eq(S::IpSaddr, addr("1.2.3.4")), eq(S::ThDport, port(80))]),
                    a(vec![lookup(&[S::IpDaddr, S::TcpDport], "svc4")]),
                    a(vec![lookup(&[S::TcpDport, S::Ip6Daddr], "svc6")]),
                    a(vec![eq(S::Iifname, wg()), in_literal(S::Ip6Saddr, vec![addr("fd00::2"), addr("fd00::1")])]),
                    a(vec![not_lookup(&[S::IpSaddr], "relay_v4")]),
                ],
            ),
        ],
    )
}

/// Models whose listing nft would not list the same way again, so no round trip can hold:
/// only the second of two `meta l4proto tcp` matches is consumed as the dependency, but the
/// listed `meta l4proto tcp tcp dport 80` loads as one match whose dependency is consumed.
pub fn unstable_table() -> NftTable {
    let a = |ms: Vec<NftMatch>| rule(ms, vec![accept()]);
    table(
        IP,
        "unstable",
        vec![],
        vec![chain(
            "c",
            vec![a(vec![eq(S::L4proto, proto(Tcp)), eq(S::L4proto, proto(Tcp)), eq(S::ThDport, port(80))])],
        )],
    )
}

/// Every fixture that nft must load and list back exactly as rendered.
pub fn loadable_tables() -> Vec<NftTable> {
    vec![
        kuport_table(),
        matches_table(),
        statements_table(),
        sets_table(),
        ip6_table(),
        inet_table(),
        overlay_filter_table(),
        overlay_relay_table(),
        table(IP, "nothing", vec![], vec![]),
    ]
}
