//! Root tests of `kuport_node_exec::sync::NodeKeepers` against a real kernel: namespaces by
//! reference (a file, a pod found by its address), per-namespace versions, and keepers that end
//! when their namespace disappears. Each test's host entry is a scratch namespace too.
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
use host::{root, run};

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kuport_node_exec::sync::{NodeApplier, NodeKeepers};
use kuport_proto::netns;
use kuport_proto::v1::{NetnsState, NftFamily, NftTable, NodeState, ObjectError, PodRef};

/// A scratch network namespace, deleted on drop unless it already was.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!("kuport-kp-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        run("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.name))
    }

    fn path_string(&self) -> String {
        self.path().display().to_string()
    }

    fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    fn tables(&self) -> String {
        run("ip", &["netns", "exec", &self.name, "nft", "list", "tables"])
    }

    /// A veth pair inside the namespace, `address` on its first end: what a pod's sandbox has.
    fn pod_interface(&self, address: &str) {
        self.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "eth0-peer"]);
        self.ip(&["addr", "add", &format!("{address}/32"), "dev", "eth0"]);
        self.ip(&["link", "set", "eth0", "up"]);
    }

    fn delete(&self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if self.path().exists() {
            self.delete();
        }
    }
}

fn table(family: NftFamily, name: &str) -> NftTable {
    NftTable { family: family as i32, name: name.into(), ..Default::default() }
}

fn node(netns: Vec<NetnsState>) -> NodeState {
    let mut state = NodeState { node: "n".into(), netns };
    kuport_proto::canonicalize(&mut state);
    state
}

/// The host entry, with a table of its own so that it is not empty.
fn host_entry() -> NetnsState {
    NetnsState { target: netns::host(), nft_tables: vec![table(NftFamily::Ip, "kuport")].into(), ..Default::default() }
}

fn errors(r: Result<(), Vec<ObjectError>>) -> Vec<ObjectError> {
    r.expect_err("a refusal")
}

/// An address for this test process's pod: unique among concurrent runs.
fn pod_address(n: u32) -> String {
    let pid = std::process::id();
    format!("10.{}.{}.{}", 200 + (pid >> 16) % 50, (pid >> 8) % 256, (pid % 256 + n) % 254 + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_that_disappears_ends_its_keeper() {
    if !root() {
        return;
    }
    let host = Netns::new("host");
    let gone = Netns::new("gone");
    let mut keepers = NodeKeepers::new(Some(host.path()));
    let entry = NetnsState {
        target: netns::path(gone.path_string()),
        nft_tables: vec![table(NftFamily::Inet, "kuport-test")].into(),
        ..Default::default()
    };
    let both = node(vec![host_entry(), entry]);
    keepers.apply(both.clone()).await.expect("applied");
    assert!(gone.tables().contains("table inet kuport-test"), "{}", gone.tables());
    assert!(host.tables().contains("table ip kuport"), "{}", host.tables());
    let kept = keepers.namespaces();
    assert!(kept.contains(&"host".to_string()) && kept.contains(&gone.path_string()), "{kept:?}");

    // The namespace goes (our keeper's open file keeps it alive, but nothing else reaches it).
    gone.delete();
    let started = Instant::now();
    while keepers.namespaces().contains(&gone.path_string()) {
        assert!(started.elapsed() < Duration::from_secs(5), "the keeper of a deleted namespace did not end");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("keeper ended {:?} after the namespace was deleted", started.elapsed());
    let stats = keepers.stats(&gone.path_string()).expect("not forgotten before the next state");
    assert!(stats.last_error.is_some_and(|e| e.contains("is gone")), "why it ended");

    // The next state, without it: no refusal about it, and it is forgotten.
    keepers.apply(node(vec![host_entry()])).await.expect("nothing refused");
    assert!(keepers.stats(&gone.path_string()).is_none(), "forgotten");
    assert_eq!(keepers.namespaces(), ["host"]);

    // A state that names it again starts a new keeper, which cannot find it.
    let refused = errors(keepers.apply(both).await);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].object.contains(&gone.path_string()), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_is_found_by_its_address_and_kept_by_version() {
    if !root() {
        return;
    }
    let host = Netns::new("host");
    let sandbox = Netns::new("pod");
    let address = pod_address(0);
    sandbox.pod_interface(&address);
    // The host's namespace holds the address too: it is never taken for the pod's.
    host.pod_interface(&address);
    let pod = PodRef { namespace: "games".into(), name: "game-0".into(), uid: "u-1".into(), addresses: vec![address] };
    let entry = NetnsState {
        target: netns::pod(pod.clone()),
        nft_tables: vec![table(NftFamily::Inet, "kuport-intercept")].into(),
        ..Default::default()
    };
    let mut keepers = NodeKeepers::new(Some(host.path()));
    let state = node(vec![host_entry(), entry]);
    let key = state.netns.iter().find(|n| !n.is_host()).map(NetnsState::describe).expect("the pod's entry");
    let version = state.netns.iter().find(|n| !n.is_host()).map(|n| n.version.clone()).expect("version");
    assert!(!version.is_empty(), "canonicalize versions each namespace");
    keepers.apply(state.clone()).await.expect("applied");
    assert!(sandbox.tables().contains("table inet kuport-intercept"), "{}", sandbox.tables());
    assert!(!host.tables().contains("kuport-intercept"), "{}", host.tables());
    let applies = keepers.stats(&key).expect("kept").applies;

    // The same version again, whole or held: nothing is applied.
    keepers.apply(state.clone()).await.expect("the same state");
    let held =
        NetnsState { target: netns::pod(pod.clone()), version: version.clone(), held: true, ..Default::default() };
    keepers.apply(NodeState { node: "n".into(), netns: vec![host_entry(), held] }).await.expect("held");
    assert_eq!(keepers.stats(&key).expect("kept").applies, applies, "a held version applies nothing");
    assert!(sandbox.tables().contains("table inet kuport-intercept"));

    // A held version the keeper does not hold is refused, so that the controller sends it whole.
    let stale =
        NetnsState { target: netns::pod(pod.clone()), version: "0000".into(), held: true, ..Default::default() };
    let refused = errors(keepers.apply(NodeState { node: "n".into(), netns: vec![host_entry(), stale] }).await);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].object.contains(&key) && refused[0].reason.contains("not held"), "{refused:?}");
    assert!(sandbox.tables().contains("table inet kuport-intercept"), "the namespace keeps what it has");

    // A pod no namespace holds the address of: refused for it alone; the host still applies.
    let missing = PodRef { name: "nowhere".into(), uid: "u-2".into(), addresses: vec![pod_address(1)], ..pod };
    let entry = NetnsState {
        target: netns::pod(missing),
        nft_tables: vec![table(NftFamily::Inet, "kuport-intercept")].into(),
        ..Default::default()
    };
    let mut host_changed = host_entry();
    host_changed.nft_tables.push(table(NftFamily::Ip6, "kuport-host"));
    let refused = errors(keepers.apply(node(vec![host_changed, entry])).await);
    assert_eq!(refused.len(), 1, "{refused:?}");
    let text = format!("{}: {}", refused[0].object, refused[0].reason);
    assert_eq!(text, "pod games/nowhere: network namespace not found on this node");
    assert!(host.tables().contains("table ip6 kuport-host"), "{}", host.tables());
}

/// A restarted pod: its new sandbox (a new namespace, the same address) is programmed from the
/// state the keepers hold, within a second, with no new state from the controller
/// (docs/intercept/table.md, lifecycle). `restarted` is what the client calls every drift poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_pod_is_reprogrammed_within_a_second() {
    if !root() {
        return;
    }
    let host = Netns::new("host");
    let first = Netns::new("pod");
    let address = pod_address(2);
    first.pod_interface(&address);
    let pod = PodRef {
        namespace: "games".into(),
        name: "game-1".into(),
        uid: "u-3".into(),
        addresses: vec![address.clone()],
    };
    let entry = NetnsState {
        target: netns::pod(pod),
        nft_tables: vec![table(NftFamily::Ip, "kuport-intercept"), table(NftFamily::Ip6, "kuport-intercept")].into(),
        ..Default::default()
    };
    let mut keepers = NodeKeepers::new(Some(host.path()));
    keepers.apply(node(vec![host_entry(), entry])).await.expect("applied");
    assert!(first.tables().contains("table ip6 kuport-intercept"), "{}", first.tables());

    // The sandbox goes and a new one comes with the same address; the controller sends nothing.
    first.delete();
    let second = Netns::new("pod");
    second.pod_interface(&address);
    let started = Instant::now();
    loop {
        keepers.restarted().await;
        let tables = second.tables();
        if tables.contains("table ip kuport-intercept") && tables.contains("table ip6 kuport-intercept") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(1), "not reprogrammed within a second: {tables}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("the new sandbox held its tables {:?} after it was created", started.elapsed());
    assert!(!host.tables().contains("kuport-intercept"), "{}", host.tables());
}

/// The host's namespace is never a pod's: a pod whose address only the host holds is refused,
/// clearly, and nothing is written to the host (docs/intercept/table.md, lifecycle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_the_hosts_address_is_refused() {
    if !root() {
        return;
    }
    let host = Netns::new("host");
    let address = pod_address(3);
    host.pod_interface(&address);
    let pod = PodRef {
        namespace: "games".into(),
        name: "hostly".into(),
        uid: "u-4".into(),
        addresses: vec![address.clone()],
    };
    let entry = NetnsState {
        target: netns::pod(pod),
        nft_tables: vec![table(NftFamily::Ip, "kuport-intercept")].into(),
        ..Default::default()
    };
    let before = run("ip", &["netns", "exec", &host.name, "nft", "list", "ruleset"]);
    let own = run("nft", &["list", "tables"]);
    let mut keepers = NodeKeepers::new(Some(host.path()));
    let state = NodeState { node: "n".into(), netns: vec![entry] };
    let refused = errors(keepers.apply(node(state.netns)).await);
    assert_eq!(refused.len(), 1, "{refused:?}");
    let text = format!("{}: {}", refused[0].object, refused[0].reason);
    let want = format!(
        "pod games/hostly: network namespace not found on this node: only the host's holds {address}, and the host's \
         is never a pod's"
    );
    assert_eq!(text, want);
    assert_eq!(run("ip", &["netns", "exec", &host.name, "nft", "list", "ruleset"]), before, "nothing on the host");
    assert_eq!(run("nft", &["list", "tables"]), own, "nothing in this process's namespace");
}
