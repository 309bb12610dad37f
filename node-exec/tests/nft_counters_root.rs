//! The counter read (docs/operations/counters.md) against counters `nft` itself sets: a table
//! loaded by `nft -f tests/data/counters_inet.nft` with elements and rules whose counters start
//! at given values reads back exactly those, by element key and by rule position, leaving out
//! what is at 0. And the whole read the controller asks an executor for: its links' statistics
//! as `ip -s link` shows them and its pods' tables as `nft` shows them in their namespaces.
//! Fails when not run as root unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
#[path = "common/netns.rs"]
mod netns;
use host::{root, run};
use netns::Netns;

use kuport_node_exec::nft::read_counters as read_table;
use kuport_node_exec::sync::{NodeApplier, NodeKeepers, read_counters};
use kuport_proto::build::{
    addr, base_chain, counter, eq, ifname, lookup, member, port, ports, proto, rule, set, table,
};
use kuport_proto::netns as target;
use kuport_proto::v1::{
    Address, ChainCounters, ChainPolicy, ChainType, ElementCount, Hook, L4Proto, Link, LinkCounters, NetnsState,
    NftFamily, NftSet, NftType, NodeState, PodRef, RuleCount, Selector, SetCounters, Vxlan, link,
};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/counters_inet.nft");

#[test]
fn counters_read_back_as_nft_set_them() {
    if !root() {
        return;
    }
    let ns = Netns::new("counters", "read");
    assert_eq!(read_table(Some(&ns.path()), NftFamily::Inet, "kuport-count").expect("read"), None, "no table yet");
    ns.nft(&["-f", FILE]);
    let read = read_table(Some(&ns.path()), NftFamily::Inet, "kuport-count").expect("read").expect("the table");
    let a: std::net::IpAddr = "203.0.113.9".parse().expect("address");
    let single =
        ElementCount { key: vec![ifname("eth0"), addr(a), proto(L4Proto::Tcp), port(3000)], packets: 5, bytes: 300 };
    let range = ElementCount {
        key: vec![ports(27015, 27115), ifname("eth0"), addr(a), proto(L4Proto::Udp)],
        packets: 9,
        bytes: 900,
    };
    assert_eq!(
        read.sets,
        vec![
            SetCounters { name: "steer_port".into(), elements: vec![single] },
            SetCounters { name: "steer_range".into(), elements: vec![range] },
        ],
        "port 3001's element is at 0 and left out"
    );
    assert_eq!(
        read.chains,
        vec![ChainCounters {
            name: "kup-limit-bb8".into(),
            rules: vec![RuleCount { index: 1, packets: 7, bytes: 70 }]
        }],
        "the second rule, by position; the first is at 0, the third has no counter"
    );
}

/// The VXLAN link the host state names.
const DEV: &str = "kup-cnt";

/// An address for this test process's pod: unique among concurrent runs.
fn pod_address() -> String {
    let pid = std::process::id();
    format!("10.{}.{}.{}", 150 + (pid >> 16) % 50, (pid >> 8) % 256, pid % 254 + 1)
}

/// `ip -s -j link show DEV` in `ns`: the oracle of a link's counters, as the report's fields.
fn ip_stats(ns: &Netns, dev: &str) -> LinkCounters {
    let out = ns.ip(&["-s", "-j", "link", "show", dev]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("ip's JSON");
    let l = &v[0];
    let n = |dir: &str, what: &str| l["stats64"][dir][what].as_u64().unwrap_or_else(|| panic!("{dir}.{what}: {out}"));
    LinkCounters {
        name: l["ifname"].as_str().expect("ifname").to_string(),
        mtu: l["mtu"].as_u64().expect("mtu") as u32,
        up: l["flags"].as_array().expect("flags").iter().any(|f| f == "UP"),
        rx_packets: n("rx", "packets"),
        rx_bytes: n("rx", "bytes"),
        rx_errors: n("rx", "errors"),
        rx_dropped: n("rx", "dropped"),
        tx_packets: n("tx", "packets"),
        tx_bytes: n("tx", "bytes"),
        tx_errors: n("tx", "errors"),
        tx_dropped: n("tx", "dropped"),
    }
}

/// Whether each of `read`'s counters lies between the oracle's before and after it.
fn between(before: &LinkCounters, read: &LinkCounters, after: &LinkCounters) -> bool {
    let f = |l: &LinkCounters| {
        [l.rx_packets, l.rx_bytes, l.rx_errors, l.rx_dropped, l.tx_packets, l.tx_bytes, l.tx_errors, l.tx_dropped]
    };
    let (b, r, a) = (f(before), f(read), f(after));
    (0..b.len()).all(|i| b[i] <= r[i] && r[i] <= a[i])
}

/// `nft -j list table inet NAME` in `ns`: each counted set element's (packets, bytes) at more
/// than 0, and each rule's counter by chain and position, as nft itself shows them.
fn nft_counts(ns: &Netns, name: &str) -> (Vec<(u64, u64)>, Vec<ChainCounters>) {
    let out = ns.nft(&["-j", "list", "table", "inet", name]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("nft's JSON");
    let counter = |c: &serde_json::Value| (c["packets"].as_u64().unwrap_or(0), c["bytes"].as_u64().unwrap_or(0));
    let mut elements = Vec::new();
    let mut chains: Vec<ChainCounters> = Vec::new();
    for o in v["nftables"].as_array().expect("nftables") {
        for e in o["set"]["elem"].as_array().into_iter().flatten() {
            let (p, b) = counter(&e["elem"]["counter"]);
            if p > 0 {
                elements.push((p, b));
            }
        }
        let rule = &o["rule"];
        if let Some(chain) = rule["chain"].as_str() {
            let index = chains.iter().find(|c| c.name == chain).map_or(0, |c| c.rules.len() as u32);
            let at = match chains.iter().position(|c| c.name == chain) {
                Some(i) => i,
                None => {
                    chains.push(ChainCounters { name: chain.to_string(), rules: Vec::new() });
                    chains.len() - 1
                }
            };
            let count = rule["expr"].as_array().into_iter().flatten().find_map(|x| x.get("counter")).map(counter);
            // Every rule takes a position; only a counted one at more than 0 is reported.
            chains[at].rules.push(RuleCount {
                index,
                packets: count.map_or(0, |c| c.0),
                bytes: count.map_or(0, |c| c.1),
            });
        }
    }
    for c in &mut chains {
        c.rules.retain(|r| r.packets > 0);
    }
    chains.retain(|c| !c.rules.is_empty());
    elements.sort();
    (elements, chains)
}

/// The counter read the controller asks for (`ReadCounters`, answered by `read_counters` from
/// the real applier), after a state with a VXLAN link and a pod's table is applied in scratch
/// namespaces: the link's statistics are those `ip -s link` shows (its packets moved with the
/// traffic sent over it), a link the kernel lacks is left out, and the pod's table counters are
/// those `nft list table` shows inside the pod's namespace; a pod that cannot be found, or whose
/// namespace went, says why while the rest is still read; and reading repairs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_read_reports_links_and_pod_tables_as_ip_and_nft_show_them() {
    if !root() {
        return;
    }
    let host = Netns::new("counters", "host");
    let remote = Netns::new("counters", "remote");
    let sandbox = Netns::new("counters", "pod");
    // The underlay between the host and the link's far end, which is made by hand.
    host.ip(&["link", "add", "u0", "type", "veth", "peer", "name", "u1", "netns", &remote.name]);
    host.ip(&["addr", "add", "10.77.0.1/24", "dev", "u0"]);
    host.ip(&["link", "set", "u0", "up"]);
    remote.ip(&["addr", "add", "10.77.0.2/24", "dev", "u1"]);
    remote.ip(&["link", "set", "u1", "up"]);
    let vxlan = ["type", "vxlan", "id", "4242", "local", "10.77.0.2", "remote", "10.77.0.1", "dstport", "4789"];
    remote.ip(&[&["link", "add", "vx0"][..], &vxlan[..]].concat());
    remote.ip(&["addr", "add", "169.254.80.1/31", "dev", "vx0"]);
    remote.ip(&["link", "set", "vx0", "up"]);
    // The pod's sandbox: found by its address.
    let address = pod_address();
    sandbox.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "eth0-peer"]);
    sandbox.ip(&["addr", "add", &format!("{address}/32"), "dev", "eth0"]);
    sandbox.ip(&["link", "set", "eth0", "up"]);

    let link = Link {
        name: DEV.into(),
        mtu: 1400,
        kind: Some(link::Kind::Vxlan(Vxlan {
            vni: 4242,
            local: "10.77.0.1".into(),
            remote: "10.77.0.2".into(),
            dstport: 4789,
            ttl: 64,
        })),
        mac: String::new(),
    };
    let host_entry = NetnsState {
        target: target::host(),
        links: vec![link],
        addresses: vec![Address { dev: DEV.into(), cidr: "169.254.80.0/31".into() }],
        ..Default::default()
    };
    // An interception-style table: a counted set of ports and a counted rule.
    let ports = NftSet {
        counter: true,
        ..set(
            "ports",
            &[NftType::InetProto, NftType::InetService],
            &[],
            vec![member(vec![proto(L4Proto::Udp), port(7000)]), member(vec![proto(L4Proto::Udp), port(7001)])],
        )
    };
    let input = base_chain(
        "input",
        ChainType::Filter,
        Hook::Input,
        0,
        ChainPolicy::Accept,
        vec![
            rule(vec![lookup(&[Selector::L4proto, Selector::ThDport], "ports")], vec![]),
            rule(vec![eq(Selector::UdpDport, port(7002))], vec![counter()]),
        ],
    );
    let pod = PodRef { namespace: "apps".into(), name: "web-0".into(), uid: "u-1".into(), addresses: vec![address] };
    let pod_entry = NetnsState {
        target: target::pod(pod.clone()),
        nft_tables: vec![table(NftFamily::Inet, "kuport-intercept", vec![ports], vec![input])].into(),
        ..Default::default()
    };
    let missing =
        PodRef { name: "nowhere".into(), uid: "u-2".into(), addresses: vec!["10.255.255.254".into()], ..pod.clone() };
    let missing_entry = NetnsState { target: target::pod(missing.clone()), ..pod_entry.clone() };
    let mut state = NodeState { node: "n".into(), netns: vec![host_entry, pod_entry, missing_entry] };
    kuport_proto::canonicalize(&mut state);
    let mut keepers = NodeKeepers::new(Some(host.path()));
    let refused = keepers.apply(state).await.expect_err("the missing pod is refused");
    assert_eq!(refused.len(), 1, "only the missing pod: {refused:?}");

    let first = read_counters(&keepers, 1).await;
    assert_eq!(first.error, "", "{first:?}");
    let start = first.links.iter().find(|l| l.name == DEV).cloned().expect("the link is read");

    // Traffic over the link: UDP to its far end (which answers ARP, and ICMP unreachable).
    let send = |ns: &Netns, to: &str, port: u32, n: u32| {
        let script =
            format!("for i in $(seq {n}); do echo x 2>/dev/null >/dev/udp/{to}/{port} || true; sleep 0.05; done");
        run("ip", &["netns", "exec", &ns.name, "bash", "-c", &script]);
    };
    send(&host, "169.254.80.1", 9, 10);
    // Into the pod: 3 packets its set counts, 2 its rule counts, 1 neither (port 7003).
    send(&sandbox, "127.0.0.1", 7000, 3);
    send(&sandbox, "127.0.0.1", 7002, 2);
    send(&sandbox, "127.0.0.1", 7003, 1);

    let before = ip_stats(&host, DEV);
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let took = std::time::Instant::now();
    let r = read_counters(&keepers, 2).await;
    let took = took.elapsed();
    let after = ip_stats(&host, DEV);
    println!("the read took {took:?}");
    println!("oracle before {before:?}\nread {:?}\noracle after {after:?}", r.links);
    assert_eq!((r.id, r.error.as_str()), (2, ""));
    assert!(r.read_unix_seconds >= clock && r.read_unix_seconds <= clock + 5, "{} vs {clock}", r.read_unix_seconds);
    assert_eq!(r.links.len(), 1, "{:?}", r.links);
    let l = &r.links[0];
    assert_eq!((l.name.as_str(), l.mtu, l.up), (DEV, 1400, true));
    assert_eq!((before.mtu, before.up), (1400, true), "ip agrees");
    assert!(between(&before, l, &after), "as ip -s link shows them:\n{before:?}\n{l:?}\n{after:?}");
    assert!(l.tx_packets >= start.tx_packets + 10, "the 10 datagrams went out: {start:?} -> {l:?}");
    assert!(l.rx_packets > start.rx_packets, "the far end's answers came in: {start:?} -> {l:?}");
    assert!(r.peers.is_empty(), "no WireGuard device");

    // A link the kernel lacks is left out of the same read.
    let names = [DEV.to_string(), "kup-absent".to_string()];
    let read = kuport_node_exec::rtnl::link_counters(Some(&host.path()), &names).expect("read");
    assert_eq!(read.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), [DEV]);

    // The pods: the found one's table as nft shows it in its namespace; the missing one says why.
    assert_eq!(r.pods.len(), 2, "{:?}", r.pods);
    let found = r.pods.iter().find(|p| p.pod.as_ref() == Some(&pod)).expect("the found pod");
    assert_eq!(found.error, "");
    assert_eq!(found.tables.len(), 1, "{found:?}");
    let t = &found.tables[0];
    let (elements, chains) = nft_counts(&sandbox, "kuport-intercept");
    let ours: Vec<(u64, u64)> = t.sets.iter().flat_map(|s| s.elements.iter().map(|e| (e.packets, e.bytes))).collect();
    assert_eq!(ours, elements, "the set's elements as nft shows them: {t:?}");
    assert_eq!(t.sets.len(), 1);
    assert_eq!(t.sets[0].elements.len(), 1, "port 7001's element is at 0 and left out");
    let e = &t.sets[0].elements[0];
    assert_eq!((e.key.clone(), e.packets), (vec![proto(L4Proto::Udp), port(7000)], 3));
    assert_eq!(t.chains, chains, "the rules as nft shows them");
    assert_eq!(
        t.chains.iter().flat_map(|c| c.rules.iter().map(|r| (r.index, r.packets))).collect::<Vec<_>>(),
        [(1, 2)]
    );
    let gone = r.pods.iter().find(|p| p.pod.as_ref() == Some(&missing)).expect("the missing pod");
    assert!(gone.tables.is_empty());
    assert_eq!(gone.error, "not programmed: network namespace not found on this node");
    // Reading changed nothing: no keeper found drift to repair.
    assert_eq!(keepers.drift(), (0, vec![]), "the reads wrote nothing the keepers watch");

    // The pod's namespace goes: its keeper ends, and the read says so instead of reading the
    // dead namespace its second hold still keeps alive.
    drop(sandbox);
    let started = std::time::Instant::now();
    while keepers.namespaces().iter().any(|k| k.starts_with("pod apps/web-0")) {
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "the pod's keeper did not end");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let r = read_counters(&keepers, 3).await;
    let ended = r.pods.iter().find(|p| p.pod.as_ref() == Some(&pod)).expect("the pod is still in the state");
    assert!(ended.tables.is_empty(), "{ended:?}");
    assert!(ended.error.starts_with("its network namespace is no longer reachable"), "{}", ended.error);
    assert_eq!((r.error.as_str(), r.links.len()), ("", 1), "the others are still read");
}
