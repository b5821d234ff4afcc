//! The benches crate's tests, one binary: what runs the implementations `kubetun_benches`
//! locates (kubetun, wireguard-go, boringtun-cli) in network namespaces. Needs root.
//!
//! - `gateway_interop_matrix` (with `restart`, `roaming`): kubetun against each
//!   implementation, every configuration order, both underlay families.
//! - `harness`: one short iteration of the throughput harness.
//! - `scale`: the scale benches at a tenth of their size.
//!
//! Each module's tests take turns (`kubetun_testenv::turn`): side by side within a module,
//! never beside another module's, as when each was its own binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_interop_matrix;
mod harness;
mod scale;
