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
