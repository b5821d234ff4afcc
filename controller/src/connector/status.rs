//! `kubetun network status`: every link of one cluster, from its TunnelEndpoints and, for
//! links without one yet, its NetworkConfigs.

use std::collections::BTreeMap;
use std::fmt;

use kube::ResourceExt;
use kube::api::ListParams;
use kubetun_crds::contract::link::{ROLE_LABEL, ROLE_LOCAL, ROLE_REMOTE};
use kubetun_crds::{
    CidrMapping, ClusterRef, ConnectionStatus, Endpoint, Isolation, NetworkConfig, TunnelEndpoint,
};

use super::state::current_processed_status;
use super::{ClusterHandle, ConnectError};

/// One link of a cluster as `kubetun network status` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkStatus {
    pub peer: ClusterRef,
    /// The peer gateway's endpoint.
    pub endpoint: Option<Endpoint>,
    /// Our CIDRs and how the peer sees them (empty until the peer has processed them).
    pub local_cidrs: Vec<(CidrKind, CidrMapping)>,
    /// The peer's CIDRs and how we see them (empty until we have processed them).
    pub remote_cidrs: Vec<(CidrKind, CidrMapping)>,
    /// The tunnel's state, once a TunnelEndpoint exists.
    pub connection: Option<ConnectionStatus>,
    /// What the link waits for, when it has no TunnelEndpoint yet.
    pub pending: Option<String>,
    /// How this cluster's gateway admits the peer's packets (the TunnelEndpoint's), once a
    /// TunnelEndpoint exists.
    pub isolation: Option<Isolation>,
}

/// Whether a CIDR holds pods or external endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CidrKind {
    Pod,
    External,
}

impl fmt::Display for CidrKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pod => "pod",
            Self::External => "external",
        })
    }
}

fn tagged(pods: &[CidrMapping], externals: &[CidrMapping]) -> Vec<(CidrKind, CidrMapping)> {
    pods.iter()
        .map(|m| (CidrKind::Pod, m.clone()))
        .chain(externals.iter().map(|m| (CidrKind::External, m.clone())))
        .collect()
}

/// Every link of the cluster behind `handle`: one per TunnelEndpoint, plus one per peer
/// that has NetworkConfigs but no TunnelEndpoint yet. Sorted by peer id.
pub async fn link_statuses(handle: &ClusterHandle) -> Result<Vec<LinkStatus>, ConnectError> {
    let own_id = handle.load_info().await?.cluster.id;
    let tunnels = handle
        .tunnels()
        .list(&ListParams::default())
        .await
        .map_err(handle.api_error::<TunnelEndpoint>(&own_id, "list", "*"))?;
    let configs = handle
        .configs()
        .list(&ListParams::default())
        .await
        .map_err(handle.api_error::<NetworkConfig>(&own_id, "list", "*"))?;
    let mut links: BTreeMap<String, LinkStatus> = BTreeMap::new();
    for te in tunnels {
        let spec = te.spec;
        links.insert(
            spec.cluster.id.clone(),
            LinkStatus {
                peer: spec.cluster,
                endpoint: Some(spec.endpoint),
                local_cidrs: tagged(&spec.local_pod_cidrs, &spec.local_external_cidrs),
                remote_cidrs: tagged(&spec.remote_pod_cidrs, &spec.remote_external_cidrs),
                connection: te.status.and_then(|s| s.connection),
                pending: None,
                isolation: Some(spec.isolation),
            },
        );
    }
    for config in &configs {
        let Some((peer, is_ours)) = peer_of(config) else {
            continue;
        };
        let peer = peer.clone();
        if links.get(&peer.id).is_some_and(|l| l.pending.is_none()) {
            continue;
        }
        let link = links.entry(peer.id.clone()).or_insert_with(|| LinkStatus {
            peer: peer.clone(),
            endpoint: None,
            local_cidrs: Vec::new(),
            remote_cidrs: Vec::new(),
            connection: None,
            pending: Some(String::new()),
            isolation: None,
        });
        let processed = current_processed_status(config);
        if let Some(status) = &processed {
            let cidrs = tagged(&status.pod_cidrs, &status.external_cidrs);
            if is_ours {
                link.local_cidrs = cidrs;
            } else {
                link.remote_cidrs = cidrs;
                link.endpoint = Some(config.spec.endpoint.clone());
            }
        }
    }
    for link in links.values_mut() {
        if link.pending.is_some() {
            let has = |role: bool| {
                configs.iter().any(|c| {
                    peer_of(c)
                        .is_some_and(|(peer, is_ours)| is_ours == role && peer.id == link.peer.id)
                })
            };
            link.pending = Some(
                if !has(true) || !has(false) {
                    "half configured: run `kubetun network connect` again, or `reset`"
                } else if link.local_cidrs.is_empty() {
                    "waiting for the peer to process our NetworkConfig"
                } else if link.remote_cidrs.is_empty() {
                    "waiting for this cluster to process the peer's NetworkConfig"
                } else {
                    "waiting for the controller to create the TunnelEndpoint"
                }
                .to_owned(),
            );
        }
    }
    Ok(links.into_values().collect())
}

/// The peer a NetworkConfig concerns, and whether it is ours (`to-`) rather than the peer's.
fn peer_of(config: &NetworkConfig) -> Option<(&ClusterRef, bool)> {
    match config.labels().get(ROLE_LABEL).map(String::as_str) {
        Some(ROLE_LOCAL) => Some((&config.spec.destination_cluster, true)),
        Some(ROLE_REMOTE) => Some((&config.spec.source_cluster, false)),
        _ => None,
    }
}
