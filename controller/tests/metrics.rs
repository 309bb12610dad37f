//! The controller's metrics as Prometheus reads them: the per-node connection gauge, the serving
//! certificate's end, and that every series the chart's alerts and dashboard use is one the
//! controller exports (a renamed metric would otherwise leave an alert silently never firing).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kuport_controller::compute::Settings;
use kuport_controller::render;
use kuport_controller::stream::{Hub, leader};
use kuport_controller::trust::tls::{self, Tls};
use kuport_proto::v1::Hello;

/// A hub with the example cluster computed and `connected` executors connected.
fn hub(connected: &[&str]) -> std::sync::Arc<Hub> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let cluster = render::load_dir(&dir, k8s_openapi::jiff::Timestamp::now()).expect("examples load");
    let (_tx, rx) = leader::standalone("127.0.0.1:1".into());
    let hub = Hub::new(Settings::default(), rx, true);
    hub.set_inputs(cluster);
    hub.recompute();
    for node in connected {
        hub.connect(&Hello { node: (*node).into(), executor_version: "test".into(), applied: None });
    }
    hub
}

/// The value of the sample line that starts with `series` followed by a space.
fn sample(text: &str, series: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_string))
}

#[test]
fn each_node_has_a_connected_series() {
    let hub = hub(&["edge-a"]);
    let text = hub.metrics().render(&hub);
    assert_eq!(sample(&text, "kuport_node_connected{node=\"edge-a\"}").as_deref(), Some("1"), "{text}");
    assert_eq!(sample(&text, "kuport_node_connected{node=\"worker-2\"}").as_deref(), Some("0"), "{text}");
    assert_eq!(sample(&text, "kuport_executors_connected").as_deref(), Some("1"), "{text}");
}

#[test]
fn the_serving_certificate_end_is_exported_once_one_is_served() {
    let hub = hub(&[]);
    let series = "kuport_serving_certificate_expiration_timestamp_seconds";
    let text = hub.metrics().render(&hub);
    assert_eq!(sample(&text, series).as_deref(), Some("0"), "none served yet:\n{text}");
    let ca = tls::issue_ca().expect("a CA");
    let serving = tls::issue_serving(&ca).expect("a serving certificate");
    let end = tls::not_after(&serving.cert).expect("its end");
    let secs = end.duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs();
    hub.metrics().watch_certificate(Tls::fixed(&serving).expect("servable"));
    let text = hub.metrics().render(&hub);
    assert_eq!(sample(&text, series), Some(secs.to_string()), "{text}");
}

/// Every series name in the text encoding: each family's from its `# TYPE` line with the
/// suffixes Prometheus sees for its type, and every sample's name.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else { continue };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            if end > 0 {
                names.insert(line[..end].to_string());
            }
        }
    }
    names
}

/// The `kuport_...` identifiers in `text` (PromQL in a rule or a dashboard).
fn referenced(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut at = 0;
    while let Some(found) = text[at..].find("kuport_") {
        let start = at + found;
        let mut end = start;
        while end < bytes.len() && word(bytes[end]) {
            end += 1;
        }
        // Part of a longer identifier (e.g. a recording rule's prefix): not a series of ours.
        if start == 0 || !word(bytes[start - 1]) {
            names.insert(text[start..end].to_string());
        }
        at = end;
    }
    names
}

/// The chart's files that hold PromQL: the alert rules and the dashboard.
fn chart_files() -> Vec<PathBuf> {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/kuport");
    vec![chart.join("templates/monitoring-prometheusrule.yaml"), chart.join("dashboards/kuport.json")]
}

#[test]
fn every_series_the_charts_alerts_and_dashboard_use_is_exported() {
    // What a working controller serves, plus one label set in each family with labels (those
    // without one are not encoded at all: the overlay's, with no overlay here).
    let hub = hub(&["edge-a"]);
    hub.metrics().nacks.inc();
    hub.metrics().render(&hub);
    hub.metrics().touch_every_family();
    let text = hub.metrics().encode();
    let exported = exported(&text);
    for must in ["kuport_nacks_total", "kuport_reconcile_seconds_bucket", "kuport_overlay_peer_relayed"] {
        assert!(exported.contains(must), "{must} not found in the encoding:\n{text}");
    }
    for file in chart_files() {
        let content = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let used = referenced(&content);
        assert!(!used.is_empty(), "{} uses no kuport series", file.display());
        let unknown: Vec<_> = used.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{} uses series kuport does not export: {unknown:?}\nexported: {exported:?}",
            file.display()
        );
    }
}

#[test]
fn referenced_finds_whole_identifiers_only() {
    let got = referenced("rate(kuport_nacks_total{job=\"kuport-controller\"}[5m]) + x_kuport_y + kuport_leader");
    assert_eq!(got, BTreeSet::from(["kuport_nacks_total".to_string(), "kuport_leader".to_string()]));
}

#[test]
fn the_dashboard_is_json_whose_panels_all_query_kuport() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/kuport/dashboards/kuport.json");
    let text = std::fs::read_to_string(&file).expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let queries: Vec<_> = panels.iter().filter(|p| p["type"] != "row").collect();
    assert!(queries.len() >= 10, "{} panels", queries.len());
    for p in queries {
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{} has no query", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("an expr");
            assert!(expr.contains("kuport_"), "{}: {expr}", p["title"]);
        }
    }
}
