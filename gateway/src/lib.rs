//! kubetun gateway: a userspace WireGuard data plane (boringtun's `noise::Tunn` on a tun-rs TUN
//! device) with a lock-free 1:1 prefix-remap fast path, the WireGuard UAPI, and a gRPC control
//! server on a Unix socket.
//!
//! Layout: [`remap`] (the IO-free remap fast path, crate `kubetun-remap`), [`state`] (the
//! desired-state model both control surfaces feed), [`uapi`] (the WireGuard text protocol), [`device`] (TUN, sockets, peers, data-path tasks), [`grpc`],
//! [`metrics`] and [`status`] (reports).

pub mod caps;
pub mod clock;
pub mod device;
pub mod grpc;
pub mod io;
pub mod key;
pub mod metrics;
pub mod peercred;
pub mod state;
pub mod status;
pub mod uapi;
pub mod unix_socket;

// The control contract, shared with the controller (`kubetun-gateway-api`).
pub use kubetun_gateway_api::{log_filter, proto, socket_paths};
// The remap fast path (`kubetun-remap`), a crate without IO.
pub use kubetun_remap as remap;

#[cfg(test)]
mod fuzz_run;
