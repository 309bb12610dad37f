//! e2e/progress.sh, which e2e/lab.sh, e2e/test.sh and e2e/controlplane/build.sh run their long
//! steps under: a step says what it runs and how long it usually takes, is never silent for more
//! than the period (10 s), shows how far it is, and ends with its time.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// Runs `progress ARGS` in bash with `every` (None: the default period); its stdout, its stderr
/// lines with the seconds since the start at which each came, and its exit status.
fn progress(args: &str, every: Option<u32>) -> (String, Vec<(f64, String)>, i32) {
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("progress.sh");
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(format!("set -euo pipefail; . {}; progress {args}", helper.display()));
    match every {
        Some(s) => cmd.env("KUPORT_PROGRESS_EVERY", s.to_string()),
        None => cmd.env_remove("KUPORT_PROGRESS_EVERY"),
    };
    let start = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("bash");
    let stdout = child.stdout.take().expect("stdout");
    let out = std::thread::spawn(move || std::io::read_to_string(stdout).expect("stdout"));
    let lines = BufReader::new(child.stderr.take().expect("stderr"))
        .lines()
        .map(|l| (start.elapsed().as_secs_f64(), l.expect("a line")))
        .collect::<Vec<_>>();
    let status = child.wait().expect("bash ends");
    (out.join().expect("stdout thread"), lines, status.code().unwrap_or(-1))
}

#[test]
fn a_long_step_says_what_it_does_beats_every_10_s_and_ends_with_its_time() {
    let (out, lines, rc) = progress(
        r#"demo "about 25 s" bash -c 'for i in $(seq 1 25); do echo "step $i of 25" >&2; sleep 1; done; echo result'"#,
        None,
    );
    let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(rc, 0, "{text:#?}");
    assert_eq!(out, "result\n", "the step's stdout passes through");
    assert!(text[0].starts_with("[demo] bash -c for i in") && text[0].ends_with("(usually about 25 s)"), "{text:#?}");
    let beats: Vec<&&str> = text.iter().filter(|l| l.contains("s (usually about 25 s): step ")).collect();
    assert!(beats.len() >= 2, "at least two heartbeats in 25 s: {text:#?}");
    let last = text.last().expect("a last line");
    let took: u64 = last
        .strip_prefix("[demo] done in ")
        .and_then(|t| t.strip_suffix('s'))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no final time: {text:#?}"));
    assert!((25..=27).contains(&took), "{last}");
    // Never silent longer than the period (and a little slack for a loaded machine), and at most
    // one line per period.
    let times: Vec<f64> = std::iter::once(0.0).chain(lines.iter().map(|(t, _)| *t)).collect();
    for w in times.windows(2) {
        assert!(w[1] - w[0] < 12.0, "silent from {:.1} s to {:.1} s: {text:#?}", w[0], w[1]);
    }
    assert!(lines.len() <= 2 + 25 / 10, "more than a line per period: {text:#?}");
}

#[test]
fn the_heartbeat_shows_cargos_last_progress_frame() {
    // cargo draws its bar's frames separated by \r (CARGO_TERM_PROGRESS_WHEN=always).
    let (_, lines, rc) = progress(
        r#"build "seconds" bash -c 'printf "   Compiling a\n    Building [=>   ] 1/3: a\r    Building [==>  ] 2/3: b    \r" >&2; sleep 2'"#,
        Some(1),
    );
    let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(rc, 0);
    assert!(text.iter().any(|l| l.ends_with("s (usually seconds): Building 2/3: b")), "{text:#?}");
}

#[test]
fn a_failed_step_prints_its_log_and_returns_its_status() {
    let started = Instant::now();
    let (_, lines, rc) =
        progress(r#"broken "1 s" bash -c 'echo "error[E0425]: cannot find value" >&2; exit 3'"#, Some(10));
    let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(rc, 3, "{text:#?}");
    // The heartbeat's sleep does not outlive the step (it held stderr open for 10 s once).
    assert!(started.elapsed().as_secs_f64() < 5.0, "took {:?}", started.elapsed());
    assert!(text.contains(&"error[E0425]: cannot find value"), "{text:#?}");
    assert!(text.last().is_some_and(|l| l.starts_with("[broken] FAILED (exit 3) after ")), "{text:#?}");
}

#[test]
fn a_quiet_step_done_within_the_period_prints_nothing_and_a_slow_one_everything() {
    let (out, lines, rc) = progress(r#"-q warm "seconds" bash -c 'echo built'"#, Some(10));
    assert_eq!((out.as_str(), lines.len(), rc), ("built\n", 0, 0), "{lines:#?}");
    let (_, lines, rc) = progress(r#"-q cold "3 s" sleep 3"#, Some(1));
    let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(rc, 0);
    assert_eq!(text[0], "[cold] sleep 3 (usually 3 s)", "{text:#?}");
    assert!(text.iter().filter(|l| l.contains("s (usually 3 s)")).count() >= 2, "{text:#?}");
    assert!(text.last().is_some_and(|l| l.starts_with("[cold] done in ")), "{text:#?}");
    assert!(text[1].ends_with("s (usually 3 s): (nothing printed yet)"), "{text:#?}");
}

#[test]
fn the_heartbeat_counts_what_the_step_printed() {
    // go build -v: a package name a line.
    let (_, lines, rc) =
        progress(r#"-n packages go "seconds" bash -c 'printf "a/b\nc/d\nk8s.io/x\n" >&2; sleep 2'"#, Some(1));
    let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(rc, 0);
    assert!(text.iter().any(|l| l.ends_with("s (usually seconds): 3 packages so far, the last k8s.io/x")), "{text:#?}");
}
