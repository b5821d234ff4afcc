//! Isolated networks (ironcore-net model): `Network` objects get a cluster-unique ID claimed
//! by create-as-lock on cluster-scoped `NetworkId` objects, and mutual `spec.peerings` become
//! Ready peerings whose prefixes feed the gateway ACL.
//!
//! # Layout
//! - [`ids`] (pure): canonical IDs, the configured range and the candidate order.
//! - [`peering`] (pure): the peering handshake, the reverse lookup the watches use and
//!   [`acl_for_cluster`].

pub mod ids;
pub mod peering;

pub use peering::{NetworkKey, acl_for_cluster};
