//! Generates the bookie protocol and metadata messages (prost, no gRPC
//! service: the bookie crate adds the service on top with `extern_path`)
//! with a vendored `protoc`, so builds need no system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    // Entry bodies and keys of the bookie protocol are `Bytes`: no copy from
    // the wire into storage and back.
    config.bytes([".cms.bookie"]);
    config.compile_protos(
        &[
            "proto/cms/metadata/v1/metadata.proto",
            "proto/cms/bookie/v1/bookie.proto",
        ],
        &["proto"],
    )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
