//! The echo script's processes for the overlay root tests (tests/data/overlay_echo.py: an echo
//! server that answers with the source address it saw, a client, a DF sender), and the retry
//! loop the tests wait with.
#![allow(dead_code)] // each test uses part of it

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::netns::Netns;

pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/overlay_echo.py");
/// The echo servers' port.
pub const ECHO_PORT: u16 = 7777;

impl Netns {
    /// `ip netns exec NAME ARGS`, to run or spawn.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(args);
        c
    }
}

/// A child process ended on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the echo script in `ns` with `args` (under `timeout`) and returns its stdout.
pub fn script(ns: &Netns, args: &[&str]) -> String {
    let mut all = vec!["timeout", "20", "python3", SCRIPT];
    all.extend_from_slice(args);
    let out = ns.command(&all).output().expect("python3");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Starts the echo server in `ns` on [`ECHO_PORT`] and returns once it listens.
pub fn serve(ns: &Netns) -> Proc {
    let mut child = ns
        .command(&["python3", SCRIPT, "serve", &ECHO_PORT.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("echo server");
    let mut line = String::new();
    use std::io::BufRead as _;
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("ready");
    assert_eq!(line.trim(), "ready");
    Proc(child)
}

/// Retries `f` until it returns Some, for at most `within`.
pub fn until<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < within, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
