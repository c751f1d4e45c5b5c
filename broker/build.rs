//! Generates the broker's protobuf records (managed-ledger and cursor metadata)
//! with a vendored `protoc`, so builds need no system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Edition 2024 makes `set_var` unsafe; the compiler path is passed explicitly.
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    // Maps are emitted as `BTreeMap`: deterministic encoding of properties.
    config.btree_map(["."]);
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_with_config(
            config,
            &["proto/cms/broker/v1/managed_ledger.proto"],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
