//! Dual-stack port maps end to end: one PortMap, published on edge-a's public interface in both
//! families (203.0.113.9 and 2001:db8::9), delivered to a pod on a worker over kuport's link.
//! An IPv4 and an IPv6 client (the same internet clients over each family) each dial the
//! address of their family; each must see its own address and port at the pod and the reply
//! from the address it dialed (docs/portmap/datapath.md; the lab's IPv6 in e2e/README.md).
//! The default topology with the Cilium-like CNI, whose masquerade into the pod network has
//! its IPv6 twin, so kuport's request claim is needed in both families.
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1. Each lab is removed on drop.

mod common;
use common::cni::{default_lab_on, on_each_cni};
use common::dual::assert_maps_any;
use common::*;

use std::net::UdpSocket;
use std::time::Duration;

use kuport_lab::Protocol::{Tcp, Udp};
use kuport_lab::program;
use kuport_lab::sys::in_netns;
use kuport_lab::topology::Cni;

/// What the lab alone does over IPv6, before kuport, on each CNI emulation: the node reaches
/// its pods at their IPv6 addresses, pods on one node see each other's, the echo server answers
/// IPv4 peers unmapped, and a client reaches edge-a's public IPv6 address by its default route.
fn emulation6(cni: Cni) {
    let lab = default_lab_on(cni);
    let a = lab.probe_any("worker-2", "[fd10:244:2::6b]:27015".parse().unwrap(), Udp).expect("worker-2 reaches game-0");
    assert_eq!(a.pod, "game-0", "{cni}: {a}");
    let a = lab.probe_any("api-0", "[fd10:244:2::6b]:27015".parse().unwrap(), Udp).expect("api-0 reaches game-0");
    assert_eq!(a.seen.ip().to_string(), "fd10:244:2::9", "{cni}: pods on one node see each other: {a}");
    let a = lab.probe_any("worker-2", "[fd10:244:2::9]:9000".parse().unwrap(), Tcp).expect("worker-2 reaches api-0");
    assert_eq!(a.pod, "api-0", "{cni}: {a}");
    let a = lab.probe_any("api-0", "10.244.2.107:27015".parse().unwrap(), Udp).expect("over IPv4 as before");
    assert_eq!(a.seen.to_string(), format!("10.244.2.9:{}", a.local.port()), "{cni}: IPv4 peers unmapped: {a}");
    let edge = in_netns(&lab.netns("edge-a").unwrap(), || UdpSocket::bind("[2001:db8::9]:7200")).unwrap();
    edge.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let client = in_netns(&lab.netns("client-1").unwrap(), || UdpSocket::bind("[::]:0")).unwrap();
    client.send_to(b"in", "[2001:db8::9]:7200").unwrap();
    let mut buf = [0u8; 16];
    let (_, from) =
        edge.recv_from(&mut buf).unwrap_or_else(|e| panic!("{cni}: client-1 reaches edge-a over IPv6: {e}"));
    assert_eq!(from.ip().to_string(), "2001:db8:100::7", "{cni}");
    edge.send_to(b"back", from).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let (_, back) = client.recv_from(&mut buf).unwrap_or_else(|e| panic!("{cni}: edge-a answers client-1: {e}"));
    assert_eq!(back.to_string(), "[2001:db8::9]:7200", "{cni}");
}
on_each_cni!(cni_emulation_routes_ipv6 = emulation6);

/// UDP (the game range on worker-2) and TCP (api-0 on worker-2), from both clients over both
/// families.
#[test]
fn a_v4_and_a_v6_client_each_see_their_own_address() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let m = with_classes(
        &(port_map("games", "game", "public", "UDP", "27015-27115", "game", "game")
            + &port_map("apps", "api", "public", "TCP", "9000", "api", "api")),
    );
    let out = program(&mut lab, &m).expect("programs");
    for (ns, name) in [("games", "game"), ("apps", "api")] {
        assert_eq!(condition(&out, ns, name, "Programmed").0, "True", "{ns}/{name}");
        let st = &out.port_maps[&(ns.to_string(), name.to_string())];
        let published: Vec<&str> =
            st.published.iter().filter(|p| p.interface == "enp1s0").map(|p| p.address.as_str()).collect();
        println!("{ns}/{name}: published on edge-a enp1s0 {published:?}; endpoint {:?}", st.endpoint);
        assert!(published.contains(&"203.0.113.9") && published.contains(&"2001:db8::9"), "{published:?}");
    }
    assert_eq!(links(&out.node_states, "edge-a").len(), 1, "one link, edge-a to worker-2, for both families");
    for client in ["client-1", "client-2"] {
        for (port, proto, pod) in [(27015, Udp, "game-0"), (27115, Udp, "game-0"), (9000, Tcp, "api-0")] {
            for to in [format!("203.0.113.9:{port}"), format!("[2001:db8::9]:{port}")] {
                let a = assert_maps_any(&lab, client, &to, proto, pod);
                println!("{client} -> {a}");
            }
        }
    }
}
