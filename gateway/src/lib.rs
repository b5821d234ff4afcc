//! kubetun gateway: a userspace WireGuard data plane (boringtun's `noise::Tunn` on a tun-rs TUN
//! device) with a lock-free 1:1 prefix-remap fast path, the WireGuard UAPI, and a gRPC control
//! server on a Unix socket.

/// Generated types and service stubs of `proto/gateway.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("kubetun.gateway.v1");
}

pub mod remap;
