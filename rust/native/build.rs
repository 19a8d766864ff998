//! Generates the SglangService server and client from the small proto in `proto/`.
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
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_protos(&["proto/sglang/runtime/v1/sglang.proto"], &["proto"])?;
    Ok(())
}
