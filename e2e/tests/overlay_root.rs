//! The overlay in the lab (docs/overlay/lab.md): the sites topology on a local API server, the
//! lab's controller replica with `--overlay` and one executor per node, each in a private mount
//! namespace with its own wireguard-go sockets. Three sites joined only by an internet: a cloud
//! node with a public address, a home worker behind a masquerading router, a VM behind a 1:1
//! NAT. Proven here:
//!
//! - pod to pod across every pair, both directions, TCP and UDP, real addresses at both ends;
//! - `wg show` in each node lists exactly the computed peers: the keys the Nodes' annotations
//!   publish, the pod CIDRs as allowed IPs;
//! - a port map across the mesh: the internet client reaches the home pod through the cloud
//!   node's public address, and the home's underlay has no route to the cloud's pods but the
//!   mesh;
//! - key persistence: a restarted executor keeps its key and no other node is reconfigured; a
//!   lost key file makes a new key that reaches every peer, and traffic resumes;
//! - a node added appears in every peer list and, deleted, leaves them; untouched peers keep
//!   their sessions.
//!
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1.

mod common;
use common::mesh::wg_dump::Dump;
use common::mesh::*;
use common::*;

/// The sites lab (e2e/topologies/sites.yaml).
type Sites = Mesh;

use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use kuport_lab::Protocol::{Tcp, Udp};
use kuport_lab::plane;
use kuport_lab::topology::{NodeSpec, PodSpec};
use kuport_lab::{Manifests, Topology};

/// (a), (b), (c) and (d) on one lab: the mesh forms (the home sends first), pods reach each
/// other over it with their real addresses, `wg show` is the computed mesh, the port map rides
/// it, and keys persist across restarts or are replaced everywhere when lost.
#[test]
fn three_sites_mesh_carries_pods_and_port_maps_and_keys_persist() {
    if !root() {
        return;
    }
    let mut s = Sites::start("mesh", &Topology::sites_lab(), &Manifests::sites_lab());
    let since = s.started;

    // The mesh forms: every node has a handshake with both others.
    let formed = s.wait_handshakes(since);
    for ((node, peer), t) in &formed {
        println!("first handshake seen on {node} with {peer}: {:.2} s after the plane's start", t.as_secs_f64());
    }

    // (b) wg show is the computed mesh.
    s.assert_wg_matches();

    // (a) pod to pod, every pair, both directions, TCP and UDP.
    s.all_pairs(Duration::from_secs(10));

    // (c) the port map across the mesh, and no other path between sites.
    assert_port_map(&s);

    // (c) the ablation: without the mesh's route the home's pod reaches nothing across.
    without_the_mesh_route_no_path(&mut s);

    // (d) restart one executor: same key, nothing reconfigured elsewhere.
    restart_keeps_the_key(&mut s, "vm");
    // (d) lose its key: a new key reaches every peer and traffic resumes.
    lost_key_makes_a_new_one_everywhere(&mut s, "vm");
}

/// The internet client reaches the home worker's pod through the cloud node's public address,
/// with its own address seen and the reply from the dialed address; the home's underlay has no
/// route to the cloud's pod CIDR but the mesh.
fn assert_port_map(s: &Sites) {
    let lab = s.lab();
    let cloud = lab.topology().node("cloud").expect("cloud").underlay.address.addr();
    let client = lab.topology().client("client").expect("client").address;
    for (name, proto) in [("web-tcp", Tcp), ("web-udp", Udp)] {
        let st = s.plane().port_map_status("apps", name).expect("the PortMap's status");
        let programmed = st.conditions.iter().find(|c| c.type_ == "Programmed").expect("Programmed");
        assert_eq!(programmed.status, "True", "{name}: {programmed:?}");
        let to = SocketAddrV4::new(cloud, 8080);
        let a = lab.probe_with("client", to, proto, Duration::from_secs(2)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(a.pod, "home-0", "{name}: {a}");
        assert_eq!(*a.seen.ip(), client, "{name}: the pod saw the client's address: {a}");
        assert_eq!(a.seen.port(), a.local.port(), "{name}: {a}");
        assert_eq!(a.reply_from, to, "{name}: the reply came from the dialed address: {a}");
    }
    // The port maps' link between cloud and home rides the overlay addresses (the first of
    // each pod CIDR): their underlays cannot reach each other.
    let stored = s.plane().stored("cloud").expect("reads").expect("a state").state.expect("a state");
    let vxlan: Vec<(String, String)> = stored
        .netns
        .iter()
        .flat_map(|n| &n.links)
        .filter_map(|l| l.kind.as_ref())
        .map(|kuport_proto::v1::link::Kind::Vxlan(v)| (v.local.clone(), v.remote.clone()))
        .collect();
    assert_eq!(vxlan, [("10.42.1.0".to_string(), "10.42.2.0".to_string())], "cloud's link to home");
    // No other path: outside kup-wg, the home reaches nothing of the cloud's pod network (its
    // only route there is the mesh's), and the cloud has no route to the home's LAN at all.
    let cloud_pods = lab.topology().node("cloud").expect("cloud").pod_cidr.0.trunc();
    let pod_route = lab.ip("home", &["route", "get", &cloud_pods.addr().to_string()]).expect("ip route get");
    assert!(pod_route.contains(&format!("dev {DEV}")), "home reaches the cloud's pods only by the mesh: {pod_route}");
    let home_lan = lab.topology().node("home").expect("home").underlay.address.addr();
    let lan = lab.ip("cloud", &["route", "get", &home_lan.to_string()]);
    assert!(lan.is_err(), "the cloud has no route to the home's LAN: {lan:?}");
    let vm_private = lab.topology().node("vm").expect("vm").underlay.address.addr();
    let vm = lab.ip("home", &["route", "get", &vm_private.to_string()]).expect("ip route get");
    assert!(vm.contains("via 192.168.1.1"), "the home reaches the VM's private address only toward its router: {vm}");
}

/// The home's executor is stopped (it would repair at once) and its route through `kup-wg` of
/// the cloud's pods (a prefix of the members' aggregated pod CIDRs) deleted: home-0 no longer
/// reaches cloud-0, TCP or UDP, since the home's
/// underlay goes only to its router and the internet. The restarted executor puts the route
/// back from its stored state, and the pods reach each other again.
fn without_the_mesh_route_no_path(s: &mut Sites) {
    let (home, cloud) = (s.pod_of("home"), s.pod_of("cloud"));
    let to_cloud = cloud.address.to_string();
    let mesh_route = |s: &Sites| -> Option<String> {
        let shown = s.lab().ip("home", &["route", "show", "match", &to_cloud, "dev", DEV]).ok()?;
        shown.split_whitespace().next().map(str::to_string)
    };
    s.plane_mut().kill_executor("home").expect("kills");
    let cidr = mesh_route(s).expect("the mesh's route of cloud's pods is there");
    s.lab().ip("home", &["route", "del", &cidr, "dev", DEV]).expect("the mesh's route is there");
    let route = s.lab().ip("home", &["route", "get", &cloud.address.to_string()]).expect("ip route get");
    assert!(!route.contains(DEV), "without the mesh's route: {route}");
    for proto in [Tcp, Udp] {
        let to = SocketAddrV4::new(cloud.address, ECHO);
        let lost = s.lab().probe_with(&home.name, to, proto, Duration::from_millis(500));
        assert!(lost.is_err(), "home-0 reached cloud-0 without the mesh: {lost:?}");
    }
    s.plane_mut().start_executor("home").expect("starts");
    until("the restarted executor puts the route back", Duration::from_secs(30), || {
        mesh_route(s).as_deref() == Some(cidr.as_str())
    });
    s.pod_to_pod(&home, &cloud, Tcp, Duration::from_secs(10));
    s.pod_to_pod(&home, &cloud, Udp, Duration::from_secs(10));
}

/// The node's executor is killed and started again with the same store: the same key is
/// published, no other node's desired state changes, and no peer entry anywhere starts again
/// (counters never go back).
fn restart_keeps_the_key(s: &mut Sites, node: &str) {
    let others: Vec<String> = s.nodes().iter().map(|n| n.name.clone()).filter(|n| n != node).collect();
    let key = s.published_key(node);
    let versions = |s: &Sites| -> BTreeMap<String, String> {
        s.plane().nodes().expect("nodes").into_iter().map(|r| (r.node, r.desired_version)).collect()
    };
    let text = |s: &Sites, n: &str| -> String {
        let stored = s.plane().stored(n).ok().flatten().and_then(|d| d.state);
        stored.map(|st| kuport_proto::text::node_state(&st)).unwrap_or_default()
    };
    let before_versions = versions(s);
    let before_text: BTreeMap<String, String> = others.iter().map(|n| (n.clone(), text(s, n))).collect();
    let before_peers: BTreeMap<String, _> = others.iter().map(|n| (n.clone(), s.computed(n))).collect();
    let before: BTreeMap<String, Dump> = others.iter().map(|n| (n.clone(), s.dump(n))).collect();
    s.plane_mut().kill_executor(node).expect("kills");
    s.plane_mut().start_executor(node).expect("starts");
    let nodes: Vec<String> = s.nodes().iter().map(|n| n.name.clone()).collect();
    s.plane()
        .wait("the restarted executor syncs", plane::CONVERGE_TIMEOUT, |rows| plane::converged(rows, &nodes))
        .expect("syncs");
    // Let a recompute (if any) land.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.published_key(node), key, "a restarted executor keeps its key");
    let after_versions = versions(s);
    for n in &others {
        // The controller may recompute the others meanwhile (an endpoint it chose from the
        // restarted node's reports, say); what must not happen is a peer set anew.
        if after_versions[n] != before_versions[n] {
            let (a, b) = (before_text[n].clone(), text(s, n));
            let gone: Vec<&str> = a.lines().filter(|l| !b.lines().any(|m| m == *l)).collect();
            let new: Vec<&str> = b.lines().filter(|l| !a.lines().any(|m| m == *l)).collect();
            println!("note: {n}'s desired version changed across {node}'s restart: -{gone:?} +{new:?}");
        }
        assert_eq!(s.computed(n), before_peers[n], "{n}: the computed peers are the same");
        let after = s.dump(n);
        for p in &before[n].peers {
            let (rx0, tx0) = before[n].bytes(&p[0]);
            let (rx1, tx1) = after.bytes(&p[0]);
            assert!(rx1 >= rx0 && tx1 >= tx0, "{n}: peer {} was made anew (counters went back)", p[0]);
            assert!(after.handshake(&p[0]) >= before[n].handshake(&p[0]), "{n}: peer {} lost its session", p[0]);
            let peer = after.peer(&p[0]).unwrap_or_else(|| panic!("{n}: peer {} is gone", p[0]));
            assert_eq!((&peer[2], &peer[3], &peer[7]), (&p[2], &p[3], &p[7]), "{n}: peer {} was reconfigured", p[0]);
        }
    }
    s.all_pairs(Duration::from_secs(10));
}

/// The node's key file is deleted while its executor is down: the started executor makes a new
/// key; the Node's annotation changes, every other node's device lists the new key instead of
/// the old, and pods reach each other again. Prints how long the key took to reach every peer.
fn lost_key_makes_a_new_one_everywhere(s: &mut Sites, node: &str) {
    let others: Vec<String> = s.nodes().iter().map(|n| n.name.clone()).filter(|n| n != node).collect();
    let old = s.published_key(node);
    s.plane_mut().kill_executor(node).expect("kills");
    let key_file = s.plane().store(node).join("wireguard.key");
    std::fs::remove_file(&key_file).expect("the key file is there");
    s.plane_mut().start_executor(node).expect("starts");
    let published = until("a new key is published", Duration::from_secs(30), || {
        let k = s.published_key(node);
        !k.is_empty() && k != old
    });
    let new = s.published_key(node);
    let everywhere = until("every peer lists the new key", Duration::from_secs(30), || {
        others.iter().all(|n| {
            let keys = s.dump(n).keys();
            keys.contains(&new) && !keys.contains(&old)
        })
    });
    println!(
        "new key: published {:.2} s and on every peer {:.2} s after the executor started",
        published.as_secs_f64(),
        (published + everywhere).as_secs_f64()
    );
    let holds = Instant::now();
    while s.dump(node).device[1] != new {
        assert!(
            holds.elapsed() < Duration::from_secs(30),
            "the device holds the new key {new} (old {old}): {:?}\n{}",
            s.dump(node),
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    s.all_pairs(Duration::from_secs(30));
    let settled = s.assert_wg_matches();
    println!("new key: every pair direct again {:.2} s after the pods' probes", settled.as_secs_f64());
}

/// (e) A fourth node joins (a public cloud node with a pod): every peer list gains it, and the
/// other pairs keep their sessions; deleted, it leaves every peer list, and again the others
/// keep theirs.
#[test]
fn a_node_added_joins_every_peer_list_and_deleted_leaves_them() {
    if !root() {
        return;
    }
    let mut s = Sites::start("join", &Topology::sites_lab(), &Manifests::sites_lab());
    s.wait_handshakes(s.started);
    let old: Vec<String> = s.nodes().iter().map(|n| n.name.clone()).collect();
    let keys: BTreeMap<String, String> = old.iter().map(|n| (n.clone(), s.published_key(n))).collect();
    let sessions = |s: &Sites| -> Sessions {
        let mut out = BTreeMap::new();
        for n in &old {
            let d = s.dump(n);
            for m in old.iter().filter(|m| *m != n) {
                out.insert((n.clone(), m.clone()), (d.handshake(&keys[m]), d.bytes(&keys[m])));
            }
        }
        out
    };
    let before = sessions(&s);

    let node: NodeSpec = serde_yaml::from_str(
        "{name: cloud-2, podCidr: 10.42.4.0/24, underlay: {interface: eth0, network: internet, address: 203.0.113.40/24}}",
    )
    .expect("a node");
    let pod: PodSpec = serde_yaml::from_str(
        "{name: cloud-2-0, namespace: apps, node: cloud-2, labels: {app: c2}, address: 10.42.4.10, tcp: [7000], udp: [7000]}",
    )
    .expect("a pod");
    let added = Instant::now();
    s.lab_mut().add_node(node, vec![pod]).expect("the node joins");
    let all: Vec<String> = s.nodes().iter().map(|n| n.name.clone()).collect();
    let joined = until("every peer lists cloud-2", Duration::from_secs(60), || {
        let k = s.published_key("cloud-2");
        !k.is_empty() && old.iter().all(|n| s.dump(n).keys().contains(&k))
    });
    println!("cloud-2 in every peer list {:.2} s after it was added", added.elapsed().as_secs_f64());
    let _ = joined;
    s.plane().wait("every node syncs", plane::CONVERGE_TIMEOUT, |rows| plane::converged(rows, &all)).expect("syncs");
    s.assert_wg_matches();
    s.all_pairs(Duration::from_secs(30));
    assert_untouched(&before, &sessions(&s));

    let before = sessions(&s);
    let new_key = s.published_key("cloud-2");
    s.lab_mut().remove_node("cloud-2").expect("the node leaves");
    until("cloud-2 leaves every peer list", Duration::from_secs(60), || {
        old.iter().all(|n| !s.dump(n).keys().contains(&new_key))
    });
    s.plane().wait("every node syncs", plane::CONVERGE_TIMEOUT, |rows| plane::converged(rows, &old)).expect("syncs");
    s.assert_wg_matches();
    assert_untouched(&before, &sessions(&s));
    s.all_pairs(Duration::from_secs(10));
}

/// Per (node, peer): the latest handshake and the (rx, tx) bytes.
type Sessions = BTreeMap<(String, String), (u64, (u64, u64))>;

/// No pair's session started again: handshakes never went back to zero or older, and byte
/// counters never went back (a peer entry made anew starts them at zero).
fn assert_untouched(before: &Sessions, after: &Sessions) {
    for (pair, (hs0, (rx0, tx0))) in before {
        let (hs1, (rx1, tx1)) = after[pair];
        assert!(hs1 >= *hs0 && hs1 != 0, "{pair:?}: the session was reset ({hs0} -> {hs1})");
        assert!(rx1 >= *rx0 && tx1 >= *tx0, "{pair:?}: the peer was made anew (rx {rx0} -> {rx1}, tx {tx0} -> {tx1})");
    }
}
