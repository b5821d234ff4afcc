//! The Network / NetworkID allocator: isolated networks (ironcore-net model): `Network` objects get a cluster-unique ID claimed
//! by create-as-lock on cluster-scoped `NetworkId` objects, and mutual `spec.peerings` become
//! Ready peerings whose prefixes feed the gateway ACL.
//!
//! # Layout
//! - [`ids`] (pure): canonical IDs, the configured range and the candidate order.
//! - [`peering`] (pure): the peering handshake, the reverse lookup the watches use and
//!   [`acl_for_cluster`].
//! - [`allocator`]: claiming and releasing IDs against the API (create-as-lock).
//! - [`gc`]: collecting claims whose Network is gone, after a grace period.
//! - [`reconciler`]: the Network and NetworkId reconcile functions and their contexts
//!   ([`Context`], [`NetworkIdContext`]).
//! - [`run`]: both controllers wired to watches, for the `kubetun-controller` binary.
//! - [`error`] and [`options`]: the ground floor ([`NetworkError`], [`NetworkOptions`]).

pub mod allocator;
mod controller;
pub mod error;
pub mod gc;
pub mod ids;
pub mod options;
pub mod peering;
pub mod reconciler;

pub use controller::run;
pub use error::NetworkError;
pub use options::NetworkOptions;
pub use peering::{NetworkKey, acl_for_cluster};
pub use reconciler::{
    Context, NetworkIdContext, NetworkIds, Networks, reconcile_network, reconcile_network_id,
};
