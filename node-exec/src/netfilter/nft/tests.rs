//! Byte-level tests of the encoding against what nft 1.0.6 sends for the same table
//! (captured with strace from `nft -f tests/data/kuport_example.nft`), and decoding back.

use super::attr::parse;
use super::consts::*;
use super::encode;
use super::rule::{compile, decompile};
use super::{decode, normalize};

include!("../../../tests/common/example.rs");

/// (NFT_MSG type, attributes) of every message nft sent.
fn nft_messages() -> Vec<(u16, Vec<u8>)> {
    fixture(include_str!("testdata_kuport_nft106.txt"))
}

/// A capture's messages: one a line, the NFT_MSG type and the attributes in hex.
fn fixture(text: &str) -> Vec<(u16, Vec<u8>)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (ty, hex) = l.split_once(' ').expect("fixture line");
            let bytes =
                (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
            (ty.parse().expect("type"), bytes)
        })
        .collect()
}

/// Our messages for the example, in the order of a full replace (minus the delete dance).
fn our_messages() -> Vec<encode::Msg> {
    let t = normalize(&kuport_example()).expect("normalize");
    let fam = NFPROTO_IPV4;
    let mut out = vec![encode::new_table(fam, &t.name)];
    for c in &t.chains {
        out.push(encode::new_chain(fam, &t.name, c).expect("chain"));
    }
    for (i, s) in t.sets.iter().enumerate() {
        let id = i as u32 + 1;
        out.push(encode::new_set(fam, &t.name, s, id).expect("set"));
        let elems: Vec<_> = s.elements.iter().collect();
        out.extend(encode::set_elements(NFT_MSG_NEWSETELEM, fam, &t.name, s, Some(id), &elems).expect("elements"));
    }
    let ctx = encode::rule_ctx(&t, true);
    for c in &t.chains {
        for (i, r) in c.rules.iter().enumerate() {
            let object = encode::rule_name(&c.name, i);
            out.push(encode::new_rule(fam, &t.name, &c.name, &compile(r, &ctx, &object).expect("compile"), object));
        }
    }
    out
}

#[test]
fn example_encodes_byte_for_byte_like_nft() {
    let theirs = nft_messages();
    let ours = our_messages();
    assert_eq!(ours.len(), theirs.len(), "message count");
    for (i, (m, (ty, attrs))) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(m.ty, *ty, "message {i} ({}) type", m.object);
        assert_eq!(hex(&m.attrs), hex(attrs), "message {i} ({}) attributes", m.object);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn nft_messages_decode_to_the_model() {
    let want = normalize(&kuport_example()).expect("normalize");
    let mut sets = Vec::new();
    let mut chains = Vec::new();
    let mut rules: Vec<(String, kuport_proto::v1::NftRule)> = Vec::new();
    for (ty, attrs) in nft_messages() {
        match ty {
            NFT_MSG_NEWCHAIN => chains.push(decode::chain(&attrs).expect("chain").1),
            NFT_MSG_NEWSET => sets.push(decode::set(&attrs).expect("set").1),
            NFT_MSG_NEWSETELEM => {
                let s = sets.last_mut().expect("set before elements");
                decode::elements(&attrs, s).expect("elements");
            }
            NFT_MSG_NEWRULE => {
                let (_, chain, r) = decode::rule(&attrs, |_| 0).expect("rule");
                rules.push((chain, r));
            }
            _ => {}
        }
    }
    for c in &mut chains {
        c.rules = rules.iter().filter(|(n, _)| *n == c.name).map(|(_, r)| r.clone()).collect();
    }
    assert_eq!(sets, want.sets);
    assert_eq!(chains, want.chains);
}

#[test]
fn rules_roundtrip_through_expressions() {
    let t = normalize(&kuport_example()).expect("normalize");
    let ctx = encode::rule_ctx(&t, false);
    for c in &t.chains {
        for r in &c.rules {
            let e = compile(r, &ctx, "r").expect("compile");
            assert_eq!(&decompile(&e, "r").expect("decompile"), r);
        }
    }
}

#[test]
fn attribute_parser_walks_nested_nests() {
    let (_, set) = &nft_messages()[4];
    let attrs = parse(set).expect("parse");
    assert_eq!(attrs.iter().map(|a| a.ty).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 10, 9, 13, 17]);
}

#[test]
fn bad_interface_name_is_refused_before_the_kernel() {
    let mut t = kuport_example();
    t.sets[1].elements[0].key[0] = ifname("a-name-longer-than-15");
    let err = normalize(&t).expect_err("too long");
    let text = err.to_string();
    assert!(text.contains("set ct_mark") && text.contains("bad interface name"), "{text}");
}

/// The overlay's table (docs/overlay/filter.md) encodes byte for byte as nft 1.0.6 sends
/// tests/data/overlay_forward.nft, captured with `strace -e write`.
#[test]
fn overlay_table_encodes_byte_for_byte_like_nft() {
    let theirs = fixture(include_str!("testdata_overlay_nft106.txt"));
    let t = normalize(&overlay_table()).expect("normalize");
    let fam = NFPROTO_INET;
    let mut ours = vec![encode::new_table(fam, &t.name)];
    ours.push(encode::new_chain(fam, &t.name, &t.chains[0]).expect("chain"));
    let ctx = encode::rule_ctx(&t, true);
    for (i, r) in t.chains[0].rules.iter().enumerate() {
        let object = encode::rule_name(&t.chains[0].name, i);
        ours.push(encode::new_rule(
            fam,
            &t.name,
            &t.chains[0].name,
            &compile(r, &ctx, &object).expect("compile"),
            object,
        ));
    }
    assert_eq!(ours.len(), theirs.len(), "message count");
    for (i, (m, (ty, attrs))) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(m.ty, *ty, "message {i} ({}) type", m.object);
        assert_eq!(hex(&m.attrs), hex(attrs), "message {i} ({}) attributes", m.object);
    }
    // nft's rules decode to the model's.
    let rules: Vec<_> = theirs
        .iter()
        .filter(|(ty, _)| *ty == NFT_MSG_NEWRULE)
        .map(|(_, attrs)| decode::rule(attrs, |_| 0).expect("rule").2)
        .collect();
    assert_eq!(rules, t.chains[0].rules);
}

/// tests/data/overlay_forward.nft as the model.
fn overlay_table() -> kuport_proto::v1::NftTable {
    use kuport_proto::build::{base_chain, counter, drop, eq, ifname, rule, table, tcp_flag, tcp_flags, tcp_mss_clamp};
    use kuport_proto::v1::{ChainPolicy, ChainType, Hook, NftFamily, Selector};
    let wg = || ifname("kup-wg");
    let clamp = rule(
        vec![eq(Selector::Oifname, wg()), tcp_flags(tcp_flag::SYN, tcp_flag::SYN | tcp_flag::RST)],
        vec![tcp_mss_clamp()],
    );
    let hairpin = rule(vec![eq(Selector::Iifname, wg()), eq(Selector::Oifname, wg())], vec![counter(), drop()]);
    table(
        NftFamily::Inet,
        "kuport-overlay",
        vec![],
        vec![base_chain("forward", ChainType::Filter, Hook::Forward, 0, ChainPolicy::Accept, vec![clamp, hairpin])],
    )
}

/// The overlay's rules (docs/overlay/filter.md) compile to the expressions
/// `nft --debug=netlink` shows for their text, survive the attribute encoding, and decompile to
/// the model rule.
#[test]
fn overlay_rules_compile_like_nft_and_decompile_back() {
    use super::expr::{Expr, Imm};
    use crate::sys::netlink::attr::AttrWriter;
    use kuport_proto::build::{base_chain, counter, drop, eq, ifname, rule, table, tcp_flag, tcp_flags, tcp_mss_clamp};
    use kuport_proto::v1::{ChainPolicy, ChainType, Hook, NftFamily, Selector};

    let wg = || ifname("kup-wg");
    let clamp = rule(
        vec![eq(Selector::Oifname, wg()), tcp_flags(tcp_flag::SYN, tcp_flag::SYN | tcp_flag::RST)],
        vec![tcp_mss_clamp()],
    );
    let hairpin = rule(vec![eq(Selector::Iifname, wg()), eq(Selector::Oifname, wg())], vec![counter(), drop()]);
    let t = table(
        NftFamily::Inet,
        "kuport-overlay",
        vec![],
        vec![base_chain(
            "forward",
            ChainType::Filter,
            Hook::Forward,
            0,
            ChainPolicy::Accept,
            vec![clamp.clone(), hairpin.clone()],
        )],
    );
    let ctx = encode::rule_ctx(&t, false);
    let mut name = b"kup-wg".to_vec();
    name.resize(16, 0);
    let oif =
        [Expr::Meta { key: NFT_META_OIFNAME, dreg: 1 }, Expr::Cmp { sreg: 1, op: NFT_CMP_EQ, data: name.clone() }];
    let want = [
        &oif[..],
        &[
            Expr::Meta { key: NFT_META_L4PROTO, dreg: 1 },
            Expr::Cmp { sreg: 1, op: NFT_CMP_EQ, data: vec![6] },
            Expr::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset: 13, len: 1, dreg: 1 },
            Expr::Bitwise { sreg: 1, dreg: 1, len: 1, mask: vec![0x06], xor: vec![0] },
            Expr::Cmp { sreg: 1, op: NFT_CMP_EQ, data: vec![0x02] },
            Expr::Rt { key: NFT_RT_TCPMSS, dreg: 1 },
            Expr::Byteorder { sreg: 1, dreg: 1, op: NFT_BYTEORDER_HTON, len: 2, size: 2 },
            Expr::ExthdrSet { op: NFT_EXTHDR_OP_TCPOPT, ty: 2, offset: 2, len: 2, sreg: 1 },
        ],
    ]
    .concat();
    let got = compile(&clamp, &ctx, "r").expect("compile");
    assert_eq!(got, want);
    let want_hairpin = [
        &[Expr::Meta { key: NFT_META_IIFNAME, dreg: 1 }, Expr::Cmp { sreg: 1, op: NFT_CMP_EQ, data: name }][..],
        &oif[..],
        &[Expr::Counter, Expr::Immediate { dreg: 0, data: Imm::Verdict { code: NF_DROP, chain: None } }],
    ]
    .concat();
    assert_eq!(compile(&hairpin, &ctx, "r").expect("compile"), want_hairpin);
    for (r, exprs) in [(&clamp, &got), (&hairpin, &want_hairpin)] {
        // Through the attributes and back, as a dump returns them.
        let decoded: Vec<Expr> = exprs
            .iter()
            .map(|e| {
                let mut w = AttrWriter::new();
                e.encode(&mut w);
                let attrs = parse(&w.buf).expect("parse");
                Expr::decode(&attrs[0]).expect("decode")
            })
            .collect();
        assert_eq!(&decoded, exprs);
        assert_eq!(&decompile(&decoded, "r").expect("decompile"), r);
    }
    // A full mask is a plain compare; an explicit `meta l4proto tcp` is the dependency.
    let full = rule(
        vec![eq(Selector::L4proto, kuport_proto::build::proto(kuport_proto::v1::L4Proto::Tcp)), tcp_flags(2, 0xff)],
        vec![],
    );
    let e = compile(&full, &ctx, "r").expect("compile");
    assert_eq!(e.len(), 4, "{e:?}");
    assert_eq!(decompile(&e, "r").expect("decompile"), rule(vec![tcp_flags(2, 0xff)], vec![]));
    // A value outside its mask, or no mask, is refused before the kernel.
    for (v, m) in [(4, 2), (2, 0), (2, 0x100)] {
        let err = compile(&rule(vec![tcp_flags(v, m)], vec![]), &ctx, "r").expect_err("refused");
        assert!(err.to_string().contains("tcp flags"), "{err}");
    }
}
