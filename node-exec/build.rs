//! Generates the CRI subset (proto/runtime/v1/api.proto) with the protoc that
//! protoc-bin-vendored ships, as kuport-proto does for kuport.v1.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let protos = ["proto/runtime/v1/api.proto"];
    tonic_prost_build::configure().compile_with_config(config, &protos, &["proto"])?;
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
