//! Interception in the lab with real executors and the lab's Kubernetes source
//! (docs/intercept/resource.md): an Intercept for the lab pod echo-0 (apps, on worker-1) has
//! worker-1's executor program the pod's own network namespace, found on the node by its
//! address; a real connection to the intercepted port reaches the agent in the pod (issue 18's
//! behaviour 1); a host-network pod the Intercept also selects is refused in its status; and
//! deleting the Intercept restores the pod's ruleset exactly (behaviour 8), the application
//! answering again.
//! One test in its own binary: the executors find pods by address, so two labs at once (the same
//! pod addresses) would make it ambiguous. Without root it fails, unless KUPORT_SKIP_ROOT_TESTS=1.

mod common;
use common::*;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kuport_lab::Manifests;
use kuport_lab::plane::{self, PlaneOptions};

const POD: &str = "echo-0";
const POD_ADDRESS: &str = "10.244.1.20";
const APP_PORT: u16 = 8080;
const AGENT_PORT: u16 = 9900;

/// A host-network pod with echo-0's label on the same node (worker-1's address); echo-0 itself,
/// as the kubelet would report it, is among the lab's generated objects.
const PODS: &str = "apiVersion: v1
kind: Pod
metadata: {name: echo-hostnet, namespace: apps, labels: {app: echo}}
spec:
  nodeName: worker-1
  hostNetwork: true
  containers: [{name: echo, image: kuport-lab-echo}]
status:
  phase: Running
  podIP: 100.64.0.11
  podIPs: [{ip: 100.64.0.11}]
---
";

const INTERCEPT: &str = "apiVersion: kuport.wlz.li/v1alpha1
kind: Intercept
metadata: {name: echo, namespace: apps}
spec:
  podSelector:
    matchLabels: {app: echo}
  intercepts:
    - {protocol: TCP, containerPort: 8080, agentPort: 9900}
---
";

/// The agent in the pod: answers every connection with AGENT. Killed (by its handle) on drop.
struct Agent(Child);

impl Agent {
    fn start(netns: &str) -> Agent {
        let code = format!(
            "import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             s.bind(('0.0.0.0', {AGENT_PORT})); s.listen(16)\nwhile True:\n    c, _ = s.accept(); c.sendall(b'AGENT\\n'); c.close()\n"
        );
        let child = Command::new("ip")
            .args(["netns", "exec", netns, "python3", "-c", &code])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the agent starts");
        Agent(child)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What answers a TCP connection from worker-1 (the pod's node) to the pod's `port`.
fn dial(lab: &kuport_lab::Lab, port: u16) -> String {
    let code = format!(
        "import socket\ntry:\n    s = socket.create_connection(('{POD_ADDRESS}', {port}), 3); print(s.recv(200).decode().strip())\nexcept OSError as e:\n    print('ERR', e)\n"
    );
    lab.exec("worker-1", &["python3", "-c", &code]).unwrap_or_else(|e| format!("ERR {e}")).trim().to_string()
}

fn ruleset(lab: &kuport_lab::Lab) -> String {
    lab.exec(POD, &["nft", "list", "ruleset"]).expect("the pod's ruleset")
}

/// Waits until `what` holds, or fails naming it.
fn wait(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}

#[test]
fn an_intercept_programs_a_lab_pod_and_its_deletion_restores_it() {
    if !root() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kuport-intercept-lab-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let api = OwnedApiServer::up(&dir.join("controlplane"));
    let mut lab = default_lab();
    let without = Manifests::default_lab().add("pods.yaml", PODS).expect("loads");
    let with = without.clone().add("intercept.yaml", INTERCEPT).expect("loads");
    let mut options = PlaneOptions::new(env!("CARGO_BIN_EXE_kuport-lab"), dir.join("plane"));
    options.kubernetes = Some(api.source(None, 1));

    let before = ruleset(&lab);
    assert!(dial(&lab, APP_PORT).starts_with(POD), "sanity: the application answers");
    let _agent = Agent::start(&lab.netns_name(POD));
    wait("the agent listens", Duration::from_secs(10), || dial(&lab, AGENT_PORT) == "AGENT");

    lab.start_plane(&with, options).expect("the controller and executors start");
    lab.plane().expect("a plane").wait_converged(plane::CONVERGE_TIMEOUT).expect("the lab converges");
    let took =
        wait("the pod's tables", Duration::from_secs(20), || ruleset(&lab).contains("table ip kuport-intercept"));
    println!("the pod's namespace held its table {:.2} s after convergence began", took.as_secs_f64());
    assert!(!lab.exec("worker-1", &["nft", "list", "tables"]).unwrap().contains("kuport-intercept"), "not the node's");
    assert_eq!(dial(&lab, APP_PORT), "AGENT", "(1) inbound to the intercepted port reaches the agent");

    // The status: echo-0 programmed, the host-network pod refused.
    let status = || -> serde_json::Value {
        let out = api.0.kubectl(&["get", "intercept", "-n", "apps", "echo", "-o", "json"], None).unwrap_or_default();
        serde_json::from_str::<serde_json::Value>(&out).map(|v| v["status"].clone()).unwrap_or_default()
    };
    wait("Intercept apps/echo reports 1 of 2 pods programmed", Duration::from_secs(20), || {
        let s = status();
        s["selectedPods"] == 2 && s["programmedPods"] == 1
    });
    let s = status();
    let pods = s["pods"].as_array().cloned().unwrap_or_default();
    assert_eq!(pods.len(), 1, "{s}");
    assert_eq!(
        (pods[0]["name"].as_str(), pods[0]["reason"].as_str()),
        (Some("echo-hostnet"), Some("HostNetwork")),
        "{s}"
    );
    let programmed = s["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "Programmed")).cloned();
    assert_eq!(programmed.as_ref().and_then(|c| c["reason"].as_str()), Some("HostNetwork"), "{s}");

    // Deleting the Intercept: the pod's ruleset is what it was, and the application answers.
    lab.plane_mut().expect("a plane").set_manifests(&without).expect("the Intercept is deleted");
    let took = wait("the pod's ruleset as before", Duration::from_secs(20), || ruleset(&lab) == before);
    println!("the pod's ruleset was restored {:.2} s after the Intercept's deletion", took.as_secs_f64());
    assert!(dial(&lab, APP_PORT).starts_with(POD), "(8) the application answers again");
    // The plane's and the API server's folders go once both have stopped.
    drop(lab);
    drop(api);
    let _ = std::fs::remove_dir_all(&dir);
}
