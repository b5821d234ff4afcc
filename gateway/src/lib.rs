//! kubetun gateway: a userspace WireGuard data plane (boringtun's `noise::Tunn` on a tun-rs TUN
//! device) with a lock-free 1:1 prefix-remap fast path, the WireGuard UAPI, and a gRPC control
//! server on a Unix socket.
//!
//! Layout: [`state`] (the desired-state model both control surfaces feed), [`uapi`] (the
//! WireGuard text protocol), [`device`] (TUN, sockets, peers, data-path tasks), [`grpc`],
//! [`metrics`] and [`status`] (reports).

pub mod caps;
pub mod clock;
pub mod device;
pub mod grpc;
pub mod io;
pub mod key;
pub mod log_filter;
pub mod metrics;
pub mod peercred;
pub mod remap;
pub mod socket_paths;
pub mod state;
pub mod status;
pub mod uapi;
pub mod unix_socket;

/// Generated types and service stubs of `proto/gateway.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("kubetun.gateway.v1");
}

#[cfg(test)]
mod fuzz_run;
