// tests/data/overlay_relay.nft as the model: the overlay's forward chain with a relay's accepts
// (docs/overlay/filter.md), and a chain of the other address shapes in an inet table. Included
// by src/netfilter/nft/tests.rs and tests/nft_root.rs.

/// tests/data/overlay_relay.nft as the model, in the file's order (which is also the canonical
/// order: sets and chains by name).
#[allow(dead_code)]
fn overlay_relay_table() -> kuport_proto::v1::NftTable {
    use kuport_proto::build::{
        accept, addr, base_chain, chain, counter, drop, eq, ifname, lookup, member, ne, port, rule, set, table,
        tcp_flag, tcp_flags, tcp_mss_clamp,
    };
    use kuport_proto::v1::{ChainPolicy, ChainType, Hook, NftFamily, NftSet, NftType as T, Selector as S};
    let wg = || ifname("kup-wg");
    let interval = |name: &str, ty: T, elems: &[&str]| NftSet {
        interval: true,
        ..set(name, &[ty], &[], elems.iter().map(|a| member(vec![addr(a)])).collect())
    };
    let on_wg = || vec![eq(S::Iifname, wg()), eq(S::Oifname, wg())];
    let relay = |saddr: S, daddr: S, set: &str| {
        let mut m = on_wg();
        m.extend([lookup(&[saddr], set), lookup(&[daddr], set)]);
        rule(m, vec![counter(), accept()])
    };
    let forward = base_chain(
        "forward",
        ChainType::Filter,
        Hook::Forward,
        0,
        ChainPolicy::Accept,
        vec![
            rule(
                vec![eq(S::Oifname, wg()), tcp_flags(tcp_flag::SYN, tcp_flag::SYN | tcp_flag::RST)],
                vec![tcp_mss_clamp()],
            ),
            relay(S::IpSaddr, S::IpDaddr, "relay_v4"),
            relay(S::Ip6Saddr, S::Ip6Daddr, "relay_v6"),
            rule(on_wg(), vec![counter(), drop()]),
        ],
    );
    let a = |ms: Vec<kuport_proto::v1::NftMatch>| rule(ms, vec![accept()]);
    let selectors = chain(
        "selectors",
        vec![
            a(vec![eq(S::IpSaddr, addr("10.42.0.0/16"))]),
            a(vec![eq(S::Ip6Daddr, addr("fd00::/64"))]),
            rule(vec![eq(S::IpSaddr, addr("10.42.0.1")), ne(S::IpDaddr, addr("10.42.1.0/25"))], vec![drop()]),
            a(vec![eq(S::TcpDport, port(80)), eq(S::Ip6Saddr, addr("fd00::1"))]),
            a(vec![lookup(&[S::IpDaddr, S::TcpDport], "svc4")]),
            a(vec![lookup(&[S::TcpDport, S::Ip6Daddr], "svc6")]),
        ],
    );
    table(
        NftFamily::Inet,
        "kuport-overlay",
        vec![
            interval("relay_v4", T::Ipv4Addr, &["10.42.1.0/24", "10.42.2.0/24"]),
            interval("relay_v6", T::Ipv6Addr, &["fd00:42:1::/64", "fd00:42:2::/64"]),
            set("svc4", &[T::Ipv4Addr, T::InetService], &[], vec![]),
            set("svc6", &[T::InetService, T::Ipv6Addr], &[], vec![]),
        ],
        vec![forward, selectors],
    )
}
