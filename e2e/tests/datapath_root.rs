//! End to end through the lab: clients dial published addresses, pods answer with the source
//! they saw. In every case the pod must see the client's real address and port, and the reply
//! must come from the address and port the client dialed.
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1. Each lab is removed on drop.

mod common;
use common::cni::{default_lab_on, multi_lab_on, on_each_cni};
use common::dual::{assert_intact_any, assert_maps_any};
use common::*;

use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;

use kuport_lab::Protocol::{Tcp, Udp};
use kuport_lab::probe::parse_target;
use kuport_lab::sys::in_netns;
use kuport_lab::topology::Cni;
use kuport_lab::{Manifests, program};

/// What the lab's CNI emulation alone does, before kuport (docs/overlay/lab.md, "The CNI
/// emulations"): the node reaches its pods, pods on one node reach each other with their own
/// addresses, and a pod's traffic to outside the cluster leaves masqueraded to the node's
/// address on the way out (worker-2's own internet connection, 192.0.2.12).
fn emulation(cni: Cni) {
    let lab = default_lab_on(cni);
    let a = lab.probe("worker-2", addr("10.244.2.107:27015"), Udp).expect("worker-2 reaches game-0");
    assert_eq!(a.pod, "game-0", "{cni}: {a}");
    let a = lab.probe("api-0", addr("10.244.2.107:27015"), Udp).expect("api-0 reaches game-0");
    assert_eq!(*a.seen.ip(), Ipv4Addr::new(10, 244, 2, 9), "{cni}: pods on one node see each other: {a}");
    let client = in_netns(&lab.netns("client-1").unwrap(), || UdpSocket::bind("0.0.0.0:7100")).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let pod = in_netns(&lab.netns("game-0").unwrap(), || UdpSocket::bind("0.0.0.0:0")).unwrap();
    pod.send_to(b"out", "198.51.100.7:7100").unwrap();
    let mut buf = [0u8; 16];
    let (_, from) = client.recv_from(&mut buf).unwrap_or_else(|e| panic!("{cni}: the pod reaches the outside: {e}"));
    assert_eq!(from.ip().to_string(), "192.0.2.12", "{cni}: masqueraded to worker-2's address");
}
on_each_cni!(cni_emulation_reaches_pods_and_the_outside = emulation);

/// The first shape of docs/portmap/datapath.md: the pod sits on the node that accepts the
/// packet. No link. Over IPv4 and IPv6.
#[test]
fn single_pod_on_accepting_node_tcp() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let m = with_classes(&port_map("web", "web", "public", "TCP", "3000", "web", "http"));
    let out = program(&mut lab, &m).expect("programs");
    assert_eq!(condition(&out, "web", "web", "Programmed").0, "True");
    assert!(links(&out.node_states, "edge-a").is_empty(), "a local pod needs no link");
    for client in ["client-1", "client-2"] {
        assert_maps(&lab, client, "203.0.113.9:3000", Tcp, "web-0");
        // The same over IPv6: web-0's IPv6 address, edge-a's 2001:db8::9.
        assert_maps_any(&lab, client, "[2001:db8::9]:3000", Tcp, "web-0");
    }
}

/// The second shape: edge-a accepts, the pod is on worker-1, both legs ride kuport's link. On
/// each CNI emulation, with no CNI setting: kuport learns the pod's device from worker-1.
fn another_node(cni: Cni) {
    let mut lab = default_lab_on(cni);
    let m = with_classes(
        &(port_map("apps", "echo-tcp", "public", "TCP", "8080", "echo", "tcp")
            + &port_map("apps", "echo-udp", "public", "UDP", "8080", "echo", "udp")),
    );
    let out = program(&mut lab, &m).expect("programs");
    let edge = links(&out.node_states, "edge-a");
    assert_eq!(edge.len(), 1, "one link for both mappings: {edge:?}");
    assert_eq!(edge[0].1, "100.64.0.11", "the link goes to worker-1");
    for client in ["client-1", "client-2"] {
        assert_maps(&lab, client, "203.0.113.9:8080", Tcp, "echo-0");
        assert_maps(&lab, client, "203.0.113.9:8080", Udp, "echo-0");
    }
}
on_each_cni!(single_pod_on_another_node_tcp_and_udp = another_node);

/// A UDP range of 101 ports, delivered to the same port numbers on the pod (the shipped default
/// manifests): first, middle and last port.
#[test]
fn udp_range_of_101_ports() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let out = program(&mut lab, &Manifests::default_lab()).expect("programs");
    assert_eq!(condition(&out, "games", "game", "Programmed").0, "True");
    for port in [27015, 27065, 27115] {
        let to = format!("203.0.113.9:{port}");
        for client in ["client-1", "client-2"] {
            let a = assert_maps(&lab, client, &to, Udp, "game-0");
            assert_eq!(a.dialed.port(), port);
        }
    }
    // Just outside the range nothing is published: edge-a itself answers (ICMP), no pod does.
    let outside = lab.probe_with("client-1", addr("203.0.113.9:27116"), Udp, std::time::Duration::from_millis(300));
    assert!(outside.is_err(), "port 27116 is outside the range: {outside:?}");
}

/// Multi: every worker accepts the `intranet` class (docs/portmap/modes.md) on wt0; the pod is on worker-1. Clients
/// enter at each worker: worker-1 delivers locally, worker-2 and worker-3 over their links,
/// and worker-1 returns each reply by the link its request came in on (the ct mark). On each
/// CNI emulation, over IPv4 and IPv6.
fn multi(cni: Cni) {
    let mut lab = multi_lab_on(cni);
    let out = program(&mut lab, &Manifests::multi_lab()).expect("programs");
    for name in ["dns", "dns-tcp"] {
        assert_eq!(condition(&out, "intranet", name, "Programmed").0, "True", "{name}");
    }
    assert_eq!(links(&out.node_states, "worker-1").len(), 2, "worker-1 has a link to each other worker");
    // Each worker's wt0 in both families (the topology is dual-stack): each client's own
    // address of the family at dns-0, the replies by the links the requests came in on.
    let entries = [
        ("client-1", "100.64.0.11", "fd7a:64::11"),
        ("client-2", "100.64.0.12", "fd7a:64::12"),
        ("client-3", "100.64.0.13", "fd7a:64::13"),
    ];
    let dialed = |v4: &str, v6: &str| [format!("{v4}:5353"), format!("[{v6}]:5353")];
    for (client, v4, v6) in entries {
        for to in dialed(v4, v6) {
            assert_maps_any(&lab, client, &to, Udp, "dns-0");
            assert_maps_any(&lab, client, &to, Tcp, "dns-0");
        }
    }
    // Any client through any worker, not only its own.
    for (_, v4, v6) in entries {
        for to in dialed(v4, v6) {
            assert_maps_any(&lab, "client-2", &to, Udp, "dns-0");
        }
    }
    // One source port through two accepting nodes: both flows have one reply tuple at
    // worker-1, whose conntrack gives the second another source port (docs/portmap/modes.md).
    // Each reply still returns by its flow's entry, from the address dialed.
    for (port, first, second) in
        [(19_001, "100.64.0.11:5353", "100.64.0.12:5353"), (19_002, "[fd7a:64::13]:5353", "[fd7a:64::11]:5353")]
    {
        let probe =
            |to: &str| lab.probe_any_from("client-2", parse_target(to).expect("target"), Udp, port).expect("answers");
        let a = probe(first);
        assert_intact_any(&lab, "client-2", &a, "dns-0");
        let b = probe(second);
        assert_eq!((b.pod.as_str(), b.seen.ip(), b.reply_from), ("dns-0", a.seen.ip(), b.dialed), "{b}");
        assert_ne!(b.seen.port(), port, "the second flow kept the port the first holds at worker-1: {b}");
    }
}
on_each_cni!(multi_three_accepting_nodes = multi);

/// Two classes over one node pair (edge-a and worker-2): two links with their own VNIs, one per
/// class, each carrying its own mapping.
#[test]
fn two_classes_over_one_node_pair() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let m = with_classes(
        &(edge_class("backup", "{vni: 4400}")
            + &port_map("games", "game", "public", "UDP", "27015-27115", "game", "game")
            + &port_map("apps", "api", "backup", "TCP", "9000", "api", "api")),
    );
    let out = program(&mut lab, &m).expect("programs");
    let edge = links(&out.node_states, "edge-a");
    assert_eq!(edge.len(), 2, "one link per class: {edge:?}");
    assert!(edge.iter().all(|(_, remote)| remote == "100.64.0.12"), "both to worker-2: {edge:?}");
    assert_ne!(edge[0].0, edge[1].0);
    let shown = lab.ip("edge-a", &["-d", "link", "show", "type", "vxlan"]).unwrap();
    assert!(shown.contains("vxlan id 4401") || shown.contains("vxlan id 4402"), "the backup class's VNI: {shown}");
    let sent = |dev: &str| link_stat(&lab, "edge-a", dev, "tx", "packets");
    let before: Vec<u64> = edge.iter().map(|(dev, _)| sent(dev)).collect();
    for client in ["client-1", "client-2"] {
        assert_maps(&lab, client, "203.0.113.9:27015", Udp, "game-0");
        assert_maps(&lab, client, "203.0.113.9:27115", Udp, "game-0");
        assert_maps(&lab, client, "203.0.113.9:9000", Tcp, "api-0");
    }
    for ((dev, _), before) in edge.iter().zip(before) {
        assert!(sent(dev) > before, "link {dev} carried nothing: each class's mapping rides its own link");
    }
}

/// A class on the CNI's own VXLAN port (Calico's `vxlan.calico`, 4789): no link of it ends on a
/// node that reports that port (learned from the nodes' devices with no setting), so its mapping
/// is not Programmed (VxlanPortConflict, naming the node and the port), while the class stays
/// Ready for nodes that do not report it and the class beside it keeps carrying traffic
/// (docs/portmap/datapath.md, "The link"; a node's report bounds only its own links).
#[test]
fn a_class_on_the_cnis_vxlan_port_is_refused() {
    if !root() {
        return;
    }
    let mut lab = default_lab_on(Cni::Calico);
    let m = with_classes(
        &(edge_class("clash", "{vni: 4400, port: 4789}")
            + &port_map("games", "game", "public", "UDP", "27015-27115", "game", "game")
            + &port_map("apps", "api", "clash", "TCP", "9000", "api", "api")),
    );
    let out = program(&mut lab, &m).expect("programs");
    let ready = out.classes["clash"].conditions.iter().find(|c| c.type_ == "Ready").expect("a Ready condition");
    assert_eq!(ready.status, "True", "a node's report takes only its own links out: {ready:?}");
    assert_eq!(
        condition(&out, "apps", "api", "Programmed"),
        ("False".into(), "VxlanPortConflict".into()),
        "the clashing class's mapping"
    );
    let why = message(&out, "apps", "api", "Programmed");
    assert!(why.contains("4789") && why.contains("node"), "the message names the node and the port: {why}");
    let shown = lab.ip("edge-a", &["-d", "link", "show", "type", "vxlan"]).unwrap();
    assert!(!shown.contains("vxlan id 4401"), "no link of the refused class: {shown}");
    for client in ["client-1", "client-2"] {
        assert_maps(&lab, client, "203.0.113.9:27015", Udp, "game-0");
    }
}

/// A Single class on edge-a's enp1s0 with the given `vxlan` (YAML flow text), as YAML.
fn edge_class(name: &str, vxlan: &str) -> String {
    format!(
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMapClass\nmetadata: {{name: {name}}}\n\
         spec: {{nodes: {{edge-a: {{interfaces: [enp1s0]}}}}, returnPath: {{mode: Vxlan, vxlan: {vxlan}}}}}\n---\n"
    )
}

/// The lab's CLI as a user runs it: up (default topology and manifests, programmed by a
/// controller process and one executor process per node; it probes every mapping itself),
/// status (kuportctl's nodes table), probe, exec, apply (another PortMap, picked up from the
/// folder), down, which leaves no namespace, process or file behind.
#[test]
fn cli_up_probe_down() {
    if !root() {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_kuport-lab");
    let dir = std::env::temp_dir().join(format!("kuport-lab-cli-{}", std::process::id()));
    let extra = std::env::temp_dir().join(format!("kuport-lab-cli-manifests-{}", std::process::id()));
    struct Down<'a>(&'a str, &'a std::path::Path, &'a std::path::Path);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new(self.0).arg("down").env("KUPORT_LAB_DIR", self.1).output();
            let _ = std::fs::remove_dir_all(self.2);
        }
    }
    let _down = Down(bin, &dir, &extra);
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin).args(args).env("KUPORT_LAB_DIR", &dir).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, text) = run(&["up"]);
    assert!(ok, "up failed: {text}");
    assert!(
        text.contains("2 controller replica(s), leader pid") && text.contains("every node applied its state"),
        "{text}"
    );
    assert!(
        text.contains("probe client-1 (198.51.100.7) -> 203.0.113.9:27015/UDP: pod game-0 saw 198.51.100.7:"),
        "{text}"
    );
    assert!(text.contains("[client address intact]"), "{text}");
    let (ok, text) = run(&["up"]);
    assert!(!ok && text.contains("is up in"), "a second up is refused: {text}");
    let (ok, text) = run(&["status"]);
    assert!(ok && text.contains("PortMap games/game: Programmed=True"), "{text}");
    assert!(!text.contains("MISSING") && !text.contains("NOT RUNNING"), "{text}");
    let row = |name: &str| text.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_string();
    for node in ["edge-a", "worker-1", "worker-2"] {
        assert!(row(node).contains("connected") && row(node).contains(" yes "), "{node} synced:\n{text}");
    }
    assert!(row("worker-2").contains("100.64.0.12 mtu 1380"), "facts reported by worker-2's executor:\n{text}");
    assert!(text.contains("(leader)"), "{text}");
    assert!(text.contains("token refresher"), "the executors' tokens are refreshed while the lab lives:\n{text}");
    // kuportctl (`kubectl kuport`) with only the kubeconfig `up` wrote: no --controller, no
    // --token, no --ca-file; it finds the leader by its Lease.
    let kubeconfig = dir.join(kuport_lab::plane::trust::KUBECONFIG_FILE);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let nodes = rt
        .block_on(async {
            use kuport_controller::ctl;
            let mut sources =
                ctl::Sources { namespace: "kuport-system".into(), kubeconfig: Some(kubeconfig), ..Default::default() };
            sources.controller = ctl::discover(&sources).await?;
            let credentials = ctl::credentials(&sources).await?;
            let mut client = ctl::connect_with(&sources.controller, &credentials).await?;
            ctl::nodes(&mut client, ctl::Output::Text).await
        })
        .unwrap_or_else(|e| panic!("kuportctl nodes with only the lab's kubeconfig: {e}"));
    for node in ["edge-a", "worker-1", "worker-2"] {
        let row = nodes.lines().find(|l| l.starts_with(node)).unwrap_or_default();
        assert!(row.contains("connected") && !nodes.contains("not the leader"), "{node} from the leader:\n{nodes}");
    }
    // The objects and statuses live in the API server.
    let api: kuport_lab::apiserver::ApiServer =
        serde_json::from_str(&std::fs::read_to_string(dir.join("apiserver.json")).unwrap()).unwrap();
    let programmed = api
        .kubectl(
            &[
                "get",
                "pm",
                "-n",
                "games",
                "game",
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Programmed')].status}",
            ],
            None,
        )
        .unwrap();
    assert_eq!(programmed, "True", "the leader wrote the status");
    let (ok, text) = run(&["probe", "--from", "client-2", "--to", "203.0.113.9:27100", "--udp"]);
    assert!(ok && text.contains("pod game-0 saw 198.51.100.8:"), "{text}");
    let (ok, text) = run(&["exec", "worker-2", "--", "ip", "-br", "addr", "show", "dev", "wt0"]);
    assert!(ok && text.contains("100.64.0.12/16"), "{text}");

    // apply: the default manifests plus a TCP mapping to api-0.
    std::fs::create_dir_all(&extra).unwrap();
    for (name, text) in [
        ("classes.yaml", include_str!("../manifests/default/classes.yaml")),
        ("game.yaml", include_str!("../manifests/default/game.yaml")),
    ] {
        std::fs::write(extra.join(name), text).unwrap();
    }
    std::fs::write(extra.join("api.yaml"), port_map("apps", "api", "public", "TCP", "9000", "api", "api")).unwrap();
    let (ok, text) = run(&["apply", extra.to_str().unwrap()]);
    assert!(ok && text.contains("PortMap apps/api: Programmed=True"), "{text}");
    let (ok, text) = run(&["probe", "--from", "client-1", "--to", "203.0.113.9:9000"]);
    assert!(ok && text.contains("pod api-0 saw 198.51.100.7:"), "{text}");

    let record: kuport_lab::Record =
        serde_json::from_str(&std::fs::read_to_string(dir.join("lab.json")).unwrap()).unwrap();
    let plane = record.plane.clone().expect("the record names the processes");
    assert_eq!(plane.executors.len(), 3, "{plane:?}");
    let (ok, text) = run(&["down"]);
    assert!(ok, "down failed: {text}");
    let left = kuport_lab::sys::netns_list().unwrap();
    assert!(!left.iter().any(|n| n.starts_with(&record.id)), "namespaces left: {left:?}");
    let pids = record
        .servers
        .values()
        .chain(plane.executors.values())
        .chain(plane.controllers.iter().filter_map(|(_, pid)| pid.as_ref()))
        .chain(plane.kubelet.iter());
    for pid in pids {
        assert!(!kuport_lab::plane::alive(*pid), "process {pid} still runs");
    }
    assert!(!dir.exists(), "the state dir is removed");
}

/// A published port reaches only what it publishes (docs/portmap/datapath.md, "kup-pre"):
/// client-2, whose default route is edge-a, sends to client-1's address on the published ports.
/// edge-a routes those packets on to client-1; only what is addressed to edge-a's own published
/// address is delivered to the pods. With the publish maps as they were before (keyed by
/// interface, protocol and port only), edge-a delivered them to the pods: game-0 and web-0 take
/// traffic meant for another host.
#[test]
fn a_published_port_catches_only_what_is_addressed_to_the_node() {
    use common::boundary::{publish_maps_of_any_destination, receive, socket};
    use kuport_lab::probe::parse_target;
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let m = Manifests::default_lab().add("web.yaml", &port_map("web", "web", "public", "TCP", "3000", "web", "http"));
    let out = kuport_lab::program::compute(&mut lab, &m.expect("loads"));
    let full = out.node_states;
    let mut old = full.clone();
    publish_maps_of_any_destination(host_state(&mut old, "edge-a"));
    for (label, states) in [("keyed by the destination", &full), ("the old maps", &old)] {
        kuport_lab::program::apply(&mut lab, states).expect("applies");
        // The published address still works.
        assert_maps(&lab, "client-2", "203.0.113.9:27015", Udp, "game-0");
        assert_maps(&lab, "client-2", "203.0.113.9:3000", Tcp, "web-0");
        assert_maps_any(&lab, "client-2", "[2001:db8::9]:3000", Tcp, "web-0");
        // Routed through edge-a to client-1, on the published ports.
        let at_client1 = socket(&lab, "client-1", "0.0.0.0:27015", Duration::from_secs(1));
        let from = socket(&lab, "client-2", "0.0.0.0:0", Duration::from_secs(1));
        from.send_to(b"through", "198.51.100.7:27015").unwrap();
        let udp = receive(&at_client1);
        let tcp = lab.probe_with("client-2", addr("198.51.100.7:3000"), Tcp, Duration::from_secs(1));
        let tcp6 = lab.probe_any_with(
            "client-2",
            parse_target("[2001:db8:100::7]:3000").unwrap(),
            Tcp,
            Duration::from_secs(1),
        );
        println!("{label}: UDP to client-1 -> {udp:?}; TCP -> {tcp:?}; TCP over IPv6 -> {tcp6:?}");
        if std::ptr::eq(states, &full) {
            let (payload, src) = udp.expect("client-1 receives what was sent to it");
            assert_eq!(
                (payload.as_str(), src.as_str()),
                ("through", &*format!("198.51.100.8:{}", from.local_addr().unwrap().port()))
            );
            assert!(tcp.is_err(), "no pod answers for client-1's address: {tcp:?}");
            assert!(tcp6.is_err(), "no pod answers for client-1's IPv6 address: {tcp6:?}");
        } else {
            assert!(udp.is_none(), "the old maps took the datagram meant for client-1");
            assert_eq!(tcp.expect("web-0 answers for client-1's address").pod, "web-0");
            assert_eq!(tcp6.expect("web-0 answers for client-1's IPv6 address").pod, "web-0");
        }
    }
}

/// Links accept only their peer (docs/portmap/datapath.md, "kup-links"): api-0, a pod on
/// worker-2, builds a VXLAN device of its own with the VNI and port of worker-2's link from
/// edge-a and sends a datagram with a forged client address (198.51.100.66) to worker-2's end
/// of the link, port 7000, which edge-a publishes to push-0. worker-2 drops it before
/// decapsulation and counts it; push-0 receives only the real client's datagrams, sent over
/// the link before, between and after the forged ones.
#[test]
fn a_pods_forged_vxlan_packet_is_dropped_and_counted_while_the_link_flows() {
    use common::boundary::{Forger, PUSH, drop_counter, push_lab, receive, socket};
    if !root() {
        return;
    }
    let (mut lab, mut states) = push_lab(Cni::Cilium);
    kuport_lab::program::apply(&mut lab, &states).expect("applies");
    for node in ["edge-a", "worker-2"] {
        common::boundary::assert_lists_as_computed(&lab, &mut states, node);
    }
    let pod = socket(&lab, "push-0", "0.0.0.0:7000", Duration::from_secs(1));
    let client = socket(&lab, "client-1", "0.0.0.0:0", Duration::from_secs(1));
    let forger = Forger::new(&lab, &mut states, "worker-2", "api-0", Ipv4Addr::new(198, 51, 100, 66));
    let before = drop_counter(&lab, "worker-2", "kup-links");
    println!("kup-links drops before the attack: {before}");
    for i in 0..3 {
        client.send_to(format!("real {i}").as_bytes(), PUSH).unwrap();
        forger.send(
            &lab,
            "api-0",
            std::net::SocketAddrV4::new(forger.link_end, 7000),
            format!("forged {i}").as_bytes(),
        );
    }
    client.send_to(b"real 3", PUSH).unwrap();
    let mut got = Vec::new();
    while let Some(r) = receive(&pod) {
        got.push(r);
    }
    let after = drop_counter(&lab, "worker-2", "kup-links");
    println!("push-0 received {got:?}; worker-2's kup-links drops {before} -> {after}");
    assert_eq!(after - before, 3, "each forged packet dropped and counted");
    assert_eq!(got.len(), 4, "every real datagram arrives: {got:?}");
    for (i, (payload, src)) in got.iter().enumerate() {
        assert_eq!(payload, &format!("real {i}"));
        assert!(src.starts_with("198.51.100.7:"), "from the real client: {src}");
    }
}

/// Return marking only for replies of published flows (docs/portmap/datapath.md, "kup-mangle"):
/// api-0, a pod beside game-0 on worker-2, reaches game-0 directly on its published port. The
/// answer is not a reply of a flow the link brought in, so worker-2 does not mark it for the
/// link (no element of the return mark map counts it) and api-0 gets it by the pod network. The
/// return mark as it was (any packet from the pod's address and port) marked it for the link.
#[test]
fn a_pods_answer_to_a_flow_not_from_the_link_stays_out_of_the_link() {
    use common::boundary::{element_packets, return_mark_on_any_packet};
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let out = kuport_lab::program::compute(&mut lab, &Manifests::default_lab());
    let full = out.node_states;
    let mut old = full.clone();
    return_mark_on_any_packet(host_state(&mut old, "worker-2"));
    for (label, states) in [("replies only", &full), ("the old mark", &old)] {
        kuport_lab::program::apply(&mut lab, states).expect("applies");
        let before = element_packets(&lab, "worker-2", "return_mark_range");
        assert_maps(&lab, "client-1", "203.0.113.9:27015", Udp, "game-0");
        let between = element_packets(&lab, "worker-2", "return_mark_range");
        let a = lab.probe_with("api-0", addr("10.244.2.107:27016"), Udp, Duration::from_secs(1));
        let after = element_packets(&lab, "worker-2", "return_mark_range");
        println!("{label}: api-0 -> game-0: {a:?}; return marks counted {before} -> {between} -> {after}");
        assert_eq!(between - before, 1, "{label}: the client's reply is marked for the link");
        if std::ptr::eq(states, &full) {
            let a = a.expect("api-0 gets game-0's answer");
            assert_eq!((a.pod.as_str(), *a.seen.ip()), ("game-0", Ipv4Addr::new(10, 244, 2, 9)));
            assert_eq!(after, between, "game-0's answer to api-0 is not marked");
        } else {
            assert_eq!(after - between, 1, "the old mark marked game-0's answer to api-0 for the link");
        }
    }
}
