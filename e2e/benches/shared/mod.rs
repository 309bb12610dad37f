//! What the lab benchmarks share (included with `#[path]`): the default lab's roles and the
//! measuring helpers.
#![allow(dead_code)]

use std::net::Ipv4Addr;

/// The accepting node: every measured flow enters the cluster there.
pub const ACCEPTING: &str = "edge-a";
/// The node of the pods reached over the VXLAN link.
pub const POD_NODE: &str = "worker-2";
/// The client attached to edge-a only: every packet enters there.
pub const CLIENT: &str = "client-2";
/// edge-a's published address.
pub const PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);

/// A numeric setting from the environment, or `default`.
pub fn env_or(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// (median, min, max) of a non-empty series.
pub fn stats(xs: &[f64]) -> (f64, f64, f64) {
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
    (median, s[0], s[n - 1])
}

/// The 1-minute load average.
pub fn load_average() -> f64 {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().next().and_then(|l| l.parse().ok()).unwrap_or(f64::NAN)
}
