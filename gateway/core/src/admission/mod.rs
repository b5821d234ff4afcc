//! Admission: which of a remote cluster's packets reach this cluster. Each remote cluster is
//! open (every packet the remap table accepts, the behaviour without admissions) or exported
//! (only its admitted endpoints, the replies of the flows this cluster's pods opened towards
//! it, and the ICMP that belongs to either). Judged on the views, after the ingress remap.
//!
//! - [`allowed::Admissions`]: the snapshot's part, rebuilt with every apply: the views of
//!   every remote cluster by longest prefix, and per exported cluster its endpoints.
//! - [`flows::FlowTable`]: the connections opened towards remote clusters; shared by all
//!   tasks, outside the snapshot (it survives applies).
//! - `check`: the per-packet steps, [`allowed::Admissions::ingress`] and
//!   [`allowed::Admissions::egress`].
//! - [`reasons`]: why a packet was refused, counted per cluster.
//!
//! Without an exported cluster the ingress step is one flag check; without any admission so
//! is the egress step. Nothing here allocates or locks per packet.

pub mod allowed;
mod check;
pub mod flows;
pub mod reasons;
mod tuple;

#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod tests;
