//! A mapping through changes: a return path that cannot be built, a pod that moves, a Service
//! that loses its last ready endpoint.
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1. Each lab is removed on drop.

mod common;
use common::*;

use std::time::Duration;

use kuport_lab::Protocol::{Tcp, Udp};
use kuport_lab::{Manifests, ProbeError, program};

/// returnPath None with the pod on another node: the mapping is refused before anything is
/// programmed (ReturnPathUnavailable) and the port stays closed; a local pod of the same class
/// is programmed as usual.
#[test]
fn return_path_none_with_a_remote_pod() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let class = "apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata:
  name: edge-only
spec:
  nodes:
    edge-a:
      interfaces: [enp1s0]
  returnPath:
    mode: None
---
";
    let m = with_classes(
        &(class.to_string()
            + &port_map("apps", "echo", "edge-only", "TCP", "8080", "echo", "tcp")
            + &port_map("web", "web", "edge-only", "TCP", "3000", "web", "http")),
    );
    let out = program(&mut lab, &m).expect("programs");
    assert_eq!(condition(&out, "apps", "echo", "Programmed"), ("False".into(), "ReturnPathUnavailable".into()));
    assert!(!out.programming.contains_key(&("apps".into(), "echo".into())), "no programming node");
    assert!(links(&out.node_states, "edge-a").is_empty(), "no link is built");
    for (node, state) in &out.node_states {
        let text = kuport_proto::text::node_state(state);
        assert!(!text.contains("8080"), "{node} carries the refused mapping:\n{text}");
    }
    match lab.probe("client-1", addr("203.0.113.9:8080"), Tcp) {
        Err(ProbeError::Refused { .. }) => {}
        other => panic!("the refused mapping's port must be closed (a reset from edge-a): {other:?}"),
    }
    assert_eq!(condition(&out, "web", "web", "Programmed").0, "True");
    assert_maps(&lab, "client-1", "203.0.113.9:3000", Tcp, "web-0");
}

/// The pod is rescheduled (worker-2, then worker-1, then the accepting node itself, each time
/// with an address from its new node): after recompute and apply the mapping follows it, and
/// the old node keeps nothing of it.
#[test]
fn pod_moves_and_the_mapping_follows() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let m = Manifests::default_lab();
    let out = program(&mut lab, &m).expect("programs");
    assert_eq!(links(&out.node_states, "edge-a")[0].1, "100.64.0.12");
    assert_maps(&lab, "client-1", "203.0.113.9:27015", Udp, "game-0");

    lab.move_pod("game-0", "worker-1", "10.244.1.107".parse().unwrap()).expect("moves");
    let out = program(&mut lab, &m).expect("programs after the move");
    let edge = links(&out.node_states, "edge-a");
    assert_eq!(edge.len(), 1, "{edge:?}");
    assert_eq!(edge[0].1, "100.64.0.11", "the link now goes to worker-1");
    assert!(links(&out.node_states, "worker-2").is_empty(), "worker-2 keeps no link");
    assert!(lab.ip("worker-2", &["-o", "link", "show", "type", "vxlan"]).unwrap().trim().is_empty());
    for port in ["27015", "27115"] {
        for client in ["client-1", "client-2"] {
            assert_maps(&lab, client, &format!("203.0.113.9:{port}"), Udp, "game-0");
        }
    }

    lab.move_pod("game-0", "edge-a", "10.244.18.107".parse().unwrap()).expect("moves");
    let out = program(&mut lab, &m).expect("programs after the second move");
    assert!(links(&out.node_states, "edge-a").is_empty(), "a pod on the accepting node needs no link");
    assert!(lab.ip("edge-a", &["-o", "link", "show", "type", "vxlan"]).unwrap().trim().is_empty());
    assert_maps(&lab, "client-2", "203.0.113.9:27065", Udp, "game-0");
}

/// The Service loses its last ready endpoint: the mapping is withdrawn (NoReadyEndpoint) and a
/// new TCP connection is refused at once by the accepting node (a reset), not blackholed. When
/// the endpoint is ready again, so is the mapping.
#[test]
fn last_ready_endpoint_lost_refuses_promptly() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let m = with_classes(
        &(port_map("apps", "echo-tcp", "public", "TCP", "8080", "echo", "tcp")
            + &port_map("apps", "echo-udp", "public", "UDP", "8080", "echo", "udp")),
    );
    program(&mut lab, &m).expect("programs");
    assert_maps(&lab, "client-1", "203.0.113.9:8080", Tcp, "echo-0");

    lab.set_pod_ready("echo-0", false).unwrap();
    let out = program(&mut lab, &m).expect("programs without the endpoint");
    assert_eq!(condition(&out, "apps", "echo-tcp", "Programmed"), ("False".into(), "NoReadyEndpoint".into()));
    assert!(links(&out.node_states, "edge-a").is_empty(), "the link goes with the last mapping using it");
    match lab.probe_with("client-1", addr("203.0.113.9:8080"), Tcp, Duration::from_secs(3)) {
        Err(ProbeError::Refused { after }) => {
            assert!(after < Duration::from_secs(1), "refused, but only after {after:?}");
            println!("TCP connect refused after {:.2} ms", after.as_secs_f64() * 1e3);
        }
        other => panic!("a new connection must be refused promptly: {other:?}"),
    }
    // UDP: edge-a answers with ICMP port unreachable, which an unconnected socket does not
    // report; no pod answers.
    let udp = lab.probe_with("client-1", addr("203.0.113.9:8080"), Udp, Duration::from_millis(300));
    assert!(matches!(udp, Err(ProbeError::NoAnswer { .. })), "{udp:?}");

    lab.set_pod_ready("echo-0", true).unwrap();
    program(&mut lab, &m).expect("programs with the endpoint back");
    assert_maps(&lab, "client-2", "203.0.113.9:8080", Tcp, "echo-0");
    assert_maps(&lab, "client-2", "203.0.113.9:8080", Udp, "echo-0");
}

/// Bad PortMaps next to a working one: a second claim on the same port (PortConflict), a port
/// below the class's range (PortOutsideClassRange), a port the class reserves and a UDP range
/// over the links' VXLAN port (ReservedPort). Each is refused
/// with a message naming spec.port, none of them reaches any node's state, and the mappings
/// that worked before keep working (their node states unchanged). When the winner goes, the
/// conflicting PortMap takes the port over.
#[test]
fn conflicting_and_reserved_port_maps_are_refused_and_the_winner_keeps_working() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let winner = port_map("apps", "echo-tcp", "public", "TCP", "8080", "echo", "tcp");
    let game = port_map("games", "game", "public", "UDP", "27015-27115", "game", "game");
    let good = with_classes(&(winner.clone() + &game));
    let before = program(&mut lab, &good).expect("programs");
    assert_maps(&lab, "client-1", "203.0.113.9:8080", Tcp, "echo-0");

    // Same creation time: the tie goes to namespace/name, apps/echo-tcp before web/web-late.
    let late = port_map("web", "web-late", "public", "TCP", "8080", "web", "http");
    // public's ports start at 1024; a class that opens the low ports still reserves 80 and 443.
    let low = "apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata:
  name: low
spec:
  nodes:
    edge-a:
      interfaces: [enp1s0]
  ports:
    min: 1
    max: 1023
    reserved: [80, 443]
  returnPath:
    mode: Vxlan
---
";
    let outside = port_map("web", "web-80", "public", "TCP", "80", "web", "http");
    let reserved = port_map("web", "web-443", "low", "TCP", "443", "web", "http");
    let over_vxlan = port_map("games", "game-vxlan", "public", "UDP", "4700-4800", "game", "game");
    let refused = late.clone() + low + &outside + &reserved + &over_vxlan;
    let bad = with_classes(&(winner.clone() + &game + &refused));
    let out = program(&mut lab, &bad).expect("programs");
    for (ns, name, reason, field) in [
        ("web", "web-late", "PortConflict", "spec.port"),
        ("web", "web-80", "PortOutsideClassRange", "spec.port: 80"),
        ("web", "web-443", "ReservedPort", "spec.port: 443"),
        ("games", "game-vxlan", "ReservedPort", "includes 4790"),
    ] {
        assert_eq!(condition(&out, ns, name, "Accepted"), ("False".into(), reason.into()), "{ns}/{name}");
        let message = message(&out, ns, name, "Accepted");
        assert!(message.contains(field), "{ns}/{name}: {message:?} does not name {field:?}");
        assert!(!out.programming.contains_key(&(ns.into(), name.into())), "{ns}/{name} has programming nodes");
        println!("{ns}/{name}: Accepted=False {reason}: {message}");
    }
    assert_eq!(condition(&out, "apps", "echo-tcp", "Programmed").0, "True");
    assert_eq!(out.node_states, before.node_states, "the refused PortMaps changed a node state");
    // The winner and the link-carried range still answer; the reserved port stays closed.
    for client in ["client-1", "client-2"] {
        assert_maps(&lab, client, "203.0.113.9:8080", Tcp, "echo-0");
        assert_maps(&lab, client, "203.0.113.9:27015", Udp, "game-0");
    }
    for port in ["80", "443"] {
        match lab.probe("client-2", addr(&format!("203.0.113.9:{port}")), Tcp) {
            Err(ProbeError::Refused { .. }) => {}
            other => panic!("refused port {port} must stay closed (a reset from edge-a): {other:?}"),
        }
    }

    // The winner deleted: the conflicting PortMap is accepted and serves web-0 on 8080.
    let out = program(&mut lab, &with_classes(&(game + &refused))).expect("programs");
    assert_eq!(condition(&out, "web", "web-late", "Accepted").0, "True");
    assert_eq!(condition(&out, "web", "web-late", "Programmed").0, "True");
    assert_maps(&lab, "client-1", "203.0.113.9:8080", Tcp, "web-0");
    assert_eq!(condition(&out, "web", "web-443", "Accepted"), ("False".into(), "ReservedPort".into()));
}
