//! Root tests of finding a pod's namespace through the container runtime's CRI
//! (docs/intercept/table.md, "Finding a pod's namespace"): a fake runtime (tonic, runtime.v1,
//! on a unix socket in a scratch directory) names a sandbox's network namespace, and
//! `NodeKeepers` programs exactly that one; a runtime that names the host's namespace or a
//! path that does not exist is refused, naming why. The runtime's "no such pod" is final: when
//! it knows no ready sandbox of the pod, does not answer, or its socket is gone, the pod is
//! refused even though another namespace holds its address (a reused pod address is another
//! pod's). Only without a runtime socket is the pod found by its address.
//! They fail when not run as root unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
use host::{root, run};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use kuport_node_exec::podns::cri::api::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use kuport_node_exec::podns::cri::api::{
    ListPodSandboxRequest, ListPodSandboxResponse, PodSandbox, PodSandboxMetadata, PodSandboxState,
    PodSandboxStatusRequest, PodSandboxStatusResponse,
};
use kuport_node_exec::sync::{NodeApplier, NodeKeepers};
use kuport_proto::netns;
use kuport_proto::v1::{NetnsState, NftFamily, NftTable, NodeState, ObjectError, PodRef};
use tonic::{Request, Response, Status};

/// A fake runtime: each sandbox with the `info` JSON its verbose status returns; it answers
/// ListPodSandbox as containerd does, by the label selector and the state filter.
#[derive(Clone, Default)]
struct FakeCri {
    sandboxes: Arc<Mutex<Vec<(PodSandbox, String)>>>,
    asked: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl RuntimeService for FakeCri {
    async fn list_pod_sandbox(
        &self,
        request: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        let filter = request.into_inner().filter.unwrap_or_default();
        self.asked.lock().unwrap().push(format!("list {:?}", filter.label_selector));
        let items = self
            .sandboxes
            .lock()
            .unwrap()
            .iter()
            .map(|(s, _)| s.clone())
            .filter(|s| filter.label_selector.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .filter(|s| filter.state.as_ref().is_none_or(|st| st.state == s.state))
            .collect();
        Ok(Response::new(ListPodSandboxResponse { items }))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<PodSandboxStatusRequest>,
    ) -> Result<Response<PodSandboxStatusResponse>, Status> {
        let r = request.into_inner();
        self.asked.lock().unwrap().push(format!("status {} verbose={}", r.pod_sandbox_id, r.verbose));
        let found = self.sandboxes.lock().unwrap().iter().find(|(s, _)| s.id == r.pod_sandbox_id).cloned();
        let Some((_, info)) = found else { return Err(Status::not_found(r.pod_sandbox_id)) };
        let info = if r.verbose { [("info".to_string(), info)].into() } else { Default::default() };
        Ok(Response::new(PodSandboxStatusResponse { status: None, info }))
    }
}

impl FakeCri {
    fn sandbox(&self, id: &str, uid: &str, created_at: i64, state: PodSandboxState, netns: &str) {
        let labels = [("io.kubernetes.pod.uid".to_string(), uid.to_string())].into();
        let metadata = PodSandboxMetadata { uid: uid.into(), ..Default::default() };
        let sandbox = PodSandbox { id: id.into(), metadata: Some(metadata), state: state as i32, created_at, labels };
        // containerd's verbose info, trimmed to what matters.
        let info = format!(
            r#"{{"pid":0,"processStatus":"running","runtimeSpec":{{"linux":{{"namespaces":[{{"type":"pid"}},{{"type":"network","path":"{netns}"}}]}}}}}}"#
        );
        self.sandboxes.lock().unwrap().push((sandbox, info));
    }

    fn clear(&self) {
        self.sandboxes.lock().unwrap().clear();
        self.asked.lock().unwrap().clear();
    }
}

/// Serves `fake` on `socket` until the test's runtime ends.
async fn serve(fake: FakeCri, socket: &Path) {
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(fake))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
}

/// A scratch network namespace, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Self {
        let name = format!("kuport-cri-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        run("ip", &["netns", "add", &name]);
        run("ip", &["-n", &name, "link", "set", "lo", "up"]);
        Netns(name)
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }

    fn tables(&self) -> String {
        run("ip", &["netns", "exec", &self.0, "nft", "list", "tables"])
    }

    /// What a pod's sandbox has: `address` on a veth end.
    fn pod_interface(&self, address: &str) {
        run("ip", &["-n", &self.0, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0-peer"]);
        run("ip", &["-n", &self.0, "addr", "add", &format!("{address}/32"), "dev", "eth0"]);
        run("ip", &["-n", &self.0, "link", "set", "eth0", "up"]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A scratch directory for the socket, removed on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn state(pod: &PodRef) -> NodeState {
    let table = NftTable { family: NftFamily::Ip as i32, name: "kuport-intercept".into(), ..Default::default() };
    let entry = NetnsState { target: netns::pod(pod.clone()), nft_tables: vec![table].into(), ..Default::default() };
    let mut s = NodeState { node: "n".into(), netns: vec![entry] };
    kuport_proto::canonicalize(&mut s);
    s
}

/// The pod's refusal as `object: reason`.
fn refusal(r: Result<(), Vec<ObjectError>>) -> String {
    let errors = r.expect_err("a refusal");
    assert_eq!(errors.len(), 1, "{errors:?}");
    format!("{}: {}", errors[0].object, errors[0].reason)
}

/// An address unique to this test process.
fn address(n: u32) -> String {
    let pid = std::process::id();
    format!("10.{}.{}.{}", 150 + (pid >> 16) % 50, (pid >> 8) % 256, (pid % 256 + n) % 254 + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_names_the_pods_namespace() {
    if !root() {
        return;
    }
    let dir = Dir(std::env::temp_dir().join(format!("kuport-cri-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let socket = dir.0.join("cri.sock");
    let fake = FakeCri::default();
    serve(fake.clone(), &socket).await;

    let host = Netns::new("host");
    // The namespace the runtime names holds no address of the pod: only the CRI can find it.
    let named = Netns::new("named");
    // A decoy holding the pod's address: what the address search would take.
    let decoy = Netns::new("decoy");
    let pod =
        PodRef { namespace: "web".into(), name: "web-0".into(), uid: "uid-web-0".into(), addresses: vec![address(0)] };
    decoy.pod_interface(&pod.addresses[0]);
    // An older ready sandbox and a newer one that is not ready: the newest ready one counts.
    fake.sandbox("sb-old", &pod.uid, 1, PodSandboxState::SandboxReady, &named.path());
    fake.sandbox("sb-down", &pod.uid, 5, PodSandboxState::SandboxNotready, &decoy.path());
    fake.sandbox("sb-other", "uid-other", 9, PodSandboxState::SandboxReady, &decoy.path());

    let host_path = PathBuf::from(host.path());
    let mut keepers = NodeKeepers::new(Some(host_path.clone())).with_cri(Some(socket.clone()));
    keepers.apply(state(&pod)).await.expect("applied");
    assert!(named.tables().contains("table ip kuport-intercept"), "the runtime's namespace: {}", named.tables());
    assert!(!decoy.tables().contains("kuport-intercept"), "not the decoy: {}", decoy.tables());
    let asked = fake.asked.lock().unwrap().clone();
    assert_eq!(asked, [r#"list {"io.kubernetes.pod.uid": "uid-web-0"}"#, "status sb-old verbose=true"]);

    // A runtime naming the host's namespace (this process's, or the configured host entry's).
    for (i, host_ns) in ["/proc/self/ns/net".to_string(), host.path()].into_iter().enumerate() {
        fake.clear();
        let p = PodRef { name: format!("hostly-{i}"), uid: format!("uid-hostly-{i}"), ..pod.clone() };
        fake.sandbox("sb-host", &p.uid, 1, PodSandboxState::SandboxReady, &host_ns);
        let mut k = NodeKeepers::new(Some(host_path.clone())).with_cri(Some(socket.clone()));
        assert_eq!(
            refusal(k.apply(state(&p)).await),
            format!(
                "pod web/hostly-{i}: the container runtime runs sandbox sb-host in the host's network namespace ({host_ns}), and the host's is never a pod's"
            )
        );
        assert!(!host.tables().contains("kuport-intercept"), "nothing written to the host");
    }

    // A path that does not exist.
    fake.clear();
    let missing = format!("/var/run/netns/kuport-cri-missing-{}", std::process::id());
    let p = PodRef { name: "gone".into(), uid: "uid-gone".into(), ..pod.clone() };
    fake.sandbox("sb-gone", &p.uid, 1, PodSandboxState::SandboxReady, &missing);
    let mut k = NodeKeepers::new(Some(host_path.clone())).with_cri(Some(socket.clone()));
    assert_eq!(
        refusal(k.apply(state(&p)).await),
        format!(
            "pod web/gone: the container runtime names {missing} for sandbox sb-gone, which cannot be opened: No such file or directory (os error 2)"
        )
    );

    // The runtime knows no ready sandbox of the pod while the decoy holds its address (a pod
    // address reused by another tenant's pod): refused, and nothing lands in the decoy.
    fake.clear();
    let p = PodRef { name: "byaddr".into(), uid: "uid-byaddr".into(), ..pod.clone() };
    let mut k = NodeKeepers::new(Some(host_path.clone())).with_cri(Some(socket.clone()));
    assert_eq!(
        refusal(k.apply(state(&p)).await),
        format!(
            "pod web/byaddr: the container runtime at {} has no ready sandbox of the pod (uid uid-byaddr); a pod the runtime does not run is not searched for by address",
            socket.display()
        )
    );
    assert!(!decoy.tables().contains("kuport-intercept"), "not the decoy: {}", decoy.tables());
    assert_eq!(fake.asked.lock().unwrap().len(), 1, "asked once, and not searched by address");
    // Also when only a sandbox that is not ready names the decoy.
    fake.sandbox("sb-down", &p.uid, 5, PodSandboxState::SandboxNotready, &decoy.path());
    let mut k = NodeKeepers::new(Some(host_path.clone())).with_cri(Some(socket.clone()));
    assert!(refusal(k.apply(state(&p)).await).contains("has no ready sandbox of the pod"));
    assert!(!decoy.tables().contains("kuport-intercept"), "not the decoy: {}", decoy.tables());

    // A socket that does not answer (a file no runtime serves), or that is gone (the runtime
    // restarting): refused, not searched by address either.
    let dead = dir.0.join("dead.sock");
    std::fs::write(&dead, b"").unwrap();
    let gone = dir.0.join("gone.sock");
    for s in [&dead, &gone] {
        let mut k = NodeKeepers::new(Some(host_path.clone())).with_cri(Some(s.clone()));
        let why = refusal(k.apply(state(&p)).await);
        assert!(
            why.starts_with(&format!("pod web/byaddr: CRI {}: ", s.display()))
                && why.ends_with("; a pod is not searched for by address while a runtime socket is set"),
            "{why}"
        );
        assert!(!decoy.tables().contains("kuport-intercept"), "not the decoy: {}", decoy.tables());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_socket_the_address_is_searched() {
    if !root() {
        return;
    }
    let host = Netns::new("nohost");
    let sandbox = Netns::new("nosock");
    let pod =
        PodRef { namespace: "web".into(), name: "web-1".into(), uid: "uid-web-1".into(), addresses: vec![address(1)] };
    sandbox.pod_interface(&pod.addresses[0]);
    let mut keepers = NodeKeepers::new(Some(PathBuf::from(host.path()))).with_cri(None);
    keepers.apply(state(&pod)).await.expect("found by address");
    assert!(sandbox.tables().contains("table ip kuport-intercept"), "{}", sandbox.tables());
}

/// Without a runtime, the namespace found by address must hold every address of the pod: a
/// namespace holding only its IPv4 address is not a dual-stack pod's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_socket_every_address_must_be_held() {
    if !root() {
        return;
    }
    let host = Netns::new("allhost");
    let partial = Netns::new("partial");
    let pod = PodRef {
        namespace: "web".into(),
        name: "web-2".into(),
        uid: "uid-web-2".into(),
        addresses: vec![address(2), "fd00:150::2".into()],
    };
    partial.pod_interface(&pod.addresses[0]);
    let mut keepers = NodeKeepers::new(Some(PathBuf::from(host.path())));
    assert_eq!(refusal(keepers.apply(state(&pod)).await), "pod web/web-2: network namespace not found on this node");
    assert!(!partial.tables().contains("kuport-intercept"), "{}", partial.tables());
}
