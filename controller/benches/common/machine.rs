//! The machine a benchmark ran on, for its report (included with `#[path]`).

/// The load averages (1, 5, 15 min), as /proc/loadavg gives them.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
