//! Running things inside network namespaces: a thread that enters one, sysctls, and the `ip`,
//! `tc` and `nft` commands the lab builds its network with (the lab is test equipment: unlike
//! the executor, it may shell out).

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};
use kuport_node_exec::sys::{self as executor_sys, netns};

/// Where `ip netns add` mounts its namespaces.
pub const NETNS_DIR: &str = "/run/netns";

pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Runs `work` on a fresh thread inside the namespace at `path` and returns its result.
/// Sockets the work creates stay in that namespace wherever they are used afterwards.
pub fn in_netns<T: Send>(path: &Path, work: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let done: Result<io::Result<T>, executor_sys::Error> = netns::run(Some(path), || Ok(work()));
    done.map_err(|e| {
        // The kind of the underlying failure (a missing namespace file is NotFound).
        let kind = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<io::Error>())
            .map_or(io::ErrorKind::Other, io::Error::kind);
        io::Error::new(kind, e.to_string())
    })?
}

/// Sets sysctls (`net.ipv4.ip_forward` style keys) inside a namespace.
pub fn sysctls(path: &Path, settings: &[(&str, &str)]) -> anyhow::Result<()> {
    in_netns(path, || {
        for (key, value) in settings {
            let file = Path::new("/proc/sys").join(key.replace('.', "/"));
            std::fs::write(&file, value).map_err(|e| io::Error::new(e.kind(), format!("{key}={value}: {e}")))?;
        }
        Ok(())
    })
    .with_context(|| format!("sysctls in {}", path.display()))
}

/// Runs a command to completion; fails with its stderr.
pub fn run(cmd: &str, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).with_context(|| format!("writing to {cmd}"))?;
    }
    let out = child.wait_with_output().with_context(|| format!("waiting for {cmd}"))?;
    if !out.status.success() {
        bail!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -n NETNS -batch -`: one transaction per line, stopping at the first failure, which is
/// reported with its line.
pub fn ip_batch(netns: &str, lines: &[String]) -> anyhow::Result<()> {
    batch("ip", netns, lines)
}

/// `tc -n NETNS -batch -`.
pub fn tc_batch(netns: &str, lines: &[String]) -> anyhow::Result<()> {
    batch("tc", netns, lines)
}

fn batch(cmd: &str, netns: &str, lines: &[String]) -> anyhow::Result<()> {
    if lines.is_empty() {
        return Ok(());
    }
    let text = lines.join("\n") + "\n";
    run(cmd, &["-n", netns, "-batch", "-"], Some(&text)).map(|_| ()).map_err(|e| {
        // iproute2 names the failing line as "Command failed -:N".
        let msg = e.to_string();
        let line = msg
            .rsplit_once("Command failed -:")
            .and_then(|(_, n)| n.trim().parse::<usize>().ok())
            .and_then(|n| lines.get(n.wrapping_sub(1)));
        match line {
            Some(l) => anyhow::anyhow!("{cmd} in {netns}: `{l}`: {msg}"),
            None => anyhow::anyhow!("{cmd} in {netns}: {msg}"),
        }
    })
}

/// `nft -f -` inside a namespace.
pub fn nft(netns: &str, ruleset: &str) -> anyhow::Result<String> {
    run("ip", &["netns", "exec", netns, "nft", "-f", "-"], Some(ruleset)).with_context(|| format!("nft in {netns}"))
}

/// An `ip` command inside a namespace; its stdout.
pub fn ip(netns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["-n", netns];
    all.extend_from_slice(args);
    run("ip", &all, None)
}

/// The namespaces `ip netns list` shows.
pub fn netns_list() -> anyhow::Result<Vec<String>> {
    let out = run("ip", &["netns", "list"], None)?;
    Ok(out.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect())
}

/// Deletes a namespace; Ok when it is gone (or never was).
pub fn netns_del(name: &str) -> anyhow::Result<()> {
    if !netns_path(name).exists() {
        return Ok(());
    }
    run("ip", &["netns", "del", name], None).map(|_| ())
}

/// True when this process runs as root.
pub fn is_root() -> bool {
    executor_sys::is_root()
}
