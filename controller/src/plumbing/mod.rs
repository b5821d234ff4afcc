//! Kubernetes and gateway plumbing every program of the controller crate builds on, with no
//! knowledge of links or operators: the reconcilers' runtime (one `Context`, one error policy,
//! watches with their own backoff), conditions, events, clients from kubeconfigs, logging,
//! shutdown, the cluster info ConfigMap, the gateway's control client and the board of this
//! cluster's exports the services operator and the gateway sync share.

pub mod cluster_info;
pub mod conditions;
pub mod events;
pub mod exports;
pub mod gateway_client;
pub mod key_secret;
pub mod kubeconfig;
pub mod logging;
pub mod runtime;
pub mod shutdown;
pub mod tunnel_endpoints;
