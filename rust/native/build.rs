//! Generates the SglangService server and client from the small proto in `proto/`, and its
//! encoded descriptor set for server reflection (`OUT_DIR/sglang.runtime.v1.fds`).
//!
//! protoc comes from the `protoc-bin-vendored` crate unless `PROTOC` is set, so a build
//! needs nothing beyond crates.io.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment yet.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    println!("cargo:rerun-if-changed=proto");
    for (name, var) in [
        ("OVERLAY_BUILD_PROFILE", "PROFILE"),
        ("OVERLAY_BUILD_TARGET", "TARGET"),
    ] {
        println!(
            "cargo:rustc-env={name}={}",
            std::env::var(var).unwrap_or_default()
        );
    }
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR unset")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("sglang.runtime.v1.fds"))
        .build_server(false)
        .build_client(true)
        .compile_protos(&["proto/sglang/runtime/v1/sglang.proto"], &["proto"])?;
    // The server side is generated from a Rust description instead, so its reply type can be
    // the pre-encoded message (see `service::generated`); method and service names match the
    // proto above.
    let service = tonic_build::manual::Service::builder()
        .name("SglangService")
        .package("sglang.runtime.v1")
        .method(
            tonic_build::manual::Method::builder()
                .name("get_server_info")
                .route_name("GetServerInfo")
                .input_type("crate::proto::GetServerInfoRequest")
                .output_type("crate::service::EncodedReply")
                .codec_path("crate::service::ReplyCodec")
                .build(),
        )
        .build();
    tonic_build::manual::Builder::new()
        .build_client(false)
        .build_transport(false)
        .compile(&[service]);
    Ok(())
}
