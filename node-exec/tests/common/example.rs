// The kuport table of tests/data/kuport_example.nft as a model, shared by the unit tests
// (include!d) and the root tests.
#[allow(unused_imports)]
use kuport_proto::v1::{
    BaseChain, ChainPolicy, ChainType, CmpOp, Compare, Hook, L4Proto, MapLookup, Nat, NatKind, NftChain, NftElement,
    NftFamily, NftMatch, NftRule, NftSet, NftStatement, NftTable, NftType, NftValue, PortRange, Selector, SetLookup,
    SetMark, nat, nft_match, nft_statement, nft_value::Value, set_mark,
};

#[allow(dead_code)]
pub fn ifname(s: &str) -> NftValue {
    NftValue { value: Some(Value::Ifname(s.into())) }
}
#[allow(dead_code)]
pub fn addr(s: &str) -> NftValue {
    NftValue { value: Some(Value::Addr(s.into())) }
}
#[allow(dead_code)]
pub fn proto(p: L4Proto) -> NftValue {
    NftValue { value: Some(Value::Proto(p as i32)) }
}
#[allow(dead_code)]
pub fn port(first: u32, last: u32) -> NftValue {
    NftValue { value: Some(Value::Port(PortRange { first, last })) }
}
#[allow(dead_code)]
pub fn mark(m: u32) -> NftValue {
    NftValue { value: Some(Value::Mark(m)) }
}
#[allow(dead_code)]
pub fn types(ts: &[NftType]) -> Vec<i32> {
    ts.iter().map(|t| *t as i32).collect()
}
#[allow(dead_code)]
pub fn sels(ss: &[Selector]) -> Vec<i32> {
    ss.iter().map(|s| *s as i32).collect()
}
#[allow(dead_code)]
pub fn set(
    name: &str,
    key: &[NftType],
    data: &[NftType],
    interval: bool,
    counter: bool,
    elements: Vec<NftElement>,
) -> NftSet {
    NftSet { name: name.into(), key: types(key), data: types(data), interval, counter, elements: elements.into(), ..Default::default() }
}
#[allow(dead_code)]
pub fn elem(key: Vec<NftValue>, data: Vec<NftValue>) -> NftElement {
    NftElement { key, data }
}
#[allow(dead_code)]
pub fn base(ty: ChainType, hook: Hook, priority: i32) -> Option<BaseChain> {
    Some(BaseChain { r#type: ty as i32, hook: hook as i32, priority, policy: ChainPolicy::Accept as i32 })
}
#[allow(dead_code)]
pub fn cmp(sel: Selector, op: CmpOp, value: NftValue, mask: u32) -> NftMatch {
    NftMatch {
        kind: Some(nft_match::Kind::Compare(Compare { selector: sel as i32, op: op as i32, value: Some(value), mask })),
    }
}
#[allow(dead_code)]
pub fn lookup(key: &[Selector], set: &str, negate: bool) -> NftMatch {
    NftMatch { kind: Some(nft_match::Kind::Lookup(SetLookup { key: sels(key), set: set.into(), negate })) }
}
#[allow(dead_code)]
pub fn st(kind: nft_statement::Kind) -> NftStatement {
    NftStatement { kind: Some(kind) }
}
#[allow(dead_code)]
pub fn nat_map(kind: NatKind, key: &[Selector], map: &str) -> NftStatement {
    st(nft_statement::Kind::Nat(Nat {
        kind: kind as i32,
        family: NftFamily::Ip as i32,
        to: Some(nat::To::Map(MapLookup { key: sels(key), map: map.into() })),
    }))
}
#[allow(dead_code)]
pub fn nat_sel(kind: NatKind, sel: Selector) -> NftStatement {
    st(nft_statement::Kind::Nat(Nat {
        kind: kind as i32,
        family: NftFamily::Ip as i32,
        to: Some(nat::To::Selector(sel as i32)),
    }))
}
#[allow(dead_code)]
pub fn rule(matches: Vec<NftMatch>, statements: Vec<NftStatement>) -> NftRule {
    NftRule { matches, statements }
}

#[allow(dead_code)]
pub fn kuport_example() -> NftTable {
    use L4Proto::{Tcp, Udp};
    use NftType::{Ifname as If, InetProto as Pr, InetService as Sv, Ipv4Addr as V4, Mark as Mk};
    use Selector as S;
    let sets = vec![
        set(
            "claim",
            &[If, V4, Pr, Sv],
            &[],
            true,
            true,
            vec![elem(vec![ifname("cilium_host"), addr("10.244.18.7"), proto(Tcp), port(3000, 3000)], vec![])],
        ),
        set("ct_mark", &[If], &[Mk], false, false, vec![elem(vec![ifname("kup-aaaa")], vec![mark(0x6b70_0001)])]),
        set(
            "link_range",
            &[If, V4, Pr, Sv],
            &[V4],
            true,
            true,
            vec![elem(
                vec![ifname("kup-aaaa"), addr("169.254.77.3"), proto(Udp), port(27015, 27115)],
                vec![addr("10.244.18.107")],
            )],
        ),
        set(
            "publish_port",
            &[If, Pr, Sv],
            &[V4, Sv],
            false,
            true,
            vec![elem(
                vec![ifname("enp1s0"), proto(Tcp), port(3000, 3000)],
                vec![addr("10.244.18.7"), port(3000, 3000)],
            )],
        ),
        set(
            "publish_range",
            &[If, Pr, Sv],
            &[V4],
            true,
            true,
            vec![elem(vec![ifname("enp1s0"), proto(Udp), port(27015, 27115)], vec![addr("10.244.18.107")])],
        ),
        set(
            "reply_claim",
            &[V4, Pr, Sv],
            &[],
            true,
            true,
            vec![elem(vec![addr("10.244.18.7"), proto(Tcp), port(3000, 3000)], vec![])],
        ),
        set(
            "return_mark",
            &[V4, Pr, Sv],
            &[Mk],
            true,
            true,
            vec![elem(vec![addr("10.244.18.7"), proto(Tcp), port(3000, 3000)], vec![mark(0x6b70_0001)])],
        ),
    ];
    let mark_from = |from: set_mark::From| SetMark { from: Some(from) };
    let chains = vec![
        NftChain {
            name: "kup-mangle".into(),
            base: base(ChainType::Filter, Hook::Prerouting, -140),
            rules: vec![
                rule(
                    vec![],
                    vec![st(nft_statement::Kind::MetaMarkSet(mark_from(set_mark::From::Map(MapLookup {
                        key: sels(&[S::IpSaddr, S::L4proto, S::ThSport]),
                        map: "return_mark".into(),
                    }))))],
                ),
                rule(
                    vec![],
                    vec![st(nft_statement::Kind::CtMarkSet(mark_from(set_mark::From::Map(MapLookup {
                        key: sels(&[S::Iifname]),
                        map: "ct_mark".into(),
                    }))))],
                ),
                rule(
                    vec![
                        cmp(S::Iifname, CmpOp::Eq, ifname("lxc*"), 0),
                        cmp(S::CtMark, CmpOp::Eq, mark(0x6b70_0000), 0xffff_0000),
                    ],
                    vec![st(nft_statement::Kind::MetaMarkSet(mark_from(set_mark::From::Selector(S::CtMark as i32))))],
                ),
            ],
        },
        NftChain {
            name: "kup-post".into(),
            base: base(ChainType::Nat, Hook::Postrouting, 90),
            rules: vec![
                rule(
                    vec![lookup(&[S::Oifname, S::IpDaddr, S::L4proto, S::ThDport], "claim", false)],
                    vec![nat_sel(NatKind::Snat, S::IpSaddr)],
                ),
                rule(
                    vec![
                        cmp(S::Oifname, CmpOp::Neq, ifname("cilium_*"), 0),
                        lookup(&[S::IpSaddr, S::L4proto, S::ThSport], "reply_claim", false),
                    ],
                    vec![nat_sel(NatKind::Snat, S::IpSaddr)],
                ),
            ],
        },
        NftChain {
            name: "kup-pre".into(),
            base: base(ChainType::Nat, Hook::Prerouting, -110),
            rules: vec![
                rule(vec![], vec![nat_map(NatKind::Dnat, &[S::Iifname, S::L4proto, S::ThDport], "publish_port")]),
                rule(vec![], vec![nat_map(NatKind::Dnat, &[S::Iifname, S::L4proto, S::ThDport], "publish_range")]),
                rule(
                    vec![],
                    vec![nat_map(NatKind::Dnat, &[S::Iifname, S::IpDaddr, S::L4proto, S::ThDport], "link_range")],
                ),
            ],
        },
    ];
    NftTable { family: NftFamily::Ip as i32, name: "kuport".into(), sets: sets.into(), chains: chains.into() }
}
