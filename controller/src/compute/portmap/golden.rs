//! Golden node states for the port map's shapes (docs/portmap/datapath.md, "The two shapes"),
//! and the proof that each golden table is what nftables itself lists once loaded.

use std::process::Command;

use crate::compute::testkit::scenarios;

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
                let family = if table.family == kuport_proto::v1::NftFamily::Inet as i32 { "inet" } else { "ip" };
                let list = ns.run(&["nft", "-s", "list", "table", family, &table.name]);
                let listed = String::from_utf8_lossy(&list.stdout);
                assert_eq!(listed, text, "{name}/{node}: nft lists the table differently");
                let del = ns.run(&["nft", "delete", "table", family, &table.name]);
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
