//! What the controller's tests against a real API server share: etcd and kube-apiserver from
//! e2e/controlplane in a temporary folder, and kubectl on them.
#![allow(dead_code)] // each test crate uses part of it

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

pub mod executor;

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
        // Its own discovery cache: kubectl keys the shared one by host and port, and another API
        // server that had this port before leaves a discovery without kuport's group there.
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("kubectl-cache"))
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

    /// Waits until each CRD is Established. `kubectl wait` fails at once, rather than waiting,
    /// while a CRD just created has no conditions yet ("accessor error"), so it is asked again.
    pub fn established(&self, crds: &[&str]) {
        let mut args = vec!["wait", "--for=condition=Established", "--timeout=30s"];
        args.extend(crds.iter().copied());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match self.kubectl(&args, None) {
                Ok(_) => return,
                Err(e) if std::time::Instant::now() < deadline => {
                    assert!(e.contains("accessor error"), "kubectl {args:?}: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Err(e) => panic!("kubectl {args:?}: {e}"),
            }
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

/// The executors' side of trust on a test control plane: their ServiceAccount and one Pod per
/// node in `namespace` (spec.nodeName set, as the DaemonSet's), pod-bound tokens as a kubelet
/// mints them, and the controller's CA bundle.
impl ControlPlane {
    /// ServiceAccount kuport-node-exec and a Pod `node-exec-<node>` per node (the Nodes must exist:
    /// a token names its Pod's node only if the API server finds that Node).
    pub fn executor_pods(&self, namespace: &str, nodes: &[&str]) {
        let mut yaml = format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: kuport-node-exec, namespace: {namespace}}}\n"
        );
        for node in nodes {
            yaml.push_str(&format!(
                "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: node-exec-{node}, namespace: {namespace}}}\n\
                 spec: {{nodeName: {node}, serviceAccountName: kuport-node-exec, containers: [{{name: node-exec, image: kuport-node-exec}}]}}\n"
            ));
        }
        self.ok(&["apply", "-f", "-"], Some(&yaml));
    }

    /// A token of `service_account` for `audience` bound to Pod `pod`, as the kubelet mints one.
    pub fn bound_token(&self, namespace: &str, service_account: &str, pod: &str, audience: &str) -> String {
        let uid = self.ok(&["get", "pod", "-n", namespace, pod, "-o", "jsonpath={.metadata.uid}"], None);
        let token = self.ok(
            &[
                "create",
                "token",
                service_account,
                "-n",
                namespace,
                "--audience",
                audience,
                "--bound-object-kind",
                "Pod",
                "--bound-object-name",
                pod,
                "--bound-object-uid",
                uid.trim(),
                "--duration",
                "1h",
            ],
            None,
        );
        token.trim().to_string()
    }

    /// The executor token of `node` (its Pod `node-exec-<node>` in `namespace`).
    pub fn executor_token(&self, namespace: &str, node: &str) -> String {
        self.bound_token(
            namespace,
            "kuport-node-exec",
            &format!("node-exec-{node}"),
            kuport_controller::trust::EXECUTOR_AUDIENCE,
        )
    }

    /// The controller's CA bundle from ConfigMap kuport-ca in `namespace`, waiting up to 30 s
    /// for a controller to publish it.
    pub fn ca(&self, namespace: &str) -> Vec<u8> {
        let started = std::time::Instant::now();
        loop {
            let jsonpath = "jsonpath={.data.ca\\.crt}";
            if let Ok(pem) = self.kubectl(&["get", "configmap", "-n", namespace, "kuport-ca", "-o", jsonpath], None)
                && pem.contains("BEGIN CERTIFICATE")
            {
                return pem.into_bytes();
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(30), "no ConfigMap {namespace}/kuport-ca");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// A ServiceAccount `name` in `namespace`, allowed Debug (get and list nodestates, get
    /// portmaps) when `allowed`, and a token of it for the API server's own audience.
    pub fn debug_token(&self, namespace: &str, name: &str, allowed: bool) -> String {
        self.ok(&["create", "serviceaccount", "-n", namespace, name], None);
        if allowed {
            let role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: kuport-test-debug}\n\
                rules: [{apiGroups: [kuport.wlz.li], resources: [nodestates], verbs: [get, list]}, {apiGroups: [kuport.wlz.li], resources: [portmaps], verbs: [get]}]\n";
            self.ok(&["apply", "-f", "-"], Some(role));
            let binding = format!("kuport-test-debug-{name}");
            let sa = format!("--serviceaccount={namespace}:{name}");
            self.ok(&["create", "clusterrolebinding", &binding, "--clusterrole=kuport-test-debug", &sa], None);
        }
        self.ok(&["create", "token", "-n", namespace, name, "--duration", "1h"], None).trim().to_string()
    }
}

/// A NodeSync client for the controller at `address` (host:port) over TLS with `ca`.
pub async fn node_sync(
    address: &str,
    ca: &[u8],
) -> Result<kuport_proto::v1::node_sync_client::NodeSyncClient<tonic::transport::Channel>, String> {
    let endpoint =
        kuport_proto::channel::endpoint(&format!("https://{address}"), Some(ca)).map_err(|e| e.to_string())?;
    let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
    Ok(kuport_proto::v1::node_sync_client::NodeSyncClient::new(channel))
}

/// `request` with `authorization: Bearer <token>`.
pub fn bearer<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    kuport_proto::channel::authorize(&mut request, token).expect("a valid token");
    request
}

/// One controller process (`kuport-controller run`) against `cp`, killed on drop; its log is
/// `<identity>.log` in the control plane's folder (kept when a test fails).
pub struct Controller {
    pub child: std::process::Child,
    metrics: String,
    log: PathBuf,
}

impl Controller {
    /// Replica `identity` on `address`, electing on the Lease in `lease_namespace`, with `args`
    /// added and the log filter `log_level`.
    pub fn start(
        cp: &ControlPlane,
        identity: &str,
        address: &str,
        lease_namespace: &str,
        args: &[&str],
        log_level: &str,
    ) -> Self {
        let metrics = free_address();
        let log = cp.dir.join(format!("{identity}.log"));
        let file = std::fs::File::create(&log).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_kuport-controller"))
            .args(["run", "--listen", address, "--lease-namespace", lease_namespace, "--identity", identity])
            .args(["--metrics-listen", &metrics])
            .args(args)
            .env("KUBECONFIG", &cp.kubeconfig)
            .env("KUPORT_LOG_LEVEL", log_level)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("controller");
        Controller { child, metrics, log }
    }

    /// GET /metrics.
    pub fn metrics(&self) -> String {
        use std::io::{Read as _, Write as _};
        let Ok(mut c) = std::net::TcpStream::connect(&self.metrics) else { return String::new() };
        let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n");
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    }

    /// The value of the metric line starting with `series`, 0 if absent.
    pub fn counter(&self, series: &str) -> u64 {
        let m = self.metrics();
        m.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([sig, &self.child.id().to_string()]).status();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free address on 127.0.0.1.
/// A loopback address for a server a test starts. Its port is below the kernel's ephemeral
/// range, so an outgoing connection (kubectl's, a client's) cannot take it between this check
/// and the server's bind, as one did with a port from `bind(0)`; and never one this process
/// handed out before, so two calls never name the same port.
pub fn free_address() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|low| *low > 12_000)
        .unwrap_or(32_768);
    // Each test process starts at its own offset: processes run one after the other, but a
    // server of an earlier one may still be going away.
    let span = low - 10_000;
    let start = std::process::id() * 7_919 % span;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < span, "no free port below {low}");
        let port = 10_000 + (start + n * 101) % span;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return format!("127.0.0.1:{port}");
        }
    }
}

/// Waits for `what` to hold within `limit`, checking every 100 ms; returns how long it took.
pub async fn within(
    limit: std::time::Duration,
    what: &str,
    mut f: impl FnMut() -> Result<(), String>,
) -> std::time::Duration {
    let started = std::time::Instant::now();
    loop {
        match f() {
            Ok(()) => return started.elapsed(),
            Err(e) if started.elapsed() > limit => panic!("{what}: not within {limit:?}: {e}"),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
}
