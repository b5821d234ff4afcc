//! kubetun gateway: a userspace WireGuard data plane (boringtun's `noise::Tunn` on a tun-rs TUN
//! device) with a lock-free 1:1 prefix-remap fast path, the WireGuard UAPI, and a gRPC control
//! server on a Unix socket.
//!
//! Layout: the IO shells around two crates without IO, `kubetun-gateway-core` (the data-path
//! core and its models, imported by that name; [`state`] and [`key`] re-export its models
//! for the API) and `kubetun-remap` ([`remap`], the remap fast path); [`state`] (the desired state from gRPC
//! requests), [`uapi`] (the WireGuard text protocol), [`device`] (TUN, sockets, data-path
//! tasks), [`io`] (the batched syscalls), [`grpc`], [`metrics`] and [`status`] (reports).

pub mod caps;
pub mod clock;
pub mod device;
pub mod grpc;
pub mod io;
pub mod metrics;
pub mod peercred;
pub mod state;
pub mod status;
pub mod uapi;
pub mod unix_socket;

// The control contract, shared with the controller (`kubetun-gateway-api`).
pub use kubetun_gateway_api::{log_filter, proto, socket_paths};
// The data-path core (`kubetun-gateway-core`) and the remap fast path (`kubetun-remap`),
// crates without IO.
pub use kubetun_gateway_core::key;
pub use kubetun_remap as remap;

#[cfg(test)]
mod fuzz_run;
