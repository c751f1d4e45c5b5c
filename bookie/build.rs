//! Generates the bookie's protobuf types with a vendored `protoc`, so builds need
//! no system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY-free: build scripts are single-threaded; setting PROTOC here is the
    // documented way to point prost-build at a compiler.
    // (edition 2024 makes set_var unsafe; we pass the path explicitly instead.)
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    // Entry bodies and keys of the bookie protocol are `Bytes`: no copy from
    // the wire into storage and back.
    config.bytes([".cms.bookie"]);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_with_config(
            config,
            &[
                "proto/cms/metadata/v1/metadata.proto",
                "proto/cms/bookie/v1/bookie.proto",
            ],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
