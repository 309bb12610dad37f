// tests/data/guard_inet.nft as the model: verdict maps (hash and interval, IPv4 and IPv6) jumping
// to regular chains, `ct state` matches, and dynamic sets filled by `update` (a per-source limit)
// and `add` (a per-source connection count), with a constant tag in the key. Included by
// src/netfilter/nft/tests.rs and tests/nft_guard_root.rs.

/// tests/data/guard_inet.nft as the model, in the file's order (the canonical order: sets and
/// chains by name, elements by key).
#[allow(dead_code)]
fn guard_inet_table() -> kuport_proto::v1::NftTable {
    use kuport_proto::build::{
        accept, addr, base_chain, chain, counter, ct_count, ct_state, drop, dynamic_set, element, ifname, jump_to,
        limit, port, ports, proto, rule, set, set_update, table, verdict_map, verdict_value,
    };
    use kuport_proto::build::ct_state::{ESTABLISHED, INVALID, NEW, RELATED};
    use kuport_proto::v1::{ChainPolicy, ChainType, Hook, L4Proto::*, NftFamily, NftSet, NftType::*, Selector as S, VerdictKind};
    let sets = vec![
        dynamic_set("cc4", &[Ipv4Addr, Mark], 65536, 0),
        dynamic_set("rl4", &[Ipv4Addr, Mark], 65536, 60),
        dynamic_set("rl6", &[Ipv6Addr, Mark], 131_072, 90),
        set(
            "vm",
            &[Ifname, Ipv4Addr, InetProto, InetService],
            &[Verdict],
            vec![
                element(vec![ifname("veth0"), addr("10.0.0.1"), proto(Tcp), port(80)], vec![jump_to("g-1")]),
                element(
                    vec![ifname("veth0"), addr("10.0.0.1"), proto(Udp), port(53)],
                    vec![verdict_value(VerdictKind::Drop, "")],
                ),
                element(
                    vec![ifname("veth0"), addr("10.0.0.2"), proto(Udp), port(53)],
                    vec![verdict_value(VerdictKind::Accept, "")],
                ),
                element(
                    vec![ifname("veth1"), addr("10.0.0.1"), proto(Tcp), port(80)],
                    vec![verdict_value(VerdictKind::Goto, "g-2")],
                ),
            ],
        ),
        NftSet {
            interval: true,
            ..set(
                "vr",
                &[InetService, Ifname, Ipv4Addr, InetProto],
                &[Verdict],
                vec![element(vec![ports(27015, 27115), ifname("veth0"), addr("10.0.0.1"), proto(Udp)], vec![jump_to("g-2")])],
            )
        },
        NftSet {
            interval: true,
            ..set(
                "vr6",
                &[InetService, Ifname, Ipv6Addr, InetProto],
                &[Verdict],
                vec![element(vec![ports(27015, 27115), ifname("veth0"), addr("fd00::1"), proto(Udp)], vec![jump_to("g-2")])],
            )
        },
    ];
    let g1 = chain(
        "g-1",
        vec![
            rule(
                vec![ct_state(NEW)],
                vec![set_update(&[S::IpSaddr], Some(0x2a), "rl4", limit(100, 200, true)), counter(), drop()],
            ),
            rule(
                vec![ct_state(NEW)],
                vec![set_update(&[S::IpSaddr], Some(0x2a), "cc4", ct_count(3, true)), counter(), drop()],
            ),
            rule(vec![ct_state(ESTABLISHED | RELATED)], vec![accept()]),
            rule(vec![ct_state(INVALID)], vec![drop()]),
            rule(vec![ct_state(NEW | ESTABLISHED | RELATED | INVALID)], vec![counter()]),
            rule(vec![], vec![set_update(&[S::IpSaddr], Some(1), "rl4", limit(5, 5, false)), accept()]),
            rule(vec![], vec![set_update(&[S::Ip6Saddr], Some(7), "rl6", limit(3, 3, true)), drop()]),
            rule(vec![], vec![set_update(&[S::IpSaddr], Some(5), "cc4", ct_count(8, false)), accept()]),
            rule(vec![], vec![accept()]),
        ],
    );
    let g2 = chain("g-2", vec![rule(vec![], vec![counter()])]);
    let pre = base_chain(
        "pre",
        ChainType::Filter,
        Hook::Prerouting,
        -120,
        ChainPolicy::Accept,
        vec![
            rule(vec![], vec![verdict_map(&[S::Iifname, S::IpDaddr, S::L4proto, S::ThDport], "vm")]),
            rule(vec![], vec![verdict_map(&[S::ThDport, S::Iifname, S::IpDaddr, S::L4proto], "vr")]),
            rule(vec![], vec![verdict_map(&[S::ThDport, S::Iifname, S::Ip6Daddr, S::L4proto], "vr6")]),
        ],
    );
    table(NftFamily::Inet, "kuport-guard", sets, vec![g1, g2, pre])
}
