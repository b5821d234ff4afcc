//! The operator, what `kubetun-controller` runs: one folder per controller, each with its
//! context, reconcile and `run`.
//!
//! - [`network_config`]: NetworkConfigs and TunnelEndpoints of this cluster's links, and the
//!   gateway sync.
//! - [`isolation`]: the Network / NetworkID allocator and peerings (the gateway ACL).
//! - [`services`]: Services across clusters (the MCS API): offers, imports, DNS.
//! - [`shortcut`]: the hub's ShortcutConnection operator (with the [`crate::connector`]).
//! - [`ha`]: leader election between gateway replicas, the standby's sync.
//! - [`process`]: one `kubetun-controller` process running all of them.

pub mod ha;
pub mod isolation;
pub mod network_config;
pub mod process;
pub mod services;
pub mod shortcut;
