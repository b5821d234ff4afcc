//! The controller and the CLI on real API servers (`kubetun-testenv`: etcd and kube-apiserver
//! per cluster, with kube-controller-manager and fake-kubelet where workloads run): one test
//! binary, its fixtures beside the tests. The programs (`kubetun`, `kubetun-controller`) run as
//! processes, built by `cargo build --workspace --bins` first.
//!
//! - `cli`, `install`, `crds`, `examples`, `logging`: the CLI's errors, `kubetun install`
//!   against `kubectl kustomize`, CRD names against discovery, every example as deployed, the
//!   log through an API-server outage; `isolation_cli`: `network connect --isolation`.
//! - `keys`, `shortcut`, `transit`: key Secrets, the hub's ShortcutConnection operator,
//!   transit through the hub.
//! - `services` (with `faults`, `hub`, `workloads`): services across clusters (fixtures:
//!   `services_support`); `conformance`: the MCS API's upstream conformance suite against two
//!   linked clusters, in both address layouts.
//! - `admissions`: isolation per link and the gateway's admissions following the exports
//!   (with their timing), per-export consumers at the exporter and the importer.
//!
//! libtest runs as many tests at once as the machine has cores, as each of these files did as
//! its own binary; every test starts its own clusters.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod realapi_support;
mod services_support;

mod admissions;
mod cli;
mod conformance;
mod crds;
mod examples;
mod install;
mod isolation_cli;
mod keys;
mod logging;
mod policies;
mod services;
mod shortcut;
mod transit;
