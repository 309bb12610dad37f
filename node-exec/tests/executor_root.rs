//! Root tests of `kuport_node_exec::executor` against a real kernel, each in a scratch namespace.
//! The desired states are the controller's, computed from examples/cluster (and edited copies
//! of it); the oracles are `nft -s list` (against kuport_proto::text) and `ip`.
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
#[path = "common/keeper.rs"]
mod keeper;
use host::{root, run};
use keeper::Keeper;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use kuport_controller::{
    compute::{Settings, compute},
    render::load_dir,
};
use kuport_node_exec::executor::{ExecError, Executor};
use kuport_proto::{
    owned,
    v1::{NetnsState, NftFamily, NftTable, NodeState, Route, link},
};

/// The examples' clock: every PortMap is older than this.
const NOW: &str = "2026-11-29T00:00:00Z";
/// How long an outside change may stay unrepaired.
const REPAIR_WITHIN: Duration = Duration::from_secs(1);

/// A scratch network namespace, deleted on drop (also when the test fails).
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!("kuport-ex-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        run("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.name))
    }

    fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    fn nft(&self, args: &[&str]) -> String {
        let mut all = vec!["netns", "exec", &self.name, "nft"];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    fn has_table(&self) -> bool {
        self.nft(&["list", "tables"]).lines().any(|l| l.trim() == format!("table ip {}", owned::NFT_TABLE))
    }

    /// The underlay addresses the state's links use, on lo: there are no dummy links on CI.
    fn underlay(&self, s: &NetnsState) {
        for l in &s.links {
            let have = self.ip(&["-4", "-o", "addr", "show", "dev", "lo"]);
            if let Some(link::Kind::Vxlan(v)) = &l.kind
                && !have.contains(&format!("inet {}/32 ", v.local))
            {
                self.ip(&["addr", "add", &format!("{}/32", v.local), "dev", "lo"]);
            }
        }
    }

    fn ifindex(&self, dev: &str) -> String {
        self.ip(&["-o", "link", "show", dev]).split(':').next().unwrap_or_default().to_string()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster")
}

/// Every node's host-namespace state as the controller computes it from `dir`.
fn states(dir: &Path) -> Vec<(String, NetnsState)> {
    let cluster = load_dir(dir, NOW.parse().expect("timestamp")).expect("the example cluster loads");
    let out = compute(&cluster, &Settings::default());
    out.node_states
        .into_iter()
        .map(|(node, s)| {
            assert!(s.netns.len() <= 1, "{node}: only the host namespace is expected");
            (node, s.netns.first().cloned().unwrap_or_default())
        })
        .collect()
}

fn node_state(dir: &Path, node: &str) -> NetnsState {
    states(dir).into_iter().find(|(n, _)| n == node).map(|(_, s)| s).unwrap_or_default()
}

/// An editable copy of examples/cluster.
struct Cluster {
    dir: PathBuf,
}

impl Cluster {
    fn copy() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir =
            std::env::temp_dir().join(format!("kuport-ex-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        std::fs::create_dir_all(&dir).expect("temp dir");
        for e in std::fs::read_dir(examples()).expect("examples") {
            let p = e.expect("entry").path();
            std::fs::copy(&p, dir.join(p.file_name().expect("name"))).expect("copy");
        }
        Cluster { dir }
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).expect("read")
    }

    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.dir.join(file), text).expect("write");
    }

    /// Replaces `from` (which must occur) by `to` in `file`.
    fn edit(&self, file: &str, from: &str, to: &str) {
        let text = self.read(file);
        assert!(text.contains(from), "{file} has no {from:?}");
        self.write(file, &text.replace(from, to));
    }

    fn remove(&self, file: &str) {
        std::fs::remove_file(self.dir.join(file)).expect("remove");
    }

    fn state(&self, node: &str) -> NetnsState {
        node_state(&self.dir, node)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `ip route show table N` for a desired route: `ip` omits the protocol (boot) and a /32.
/// A route as `ip route` (or `ip -6 route`, with its metric and preference) prints it.
fn route_line(r: &Route) -> String {
    let v6 = r.dst.contains(':') || r.via.contains(':');
    let mut s = r.dst.strip_suffix(if v6 { "/128" } else { "/32" }).unwrap_or(&r.dst).to_string();
    if !r.via.is_empty() {
        s += &format!(" via {}", r.via);
    }
    s += &format!(" dev {}", r.dev);
    if v6 {
        s += " metric 1024 pref medium";
    } else if r.via.is_empty() {
        s += " scope link";
    }
    s
}

fn table_name(t: u32) -> String {
    if t == owned::MAIN_TABLE { "main".into() } else { t.to_string() }
}

/// How `nft list` may order a set's elements.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// As rendered: the table was loaded whole.
    Exact,
    /// Any: elements added in place to an interval set are listed in insertion order.
    AnyElementOrder,
}

/// The listing with each `elements = { ... }` block's entries sorted.
fn sorted_elements(text: &str) -> String {
    let mut out = String::new();
    let mut block: Option<(String, Vec<String>)> = None;
    for line in text.lines() {
        let (head, rest) = match (&mut block, line.split_once("elements = { ")) {
            (None, Some((indent, rest))) => (Some(format!("{indent}elements = {{ ")), rest),
            (None, None) => {
                out.push_str(line);
                out.push('\n');
                continue;
            }
            (Some(_), _) => (None, line.trim_start()),
        };
        if let Some(h) = head {
            block = Some((h, Vec::new()));
        }
        let Some((_, entries)) = &mut block else { continue };
        let done = rest.ends_with(" }");
        entries.push(rest.trim_end_matches(" }").trim_end_matches(',').to_string());
        if done && let Some((h, mut entries)) = block.take() {
            entries.sort();
            out.push_str(&format!("{h}{} }}\n", entries.join(", ")));
        }
    }
    out
}

/// Asserts the namespace holds exactly `s`: kuport's table lists as rendered (or is absent),
/// and kuport's links, addresses, rules and routes are exactly the desired ones.
fn assert_exactly(ns: &Netns, s: &NetnsState) {
    assert_state(ns, s, Order::Exact)
}

fn assert_state(ns: &Netns, s: &NetnsState, order: Order) {
    let own = s.nft_tables.iter().find(|t| t.family == NftFamily::Inet as i32 && t.name == owned::NFT_TABLE);
    match own {
        Some(t) => {
            let (listed, rendered) =
                (ns.nft(&["-s", "list", "table", "inet", owned::NFT_TABLE]), kuport_proto::text::nft_table(t));
            if order == Order::Exact {
                assert_eq!(listed, rendered, "nft list differs from the rendering");
            } else {
                assert_eq!(sorted_elements(&listed), sorted_elements(&rendered), "nft list differs from the rendering");
            }
        }
        None => assert!(!ns.has_table(), "kuport's table must be gone"),
    }

    // Links: exactly the desired kup- links, each with its attributes.
    let links: BTreeSet<String> = ns
        .ip(&["-o", "link", "show"])
        .lines()
        .filter_map(|l| l.split(": ").nth(1).map(|n| n.split('@').next().unwrap_or(n).to_string()))
        .filter(|n| n.starts_with(owned::LINK_PREFIX))
        .collect();
    let want: BTreeSet<String> = s.links.iter().map(|l| l.name.clone()).collect();
    assert_eq!(links, want, "kup- links");
    for l in &s.links {
        let shown = ns.ip(&["-d", "link", "show", &l.name]);
        assert!(shown.contains(&format!(" mtu {} ", l.mtu)), "{shown}");
        assert!(shown.contains(",UP"), "{shown}");
        let Some(link::Kind::Vxlan(v)) = &l.kind else { panic!("{}: not a vxlan link", l.name) };
        let attrs = format!("vxlan id {} remote {} local {} ", v.vni, v.remote, v.local);
        assert!(shown.contains(&attrs), "{attrs} not in {shown}");
        assert!(shown.contains(&format!("dstport {} ", v.dstport)), "{shown}");
        assert!(shown.contains(&format!("ttl {} ", v.ttl)), "{shown}");
        if !l.mac.is_empty() {
            assert!(shown.contains(&format!("link/ether {} ", l.mac)), "{shown}");
        }
    }

    // Permanent neighbour entries on kup- links: exactly the desired ones.
    let neighbours: BTreeSet<String> = ns
        .ip(&["neigh", "show", "nud", "permanent"])
        .lines()
        .filter(|l| l.contains(" dev kup-"))
        .map(|l| l.trim().to_string())
        .collect();
    let want: BTreeSet<String> =
        s.neighbours.iter().map(|n| format!("{} dev {} lladdr {} PERMANENT", n.address, n.dev, n.mac)).collect();
    assert_eq!(neighbours, want, "permanent neighbours on kup- links");

    // Addresses on kup- links.
    let addrs: BTreeSet<(String, String)> = ns
        .ip(&["-o", "addr", "show"])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Both families; not the kernel's own fe80:: on the link.
            let family = matches!(f.get(2), Some(&"inet") | Some(&"inet6"));
            (f.get(1)?.starts_with(owned::LINK_PREFIX) && family && !f.get(3)?.starts_with("fe80:"))
                .then(|| (f[1].to_string(), f.get(3).unwrap_or(&"").to_string()))
        })
        .collect();
    let want: BTreeSet<(String, String)> = s.addresses.iter().map(|a| (a.dev.clone(), a.cidr.clone())).collect();
    assert_eq!(addrs, want, "addresses on kup- links");

    // Rules under kuport's mark prefix, as `ip rule` prints them (it omits a full mask and /32).
    let rules: BTreeSet<String> = [ns.ip(&["rule"]), ns.ip(&["-6", "rule"])]
        .iter()
        .flat_map(|out| out.lines().filter(|l| l.contains("fwmark 0x6b70")).map(|l| l.to_string()).collect::<Vec<_>>())
        .collect();
    let want: BTreeSet<String> = s
        .ip_rules
        .iter()
        .map(|r| {
            let to = if r.to.is_empty() { String::new() } else { format!("to {} ", r.to.trim_end_matches("/32")) };
            // `ip -6 rule` prints the same line; the family is in which listing holds it.
            let mask = if r.fwmask == u32::MAX { String::new() } else { format!("/{:#x}", r.fwmask) };
            format!("{}:\tfrom all {to}fwmark {:#x}{mask} lookup {}", r.pref, r.fwmark, table_name(r.table))
        })
        .collect();
    assert_eq!(rules, want, "kuport's rules");
    assert!(s.ip_rules.iter().all(|r| [owned::PREF_LOOP_GUARD, owned::PREF_DIVERT].contains(&r.pref)));

    // Routes: every table the state names holds exactly its routes; no route uses a kup- link
    // that is not desired; the link tables kuport used before are empty.
    let tables: BTreeSet<u32> = s.routes.iter().map(|r| r.table).collect();
    for t in &tables {
        let t_ = t.to_string();
        // `ip -6 route` fails on a table the kernel has no IPv6 route in.
        let v6 = s.routes.iter().any(|r| r.table == *t && (r.dst.contains(':') || r.via.contains(':')));
        let mut shown: BTreeSet<String> =
            ns.ip(&["route", "show", "table", &t_]).lines().map(|l| l.trim().to_string()).collect();
        if v6 {
            shown.extend(ns.ip(&["-6", "route", "show", "table", &t_]).lines().map(|l| l.trim().to_string()));
        }
        let want: BTreeSet<String> = s.routes.iter().filter(|r| r.table == *t).map(route_line).collect();
        assert_eq!(shown, want, "routes of table {t}");
    }
    let all = ns.ip(&["route", "show", "table", "all"]);
    for line in all.lines().filter(|l| l.contains(" dev kup-") && !l.contains("proto kernel")) {
        let dev = line.split(" dev ").nth(1).and_then(|d| d.split_whitespace().next()).unwrap_or_default();
        assert!(s.links.iter().any(|l| l.name == dev), "leftover route {line}");
    }
    for line in all.lines().filter(|l| l.contains(" table ") && !l.contains("table local")) {
        let t: u32 = line.split(" table ").nth(1).and_then(|t| t.split_whitespace().next()?.parse().ok()).unwrap_or(0);
        assert!(t == 0 || tables.contains(&t), "leftover route in table {t}: {line}");
    }
}

fn apply(ex: &mut Executor, s: &NetnsState) -> usize {
    ex.apply(s).unwrap_or_else(|e| panic!("apply: {e}")).writes
}

/// Applies `s`, checks it is exactly there, and that applying it again writes nothing.
fn apply_exactly(ns: &Netns, ex: &mut Executor, s: &NetnsState) {
    apply_ordered(ns, ex, s, Order::Exact)
}

/// [`apply_exactly`] for a transition: set elements may list in insertion order.
fn transition(ns: &Netns, ex: &mut Executor, s: &NetnsState) {
    apply_ordered(ns, ex, s, Order::AnyElementOrder)
}

fn apply_ordered(ns: &Netns, ex: &mut Executor, s: &NetnsState, order: Order) {
    ns.underlay(s);
    let writes = apply(ex, s);
    assert_state(ns, s, order);
    assert_eq!(apply(ex, s), 0, "re-apply must write nothing (first apply wrote {writes})");
    assert!(ex.differences(s).expect("diff").is_empty());
    // A fresh executor (a restarted process) finds nothing to do either.
    assert_eq!(apply(&mut Executor::new(Some(ns.path())), s), 0);
}

#[test]
fn every_example_node_state_applies_exactly_and_reapplies_without_writes() {
    if !root() {
        return;
    }
    let all = states(&examples());
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    for node in ["edge-a", "worker-1", "worker-2"] {
        assert!(names.contains(&node), "{node} missing from {names:?}");
    }
    for (node, s) in &all {
        println!("node {node}: {} link(s), {} table(s)", s.links.len(), s.nft_tables.len());
        let ns = Netns::new();
        let mut ex = Executor::new(Some(ns.path()));
        apply_exactly(&ns, &mut ex, s);
    }
}

/// Issue 2's golden scenarios, each node's state applied to a fresh namespace.
#[test]
fn every_golden_node_state_applies_exactly_and_reapplies_without_writes() {
    if !root() {
        return;
    }
    for (scenario, world) in kuport_controller::compute::testkit::scenarios() {
        for (node, state) in world.run().node_states {
            for s in &state.netns {
                println!("{scenario}/{node}: {} link(s), {} table(s)", s.links.len(), s.nft_tables.len());
                let ns = Netns::new();
                let mut ex = Executor::new(Some(ns.path()));
                apply_exactly(&ns, &mut ex, s);
            }
        }
    }
}

#[test]
fn a_local_pod_only_state_applies_exactly() {
    if !root() {
        return;
    }
    // edge-a without the game: the web pod is local, so no link at all.
    let c = Cluster::copy();
    c.remove("game.yaml");
    let s = c.state("edge-a");
    assert!(s.links.is_empty() && !s.nft_tables.is_empty(), "{s:?}");
    let ns = Netns::new();
    apply_exactly(&ns, &mut Executor::new(Some(ns.path())), &s);
}

#[test]
fn transitions_reach_exactly_the_new_state() {
    if !root() {
        return;
    }
    let c = Cluster::copy();
    let ns = Netns::new();
    let mut ex = Executor::new(Some(ns.path()));
    let node = "edge-a";

    let base = c.state(node);
    assert_eq!(base.links.len(), 1, "edge-a has one link, to worker-2");
    apply_exactly(&ns, &mut ex, &base);

    // Add a mapping: a second local web app.
    let web2 = c.read("web.yaml").replace("name: web", "name: web2").replace("10.244.18.7", "10.244.18.8");
    let web2 = web2.replace("port: 3000", "port: 3001").replace("namespace: web", "namespace: web2");
    let web2 = web2.replace("web-abcde", "web2-abcde").replace("service-name: web\n", "service-name: web2\n");
    c.write("web2.yaml", &web2);
    let added = c.state(node);
    assert_ne!(added.nft_tables, base.nft_tables, "the new mapping must change the table");
    transition(&ns, &mut ex, &added);

    // Remove a mapping: the game (and with it the link to worker-2).
    let game = c.read("game.yaml");
    c.remove("game.yaml");
    let removed = c.state(node);
    assert!(removed.links.is_empty());
    transition(&ns, &mut ex, &removed);
    c.write("game.yaml", &game);
    let back = c.state(node);
    transition(&ns, &mut ex, &back);
    let dev = back.links[0].name.clone();
    let index = ns.ifindex(&dev);

    // The peer's underlay address changes: the link is retargeted in place.
    c.edit("facts.yaml", "underlayAddress: 100.64.0.12", "underlayAddress: 100.64.0.22");
    c.edit("facts.yaml", "addresses: [100.64.0.12]", "addresses: [100.64.0.22]");
    c.edit("nodes.yaml", "address: 100.64.0.12", "address: 100.64.0.22");
    let moved_peer = c.state(node);
    let Some(link::Kind::Vxlan(v)) = &moved_peer.links[0].kind else { panic!("vxlan") };
    assert_eq!((moved_peer.links[0].name.as_str(), v.remote.as_str()), (dev.as_str(), "100.64.0.22"));
    transition(&ns, &mut ex, &moved_peer);
    assert_eq!(ns.ifindex(&dev), index, "a retargeted link keeps its ifindex");

    // The MTU changes: edge-a's underlay MTU drops below worker-2's (the link takes the lower).
    c.edit(
        "facts.yaml",
        "underlayMtu: 1420\ninterfaces:\n  - name: enp1s0",
        "underlayMtu: 1360\ninterfaces:\n  - name: enp1s0",
    );
    let mtu = c.state(node);
    assert_ne!(mtu.links[0].mtu, moved_peer.links[0].mtu, "the MTU edit must change the link");
    transition(&ns, &mut ex, &mtu);
    assert_eq!(ns.ifindex(&dev), index, "an MTU change keeps the ifindex");

    // The remote and the MTU change at once, as when a link moves onto the overlay: the kernel
    // refuses IFLA_MTU beside VXLAN data ("Cannot change mtu"), so they go in two messages.
    c.edit("facts.yaml", "underlayAddress: 100.64.0.22", "underlayAddress: 100.64.0.32");
    c.edit("facts.yaml", "addresses: [100.64.0.22]", "addresses: [100.64.0.32]");
    c.edit("nodes.yaml", "address: 100.64.0.22", "address: 100.64.0.32");
    c.edit(
        "facts.yaml",
        "underlayMtu: 1360\ninterfaces:\n  - name: enp1s0",
        "underlayMtu: 1340\ninterfaces:\n  - name: enp1s0",
    );
    let both = c.state(node);
    let Some(link::Kind::Vxlan(v)) = &both.links[0].kind else { panic!("vxlan") };
    assert_eq!(v.remote, "100.64.0.32");
    assert_ne!(both.links[0].mtu, mtu.links[0].mtu, "the MTU edit must change the link");
    transition(&ns, &mut ex, &both);
    assert_eq!(ns.ifindex(&dev), index, "a link retargeted with a new MTU keeps its ifindex");

    // The game pod moves to worker-3: its elements and the link move to a new link.
    c.edit("game.yaml", "nodeName: worker-2", "nodeName: worker-3");
    let pod_moved = c.state(node);
    assert_eq!(pod_moved.links.len(), 1);
    assert_ne!(pod_moved.links[0].name, dev, "another peer, another link");
    // Make before break: the new link exists before the table points at it, the old one goes
    // only after the table no longer does.
    ns.underlay(&pod_moved);
    let report = ex.apply(&pod_moved).unwrap_or_else(|e| panic!("apply: {e}"));
    let at = |prefix: &str| {
        report.actions.iter().position(|a| a.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix}: {report}"))
    };
    let (add, table, del) =
        (at(&format!("add link {}", pod_moved.links[0].name)), at("nft table"), at(&format!("delete link {dev}")));
    assert!(add < table && table < del, "{report}");
    transition(&ns, &mut ex, &pod_moved);

    // Nothing left for this node.
    for f in ["game.yaml", "web.yaml", "web2.yaml", "dns.yaml"] {
        c.remove(f);
    }
    let empty = c.state(node);
    assert!(empty.links.is_empty() && empty.nft_tables.is_empty(), "{empty:?}");
    transition(&ns, &mut ex, &empty);
    assert!(!ns.ip(&["-o", "link", "show"]).contains(owned::LINK_PREFIX));
}

fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first element's key of the first set in the rendering: `"kup-..." . 169.254.77.3 ...`.
fn first_element(text: &str) -> (String, String) {
    let mut set = String::new();
    for line in text.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("set ").or_else(|| l.strip_prefix("map ")) {
            set = rest.trim_end_matches(" {").to_string();
        }
        if let Some(rest) = l.strip_prefix("elements = { ") {
            let first = rest.split([',', '}']).next().unwrap_or_default();
            let key = first.split(" counter").next().unwrap_or_default().split(" : ").next().unwrap_or_default();
            return (set, key.trim().to_string());
        }
    }
    panic!("no element in {text}")
}

#[test]
fn outside_changes_are_repaired_and_counted_once_each() {
    if !root() {
        return;
    }
    // worker-1: two links (Multi), rules at 101 and 102, routes in two tables.
    let s = node_state(&examples(), "worker-1");
    assert_eq!(s.links.len(), 2);
    let ns = Netns::new();
    ns.underlay(&s);
    let keeper = Keeper::start(Executor::new(Some(ns.path())), s.clone());
    let check = Executor::new(Some(ns.path()));
    wait_until("the first apply", Duration::from_secs(5), || keeper.stats.get().applies >= 1);
    assert_exactly(&ns, &s);
    assert_eq!(keeper.stats.get().drift_repairs, 0, "the first apply is no drift");

    let rule = &s.ip_rules.iter().find(|r| r.pref == owned::PREF_DIVERT).expect("a divert rule");
    let (set, key) = first_element(&kuport_proto::text::nft_table(&s.nft_tables[0]));
    let changes: Vec<(&str, Vec<String>)> = vec![
        ("nft", vec!["delete".into(), "table".into(), "inet".into(), owned::NFT_TABLE.into()]),
        ("ip", {
            let mark = format!("{:#x}/{:#x}", rule.fwmark, rule.fwmask);
            ["rule", "del", "pref", &rule.pref.to_string(), "fwmark", &mark, "lookup", &rule.table.to_string()]
                .map(String::from)
                .to_vec()
        }),
        ("ip", vec!["link".into(), "del".into(), s.links[0].name.clone()]),
        (
            "nft",
            vec![
                "delete".into(),
                "element".into(),
                "inet".into(),
                owned::NFT_TABLE.into(),
                set.clone(),
                format!("{{ {key} }}"),
            ],
        ),
        // The far end's permanent entry, and a link's computed MAC (docs/portmap/links.md).
        ("ip", {
            let n = &s.neighbours[0];
            ["neigh", "del", &n.address, "dev", &n.dev].map(String::from).to_vec()
        }),
        ("ip", ["link", "set", "dev", &s.links[1].name, "address", "02:aa:bb:cc:dd:ee"].map(String::from).to_vec()),
    ];
    for (n, (tool, args)) in changes.iter().enumerate() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match *tool {
            "nft" => ns.nft(&args),
            _ => ns.ip(&args),
        };
        println!("outside change: {tool} {}", args.join(" "));
        // The change is real before it is repaired.
        wait_until("repair", REPAIR_WITHIN, || check.differences(&s).is_ok_and(|d| d.is_empty()));
        wait_until("the count", REPAIR_WITHIN, || keeper.stats.get().drift_repairs == n as u64 + 1);
        // Our own repair's notifications must not count as drift.
        std::thread::sleep(Duration::from_millis(300));
        let stats = keeper.stats.get();
        assert_eq!(stats.drift_repairs, n as u64 + 1, "exactly one per outside change: {stats:?}");
        assert!(!stats.last_differences.is_empty());
        println!("  repaired: {:?}", stats.last_differences);
        assert_exactly(&ns, &s);
    }
    assert_eq!(keeper.stats.get().last_error, None);
    drop(keeper);
    // Stopping the keeper tears nothing down.
    assert_exactly(&ns, &s);
}

#[test]
fn unchanged_routes_are_not_reread_and_the_drift_check_still_repairs_them() {
    if !root() {
        return;
    }
    let s = node_state(&examples(), "worker-1");
    let ns = Netns::new();
    ns.underlay(&s);
    let mut ex = Executor::new(Some(ns.path()));
    apply(&mut ex, &s);
    // While the state's links, addresses, routes and rules stay as applied, an apply does not
    // read them back, so it does not see this outside change...
    ns.ip(&["link", "del", &s.links[0].name]);
    assert_eq!(apply(&mut ex, &s), 0);
    assert!(!ex.differences(&s).expect("diff").is_empty());
    // ...the drift check (run on every link, address, route and rule notification) repairs it.
    assert!(!ex.check().is_empty());
    assert_exactly(&ns, &s);
    assert!(apply(&mut ex, &s) == 0 && ex.differences(&s).expect("diff").is_empty());
}

#[test]
fn a_refused_change_keeps_the_previous_state_and_names_the_object() {
    if !root() {
        return;
    }
    let s = node_state(&examples(), "edge-a");
    let ns = Netns::new();
    let mut ex = Executor::new(Some(ns.path()));
    apply_exactly(&ns, &mut ex, &s);

    // A route whose gateway is not reachable through its link: the kernel refuses it.
    let mut bad = s.clone();
    let dev = s.links[0].name.clone();
    bad.routes.push(Route { table: 299, dst: "10.77.0.0/16".into(), via: "192.0.2.1".into(), dev: dev.clone() });
    // And a new mapping's table change, which must not go in with it.
    bad.nft_tables[0].sets[0].elements.clear();
    let err = ex.apply(&bad).expect_err("an unreachable gateway must be refused");
    println!("{err}");
    let ExecError::Refused { report } = &err else { panic!("expected a refusal: {err}") };
    assert_eq!(report.errors.len(), 1, "{err}");
    assert!(report.errors[0].object.contains("route 10.77.0.0/16 via 192.0.2.1"), "{err}");
    assert!(report.errors[0].reason.contains("unreachable") || report.errors[0].reason.contains("gateway"), "{err}");
    assert_exactly(&ns, &s);
    assert!(ex.stats().get().last_error.is_some());

    // An nft rule the kernel refuses (a jump to a chain that does not exist).
    let mut bad = s.clone();
    let jump = kuport_proto::v1::NftStatement {
        kind: Some(kuport_proto::v1::nft_statement::Kind::Verdict(kuport_proto::v1::Verdict {
            kind: kuport_proto::v1::VerdictKind::Jump as i32,
            chain: "missing".into(),
        })),
    };
    bad.nft_tables[0].chains[0].rules.push(kuport_proto::v1::NftRule { matches: vec![], statements: vec![jump] });
    let err = ex.apply(&bad).expect_err("a jump to a missing chain must be refused");
    println!("{err}");
    let ExecError::Refused { report } = &err else { panic!("expected a refusal: {err}") };
    assert!(report.errors[0].object.contains("rule"), "{err}");
    assert!(report.errors[0].reason.contains("No such file or directory"), "{err}");
    assert_exactly(&ns, &s);

    // The good state still applies without writes, and clears the error.
    assert_eq!(apply(&mut ex, &s), 0);
    assert_eq!(ex.stats().get().last_error, None);
}

#[test]
fn the_binary_applies_a_json_state() {
    if !root() {
        return;
    }
    let cluster = load_dir(&examples(), NOW.parse().expect("timestamp")).expect("load");
    let out = compute(&cluster, &Settings::default());
    let state = NodeState::clone(out.node_states.get("worker-2").expect("worker-2"));
    let ns = Netns::new();
    ns.underlay(&state.netns[0]);
    let file = std::env::temp_dir().join(format!("kuport-ex-{}-state.json", std::process::id()));
    std::fs::write(&file, serde_json::to_string(&state).expect("json")).expect("write");
    let path = ns.path();
    let args = ["apply", "--state", file.to_str().expect("utf-8"), "--netns", path.to_str().expect("utf-8")];
    let first = run(env!("CARGO_BIN_EXE_kuport-node-exec"), &args);
    let again = run(env!("CARGO_BIN_EXE_kuport-node-exec"), &args);
    let _ = std::fs::remove_file(&file);
    println!("{first}");
    assert_exactly(&ns, &state.netns[0]);
    assert!(again.contains(": 0 write(s)"), "{again}");
}

/// The namespace's tables as `nft list tables` prints them (`table inet kuport-test`).
fn tables(ns: &Netns) -> BTreeSet<String> {
    ns.nft(&["list", "tables"]).lines().map(|l| l.trim().to_string()).collect()
}

#[test]
fn a_kuport_table_of_any_name_and_family_that_leaves_the_state_is_removed() {
    if !root() {
        return;
    }
    let s = node_state(&examples(), "edge-a");
    let ns = Netns::new();
    ns.underlay(&s);
    let mut ex = Executor::new(Some(ns.path()));
    let mut with = s.clone();
    with.nft_tables.push(NftTable { family: NftFamily::Inet as i32, name: "kuport-test".into(), ..Default::default() });
    ns.nft(&["add", "table", "inet", "foreign"]);
    apply(&mut ex, &with);
    let listed = tables(&ns);
    for t in ["table inet kuport", "table inet kuport-test", "table inet foreign"] {
        assert!(listed.contains(t), "{t} missing: {listed:?}");
    }

    // It leaves the state: it goes, after the tables that stay are in; others' tables stay.
    let report = ex.apply(&s).unwrap_or_else(|e| panic!("apply: {e}"));
    assert!(report.actions.iter().any(|a| a == "delete nft table inet kuport-test"), "{report}");
    let listed = tables(&ns);
    assert!(!listed.contains("table inet kuport-test"), "{listed:?}");
    assert!(listed.contains("table inet kuport") && listed.contains("table inet foreign"), "{listed:?}");
    assert_exactly(&ns, &s);

    // One made outside, under kuport's prefix, is drift: found, and repaired by removing it.
    ns.nft(&["add", "table", "ip6", "kuport-stray"]);
    let found = ex.differences(&s).expect("diff");
    assert_eq!(found, ["extra nft table ip6 kuport-stray"]);
    assert_eq!(ex.check(), found);
    let listed = tables(&ns);
    assert!(!listed.contains("table ip6 kuport-stray") && listed.contains("table inet foreign"), "{listed:?}");
    assert!(ex.differences(&s).expect("diff").is_empty());
}
