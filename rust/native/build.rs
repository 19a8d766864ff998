//! Generates the SglangService messages and server from the small proto in `proto/`, its
//! encoded descriptor set for server reflection (`OUT_DIR/sglang.runtime.v1.fds`), a client
//! for the integration tests (`OUT_DIR/client/`), and the versions of the gRPC crates the
//! build resolved (`OVERLAY_GRPC_CRATES`, from Cargo.lock).
//!
//! protoc comes from the `protoc-bin-vendored` crate unless `PROTOC` is set, so a build
//! needs nothing beyond crates.io.

const PROTO: &str = "proto/sglang/runtime/v1/sglang.proto";
/// The crates `build_info()["grpc"]` names, in that order.
const GRPC_CRATES: [&str; 4] = ["tonic", "tonic-health", "tonic-reflection", "prost"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment yet.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    println!("cargo:rerun-if-changed=proto");
    grpc_crate_versions()?;
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
        .build_client(false)
        .compile_protos(&[PROTO], &["proto"])?;
    // A client for the integration tests only (`tests/common`): the module serves, never calls.
    let client_dir = out_dir.join("client");
    std::fs::create_dir_all(&client_dir)?;
    tonic_prost_build::configure()
        .out_dir(&client_dir)
        .build_server(false)
        .build_client(true)
        .compile_protos(&[PROTO], &["proto"])?;
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

/// `tonic 0.14, tonic-health 0.14, ...`: major.minor of each gRPC crate in the workspace's
/// Cargo.lock (found by walking up from this crate; an sdist carries it at its root).
fn grpc_crate_versions() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let lock = manifest
        .ancestors()
        .map(|dir| dir.join("Cargo.lock"))
        .find(|path| path.is_file())
        .ok_or("no Cargo.lock above the crate")?;
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(&lock)?;
    let mut named = Vec::new();
    for name in GRPC_CRATES {
        let version = locked_version(&text, name).ok_or(format!("{name} is not in Cargo.lock"))?;
        let major_minor: Vec<&str> = version.split('.').take(2).collect();
        named.push(format!("{name} {}", major_minor.join(".")));
    }
    println!("cargo:rustc-env=OVERLAY_GRPC_CRATES={}", named.join(", "));
    Ok(())
}

/// The version of package `name` in Cargo.lock text (the first entry, if several).
fn locked_version<'a>(lock: &'a str, name: &str) -> Option<&'a str> {
    let mut lines = lock.lines();
    let wanted = format!("name = \"{name}\"");
    while let Some(line) = lines.next() {
        if line.trim() == wanted {
            let version = lines.next()?.trim().strip_prefix("version = \"")?;
            return version.strip_suffix('"');
        }
    }
    None
}
