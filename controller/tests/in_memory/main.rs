//! The controller's tests on in-memory API servers (kube-fake-client) with in-process gateways:
//! one test binary, its fixtures beside the tests that use them. Fast and parallel; what needs
//! watches, RBAC or a real API server's semantics is in the `realapi_*` binaries.
//!
//! - The NetworkConfig controller: `controller_lifecycle`, `controller_scenarios`,
//!   `controller_invalid`, `controller_isolation` (fixtures: `controller_support`).
//! - Links between clusters and the hub's operator: `connector_links`, `diagnose_links`,
//!   `shortcut_cli`, `shortcut_operator` (fixtures: `connector_support`).
//! - Networks and their IDs: `network_allocation`, `network_gc`, `network_peering`,
//!   `reliability_restart` (fixtures: `network_common`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod connector_support;
mod controller_support;
mod network_common;

mod connector_links;
mod controller_invalid;
mod controller_isolation;
mod controller_lifecycle;
mod controller_scenarios;
mod diagnose_links;
mod network_allocation;
mod network_gc;
mod network_peering;
mod reliability_restart;
mod shortcut_cli;
mod shortcut_operator;
