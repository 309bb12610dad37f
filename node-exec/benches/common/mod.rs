//! What node-exec's benchmarks share: their error type and running a command for its output.

use std::process::Command;

pub type BenchResult<T> = Result<T, String>;

/// Runs `cmd`; its stdout, or the command and its stderr as the error.
pub fn run(cmd: &mut Command) -> BenchResult<String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
