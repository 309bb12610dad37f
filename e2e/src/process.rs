//! The lab's own processes (controller replicas, executors, echo servers), started from this
//! crate's binary and ended by pid: each is either a child that dies with the thread that
//! started it (a test that dies leaves none behind) or detached in a session of its own
//! (`kuport-lab up`), known afterwards by pid and ended only while its command line is still
//! the lab's.
//!
//! The lifetime is applied by the child itself, first thing ([`adopt_lifetime`], told by
//! [`spawn`] through an environment variable), not in a `pre_exec` hook between fork and exec,
//! which the workspace does not allow outside node-exec's `sys`.

use std::fs::File;
use std::io::BufRead as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rustix::process::{Pid, Signal};

/// Tells a spawned process its [`Lifetime`]: `session`, or `parent PID`.
const LIFETIME_ENV: &str = "KUPORT_LAB_LIFETIME";

/// How a spawned process relates to the one that starts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Killed (SIGKILL) when the thread that started it ends.
    Child,
    /// In a session and process group of its own: outlives this process.
    Detached,
}

/// A process the lab started: a child of this process, or known by pid only.
#[derive(Debug)]
pub(crate) struct Proc {
    pub pid: u32,
    pub child: Option<Child>,
}

/// Starts a process with stdin closed and stderr to `stderr`; with `first_line`, waits for its
/// first line on stdout (None if it closed stdout without one). The process must call
/// [`adopt_lifetime`] (the hidden subcommands do).
pub(crate) fn spawn(
    mut cmd: Command,
    stderr: File,
    lifetime: Lifetime,
    first_line: bool,
) -> anyhow::Result<(Proc, Option<String>)> {
    cmd.stdin(Stdio::null()).stdout(if first_line { Stdio::piped() } else { Stdio::null() }).stderr(stderr);
    match lifetime {
        Lifetime::Detached => cmd.env(LIFETIME_ENV, "session"),
        Lifetime::Child => cmd.env(LIFETIME_ENV, format!("parent {}", std::process::id())),
    };
    let what = format!("{cmd:?}");
    let mut child = cmd.spawn().with_context(|| format!("starting {what}"))?;
    let mut line = None;
    if first_line && let Some(out) = child.stdout.take() {
        let mut text = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut text);
        line = Some(text);
    }
    let pid = child.id();
    // A detached process is reaped by init once this process exits; until then its handle is
    // kept so that it is reaped here when killed.
    Ok((Proc { pid, child: Some(child) }, line))
}

/// Applies the lifetime [`spawn`] asked for: a session of its own, or SIGKILL when the thread
/// that started this process ends. Nothing when started otherwise (by hand).
pub fn adopt_lifetime() -> anyhow::Result<()> {
    let Ok(wanted) = std::env::var(LIFETIME_ENV) else {
        return Ok(());
    };
    if wanted == "session" {
        rustix::process::setsid().context("leaving the lab's session")?;
        return Ok(());
    }
    let Some(parent) = wanted.strip_prefix("parent ").and_then(|p| p.parse::<i32>().ok()) else {
        bail!("{LIFETIME_ENV}={wanted:?}: expected `session` or `parent PID`");
    };
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).context("PR_SET_PDEATHSIG")?;
    // A parent that ended before the line above sent no signal: this process is an orphan.
    if rustix::process::getppid().map(Pid::as_raw_nonzero).map(|p| p.get()) != Some(parent) {
        bail!("the process that started this one has ended");
    }
    Ok(())
}

/// Sends `sig` to `pid`; a process that is gone already is not an error.
pub(crate) fn signal(pid: u32, sig: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// Ends a process: waits up to `grace` for it to exit after whatever signal it got, then
/// SIGKILLs it and reaps it (children) or waits until it is gone or a zombie (others).
pub(crate) fn kill(mut p: Proc, grace: Duration) {
    let gone = |p: &mut Proc| match &mut p.child {
        Some(c) => c.try_wait().ok().flatten().is_some(),
        None => !alive(p.pid),
    };
    if grace.is_zero() {
        signal(p.pid, Signal::KILL);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && !gone(&mut p) {
        std::thread::sleep(Duration::from_millis(5));
    }
    if !gone(&mut p) {
        signal(p.pid, Signal::KILL);
    }
    match &mut p.child {
        Some(c) => {
            let _ = c.wait();
        }
        None => {
            wait_gone(p.pid, Duration::from_secs(2));
        }
    }
}

/// Waits up to `timeout` until `pid` has exited: gone, or a zombie its parent has yet to reap.
pub(crate) fn wait_gone(pid: u32, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline && alive(pid) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `pid` still runs a command line containing every one of `words`.
pub(crate) fn owned(pid: u32, words: &[&str]) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    !cmdline.is_empty() && words.iter().all(|w| cmdline.contains(w))
}

/// Whether a process runs (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z ")
}

/// The last lines of a log, for an error message.
pub(crate) fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(10);
    format!("{}: {}", log.display(), lines[start..].join("\n"))
}
