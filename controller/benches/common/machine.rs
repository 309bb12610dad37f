//! The machine a benchmark ran on, for its report, and its clock and memory (included with
//! `#[path]`).
#![allow(dead_code)]

/// The load averages (1, 5, 15 min), as /proc/loadavg gives them.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The CPU time (user and system) this thread has used, from /proc/thread-self/stat in clock
/// ticks (100 per second): unlike wall time, it leaves out the time other work held the CPUs.
pub fn cpu_time() -> std::time::Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // The fields after the command, whose parentheses may hold spaces: utime and stime are the
    // 14th and 15th of the line, the 12th and 13th after ")".
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let ticks: u64 = after.split_whitespace().skip(11).take(2).filter_map(|v| v.parse::<u64>().ok()).sum();
    std::time::Duration::from_millis(ticks * 10)
}

/// A field of /proc/self/status, in kB.
pub fn proc_status(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Resets VmHWM to the current RSS; false where the kernel refuses.
pub fn reset_hwm() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

pub fn timed<T>(f: impl FnOnce() -> T) -> (std::time::Duration, T) {
    let t = std::time::Instant::now();
    let v = f();
    (t.elapsed(), v)
}

pub fn median_min(mut v: Vec<std::time::Duration>) -> (std::time::Duration, std::time::Duration) {
    v.sort();
    (v[v.len() / 2], v[0])
}

pub fn ms(d: std::time::Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms >= 100.0 { format!("{ms:.0} ms") } else { format!("{ms:.1} ms") }
}
