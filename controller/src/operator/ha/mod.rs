//! Highly available gateways: several gateway replicas per cluster (each with its controller
//! beside it), one active, chosen by a `coordination.k8s.io/v1` Lease.
//!
//! - [`election`] (pure): the lease state machine on an injected monotonic clock.
//! - [`lease`]: the [`Elector`] reading and writing the Lease and holding the local gateway
//!   active (gRPC `Hold`) for exactly as long as this replica leads; failover events.
//! - [`standby`]: what a standby replica's controller does: it keeps its gateway on the
//!   desired state (read from the TunnelEndpoints the active replica's controller
//!   maintains) without writing anything, so a takeover needs no IPAM and no change on
//!   the remote side.
//! - [`metrics`]: leader gauge and takeover counter.
//!
//! The leader runs the whole controller; a replica that loses the lease puts its gateway on
//! standby and exits, to come back as a standby (the controller-runtime convention: two
//! sets of reconcilers must never run against one cluster).

pub mod election;
pub mod lease;
pub mod metrics;
pub mod standby;

pub use election::{Election, Timing, TimingError};
pub use lease::Elector;
pub use metrics::HaMetrics;
