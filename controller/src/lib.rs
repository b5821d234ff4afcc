//! kubetun controller library: everything between the Kubernetes API and the gateway, in
//! floors whose arrows point down only. The operator (`kubetun-controller`) runs all of it;
//! the route agent (`kubetun-agent`) and the CLI (`kubetun`) use the floors below the
//! operator. The names shared on objects live in `kubetun_crds::contract`.
//!
//! - [`operator`]: the controllers (NetworkConfig and gateway sync, Network allocator,
//!   services, shortcut, HA).
//! - [`connector`]: what the CLI and the hub's operator both do to a link: connect, sync,
//!   tear down, rotate keys.
//! - [`plumbing`]: Kubernetes and gateway plumbing (runtime, conditions, events, kubeconfig,
//!   logging, shutdown, cluster info, gateway client).
//! - Pure cores (no IO, time passed in): [`ipam`] maps remote CIDRs to non-overlapping local
//!   views; [`planner`] turns NetworkConfigs into `TunnelEndpointSpec`s and the gateway's
//!   [`gateway_api::DesiredState`]; [`keys`] is the gateway's key pair.

// The gateway's control contract (`kubetun-gateway-api`): its gRPC types and client, its
// socket paths, the log filter every program reads.
pub use kubetun_gateway_api::proto as gateway_api;
pub use kubetun_gateway_api::{log_filter, socket_paths};

pub mod connector;
pub mod ipam;
pub mod keys;
pub mod operator;
pub mod planner;
pub mod plumbing;
