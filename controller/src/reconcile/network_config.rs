//! The NetworkConfig reconciler.
//!
//! - `remote` role (`from-<peer>`, written by the peer's connector): validated, mapped by the
//!   IPAM, the views written into its status; a finalizer releases the views and removes the
//!   TunnelEndpoint when it goes away.
//! - `local` role (`to-<peer>`, our own announcement, its status mirrored back from the
//!   peer): nothing to process, but a change may complete the pair a TunnelEndpoint needs.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, Event};
use kubetun_crds::{NetworkConfig, NetworkConfigStatus};

use crate::conditions::{self, reason};
use crate::context::Context;
use crate::error::Error;
use crate::planner::{self, PEER_LABEL, PlanError, ROLE_LABEL, ROLE_LOCAL, ROLE_REMOTE};
use crate::reconcile::{FINALIZER, apply_status, tunnel_endpoint};

/// How often a healthy NetworkConfig is reconciled anyway.
const RESYNC: Duration = Duration::from_secs(300);
/// How soon an exhausted pool is retried (another peer may have been released).
const EXHAUSTED_RETRY: Duration = Duration::from_secs(60);

/// Which side of a peering a NetworkConfig describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role<'a> {
    /// Ours, sent to the peer.
    Local {
        /// The peer's cluster id.
        peer: &'a str,
    },
    /// The peer's, sent to us.
    Remote {
        /// The peer's cluster id.
        peer: &'a str,
    },
}

/// The role and peer of a NetworkConfig from its labels; `None` if it is not kubetun's.
pub fn role_of(nc: &NetworkConfig) -> Option<Role<'_>> {
    let labels = nc.metadata.labels.as_ref()?;
    let peer = labels.get(PEER_LABEL)?.as_str();
    match labels.get(ROLE_LABEL)?.as_str() {
        ROLE_LOCAL => Some(Role::Local { peer }),
        ROLE_REMOTE => Some(Role::Remote { peer }),
        _ => None,
    }
}

/// Reconciles one NetworkConfig.
pub async fn reconcile(nc: Arc<NetworkConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciled("networkconfig");
    match role_of(&nc) {
        Some(Role::Remote { .. }) => {
            let api: Api<NetworkConfig> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
            let nc = with_finalizer(&api, nc).await?;
            finalizer::finalizer(&api, FINALIZER, nc, |event| async {
                match event {
                    Event::Apply(nc) => apply_remote(&nc, &ctx).await,
                    Event::Cleanup(nc) => cleanup_remote(&nc, &ctx).await,
                }
            })
            .await
            .map_err(Error::from)
        }
        Some(Role::Local { peer }) => {
            tunnel_endpoint::ensure(&ctx, peer, &nc).await?;
            Ok(Action::requeue(RESYNC))
        }
        None => {
            tracing::debug!(networkconfig = %nc.name_any(), "no {ROLE_LABEL}/{PEER_LABEL} labels; ignored");
            Ok(Action::await_change())
        }
    }
}

/// Adds [`FINALIZER`] unless present (or the object is going away), guarded by the
/// resourceVersion so a concurrent writer makes this fail and retry instead of losing a
/// finalizer. `finalizer()` adds it itself with a JSON patch whose `test` of an absent list
/// only real API servers accept; a merge patch works everywhere.
async fn with_finalizer(
    api: &Api<NetworkConfig>,
    nc: Arc<NetworkConfig>,
) -> Result<Arc<NetworkConfig>, Error> {
    if nc.metadata.deletion_timestamp.is_some() || nc.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(nc);
    }
    let mut finalizers = nc.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    let patch = serde_json::json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": nc.resource_version() }
    });
    let updated = api
        .patch(
            &nc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(Arc::new(updated))
}

/// Maps the peer's CIDRs and records the views (or why not) in the status.
async fn apply_remote(nc: &NetworkConfig, ctx: &Context) -> Result<Action, Error> {
    let name = nc.name_any();
    let peer = role_of(nc).map(|role| match role {
        Role::Local { peer } | Role::Remote { peer } => peer,
    });
    let outcome = planner::check_addressing(&name, &nc.spec, &ctx.cluster.cluster.id, peer)
        .and_then(|()| planner::process_network_config(&mut ctx.ipam(), &nc.spec));

    let generation = nc.metadata.generation;
    let mut status = nc.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    let action = match &outcome {
        Ok(view) => {
            let remapped = view
                .pod_cidrs
                .iter()
                .chain(&view.external_cidrs)
                .filter(|m| m.is_remapped())
                .count();
            let total = view.pod_cidrs.len() + view.external_cidrs.len();
            status.processed = true;
            status.pod_cidrs.clone_from(&view.pod_cidrs);
            status.external_cidrs.clone_from(&view.external_cidrs);
            let message = format!("{total} CIDRs mapped, {remapped} remapped to avoid overlaps");
            conditions::set(
                &mut status.conditions,
                conditions::PROCESSED,
                true,
                reason::PROCESSED,
                &message,
                generation,
                ctx.now(),
            );
            Action::requeue(RESYNC)
        }
        Err(error) => {
            tracing::info!(networkconfig = %name, %error, "cannot process NetworkConfig");
            // The peer's own NetworkConfig became unusable: its views go, as the status
            // says. A NetworkConfig that only claims to be the peer's must not touch them.
            if !matches!(
                error,
                PlanError::Misnamed { .. } | PlanError::InvalidSource { .. }
            ) {
                ctx.ipam().release(&nc.spec.source_cluster.id);
            }
            status.processed = false;
            status.pod_cidrs.clear();
            status.external_cidrs.clear();
            conditions::set(
                &mut status.conditions,
                conditions::PROCESSED,
                false,
                error.reason(),
                &error.to_string(),
                generation,
                ctx.now(),
            );
            if matches!(
                error,
                PlanError::Ipam(crate::ipam::IpamError::PoolExhausted { .. })
            ) {
                Action::requeue(EXHAUSTED_RETRY)
            } else {
                Action::await_change()
            }
        }
    };
    let written;
    let nc = if nc.status.as_ref() == Some(&status) {
        nc
    } else {
        written = write_status(ctx, &name, &status).await?;
        &written
    };
    if let Some(peer) = peer {
        tunnel_endpoint::ensure(ctx, peer, nc).await?;
    }
    Ok(action)
}

/// Releases the peer's views and removes its TunnelEndpoint; the gateway drops the peer at
/// the next push.
async fn cleanup_remote(nc: &NetworkConfig, ctx: &Context) -> Result<Action, Error> {
    let peer = nc.spec.source_cluster.id.as_str();
    // A misnamed NetworkConfig never held views; it must not release the real peer's.
    if nc.name_any() == planner::remote_config_name(peer) {
        ctx.ipam().release(peer);
        tunnel_endpoint::remove(ctx, peer).await?;
        tracing::info!(networkconfig = %nc.name_any(), peer, "peer removed, views released");
    }
    Ok(Action::await_change())
}

/// Writes `status`; returns the NetworkConfig as written.
async fn write_status(
    ctx: &Context,
    name: &str,
    status: &NetworkConfigStatus,
) -> Result<NetworkConfig, Error> {
    let api: Api<NetworkConfig> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    apply_status(&api, name, status).await
}
