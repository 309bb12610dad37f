//! The chart's RBAC carries the datapath: the chart is installed into a local API server, two
//! controller replicas run out of cluster with a TokenRequest token of the chart's controller
//! ServiceAccount (so every request they make is authorized by the chart's roles alone), the
//! lab registers its objects as the admin, and a client reaches pods on another node than the
//! accepting one (Single mode, over the VXLAN link) with its real address. So the managed
//! serving certificate (Secret kuport-controller-tls, ConfigMap kuport-ca) and the reviews of the
//! executors' pod-bound tokens and of the lab's Debug token go through the chart's grants too.
//!
//! `e2e/chart/rbac.sh` proves each grant is needed; this test proves together they are enough
//! for the whole path from PortMap to packet. Without root it fails, unless
//! KUPORT_SKIP_ROOT_TESTS=1.

mod common;
use common::*;

use std::time::{Duration, Instant};

use kuport_lab::Protocol::{Tcp, Udp};
use kuport_lab::apiserver::LEASE_NAMESPACE;
use kuport_lab::plane::{self, PlaneOptions};
use kuport_lab::{Manifests, apiserver::ApiServer};

/// The chart's controller ServiceAccount (release "kuport").
const SERVICE_ACCOUNT: &str = "kuport-controller";

/// A kubeconfig that authenticates with a fresh token of the chart's controller ServiceAccount.
fn token_kubeconfig(api: &ApiServer, path: &std::path::Path) -> String {
    let view = |field: &str| {
        api.kubectl(
            &["config", "view", "--raw", "--minify", "-o", &format!("jsonpath={{.clusters[0].cluster.{field}}}")],
            None,
        )
        .expect("kubectl config view")
    };
    let (server, ca) = (view("server"), view("certificate-authority-data"));
    let token = api
        .kubectl(&["-n", LEASE_NAMESPACE, "create", "token", SERVICE_ACCOUNT, "--duration=2h"], None)
        .expect("a TokenRequest");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: lab, cluster: {{server: \"{server}\", certificate-authority-data: \"{ca}\"}}}}]\n\
         users: [{{name: sa, user: {{token: \"{}\"}}}}]\n\
         contexts: [{{name: sa, context: {{cluster: lab, user: sa, namespace: {LEASE_NAMESPACE}}}}}]\ncurrent-context: sa\n",
        token.trim()
    );
    std::fs::write(path, text).expect("kubeconfig written");
    let who = api
        .kubectl(
            &[
                "--kubeconfig",
                &path.display().to_string(),
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ],
            None,
        )
        .expect("whoami");
    assert_eq!(who, format!("system:serviceaccount:{LEASE_NAMESPACE}:{SERVICE_ACCOUNT}"));
    who
}

#[test]
fn chart_service_account_serves_single_mode_across_nodes() {
    if !root() {
        return;
    }
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("kuport-chart-lab-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder");
    let api = OwnedApiServer::up(&dir.join("controlplane"));
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/kuport");
    api.0
        .helm(&[
            "install",
            "kuport",
            &chart.display().to_string(),
            "-n",
            LEASE_NAMESPACE,
            "--create-namespace",
            "--wait=false",
        ])
        .expect("helm install");
    let kubeconfig = dir.join("controller.kubeconfig");
    let who = token_kubeconfig(&api.0, &kubeconfig);

    let mut lab = default_lab();
    let manifests = Manifests::default_lab()
        .add("api.yaml", &port_map("apps", "api", "public", "TCP", "9000", "api", "api"))
        .expect("loads");
    let mut options = PlaneOptions::new(env!("CARGO_BIN_EXE_kuport-lab"), dir.join("plane"));
    options.kubernetes = Some(api.source(Some(kubeconfig), 2));
    lab.start_plane(&manifests, options).expect("the controllers and executors start");
    let plane = lab.plane().expect("a plane");
    let took = plane.wait_converged(plane::CONVERGE_TIMEOUT).expect("the lab converges");

    // game-0 and api-0 are on worker-2; the class accepts on edge-a.
    let game = assert_maps(&lab, "client-1", "203.0.113.9:27015", Udp, "game-0");
    let web = assert_maps(&lab, "client-2", "203.0.113.9:9000", Tcp, "api-0");
    // The replicas wrote the statuses and the Lease with the ServiceAccount's grants alone.
    let programmed = "jsonpath={.status.conditions[?(@.type=='Programmed')].status}";
    for (ns, name) in [("games", "game"), ("apps", "api")] {
        let waited = Instant::now();
        while api.0.kubectl(&["get", "pm", "-n", ns, name, "-o", programmed], None).unwrap_or_default() != "True" {
            assert!(waited.elapsed() < Duration::from_secs(20), "{ns}/{name} never became Programmed");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let holder = api
        .0
        .kubectl(
            &["-n", LEASE_NAMESPACE, "get", "lease", "kuport-controller", "-o", "jsonpath={.spec.holderIdentity}"],
            None,
        )
        .expect("the Lease");
    assert!(holder.contains("-controller-"), "a lab replica holds the Lease: {holder:?}");
    let mut forbidden = Vec::new();
    for i in 0..2 {
        let log = std::fs::read_to_string(dir.join("plane").join(plane::controller_log(i))).unwrap_or_default();
        forbidden.extend(log.lines().filter(|l| l.contains("forbidden")).map(str::to_string));
    }
    assert!(forbidden.is_empty(), "the controllers were refused:\n{}", forbidden.join("\n"));
    println!(
        "chart installed; controllers as {who}: every node applied its state after {:.2} s; {game}; {web}; \
         statuses Programmed=True, Lease held by {holder}, no request forbidden ({:.1} s in all)",
        took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    drop(lab);
    drop(api);
    let _ = std::fs::remove_dir_all(&dir);
}
