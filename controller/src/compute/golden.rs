//! Golden node states for note 000's shapes, and the proof that each golden table is what
//! nftables itself lists once loaded.

use std::process::Command;

use super::tests::World;

use crate::api::{Protocol::Tcp, Protocol::Udp, ReturnPathMode, ServingMode};

const EDGE: &[(&str, &[&str])] = &[("edge-a", &["enp1s0", "wt0"])];

fn nodes() -> World {
    World::new()
        .node("edge-a", "100.64.93.143", true)
        .node("worker-b", "100.64.0.2", true)
        .node("worker-c", "100.64.0.3", true)
        .facts("edge-a", 1420, &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.93.143")])
        .facts("worker-b", 1380, &[("wt0", "100.64.0.2")])
        .facts("worker-c", 1420, &[("wt0", "100.64.0.3")])
}

/// Every golden scenario: a name and its cluster.
pub fn scenarios() -> Vec<(&'static str, World)> {
    use ReturnPathMode::{None as NoPath, Vxlan};
    use ServingMode::{Multi, Single};
    vec![
        (
            "local_pod_port_and_range",
            nodes()
                .class("public", Single, Vxlan, EDGE)
                .service("web", "web", "TCP", 8080, &[("web-0", "edge-a", "10.244.0.7", true)])
                .service("games", "game", "UDP", 27015, &[("game-0", "edge-a", "10.244.0.107", true)])
                .port_map("web", "web", "public", Tcp, 3000, None, "web", 0)
                .port_map("games", "game", "public", Udp, 27015, Some(27115), "game", 1),
        ),
        (
            "single_remote_pod",
            nodes()
                .class("public", Single, Vxlan, EDGE)
                .service("web", "web", "TCP", 3000, &[("web-0", "worker-b", "10.244.1.7", true)])
                .service("games", "game", "UDP", 27015, &[("game-0", "worker-b", "10.244.1.107", true)])
                .port_map("web", "web", "public", Tcp, 3000, None, "web", 0)
                .port_map("games", "game", "public", Udp, 27015, Some(27115), "game", 1),
        ),
        (
            "multi_pod_node_two_links",
            nodes()
                .class("pair", Multi, Vxlan, &[("edge-a", &["wt0"]), ("worker-c", &["wt0"])])
                .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])
                .port_map("ns", "m", "pair", Tcp, 3000, None, "svc", 0),
        ),
        (
            "multi_three_accepting",
            nodes()
                .class(
                    "intranet",
                    Multi,
                    Vxlan,
                    &[("edge-a", &["wt0"]), ("worker-b", &["wt0"]), ("worker-c", &["wt0"])],
                )
                .edit_class("intranet", |s| {
                    s.return_path.vxlan.vni = 4300;
                    s.return_path.vxlan.subnet = "169.254.79.0/24".into();
                })
                .service("ns", "dns", "UDP", 5353, &[("dns-0", "worker-b", "10.244.1.53", true)])
                .port_map("ns", "dns", "intranet", Udp, 5353, None, "dns", 0),
        ),
        (
            "none_refusal",
            nodes()
                .class("public", Single, NoPath, EDGE)
                .service("ns", "svc", "TCP", 3000, &[("pod", "worker-b", "10.244.1.7", true)])
                .port_map("ns", "m", "public", Tcp, 3000, None, "svc", 0),
        ),
        (
            "two_classes_one_pair",
            nodes()
                .class("public", Single, Vxlan, EDGE)
                .class("mesh", Single, Vxlan, &[("edge-a", &["wt0"])])
                .edit_class("mesh", |s| s.return_path.vxlan.vni = 4400)
                .service("ns", "web", "TCP", 3000, &[("web-0", "worker-b", "10.244.1.7", true)])
                .service("ns", "api", "TCP", 9000, &[("api-0", "worker-b", "10.244.1.9", true)])
                .port_map("ns", "web", "public", Tcp, 3000, None, "web", 0)
                .port_map("ns", "api", "mesh", Tcp, 9000, None, "api", 1)
                .edit_map("web", |s| s.interfaces = Some(vec!["enp1s0".into()])),
        ),
    ]
}

#[test]
fn golden_states() {
    for (name, world) in scenarios() {
        let text = crate::render::render_text(&world.run());
        insta::assert_snapshot!(name, text);
    }
}

/// Loads every golden table with `nft -f` in a scratch network namespace and checks that
/// `nft -s list table` prints exactly the canonical text.
#[test]
fn golden_tables_load_and_list_unchanged() {
    if !root_tests_enabled() {
        return;
    }
    let ns = Netns::new("golden");
    for (name, world) in scenarios() {
        for (node, state) in world.run().node_states {
            for table in state.netns.iter().flat_map(|n| &n.nft_tables) {
                let text = kuport_proto::text::nft_table(table);
                let file = std::env::temp_dir().join(format!("kuport-golden-{}-{name}-{node}.nft", std::process::id()));
                std::fs::write(&file, &text).expect("write temp file");
                let load = ns.run(&["nft", "-f", &file.to_string_lossy()]);
                let _ = std::fs::remove_file(&file);
                assert!(
                    load.status.success(),
                    "{name}/{node}: nft -f refused:\n{}\n{text}",
                    String::from_utf8_lossy(&load.stderr)
                );
                let list = ns.run(&["nft", "-s", "list", "table", "ip", &table.name]);
                let listed = String::from_utf8_lossy(&list.stdout);
                assert_eq!(listed, text, "{name}/{node}: nft lists the table differently");
                let del = ns.run(&["nft", "delete", "table", "ip", &table.name]);
                assert!(del.status.success());
            }
        }
    }
}

/// Root tests run in CI (as root); elsewhere they fail unless KUPORT_SKIP_ROOT_TESTS=1.
pub fn root_tests_enabled() -> bool {
    if std::env::var("KUPORT_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
        eprintln!("skipped: KUPORT_SKIP_ROOT_TESTS=1");
        return false;
    }
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout == b"0\n").unwrap_or(false);
    assert!(root, "this test needs root (network namespaces); set KUPORT_SKIP_ROOT_TESTS=1 to skip");
    true
}

/// A scratch network namespace, deleted on drop.
pub struct Netns(String);

impl Netns {
    pub fn new(tag: &str) -> Self {
        let name = format!("kuport-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let out = Command::new("ip").args(["netns", "add", &name]).output().expect("run ip");
        assert!(out.status.success(), "ip netns add: {}", String::from_utf8_lossy(&out.stderr));
        Netns(name)
    }

    pub fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip").args(["netns", "exec", &self.0]).args(args).output().expect("run ip netns exec")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}
