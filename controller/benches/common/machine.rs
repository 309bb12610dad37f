//! The machine a benchmark ran on, for its report (included with `#[path]`).
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
