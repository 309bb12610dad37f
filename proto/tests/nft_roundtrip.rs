//! The renderer against the real thing: each fixture table is rendered, loaded with `nft -f`
//! into a fresh network namespace, listed with `nft -s list table`, and the listing must equal
//! the rendering byte for byte.
//!
//! Needs root and nft (1.0.6, the version the renderer mimics). Without them the test fails,
//! unless KUPORT_SKIP_ROOT_TESTS=1 is set, in which case it says so and passes.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use kuport_proto::text::nft_table;
use kuport_proto::v1::{NftFamily, NftTable};

/// A scratch network namespace, deleted on drop so a failing assertion leaves nothing behind.
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!("kuport-rt-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let out = run(Command::new("ip").args(["netns", "add", &name]));
        assert!(out.status.success(), "ip netns add {name}: {}", String::from_utf8_lossy(&out.stderr));
        Netns { name }
    }

    fn exec(&self, args: &[&str]) -> Output {
        run(Command::new("ip").args(["netns", "exec", &self.name]).args(args))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Best effort: a panic in drop during unwinding would abort and hide the real failure.
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// A temporary file, removed on drop.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn run(cmd: &mut Command) -> Output {
    match cmd.output() {
        Ok(out) => out,
        Err(e) => panic!("cannot run {cmd:?}: {e}"),
    }
}

fn is_root() -> bool {
    // The effective uid is the second field of /proc/self/status's Uid line.
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1).map(|euid| euid == "0"))
            .unwrap_or(false)
    })
}

fn has(cmd: &str, arg: &str) -> bool {
    Command::new(cmd).arg(arg).output().is_ok_and(|o| o.status.success())
}

/// Whether the environment can run the round trip; panics with the reason if it cannot and
/// skipping was not asked for.
fn environment_ready() -> bool {
    let missing = if !is_root() {
        Some("this test must run as root (it creates network namespaces)")
    } else if !has("nft", "--version") {
        Some("nft is not installed")
    } else if !has("ip", "-V") {
        Some("ip (iproute2) is not installed")
    } else {
        None
    };
    match missing {
        None => true,
        Some(why) if std::env::var("KUPORT_SKIP_ROOT_TESTS").is_ok_and(|v| v == "1") => {
            println!("skipping nft round trip: {why} (KUPORT_SKIP_ROOT_TESTS=1)");
            false
        }
        Some(why) => {
            panic!("nft round trip cannot run: {why}; set KUPORT_SKIP_ROOT_TESTS=1 to skip")
        }
    }
}

fn family(t: &NftTable) -> &'static str {
    match NftFamily::try_from(t.family) {
        Ok(NftFamily::Ip) => "ip",
        Ok(NftFamily::Ip6) => "ip6",
        Ok(NftFamily::Inet) => "inet",
        _ => panic!("fixture {} has no family", t.name),
    }
}

/// Loads `rendered` into a fresh namespace and returns what nft lists, or the load error.
fn load_and_list(t: &NftTable, rendered: &str) -> Result<String, String> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "kuport-rt-{}-{}.nft",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, rendered).map_err(|e| format!("write {}: {e}", path.display()))?;
    let file = TempFile(path);
    let ns = Netns::new();
    let Some(path) = file.0.to_str() else {
        return Err(format!("temp path {} is not UTF-8", file.0.display()));
    };
    let load = ns.exec(&["nft", "-f", path]);
    if !load.status.success() {
        return Err(format!("nft -f failed:\n{}", String::from_utf8_lossy(&load.stderr)));
    }
    let list = ns.exec(&["nft", "-s", "list", "table", family(t), &t.name]);
    if !list.status.success() {
        return Err(format!("nft list failed:\n{}", String::from_utf8_lossy(&list.stderr)));
    }
    Ok(String::from_utf8_lossy(&list.stdout).into_owned())
}

/// Where two texts first differ, line by line, to point at the culprit in long tables.
fn first_difference(rendered: &str, listed: &str) -> String {
    let (mut r, mut l) = (rendered.lines(), listed.lines());
    for n in 1.. {
        match (r.next(), l.next()) {
            (None, None) => break,
            (a, b) if a == b => continue,
            (a, b) => {
                return format!(
                    " at line {n}:\n  rendered: {}\n  listed:   {}",
                    a.unwrap_or("<end>"),
                    b.unwrap_or("<end>")
                );
            }
        }
    }
    " (only in trailing whitespace)".to_string()
}

#[test]
fn rendered_tables_list_back_unchanged() {
    if !environment_ready() {
        return;
    }
    let mut failures = Vec::new();
    for t in common::loadable_tables() {
        let rendered = nft_table(&t);
        match load_and_list(&t, &rendered) {
            Ok(listed) if listed == rendered => {}
            Ok(listed) => failures.push(format!(
                "table {}: nft lists something else{}\n--- rendered\n{rendered}--- listed\n{listed}",
                t.name,
                first_difference(&rendered, &listed)
            )),
            Err(e) => failures.push(format!("table {}: {e}\n--- rendered\n{rendered}", t.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
