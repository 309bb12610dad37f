//! A lab with kuport's WireGuard mesh on its own API server (docs/overlay/lab.md): the lab's
//! controller replica with `--overlay` and one executor per node, each in a private mount
//! namespace with its own wireguard-go sockets; `wg show` inside a node's namespace as the
//! oracle. Shared by the overlay's and the relays' lab tests.
#![allow(dead_code)]

#[path = "../../../node-exec/tests/common/wg_dump.rs"]
pub mod wg_dump;
use wg_dump::{Dump, sorted};

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kuport_lab::Protocol::{Tcp, Udp};
use kuport_lab::plane::{self, PlaneOptions};
use kuport_lab::topology::{NodeSpec, PodSpec};
use kuport_lab::{Lab, Manifests, Plane, Topology};

use super::OwnedApiServer;

/// The overlay's device, as the controller names it by default.
pub const DEV: &str = "kup-wg";
/// The pods' echo port of the sites topology.
pub const ECHO: u16 = 7000;
/// How long the mesh may take to form, on a noisy machine.
pub const FORM: Duration = Duration::from_secs(60);

/// A mesh lab on its own API server; removed on drop.
pub struct Mesh {
    lab: Option<Lab>,
    api: Option<OwnedApiServer>,
    pub dir: PathBuf,
    pub started: Instant,
}

impl Mesh {
    /// The lab of `topology` with `manifests`, its plane started and converged.
    pub fn start(tag: &str, topology: &Topology, manifests: &Manifests) -> Mesh {
        let dir = std::env::temp_dir().join(format!("kuport-overlay-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let api = OwnedApiServer::up(&dir.join("controlplane"));
        let mut lab = Lab::up(topology).expect("the lab builds");
        let mut options = PlaneOptions::new(env!("CARGO_BIN_EXE_kuport-lab"), dir.join("plane"));
        options.kubernetes = Some(api.source(None, 1));
        let started = Instant::now();
        // The port maps from the start: their links begin on the underlay (no keys yet) and move
        // onto the mesh in place once every node is a member.
        lab.start_plane(manifests, options).expect("the controller and executors start");
        let plane = lab.plane_mut().expect("a plane");
        let took = plane.wait_mesh(plane::CONVERGE_TIMEOUT).expect("the mesh is computed");
        plane.wait_converged(plane::CONVERGE_TIMEOUT).expect("the lab converges");
        println!(
            "[{tag}] the mesh computed and applied {:.2} s after start, the port maps {:.2} s",
            took.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        Mesh { lab: Some(lab), api: Some(api), dir, started }
    }

    pub fn lab(&self) -> &Lab {
        self.lab.as_ref().expect("the lab")
    }

    pub fn lab_mut(&mut self) -> &mut Lab {
        self.lab.as_mut().expect("the lab")
    }

    pub fn plane(&self) -> &Plane {
        self.lab().plane().expect("the plane")
    }

    pub fn plane_mut(&mut self) -> &mut Plane {
        self.lab_mut().plane_mut().expect("the plane")
    }

    pub fn api(&self) -> &kuport_lab::apiserver::ApiServer {
        &self.api.as_ref().expect("the API server").0
    }

    pub fn nodes(&self) -> Vec<NodeSpec> {
        self.lab().topology().nodes.clone()
    }

    pub fn pods(&self) -> Vec<PodSpec> {
        self.lab().topology().pods.clone()
    }

    /// The public key the controller published on a Node (empty: none).
    pub fn published_key(&self, node: &str) -> String {
        let path = "jsonpath={.metadata.annotations.kuport\\.wlz\\.li/wireguard-public-key}";
        self.api().kubectl(&["get", "node", node, "-o", path], None).expect("kubectl get node").trim().to_string()
    }

    /// `wg show kup-wg dump` inside a node's namespace, with its own sockets mounted where `wg`
    /// looks (`ip netns exec` gives the command a mount namespace of its own).
    pub fn dump(&self, node: &str) -> Dump {
        Dump::parse(&self.wg_show(node), node)
    }

    /// The dump, None while the device is not there.
    pub fn try_dump(&self, node: &str) -> Option<Dump> {
        let out = self.wg_show(node);
        out.status.success().then(|| Dump::parse(&out, node))
    }

    pub fn wg_show(&self, node: &str) -> std::process::Output {
        let sockets = self.plane().wireguard_sockets(node);
        let script = format!("mount --bind {} /var/run/wireguard && exec wg show {DEV} dump", sockets.display());
        std::process::Command::new("ip")
            .args(["netns", "exec", &self.lab().netns_name(node), "sh", "-c", &script])
            .output()
            .expect("runs wg")
    }

    /// Every process log of the plane, for a failure's message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(entries) = std::fs::read_dir(self.plane().dir()) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".log") {
                    let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(40).collect();
                    out.push_str(&format!("--- {name}\n"));
                    for l in tail.into_iter().rev() {
                        out.push_str(l);
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    /// The peers the controller computed for a node, as its executor stored them applied:
    /// (public key, allowed IPs sorted, keepalive).
    pub fn computed(&self, node: &str) -> BTreeSet<(String, String, String)> {
        let stored = self.plane().stored(node).expect("reads the store").expect("a stored state");
        let state = stored.state.expect("a state");
        let host = state.netns.iter().find(|n| n.is_host()).expect("the host namespace");
        let dev = host.wireguard_devices.iter().find(|d| d.name == DEV).expect("the overlay device");
        dev.peers
            .iter()
            .map(|p| {
                (p.public_key.clone(), sorted(&p.allowed_ips.join(",")), p.persistent_keepalive_seconds.to_string())
            })
            .collect()
    }

    /// The pod on `node` that serves the echo port.
    pub fn pod_of(&self, node: &str) -> PodSpec {
        self.pods()
            .into_iter()
            .find(|p| p.node == node && p.tcp.iter().any(|r| r.iter().any(|x| x == ECHO)))
            .expect("a pod")
    }

    /// Probes pod to pod over the mesh until it answers (the first packets may wait for a
    /// handshake); asserts the real addresses at both ends.
    pub fn pod_to_pod(&self, from: &PodSpec, to: &PodSpec, proto: kuport_lab::Protocol, within: Duration) {
        let dial = SocketAddrV4::new(to.address, ECHO);
        let start = Instant::now();
        let a = loop {
            match self.lab().probe(&from.name, dial, proto) {
                Ok(a) => break a,
                Err(e) if start.elapsed() > within => panic!("{} -> {dial}/{proto}: {e}", from.name),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        assert_eq!(a.pod, to.name, "the wrong pod answered: {a}");
        assert_eq!(*a.seen.ip(), from.address, "{} did not see {}'s real address: {a}", to.name, from.name);
        assert_eq!(a.seen.port(), a.local.port(), "the source port changed on the way: {a}");
        assert_eq!(a.reply_from, dial, "the reply did not come from the dialed address: {a}");
    }

    /// Every pod pair, both directions, TCP and UDP.
    pub fn all_pairs(&self, within: Duration) {
        let nodes: Vec<String> = self.nodes().iter().map(|n| n.name.clone()).collect();
        for a in &nodes {
            for b in &nodes {
                if a == b {
                    continue;
                }
                let (pa, pb) = (self.pod_of(a), self.pod_of(b));
                self.pod_to_pod(&pa, &pb, Tcp, within);
                self.pod_to_pod(&pa, &pb, Udp, within);
            }
        }
    }

    /// Each node's device lists exactly its computed peers, whose keys are the other Nodes'
    /// published keys and whose allowed IPs are their pod CIDRs, every pair direct (keepalive
    /// on), within 30 s. A pair a side reported unreachable (a new key's path not yet seen
    /// working, or one broken while its node restarted) stays off its keepalive until that
    /// side's probes report it again (docs/overlay/reach.md), and the pods' traffic can pass
    /// before that report does. Returns how long the mesh took to settle.
    pub fn assert_wg_matches(&self) -> Duration {
        let nodes = self.nodes();
        let start = Instant::now();
        loop {
            let keys: BTreeMap<String, String> =
                nodes.iter().map(|n| (n.name.clone(), self.published_key(&n.name))).collect();
            let expected = |n: &NodeSpec| -> BTreeSet<(String, String, String)> {
                nodes
                    .iter()
                    .filter(|o| o.name != n.name)
                    .map(|o| (keys[&o.name].clone(), o.pod_cidr.0.trunc().to_string(), "25".to_string()))
                    .collect()
            };
            let listed = |n: &NodeSpec| -> BTreeSet<(String, String, String)> {
                self.dump(&n.name).peers.iter().map(|p| (p[0].clone(), sorted(&p[3]), p[7].clone())).collect()
            };
            let settled = nodes.iter().all(|n| {
                self.computed(&n.name) == expected(n)
                    && listed(n) == expected(n)
                    && self.dump(&n.name).device[1] == keys[&n.name]
            });
            if settled || start.elapsed() > Duration::from_secs(30) {
                for n in &nodes {
                    assert_eq!(self.computed(&n.name), expected(n), "{}: the computed peers", n.name);
                    assert_eq!(listed(n), expected(n), "{}: wg show lists exactly the computed peers", n.name);
                    assert_eq!(
                        self.dump(&n.name).device[1],
                        keys[&n.name],
                        "{}: the device holds the published key",
                        n.name
                    );
                }
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every node has a handshake with every other; when each pair's first
    /// handshake was seen, from `since`, by (node, peer).
    pub fn wait_handshakes(&self, since: Instant) -> BTreeMap<(String, String), Duration> {
        let nodes: Vec<String> = self.nodes().iter().map(|n| n.name.clone()).collect();
        let pairs = nodes.len() * (nodes.len() - 1);
        let mut seen = BTreeMap::new();
        let deadline = Instant::now() + FORM;
        while seen.len() < pairs && Instant::now() < deadline {
            let keys: BTreeMap<String, String> = nodes.iter().map(|n| (self.published_key(n), n.clone())).collect();
            for n in &nodes {
                let Some(d) = self.try_dump(n) else { continue };
                for p in d.peers.iter().filter(|p| p[4] != "0") {
                    if let Some(peer) = keys.get(&p[0]) {
                        seen.entry((n.clone(), peer.clone())).or_insert_with(|| since.elapsed());
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if seen.len() != pairs {
            let dumps: Vec<String> = nodes.iter().map(|n| format!("{n}: {:?}", self.try_dump(n))).collect();
            panic!(
                "every node has a handshake with every peer within {FORM:?}: {seen:?}\n{}\n{}",
                dumps.join("\n"),
                self.logs()
            );
        }
        seen
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        drop(self.lab.take());
        drop(self.api.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until `f` holds; panics with `what` after `within`.
pub fn until(what: &str, within: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}
