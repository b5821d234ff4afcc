//! kubetun controller library: everything between the Kubernetes API and the gateway. The
//! operator (`kubetun-controller`) runs it; the route agent (`kubetun-agent`, crate
//! `controller/agent`) and the CLI (`kubetun`, crate `controller/cli`) build on its core (kube
//! plumbing, IPAM, planner, connector), each linking only what its own program needs.
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
//! - [`services`]: Services across clusters (the MCS API): offers, imports, DNS.
//! - [`ha`]: leader election between gateway replicas, the standby's sync.
//! - [`runtime`]: what the reconcilers share: one [`runtime::Context`] and one
//!   [`runtime::error_policy`] (requeue backoff), watches with their own backoff, the API
//!   server's reachability ([`runtime::ApiHealth`]), status patches.
//! - [`cluster_info`], [`keys`], [`conditions`], [`context`], [`error`], [`events`],
//!   [`logging`], [`shutdown`] and [`socket_paths`] are shared plumbing.

// The gateway's control contract (`kubetun-gateway-api`): its gRPC types and client, its
// socket paths, the log filter every program reads.
pub use kubetun_gateway_api::proto as gateway_api;
pub use kubetun_gateway_api::{log_filter, socket_paths};

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
pub mod logging;
pub mod network;
pub mod planner;
pub mod reconcile;
pub mod rotation;
pub mod runtime;
pub mod services;
pub mod shortcut;
pub mod shutdown;
