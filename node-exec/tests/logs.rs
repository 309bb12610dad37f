//! The executor's text logs off a terminal: no colour codes. The kubelet stores a pod's stderr
//! verbatim, so escape sequences would land in `kubectl logs` and every log collector (seen on the
//! real node, e2e/realnode/chart.sh).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn text_logs_carry_no_colour_codes_when_stderr_is_no_terminal() {
    let dir = std::env::temp_dir().join(format!("kuport-logs-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("state dir");
    // A controller that is not there: the executor starts, logs, and keeps retrying.
    let mut child = Command::new(env!("CARGO_BIN_EXE_kuport-node-exec"))
        .args(["run", "--controller", "http://127.0.0.1:1", "--node", "logs-test", "--cri-socket", "none"])
        .args(["--log-format", "text", "--log-level", "info", "--state-dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kuport-node-exec");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok).take(2) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let lines: Vec<String> = (0..2).map_while(|_| rx.recv_timeout(Duration::from_secs(20)).ok()).collect();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!lines.is_empty(), "the executor logged nothing within 20 s");
    for line in &lines {
        assert!(!line.contains('\u{1b}'), "a colour code in a log line off a terminal: {line:?}");
        assert!(line.contains("INFO") || line.contains("WARN"), "not a log line: {line:?}");
    }
}
