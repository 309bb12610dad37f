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
    include_str!("testdata_kuport_nft106.txt")
        .lines()
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
