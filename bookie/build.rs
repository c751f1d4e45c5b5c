//! Generates the bookie's gRPC service (tonic) with a vendored `protoc`, so
//! builds need no system protobuf compiler. The messages themselves live in
//! `cms-bookie-format` (`extern_path`): one definition, fuzzable without tonic.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .extern_path(".cms.bookie.v1", "::cms_bookie_format::proto::bookie")
        .extern_path(".cms.metadata.v1", "::cms_bookie_format::proto::metadata")
        .compile_with_config(
            config,
            &["format/proto/cms/bookie/v1/bookie.proto"],
            &["format/proto"],
        )?;
    println!("cargo:rerun-if-changed=format/proto");
    Ok(())
}
