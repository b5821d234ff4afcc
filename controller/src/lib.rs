//! kubetun controller library: IPAM, the CR -> gateway-state planner, reconcilers, the gateway
//! client and the connector shared by the CLI and the ShortcutConnection operator.

/// Gateway control API client types, generated from `gateway/proto/gateway.proto`.
#[allow(missing_docs, clippy::all)]
pub mod gateway_api {
    tonic::include_proto!("kubetun.gateway.v1");
}

pub mod cluster_info;
pub mod conditions;
pub mod context;
pub mod error;
pub mod gateway_client;
pub mod ipam;
pub mod keys;
pub mod planner;
pub mod reconcile;
#[doc(hidden)]
pub mod testing;
pub mod network;
pub mod connector;
pub mod cli;
pub mod shortcut;
pub mod agent;
