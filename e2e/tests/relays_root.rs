//! Relays in the lab (docs/overlay/relays.md, "The lab"): two homes behind their own NAT on the
//! same LAN prefix, that cannot reach each other, go through the cloud node; a port forward on
//! one home's router makes them direct; a cut moves them back to the relay and its repair back
//! to direct; a second relay takes the pair when the first one stops. The scenario and its
//! oracles are in `common/homes.rs`; the figures it prints are the benchmark's
//! (docs/performance.md), not asserted here.
//!
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1.

mod common;
use common::homes;

#[test]
fn homes_go_through_a_relay_and_back_to_direct_as_the_path_allows() {
    if !common::root() {
        return;
    }
    // Each cut held past the executors' first burst of probes and a NAT's UDP timeout.
    let h = homes::scenario("relays", std::time::Duration::from_secs(45));
    for t in &h.transitions {
        println!("measured: {t}");
    }
}
