//! Interception benchmark (issue 18): the cost of programming 100 pods on one node.
//!
//! Run as root, release build: `cargo bench -p kuport-node-exec --bench intercept`.
//! KUPORT_BENCH_PODS (100) and KUPORT_BENCH_REPS (3) override the defaults. Creates one scratch
//! network namespace per pod with an IPv4 and an IPv6 address on its loopback, computes each
//! pod's two tables with the controller's `compute::intercept::tables` (docs/intercept/table.md),
//! and times, with one kuport `Executor` per pod (as one keeper per namespace has) and then with
//! `nft -f` per namespace in the same namespaces: the cold apply of every pod, one intercept
//! changed in one pod (a mesh dial subnet added), and the removal of every pod's tables. Prints
//! a markdown table of median and minimum wall times. Every namespace is deleted on exit, error
//! or panic included (Drop).

/// The executor binary's allocator (`src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;
use common::{BenchResult, run};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use kuport_controller::compute::intercept::{
    AgentIdentity, Intercept, InterceptSpec, MESH_DIAL_SUBNETS, Protocol, TABLE, tables,
};
use kuport_node_exec::executor::Executor;
use kuport_node_exec::sys::netns;
use kuport_proto::v1::{NetnsState, NftFamily, NftTable, NodeState};

const DEFAULT_PODS: usize = 100;
const DEFAULT_REPS: usize = 3;
/// The dial subnet every pod's mesh starts with, and the one added to one pod.
const DIAL: [&str; 2] = ["240.240.0.0/16", "2001:2::/48"];
const DIAL_ADDED: &str = "240.250.0.0/16";
/// Pause before each timed phase, so the kernel's deferred freeing of the previous one (RCU)
/// does not fall into it.
const SETTLE: Duration = Duration::from_millis(500);

/// A scratch "pod": a network namespace with the pod's addresses, deleted on drop.
struct Pod {
    name: String,
    addresses: Vec<IpAddr>,
}

impl Pod {
    fn new(i: usize) -> BenchResult<Self> {
        let name = format!("kuport-bench-{}-pod{i}", std::process::id());
        let v4: IpAddr = format!("10.250.{}.{}", i / 250, i % 250 + 2).parse().map_err(|e| format!("{e}"))?;
        let v6: IpAddr = format!("fd00:250::{:x}", i + 2).parse().map_err(|e| format!("{e}"))?;
        run(Command::new("ip").args(["netns", "add", &name]))?;
        // Owned from here: a failure below deletes the namespace.
        let pod = Pod { name, addresses: vec![v4, v6] };
        run(Command::new("ip").args(["-n", &pod.name, "link", "set", "lo", "up"]))?;
        for (a, len) in [(v4, 32), (v6, 128)] {
            run(Command::new("ip").args(["-n", &pod.name, "addr", "add", &format!("{a}/{len}"), "dev", "lo"]))?;
        }
        Ok(pod)
    }
    fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.name)
    }
    /// `nft ARGS` inside the namespace; setns happens in the forked child (the sys module), so
    /// the time is nft's own (fork, exec, parse, netlink), not `ip netns exec`'s.
    fn nft(&self, ns: &netns::Netns, args: &[&str]) -> BenchResult<String> {
        let mut cmd = Command::new("nft");
        cmd.args(args);
        ns.command(&mut cmd).map_err(|e| format!("{}: {e}", self.name))?;
        run(&mut cmd)
    }
    fn list(&self, ns: &netns::Netns) -> BenchResult<String> {
        let mut out = String::new();
        for f in ["ip", "ip6"] {
            out += &self.nft(ns, &["-s", "list", "table", f, TABLE])?;
        }
        Ok(out)
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Two intercepts (a TCP one with a proxy port, a UDP one), the default agent group, the mesh's
/// dial subnets: the spec of issue 18's tests (node-exec/tests/intercept_root.rs).
fn spec(pod: &Pod, dial: &[&str]) -> BenchResult<InterceptSpec> {
    Ok(InterceptSpec {
        intercepts: vec![
            Intercept { protocol: Protocol::Tcp, container_port: 8080, agent_port: 9900, proxy_port: Some(9901) },
            Intercept { protocol: Protocol::Udp, container_port: 8080, agent_port: 9902, proxy_port: None },
        ],
        identity: AgentIdentity::default(),
        mesh_dial_subnets: dial
            .iter()
            .map(|s| s.parse::<IpNet>().map_err(|e| format!("{s}: {e}")))
            .collect::<BenchResult<_>>()?,
        pod_addresses: pod.addresses.clone(),
    })
}

/// The pod namespace's state as the controller sends it: canonical, tables only.
fn state(pod: &Pod, dial: &[&str]) -> BenchResult<Arc<NetnsState>> {
    let computed = tables(&spec(pod, dial)?).map_err(|e| format!("{}: {e}", pod.name))?;
    if !computed.refusals.is_empty() || computed.tables.len() != 2 {
        return Err(format!("{}: {} table(s), refusals {:?}", pod.name, computed.tables.len(), computed.refusals));
    }
    let mut s = NodeState {
        node: "bench".into(),
        netns: vec![NetnsState { nft_tables: computed.tables.into(), ..Default::default() }],
    };
    kuport_proto::canonicalize(&mut s);
    s.netns.pop().map(Arc::new).ok_or_else(|| "canonicalize dropped the netns".into())
}

fn family(t: &NftTable) -> &'static str {
    if t.family == NftFamily::Ip6 as i32 { "ip6" } else { "ip" }
}

fn nft_text(s: &NetnsState) -> String {
    s.nft_tables.iter().map(kuport_proto::text::nft_table).collect()
}

#[derive(Default)]
struct Samples(Vec<Duration>);

impl Samples {
    fn sorted(&self) -> Vec<Duration> {
        let mut v = self.0.clone();
        v.sort();
        v
    }
    /// median (min), total and divided by `per`.
    fn cells(&self, per: usize) -> (String, String) {
        let v = self.sorted();
        match (v.get(v.len() / 2), v.first()) {
            (Some(med), Some(min)) => {
                let per = per.max(1) as u32;
                (format!("{} ({})", ms(*med), ms(*min)), format!("{} ({})", ms(*med / per), ms(*min / per)))
            }
            _ => ("-".into(), "-".into()),
        }
    }
}

fn ms(d: Duration) -> String {
    let m = d.as_secs_f64() * 1e3;
    if m < 10.0 { format!("{m:.2} ms") } else { format!("{m:.0} ms") }
}

fn timed<T>(f: impl FnOnce() -> BenchResult<T>) -> BenchResult<(T, Duration)> {
    std::thread::sleep(SETTLE);
    let t = Instant::now();
    let r = f()?;
    Ok((r, t.elapsed()))
}

/// One file per pod, written before the timed region.
fn write_file(pod: &Pod, tag: &str, text: &str) -> BenchResult<String> {
    let file = std::env::temp_dir().join(format!("{}-{tag}.nft", pod.name));
    std::fs::write(&file, text).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(file.to_string_lossy().into_owned())
}

#[derive(Default)]
struct Rows {
    cold: (Samples, Samples),
    rewarm: (Samples, Samples),
    change: (Samples, Samples),
    remove: (Samples, Samples),
}

fn bench(n: usize, reps: usize) -> BenchResult<Rows> {
    let pods: Vec<Pod> = (0..n).map(Pod::new).collect::<BenchResult<_>>()?;
    let handles: Vec<netns::Netns> = pods
        .iter()
        .map(|p| netns::Netns::open(&p.path()).map_err(|e| format!("{}: {e}", p.name)))
        .collect::<BenchResult<_>>()?;
    // Desired states and nft files, computed outside the timed regions.
    let base: Vec<Arc<NetnsState>> = pods.iter().map(|p| state(p, &DIAL)).collect::<BenchResult<_>>()?;
    let changed = state(&pods[0], &[DIAL[0], DIAL[1], DIAL_ADDED])?;
    let empty = Arc::new(NetnsState::default());
    let cold_files: Vec<String> =
        pods.iter().zip(&base).map(|(p, s)| write_file(p, "cold", &nft_text(s))).collect::<BenchResult<_>>()?;
    let change_file =
        write_file(&pods[0], "change", &format!("add element ip {TABLE} {MESH_DIAL_SUBNETS} {{ {DIAL_ADDED} }}\n"))?;
    let remove_text: String =
        base[0].nft_tables.iter().map(|t| format!("delete table {} {TABLE}\n", family(t))).collect();
    let remove_files: Vec<String> =
        pods.iter().map(|p| write_file(p, "remove", &remove_text)).collect::<BenchResult<_>>()?;

    let mut rows = Rows::default();
    for rep in 0..reps {
        // kuport: one executor per pod namespace, new for each repetition (as a new pod's
        // keeper), so its first apply also lists the namespace's tables.
        let mut exs: Vec<Executor> = pods.iter().map(|p| Executor::new(Some(p.path()))).collect();
        let ((), d) = timed(|| {
            for (ex, s) in exs.iter_mut().zip(&base) {
                let r = ex.apply_shared(Arc::clone(s)).map_err(|e| e.to_string())?;
                if r.writes == 0 {
                    return Err("a cold apply wrote nothing".into());
                }
            }
            Ok(())
        })?;
        rows.cold.0.0.push(d);
        let (r, d) = timed(|| exs[0].apply_shared(Arc::clone(&changed)).map_err(|e| e.to_string()))?;
        if r.writes == 0 || r.writes > 4 {
            return Err(format!("one dial subnet added through the executor: {r}"));
        }
        rows.change.0.0.push(d);
        let ours_listed = if rep == 0 { Some(pods[0].list(&handles[0])?) } else { None };
        let ((), d) = timed(|| {
            for ex in &mut exs {
                ex.apply_shared(Arc::clone(&empty)).map_err(|e| e.to_string())?;
            }
            Ok(())
        })?;
        rows.remove.0.0.push(d);
        for (p, h) in pods.iter().zip(&handles) {
            if !p.nft(h, &["list", "ruleset"])?.trim().is_empty() {
                return Err(format!("{}: tables left after the executor removed them", p.name));
            }
        }
        // The same executors again: they know the namespace's links, addresses and tables, so
        // this is the tables' write alone (the cold apply's rest is the executor's first look).
        let ((), d) = timed(|| {
            for (ex, s) in exs.iter_mut().zip(&base) {
                ex.apply_shared(Arc::clone(s)).map_err(|e| e.to_string())?;
            }
            Ok(())
        })?;
        rows.rewarm.0.0.push(d);
        for ex in &mut exs {
            ex.apply_shared(Arc::clone(&empty)).map_err(|e| e.to_string())?;
        }

        // The baseline: `nft -f` per namespace, the same tables from their text.
        let ((), d) = timed(|| {
            for ((p, h), f) in pods.iter().zip(&handles).zip(&cold_files) {
                p.nft(h, &["-f", f])?;
            }
            Ok(())
        })?;
        rows.cold.1.0.push(d);
        let (_, d) = timed(|| pods[0].nft(&handles[0], &["-f", &change_file]))?;
        rows.change.1.0.push(d);
        if let Some(ours) = ours_listed
            && pods[0].list(&handles[0])? != ours
        {
            return Err("nft's tables after the change list differently from the executor's".into());
        }
        let ((), d) = timed(|| {
            for ((p, h), f) in pods.iter().zip(&handles).zip(&remove_files) {
                p.nft(h, &["-f", f])?;
            }
            Ok(())
        })?;
        rows.remove.1.0.push(d);
    }
    for f in cold_files.iter().chain(&remove_files).chain([&change_file]) {
        let _ = std::fs::remove_file(f);
    }
    Ok(rows)
}

fn env_usize(var: &str) -> Option<usize> {
    std::env::var(var).ok()?.trim().parse().ok()
}

fn main() -> ExitCode {
    if !kuport_node_exec::sys::is_root() {
        eprintln!("the intercept benchmark needs root (network namespaces, nf_tables)");
        return ExitCode::FAILURE;
    }
    let n = env_usize("KUPORT_BENCH_PODS").unwrap_or(DEFAULT_PODS).max(1);
    let reps = env_usize("KUPORT_BENCH_REPS").unwrap_or(DEFAULT_REPS).max(1);
    eprintln!("measuring {n} pods, {reps} repetition(s)...");
    let rows = match bench(n, reps) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("\n{n} pods (an `ip` and an `ip6` table each); median (min) of {reps} runs, wall time\n");
    println!("| operation | kuport `Executor`, total | per pod | `nft -f` per netns, total | per pod |");
    println!("|---|---|---|---|---|");
    let ops = [
        (format!("cold apply, all {n} pods"), &rows.cold, n),
        (format!("apply again after removal, same executors, all {n} pods"), &rows.rewarm, n),
        ("one dial subnet added in one pod".to_string(), &rows.change, 1),
        (format!("removal, all {n} pods"), &rows.remove, n),
    ];
    for (what, (ours, nft), per) in ops {
        let ((ot, op), (nt, np)) = (ours.cells(per), nft.cells(per));
        println!("| {what} | {ot} | {op} | {nt} | {np} |");
    }
    ExitCode::SUCCESS
}
