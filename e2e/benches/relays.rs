//! Relay transitions (issue 17, docs/overlay/relays.md "The lab"): the homes scenario of
//! `e2e/tests/common/homes.rs`, run [`RUNS`] times on a fresh lab each, every transition timed
//! from its event (the plane's start, a port forward announced, the path cut, the path
//! restored, the relay stopped) to the first pod-to-pod probe answered on the new path, with the
//! probes lost meanwhile. Printed side by side with the overlay note's hand-made run (three VMs,
//! two homes behind NAT): 44 s, 27 s, 45 s and 141 s, and no figure for a relay lost.
//!
//! Needs root. `cargo bench -p kuport-lab --bench relays`; `KUPORT_RELAY_RUNS=N` runs N labs,
//! `KUPORT_RELAY_HOLD=S` holds each cut S seconds (60 by default) before it is repaired.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

/// Labs by default.
const RUNS: usize = 3;

/// The note's figures, by transition.
const NOTE: [(&str, &str); 5] =
    [("start", "44 s"), ("port forward", "27 s"), ("cut", "45 s"), ("restore", "141 s"), ("relay loss", "-")];

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    if !kuport_lab::sys::is_root() {
        eprintln!("the relays benchmark needs root (network namespaces)");
        std::process::exit(2);
    }
    let runs = env("KUPORT_RELAY_RUNS", RUNS as u64) as usize;
    let hold = Duration::from_secs(env("KUPORT_RELAY_HOLD", 60));
    let mut by: BTreeMap<&str, Vec<common::homes::Transition>> = BTreeMap::new();
    for run in 0..runs {
        let h = common::homes::scenario(&format!("bench-{run}"), hold);
        for t in &h.transitions {
            by.entry(t.what).or_default().push(t.clone());
        }
    }
    println!(
        "\n{runs} runs, each cut held {} s; seconds from the event to the first packet on the new path",
        hold.as_secs()
    );
    println!("{:<14} {:>8} {:>8} {:>8} {:>12} {:>8}", "transition", "min", "median", "max", "lost/sent", "note");
    for (what, note) in NOTE {
        let Some(ts) = by.get(what) else { continue };
        let mut s: Vec<f64> = ts.iter().map(|t| t.first_packet.as_secs_f64()).collect();
        s.sort_by(f64::total_cmp);
        let lost: usize = ts.iter().map(|t| t.lost).sum();
        let sent: usize = ts.iter().map(|t| t.sent).sum();
        println!(
            "{what:<14} {:>8.2} {:>8.2} {:>8.2} {:>12} {note:>8}",
            s[0],
            s[s.len() / 2],
            s[s.len() - 1],
            format!("{lost}/{sent}")
        );
    }
}
