//! The memory a Pod costs the controller (docs/performance.md, "Pods in memory"): every pod of
//! the cluster is watched so that endpoints are believed only when their Pod vouches for them,
//! and the reflector keeps each stripped (`observe::kubernetes::strip_pod`). Measured as the
//! growth of the process's resident memory over 20,000 pods, stripped ones first (a full pod is
//! parsed, stripped and dropped, so its memory is reused), then full ones.

use k8s_openapi::api::core::v1::Pod;
use kuport_controller::observe::kubernetes::strip_pod;

/// A pod of a Deployment as an API server serves it: one container with env, probes and
/// resources, a projected token volume, managedFields of the controller and the kubelet.
const POD: &str = include_str!("fixtures/pod.json");
const PODS: usize = 20_000;

/// The process's resident memory, bytes.
fn resident() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: usize = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("resident pages");
    pages * 4096
}

fn parse(i: usize) -> Pod {
    // Distinct names, as in a cluster (no string is shared between pods).
    let mut p: Pod = serde_json::from_str(POD).expect("the fixture parses");
    p.metadata.name = Some(format!("api-7d9f8c6b5-{i:05}"));
    p
}

#[test]
fn a_stripped_pod_holds_a_fraction_of_a_full_one() {
    let base = resident();
    let stripped: Vec<Pod> = (0..PODS)
        .map(|i| {
            let mut p = parse(i);
            strip_pod(&mut p);
            p
        })
        .collect();
    let kept = (resident() - base) / PODS;
    let base = resident();
    let full: Vec<Pod> = (0..PODS).map(parse).collect();
    let whole = (resident() - base) / PODS;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    println!(
        "per pod over {PODS} pods: {whole} B as served ({} B of JSON), {kept} B stripped; inline: Pod {} B (ObjectMeta {}, PodSpec {}, PodStatus {})",
        POD.len(),
        std::mem::size_of::<Pod>(),
        std::mem::size_of::<ObjectMeta>(),
        std::mem::size_of::<PodSpec>(),
        std::mem::size_of::<PodStatus>()
    );
    let p = &stripped[0];
    assert!(p.metadata.labels.as_ref().is_some_and(|l| l["app"] == "api"), "labels are kept (interception)");
    assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some("worker-2"));
    let ips: Vec<&str> = p.status.iter().flat_map(|s| s.pod_ips.iter().flatten()).map(|i| i.ip.as_str()).collect();
    assert_eq!(ips, ["10.244.2.9", "fd10:244:2::9"]);
    assert!(p.metadata.managed_fields.is_none() && p.spec.as_ref().is_some_and(|s| s.containers.is_empty()));
    assert!(kept * 4 < whole, "stripping keeps {kept} B of {whole} B");
    drop(full);
}
