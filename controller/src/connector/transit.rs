//! Transit through a hub: what a ShortcutConnection that allows it needs from the hub's own
//! links to the two leaves. The hub's `from-<leaf>` NetworkConfigs say how the hub sees each
//! leaf (its views: the addresses on the wire between the other leaf and the hub); a transit
//! grant on them ([`transit_annotation`]) makes the hub's gateway accept those views as
//! sources of what it forwards, and [`release`] withdraws it.

use std::collections::BTreeMap;

use kube::ResourceExt as _;
use kube::api::{ListParams, Patch, PatchParams};
use kubetun_crds::{CidrMapping, ClusterRef, FallbackPath, NetworkConfig, NetworkConfigStatus};

use super::state::current_processed_status;
use super::{ClusterHandle, ConnectError};
use crate::planner::{remote_config_name, transit_annotation};

/// How `hub` sees a leaf it processed with `at_hub`: what the other leaf of a transit
/// shortcut gets as its fallback to that leaf (the hub's views, in announced order).
pub fn path_through(hub: &ClusterRef, at_hub: &NetworkConfigStatus) -> FallbackPath {
    let views = |mappings: &[CidrMapping]| mappings.iter().map(|m| m.view.clone()).collect();
    FallbackPath {
        hub: hub.clone(),
        pod_cidrs: views(&at_hub.pod_cidrs),
        external_cidrs: views(&at_hub.external_cidrs),
    }
}

/// The fallbacks through `hub` to leaves `local_id` and `remote_id` (the path to the local
/// leaf, which its own NetworkConfig carries to the remote one, and the path to the remote
/// leaf); puts transit grant `grant` on the hub's NetworkConfigs of both leaves. Fails when a
/// leaf is not linked to the hub (or the hub has not processed it yet).
pub async fn fallback_via(
    hub: &ClusterHandle,
    grant: &str,
    local_id: &str,
    remote_id: &str,
) -> Result<(FallbackPath, FallbackPath), ConnectError> {
    let info = hub.load_info().await?;
    let annotation = transit_annotation(grant);
    let mut paths = Vec::with_capacity(2);
    for leaf in [local_id, remote_id] {
        let name = remote_config_name(leaf);
        let config = hub
            .configs()
            .get_opt(&name)
            .await
            .map_err(hub.api_error::<NetworkConfig>(&info.cluster.id, "get", &name))?;
        let status = config
            .as_ref()
            .and_then(current_processed_status)
            .ok_or_else(|| ConnectError::TransitUnlinked {
                leaf: leaf.to_owned(),
                name: name.clone(),
                namespace: hub.namespace.clone(),
            })?;
        let granted = config
            .as_ref()
            .and_then(|c| c.annotations().get(&annotation))
            .is_some_and(|v| v == "true");
        if !granted {
            let patch = serde_json::json!({
                "metadata": { "annotations": BTreeMap::from([(&annotation, "true")]) }
            });
            hub.configs()
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(hub.api_error::<NetworkConfig>(&info.cluster.id, "annotate", &name))?;
            tracing::info!(leaf, "the hub forwards this leaf's traffic (transit)");
        }
        paths.push(path_through(&info.cluster, &status));
    }
    let remote = paths.pop().unwrap_or_default();
    let local = paths.pop().unwrap_or_default();
    Ok((local, remote))
}

/// Withdraws transit grant `grant` from every NetworkConfig of `hub` that carries it (the
/// ShortcutConnection went or no longer allows transit). Returns how many it changed.
pub async fn release(hub: &ClusterHandle, grant: &str) -> Result<usize, ConnectError> {
    let annotation = transit_annotation(grant);
    let configs = hub
        .configs()
        .list(&ListParams::default())
        .await
        .map_err(hub.api_error::<NetworkConfig>(&hub.label, "list", "(all)"))?;
    let mut released = 0;
    for config in configs
        .items
        .iter()
        .filter(|c| c.annotations().contains_key(&annotation))
    {
        let name = config.name_any();
        // A merge patch with null removes just this key: other grants stay.
        let patch = serde_json::json!({
            "metadata": { "annotations": { &annotation: null } }
        });
        hub.configs()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(hub.api_error::<NetworkConfig>(&hub.label, "annotate", &name))?;
        tracing::info!(config = %name, "transit grant withdrawn");
        released += 1;
    }
    Ok(released)
}
