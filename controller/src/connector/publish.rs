//! Writing a link's NetworkConfigs: the connector's labels and owner annotations, the apply
//! that skips what is already as desired, and the peer's view mirrored into the status.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams};
use kubetun_crds::contract::link::{
    HUB_ANNOTATION, MANAGED_BY_CONNECTOR, MANAGED_BY_LABEL, PEER_LABEL, ROLE_LABEL,
    SHORTCUT_ANNOTATION,
};
use kubetun_crds::{NetworkConfig, NetworkConfigSpec, NetworkConfigStatus};

use super::{ClusterHandle, ConnectError, FIELD_MANAGER, LinkOwner, Progress};

/// The NetworkConfig object the connector writes: spec plus identifying labels.
pub fn network_config(
    name: &str,
    namespace: &str,
    role: &str,
    peer_id: &str,
    spec: &NetworkConfigSpec,
) -> NetworkConfig {
    NetworkConfig {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(connector_labels(role, peer_id)),
            ..ObjectMeta::default()
        },
        spec: spec.clone(),
        status: None,
    }
}

fn owner_annotations(owner: Option<&LinkOwner>) -> BTreeMap<String, String> {
    owner.map_or_else(BTreeMap::new, |owner| {
        BTreeMap::from([
            (SHORTCUT_ANNOTATION.to_owned(), owner.shortcut.clone()),
            (HUB_ANNOTATION.to_owned(), owner.hub.clone()),
        ])
    })
}

/// The hub's ShortcutConnection that manages the link of `handle` to `peer_id`, if any (read
/// from the annotations of the connector's NetworkConfigs).
pub async fn link_owner(
    handle: &ClusterHandle,
    cluster_id: &str,
    peer_id: &str,
) -> Result<Option<LinkOwner>, ConnectError> {
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_CONNECTOR},{PEER_LABEL}={peer_id}");
    let configs = handle
        .configs()
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(handle.api_error::<NetworkConfig>(
            cluster_id,
            "list",
            &format!("-l {selector}"),
        ))?;
    Ok(configs.items.iter().find_map(|nc| {
        let annotations = nc.annotations();
        Some(LinkOwner {
            shortcut: annotations.get(SHORTCUT_ANNOTATION)?.clone(),
            hub: annotations
                .get(HUB_ANNOTATION)
                .filter(|hub| !hub.is_empty())
                .cloned()
                .unwrap_or_else(|| "(unknown)".to_owned()),
        })
    }))
}

fn connector_labels(role: &str, peer_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_CONNECTOR.to_owned()),
        (ROLE_LABEL.to_owned(), role.to_owned()),
        (PEER_LABEL.to_owned(), peer_id.to_owned()),
    ])
}

/// Where one NetworkConfig goes and who it is about.
pub(super) struct ConfigTarget<'a> {
    pub(super) owner: Option<&'a LinkOwner>,
    pub(super) handle: &'a ClusterHandle,
    pub(super) cluster_id: &'a str,
    pub(super) name: String,
    pub(super) role: &'static str,
    pub(super) peer_id: &'a str,
}

/// Applies one NetworkConfig unless it already has the desired spec and labels. Returns the
/// number of writes (0 or 1).
pub(super) async fn apply_config(
    target: ConfigTarget<'_>,
    spec: &NetworkConfigSpec,
    progress: &dyn Progress,
    report_unchanged: bool,
) -> Result<usize, ConnectError> {
    let ConfigTarget {
        owner,
        handle,
        cluster_id,
        name,
        role,
        peer_id,
    } = target;
    let name = name.as_str();
    let api = handle.configs();
    let object = handle.object::<NetworkConfig>(name);
    let existing = api
        .get_opt(name)
        .await
        .map_err(handle.api_error::<NetworkConfig>(cluster_id, "get", name))?;
    let labels = connector_labels(role, peer_id);
    if let Some(existing) = &existing {
        if existing.labels().get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY_CONNECTOR)
        {
            return Err(ConnectError::NotManaged {
                cluster: handle.label.clone(),
                cluster_id: cluster_id.to_owned(),
                object,
            });
        }
        let labelled = labels
            .iter()
            .all(|(k, v)| existing.labels().get(k) == Some(v));
        let annotated = owner_annotations(owner)
            .iter()
            .all(|(k, v)| existing.annotations().get(k) == Some(v));
        if labelled && annotated && existing.spec == *spec {
            if report_unchanged {
                progress.done(&handle.label, &format!("{object} up to date"));
            }
            return Ok(0);
        }
    }
    let mut desired = network_config(name, &handle.namespace, role, peer_id, spec);
    if owner.is_some() {
        desired.metadata.annotations = Some(owner_annotations(owner));
    }
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&desired),
    )
    .await
    .map_err(handle.api_error::<NetworkConfig>(cluster_id, "apply", name))?;
    let verb = if existing.is_some() {
        "updated"
    } else {
        "created"
    };
    progress.done(&handle.label, &format!("{verb} {object}"));
    Ok(1)
}

/// Copies the peer's processing of our NetworkConfig onto our `to-` NetworkConfig's status.
pub(super) async fn mirror_status(
    handle: &ClusterHandle,
    cluster_id: &str,
    name: &str,
    processed: &NetworkConfigStatus,
    progress: &dyn Progress,
) -> Result<usize, ConnectError> {
    let api = handle.configs();
    let Some(own) = api
        .get_opt(name)
        .await
        .map_err(handle.api_error::<NetworkConfig>(cluster_id, "get", name))?
    else {
        return Ok(0);
    };
    let desired = NetworkConfigStatus {
        observed_generation: own.metadata.generation,
        ..processed.clone()
    };
    if own.status.as_ref() == Some(&desired) {
        return Ok(0);
    }
    let patch = serde_json::json!({ "status": desired });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(handle.api_error::<NetworkConfig>(cluster_id, "update the status of", name))?;
    let object = handle.object::<NetworkConfig>(name);
    progress.done(
        &handle.label,
        &format!("mirrored the peer's view into the status of {object}"),
    );
    Ok(1)
}
