//! TunnelEndpoints' specs: created, updated and deleted from the `to-`/`from-` NetworkConfig
//! pair of a peer (the NetworkConfig reconcile's half; the status half is the gateway sync's,
//! [`super::gateway::status`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::Resource as _;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, Preconditions};
use kubetun_crds::contract::link::{PEER_LABEL, reason};
use kubetun_crds::{NetworkConfig, TunnelEndpoint};

use crate::operator::network_config::context::Context;
use crate::operator::network_config::error::Error;
use crate::planner;
use crate::plumbing::cluster_info::FIELD_MANAGER;

/// Creates or updates the TunnelEndpoint of `peer` when both NetworkConfigs exist and are
/// processed for their current spec; removes it otherwise. `fresh` is one of the two as the
/// caller has just read or written it: the cache may not show the caller's own write yet, and
/// removing the TunnelEndpoint for a status it no longer has would flap the peer.
pub async fn ensure(ctx: &Context, peer: &str, fresh: &NetworkConfig) -> Result<(), Error> {
    let config = |name: String| async move {
        if fresh.metadata.name.as_deref() == Some(name.as_str()) {
            return Ok(Some(Arc::new(fresh.clone())));
        }
        ctx.cache.network_config(&name).await
    };
    let local = config(planner::local_config_name(peer)).await?;
    let remote = config(planner::remote_config_name(peer)).await?;
    let alive = |nc: &Arc<NetworkConfig>| nc.metadata.deletion_timestamp.is_none();
    let (Some(local), Some(remote)) = (local.filter(alive), remote.filter(alive)) else {
        return remove_unless_absent(ctx, peer).await;
    };
    // The isolation is ours to set: our `to-` NetworkConfig's, else the cluster default.
    let default_isolation = ctx.gateway_settings().isolation;
    let mut spec = match planner::tunnel_endpoint_spec_with(&local, &remote, default_isolation) {
        Ok(spec) => spec,
        Err(error) => {
            tracing::debug!(peer, %error, "TunnelEndpoint not ready");
            return remove_unless_absent(ctx, peer).await;
        }
    };
    spec.allowed_prefixes = allowed_prefixes(ctx, peer).await?;
    let owner = remote
        .controller_owner_ref(&())
        .ok_or(Error::MissingField {
            kind: "NetworkConfig",
            field: "metadata.uid",
        })?;

    // A stale cache costs at most an apply that changes nothing, and the TunnelEndpoint's
    // own watch event brings its owner back here.
    if let Some(existing) = ctx.cache.tunnel_endpoint(peer).await?
        && existing.spec == spec
        && existing.owner_references().contains(&owner)
    {
        return Ok(());
    }
    let endpoint = TunnelEndpoint {
        metadata: ObjectMeta {
            name: Some(peer.to_owned()),
            namespace: Some(ctx.namespace.clone()),
            labels: Some(BTreeMap::from([(PEER_LABEL.to_owned(), peer.to_owned())])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    };
    let endpoints: Api<TunnelEndpoint> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    endpoints
        .patch(
            peer,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&endpoint),
        )
        .await?;
    tracing::info!(peer, "TunnelEndpoint applied");
    ctx.wake_gateway_sync();
    Ok(())
}

/// [`remove`], skipped when the cache holds no TunnelEndpoint of `peer`: every reconcile of a
/// remote that is not ready yet deleted one that never existed. One applied but not cached yet
/// is not missed: its watch event reconciles its owner (the remote NetworkConfig) again.
async fn remove_unless_absent(ctx: &Context, peer: &str) -> Result<(), Error> {
    if ctx.cache.lacks_tunnel_endpoint(peer) {
        return Ok(());
    }
    remove(ctx, peer).await
}

/// Deletes the TunnelEndpoint of `peer` if it exists.
pub async fn remove(ctx: &Context, peer: &str) -> Result<(), Error> {
    let endpoints: Api<TunnelEndpoint> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    match endpoints.delete(peer, &DeleteParams::default()).await {
        Ok(_) => {
            tracing::info!(peer, "TunnelEndpoint deleted");
            ctx.wake_gateway_sync();
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether `endpoint` is one [`ensure`] made: a NetworkConfig is its controller. Every
/// TunnelEndpoint [`ensure`] writes carries that owner from its first moment.
pub fn is_managed(endpoint: &TunnelEndpoint) -> bool {
    endpoint.owner_references().iter().any(|owner| {
        owner.controller == Some(true)
            && owner.kind == NetworkConfig::kind(&())
            && owner.api_version == NetworkConfig::api_version(&())
    })
}

/// Why a TunnelEndpoint made by hand is removed, and what to do instead (Event note).
pub fn stray_message(peer: &str) -> String {
    format!(
        "TunnelEndpoint {peer} was not made by the controller (no NetworkConfig owns it), so it \
         was removed: the controller builds each peer's TunnelEndpoint from the NetworkConfig \
         pair {local} (this cluster's announcement) and {remote} (the peer's, processed here), \
         and the gateway runs only those. Link the clusters with `kubetun network connect`, or \
         create both NetworkConfigs, instead",
        local = planner::local_config_name(peer),
        remote = planner::remote_config_name(peer),
    )
}

/// Removes a TunnelEndpoint no NetworkConfig owns (created by hand, or with its owner
/// reference stripped) with a Warning Event saying why, then rebuilds the peer's own if its
/// NetworkConfigs call for one. Does nothing to a managed one or one that changed since
/// `endpoint` was read (the delete carries its UID and resourceVersion).
pub async fn remove_stray(ctx: &Context, endpoint: &TunnelEndpoint) -> Result<(), Error> {
    if is_managed(endpoint) || endpoint.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let peer = endpoint.name_any();
    let endpoints: Api<TunnelEndpoint> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: endpoint.metadata.uid.clone(),
            resource_version: endpoint.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    // The Event first: it must name the object while it exists.
    let message = stray_message(&peer);
    crate::plumbing::events::warn(
        &ctx.client,
        &endpoint.object_ref(&()),
        reason::NOT_MANAGED,
        "Remove",
        &message,
    )
    .await;
    match endpoints.delete(&peer, &params).await {
        Ok(_) => {
            tracing::info!(
                peer,
                "removed a TunnelEndpoint no NetworkConfig owns (made by hand)"
            );
            ctx.wake_gateway_sync();
        }
        // Gone, or changed meanwhile (e.g. taken over by `ensure`): its next event decides.
        Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => {
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    // A peer whose pair is complete gets its own back at once rather than at the next resync.
    if let Some(remote) = ctx
        .cache
        .network_config(&planner::remote_config_name(&peer))
        .await?
    {
        ensure(ctx, &peer, &remote).await?;
    }
    Ok(())
}

/// The remote prefixes Network peerings allow from `peer` (see
/// [`crate::operator::isolation::acl_for_cluster`]); `None` when no Network mentions it or the Network
/// API is not installed.
async fn allowed_prefixes(ctx: &Context, peer: &str) -> Result<Option<Vec<String>>, Error> {
    let Some(networks) = ctx.cache.networks().await? else {
        return Ok(None);
    };
    Ok(crate::operator::isolation::acl_for_cluster(&networks, peer)
        .map(|prefixes| prefixes.iter().map(ToString::to_string).collect()))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use kubetun_crds::{ClusterRef, Endpoint, TunnelEndpointSpec};

    fn endpoint() -> TunnelEndpoint {
        let mut te = endpoint_named("rome");
        te.metadata.generation = Some(3);
        te
    }

    /// A TunnelEndpoint for peer `name` with empty CIDR lists (shared with the cache tests).
    pub(in crate::operator::network_config) fn endpoint_named(name: &str) -> TunnelEndpoint {
        TunnelEndpoint::new(
            name,
            TunnelEndpointSpec {
                cluster: ClusterRef {
                    id: name.into(),
                    name: String::new(),
                },
                local_pod_cidrs: vec![],
                local_external_cidrs: vec![],
                remote_pod_cidrs: vec![],
                remote_external_cidrs: vec![],
                endpoint: Endpoint {
                    address: "192.0.2.2".into(),
                    port: 51820,
                },
                public_key: "KEY".into(),
                mtu: None,
                allowed_prefixes: None,
                ..Default::default()
            },
        )
    }

    #[test]
    fn only_an_endpoint_a_network_config_controls_is_managed() {
        let mut te = endpoint();
        assert!(!is_managed(&te), "made by hand");
        let mut remote = NetworkConfig::new("from-rome", Default::default());
        remote.metadata.uid = Some("uid-1".into());
        let mut owner = remote.controller_owner_ref(&()).expect("named, with a uid");
        te.metadata.owner_references = Some(vec![owner.clone()]);
        assert!(is_managed(&te));
        owner.controller = None;
        te.metadata.owner_references = Some(vec![owner.clone()]);
        assert!(!is_managed(&te), "an owner, not the controller");
        owner.controller = Some(true);
        owner.kind = "ConfigMap".into();
        te.metadata.owner_references = Some(vec![owner]);
        assert!(!is_managed(&te), "another kind");
        let message = stray_message("rome");
        assert!(
            message.contains("to-rome") && message.contains("from-rome"),
            "{message}"
        );
    }
}
