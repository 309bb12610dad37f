//! What every root test needs from the host: the root check and running the oracle commands.

use std::process::Command;

/// True to run; false (after printing a skip line) when not root and KUPORT_SKIP_ROOT_TESTS=1.
/// Panics otherwise: CI runs these tests as root, and a silent skip would hide them.
pub fn root() -> bool {
    if kuport_node_exec::sys::is_root() {
        return true;
    }
    if std::env::var("KUPORT_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
        println!("skipped: not root and KUPORT_SKIP_ROOT_TESTS=1");
        return false;
    }
    panic!("these tests need root (network namespaces); set KUPORT_SKIP_ROOT_TESTS=1 to skip");
}

/// Runs an oracle command and returns its stdout; panics with its stderr when it fails.
pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Ends the processes inside namespace `name` (wireguard-go daemons outlive their executor and
/// keep the namespace alive), by pid: SIGTERM, up to 2 s, then SIGKILL; then deletes it.
#[allow(dead_code)] // not every root test makes namespaces with processes
pub fn remove_netns(name: &str) {
    let pids = || -> Vec<String> {
        let out = Command::new("ip").args(["netns", "pids", name]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(String::from).collect())
            .unwrap_or_default()
    };
    for pid in pids() {
        let _ = Command::new("kill").arg(&pid).status();
    }
    let start = std::time::Instant::now();
    while !pids().is_empty() && start.elapsed() < std::time::Duration::from_secs(2) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for pid in pids() {
        let _ = Command::new("kill").args(["-9", &pid]).status();
    }
    let _ = Command::new("ip").args(["netns", "del", name]).status();
}
