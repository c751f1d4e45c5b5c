//! Generates the Pulsar protocol types (`proto/pulsar_api.proto`, proto2) with
//! prost and a vendored `protoc`, so builds need no system protobuf compiler.
//! `bytes` fields become `bytes::Bytes` (no copy when slicing frames).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    config.bytes(["."]);
    config.compile_protos(&["proto/pulsar_api.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
