//! Apply benchmark: our nf_tables codec against `nft -f`, in scratch network namespaces.
//!
//! Run as root, release build: `cargo bench -p kuport-node-exec --bench apply`.
//! KUPORT_BENCH_SIZES (comma-separated mapping counts) and KUPORT_BENCH_REPS override the
//! defaults; KUPORT_BENCH_QUICK=1 skips nft and the read-back rows; KUPORT_BENCH_TRACE=1 prints
//! each Applier delta's elements compared and time comparing / writing. Prints a markdown table of
//! median and minimum wall times. The table is the one the controller renders for the pod's
//! node of n single-mode PortMaps (the controller's testkit, outside the timed regions), canonical
//! with runs and digests as the controller sends it; the rows marked "no digests" clear both.

/// The executor binary's allocator (`src/main.rs`), so that freeing and allocating cost here
/// what they cost there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;
use common::{BenchResult, run};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kuport_controller::compute::testkit::World;
use kuport_node_exec::executor::{ExecError, Executor};
use kuport_node_exec::nft::{Applier, ApplyMode, apply_table, remove_table};
use kuport_node_exec::sys::netns;
use kuport_proto::v1::{NetnsState, NftFamily, NftSet, NftTable, NodeState};

/// Mapping counts measured by default.
const DEFAULT_SIZES: [usize; 3] = [1_000, 10_000, 50_000];
/// Repetitions of each measurement (median and minimum are reported).
const DEFAULT_REPS: usize = 5;
/// Every RANGE_EVERY-th mapping publishes a UDP port range instead of one TCP port.
const RANGE_EVERY: usize = 10;
/// Ports of a published range.
const RANGE_WIDTH: u16 = 10;
/// First node port handed out (mapping i publishes FIRST_NODE_PORT + i).
const FIRST_NODE_PORT: u16 = 5_000;
/// The pod-side port of single-port mappings, and the first of range mappings.
const POD_PORT: i32 = 8_080;
const POD_RANGE_FIRST: i32 = 27_015;
/// The CNI's VXLAN port: a UDP range over it is refused, so that mapping publishes one port.
const CNI_VXLAN_PORT: u16 = 8_472;
/// The node whose table is measured: it holds every pod; edge-a accepts every mapping.
const POD_NODE: &str = "worker-b";
const TABLE: &str = "kuport";

/// A scratch network namespace, deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> BenchResult<Self> {
        let name = format!("kuport-bench-{}-{tag}", std::process::id());
        run(Command::new("ip").args(["netns", "add", &name]))?;
        Ok(Self { name })
    }
    fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.name)
    }
    /// `nft ARGS` inside the namespace; setns happens in the child, so only nft itself (fork,
    /// exec, parse, netlink) is timed, not `ip netns exec`.
    fn nft(&self, args: &[&str]) -> BenchResult<String> {
        let ns = netns::Netns::open(&self.path()).map_err(|e| format!("{}: {e}", self.name))?;
        let mut cmd = Command::new("nft");
        cmd.args(args);
        ns.command(&mut cmd).map_err(|e| format!("{}: {e}", self.name))?;
        run(&mut cmd)
    }
    fn nft_file(&self, text: &str, tag: &str) -> BenchResult<Duration> {
        let file = std::env::temp_dir().join(format!("{}-{tag}.nft", self.name));
        std::fs::write(&file, text).map_err(|e| format!("{}: {e}", file.display()))?;
        let f = file.to_string_lossy().into_owned();
        std::thread::sleep(SETTLE);
        let t = Instant::now();
        let r = self.nft(&["-f", &f]);
        let took = t.elapsed();
        let _ = std::fs::remove_file(&file);
        r.map(|_| took)
    }
    fn list(&self) -> BenchResult<String> {
        self.nft(&["-s", "list", "table", "ip", TABLE])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// A cluster of `n` single-mode PortMaps, all accepted by edge-a and served by pods on
/// worker-b, so worker-b's table holds five elements per mapping: the link's DNAT, the request
/// and reply claims, the return mark. Mapping i publishes one TCP port, or every tenth a UDP
/// range, and has its own Service and pod.
fn world(indices: impl Iterator<Item = usize>) -> World {
    use kuport_controller::api::{Protocol, ReturnPathMode, ServingMode};
    use kuport_controller::compute::portmap::admission::NODE_PORTS;
    let mut w = World::new()
        .node("edge-a", "100.64.93.143", true)
        .node(POD_NODE, "100.64.0.2", true)
        .facts("edge-a", 1420, &[("enp1s0", "203.0.113.9")])
        .facts(POD_NODE, 1420, &[("eth0", "100.64.0.2")])
        .class("public", ServingMode::Single, ReturnPathMode::Vxlan, &[("edge-a", &["enp1s0"])]);
    for i in indices {
        let (svc, pod) = (format!("s{i}"), format!("pod-{i}"));
        let ip = format!("10.244.{}.{}", i / 250, i % 250 + 2);
        let node_port = FIRST_NODE_PORT + i as u16;
        let eps = [(pod.as_str(), POD_NODE, ip.as_str(), true)];
        // Ranges publish node ports [p - width + 1, p], disjoint between range mappings.
        let first = node_port + 1 - RANGE_WIDTH;
        // The ports a node keeps for itself are published by no class (the controller's
        // NODE_PORTS): those mappings are left out.
        let udp = i % RANGE_EVERY == RANGE_EVERY - 1;
        let (lo, hi) = if udp { (first, node_port) } else { (node_port, node_port) };
        if NODE_PORTS.iter().any(|(p, a, b, _)| (*p == Protocol::Udp) == udp && *a <= hi && lo <= *b) {
            continue;
        }
        w = if i % RANGE_EVERY == RANGE_EVERY - 1 && !(first..=node_port).contains(&CNI_VXLAN_PORT) {
            w.service("bench", &svc, "UDP", POD_RANGE_FIRST, &eps).port_map(
                "bench",
                &svc,
                "public",
                Protocol::Udp,
                first,
                Some(node_port),
                &svc,
                i as i64,
            )
        } else {
            w.service("bench", &svc, "TCP", POD_PORT, &eps).port_map(
                "bench",
                &svc,
                "public",
                Protocol::Tcp,
                node_port,
                None,
                &svc,
                i as i64,
            )
        };
    }
    w
}

/// The pod node's table as the controller renders and sends it (canonical, with digests and
/// runs), for mappings 0..n and then `extra`.
fn rendered(n: usize, extra: Option<usize>) -> BenchResult<NftTable> {
    let out = world((0..n).chain(extra)).run();
    let accepted = |s: &kuport_controller::api::PortMapStatus| {
        s.conditions.iter().any(|c| c.type_ == "Accepted" && c.status == "True")
    };
    let refused = out.port_maps.values().filter(|s| !accepted(s)).count();
    if refused > 0 {
        return Err(format!("{n}: {refused} PortMap(s) not accepted"));
    }
    out.node_states
        .get(POD_NODE)
        .and_then(|s| s.netns.first())
        .and_then(|ns| ns.nft_tables.first())
        .cloned()
        .ok_or_else(|| format!("{n}: no table rendered for {POD_NODE}"))
}

/// `add element` (or `delete element`, keys only) lines for what `plus` holds beyond `base`,
/// in nft syntax (the renderer's own element text).
fn element_lines(base: &NftTable, plus: &NftTable, delete: bool) -> BenchResult<String> {
    use prost::Message;
    let mut out = String::new();
    for set in &plus.sets {
        let have: std::collections::HashSet<Vec<u8>> = base
            .sets
            .iter()
            .filter(|b| b.name == set.name)
            .flat_map(|b| b.elements.iter().map(Message::encode_to_vec))
            .collect();
        for e in set.elements.iter().filter(|e| !have.contains(&e.encode_to_vec())) {
            // A one-element table's text, cut at `elements = {`.
            let one = NftTable {
                sets: vec![NftSet { elements: vec![e.clone()].into(), counter: false, ..set.clone() }].into(),
                chains: vec![].into(),
                ..base.clone()
            };
            let text = kuport_proto::text::nft_table(&one);
            let body = text
                .split_once("elements = { ")
                .and_then(|(_, rest)| rest.split_once(" }"))
                .map(|(el, _)| el.to_string())
                .ok_or_else(|| format!("no elements in {text}"))?;
            let body = if delete { body.split(" : ").next().unwrap_or_default().to_string() } else { body };
            let verb = if delete { "delete" } else { "add" };
            let _ = writeln!(out, "{verb} element ip {TABLE} {} {{ {body} }}", set.name);
        }
    }
    Ok(out)
}

/// What a naive tool does: replace the whole table from its text, atomically.
fn reload_text(t: &NftTable) -> String {
    format!("table ip {TABLE}\ndelete table ip {TABLE}\n{}", kuport_proto::text::nft_table(t))
}

#[derive(Default)]
struct Samples(Vec<Duration>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d);
    }
    fn cell(&self) -> String {
        let mut v = self.0.clone();
        v.sort();
        match (v.get(v.len() / 2), v.first()) {
            (Some(med), Some(min)) => format!("{} ({})", ms(*med), ms(*min)),
            _ => "-".into(),
        }
    }
}

fn ms(d: Duration) -> String {
    let m = d.as_secs_f64() * 1e3;
    if m < 10.0 { format!("{m:.2} ms") } else { format!("{m:.0} ms") }
}

/// Pause before each timed operation, so that what the previous one left to do in the
/// background (the kernel freeing a replaced table after an RCU grace period, the executor
/// freeing a replaced state on its own thread) does not fall into it.
const SETTLE: Duration = Duration::from_secs(1);

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    std::thread::sleep(SETTLE);
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

fn nft_err(e: kuport_node_exec::nft::NftError) -> String {
    e.to_string()
}

/// A row of the table: one operation, ours against `nft -f` (when nft has an equivalent).
struct Row {
    what: &'static str,
    ours: Samples,
    nft: Samples,
}

impl Row {
    fn new(what: &'static str) -> Self {
        Row { what, ours: Samples::default(), nft: Samples::default() }
    }
}

/// `kuport_proto::canonicalize` of one table (order, runs, digests), as the controller does.
fn canonical(t: NftTable) -> NftTable {
    let mut st = NodeState {
        node: "bench".into(),
        netns: vec![NetnsState { nft_tables: vec![t].into(), ..Default::default() }],
    };
    kuport_proto::canonicalize(&mut st);
    st.netns.pop().and_then(|mut n| n.nft_tables.pop()).unwrap_or_default()
}

/// The same table without digests and runs: the Applier then compares every set element by
/// element.
fn without_digests(t: &NftTable) -> NftTable {
    let mut t = t.clone();
    for s in &mut t.sets {
        s.digest.clear();
        s.runs.clear();
    }
    t
}

/// A one-netns state holding `t`, as the sync client hands it to the executor.
fn netns_state(path: &std::path::Path, t: &NftTable) -> Arc<NetnsState> {
    Arc::new(NetnsState {
        target: kuport_proto::netns::path(path.to_string_lossy()),
        nft_tables: vec![t.clone()].into(),
        ..Default::default()
    })
}

fn check_one_mapping(n: usize, what: &str, mode: ApplyMode, writes: usize, batches: usize) -> BenchResult<()> {
    if (mode.clone(), writes, batches) != (ApplyMode::Elements, 5, 1) {
        return Err(format!("{n}: {what} wrote {mode:?}, {writes} message(s) in {batches} transaction(s)"));
    }
    Ok(())
}

/// Applies `t` through `a` (timed) and checks it wrote one mapping's five elements in one
/// transaction.
fn timed_mapping(a: &mut Applier, t: &NftTable, n: usize, what: &str) -> BenchResult<Duration> {
    let (r, d) = timed(|| a.apply(t));
    let r = r.map_err(nft_err)?;
    check_one_mapping(n, what, r.mode, r.writes, r.batches)?;
    Ok(d)
}

fn bench_size(n: usize, reps: usize, out: &mut Vec<(usize, usize, Vec<Row>)>) -> BenchResult<()> {
    // KUPORT_BENCH_QUICK=1: our rows alone (for profiling; nft and read-back skipped).
    let quick = std::env::var("KUPORT_BENCH_QUICK").as_deref() == Ok("1");
    // Every desired table below is the controller's, in canonical order with runs and digests.
    let base = rendered(n, None)?;
    // The elements in reverse, so that canonicalize has sorting to do.
    let mut raw = without_digests(&base);
    for s in &mut raw.sets {
        s.elements.reverse();
    }
    let mut canon = Row::new("controller: `canonicalize` (sort, dedup, runs and digests), not part of any apply");
    let mut digests = Row::new("controller: the runs and digests alone (sha256 of the sorted elements)");
    for _ in 0..reps {
        let (t, d) = timed(|| canonical(raw.clone()));
        canon.ours.push(d);
        let ((), d) = timed(|| {
            for s in &t.sets {
                std::hint::black_box(kuport_proto::canonical::element_runs(&s.elements));
            }
        });
        digests.ours.push(d);
    }
    let plain = without_digests(&base);
    let elements: usize = base.sets.iter().map(|s| s.elements.len()).sum();
    let base_text = kuport_proto::text::nft_table(&base);
    let ours_ns = Netns::new(&format!("{n}-ours"))?;
    let nft_ns = Netns::new(&format!("{n}-nft"))?;
    let path = ours_ns.path();
    let mut cold = Row::new("cold apply into an empty netns");
    for _ in 0..reps {
        remove_table(Some(&path), NftFamily::Ip, TABLE).map_err(nft_err)?;
        let mut a = Applier::new(Some(&path));
        let (r, d) = timed(|| a.apply(&base));
        r.map_err(nft_err)?;
        cold.ours.push(d);
        if quick {
            continue;
        }
        let _ = nft_ns.nft(&["delete", "table", "ip", TABLE]);
        cold.nft.push(nft_ns.nft_file(&base_text, "cold")?);
    }
    if !quick && ours_ns.list()? != nft_ns.list()? {
        return Err(format!("{n}: our table lists differently from nft's"));
    }

    // Warm applier: remembers `base` (and its digests) from one cold apply.
    let mut applier = Applier::new(Some(&path));
    applier.apply(&base).map_err(nft_err)?;
    let plus: Vec<NftTable> = (0..reps).map(|k| rendered(n, Some(n + k))).collect::<BenchResult<_>>()?;
    let plus_plain: Vec<NftTable> = plus.iter().map(without_digests).collect();
    let add_lines: Vec<String> = plus.iter().map(|t| element_lines(&base, t, false)).collect::<BenchResult<_>>()?;
    let del_lines: Vec<String> = plus.iter().map(|t| element_lines(&base, t, true)).collect::<BenchResult<_>>()?;
    let mut add_d = Row::new("add one mapping (5 elements), `Applier`, runs and digests");
    let mut del_d = Row::new("remove that mapping, `Applier`, runs and digests");
    let mut add = Row::new("add one mapping (5 elements), `Applier`, no digests");
    let mut del = Row::new("remove that mapping, `Applier`, no digests");
    let mut readback = Row::new("add one mapping, read-back `apply_table`");
    let mut reload = Row::new("add one mapping, whole-table `nft -f` reload");
    for (k, t) in plus.iter().enumerate() {
        // With digests: the memory holds base's digests (the apply of `base` before this).
        add_d.ours.push(timed_mapping(&mut applier, t, n, "one mapping (runs and digests)")?);
        if !quick && k == 0 {
            let expect = ours_ns.list()?;
            nft_ns.nft_file(&add_lines[k], "check")?;
            if nft_ns.list()? != expect {
                return Err(format!("{n}: nft's element add lists differently from ours"));
            }
            nft_ns.nft_file(&del_lines[k], "uncheck")?;
        }
        del_d.ours.push(timed_mapping(&mut applier, &base, n, "removing one mapping (runs and digests)")?);
        if !quick {
            add_d.nft.push(nft_ns.nft_file(&add_lines[k], "add")?);
            del_d.nft.push(nft_ns.nft_file(&del_lines[k], "del")?);
        }

        // Without digests: every set is compared element by element.
        add.ours.push(timed_mapping(&mut applier, &plus_plain[k], n, "one mapping")?);
        del.ours.push(timed_mapping(&mut applier, &plain, n, "removing one mapping")?);
        // Learn base's digests again (a no-op that compares elements) for the next round.
        applier.apply(&base).map_err(nft_err)?;
        if quick {
            continue;
        }
        add.nft.push(nft_ns.nft_file(&add_lines[k], "add")?);
        del.nft.push(nft_ns.nft_file(&del_lines[k], "del")?);
    }
    // A UDP range mapping: its five elements go to the interval sets (pipapo in the kernel).
    let range_plus = rendered(n, Some(n + RANGE_EVERY - 1))?;
    let (range_add, range_del) = (element_lines(&base, &range_plus, false)?, element_lines(&base, &range_plus, true)?);
    let mut add_r = Row::new("add one UDP range mapping (5 elements), `Applier`, runs and digests");
    let mut del_r = Row::new("remove that range mapping, `Applier`, runs and digests");
    for _ in 0..reps {
        add_r.ours.push(timed_mapping(&mut applier, &range_plus, n, "one range mapping")?);
        del_r.ours.push(timed_mapping(&mut applier, &base, n, "removing one range mapping")?);
        if quick {
            continue;
        }
        add_r.nft.push(nft_ns.nft_file(&range_add, "add")?);
        del_r.nft.push(nft_ns.nft_file(&range_del, "del")?);
    }
    let mut noop_d = Row::new("no-op reconcile, `Applier` with memory, runs and digests");
    let mut noop = Row::new("no-op reconcile, `Applier` with memory, no digests");
    let mut noop_rb = Row::new("no-op reconcile, read-back `apply_table`");
    for _ in 0..reps {
        let (r, d) = timed(|| applier.apply(&base));
        if r.map_err(nft_err)?.writes != 0 {
            return Err(format!("{n}: a no-op wrote"));
        }
        noop_d.ours.push(d);
        let (r, d) = timed(|| applier.apply(&plain));
        if r.map_err(nft_err)?.writes != 0 {
            return Err(format!("{n}: a no-op wrote"));
        }
        noop.ours.push(d);
        applier.apply(&base).map_err(nft_err)?;
        if quick {
            continue;
        }
        let (r, d) = timed(|| apply_table(Some(&path), &base));
        r.map_err(nft_err)?;
        noop_rb.ours.push(d);
    }

    // The whole executor: a one-netns state holding the table, handed over shared (as the
    // sync client's keeper does), so the executor holds the only reference (the state it
    // replaces is freed on its dropper thread). Its applier starts with a read-back of `base`.
    let mut ex_add = Row::new("add one mapping, whole `Executor::apply_shared`, runs and digests");
    let mut ex_del = Row::new("remove that mapping, whole `Executor::apply_shared`, runs and digests");
    let mut ex_add_copy =
        Row::new("add one mapping, `Executor::apply(&NetnsState)` (copies the state), runs and digests");
    let mut ex_noop = Row::new("no-op, whole `Executor::apply_shared`, runs and digests");
    let mut ex = Executor::new(Some(path.clone()));
    ex.apply_shared(netns_state(&path, &base)).map_err(|e| e.to_string())?;
    let ex_report = |n: usize, what: &str, r: Result<kuport_node_exec::executor::Report, ExecError>| {
        let r = r.map_err(|e| e.to_string())?;
        if r.writes != 5 {
            return Err(format!("{n}: {what} through the executor: {r}"));
        }
        Ok(())
    };
    for (k, t) in plus.iter().enumerate() {
        let (add_state, base_state) = (netns_state(&path, t), netns_state(&path, &base));
        let (r, d) = timed(|| ex.apply_shared(add_state));
        ex_report(n, "one mapping", r)?;
        ex_add.ours.push(d);
        let (r, d) = timed(|| ex.apply_shared(base_state));
        ex_report(n, "removing one mapping", r)?;
        ex_del.ours.push(d);
        let borrowed = NetnsState::clone(&netns_state(&path, t));
        let (r, d) = timed(|| ex.apply(&borrowed));
        ex_report(n, "one mapping (borrowed)", r)?;
        ex_add_copy.ours.push(d);
        ex.apply_shared(netns_state(&path, &base)).map_err(|e| e.to_string())?;
        let noop_state = netns_state(&path, &base);
        let (r, d) = timed(|| ex.apply_shared(noop_state));
        if r.map_err(|e| e.to_string())?.writes != 0 {
            return Err(format!("{n}: an executor no-op wrote"));
        }
        ex_noop.ours.push(d);
        if quick {
            continue;
        }
        ex_add.nft.push(nft_ns.nft_file(&add_lines[k], "add")?);
        ex_del.nft.push(nft_ns.nft_file(&del_lines[k], "del")?);
    }
    // The heavy operations last: their aftermath in the kernel (freeing a whole table) must
    // not fall into the small ones above. Each is undone (untimed) before the next.
    for (k, t) in plus.iter().enumerate().take(if quick { 0 } else { reps }) {
        let (r, d) = timed(|| apply_table(Some(&path), t));
        r.map_err(nft_err)?;
        readback.ours.push(d);
        apply_table(Some(&path), &base).map_err(nft_err)?;
        reload.nft.push(nft_ns.nft_file(&reload_text(t), "reload")?);
        nft_ns.nft_file(&del_lines[k], "unreload")?;
    }
    if !quick && ours_ns.list()? != nft_ns.list()? {
        return Err(format!("{n}: after the runs our table lists differently from nft's"));
    }
    let rows = vec![
        canon,
        digests,
        cold,
        add_d,
        del_d,
        add_r,
        del_r,
        ex_add,
        ex_del,
        ex_add_copy,
        add,
        del,
        readback,
        reload,
        noop_d,
        ex_noop,
        noop,
        noop_rb,
    ];
    out.push((n, elements, rows));
    Ok(())
}

fn env_list(var: &str) -> Option<Vec<usize>> {
    let v = std::env::var(var).ok()?;
    v.split(',').map(|s| s.trim().parse().ok()).collect()
}

fn main() -> ExitCode {
    // `cargo bench` passes --bench; nothing else is accepted.
    if !kuport_node_exec::sys::is_root() {
        eprintln!("the apply benchmark needs root (network namespaces, nf_tables)");
        return ExitCode::FAILURE;
    }
    if std::env::var("KUPORT_BENCH_TRACE").as_deref() == Ok("1") {
        // Where an Applier's time goes: elements compared, time comparing, time writing.
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "kuport_node_exec::nft=debug,kuport_node_exec::executor=debug",
            ))
            .with_writer(std::io::stderr)
            .init();
    }
    let sizes = env_list("KUPORT_BENCH_SIZES").unwrap_or_else(|| DEFAULT_SIZES.to_vec());
    let reps = env_list("KUPORT_BENCH_REPS").and_then(|v| v.first().copied()).unwrap_or(DEFAULT_REPS).max(1);
    let mut results = Vec::new();
    for n in sizes {
        eprintln!("measuring {n} mappings...");
        if let Err(e) = bench_size(n, reps, &mut results) {
            eprintln!("benchmark failed: {e}");
            return ExitCode::FAILURE;
        }
    }
    println!("\nmedian (min) of {reps} runs; wall time per operation\n");
    println!("| mappings (elements) | operation | kuport codec | `nft -f` |");
    println!("|---|---|---|---|");
    for (n, elements, rows) in &results {
        for r in rows {
            println!("| {n} ({elements}) | {} | {} | {} |", r.what, r.ours.cell(), r.nft.cell());
        }
    }
    ExitCode::SUCCESS
}
