//! The contract between kubetun's programs, compiled once and used by both sides:
//!
//! - [`proto`]: the gateway's gRPC control API (`proto/gateway.proto`: Apply, Status,
//!   Watch), its messages with serde (state files are YAML or JSON), the gateway's server
//!   and the controller's client;
//! - [`socket_paths`]: where a gateway's control sockets are, from its interface name;
//! - [`log_filter`]: how every kubetun program reads `RUST_LOG`.
//!
//! What may change here is what both programs must agree on; each program's own model of a
//! state (the gateway's validated state, the controller's plan) lives with the program.

/// Generated types and service stubs of `proto/gateway.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("kubetun.gateway.v1");
}

pub mod log_filter;
pub mod socket_paths;
