// tests/data/kuport_inet.nft as the model: the port-map table served to both families from one
// `table inet kuport` (docs/portmap/firewall.md and datapath.md; IPv6 twins end in 6), with the
// steering chain's `ip daddr set` and `ip6 daddr set`. Included by src/netfilter/nft/tests.rs
// and tests/nft_inet_root.rs.

/// tests/data/kuport_inet.nft as the model, in the file's order (the canonical order: sets and
/// chains by name).
#[allow(dead_code)]
fn kuport_inet_table() -> kuport_proto::v1::NftTable {
    use kuport_proto::build::{
        addr, base_chain, ct_mark_set, element, eq, ifname, ip_daddr_set_map, lookup, map_lookup, mark, member,
        meta_mark_set, nat_to_map, nat_to_selector, ne, port, ports, proto, rule, set, table,
    };
    use kuport_proto::v1::{
        AddressSet, ChainPolicy, ChainType, CmpOp, Hook, L4Proto::*, NatKind, NftFamily, NftSet, NftStatement,
        NftType::*, Selector as S, nft_statement, set_mark,
    };
    let counted = |s: NftSet| NftSet { counter: true, ..s };
    let interval = |s: NftSet| NftSet { interval: true, counter: true, ..s };
    let ip6_daddr_set_map = |key: &[S], map: &str| NftStatement {
        kind: Some(nft_statement::Kind::AddressSet(AddressSet {
            selector: S::Ip6Daddr as i32,
            map: Some(map_lookup(key, map)),
        })),
    };
    let (pod, pod6) = ("10.244.18.7", "fd00:10:244:18::7");
    let (game, game6) = ("10.244.18.107", "fd00:10:244:18::107");
    let sets = vec![
        interval(set(
            "claim",
            &[Ifname, Ipv4Addr, InetProto, InetService],
            &[],
            vec![member(vec![ifname("cilium_host"), addr(pod), proto(Tcp), port(3000)])],
        )),
        interval(set(
            "claim6",
            &[Ifname, Ipv6Addr, InetProto, InetService],
            &[],
            vec![member(vec![ifname("cilium_host"), addr(pod6), proto(Tcp), port(3000)])],
        )),
        set("ct_mark", &[Ifname], &[Mark], vec![element(vec![ifname("kup-aaaa")], vec![mark(0x6b70_0001)])]),
        counted(set(
            "link_port6",
            &[Ifname, Ipv6Addr, InetProto, InetService],
            &[Ipv6Addr, InetService],
            vec![element(
                vec![ifname("kup-aaaa"), addr("fd64:f5ac:e961::3"), proto(Tcp), port(3000)],
                vec![addr(pod6), port(3000)],
            )],
        )),
        interval(set(
            "link_range",
            &[Ifname, Ipv4Addr, InetProto, InetService],
            &[Ipv4Addr],
            vec![element(
                vec![ifname("kup-aaaa"), addr("169.254.77.3"), proto(Udp), ports(27015, 27115)],
                vec![addr(game)],
            )],
        )),
        interval(set(
            "link_range6",
            &[Ifname, Ipv6Addr, InetProto, InetService],
            &[Ipv6Addr],
            vec![element(
                vec![ifname("kup-aaaa"), addr("fd64:f5ac:e961::3"), proto(Udp), ports(27015, 27115)],
                vec![addr(game6)],
            )],
        )),
        counted(set(
            "publish_port",
            &[Ifname, InetProto, InetService],
            &[Ipv4Addr, InetService],
            vec![element(vec![ifname("enp1s0"), proto(Tcp), port(3000)], vec![addr(pod), port(3000)])],
        )),
        counted(set(
            "publish_port6",
            &[Ifname, InetProto, InetService],
            &[Ipv6Addr, InetService],
            vec![element(vec![ifname("enp1s0"), proto(Tcp), port(3000)], vec![addr(pod6), port(3000)])],
        )),
        interval(set(
            "publish_range",
            &[Ifname, InetProto, InetService],
            &[Ipv4Addr],
            vec![element(vec![ifname("enp1s0"), proto(Udp), ports(27015, 27115)], vec![addr(game)])],
        )),
        interval(set(
            "publish_range6",
            &[Ifname, InetProto, InetService],
            &[Ipv6Addr],
            vec![element(vec![ifname("enp1s0"), proto(Udp), ports(27015, 27115)], vec![addr(game6)])],
        )),
        interval(set(
            "reply_claim",
            &[Ipv4Addr, InetProto, InetService],
            &[],
            vec![member(vec![addr(pod), proto(Tcp), port(3000)])],
        )),
        interval(set(
            "reply_claim6",
            &[Ipv6Addr, InetProto, InetService],
            &[],
            vec![member(vec![addr(pod6), proto(Tcp), port(3000)])],
        )),
        interval(set(
            "return_mark",
            &[Ipv4Addr, InetProto, InetService],
            &[Mark],
            vec![element(vec![addr(pod), proto(Tcp), port(3000)], vec![mark(0x6b70_0001)])],
        )),
        interval(set(
            "return_mark6",
            &[Ipv6Addr, InetProto, InetService],
            &[Mark],
            vec![element(vec![addr(pod6), proto(Tcp), port(3000)], vec![mark(0x6b70_0001)])],
        )),
        counted(set(
            "steer_port",
            &[Ifname, Ipv4Addr, InetProto, InetService],
            &[Ipv4Addr],
            vec![element(
                vec![ifname("enp1s0"), addr("203.0.113.9"), proto(Tcp), port(3000)],
                vec![addr("169.254.76.237")],
            )],
        )),
        // 2001:db8::9 and fd6b:7570::1:bae4 have the same one's-complement sum.
        counted(set(
            "steer_port6",
            &[Ifname, Ipv6Addr, InetProto, InetService],
            &[Ipv6Addr],
            vec![element(
                vec![ifname("enp1s0"), addr("2001:db8::9"), proto(Tcp), port(3000)],
                vec![addr("fd6b:7570::1:bae4")],
            )],
        )),
        interval(set(
            "steer_range",
            &[InetService, Ifname, Ipv4Addr, InetProto],
            &[Ipv4Addr],
            vec![element(
                vec![ports(27015, 27115), ifname("enp1s0"), addr("203.0.113.9"), proto(Udp)],
                vec![addr("169.254.76.237")],
            )],
        )),
        interval(set(
            "steer_range6",
            &[InetService, Ifname, Ipv6Addr, InetProto],
            &[Ipv6Addr],
            vec![element(
                vec![ports(27015, 27115), ifname("enp1s0"), addr("2001:db8::9"), proto(Udp)],
                vec![addr("fd6b:7570::1:bae4")],
            )],
        )),
    ];
    let mark_map = |key: &[S], map: &str| meta_mark_set(set_mark::From::Map(map_lookup(key, map)));
    let mangle = base_chain(
        "kup-mangle",
        ChainType::Filter,
        Hook::Prerouting,
        -140,
        ChainPolicy::Accept,
        vec![
            rule(vec![], vec![mark_map(&[S::IpSaddr, S::L4proto, S::ThSport], "return_mark")]),
            rule(vec![], vec![mark_map(&[S::Ip6Saddr, S::L4proto, S::ThSport], "return_mark6")]),
            rule(vec![], vec![ct_mark_set(set_mark::From::Map(map_lookup(&[S::Iifname], "ct_mark")))]),
            rule(
                vec![
                    eq(S::Iifname, ifname("lxc*")),
                    kuport_proto::build::compare(S::CtMark, CmpOp::Eq, mark(0x6b70_0000), 0xffff_0000),
                ],
                vec![meta_mark_set(set_mark::From::Selector(S::CtMark as i32))],
            ),
        ],
    );
    let snat = |f: NftFamily, s: S| nat_to_selector(NatKind::Snat, f, s);
    let post = base_chain(
        "kup-post",
        ChainType::Nat,
        Hook::Postrouting,
        90,
        ChainPolicy::Accept,
        vec![
            rule(
                vec![lookup(&[S::Oifname, S::IpDaddr, S::L4proto, S::ThDport], "claim")],
                vec![snat(NftFamily::Ip, S::IpSaddr)],
            ),
            rule(
                vec![lookup(&[S::Oifname, S::Ip6Daddr, S::L4proto, S::ThDport], "claim6")],
                vec![snat(NftFamily::Ip6, S::Ip6Saddr)],
            ),
            rule(
                vec![ne(S::Oifname, ifname("cilium_*")), lookup(&[S::IpSaddr, S::L4proto, S::ThSport], "reply_claim")],
                vec![snat(NftFamily::Ip, S::IpSaddr)],
            ),
            rule(
                vec![
                    ne(S::Oifname, ifname("cilium_*")),
                    lookup(&[S::Ip6Saddr, S::L4proto, S::ThSport], "reply_claim6"),
                ],
                vec![snat(NftFamily::Ip6, S::Ip6Saddr)],
            ),
        ],
    );
    let dnat = |f: NftFamily, key: &[S], map: &str| rule(vec![], vec![nat_to_map(NatKind::Dnat, f, key, map)]);
    let published = [S::Iifname, S::L4proto, S::ThDport];
    let pre = base_chain(
        "kup-pre",
        ChainType::Nat,
        Hook::Prerouting,
        -110,
        ChainPolicy::Accept,
        vec![
            dnat(NftFamily::Ip, &published, "publish_port"),
            dnat(NftFamily::Ip6, &published, "publish_port6"),
            dnat(NftFamily::Ip, &published, "publish_range"),
            dnat(NftFamily::Ip6, &published, "publish_range6"),
            dnat(NftFamily::Ip, &[S::Iifname, S::IpDaddr, S::L4proto, S::ThDport], "link_range"),
            dnat(NftFamily::Ip6, &[S::Iifname, S::Ip6Daddr, S::L4proto, S::ThDport], "link_port6"),
            dnat(NftFamily::Ip6, &[S::Iifname, S::Ip6Daddr, S::L4proto, S::ThDport], "link_range6"),
        ],
    );
    let steer = base_chain(
        "kup-steer",
        ChainType::Filter,
        Hook::Prerouting,
        -120,
        ChainPolicy::Accept,
        vec![
            rule(vec![], vec![ip_daddr_set_map(&[S::Iifname, S::IpDaddr, S::L4proto, S::ThDport], "steer_port")]),
            rule(vec![], vec![ip6_daddr_set_map(&[S::Iifname, S::Ip6Daddr, S::L4proto, S::ThDport], "steer_port6")]),
            rule(vec![], vec![ip_daddr_set_map(&[S::ThDport, S::Iifname, S::IpDaddr, S::L4proto], "steer_range")]),
            rule(vec![], vec![ip6_daddr_set_map(&[S::ThDport, S::Iifname, S::Ip6Daddr, S::L4proto], "steer_range6")]),
        ],
    );
    table(NftFamily::Inet, "kuport", sets, vec![mangle, post, pre, steer])
}
