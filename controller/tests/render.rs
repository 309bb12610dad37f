//! `kuport-controller render`: the examples render stably, and bad input is named precisely.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::jiff::Timestamp;
use kuport_controller::compute::{Settings, compute};
use kuport_controller::render::{LoadError, load_dir, load_text, render_text};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster")
}

const NOW: &str = "2026-11-29T00:00:00Z";

#[test]
fn examples_render() {
    let now: Timestamp = NOW.parse().expect("timestamp");
    let cluster = load_dir(&examples(), now).expect("examples load");
    assert_eq!(cluster.classes.len(), 2, "the example classes public and intranet (docs/portmap/modes.md)");
    insta::assert_snapshot!(render_text(&compute(&cluster, &Settings::default())));
}

/// The examples with the mesh on: every node a member (a pod CIDR and a key each), so the port
/// maps' links run between overlay addresses, 50 below the devices' MTU (docs/overlay/mesh.md,
/// "Port maps over the mesh").
#[test]
fn examples_render_over_the_mesh() {
    use k8s_openapi::api::core::v1::NodeSpec;
    use kuport_controller::compute::overlay::OverlaySettings;
    let now: Timestamp = NOW.parse().expect("timestamp");
    let mut cluster = load_dir(&examples(), now).expect("examples load");
    cluster.nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for (i, n) in cluster.nodes.iter_mut().enumerate() {
        n.spec = Some(NodeSpec { pod_cidrs: Some(vec![format!("10.42.{i}.0/24")]), ..Default::default() });
    }
    for f in cluster.facts.iter_mut() {
        let i = cluster.nodes.iter().position(|n| n.metadata.name.as_deref() == Some(&f.node)).expect("a node");
        f.wireguard_public_key = Some(format!("{}{}=", "BCDEFGHIJ".as_bytes()[i] as char, "A".repeat(42)));
    }
    let settings = Settings { overlay: Some(OverlaySettings::default()) };
    let out = compute(&cluster, &settings);
    assert!(out.overlay.values().all(|o| o.refused.is_empty()), "{:?}", out.overlay);
    insta::assert_snapshot!(render_text(&out));
}

#[test]
fn cli_renders_the_examples() {
    let out = Command::new(env!("CARGO_BIN_EXE_kuport-controller"))
        .args(["render", &examples().to_string_lossy(), "--now", NOW])
        .output()
        .expect("run the binary");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("=== node edge-a"));
    assert!(text.contains("dnat ip to th dport . iifname . ip daddr . meta l4proto map @publish_range"));
}

fn load_err(yaml: &str) -> String {
    let mut cluster = Default::default();
    match load_text(Path::new("bad.yaml"), yaml, &mut cluster) {
        Ok(()) => panic!("expected an error for:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_input_names_file_object_and_field() {
    let e = load_err(
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMap\nmetadata: {name: web, namespace: apps}\n\
         spec: {className: public, protocol: TCP, port: http, serviceRef: {name: web}}\n",
    );
    assert!(e.starts_with("bad.yaml: document 1: PortMap apps/web: field spec.port:"), "{e}");

    let e = load_err(
        "---\n---\napiVersion: kuport.wlz.li/v1alpha1\nkind: PortMap\nmetadata: {name: x, namespace: y}\nspec: {className: c, protocol: SCTP, port: 1, serviceRef: {name: s}}\n",
    );
    assert!(e.contains("document 2") && e.contains("field spec.protocol") && e.contains("SCTP"), "{e}");

    let e = load_err(
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMapClass\nmetadata: {name: c}\nspec: {nodes: {a: {interfaces: wt0}}}\n",
    );
    assert!(e.contains("PortMapClass c: field spec.nodes.a.interfaces"), "{e}");

    let e = load_err("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n");
    assert!(e.contains("Deployment d") && e.contains("not a render input"), "{e}");

    let e = load_err("kind: [unclosed\n");
    assert!(e.starts_with("bad.yaml: document 1: not YAML"), "{e}");
}

#[test]
fn cli_reports_bad_input_without_panicking() {
    let dir = std::env::temp_dir().join(format!("kuport-render-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(
        dir.join("pm.yaml"),
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMap\nmetadata: {name: web, namespace: apps}\nspec: {className: public, protocol: TCP, port: 70000, serviceRef: {name: web}}\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_kuport-controller"))
        .args(["render", &dir.to_string_lossy()])
        .output()
        .expect("run the binary");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pm.yaml: document 1: PortMap apps/web: field spec.port"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn missing_folder_is_an_error() {
    let e = load_dir(Path::new("/nonexistent/kuport"), Timestamp::UNIX_EPOCH).map(|_| ()).unwrap_err();
    assert!(matches!(e, LoadError::Read { .. }));
}
