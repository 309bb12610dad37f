//! Robustness on kuport's real processes: one controller reading the lab's manifest folder and
//! one executor per node, each a process of its own (`kuport-lab controller`, `kuport-lab
//! node-exec`). While they are killed, restarted, drifted and fed edits, probes run every 20 ms
//! from the clients to mappings whose pods sit on another node than the accepting one:
//!
//! - `udp-established`: client-1 to 203.0.113.9:27015 (game-0 on worker-2) on one UDP socket,
//!   one flow with conntrack entries on edge-a and worker-2 for the whole test;
//! - `udp-new`: client-1 to the same address from a new socket (a new flow) each time;
//! - `tcp-new`: client-2 to 203.0.113.9:9000 (api-0 on worker-2), a new connection each time.
//!
//! A probe is answered when the pod saw the client's real address and port and the reply came
//! from the address dialed; lost when nothing came within 300 ms. The counts are printed
//! (`--nocapture`). Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1.

mod common;
use common::*;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kuport_lab::Protocol::Udp;
use kuport_lab::plane::{self, PlaneOptions, converged, synced};
use kuport_lab::probe::{Flow, Prober, Target};
use kuport_lab::{Lab, Manifests, Plane};
use kuport_proto::v1::NodeDebug;

const NODES: [&str; 3] = ["edge-a", "worker-1", "worker-2"];
const INTERVAL: Duration = Duration::from_millis(20);
const TIMEOUT: Duration = Duration::from_millis(300);
/// What the issue allows for a drift repair.
const REPAIR_BOUND: Duration = Duration::from_secs(1);
/// From a rebuilt link seen to the rest of its apply (address, neighbour, route, rules).
const SETTLE: Duration = Duration::from_millis(50);

/// A default lab programmed by the processes, with the game range and a TCP mapping to api-0.
struct Robust {
    tag: String,
    lab: Option<Lab>,
    /// The API server of [`Robust::on_api_server`], stopped after the lab.
    api: Option<OwnedApiServer>,
    dir: PathBuf,
    started: Instant,
}

impl Robust {
    /// One controller on the lab's manifest folder.
    fn new(tag: &str) -> Robust {
        Robust::start(tag, false)
    }

    /// Two controller replicas on a local API server, where the lab registers its objects.
    fn on_api_server(tag: &str) -> Robust {
        Robust::start(tag, true)
    }

    fn start(tag: &str, kubernetes: bool) -> Robust {
        let begun = Instant::now();
        let dir = std::env::temp_dir().join(format!("kuport-robust-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let api = kubernetes.then(|| OwnedApiServer::up(&dir.join("controlplane")));
        let mut lab = default_lab();
        let started = Instant::now();
        let mut options = PlaneOptions::new(env!("CARGO_BIN_EXE_kuport-lab"), &dir);
        options.kubernetes = api.as_ref().map(|a| a.source(None, 2));
        lab.start_plane(&manifests(false), options).expect("the controller and executors start");
        let plane = lab.plane().expect("a plane");
        let took = plane.wait_converged(plane::CONVERGE_TIMEOUT).expect("the lab converges");
        println!(
            "[{tag}] {} controller(s) and 3 executors started; every node applied its state {:.2} s after start \
             ({:.2} s of it waiting on Debug)",
            plane.addresses().len(),
            started.elapsed().as_secs_f64(),
            took.as_secs_f64()
        );
        Robust { tag: tag.to_string(), lab: Some(lab), api, dir, started: begun }
    }

    fn api(&self) -> &kuport_lab::apiserver::ApiServer {
        &self.api.as_ref().expect("an API server").0
    }

    fn lab(&self) -> &Lab {
        self.lab.as_ref().expect("the lab")
    }

    fn lab_mut(&mut self) -> &mut Lab {
        self.lab.as_mut().expect("the lab")
    }

    fn plane(&self) -> &Plane {
        self.lab().plane().expect("the plane")
    }

    fn plane_mut(&mut self) -> &mut Plane {
        self.lab_mut().plane_mut().expect("the plane")
    }

    fn row(&self, node: &str) -> NodeDebug {
        let rows = self.plane().nodes().expect("ListNodes");
        rows.into_iter().find(|r| r.node == node).unwrap_or_else(|| panic!("no row for {node}"))
    }

    /// The standard probe streams, a probe lost after [`TIMEOUT`].
    fn prober(&self) -> Prober {
        self.prober_with(TIMEOUT)
    }

    fn prober_with(&self, timeout: Duration) -> Prober {
        standard_prober(self.lab(), INTERVAL, timeout)
    }

    /// kuport's table in a node, with handles and without counters (`nft -a -s`): a rebuilt
    /// table lists new handles.
    fn table(&self, node: &str) -> String {
        self.lab().exec(node, &["nft", "-a", "-s", "list", "table", "inet", "kuport"]).unwrap_or_default()
    }

    fn has_table(&self, node: &str) -> bool {
        let path = self.lab().netns(node).expect("a node");
        kuport_node_exec::nft::read_table(Some(&path), kuport_proto::v1::NftFamily::Inet, "kuport")
            .expect("reading the table")
            .is_some()
    }

    /// kuport's links (with their ifindex), its routes and the node's IPv4 rules: a recreated
    /// object differs.
    fn links_routes_rules(&self, node: &str) -> String {
        let lab = self.lab();
        let links = lab.ip(node, &["-o", "link", "show", "type", "vxlan"]).unwrap_or_default();
        let links: Vec<&str> = links.lines().map(|l| l.split('@').next().unwrap_or(l)).collect();
        let rules = lab.ip(node, &["-4", "rule", "show"]).unwrap_or_default();
        let routes = lab.ip(node, &["-4", "route", "show", "table", "all"]).unwrap_or_default();
        let routes: Vec<&str> = routes.lines().filter(|l| l.contains("kup-")).collect();
        format!("{}\n{rules}{}", links.join("\n"), routes.join("\n"))
    }
}

impl Drop for Robust {
    fn drop(&mut self) {
        drop(self.lab.take());
        drop(self.api.take());
        let _ = std::fs::remove_dir_all(&self.dir);
        println!("[{}] lab built, tested and removed in {:.2} s", self.tag, self.started.elapsed().as_secs_f64());
    }
}

/// The example classes, the game range on worker-2, a TCP mapping to api-0 on worker-2 and,
/// with `echo`, a UDP mapping to echo-0 on worker-1.
fn manifests(echo: bool) -> Manifests {
    let mut m = Manifests::default_lab()
        .add("api.yaml", &port_map("apps", "api", "public", "TCP", "9000", "api", "api"))
        .expect("loads");
    if echo {
        m = m.add("echo.yaml", &port_map("apps", "echo-udp", "public", "UDP", "8080", "echo", "udp")).expect("loads");
    }
    m
}

/// `nft monitor` and `ip monitor link address route rule` in a node's namespace: every write
/// to kuport's objects (or anything else there) shows as a line.
struct Monitors {
    children: Vec<Child>,
    readers: Vec<std::thread::JoinHandle<Vec<String>>>,
}

impl Monitors {
    fn start(lab: &Lab, node: &str) -> Monitors {
        let ns = lab.netns_name(node);
        let commands: [&[&str]; 2] = [
            &["ip", "netns", "exec", &ns, "nft", "monitor"],
            &["ip", "-4", "-n", &ns, "monitor", "link", "address", "route", "rule"],
        ];
        let mut children = Vec::new();
        let mut readers = Vec::new();
        for c in commands {
            let mut child = Command::new(c[0])
                .args(&c[1..])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("a monitor starts");
            let out = child.stdout.take().expect("stdout");
            readers.push(std::thread::spawn(move || {
                use std::io::BufRead as _;
                std::io::BufReader::new(out).lines().map_while(Result::ok).collect()
            }));
            children.push(child);
        }
        // Both subscribe right after they start; nothing confirms it but time.
        std::thread::sleep(Duration::from_millis(200));
        Monitors { children, readers }
    }

    fn stop(mut self) -> Vec<String> {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.readers.drain(..).flat_map(|r| r.join().unwrap_or_default()).collect()
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

/// Every executor in turn (the pod's node, then the accepting node) is SIGKILLed and started
/// again: no probe is lost, the controller shows it disconnected, then connected and synced,
/// and the restarted executor writes nothing (its stored state is what the kernel holds).
#[test]
fn executor_restart_loses_no_probe_and_writes_nothing() {
    if !root() {
        return;
    }
    let mut r = Robust::new("exec");
    let mut prober = r.prober();
    let from = prober.now();
    for node in ["worker-2", "edge-a"] {
        let table = r.table(node);
        let objects = r.links_routes_rules(node);
        let monitors = Monitors::start(r.lab(), node);
        let pid = r.plane().executor_pid(node).expect("an executor");
        let killed = Instant::now();
        r.plane_mut().kill_executor(node).expect("killed");
        let (_, seen_gone) = r
            .plane()
            .wait("the controller to see the executor gone", Duration::from_secs(5), |rows| {
                rows.iter().any(|x| x.node == node && !x.connected)
            })
            .expect("disconnect shown");
        let down_for = killed.elapsed();
        r.plane_mut().start_executor(node).expect("started");
        let restarted = Instant::now();
        let nodes: Vec<String> = NODES.iter().map(|n| n.to_string()).collect();
        let (rows, _) = r
            .plane()
            .wait("the restarted executor to reconnect and ack", Duration::from_secs(10), |rows| {
                converged(rows, &nodes)
            })
            .expect("reconnected");
        let back = restarted.elapsed();
        // Anything the restarted executor would write comes within its first apply and drift
        // check (50 ms debounce); give it that and more before reading the monitors.
        std::thread::sleep(Duration::from_millis(300));
        let events = monitors.stop();
        let row = rows.iter().find(|x| x.node == node).expect("row");
        assert!(synced(row), "{row:?}");
        let stored = r.plane().stored(node).expect("readable").expect("a stored state");
        assert_eq!(stored.version, row.desired_version, "the stored state is the desired one");
        println!(
            "executor {node} (pid {pid}) SIGKILLed: controller showed it disconnected after {}; \
             {} after its start it was connected and synced (acked {})",
            ms(seen_gone),
            ms(back),
            &row.acked_version[..12],
        );
        assert!(events.is_empty(), "{node}: the restarted executor wrote to the kernel:\n{}", events.join("\n"));
        assert_eq!(r.table(node), table, "{node}: kuport's table changed (handles are new)");
        assert_eq!(r.links_routes_rules(node), objects, "{node}: links, routes or rules changed");
        println!("  {node}: no netlink write seen (nft monitor, ip monitor: 0 events); table handles unchanged");
        let _ = down_for;
    }
    let to = prober.now();
    prober.stop();
    print!("probes while both executors were killed and restarted ({:.1} s):\n{}", (to - from).as_secs_f64(), {
        prober.report(from, to)
    });
    for l in prober.labels() {
        let t = prober.tally(&l, from, to);
        assert_eq!(t.failed(), 0, "{l}: {t}; first failure: {:?}", prober.first_failure(&l, from, to));
    }
}

/// The controller is SIGKILLed: the executors keep the datapath (no probe lost); it comes back
/// on the same address with nothing edited: every executor reconnects and applies and stores
/// the new term's states, which are the same versions, so nothing is written.
#[test]
fn controller_kill_and_restart_loses_no_probe() {
    if !root() {
        return;
    }
    let mut r = Robust::new("ctrl");
    let mut prober = r.prober();
    let from = prober.now();
    let before: Vec<NodeDebug> = NODES.iter().map(|n| r.plane().node(n).expect("GetNode")).collect();
    let tables: Vec<String> = NODES.iter().map(|n| r.table(n)).collect();
    let address = r.plane().address();
    let old_term = before[0].desired.as_ref().expect("desired").term;

    r.plane_mut().kill_controller().expect("killed");
    let killed = Instant::now();
    assert!(r.plane().nodes().is_err(), "the controller is gone");
    // Down for a second: the executors keep what they applied.
    std::thread::sleep(Duration::from_secs(1));
    let during = prober.now();
    for (n, t) in NODES.iter().zip(&tables) {
        assert_eq!(r.table(n), *t, "{n}: the table changed while the controller was away");
        assert!(plane::alive(r.plane().executor_pid(n).expect("pid")), "{n}: its executor died");
    }
    print!("probes while the controller was down ({:.1} s):\n{}", killed.elapsed().as_secs_f64(), {
        prober.report(from, during)
    });

    r.plane_mut().start_controller().expect("started again");
    let restarted = Instant::now();
    assert_eq!(r.plane().address(), address, "the same address");
    let new_term = r.plane().node("edge-a").ok().and_then(|n| n.desired).map(|d| d.term);
    let nodes: Vec<String> = NODES.iter().map(|n| n.to_string()).collect();
    // Converged, and every executor stored the new term's state (it stores before it acks).
    let plane = r.plane();
    let (rows, _) = plane
        .wait("the executors to reconnect and ack the new term", Duration::from_secs(10), |rows| {
            converged(rows, &nodes)
                && NODES.iter().all(|n| {
                    let term = plane.node(n).ok().and_then(|x| x.desired).map(|d| d.term);
                    let stored = plane.stored(n).ok().flatten().map(|s| s.term);
                    term.is_some() && stored == term
                })
        })
        .expect("reconnected");
    let back = restarted.elapsed();
    let term = r.plane().node("edge-a").expect("GetNode").desired.expect("desired").term;
    assert!(term > old_term, "a new term: {term} after {old_term}");
    assert!(new_term.is_none_or(|t| t == term));
    for (b, n) in before.iter().zip(NODES) {
        let row = rows.iter().find(|x| x.node == n).expect("row");
        assert_eq!(row.desired_version, b.desired_version, "{n}: the restarted controller computed another state");
    }
    for (n, t) in NODES.iter().zip(&tables) {
        assert_eq!(r.table(n), *t, "{n}: the table was rewritten");
    }
    std::thread::sleep(Duration::from_millis(200));
    let to = prober.now();
    prober.stop();
    println!(
        "controller down {:.2} s; {} after its restart every executor had reconnected, applied and stored \
         term {term} (was {old_term}); same versions, tables untouched",
        (restarted - killed).as_secs_f64(),
        ms(back)
    );
    print!("probes over the whole test ({:.1} s):\n{}", (to - from).as_secs_f64(), prober.report(from, to));
    for l in prober.labels() {
        let t = prober.tally(&l, from, to);
        assert_eq!(t.failed(), 0, "{l}: {t}; first failure: {:?}", prober.first_failure(&l, from, to));
    }
}

/// Drift from outside: kuport's table deleted on the accepting node (edge-a), then on the pod's
/// node (worker-2), then worker-2's pref 102 rule deleted (under Single only the pod's node
/// has kuport's ip rules). Each is repaired within 1 s, and the drift counter the controller
/// shows (Debug drift_repairs) grows by exactly one per episode. Then edge-a's table again
/// while the controller is away (the executor alone repairs it within 1 s) and once more after
/// it came back.
#[test]
fn drift_is_repaired_within_a_second_and_counted() {
    if !root() {
        return;
    }
    let mut r = Robust::new("drift");
    let mut prober = r.prober();
    let from = prober.now();
    let rule_102 = |r: &Robust| r.lab().ip("worker-2", &["rule", "show", "pref", "102"]).unwrap_or_default();
    let rule_before = rule_102(&r);
    assert!(rule_before.contains("lookup 201"), "worker-2's return rule: {rule_before}");
    type Check = fn(&Robust) -> bool;
    let episodes: [(&str, &[&str], &str, Check); 3] = [
        ("edge-a", &["nft", "delete", "table", "inet", "kuport"], "nft delete table inet kuport", |r| {
            r.has_table("edge-a")
        }),
        ("worker-2", &["nft", "delete", "table", "inet", "kuport"], "nft delete table inet kuport", |r| {
            r.has_table("worker-2")
        }),
        ("worker-2", &["ip", "rule", "del", "pref", "102"], "ip rule del pref 102", |r| {
            r.lab().ip("worker-2", &["rule", "show", "pref", "102"]).unwrap_or_default().contains("lookup 201")
        }),
    ];
    let mut lines = Vec::new();
    for (node, cmd, shown, repaired) in episodes {
        let drift_before = r.row(node).drift_repairs;
        let table_before = r.table(node);
        let gap_from = prober.now();
        r.lab().exec(node, cmd).unwrap_or_else(|e| panic!("{node}: {shown}: {e}"));
        let started = Instant::now();
        assert!(!repaired(&r), "{node}: {shown} did nothing");
        while !repaired(&r) {
            assert!(started.elapsed() < REPAIR_BOUND * 3, "{node}: {shown}: not repaired");
            std::thread::sleep(Duration::from_millis(2));
        }
        let took = started.elapsed();
        let (_, reported) = r
            .plane()
            .wait("the drift to be reported", Duration::from_secs(3), |rows| {
                rows.iter().any(|x| x.node == node && x.drift_repairs > drift_before)
            })
            .expect("drift reported");
        // Probes sent up to one timeout after the repair may still have been in the gap.
        let settled = prober.now() + TIMEOUT;
        assert!(prober.wait_answered(settled, Duration::from_secs(3)), "{node}: the probes never recovered");
        let row = r.row(node);
        assert_eq!(row.drift_repairs, drift_before + 1, "{node}: {shown}: one episode, one count: {row:?}");
        assert!(synced(&row), "{row:?}");
        if shown.starts_with("nft") {
            assert_eq!(
                r.table(node).lines().filter(|l| !l.contains("handle")).count(),
                table_before.lines().filter(|l| !l.contains("handle")).count()
            );
        }
        let gap = prober.report(gap_from, settled);
        let line = format!(
            "{node}: `{shown}` repaired after {}, reported by Debug after {} (drift_repairs {} -> {}); \
             probes sent from the deletion to the repair + 300 ms:\n{gap}",
            ms(took),
            ms(reported),
            drift_before,
            row.drift_repairs,
        );
        print!("{line}");
        lines.push(line);
        assert!(took < REPAIR_BOUND, "{node}: {shown}: repaired only after {took:?}");
    }

    // 4. The same with the controller away: the executor alone repairs. Then the controller
    //    comes back, and one more episode is counted.
    let repair = |r: &Robust| {
        r.lab().exec("edge-a", &["nft", "delete", "table", "inet", "kuport"]).expect("deleted");
        let started = Instant::now();
        while !r.has_table("edge-a") {
            assert!(started.elapsed() < REPAIR_BOUND * 3, "edge-a: not repaired");
            std::thread::sleep(Duration::from_millis(2));
        }
        started.elapsed()
    };
    let shown_before = r.row("edge-a").drift_repairs;
    r.plane_mut().kill_controller().expect("killed");
    let away = repair(&r);
    r.plane_mut().start_controller().expect("started");
    r.plane().wait_converged(Duration::from_secs(10)).expect("reconnected");
    std::thread::sleep(Duration::from_millis(300));
    let shown_after_restart = r.row("edge-a").drift_repairs;
    let again = repair(&r);
    let (rows, _) = r
        .plane()
        .wait("the drift to be reported", Duration::from_secs(3), |rows| {
            rows.iter().any(|x| x.node == "edge-a" && x.drift_repairs > shown_after_restart)
        })
        .expect("drift reported");
    let shown = rows.iter().find(|x| x.node == "edge-a").map_or(0, |x| x.drift_repairs);
    println!(
        "edge-a with the controller SIGKILLed: `nft delete table ip kuport` repaired after {} by the executor \
         alone. Debug's drift_repairs for edge-a: {shown_before} before, {shown_after_restart} from the restarted \
         controller, {shown} after one more episode (repaired after {})",
        ms(away),
        ms(again)
    );
    assert!(away < REPAIR_BOUND && again < REPAIR_BOUND, "repairs took {away:?} and {again:?}");

    let to = prober.now();
    prober.stop();
    print!("probes over the whole test ({:.1} s):\n{}", (to - from).as_secs_f64(), prober.report(from, to));
}

/// kuport's links on `node` with their MACs (`ip -o link show type vxlan`).
fn link_macs(r: &Robust, node: &str) -> Vec<(String, String)> {
    let out = r.lab().ip(node, &["-o", "link", "show", "type", "vxlan"]).unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            let name = l.split(':').nth(1)?.trim().split('@').next()?.to_string();
            let mac = l.split("link/ether ").nth(1)?.split_whitespace().next()?.to_string();
            name.starts_with("kup-").then_some((name, mac))
        })
        .collect()
}

/// The first probe of each stream sent at or after `from` that was answered, as a delay from
/// `from`: how long the datapath stayed broken.
fn resumed_after(prober: &Prober, from: Duration) -> Vec<(String, Duration)> {
    prober
        .labels()
        .into_iter()
        .map(|l| {
            let at = prober.first_answer(&l, from).unwrap_or(Duration::MAX);
            (l, at.saturating_sub(from))
        })
        .collect()
}

/// An operator deletes the pod node's kup- link (issue 19): the executor rebuilds it at its
/// computed MAC, edge-a's permanent neighbour entry still matches, and every probe sent from
/// 50 ms after the rebuild is answered (the first within a second). Ablation: with both
/// executors stopped, edge-a's entry made an ARP-learned one and worker-2's device at another MAC
/// (what a rebuild leaves without kuport's MACs and neighbours), no probe is answered for the 4 s
/// watched (51.9 s until ARP re-resolved, measured once); the restarted executors repair both
/// (docs/portmap/links.md, docs/decisions.md).
#[test]
fn a_rebuilt_link_carries_traffic_at_once() {
    if !root() {
        return;
    }
    let mut r = Robust::new("rebuild");
    let mut prober = r.prober();
    let from = prober.now();
    let before = link_macs(&r, "worker-2");
    assert!(!before.is_empty(), "worker-2 has no kup- link");
    let permanent = r.lab().ip("edge-a", &["-4", "neigh", "show", "nud", "permanent"]).unwrap_or_default();
    for (_, mac) in &before {
        assert!(permanent.contains(&format!("lladdr {mac} PERMANENT")), "edge-a has no entry for {mac}:\n{permanent}");
    }

    // 1. `ip link del` of every kup- link on worker-2, as the operator did.
    let deleted_at = prober.now();
    let started = Instant::now();
    for (dev, _) in &before {
        r.lab().exec("worker-2", &["ip", "link", "del", dev]).expect("deleted");
    }
    while link_macs(&r, "worker-2") != before {
        assert!(started.elapsed() < REPAIR_BOUND * 3, "worker-2's links not rebuilt at their MACs: {:?}", {
            link_macs(&r, "worker-2")
        });
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = started.elapsed();
    let repaired_at = prober.now();
    // Let a second of probes after the repair complete (a lost probe holds its stream for a
    // timeout, so a stream's first probe after the repair may be sent up to 300 ms later).
    std::thread::sleep(Duration::from_secs(1) + TIMEOUT);
    let resumed = resumed_after(&prober, repaired_at);
    println!(
        "worker-2: `ip link del` of {} link(s) rebuilt at the same MAC(s) after {}; probes from the deletion \
         to the repair + 1 s:\n{}  first answer after the repair: {resumed:?}",
        before.len(),
        ms(took),
        prober.report(deleted_at, repaired_at + Duration::from_secs(1)),
    );
    assert!(took < REPAIR_BOUND, "rebuilt only after {took:?}");
    for (l, gap) in &resumed {
        assert!(*gap < Duration::from_secs(1), "{l}: probes resumed only {gap:?} after the repair");
        // The link's address, neighbour, route and rules follow it within the same apply.
        let after = prober.tally(l, repaired_at + SETTLE, repaired_at + Duration::from_secs(1));
        assert_eq!(after.failed(), 0, "{l}: probes failed after the repair: {after}");
    }

    // 2. Ablation: no kuport on either end, an ARP-learned entry on edge-a and another MAC on
    //    worker-2's device (a rebuilt device's random one), as any rebuild without computed MACs
    //    leaves them.
    r.plane_mut().kill_executor("edge-a").expect("killed");
    r.plane_mut().kill_executor("worker-2").expect("killed");
    for line in permanent.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [address, "dev", dev, "lladdr", mac, ..] = words.as_slice() else { continue };
        r.lab()
            .exec("edge-a", &["ip", "neigh", "replace", address, "lladdr", mac, "dev", dev, "nud", "reachable"])
            .expect("replaced");
    }
    // worker-2's own entries go with the MAC change (the kernel flushes a device's neighbours);
    // they are put back in the same batch, and worker-2's ARP output is dropped meanwhile, or a
    // reply sent in between would ARP and so teach edge-a the new MAC: after a real rebuild
    // worker-2 sends nothing until edge-a's requests arrive.
    let own = r.lab().ip("worker-2", &["-4", "neigh", "show", "nud", "permanent"]).unwrap_or_default();
    let mut batch = String::new();
    for (i, (dev, _)) in before.iter().enumerate() {
        batch += &format!("link set dev {dev} address 02:42:de:ad:be:{i:02x}\n");
        for line in own.lines().filter(|l| l.contains(&format!(" dev {dev} "))) {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let [address, "dev", dev, "lladdr", mac, ..] = words.as_slice() {
                batch += &format!("neigh replace {address} lladdr {mac} dev {dev} nud permanent\n");
            }
        }
    }
    let batch_file = r.dir.join("ablation.batch");
    std::fs::write(&batch_file, &batch).expect("written");
    let hush = [
        "nft",
        "add table arp kuport-ablation; add chain arp kuport-ablation out { type filter hook output priority 0; policy drop; }",
    ];
    r.lab().exec("worker-2", &hush).expect("ARP output dropped");
    let broken_at = prober.now();
    r.lab().exec("worker-2", &["ip", "-batch", &batch_file.to_string_lossy()]).expect("batch");
    r.lab().exec("worker-2", &["nft", "delete table arp kuport-ablation"]).expect("ARP output back");
    const ABLATION: Duration = Duration::from_secs(4);
    std::thread::sleep(ABLATION + TIMEOUT);
    let lost = prober.report(broken_at, broken_at + ABLATION);
    let learned = r.lab().ip("edge-a", &["-4", "neigh", "show"]).unwrap_or_default();
    let learned: Vec<&str> = learned.lines().filter(|l| l.contains("kup-")).collect();
    println!(
        "ablation: learned entry on edge-a, another MAC on worker-2; probes over {ABLATION:?}:\n{lost}  \
         edge-a: {learned:?}"
    );
    for l in prober.labels() {
        let t = prober.tally(&l, broken_at + TIMEOUT, broken_at + ABLATION);
        assert_eq!(
            t.answered, 0,
            "{l}: answered without kuport's MACs and neighbours ({t}): the ablation shows nothing"
        );
    }
    r.plane_mut().start_executor("edge-a").expect("started");
    r.plane_mut().start_executor("worker-2").expect("started");
    let back = prober.now();
    assert!(prober.wait_answered(back, Duration::from_secs(10)), "the restarted executors did not repair");
    println!("executors restarted: first answers after {:?}", resumed_after(&prober, back));
    assert_eq!(link_macs(&r, "worker-2"), before, "the computed MACs are back");

    let to = prober.now();
    prober.stop();
    print!("probes over the whole test ({:.1} s):\n{}", (to - from).as_secs_f64(), prober.report(from, to));
}

/// The manifest folder is edited while the probes run: a PortMap added (a UDP mapping to echo-0
/// on worker-1: a new link edge-a to worker-1) converges in well under a second and the
/// existing mappings lose nothing; then game-0 moves to worker-1 (the EndpointSlice's nodeName
/// and address change): the controller follows, new flows reach the pod at its new place, and
/// the established UDP flow follows as well (its stale conntrack entry is deleted).
#[test]
fn manifest_edits_converge_and_the_probes_follow() {
    if !root() {
        return;
    }
    let mut r = Robust::new("edit");
    // A shorter timeout than elsewhere: how soon the probes follow is measured to within it.
    let mut prober = r.prober_with(Duration::from_millis(100));
    let from = prober.now();

    // 1. A PortMap added.
    let before = r.plane().nodes().expect("ListNodes");
    let lab = r.lab();
    let mut echo = Prober::start(
        vec![Target {
            label: "echo-udp-new".into(),
            from: lab.netns("client-2").expect("client"),
            client: client_address(lab, "client-2"),
            to: addr("203.0.113.9:8080"),
            protocol: Udp,
            flow: Flow::New,
            pod: "echo-0".into(),
        }],
        INTERVAL,
        Duration::from_millis(100),
    );
    let written = echo.now();
    let wrote = Instant::now();
    r.plane_mut().set_manifests(&manifests(true)).expect("written");
    let (_, took) =
        r.plane().wait_changed(&before, &["edge-a", "worker-1"], Duration::from_secs(10)).expect("converges");
    let converged_after = wrote.elapsed();
    assert!(echo.wait_answered(written, Duration::from_secs(3)), "the new mapping never answered");
    let first = echo.first_answer("echo-udp-new", written).expect("answered") - written;
    echo.stop();
    println!(
        "PortMap apps/echo-udp added: edge-a and worker-1 applied it {} after the write ({} polling); \
         first answer to a probe sent {} after the write",
        ms(converged_after),
        ms(took),
        ms(first)
    );
    let edit_done = prober.now();
    print!("probes of the existing mappings meanwhile:\n{}", prober.report(from, edit_done));
    for l in prober.labels() {
        let t = prober.tally(&l, from, edit_done);
        assert_eq!(t.failed(), 0, "{l}: {t}; first failure: {:?}", prober.first_failure(&l, from, edit_done));
    }

    // 2. game-0 moves to worker-1: a new namespace there, then the objects written.
    let before = r.plane().nodes().expect("ListNodes");
    let moved = prober.now();
    let move_started = Instant::now();
    r.lab_mut().move_pod("game-0", "worker-1", "10.244.1.107".parse().unwrap()).expect("moves");
    let pod_up = move_started.elapsed();
    let published = prober.now();
    let wrote = Instant::now();
    r.lab_mut().publish().expect("objects written");
    let (_, _) = r.plane().wait_changed(&before, &["edge-a", "worker-1"], Duration::from_secs(10)).expect("converges");
    let converged_after = wrote.elapsed();
    assert!(
        prober.first_answer("udp-new", published).is_some()
            || prober.wait_answered_one("udp-new", published, Duration::from_secs(3)),
        "new flows never reached game-0 on worker-1:\n{}",
        prober.report(published, prober.now())
    );
    let first = prober.first_answer("udp-new", published).expect("answered") - published;
    let st = r.plane().port_map_status("games", "game").expect("status");
    assert_eq!(st.endpoint.as_ref().map(|e| e.node.as_str()), Some("worker-1"), "{st:?}");
    // The established flow follows too: edge-a's executor deleted the conntrack entry that
    // still translated it to the old link, so its next datagram met the new element.
    let established = prober.wait_answered_one("udp-established", published, Duration::from_secs(5));
    let to = prober.now();
    prober.stop();
    let edge_ct = conntrack(r.lab(), "edge-a", &["dport=27015"]);
    let pod_ct = conntrack(r.lab(), "worker-1", &["dport=27015"]);
    let exec_logs: String = ["edge-a", "worker-1"]
        .iter()
        .map(|n| std::fs::read_to_string(r.plane().dir().join(kuport_lab::plane::executor_log(n))).unwrap_or_default())
        .flat_map(|log| log.lines().filter(|l| l.contains("conntrack")).map(str::to_string).collect::<Vec<_>>())
        .collect::<Vec<_>>()
        .join("\n");
    println!(
        "game-0 moved to worker-1 (its namespace and server rebuilt in {}), objects written: edge-a and \
         worker-1 applied the new states {} after the write; first new flow answered by game-0 on worker-1 \
         {} after the write",
        ms(pod_up),
        ms(converged_after),
        ms(first)
    );
    print!("probes from the move on ({:.1} s):\n{}", (to - moved).as_secs_f64(), prober.report(moved, to));
    assert!(
        established,
        "the established UDP flow did not follow within 5 s: edge-a's conntrack for port 27015:\n{edge_ct}\n\
         worker-1's:\n{pod_ct}\nthe executors' conntrack log lines:\n{exec_logs}"
    );
    let at = prober.first_answer("udp-established", published).expect("answered") - published;
    println!("the established UDP flow followed {} after the write; edge-a's conntrack now:\n{edge_ct}", ms(at));
    let tcp = prober.tally("tcp-new", moved, to);
    assert_eq!(
        tcp.failed(),
        0,
        "api-0 did not move; its mapping must not suffer: {tcp}; first failure: {:?}",
        prober.first_failure("tcp-new", moved, to)
    );
}

/// Two controller replicas on the API server; the leader is SIGKILLed. The other takes the
/// Lease within 5 s, every executor follows it and acks its term, no probe is lost (the
/// executors keep the datapath meanwhile), and no PortMap or class in the API server is
/// rewritten. The killed replica comes back as a follower. Then game-0 moves to worker-1 (its
/// EndpointSlice changes in the API server): new flows follow, and the leader writes the new
/// serving node into the PortMap's status.
#[test]
fn leader_kill_on_the_api_server_loses_no_probe() {
    if !root() {
        return;
    }
    let mut r = Robust::on_api_server("leader");
    let leader = r.plane().leader().expect("a replica leads");
    let other = 1 - leader;
    let versions = |r: &Robust| {
        let range = "{range .items[*]}{.kind} {.metadata.name} {.metadata.resourceVersion}{\"\\n\"}{end}";
        let pm = r.api().kubectl(&["get", "pm", "-A", "-o", &format!("jsonpath={range}")], None).expect("kubectl");
        let pmc = r.api().kubectl(&["get", "pmc", "-o", &format!("jsonpath={range}")], None).expect("kubectl");
        pm + &pmc
    };
    let nodes: Vec<String> = NODES.iter().map(|n| n.to_string()).collect();
    // Statuses settle once every node acked (Programmed) and the grace of the first term ended.
    let programmed = "jsonpath={.status.conditions[?(@.type=='Programmed')].status}";
    // Settled: both Programmed and nothing written for a second.
    let settled = Instant::now();
    let mut before = String::new();
    loop {
        let ready = [("apps", "api"), ("games", "game")].iter().all(|(ns, name)| {
            r.api().kubectl(&["get", "pm", "-n", ns, name, "-o", programmed], None).unwrap_or_default() == "True"
        });
        let now = versions(&r);
        if ready && now == before {
            break;
        }
        assert!(settled.elapsed() < Duration::from_secs(30), "the statuses never settled: {now}");
        before = now;
        std::thread::sleep(Duration::from_secs(1));
    }
    let old_term = r.plane().node("edge-a").expect("GetNode").desired.expect("desired").term;
    let mut prober = r.prober();
    let from = prober.now();

    r.plane_mut().kill_replica(leader).expect("killed");
    let killed = Instant::now();
    while r.plane().leader() != Some(other) {
        assert!(killed.elapsed() < Duration::from_secs(5), "no new leader within 5 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let took_over = killed.elapsed();
    // Converged on the new leader's term: every executor stored it (it stores before it acks).
    let plane = r.plane();
    plane
        .wait("the executors to follow the new leader", Duration::from_secs(10), |rows| {
            converged(rows, &nodes)
                && NODES.iter().all(|n| {
                    let term = plane.node(n).ok().and_then(|x| x.desired).map(|d| d.term);
                    let stored = plane.stored(n).ok().flatten().map(|s| s.term);
                    term.is_some_and(|t| t > old_term) && stored == term
                })
        })
        .expect("converged on the new leader");
    let followed = killed.elapsed();
    let term = r.plane().node("edge-a").expect("GetNode").desired.expect("desired").term;
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(versions(&r), before, "the new leader rewrote a status");
    r.plane_mut().start_controller().expect("the killed replica starts again");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(r.plane().leader(), Some(other), "the restarted replica follows");
    let to = prober.now();
    println!(
        "leader (replica {leader}) SIGKILLed: replica {other} held the Lease after {}, every executor acked its \
         term {term} after {}; no status rewritten",
        ms(took_over),
        ms(followed)
    );
    print!("probes over the failover ({:.1} s):\n{}", (to - from).as_secs_f64(), prober.report(from, to));
    for l in prober.labels() {
        let t = prober.tally(&l, from, to);
        assert_eq!(t.failed(), 0, "{l}: {t}; first failure: {:?}", prober.first_failure(&l, from, to));
    }

    // The pod moves: the EndpointSlice in the API server changes, the mapping follows.
    let before = r.plane().nodes().expect("ListNodes");
    r.lab_mut().move_pod("game-0", "worker-1", "10.244.1.107".parse().unwrap()).expect("moves");
    let published = prober.now();
    let wrote = Instant::now();
    r.lab_mut().publish().expect("objects registered");
    r.plane().wait_changed(&before, &["edge-a", "worker-1"], Duration::from_secs(10)).expect("converges");
    let converged_after = wrote.elapsed();
    assert!(
        prober.wait_answered_one("udp-new", published, Duration::from_secs(3)),
        "new flows never reached game-0 on worker-1:\n{}",
        prober.report(published, prober.now())
    );
    let node = "jsonpath={.status.endpoint.node}";
    while r.api().kubectl(&["get", "pm", "-n", "games", "game", "-o", node], None).unwrap_or_default() != "worker-1" {
        assert!(wrote.elapsed() < Duration::from_secs(10), "the status never named worker-1");
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "game-0 moved to worker-1 through its EndpointSlice: the nodes applied it {} after the write, the status \
         named worker-1 {} after it",
        ms(converged_after),
        ms(wrote.elapsed())
    );
    prober.stop();
    // The move went to the executors as deltas from what they held (docs/design.md, "Deltas"),
    // and each gave the leader's version: none was refused and sent again whole.
    let metrics = r.plane().metrics().expect("the leader's metrics");
    let total = |name: &str| {
        let prefix = format!("kuport_{name}_total ");
        metrics.lines().find_map(|l| l.strip_prefix(prefix.as_str())?.trim().parse::<u64>().ok())
    };
    assert!(total("deltas_sent").is_some_and(|n| n > 0), "no namespace went as a delta:\n{metrics}");
    assert_eq!(total("deltas_refused"), Some(0), "{metrics}");
}

/// The conntrack entries of a node's namespace that contain every one of `words`.
fn conntrack(lab: &Lab, node: &str, words: &[&str]) -> String {
    let text = lab.exec(node, &["cat", "/proc/net/nf_conntrack"]).unwrap_or_else(|e| e.to_string());
    text.lines().filter(|l| words.iter().all(|w| l.contains(w))).map(|l| format!("  {l}\n")).collect()
}
