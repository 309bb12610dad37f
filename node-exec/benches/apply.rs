//! Apply benchmark: our nf_tables codec against `nft -f`, in scratch network namespaces.
//!
//! Run as root, release build: `cargo bench -p kuport-node-exec --bench apply`.
//! KUPORT_BENCH_SIZES (comma-separated mapping counts) and KUPORT_BENCH_REPS override the
//! defaults. Prints a markdown table of median and minimum wall times.

mod common {
    include!("../tests/common/example.rs");
}

use std::fmt::Write as _;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use common::*;
use kuport_node_exec::nft::{Applier, ApplyMode, apply_table, remove_table};
use kuport_proto::v1::{L4Proto, NftElement, NftFamily, NftSet, NftTable};

/// Mapping counts measured by default.
const DEFAULT_SIZES: [usize; 3] = [1_000, 10_000, 50_000];
/// Repetitions of each measurement (median and minimum are reported).
const DEFAULT_REPS: usize = 5;
/// Every RANGE_EVERY-th mapping publishes a UDP port range instead of one TCP port.
const RANGE_EVERY: usize = 10;
/// Ports of a published range.
const RANGE_WIDTH: u32 = 10;
/// First node port handed out (mapping i publishes FIRST_NODE_PORT + i).
const FIRST_NODE_PORT: u32 = 5_000;
/// The pod-side port of single-port mappings, and the first of range mappings.
const POD_PORT: u32 = 8_080;
const POD_RANGE_FIRST: u32 = 27_015;
/// The return mark of single-mode links (kuport's 0x6b70 prefix).
const RETURN_MARK: u32 = 0x6b70_0001;
const TABLE: &str = "kuport";

type BenchResult<T> = Result<T, String>;

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
        let ns = File::open(self.path()).map_err(|e| format!("{}: {e}", self.name))?;
        let fd = ns.as_raw_fd();
        let mut cmd = Command::new("nft");
        cmd.args(args);
        // SAFETY: setns is async-signal-safe; fd stays open in the parent until the child execs.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        run(&mut cmd)
    }
    fn nft_file(&self, text: &str, tag: &str) -> BenchResult<Duration> {
        let file = std::env::temp_dir().join(format!("{}-{tag}.nft", self.name));
        std::fs::write(&file, text).map_err(|e| format!("{}: {e}", file.display()))?;
        let f = file.to_string_lossy().into_owned();
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

fn run(cmd: &mut Command) -> BenchResult<String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The elements one mapping adds, by set name (what the controller renders for one published
/// port of a pod in single mode: the DNAT, the request and reply claims, the return mark).
fn mapping(i: usize) -> Vec<(&'static str, NftElement)> {
    let ip = format!("10.244.{}.{}", i / 250, i % 250 + 2);
    let node_port = FIRST_NODE_PORT + i as u32;
    let (proto_, ports) = if i % RANGE_EVERY == RANGE_EVERY - 1 {
        (L4Proto::Udp, port(POD_RANGE_FIRST, POD_RANGE_FIRST + RANGE_WIDTH - 1))
    } else {
        (L4Proto::Tcp, port(POD_PORT, POD_PORT))
    };
    let publish = if proto_ == L4Proto::Udp {
        // Ranges publish node ports [p - width + 1, p], disjoint between range mappings.
        let first = node_port + 1 - RANGE_WIDTH;
        ("publish_range", elem(vec![ifname("enp1s0"), proto(proto_), port(first, node_port)], vec![addr(&ip)]))
    } else {
        (
            "publish_port",
            elem(vec![ifname("enp1s0"), proto(proto_), port(node_port, node_port)], vec![addr(&ip), ports.clone()]),
        )
    };
    vec![
        publish,
        ("claim", elem(vec![ifname("cilium_host"), addr(&ip), proto(proto_), ports.clone()], vec![])),
        ("reply_claim", elem(vec![addr(&ip), proto(proto_), ports.clone()], vec![])),
        ("return_mark", elem(vec![addr(&ip), proto(proto_), ports], vec![mark(RETURN_MARK)])),
    ]
}

fn set_mut<'a>(t: &'a mut NftTable, name: &str) -> BenchResult<&'a mut NftSet> {
    t.sets.iter_mut().find(|s| s.name == name).ok_or_else(|| format!("no set {name}"))
}

/// The kuport example table (its chains, ct_mark and link_range) with `n` mappings.
fn table(n: usize) -> BenchResult<NftTable> {
    let mut t = kuport_example();
    for s in ["publish_port", "publish_range", "claim", "reply_claim", "return_mark"] {
        set_mut(&mut t, s)?.elements.clear();
    }
    for i in 0..n {
        for (s, e) in mapping(i) {
            set_mut(&mut t, s)?.elements.push(e);
        }
    }
    Ok(t)
}

fn with_mapping(base: &NftTable, i: usize) -> BenchResult<NftTable> {
    let mut t = base.clone();
    for (s, e) in mapping(i) {
        set_mut(&mut t, s)?.elements.push(e);
    }
    Ok(t)
}

/// `add element` (or `delete element`, keys only) lines for mapping `i`, in nft syntax.
fn element_lines(base: &NftTable, i: usize, delete: bool) -> BenchResult<String> {
    let mut out = String::new();
    for (s, e) in mapping(i) {
        let set = base.sets.iter().find(|x| x.name == s).ok_or_else(|| format!("no set {s}"))?;
        // The renderer's own element text: a one-element table, cut at `elements = {`.
        let one = NftTable {
            sets: vec![NftSet { elements: vec![e], counter: false, ..set.clone() }],
            chains: vec![],
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
        let _ = writeln!(out, "{verb} element ip {TABLE} {s} {{ {body} }}");
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

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

fn nft_err(e: kuport_node_exec::nft::NftError) -> String {
    e.to_string()
}

struct Row {
    what: &'static str,
    ours: Samples,
    nft: Samples,
}

fn bench_size(n: usize, reps: usize, out: &mut Vec<(usize, usize, Vec<Row>)>) -> BenchResult<()> {
    // KUPORT_BENCH_QUICK=1: the applier alone (for profiling; nft and read-back skipped).
    let quick = std::env::var("KUPORT_BENCH_QUICK").as_deref() == Ok("1");
    let base = table(n)?;
    let elements: usize = base.sets.iter().map(|s| s.elements.len()).sum();
    let base_text = kuport_proto::text::nft_table(&base);
    let ours_ns = Netns::new(&format!("{n}-ours"))?;
    let nft_ns = Netns::new(&format!("{n}-nft"))?;
    let path = ours_ns.path();
    let mut cold = Row { what: "cold apply into an empty netns", ours: Samples::default(), nft: Samples::default() };
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

    // Warm applier: remembers `base` from one cold apply.
    let mut applier = Applier::new(Some(&path));
    applier.apply(&base).map_err(nft_err)?;
    let plus: Vec<NftTable> = (0..reps).map(|k| with_mapping(&base, n + k)).collect::<BenchResult<_>>()?;
    let mut add = Row { what: "add one mapping (4 elements)", ours: Samples::default(), nft: Samples::default() };
    let mut del = Row { what: "remove that mapping", ours: Samples::default(), nft: Samples::default() };
    let mut readback =
        Row { what: "add one mapping, read-back `apply_table`", ours: Samples::default(), nft: Samples::default() };
    let mut reload =
        Row { what: "add one mapping, whole-table `nft -f` reload", ours: Samples::default(), nft: Samples::default() };
    for (k, t) in plus.iter().enumerate() {
        let (r, d) = timed(|| applier.apply(t));
        let r = r.map_err(nft_err)?;
        if (r.mode.clone(), r.writes, r.batches) != (ApplyMode::Elements, 4, 1) {
            return Err(format!("{n}: one mapping wrote {r:?}"));
        }
        add.ours.push(d);
        if quick {
            applier.apply(&base).map_err(nft_err)?;
            continue;
        }
        if k == 0 {
            let expect = ours_ns.list()?;
            nft_ns.nft_file(&element_lines(&base, n + k, false)?, "check")?;
            if nft_ns.list()? != expect {
                return Err(format!("{n}: nft's element add lists differently from ours"));
            }
            nft_ns.nft_file(&element_lines(&base, n + k, true)?, "uncheck")?;
        }
        let (r, d) = timed(|| applier.apply(&base));
        r.map_err(nft_err)?;
        del.ours.push(d);
        add.nft.push(nft_ns.nft_file(&element_lines(&base, n + k, false)?, "add")?);
        del.nft.push(nft_ns.nft_file(&element_lines(&base, n + k, true)?, "del")?);

        let (r, d) = timed(|| apply_table(Some(&path), t));
        r.map_err(nft_err)?;
        readback.ours.push(d);
        apply_table(Some(&path), &base).map_err(nft_err)?;
        reload.nft.push(nft_ns.nft_file(&reload_text(t), "reload")?);
    }
    // The applier forgot nothing: the read-back applies above restored `base` each time.
    let mut noop =
        Row { what: "no-op reconcile (Applier with memory)", ours: Samples::default(), nft: Samples::default() };
    let mut noop_rb =
        Row { what: "no-op reconcile, read-back `apply_table`", ours: Samples::default(), nft: Samples::default() };
    for _ in 0..reps {
        let (r, d) = timed(|| applier.apply(&base));
        if r.map_err(nft_err)?.writes != 0 {
            return Err(format!("{n}: a no-op wrote"));
        }
        noop.ours.push(d);
        if quick {
            continue;
        }
        let (r, d) = timed(|| apply_table(Some(&path), &base));
        r.map_err(nft_err)?;
        noop_rb.ours.push(d);
    }
    out.push((n, elements, vec![cold, add, del, readback, reload, noop, noop_rb]));
    Ok(())
}

fn env_list(var: &str) -> Option<Vec<usize>> {
    let v = std::env::var(var).ok()?;
    v.split(',').map(|s| s.trim().parse().ok()).collect()
}

fn main() -> ExitCode {
    // `cargo bench` passes --bench; nothing else is accepted.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("the apply benchmark needs root (network namespaces, nf_tables)");
        return ExitCode::FAILURE;
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
