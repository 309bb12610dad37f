//! Trust on the controller's port with the lab's Kubernetes source (docs/security.md): executors
//! sync over TLS, each with the pod-bound token of its own node's Pod; an executor that claims
//! another node than its token proves is refused while the others keep syncing; Debug needs a
//! token RBAC lets read it; and a new serving certificate in the Secret kuport-controller-tls is
//! served to new handshakes at once, with the executors synced and no probe lost.
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kuport_lab::apiserver::LEASE_NAMESPACE;
use kuport_lab::plane::{self, PlaneOptions, converged, synced, trust};
use kuport_lab::probe::Prober;
use kuport_lab::{Lab, Manifests, Plane};
use kuport_proto::v1::ListNodesRequest;

const NODES: [&str; 3] = ["edge-a", "worker-1", "worker-2"];

/// A default lab on a local API server, `replicas` controllers, the game range and a TCP mapping to
/// api-0 (both pods on worker-2, the class accepting on edge-a).
struct Secured {
    lab: Option<Lab>,
    api: Option<OwnedApiServer>,
    dir: PathBuf,
}

impl Secured {
    fn start(tag: &str, replicas: usize) -> Secured {
        let dir = std::env::temp_dir().join(format!("kuport-trust-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let api = OwnedApiServer::up(&dir.join("controlplane"));
        let mut lab = default_lab();
        let manifests = Manifests::default_lab()
            .add("api.yaml", &port_map("apps", "api", "public", "TCP", "9000", "api", "api"))
            .expect("loads");
        let mut options = PlaneOptions::new(env!("CARGO_BIN_EXE_kuport-lab"), dir.join("plane"));
        options.kubernetes = Some(api.source(None, replicas));
        let started = Instant::now();
        lab.start_plane(&manifests, options).expect("the controllers and executors start");
        let took = lab.plane().expect("a plane").wait_converged(plane::CONVERGE_TIMEOUT).expect("the lab converges");
        println!(
            "[{tag}] {replicas} controller(s), 3 executors over TLS: converged {:.2} s after start ({:.2} s waiting)",
            started.elapsed().as_secs_f64(),
            took.as_secs_f64()
        );
        Secured { lab: Some(lab), api: Some(api), dir }
    }

    fn lab(&self) -> &Lab {
        self.lab.as_ref().expect("the lab")
    }

    fn plane(&self) -> &Plane {
        self.lab().plane().expect("the plane")
    }

    fn plane_mut(&mut self) -> &mut Plane {
        self.lab.as_mut().and_then(|l| l.plane_mut()).expect("the plane")
    }

    fn api(&self) -> &kuport_lab::apiserver::ApiServer {
        &self.api.as_ref().expect("the API server").0
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.plane().dir().join(name)).unwrap_or_default()
    }

    /// Every replica's log, one after the other.
    fn controller_logs(&self) -> String {
        (0..self.plane().addresses().len()).map(|i| self.log(&plane::controller_log(i))).collect()
    }

    /// The game range and the TCP mapping, probed every 20 ms from both clients.
    fn prober(&self) -> Prober {
        standard_prober(self.lab(), Duration::from_millis(20), Duration::from_millis(300))
    }
}

impl Drop for Secured {
    fn drop(&mut self) {
        drop(self.lab.take());
        drop(self.api.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// base64 (standard or URL alphabet, padding optional) decoded.
fn unbase64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' | b'-' => 62,
        b'/' | b'_' => 63,
        _ => panic!("not base64: {c:?}"),
    };
    let digits: Vec<u8> = text.bytes().filter(|c| !b"=\n\r ".contains(c)).map(value).collect();
    let mut out = Vec::new();
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, d)| n | (u32::from(*d) << (18 - 6 * i)));
        out.extend(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// A JWT's claims.
fn claims(token: &str) -> serde_json::Value {
    let payload = token.trim().split('.').nth(1).expect("a JWT");
    serde_json::from_slice(&unbase64(payload)).expect("JSON claims")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The serial of the certificate a new TLS handshake with `address` presents (`openssl
/// s_client`, under the one server name every client verifies).
fn served_serial(address: std::net::SocketAddr) -> String {
    let script = format!(
        "openssl s_client -connect {address} -servername {} -alpn h2 </dev/null 2>/dev/null \
         | openssl x509 -noout -serial",
        kuport_proto::channel::SERVER_NAME
    );
    run(Command::new("bash").args(["-c", &script])).trim().to_string()
}

/// The executors sync over TLS, each with its own Pod's token (which names its node); Debug
/// refuses a call without a token and one with an executor's token; an executor started for
/// worker-1 with worker-2's token is refused (its log and the leader's say why) while edge-a and
/// worker-2 stay synced; worker-1's own executor then syncs again.
#[test]
fn executors_prove_their_node_and_an_impostor_is_refused() {
    if !root() {
        return;
    }
    let mut s = Secured::start("identity", 1);
    let plane = s.plane();
    assert!(plane.secure(), "the Kubernetes source is TLS");
    for node in NODES {
        let file = plane.token_file(node);
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).expect("a token").permissions());
        assert_eq!(mode & 0o777, 0o600, "{}", file.display());
        let c = claims(&std::fs::read_to_string(&file).expect("readable"));
        let k = &c["kubernetes.io"];
        assert_eq!(k["node"]["name"], node, "{node}'s token names its node: {c}");
        assert_eq!(k["pod"]["name"], trust::pod_name(node), "{c}");
        assert_eq!(k["serviceaccount"]["name"], trust::EXECUTOR_SERVICE_ACCOUNT, "{c}");
        assert_eq!(c["aud"], serde_json::json!([trust::EXECUTOR_AUDIENCE]), "{c}");
        let life = c["exp"].as_i64().expect("exp") - c["iat"].as_i64().expect("iat");
        assert_eq!(life, trust::TOKEN_SECONDS, "{c}");
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", plane.executor_pid(node).expect("runs")))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        assert!(cmdline.contains("https://127.0.0.1:") && cmdline.contains("--token-file"), "{cmdline}");
    }
    // The token refresher runs for the lab's life, with every node's token file.
    let kubelet = plane.record().kubelet.expect("a token refresher");
    let cmdline = std::fs::read(format!("/proc/{kubelet}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default();
    for node in NODES {
        assert!(cmdline.contains(&format!("{node}={}", plane.token_file(node).display())), "{cmdline}");
    }
    let leader = plane.address().expect("a leader");
    let serial = served_serial(leader);
    assert!(serial.starts_with("serial="), "{serial}");
    let logs = s.controller_logs();
    for node in NODES {
        assert!(
            logs.lines().any(|l| l.contains("executor connected") && l.contains(node)),
            "the leader logs {node}'s executor connected, with its proven node:\n{logs}"
        );
    }
    println!("3 executors synced over TLS ({serial}), each with its Pod's token (node, pod, audience, 1 h)");

    // Debug: without a token, and with an executor's token (another audience), refused.
    let ca = plane.ca().expect("the CA").expect("TLS");
    let url = plane.url(leader);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let executor_token = std::fs::read_to_string(plane.token_file("edge-a")).expect("a token");
    for (what, token) in [("no token", None), ("an executor's token", Some(executor_token))] {
        let code = rt.block_on(async {
            let mut c = plane::debug::connect(&url, Some(&ca), token).await.expect("connects");
            c.list_nodes(ListNodesRequest {}).await.map(|_| ()).map_err(|e| (e.code(), e.message().to_string()))
        });
        match code {
            Err((tonic::Code::Unauthenticated | tonic::Code::PermissionDenied, m)) => {
                println!("Debug with {what}: refused: {m}")
            }
            other => panic!("Debug with {what} must be refused: {other:?}"),
        }
    }

    // The impostor: worker-1's executor replaced by one with worker-2's token.
    s.plane_mut().kill_executor("worker-1").expect("killed");
    let stolen = s.plane().token_file("worker-2");
    let from = s.log(&plane::executor_log("worker-1")).len();
    let controller_from = s.controller_logs().len();
    s.plane_mut().start_executor_with_token("worker-1", &stolen).expect("started");
    let started = Instant::now();
    let others: Vec<String> = ["edge-a", "worker-2"].iter().map(|n| n.to_string()).collect();
    let refused_line = loop {
        let log = s.log(&plane::executor_log("worker-1"));
        if let Some(l) = log[from.min(log.len())..].lines().find(|l| l.contains("wrong_node") && l.contains("worker-2"))
        {
            break l.to_string();
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the impostor was never refused:\n{}", &log[from..]);
        // Meanwhile the others stay synced.
        let rows = s.plane().nodes().expect("ListNodes");
        assert!(converged(&rows, &others), "edge-a and worker-2 must stay synced: {rows:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    // A few more reconnects by the impostor: still refused, the others synced, worker-1 absent.
    std::thread::sleep(Duration::from_secs(2));
    let rows = s.plane().nodes().expect("ListNodes");
    assert!(converged(&rows, &others), "{rows:?}");
    let w1 = rows.iter().find(|r| r.node == "worker-1").expect("a row");
    assert!(!w1.connected, "the impostor must not be connected as worker-1: {w1:?}");
    let logs = s.controller_logs();
    let why: Vec<&str> = logs[controller_from.min(logs.len())..]
        .lines()
        .filter(|l| l.contains("executor refused") && l.contains("worker-1") && l.contains("worker-2"))
        .collect();
    assert!(!why.is_empty(), "the controller's log says why (claimed worker-1, proven worker-2):\n{logs}");
    println!(
        "impostor for worker-1 with worker-2's token refused:\n  executor: {refused_line}\n  controller: {}",
        why[0]
    );

    s.plane_mut().kill_executor("worker-1").expect("killed");
    s.plane_mut().start_executor("worker-1").expect("started");
    let nodes: Vec<String> = NODES.iter().map(|n| n.to_string()).collect();
    let (rows, took) = s
        .plane()
        .wait("worker-1's own executor to sync", Duration::from_secs(10), |r| converged(r, &nodes))
        .expect("syncs");
    assert!(nodes.iter().all(|n| rows.iter().any(|r| r.node == *n && synced(r))));
    println!("worker-1's own executor synced {:.2} s after its start", took.as_secs_f64());
}

/// Two replicas; while probes run every 20 ms, the Secret kuport-controller-tls gets a new
/// serving certificate for controller.kuport.internal signed by the same CA (made here with
/// openssl from the Secret's CA key): both replicas present it to new handshakes within seconds,
/// the executors stay synced (a restarted one connects with it), and no probe is lost.
#[test]
fn a_new_serving_certificate_is_served_at_once_and_no_probe_is_lost() {
    if !root() {
        return;
    }
    let mut s = Secured::start("rotation", 2);
    let work = s.dir.join("pki");
    std::fs::create_dir_all(&work).expect("a folder");
    let secret = trust_secret(s.api());
    for key in ["ca.crt", "ca.key", "tls.crt"] {
        std::fs::write(work.join(key), &secret[key]).expect("written");
    }
    let old = run(Command::new("openssl").args(["x509", "-noout", "-serial", "-in"]).arg(work.join("tls.crt")));
    let addresses = s.plane().addresses();
    for a in &addresses {
        assert_eq!(served_serial(*a), old.trim(), "replica {a} serves the Secret's certificate");
    }
    let new_crt = new_serving_certificate(&work);
    let new = run(Command::new("openssl").args(["x509", "-noout", "-serial", "-in"]).arg(&new_crt)).trim().to_string();
    assert_ne!(new, old.trim());

    let mut prober = s.prober();
    let from = prober.now();
    let b64 = |p: &Path| run(Command::new("openssl").args(["base64", "-A", "-in"]).arg(p)).trim().to_string();
    let patch = serde_json::json!({"data": {"tls.crt": b64(&new_crt), "tls.key": b64(&work.join("new.key"))}});
    let replaced = Instant::now();
    s.api()
        .kubectl(
            &[
                "-n",
                LEASE_NAMESPACE,
                "patch",
                "secret",
                kuport_controller::trust::TLS_SECRET,
                "--type=merge",
                "-p",
                &patch.to_string(),
            ],
            None,
        )
        .expect("the Secret patched");
    let nodes: Vec<String> = NODES.iter().map(|n| n.to_string()).collect();
    let mut seen = Vec::new();
    for a in &addresses {
        loop {
            if served_serial(*a) == new {
                seen.push((*a, replaced.elapsed()));
                break;
            }
            assert!(
                replaced.elapsed() < Duration::from_secs(15),
                "replica {a} still serves {old} 15 s after the change"
            );
            let rows = s.plane().nodes().expect("ListNodes");
            assert!(converged(&rows, &nodes), "the executors must stay synced: {rows:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    println!(
        "new serving certificate {new} (was {}) presented by {}",
        old.trim(),
        seen.iter().map(|(a, t)| format!("{a} after {:.2} s", t.as_secs_f64())).collect::<Vec<_>>().join(", ")
    );
    // A new connection of an executor verifies the new certificate against the same CA.
    s.plane_mut().kill_executor("edge-a").expect("killed");
    s.plane()
        .wait("the leader to see edge-a's executor gone", Duration::from_secs(5), |rows| {
            rows.iter().any(|r| r.node == "edge-a" && !r.connected)
        })
        .expect("disconnect shown");
    s.plane_mut().start_executor("edge-a").expect("started");
    let (rows, took) = s
        .plane()
        .wait("edge-a's restarted executor to sync", Duration::from_secs(10), |r| converged(r, &nodes))
        .expect("syncs");
    assert!(nodes.iter().all(|n| rows.iter().any(|r| r.node == *n && synced(r))));
    println!("edge-a's executor restarted: synced over the new certificate {:.2} s later", took.as_secs_f64());
    std::thread::sleep(Duration::from_secs(1));
    let to = prober.now();
    prober.stop();
    print!("probes over the rotation ({:.1} s):\n{}", (to - from).as_secs_f64(), prober.report(from, to));
    for l in prober.labels() {
        let t = prober.tally(&l, from, to);
        assert_eq!(t.failed(), 0, "{l}: {t}; first failure: {:?}", prober.first_failure(&l, from, to));
    }
    let renewed = s.controller_logs().lines().filter(|l| l.contains("renewed the serving certificate")).count();
    assert_eq!(renewed, 0, "a 90-day certificate is not renewed");
}

/// The Secret kuport-controller-tls's keys, decoded.
fn trust_secret(api: &kuport_lab::apiserver::ApiServer) -> std::collections::BTreeMap<String, Vec<u8>> {
    let json = api
        .kubectl(&["-n", LEASE_NAMESPACE, "get", "secret", kuport_controller::trust::TLS_SECRET, "-o", "json"], None)
        .expect("the Secret");
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let data = v["data"].as_object().expect("data");
    data.iter().map(|(k, v)| (k.clone(), unbase64(v.as_str().expect("base64")))).collect()
}

/// A new key and a 90-day serving certificate for controller.kuport.internal signed by the CA in
/// `dir` (ca.crt, ca.key); the certificate's path (the key is new.key).
fn new_serving_certificate(dir: &Path) -> PathBuf {
    let name = kuport_proto::channel::SERVER_NAME;
    std::fs::write(
        dir.join("ext.cnf"),
        format!("subjectAltName=DNS:{name}\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n"),
    )
    .expect("written");
    run(Command::new("openssl")
        .args(["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
        .args(["-subj", &format!("/CN={name}"), "-keyout"])
        .arg(dir.join("new.key"))
        .arg("-out")
        .arg(dir.join("new.csr")));
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "90", "-set_serial", "0x6b7570"])
        .arg("-in")
        .arg(dir.join("new.csr"))
        .arg("-CA")
        .arg(dir.join("ca.crt"))
        .arg("-CAkey")
        .arg(dir.join("ca.key"))
        .arg("-extfile")
        .arg(dir.join("ext.cnf"))
        .arg("-out")
        .arg(dir.join("new.crt")));
    dir.join("new.crt")
}
