//! kubetun controller library: everything between the Kubernetes API and the gateway.
//!
//! Pure core (no IO, time passed in):
//! - [`ipam`]: [`ipam::Ipam`] maps remote CIDRs to non-overlapping local views.
//! - [`planner`]: NetworkConfigs -> `TunnelEndpointSpec`s -> the gateway's
//!   [`gateway_api::DesiredState`].
//!
//! IO shell:
//! - [`reconcile`]: NetworkConfig and TunnelEndpoint reconcilers and the gateway sync
//!   ([`gateway_client::GatewayClient`] over the Unix socket).
//! - [`network`]: the Network / NetworkID allocator and peerings (the gateway ACL).
//! - [`connector`] and [`shortcut`]: linking two clusters, from the CLI or the hub's operator.
//! - [`rotation`]: rotating a cluster's gateway key across its links (`kubetun network
//!   rotate-keys`); the controller's side is [`reconcile::keys`].
//! - [`agent`]: the per-node route agent.
//! - [`runtime`]: what the reconcilers share: watches with their own backoff, the API
//!   server's reachability ([`runtime::ApiHealth`]), status patches, requeue backoff, shutdown.
//! - [`cli`]: the `kubetun` subcommands; [`cluster_info`], [`keys`], [`conditions`],
//!   [`context`], [`error`], [`events`], [`shutdown`] and [`socket_paths`] are shared plumbing.

// The gateway's control contract (`kubetun-gateway-api`): its gRPC types and client, its
// socket paths, the log filter every program reads.
pub use kubetun_gateway_api::proto as gateway_api;
pub use kubetun_gateway_api::{log_filter, socket_paths};

pub mod agent;
pub mod cli;
pub mod cluster_info;
pub mod conditions;
pub mod connector;
pub mod context;
pub mod error;
pub mod events;
pub mod gateway_client;
pub mod ha;
pub mod ipam;
pub mod keys;
pub mod kubeconfig;
pub mod network;
pub mod planner;
pub mod reconcile;
pub mod rotation;
pub mod runtime;
pub mod services;
pub mod shortcut;
pub mod shutdown;
// Test support (an in-process gateway): compiled for tests and the `testing` feature only.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
