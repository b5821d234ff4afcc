//! The names the programs share on Kubernetes objects: every label, annotation, finalizer,
//! Secret or ConfigMap key and condition type or reason that more than one program (the
//! controller, the route agent, the CLI, the lab) writes or reads. A program names them from
//! here, never from another program's modules. One module per object (or pair of objects).
//!
//! - [`cluster_info`]: the cluster info ConfigMap and the namespace kubetun runs in.
//! - [`gateway_key`]: the gateway key Secret.
//! - [`lease`]: the gateway replicas' Lease.
//! - [`link`]: NetworkConfigs and TunnelEndpoints (the two objects of a link).
//! - [`network`]: Networks and NetworkIDs.
//! - [`shortcut`]: ShortcutConnections and their kubeconfig Secrets.
//! - [`services`]: Services across clusters (credential Secrets, ServiceImports,
//!   EndpointSlices, derived Services).

pub mod cluster_info;
pub mod gateway_key;
pub mod lease;
pub mod link;
pub mod network;
pub mod services;
pub mod shortcut;
