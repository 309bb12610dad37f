//! Root tests of a pod in a user namespace (`hostUsers: false`; docs/intercept/table.md, "Pods
//! in a user namespace"). The pod's processes run in a child user namespace mapping its IDs
//! 0..65536 to the host's 200000..265536 (the maps are written here, as the runtime would); the
//! agent runs with gid 7439 inside, host gid 207439. The kernel reads `meta skgid` through the
//! user namespace that owns the network namespace, so:
//!
//! - a network namespace owned by the pod's user namespace (how containerd and CRI-O make a
//!   `hostUsers: false` sandbox) takes the group as sent, 7439: the executor finds that it must
//!   not translate, and a rule carrying the host-side 207439 would let the mesh capture the
//!   agent;
//! - a network namespace owned by the host's user namespace, with the pod's processes in the
//!   child one, needs the host-side group: the executor maps 7439 through the pod's gid_map to
//!   207439, and without that the agent's egress is captured by the mesh.
//!
//! They fail when not run as root unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
use host::{root, run};

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kuport_controller::compute::intercept::{AgentIdentity, Intercept, InterceptSpec, Protocol, tables};
use kuport_node_exec::executor::Executor;
use kuport_node_exec::podns::{self, IdRange, OwnerIds};
use kuport_node_exec::sync::{NodeApplier, NodeKeepers};
use kuport_proto::netns;
use kuport_proto::v1::{NetnsState, NodeState, PodRef, Selector, nft_match, nft_value};

/// The pod's address, one per test (they run at once).
fn pod4(owner: Owner) -> &'static str {
    match owner {
        Owner::Pod => "10.244.9.10",
        Owner::Host => "10.244.9.11",
    }
}
const UPSTREAM4: &str = "10.244.9.20";
const UPSTREAM: u32 = 7000;
const MESH_OUT: u32 = 15001;
const AGENT_GID: u32 = 7439;
/// Where the pod's IDs start on the host.
const BASE: u32 = 200_000;

/// Who owns the pod's network namespace.
#[derive(Clone, Copy, PartialEq)]
enum Owner {
    /// The pod's user namespace (unshare --user --net together).
    Pod,
    /// The host's; only the pod's processes are in a child user namespace.
    Host,
}

/// A pod sandbox whose processes run in a child user namespace; everything it started is
/// killed by handle and its namespaces deleted on drop.
struct Sandbox {
    name: String,
    host: String,
    dir: PathBuf,
    /// The process holding the pod's user namespace (and, with Owner::Pod, its network one).
    holder: Child,
    children: Vec<Child>,
    address: &'static str,
}

impl Sandbox {
    fn new(tag: &str, owner: Owner) -> Self {
        let id = std::process::id();
        let (name, host) = (format!("kuport-uns-{tag}-{id}"), format!("kuport-unh-{tag}-{id}"));
        let dir = std::env::temp_dir().join(format!("kuport-userns-{tag}-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let script = dir.join("peer.py");
        std::fs::write(&script, include_str!("data/intercept_peer.py")).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        for n in [&name, &host] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
        run("ip", &["netns", "add", &host]);
        let holder = match owner {
            Owner::Pod => Command::new("unshare").args(["--user", "--net", "sleep", "600"]).spawn().unwrap(),
            Owner::Host => {
                run("ip", &["netns", "add", &name]);
                Command::new("ip").args(["netns", "exec", &name, "unshare", "--user", "sleep", "600"]).spawn().unwrap()
            }
        };
        let pid = holder.id();
        let ours = std::fs::read_link("/proc/self/ns/user").unwrap();
        let start = Instant::now();
        while std::fs::read_link(format!("/proc/{pid}/ns/user")).is_ok_and(|u| u == ours) {
            assert!(start.elapsed() < Duration::from_secs(5), "the holder never entered its user namespace");
            std::thread::sleep(Duration::from_millis(10));
        }
        let map = format!("0 {BASE} 65536\n");
        std::fs::write(format!("/proc/{pid}/uid_map"), &map).unwrap();
        std::fs::write(format!("/proc/{pid}/gid_map"), map).unwrap();
        let mut s = Sandbox { name, host, dir, holder, children: Vec::new(), address: pod4(owner) };
        if owner == Owner::Pod {
            run("ip", &["netns", "attach", &s.name, &pid.to_string()]);
        }
        // The pod's address and the upstream's, both local: the mesh's output hook sees the dial.
        let n = s.name.clone();
        run("ip", &["-n", &n, "link", "set", "lo", "up"]);
        let h = s.host.clone();
        run("ip", &["-n", &n, "link", "add", "eth0", "type", "veth", "peer", "name", "pod0", "netns", &h]);
        run("ip", &["-n", &h, "link", "set", "pod0", "up"]);
        run("ip", &["-n", &n, "addr", "add", &format!("{}/24", s.address), "dev", "eth0"]);
        run("ip", &["-n", &n, "addr", "add", &format!("{UPSTREAM4}/32"), "dev", "eth0"]);
        run("ip", &["-n", &n, "link", "set", "eth0", "up"]);
        s.serve(UPSTREAM, "UPSTREAM");
        s.serve(MESH_OUT, "MESH-OUT");
        // The mesh: every TCP dial to its outbound proxy, except its own and localhost.
        let mesh = format!(
            "table ip mesh {{\n  chain output {{ type nat hook output priority -100; policy accept;\n    meta skuid 1337 return\n    ip daddr 127.0.0.1 return\n    meta l4proto tcp redirect to :{MESH_OUT}\n  }}\n}}\n"
        );
        let file = s.dir.join("mesh.nft");
        std::fs::write(&file, mesh).unwrap();
        run("ip", &["netns", "exec", &n, "nft", "-f", &file.to_string_lossy()]);
        s
    }

    fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.name)
    }

    fn serve(&mut self, port: u32, banner: &str) {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name, "/usr/bin/python3"])
            .arg(self.dir.join("peer.py"))
            .args(["tcp", &port.to_string(), banner])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(child);
        let filter = format!("sport = :{port}");
        let start = Instant::now();
        while run("ip", &["netns", "exec", &self.name, "ss", "-Hlnt", &filter]).trim().is_empty() {
            assert!(start.elapsed() < Duration::from_secs(10), "port {port} never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A dial of the upstream from a process of the pod (in its user namespace) with group
    /// `gid` as the pod sees it: whoever answered.
    fn dial(&self, gid: u32) -> String {
        let out = Command::new("nsenter")
            .args(["--target", &self.holder.id().to_string(), "--user", "--net", "--setuid", "0"])
            .args(["--setgid", &gid.to_string(), "/usr/bin/python3"])
            .arg(self.dir.join("peer.py"))
            .args(["tcp-get", UPSTREAM4, &UPSTREAM.to_string()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn output_chain(&self) -> String {
        run("ip", &["netns", "exec", &self.name, "nft", "list", "chain", "ip", "kuport-intercept", "output"])
    }

    fn pod(&self) -> PodRef {
        PodRef {
            namespace: "web".into(),
            name: self.name.clone(),
            uid: self.name.clone(),
            addresses: vec![self.address.into()],
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for c in self.children.iter_mut().chain([&mut self.holder]) {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in [&self.name, &self.host] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The pod's intercept tables as the controller sends them: the agent's group as the pod sees it.
fn entry(pod: PodRef) -> NetnsState {
    let address = pod.addresses[0].parse().unwrap();
    let spec = InterceptSpec {
        intercepts: vec![Intercept {
            protocol: Protocol::Tcp,
            container_port: 8080,
            agent_port: 9080,
            proxy_port: None,
        }],
        identity: AgentIdentity::Group(AGENT_GID),
        mesh_dial_subnets: vec![],
        pod_addresses: vec![address],
    };
    let t = tables(&spec).unwrap().tables;
    let mut s = NodeState {
        node: "n".into(),
        netns: vec![NetnsState { target: netns::pod(pod), nft_tables: t.into(), ..Default::default() }],
    };
    kuport_proto::canonicalize(&mut s);
    s.netns.pop().unwrap()
}

/// Every `meta skgid` of `state` set to `gid`: an ablation's table.
fn with_gid(state: &NetnsState, gid: u32) -> NetnsState {
    let mut s = state.clone();
    for m in s.nft_tables.iter_mut().flat_map(|t| &mut t.chains).flat_map(|c| &mut c.rules).flat_map(|r| &mut r.matches)
    {
        if let Some(nft_match::Kind::Compare(c)) = &mut m.kind
            && c.selector == Selector::MetaSkgid as i32
            && let Some(v) = &mut c.value
        {
            v.value = Some(nft_value::Value::Id(gid));
        }
    }
    s
}

/// The agent (gid 7439 in the pod) against the table with `rule_gid` applied by an Executor
/// straight into the namespace, then removed.
fn agent_with_rule(sb: &Sandbox, state: &NetnsState, rule_gid: u32) -> String {
    let mut ex = Executor::new(Some(sb.path()));
    ex.apply(&with_gid(state, rule_gid)).unwrap();
    assert!(sb.output_chain().contains(&format!("meta skgid {rule_gid}")), "{}", sb.output_chain());
    let got = sb.dial(AGENT_GID);
    ex.apply(&NetnsState::default()).unwrap();
    got
}

/// Programs the pod through NodeKeepers (resolution, owner translation, apply), checks the
/// agent goes direct and the app to the mesh, then removes it.
async fn programmed(sb: &Sandbox, state: &NetnsState, rule_gid: u32) {
    let host = PathBuf::from("/var/run/netns").join(&sb.host);
    let mut keepers = NodeKeepers::new(Some(host));
    let node = NodeState { node: "n".into(), netns: vec![state.clone()] };
    keepers.apply(node).await.expect("applied");
    assert!(sb.output_chain().contains(&format!("meta skgid {rule_gid}")), "{}", sb.output_chain());
    assert_eq!(sb.dial(AGENT_GID), "UPSTREAM", "the agent (gid {AGENT_GID} in the pod) goes direct");
    assert_eq!(sb.dial(1000), "MESH-OUT", "the application's egress still goes to the mesh");
    keepers.apply(NodeState { node: "n".into(), netns: vec![] }).await.expect("removed");
    assert!(!run("ip", &["netns", "exec", &sb.name, "nft", "list", "tables"]).contains("kuport"), "tables removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_owned_by_the_pods_user_namespace_takes_the_group_as_sent() {
    if !root() {
        return;
    }
    let sb = Sandbox::new("pod", Owner::Pod);
    assert_eq!(sb.dial(AGENT_GID), "MESH-OUT", "sanity: without tables the mesh has the agent");
    let held = podns::resolve(&sb.pod(), &podns::host_ids(None)).unwrap();
    assert_eq!(*held.owners(), OwnerIds::AsInPod, "the kernel reads owners as the pod sees them");
    drop(held);
    let state = entry(sb.pod());
    // Ablation: the host-side group in the rule (what a translation here would write).
    assert_eq!(agent_with_rule(&sb, &state, BASE + AGENT_GID), "MESH-OUT", "a host-side gid never matches here");
    programmed(&sb, &state, AGENT_GID).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_owned_namespace_needs_the_host_side_group() {
    if !root() {
        return;
    }
    let sb = Sandbox::new("host", Owner::Host);
    let held = podns::resolve(&sb.pod(), &podns::host_ids(None)).unwrap();
    let range = vec![IdRange { inside: 0, outside: BASE, count: 65_536 }];
    assert_eq!(*held.owners(), OwnerIds::Mapped { uid: range.clone(), gid: range }, "the pod's maps");
    drop(held);
    let state = entry(sb.pod());
    // Ablation: without the translation, the rule's 7439 is no socket's group here.
    assert_eq!(agent_with_rule(&sb, &state, AGENT_GID), "MESH-OUT", "untranslated: the mesh captures the agent");
    programmed(&sb, &state, BASE + AGENT_GID).await;
}
