//! Ablations: each test removes one element of the computed datapath from one node (in the
//! test, on the computed NodeState, before applying it) and shows what docs/portmap/datapath.md says breaks.
//! Each first proves the full state works in the same lab, so the failure is the ablation's.
//!
//! Single cases use the shipped default lab: the game range (UDP 27015-27115) published on
//! edge-a's enp1s0 and delivered to game-0 on worker-2 over the link. client-1 can also be
//! reached from worker-2's own internet connection, client-2 only through edge-a. Multi cases use
//! the Multi lab: the pod on worker-1, client-2 entering at worker-2.
//! Each runs on each of the lab's CNI emulations (`NAME::cilium`, `NAME::bridge`,
//! `NAME::calico`; docs/overlay/lab.md): the failures are the same on all three but one, the
//! request claim's, which shows only where a CNI masquerades traffic entering the pod network.
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1. Each lab is removed on drop.

mod common;
use common::boundary::{Forger, PUSH, drop_counter, push_lab, receive, return_mark_on_any_packet, socket};
use common::cni::{default_lab_on, multi_lab_on, on_each_cni, pod_device};
use common::dual::assert_maps_any;
use common::*;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::Duration;

use kuport_lab::Protocol::{Tcp, Udp};
use kuport_lab::probe::parse_target;
use kuport_lab::program::{apply, compute};
use kuport_lab::sys::in_netns;
use kuport_lab::topology::Cni;
use kuport_lab::{Lab, Manifests, ProbeError};
use kuport_proto::v1::{NftRule, NodeState, nft_statement, nft_value, set_mark};

const GAME: &str = "203.0.113.9:27015";
const SHORT: Duration = Duration::from_millis(500);

/// The default lab programmed with the default manifests and probed once; the computed states.
fn single_lab(cni: Cni) -> (Lab, BTreeMap<String, std::sync::Arc<NodeState>>) {
    let mut lab = default_lab_on(cni);
    let out = compute(&mut lab, &Manifests::default_lab());
    apply(&mut lab, &out.node_states).expect("the full state applies");
    assert_maps(&lab, "client-1", GAME, Udp, "game-0");
    (lab, out.node_states)
}

fn multi_lab(cni: Cni) -> (Lab, BTreeMap<String, std::sync::Arc<NodeState>>) {
    let mut lab = multi_lab_on(cni);
    let out = compute(&mut lab, &Manifests::multi_lab());
    apply(&mut lab, &out.node_states).expect("the full state applies");
    assert_maps(&lab, "client-2", "100.64.0.12:5353", Udp, "dns-0");
    (lab, out.node_states)
}

/// Whether the element's key holds the interface `name`, in any field (a range key starts with
/// its ports, a single port's ends with it).
fn is_ifname(e: &kuport_proto::v1::NftElement, name: &str) -> bool {
    e.key.iter().any(|v| matches!(v.value.as_ref(), Some(nft_value::Value::Ifname(n)) if n == name))
}

/// The request claim on the pod's node (`range . DEVICE . pod . udp` in @claim_range, DEVICE
/// the one worker-2 routes game-0 through: `cilium_host`, `cni0` or game-0's `cali` device).
/// On the Cilium-like node, without it the CNI's masquerade claims the request on its way into
/// the pod network, and the pod sees the node's cilium_host (router) address instead of the
/// client. The bridge (Flannel, k3s) and Calico masquerade only pods' traffic to outside the
/// cluster, nothing entering the pod network: there the claim has nothing to beat and the pod
/// still sees the client (docs/portmap/datapath.md, "The request claim").
fn request_claim(cni: Cni) {
    let (mut lab, mut states) = single_lab(cni);
    let pod = lab.topology().pod("game-0").expect("game-0").clone();
    let device = pod_device(cni, &pod);
    let n = drop_elements(host_state(&mut states, "worker-2"), "claim_range", |e| is_ifname(e, &device));
    assert_eq!(n, 1, "{cni}: one claim element names {device}");
    apply(&mut lab, &states).unwrap();
    for client in ["client-1", "client-2"] {
        let a = lab.probe(client, addr(GAME), Udp).expect("still answered");
        println!("{cni}: without the request claim: {client} -> {a}");
        match cni {
            Cni::Cilium => {
                assert_eq!(a.pod, "game-0");
                assert_eq!(*a.seen.ip(), Ipv4Addr::new(10, 244, 2, 1), "the pod sees worker-2's router address: {a}");
                assert_eq!(a.reply_from, a.dialed, "{a}");
            }
            // Nothing masquerades traffic into the pod network: no failure to show.
            Cni::Bridge | Cni::Calico => assert_intact(&lab, client, &a, "game-0"),
        }
    }
}
on_each_cni!(without_the_request_claim_the_pod_sees_the_node = request_claim);

/// The reply claim on the pod's node (@reply_claim_range, `oifname "kup-*" sport . ip saddr
/// . proto`). docs/portmap/datapath.md: without it the CNI's egress masquerade rewrites the reply's source and the
/// client discards it. Observed here: for connections the client opens nothing changes, because
/// NAT is decided on a connection's first packet and a reply is never evaluated by a NAT rule;
/// the claim only acts on a flow the pod starts from the published port. See the next test.
fn reply_claim(cni: Cni) {
    let (mut lab, mut states) = single_lab(cni);
    let n = drop_elements(host_state(&mut states, "worker-2"), "reply_claim_range", |_| true);
    assert_eq!(n, 1);
    apply(&mut lab, &states).unwrap();
    for client in ["client-1", "client-2"] {
        let a = assert_maps(&lab, client, GAME, Udp, "game-0");
        println!("{cni}: without the reply claim: {client} -> {a}");
        assert_maps(&lab, client, "203.0.113.9:27115", Udp, "game-0");
    }
}
on_each_cni!(without_the_reply_claim_client_opened_flows_still_work = reply_claim);

/// A datagram the pod sends first from its published port, after its own node's conntrack
/// entry has expired while edge-a's lives on (docs/portmap/datapath.md, "The reply claim" and
/// "kup-mangle"): to worker-2 it is a new connection the pod opens, not a reply of one the link
/// brought in, so it is not marked into the link and leaves by worker-2's own connection,
/// masqueraded by the CNI to worker-2's address like any pod's traffic to the outside (all
/// three CNI emulations do that). So does a connection the pod opens from its published port to
/// any other host.
///
/// Under the return mark as it was (any packet from the pod's address and port), it went into
/// the link, where the reply claim acted: with the claim it keeps the pod's own address, and
/// edge-a, whose live entry does not match it, drops it as a new connection out of the link (the
/// link drop); without the claim the CNI masqueraded it to worker-2's end of the link, which
/// edge-a's live entry translated back, so it arrived from the address the client dialed.
fn pod_first_datagram(cni: Cni) {
    let (mut lab, full) = push_lab(cni);
    // worker-2 forgets UDP flows after a second; edge-a keeps them (30 s / 120 s).
    let worker2 = lab.netns("worker-2").unwrap();
    kuport_lab::sys::sysctls(
        &worker2,
        &[("net.netfilter.nf_conntrack_udp_timeout", "1"), ("net.netfilter.nf_conntrack_udp_timeout_stream", "1")],
    )
    .unwrap();
    let mut old = full.clone();
    return_mark_on_any_packet(host_state(&mut old, "worker-2"));
    let mut old_unclaimed = old.clone();
    assert_eq!(drop_elements(host_state(&mut old_unclaimed, "worker-2"), "reply_claim_port", |_| true), 1);

    let pod_ns = lab.netns("push-0").unwrap();
    let client_ns = lab.netns("client-1").unwrap();
    let pod = in_netns(&pod_ns, || UdpSocket::bind("0.0.0.0:7000")).unwrap();
    pod.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut results = Vec::new();
    for (label, states) in
        [("replies only", &full), ("the old mark", &old), ("the old mark without the reply claim", &old_unclaimed)]
    {
        apply(&mut lab, states).unwrap();
        let client = in_netns(&client_ns, || UdpSocket::bind("0.0.0.0:0")).unwrap();
        client.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let dialed: SocketAddrV4 = addr(PUSH);
        client.send_to(b"hello", dialed).unwrap();
        let mut buf = [0u8; 64];
        let (_, seen) = pod.recv_from(&mut buf).expect("the pod receives the client's datagram");
        assert_eq!(seen.ip().to_string(), "198.51.100.7", "{label}: the request keeps the client's address");
        pod.send_to(b"answer", seen).unwrap();
        let (_, from) = client.recv_from(&mut buf).expect("the answer arrives");
        assert_eq!(from, dialed.into(), "{label}: an answer within the flow comes from what was dialed");
        // worker-2's entry expires; edge-a's does not.
        std::thread::sleep(Duration::from_millis(1500));
        pod.send_to(b"push", seen).unwrap();
        let got =
            client.recv_from(&mut buf).map(|(_, from)| from.to_string()).unwrap_or_else(|e| format!("nothing ({e})"));
        println!("{cni}, {label}: the pod's first datagram after worker-2's entry expired arrived from {got}");

        results.push(got);
    }
    let ip = |r: &str| r.split_once(':').map(|(ip, _)| ip.to_string()).unwrap_or_default();
    assert_eq!(ip(&results[0]), "192.0.2.12", "{cni}: by worker-2's own connection, masqueraded: {}", results[0]);
    // The claimed datagram keeps the pod's address: edge-a's live entry does not take it as a
    // reply, and as a new connection out of the link the link drop refuses it. (Before the link
    // drop it reached the client from 10.244.2.70:7000, or, on the Calico-like edge-a, which
    // masqueraded it, from 203.0.113.9 and another port.)
    assert!(results[1].starts_with("nothing"), "{cni}, the old mark with the claim: dropped by edge-a: {}", results[1]);
    assert_eq!(
        results[2], "203.0.113.9:7000",
        "{cni}, the old mark without the claim: masqueraded, then translated back by edge-a"
    );
}
on_each_cni!(a_pods_first_datagram_leaves_by_its_own_node_not_the_link = pod_first_datagram);

/// The link peer filter (`kup-links` on worker-2: a packet to a link's VXLAN port from anyone
/// but the link's peer is dropped): without it api-0, a pod on worker-2, sends a VXLAN packet of
/// its own with the link's VNI to worker-2's underlay address; worker-2's link device takes it
/// from a third address, decapsulates it, and the link's DNAT delivers it to push-0 with a
/// forged client address.
#[test]
fn without_the_link_peer_filter_a_pod_forges_a_client_for_a_published_pod() {
    if !root() {
        return;
    }
    let (mut lab, mut states) = push_lab(Cni::Cilium);
    assert_eq!(drop_rules(host_state(&mut states, "worker-2"), "kup-links", |_| true), 1);
    apply(&mut lab, &states).unwrap();
    let pod = socket(&lab, "push-0", "0.0.0.0:7000", Duration::from_secs(1));
    let forger = Forger::new(&lab, &mut states, "worker-2", "api-0", Ipv4Addr::new(198, 51, 100, 66));
    forger.send(&lab, "api-0", SocketAddrV4::new(forger.link_end, 7000), b"forged");
    let got = receive(&pod);
    println!("without kup-links: push-0 received {got:?}");
    let (payload, src) = got.expect("the forged datagram reaches push-0");
    assert_eq!(payload, "forged");
    assert!(src.starts_with("198.51.100.66:"), "with the forged client address: {src}");
}

/// The link drop (the last rule of `kup-pre`: a new connection out of a `kup-` link that no
/// link map translated is dropped and counted). The link's peer, or anyone once the peer filter
/// is gone, sends into the link a datagram addressed to push-0's own address rather than to
/// the published port: worker-2 drops it and counts it. Without the rule worker-2 forwards it
/// to push-0 untranslated, with its forged source.
#[test]
fn without_the_link_drop_what_no_mapping_sent_reaches_a_pod() {
    if !root() {
        return;
    }
    let (mut lab, mut states) = push_lab(Cni::Cilium);
    let from_link = |r: &NftRule| r.statements.iter().any(|s| matches!(s.kind, Some(nft_statement::Kind::Verdict(_))));
    assert_eq!(drop_rules(host_state(&mut states, "worker-2"), "kup-links", |_| true), 1);
    let mut ablated = states.clone();
    assert_eq!(drop_rules(host_state(&mut ablated, "worker-2"), "kup-pre", from_link), 1);
    let pod = socket(&lab, "push-0", "0.0.0.0:7000", Duration::from_secs(1));
    let forger = Forger::new(&lab, &mut states, "worker-2", "api-0", Ipv4Addr::new(198, 51, 100, 66));
    let to = addr("10.244.2.70:7000");

    apply(&mut lab, &states).unwrap();
    let before = drop_counter(&lab, "worker-2", "kup-pre");
    forger.send(&lab, "api-0", to, b"forged");
    let got = receive(&pod);
    let after = drop_counter(&lab, "worker-2", "kup-pre");
    println!("with the link drop: push-0 received {got:?}; kup-pre drops {before} -> {after}");
    assert!(got.is_none(), "dropped: {got:?}");
    assert_eq!(after - before, 1, "and counted");
    let real = socket(&lab, "client-1", "0.0.0.0:0", Duration::from_secs(1));
    real.send_to(b"real", PUSH).unwrap();
    let (_, src) = receive(&pod).expect("the real client's datagram still arrives");
    assert!(src.starts_with("198.51.100.7:"), "{src}");

    apply(&mut lab, &ablated).unwrap();
    forger.send(&lab, "api-0", to, b"forged");
    let got = receive(&pod);
    println!("without the link drop: push-0 received {got:?}");
    let (payload, src) = got.expect("the forged datagram reaches push-0");
    assert_eq!(payload, "forged");
    assert!(src.starts_with("198.51.100.66:"), "untranslated, with the forged source: {src}");
}

/// The return mark (@return_mark_range on the pod's node): without it the reply is routed by the
/// main table. client-1, which worker-2 reaches over its own internet connection, receives it
/// from worker-2's end of the link (the source the pod's node translated back to), not from the
/// address it dialed; client-2, which only edge-a reaches, receives nothing.
fn return_mark(cni: Cni) {
    let (mut lab, mut states) = single_lab(cni);
    assert_eq!(drop_elements(host_state(&mut states, "worker-2"), "return_mark_range", |_| true), 1);
    apply(&mut lab, &states).unwrap();
    wrong_way(&lab);
}
on_each_cni!(without_the_return_mark_the_reply_leaves_by_the_wrong_way = return_mark);

/// The IPv6 twins (docs/portmap/datapath.md, "The table and its chains") are elements of their
/// own: the default lab is dual-stack, so edge-a publishes the game range on 2001:db8::9 too.
const GAME6: &str = "[2001:db8::9]:27015";

/// The request claim's IPv6 twin (@claim_range6) on the Cilium-like node, whose masquerade into
/// the pod network has an IPv6 twin: without it an IPv6 client's request is masqueraded on its
/// way into the pod network, and the pod sees worker-2's IPv6 router address, while IPv4 clients,
/// claimed by @claim_range, still reach it intact.
#[test]
fn without_the_ipv6_request_claim_the_pod_sees_the_node_over_ipv6() {
    if !root() {
        return;
    }
    let (mut lab, mut states) = single_lab(Cni::Cilium);
    assert_maps_any(&lab, "client-1", GAME6, Udp, "game-0");
    let n = drop_elements(host_state(&mut states, "worker-2"), "claim_range6", |e| is_ifname(e, "cilium_host"));
    assert_eq!(n, 1, "one IPv6 claim element names cilium_host");
    apply(&mut lab, &states).unwrap();
    for client in ["client-1", "client-2"] {
        let a = lab.probe_any(client, parse_target(GAME6).unwrap(), Udp).expect("still answered");
        println!("without the IPv6 request claim: {client} -> {a}");
        assert_eq!(a.pod, "game-0");
        assert_eq!(a.seen.ip().to_string(), "fd10:244:2::1", "the pod sees worker-2's IPv6 router address: {a}");
        assert_eq!(a.reply_from, a.dialed, "{a}");
        assert_maps(&lab, client, GAME, Udp, "game-0");
    }
}

/// The return mark's IPv6 twin (@return_mark_range6): without it an IPv6 reply is routed by
/// worker-2's main table, which has no IPv6 route to the clients (worker-2's own connection is
/// IPv4 only), so no IPv6 client gets an answer; IPv4 replies, marked by @return_mark_range,
/// still take the link.
fn return_mark6(cni: Cni) {
    let (mut lab, mut states) = single_lab(cni);
    assert_maps_any(&lab, "client-1", GAME6, Udp, "game-0");
    assert_eq!(drop_elements(host_state(&mut states, "worker-2"), "return_mark_range6", |_| true), 1);
    apply(&mut lab, &states).unwrap();
    for client in ["client-1", "client-2"] {
        let r = lab.probe_any_with(client, parse_target(GAME6).unwrap(), Udp, SHORT);
        println!("{cni}: without the IPv6 return mark: {client} -> {GAME6}/UDP: {r:?}");
        assert!(matches!(r, Err(ProbeError::NoAnswer { .. })), "{cni}: {client} gets nothing over IPv6: {r:?}");
        assert_maps(&lab, client, GAME, Udp, "game-0");
    }
}
on_each_cni!(without_the_ipv6_return_mark_ipv6_replies_are_lost = return_mark6);

/// The divert rule (ip rule pref 102): without it a marked reply is routed by main, as without
/// the mark.
fn pref_102(cni: Cni) {
    let (mut lab, mut states) = single_lab(cni);
    // The IPv4 rule and its IPv6 twin (the lab's pods are dual-stack).
    assert_eq!(drop_ip_rules(host_state(&mut states, "worker-2"), 102), 2);
    apply(&mut lab, &states).unwrap();
    wrong_way(&lab);
}
on_each_cni!(without_pref_102_the_reply_leaves_by_the_wrong_way = pref_102);

fn wrong_way(lab: &Lab) {
    // kuport's link, not the CNI's VXLAN device (Calico's vxlan.calico).
    let vxlan = lab.ip("worker-2", &["-o", "link", "show", "type", "vxlan"]).unwrap();
    let dev = vxlan
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|d| d.split('@').next().unwrap_or(d))
        .find(|d| d.starts_with("kup-"))
        .expect("worker-2's link")
        .to_string();
    let link_end: Ipv4Addr = lab
        .ip("worker-2", &["-o", "-4", "addr", "show", "dev", &dev])
        .unwrap()
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next()?.parse().ok())
        .expect("worker-2's end of the link");
    let a = lab.probe("client-1", addr(GAME), Udp).expect("client-1 gets an answer");
    println!("client-1 -> {a}");
    assert_eq!(*a.seen.ip(), Ipv4Addr::new(198, 51, 100, 7), "the request is intact: {a}");
    assert_eq!(a.reply_from, SocketAddrV4::new(link_end, 27015), "the reply comes from the link's far end: {a}");
    let b = lab.probe_with("client-2", addr(GAME), Udp, SHORT);
    println!("client-2 -> {GAME}/UDP: {b:?}");
    assert!(matches!(b, Err(ProbeError::NoAnswer { .. })), "client-2 gets nothing: {b:?}");
}

/// The loop guard (ip rule pref 101): without it the encapsulated reply, which inherits the
/// mark, matches pref 102 and is routed back into the link it just left; the kernel refuses,
/// logs nothing and counts one transmit error on the link per packet. The reply never leaves.
fn pref_101(cni: Cni) {
    let (mut lab, mut states) = single_lab(cni);
    let link = links(&states, "worker-2")[0].0.clone();
    assert_eq!(drop_ip_rules(host_state(&mut states, "worker-2"), 101), 1);
    apply(&mut lab, &states).unwrap();
    let before = tx_errors(&lab, "worker-2", &link);
    for (i, client) in ["client-1", "client-2", "client-1"].iter().enumerate() {
        let r = lab.probe_with(client, addr(&format!("203.0.113.9:{}", 27015 + i)), Udp, SHORT);
        assert!(matches!(r, Err(ProbeError::NoAnswer { .. })), "{client}: the reply never arrives: {r:?}");
    }
    let after = tx_errors(&lab, "worker-2", &link);
    println!("{link} on worker-2: tx errors {before} -> {after} over 3 probes");
    assert_eq!(after - before, 3, "one transmit error per reply");
}
on_each_cni!(without_pref_101_the_link_counts_a_tx_error_per_reply = pref_101);

fn ct_mark_save(r: &NftRule) -> bool {
    r.statements.iter().any(|s| matches!(s.kind, Some(nft_statement::Kind::CtMarkSet(_))))
}

fn ct_mark_restore(r: &NftRule) -> bool {
    r.statements.iter().any(|s| {
        matches!(&s.kind, Some(nft_statement::Kind::MetaMarkSet(m)) if matches!(m.from, Some(set_mark::From::Selector(_))))
    })
}

/// Multi: without the ct mark save (`ct mark set iifname map @ct_mark` on the pod's node) a reply
/// finds no mark to restore and leaves by worker-1's own connection to the client, from
/// worker-1's end of worker-2's link instead of the worker-2 address the client dialed. A
/// client entering at worker-1 itself is unaffected.
fn ct_mark_save_ablated(cni: Cni) {
    let (mut lab, mut states) = multi_lab(cni);
    assert_eq!(drop_rules(host_state(&mut states, "worker-1"), "kup-mangle", ct_mark_save), 1);
    apply(&mut lab, &states).unwrap();
    multi_wrong_way(&lab);
}
on_each_cni!(multi_without_the_ct_mark_save_replies_leave_by_the_pod_node = ct_mark_save_ablated);

/// Multi: without the restore (`ct direction reply ct mark 0x6b700000/16 meta mark set ct
/// mark`, which needs no CNI device name) the saved mark never reaches the reply: the same
/// failure.
fn ct_mark_restore_ablated(cni: Cni) {
    let (mut lab, mut states) = multi_lab(cni);
    assert_eq!(drop_rules(host_state(&mut states, "worker-1"), "kup-mangle", ct_mark_restore), 1);
    apply(&mut lab, &states).unwrap();
    multi_wrong_way(&lab);
}
on_each_cni!(multi_without_the_ct_mark_restore_replies_leave_by_the_pod_node = ct_mark_restore_ablated);

fn multi_wrong_way(lab: &Lab) {
    for (client, entry) in [("client-2", "100.64.0.12:5353"), ("client-3", "100.64.0.13:5353")] {
        let a = lab.probe(client, addr(entry), Udp).expect("an answer arrives, by the wrong way");
        println!("{client} -> {a}");
        assert_eq!(a.seen.ip(), &client_address(lab, client), "the request is intact: {a}");
        assert_ne!(a.reply_from, a.dialed, "{a}");
        assert!(a.reply_from.ip().to_string().starts_with("169.254.79."), "from worker-1's end of the link: {a}");
        let t = lab.probe_with(client, addr(entry), Tcp, SHORT);
        println!("{client} -> {entry}/TCP: {t:?}");
        assert!(t.is_err(), "TCP cannot complete: {t:?}");
    }
    assert_maps(lab, "client-1", "100.64.0.11:5353", Udp, "dns-0");
    assert_maps(lab, "client-1", "100.64.0.11:5353", Tcp, "dns-0");
}
