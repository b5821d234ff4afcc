//! Services across clusters: kubetun's implementation of the Multi-Cluster Services API.
//!
//! An exported Service travels as an [`kubetun_crds::ExportedService`] that its own cluster
//! writes into kubetun's namespace ([`offer`]); every linked cluster reads those with a
//! credential that may read nothing else and holds, per Service, a ServiceImport, a derived
//! selector-less Service (its ClusterIP is the ClusterSetIP) and EndpointSlices in its own
//! views of the exporters' addresses ([`desired`]), merged by KEP-1645's rules
//! ([`merge`]). It answers `clusterset.local` DNS from those imports ([`dns`]). Pure core:
//! [`offer`], [`merge`], [`desired`], [`dns`]; IO shell: [`sync`], [`dns_server`], and
//! `policies` (ExportPolicies: the selectors offers carry, the answers clients give).

pub mod desired;
pub mod dns;
pub mod dns_server;
mod import;
pub mod merge;
pub mod metrics;
pub mod offer;
mod policies;
pub mod sync;
mod writes;
