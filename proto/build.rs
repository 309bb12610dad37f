//! Generates the kuport.v1 types with the protoc that protoc-bin-vendored ships, so a fresh
//! machine needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let protos = ["kuport/v1/state.proto", "kuport/v1/sync.proto"];
    let descriptors = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("kuport_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(descriptors)
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .type_attribute(".", "#[serde(rename_all = \"camelCase\")]")
        // Written by hand: its peers are a persistent map, shared between states.
        .extern_path(".kuport.v1.WireguardDevice", "crate::wireguard::WireguardDevice")
        // Written by hand: their large lists are shared between states until one changes.
        .extern_path(".kuport.v1.NetnsState", "crate::shared::NetnsState")
        .extern_path(".kuport.v1.NftTable", "crate::shared::NftTable")
        .extern_path(".kuport.v1.NftSet", "crate::shared::NftSet")
        .compile_with_config(config, &protos, &["."])?;
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
