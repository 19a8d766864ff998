//! Native half of sglang-sidecar-overlay: the follower metadata gRPC server.
//!
//! `server` is plain Rust (tonic + tokio) and is what `cargo test` exercises; `python`
//! wraps it as `sglang_sidecar_overlay._native` and is compiled only into the wheel.

pub mod address;
pub mod incoming;
pub mod limits;
pub mod server;
pub mod service;

#[cfg(feature = "python")]
mod python;

/// Generated from `proto/sglang/runtime/v1/sglang.proto`.
pub mod proto {
    tonic::include_proto!("sglang.runtime.v1");
}

/// The fully qualified gRPC service name, also the health-check service name.
pub const SGLANG_SERVICE: &str = "sglang.runtime.v1.SglangService";
