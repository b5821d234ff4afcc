//! kubetun gateway: a userspace WireGuard data plane (boringtun's `noise::Tunn` on a tun-rs TUN
//! device) with a lock-free 1:1 prefix-remap fast path, the WireGuard UAPI, and a gRPC control
//! server on a Unix socket.
//!
//! Layout: the IO shell around two crates without IO, each named by its own name,
//! `kubetun-gateway-core` (the data-path core and its models) and `kubetun-remap` (the remap
//! fast path), and over the syscall crate `kubetun-gateway-io`; here [`state`] (the desired
//! state from gRPC requests), [`uapi`] (the WireGuard text protocol), [`device`] (TUN,
//! sockets, data-path tasks), [`io_options`] (which I/O techniques are on), [`grpc`],
//! [`metrics`] and [`status`] (reports).

pub mod caps;
pub mod clock;
pub mod device;
pub mod grpc;
pub mod io_options;
pub mod metrics;
pub mod peercred;
pub mod state;
pub mod status;
pub mod uapi;
pub mod unix_socket;

// The control contract, shared with the controller (`kubetun-gateway-api`).
pub use kubetun_gateway_api::{log_filter, proto, socket_paths};

#[cfg(test)]
mod fuzz_run;
