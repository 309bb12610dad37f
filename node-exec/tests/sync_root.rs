//! NodeSync end to end: a standalone controller (in-process, reading a manifest folder) and
//! executors applying into their own network namespaces. `nft` and `ip` are the oracle;
//! kuportctl's functions show what the controller knows.

#[path = "common/fake.rs"]
mod fake;
#[path = "common/host.rs"]
mod host;
#[allow(dead_code)]
mod example {
    include!("common/example.rs");
}

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use host::{root, run};
use kuport_controller::compute::Settings;
use kuport_controller::ctl::{self, Output};
use kuport_controller::serve::{self, Standalone};
use kuport_node_exec::sync::{self, NodeKeepers};
use kuport_proto::v1::debug_client::DebugClient;
use kuport_proto::v1::{GetNodeRequest, ListNodesRequest, NftTable, NodeDebug};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// A scratch namespace shaped like one node of examples/cluster: its underlay (and, for the
/// edge, public) interface with the facts file's address, and a default route through it.
struct Node {
    name: &'static str,
    ns: String,
}

impl Node {
    fn new(name: &'static str, tag: &str, ifaces: &[(&str, &str)]) -> Self {
        let ns = format!("kst-{tag}-{}-{}", name, std::process::id());
        let _ = std::process::Command::new("ip").args(["netns", "del", &ns]).output();
        run("ip", &["netns", "add", &ns]);
        let node = Node { name, ns };
        node.ip(&["link", "set", "lo", "up"]);
        for (i, (dev, addr)) in ifaces.iter().enumerate() {
            let peer = format!("{dev}-p");
            node.ip(&["link", "add", dev, "type", "veth", "peer", "name", &peer]);
            node.ip(&["addr", "add", &format!("{addr}/24"), "dev", dev]);
            node.ip(&["link", "set", dev, "mtu", "1420", "up"]);
            node.ip(&["link", "set", &peer, "up"]);
            if i == 0 {
                let gw = addr.rsplit_once('.').map(|(net, _)| format!("{net}.1")).unwrap_or_default();
                node.ip(&["route", "add", "default", "via", &gw, "dev", dev, "onlink"]);
            }
        }
        node
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.ns))
    }

    fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.ns.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    fn nft(&self, args: &[&str]) -> String {
        let mut all = vec!["netns", "exec", self.ns.as_str(), "nft"];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    fn table(&self) -> String {
        self.nft(&["-s", "list", "table", "inet", "kuport"])
    }

    fn has_table(&self) -> bool {
        self.nft(&["list", "tables"]).contains("kuport")
    }

    fn config(&self, controller: &str, underlay: &str) -> sync::Config {
        let mut cfg = sync::Config::new(format!("http://{controller}"), self.name);
        cfg.netns = Some(self.path());
        cfg.underlay_interface = Some(underlay.to_string());
        cfg.backoff_initial = Duration::from_millis(50);
        cfg.backoff_max = Duration::from_millis(500);
        cfg
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// A copy of examples/cluster that the test may edit.
fn manifests(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kuport-sync-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("manifest dir");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    for e in std::fs::read_dir(&src).expect("examples") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
    }
    dir
}

/// A standalone controller on `address` (127.0.0.1:0 for any port); stops when the sender is
/// dropped or fired.
async fn controller(dir: &Path, address: &str) -> (String, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind(address).await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    let cfg = Standalone { manifests: dir.to_path_buf(), settings: Settings::default(), advertise: None };
    let task = tokio::spawn(async move {
        serve::run_standalone(cfg, listener, async {
            let _ = stopped.await;
        })
        .await
        .expect("controller");
    });
    (address, stop, task)
}

fn executor(cfg: sync::Config) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let keepers = NodeKeepers::new(cfg.netns.clone());
    let task = tokio::spawn(sync::run(cfg, keepers, async {
        let _ = stopped.await;
    }));
    (stop, task)
}

async fn nodes(address: &str) -> Vec<NodeDebug> {
    let Ok(mut c) = ctl::connect(address).await else { return Vec::new() };
    c.list_nodes(ListNodesRequest {}).await.map(|r| r.into_inner().nodes).unwrap_or_default()
}

/// Waits until `check` holds for the named nodes' rows, or fails after 20 s with the last rows.
async fn until(address: &str, names: &[&str], what: &str, check: impl Fn(&NodeDebug) -> bool) -> Vec<NodeDebug> {
    let started = Instant::now();
    loop {
        let rows = nodes(address).await;
        let ok = names.iter().all(|n| rows.iter().any(|r| r.node == *n && check(r)));
        if ok {
            return rows;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{what}: not within 20 s: {rows:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn synced(r: &NodeDebug) -> bool {
    r.connected && !r.desired_version.is_empty() && r.desired_version == r.acked_version
}

async fn desired_table(client: &mut DebugClient<Channel>, node: &str) -> Option<NftTable> {
    let n = client.get_node(GetNodeRequest { node: node.into() }).await.expect("GetNode").into_inner();
    let state = n.desired?.state?;
    state.netns.into_iter().find(|ns| ns.is_host())?.nft_tables.into_iter().find(|t| t.name == "kuport")
}

/// The kernel of `node` lists its desired table exactly.
async fn kernel_matches(client: &mut DebugClient<Channel>, node: &Node) {
    let want = desired_table(client, node.name).await.map(|t| kuport_proto::text::nft_table(&t));
    match want {
        Some(text) => assert_eq!(node.table(), text, "{}: nft list differs from the desired table", node.name),
        None => assert!(!node.has_table(), "{}: a table the state does not have", node.name),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn executors_converge_report_refusals_and_survive_the_controller() {
    if !root() {
        return;
    }
    tokio::time::timeout(Duration::from_secs(120), converge_refuse_survive()).await.expect("the test hung");
}

async fn converge_refuse_survive() {
    let dir = manifests("converge");
    let edge = Node::new("edge-a", "cv", &[("wt0", "100.64.93.143"), ("enp1s0", "203.0.113.9")]);
    // cilium_host's connected route is how worker-2's kernel reaches its pod 10.244.2.107: the
    // request claim names that device (docs/portmap/datapath.md, "Which device reaches the pod").
    let worker = Node::new("worker-2", "cv", &[("wt0", "100.64.0.12"), ("cilium_host", "10.244.2.1")]);
    let (address, stop_controller, controller_task) = controller(&dir, "127.0.0.1:0").await;
    let (stop_edge, edge_task) = executor(edge.config(&address, "wt0"));
    let (stop_worker, worker_task) = executor(worker.config(&address, "wt0"));

    // 1. Both converge; kuportctl shows the acked versions and the reported facts.
    until(&address, &["edge-a", "worker-2"], "first convergence", synced).await;
    let mut client = ctl::connect(&address).await.expect("connect");
    kernel_matches(&mut client, &edge).await;
    kernel_matches(&mut client, &worker).await;
    let text = ctl::nodes(&mut client, Output::Text).await.expect("nodes");
    let row = |name: &str| text.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_string();
    assert!(row("worker-2").contains("connected") && row("worker-2").contains(" yes "), "{text}");
    assert!(row("worker-2").contains("100.64.0.12 mtu 1420"), "facts reported: {text}");
    assert!(row("worker-1").contains("absent"), "{text}");
    let explained = ctl::port_map(&mut client, "games/game", Output::Text).await.expect("portmap");
    assert!(explained.contains("node edge-a (accepting): applied"), "{explained}");
    assert!(explained.contains("node worker-2 (pod): applied"), "{explained}");
    let shown = ctl::node(&mut client, "worker-2", Output::Text).await.expect("node");
    assert!(shown.starts_with("# netns host\ntable inet kuport {"), "{shown}");
    let link = worker.ip(&["-o", "link", "show"]);
    assert!(link.contains("kup-dcc4266d") && link.contains("mtu 1370"), "link to edge-a: {link}");

    // 2. Editing the folder: the game mapping goes, then comes back; both nodes follow.
    let before = nodes(&address).await;
    let version = |rows: &[NodeDebug], n: &str| {
        rows.iter().find(|r| r.node == n).map(|r| r.acked_version.clone()).unwrap_or_default()
    };
    let game = std::fs::read_to_string(dir.join("game.yaml")).expect("game");
    std::fs::remove_file(dir.join("game.yaml")).expect("remove game");
    let after = until(&address, &["edge-a", "worker-2"], "game removed", |r| {
        synced(r) && r.acked_version != version(&before, &r.node)
    })
    .await;
    kernel_matches(&mut client, &edge).await;
    kernel_matches(&mut client, &worker).await;
    assert!(!worker.ip(&["-o", "link", "show"]).contains("kup-dcc4266d"), "the unused link is gone");
    std::fs::write(dir.join("game.yaml"), &game).expect("restore game");
    until(&address, &["edge-a", "worker-2"], "game restored", |r| {
        synced(r) && r.acked_version != version(&after, &r.node)
    })
    .await;
    kernel_matches(&mut client, &worker).await;
    assert!(worker.ip(&["-o", "link", "show"]).contains("kup-dcc4266d"));

    // 3. A state the kernel refuses: worker-2's underlay MTU drops to 100, so its link would
    //    need MTU 50, below the kernel's minimum. The refusal shows; the old link stays.
    worker.ip(&["link", "set", "wt0", "mtu", "100"]);
    let rows = until(&address, &["worker-2"], "refusal reported", |r| !r.errors.is_empty()).await;
    let w = rows.iter().find(|r| r.node == "worker-2").expect("row");
    assert!(w.errors.iter().any(|e| e.object.contains("kup-") && !e.reason.is_empty()), "{:?}", w.errors);
    assert_ne!(w.acked_version, w.desired_version);
    let text = ctl::nodes(&mut client, Output::Text).await.expect("nodes");
    assert!(row_of(&text, "worker-2").contains("kup-"), "kuportctl nodes shows the refused object: {text}");
    let link = worker.ip(&["-o", "link", "show", "kup-dcc4266d"]);
    assert!(link.contains("mtu 1370"), "the previous link is kept: {link}");
    worker.ip(&["link", "set", "wt0", "mtu", "1420"]);
    until(&address, &["worker-2"], "recovered", |r| synced(r) && r.errors.is_empty()).await;

    // 4. The controller stops: the executors keep the datapath and keep repairing it.
    let kept = worker.table();
    let _ = stop_controller.send(());
    controller_task.await.expect("controller task");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(worker.table(), kept, "the state stays while the controller is away");
    worker.nft(&["delete", "table", "inet", "kuport"]);
    let started = Instant::now();
    while !worker.has_table() {
        assert!(started.elapsed() < Duration::from_secs(1), "drift not repaired within 1 s without a controller");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(worker.table().lines().count(), kept.lines().count());

    // It comes back on the same address: both reconnect and ack its (new-term) states.
    let (again, stop_again, again_task) = controller(&dir, &address).await;
    assert_eq!(again, address);
    // The repair made while the controller was away reaches the new one (a running total).
    let rows = until(&address, &["edge-a", "worker-2"], "reconnected", |r| {
        synced(r) && (r.node != "worker-2" || r.drift_repairs >= 1)
    })
    .await;
    assert!(rows.iter().any(|r| r.node == "worker-2" && r.drift_repairs >= 1));
    kernel_matches(&mut client, &worker).await;

    for s in [stop_edge, stop_worker, stop_again] {
        let _ = s.send(());
    }
    for t in [edge_task, worker_task, again_task] {
        t.await.expect("task");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn row_of(text: &str, name: &str) -> String {
    text.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_string()
}

/// Mappings in the large-state test: the largest size.
const LARGE: usize = 50_000;

/// The example table with `n` single-port TCP mappings, each an element in publish_port,
/// claim, reply_claim and return_mark (what the controller renders for one published port).
fn large_table(n: usize) -> NftTable {
    use example::{addr, elem, ifname, mark, port, proto};
    use kuport_proto::v1::L4Proto;
    let mut t = example::kuport_example();
    for s in &mut t.sets {
        if ["publish_port", "claim", "reply_claim", "return_mark"].contains(&s.name.as_str()) {
            s.elements.clear();
        }
    }
    let mut add = |set: &str, e| {
        if let Some(s) = t.sets.iter_mut().find(|s| s.name == set) {
            s.elements.push(e);
        }
    };
    for i in 0..n {
        let ip = format!("10.{}.{}.{}", 100 + i / 62_500, (i / 250) % 250, i % 250 + 2);
        let node_port = 1024 + (i % 60_000) as u32;
        let iface = if i < 60_000 { "enp1s0" } else { "wt0" };
        let tcp = || proto(L4Proto::Tcp);
        add(
            "publish_port",
            elem(vec![ifname(iface), tcp(), port(node_port, node_port)], vec![addr(&ip), port(8080, 8080)]),
        );
        add("claim", elem(vec![ifname("cilium_host"), addr(&ip), tcp(), port(8080, 8080)], vec![]));
        add("reply_claim", elem(vec![addr(&ip), tcp(), port(8080, 8080)], vec![]));
        add("return_mark", elem(vec![addr(&ip), tcp(), port(8080, 8080)], vec![mark(0x6b70_0001)]));
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50000_mapping_state_streams_and_applies() {
    if !root() {
        return;
    }
    use kuport_proto::v1::{ControllerMessage, DesiredState, NetnsState, NodeState, controller_message};
    use prost::Message as _;

    let node = Node::new("big", "lg", &[("wt0", "100.64.0.20"), ("enp1s0", "203.0.113.20")]);
    let mut state = NodeState {
        node: "big".into(),
        netns: vec![NetnsState { nft_tables: vec![large_table(LARGE)].into(), ..Default::default() }],
    };
    kuport_proto::canonicalize(&mut state);
    let version = kuport_proto::version(&state);
    let desired = DesiredState { term: 1, sequence: 1, version: version.clone(), state: Some(state) };
    let bytes = desired.encoded_len();
    assert!(bytes > 4 * 1024 * 1024, "{bytes} bytes: over gRPC's default 4 MiB limit, as the test means");
    let (address, mut seen) =
        fake::start(vec![ControllerMessage { message: Some(controller_message::Message::State(desired)) }]).await;
    let (stop, task) = executor(node.config(&address, "wt0"));
    let started = Instant::now();
    let acks = fake::acks(&mut seen, 1, Duration::from_secs(300)).await;
    let took = started.elapsed();
    let _ = stop.send(());
    task.await.expect("executor");
    assert_eq!(acks.len(), 1, "no answer within 300 s");
    assert!(acks[0].ok && acks[0].version == version, "{:?}", acks[0].errors);
    let listed = node.nft(&["list", "map", "ip", "kuport", "publish_port"]);
    let elements = listed.matches(" : 10.").count();
    assert_eq!(elements, LARGE, "publish_port elements in the kernel");
    println!("{LARGE} mappings: {bytes} bytes streamed, applied and acked in {took:?}");
}
