//! What the checks read from one cluster ([`Side`]), and how to read it.

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Api, ListParams};
use kubetun_crds::{ExportedService, NetworkConfig, TunnelEndpoint};

use super::expect::AGENT_DAEMONSET;
use kubetun_controller::connector::ClusterHandle;
use kubetun_controller::gateway_api::StatusResponse;
use kubetun_controller::plumbing::cluster_info::ClusterInfo;

/// What one cluster's API returned.
#[derive(Debug, Clone)]
pub struct Side {
    /// `local` or `remote`.
    pub label: String,
    /// The cluster info, or why it could not be read.
    pub info: Result<ClusterInfo, String>,
    /// The NetworkConfigs in kubetun's namespace.
    pub configs: Vec<NetworkConfig>,
    /// The TunnelEndpoints in kubetun's namespace.
    pub tunnels: Vec<TunnelEndpoint>,
    /// The route agent's DaemonSet: `None` when not installed, else (desired, ready).
    pub agent: Option<(i32, i32)>,
    /// The ExportedServices in kubetun's namespace (what this cluster offers its peers);
    /// `None` when they could not be listed.
    pub exports: Option<Vec<ExportedService>>,
    /// The gateway's status from its control socket: `None` when not asked for
    /// (`--gateway-socket`), else it or why it could not be read.
    pub gateway: Option<Result<StatusResponse, String>>,
}

/// Reads what the checks need from one cluster.
pub async fn collect(handle: &ClusterHandle) -> Side {
    let info = handle
        .load_info()
        .await
        .map_err(|e| kubetun_controller::connector::error_chain(&e));
    let configs: Api<NetworkConfig> = Api::namespaced(handle.client.clone(), &handle.namespace);
    let tunnels: Api<TunnelEndpoint> = Api::namespaced(handle.client.clone(), &handle.namespace);
    let daemonsets: Api<DaemonSet> = Api::namespaced(handle.client.clone(), &handle.namespace);
    let exports: Api<ExportedService> = Api::namespaced(handle.client.clone(), &handle.namespace);
    let lp = ListParams::default();
    let agent = daemonsets
        .get_opt(AGENT_DAEMONSET)
        .await
        .ok()
        .flatten()
        .map(|ds| {
            let status = ds.status.unwrap_or_default();
            (status.desired_number_scheduled, status.number_ready)
        });
    Side {
        label: handle.label.clone(),
        info,
        configs: configs.list(&lp).await.map(|l| l.items).unwrap_or_default(),
        tunnels: tunnels.list(&lp).await.map(|l| l.items).unwrap_or_default(),
        agent,
        exports: exports.list(&lp).await.map(|l| l.items).ok(),
        gateway: None,
    }
}

/// The peers `side` has links with (by NetworkConfig or TunnelEndpoint).
pub(super) fn peers_of(side: &Side, own: &str) -> Vec<String> {
    let mut peers: Vec<String> = side
        .tunnels
        .iter()
        .map(|te| te.spec.cluster.id.clone())
        .chain(side.configs.iter().filter_map(|c| {
            if c.spec.source_cluster.id == own {
                Some(c.spec.destination_cluster.id.clone())
            } else if c.spec.destination_cluster.id == own {
                Some(c.spec.source_cluster.id.clone())
            } else {
                None
            }
        }))
        .collect();
    peers.sort();
    peers.dedup();
    peers
}

pub(super) fn tunnel_of<'a>(side: &'a Side, peer: &str) -> Option<&'a TunnelEndpoint> {
    side.tunnels.iter().find(|te| te.spec.cluster.id == peer)
}
