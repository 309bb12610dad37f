//! crds/ must be what the Rust types generate.

use std::path::Path;

#[test]
fn crds_folder_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/kuport.wlz.li.yaml");
    let want = kuport_controller::api::crds::yaml().expect("CRDs serialise");
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is stale; regenerate it with: cargo run -p kuport-controller -- crds > crds/kuport.wlz.li.yaml",
        path.display()
    );
}
