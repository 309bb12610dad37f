//! What a one-element delta costs on each side, against a namespace of N elements in one set
//! (docs/performance.md, "Deltas on the stream"): the controller's `diff`, the executor's
//! `apply` (which rebuilds, orders and versions the whole namespace), and, for comparison, what
//! a whole namespace costs to encode and decode.
//!
//! Run with `cargo bench -p kuport-proto --bench delta`; KUPORT_BENCH_ELEMENTS picks the sizes,
//! comma-separated (default 50000,250000); KUPORT_BENCH_REPS the repetitions (default 5;
//! median and minimum are reported).

use std::time::{Duration, Instant};

use kuport_proto::build::{member, port, set, table};
use kuport_proto::canonical::canonicalize_netns_whole;
use kuport_proto::v1::{NetnsState, NftFamily, NftType};
use prost::Message;

/// `n` ports in one set, and one more: `extra`.
fn namespace(n: u32, extra: u32) -> NetnsState {
    let mut elements: Vec<_> = (0..n).map(|i| member(vec![port(1000 + i)])).collect();
    elements.push(member(vec![port(extra)]));
    let sets = vec![set("ports", &[NftType::InetService], &[], elements)];
    let mut ns =
        NetnsState { nft_tables: vec![table(NftFamily::Inet, "kuport", sets, vec![])].into(), ..Default::default() };
    canonicalize_netns_whole(&mut ns);
    ns
}

fn median_min(mut v: Vec<Duration>) -> String {
    v.sort();
    format!("{:.1} / {:.1} ms", v[v.len() / 2].as_secs_f64() * 1e3, v[0].as_secs_f64() * 1e3)
}

fn main() {
    let sizes: Vec<u32> = std::env::var("KUPORT_BENCH_ELEMENTS")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().replace('_', "").parse().ok()).collect())
        .unwrap_or_else(|| vec![50_000, 250_000]);
    let reps: usize = std::env::var("KUPORT_BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(5).max(1);
    println!("Delta benchmark (`cargo bench -p kuport-proto --bench delta`), {reps} repetitions, median / min\n");
    println!("| elements | whole namespace | delta | diff (controller) | apply (executor) | whole encode + decode |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let (old, new) = (namespace(n, 1), namespace(n, 2));
        let (mut diffs, mut applies, mut wholes) = (Vec::new(), Vec::new(), Vec::new());
        let mut delta = NetnsState::default();
        for _ in 0..reps {
            let t = Instant::now();
            delta = kuport_proto::delta::diff(&old, &new);
            diffs.push(t.elapsed());
            let sent = delta.clone();
            let t = Instant::now();
            let got = kuport_proto::delta::apply(&old, sent);
            applies.push(t.elapsed());
            assert_eq!(got.as_ref(), Ok(&new), "the delta gives the new namespace");
            let t = Instant::now();
            let decoded = NetnsState::decode(new.encode_to_vec().as_slice());
            wholes.push(t.elapsed());
            assert_eq!(decoded.as_ref(), Ok(&new));
        }
        println!(
            "| {n} | {} B | {} B | {} | {} | {} |",
            new.encoded_len(),
            delta.encoded_len(),
            median_min(diffs),
            median_min(applies),
            median_min(wholes)
        );
    }
}
