//! What the controller's tests against a real API server share: etcd and kube-apiserver from
//! e2e/controlplane in a temporary folder, and kubectl on them.
#![allow(dead_code)] // each test crate uses part of it

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// etcd and kube-apiserver in a temporary folder, stopped on drop.
pub struct ControlPlane {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
    /// Names the temporary folders: tests of one run may start several control planes.
    label: &'static str,
}

impl ControlPlane {
    pub fn up(label: &'static str) -> Self {
        let bin = Command::new("bash").arg(repo().join("e2e/controlplane/build.sh")).output().expect("build.sh");
        assert!(bin.status.success(), "build.sh: {}", String::from_utf8_lossy(&bin.stderr));
        let bin = String::from_utf8_lossy(&bin.stdout).lines().last().unwrap_or_default().trim().to_string();
        let dir = std::env::temp_dir().join(format!("kuport-{label}-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let up = Command::new("bash").arg(repo().join("e2e/controlplane/up.sh")).arg(&dir).output().expect("up.sh");
        assert!(up.status.success(), "up.sh: {}", String::from_utf8_lossy(&up.stderr));
        ControlPlane { kubeconfig: dir.join("kubeconfig"), kubectl: Path::new(&bin).join("kubectl"), dir, label }
    }

    /// kubectl with `args` (and `stdin`); Ok(stdout) or Err(stderr).
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write as _;
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes()).expect("stdin");
        }
        let out = child.wait_with_output().expect("kubectl output");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    pub fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        self.kubectl(args, stdin).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a, None)).expect("json")
    }

    pub fn apply_file(&self, path: &Path) {
        self.ok(&["apply", "-f", &path.display().to_string()], None);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("KUPORT_TEST_KEEP_LOGS").is_some() {
            // Keep the logs of a failed run, or when asked (down.sh removes the folder).
            let keep = std::env::temp_dir().join(format!("kuport-{}-test-logs-{}", self.label, std::process::id()));
            let _ = std::fs::create_dir_all(&keep);
            for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
                if e.path().extension().is_some_and(|x| x == "log") {
                    let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
                }
            }
            eprintln!("logs kept in {}", keep.display());
        }
        let _ = Command::new("bash").arg(repo().join("e2e/controlplane/down.sh")).arg(&self.dir).output();
    }
}
