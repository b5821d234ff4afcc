//! The NetworkConfig reconciler.
//!
//! - `remote` role (`from-<peer>`, written by the peer's connector): validated, mapped by the
//!   IPAM, the views written into its status; a finalizer releases the views and removes the
//!   TunnelEndpoint when it goes away.
//! - `local` role (`to-<peer>`, our own announcement, its status mirrored back from the
//!   peer): nothing to process, but a change may complete the pair a TunnelEndpoint needs.
//! - neither (labels missing, an unknown role) or a `local` one not named `to-<peer>`: not
//!   acted on, and it says so: condition `Processed=False` (`MissingLabels`, `InvalidName`)
//!   naming the labels and name it needs, derived from its name or spec, and a Warning Event.
//!   Every rejection of a remote one gets the same Event next to its condition.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, Event};
use kube::{Resource as _, ResourceExt as _};
use kubetun_crds::contract::link::{
    FINALIZER, PEER_LABEL, ROLE_LABEL, ROLE_LOCAL, ROLE_REMOTE, reason,
};
use kubetun_crds::{NetworkConfig, NetworkConfigStatus};

use crate::operator::network_config::context::Context;
use crate::operator::network_config::error::Error;
use crate::operator::network_config::status_patch::apply_status;
use crate::operator::network_config::tunnel_endpoint;
use crate::planner::{self, PlanError};
use crate::plumbing::conditions;
use crate::plumbing::events;

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
        Some(Role::Local { peer }) if nc.name_any() != planner::local_config_name(peer) => {
            let message = format!(
                "not used: a NetworkConfig labelled {ROLE_LABEL}={ROLE_LOCAL} and {PEER_LABEL}={peer} \
                 is this cluster's announcement to {peer} and must be named {expected}, not {name:?}: \
                 create it as {expected} and delete this one (a name cannot change)",
                expected = planner::local_config_name(peer),
                name = nc.name_any(),
            );
            report_unprocessed(&nc, &ctx, reason::INVALID_NAME, &message).await?;
            Ok(Action::await_change())
        }
        Some(Role::Local { peer }) => {
            tunnel_endpoint::ensure(&ctx, peer, &nc).await?;
            Ok(Action::requeue(RESYNC))
        }
        None if nc.metadata.deletion_timestamp.is_some() => {
            // Once a remote one (it carries our finalizer) whose labels went: release what it
            // held as for any remote one, or it could never go.
            if nc.finalizers().iter().any(|f| f == FINALIZER) {
                let api: Api<NetworkConfig> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
                finalizer::finalizer(&api, FINALIZER, nc, |event| async {
                    match event {
                        Event::Apply(_) => Ok(Action::await_change()),
                        Event::Cleanup(nc) => cleanup_remote(&nc, &ctx).await,
                    }
                })
                .await
                .map_err(Error::from)
            } else {
                Ok(Action::await_change())
            }
        }
        None => {
            let message = unlabelled_message(&nc, &ctx.cluster.cluster.id, &ctx.namespace);
            tracing::info!(networkconfig = %nc.name_any(), "not processed: {message}");
            report_unprocessed(&nc, &ctx, reason::MISSING_LABELS, &message).await?;
            // A label or name change is a watch event: it comes back then.
            Ok(Action::await_change())
        }
    }
}

/// What a NetworkConfig without usable role/peer labels should be, from its name
/// (`from-<peer>`, `to-<peer>`) or else its spec (addressed to or sent by this cluster).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suggestion {
    /// [`ROLE_REMOTE`] or [`ROLE_LOCAL`].
    pub role: &'static str,
    /// The peer's cluster id.
    pub peer: String,
    /// The name it must have.
    pub name: String,
    /// Where this was read from, for the message.
    pub because: String,
}

/// See [`Suggestion`]; `None` when neither name nor spec tie it to `local_cluster_id`.
pub fn suggest(nc: &NetworkConfig, local_cluster_id: &str) -> Option<Suggestion> {
    let name = nc.name_any();
    let remote = |peer: &str, because: String| Suggestion {
        role: ROLE_REMOTE,
        peer: peer.to_owned(),
        name: planner::remote_config_name(peer),
        because,
    };
    let local = |peer: &str, because: String| Suggestion {
        role: ROLE_LOCAL,
        peer: peer.to_owned(),
        name: planner::local_config_name(peer),
        because,
    };
    if let Some(peer) = name.strip_prefix("from-").filter(|p| !p.is_empty()) {
        return Some(remote(peer, format!("its name says {peer} sent it")));
    }
    if let Some(peer) = name.strip_prefix("to-").filter(|p| !p.is_empty()) {
        return Some(local(
            peer,
            format!("its name says it is this cluster's announcement to {peer}"),
        ));
    }
    let source = nc.spec.source_cluster.id.as_str();
    let destination = nc.spec.destination_cluster.id.as_str();
    if destination == local_cluster_id && !source.is_empty() && source != local_cluster_id {
        return Some(remote(
            source,
            format!("its spec says {source} sent it to {destination} (this cluster)"),
        ));
    }
    if source == local_cluster_id && !destination.is_empty() && destination != local_cluster_id {
        return Some(local(
            destination,
            format!("its spec says this cluster ({source}) announces itself to {destination}"),
        ));
    }
    None
}

/// The condition message of a NetworkConfig [`role_of`] does not recognise: which labels are
/// missing or wrong, and what its labels (and name) should be.
pub fn unlabelled_message(nc: &NetworkConfig, local_cluster_id: &str, namespace: &str) -> String {
    let labels = nc.labels();
    let role = labels.get(ROLE_LABEL).map(String::as_str);
    let bad_role = role.filter(|r| *r != ROLE_REMOTE && *r != ROLE_LOCAL);
    let problem = match (role, labels.get(PEER_LABEL)) {
        (None, None) => format!("it has neither label {ROLE_LABEL} nor {PEER_LABEL}"),
        (None, Some(_)) => format!("it has no label {ROLE_LABEL}"),
        (Some(_), None) if bad_role.is_none() => format!("it has no label {PEER_LABEL}"),
        (Some(r), None) => format!(
            "it has no label {PEER_LABEL}, and label {ROLE_LABEL} is {r:?}, which is neither \
             {ROLE_REMOTE:?} nor {ROLE_LOCAL:?}"
        ),
        (Some(r), Some(_)) => format!(
            "label {ROLE_LABEL} is {r:?}, which is neither {ROLE_REMOTE:?} nor {ROLE_LOCAL:?}"
        ),
    };
    let rule = format!(
        "kubetun acts only on NetworkConfigs labelled {ROLE_LABEL}={ROLE_REMOTE} (a peer's, named \
         from-<peer>) or {ROLE_LABEL}={ROLE_LOCAL} (this cluster's own, named to-<peer>), and \
         {PEER_LABEL}=<the peer's cluster id>"
    );
    let name = nc.name_any();
    let fix = match suggest(nc, local_cluster_id) {
        Some(s) if s.name == name => format!(
            "{because}: label it with `kubectl -n {namespace} label networkconfig {name} \
             {ROLE_LABEL}={role} {PEER_LABEL}={peer} --overwrite`",
            because = s.because,
            role = s.role,
            peer = s.peer,
        ),
        Some(s) => format!(
            "{because}: create it as {expected} with labels {ROLE_LABEL}={role} and \
             {PEER_LABEL}={peer}, then delete {name:?} (a name cannot change)",
            because = s.because,
            expected = s.name,
            role = s.role,
            peer = s.peer,
        ),
        None => format!(
            "neither its name (from-<peer>, to-<peer>) nor its spec (sourceCluster.id \
             {source:?}, destinationCluster.id {destination:?}) names this cluster \
             ({local_cluster_id}): is it in the right cluster?",
            source = nc.spec.source_cluster.id,
            destination = nc.spec.destination_cluster.id,
        ),
    };
    format!(
        "not processed: {problem}, and {rule}. {fix}; `kubetun network connect` writes both \
         NetworkConfigs of a link so",
        fix = capitalized(&fix),
    )
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

/// Records that `nc` is not acted on: `Processed=False` with `reason` and `message` (no
/// views), and a Warning Event when that is news.
async fn report_unprocessed(
    nc: &NetworkConfig,
    ctx: &Context,
    why: &str,
    message: &str,
) -> Result<(), Error> {
    let generation = nc.metadata.generation;
    let mut status = nc.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    mark_unprocessed(&mut status, why, message, generation, ctx.now());
    if nc.status.as_ref() != Some(&status) {
        write_status(ctx, &nc.name_any(), &status).await?;
    }
    announce_rejection(nc, ctx, why, message).await;
    Ok(())
}

/// `Processed=False` with `why` and `message`, and no views.
fn mark_unprocessed(
    status: &mut NetworkConfigStatus,
    why: &str,
    message: &str,
    generation: Option<i64>,
    now: Time,
) {
    status.processed = false;
    status.pod_cidrs.clear();
    status.external_cidrs.clear();
    conditions::set(
        &mut status.conditions,
        kubetun_crds::contract::link::PROCESSED,
        false,
        why,
        message,
        generation,
        now,
    );
}

/// A Warning Event when `nc`'s status did not say `Processed=False` with this reason and
/// message yet.
async fn announce_rejection(nc: &NetworkConfig, ctx: &Context, why: &str, message: &str) {
    let known = nc
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, kubetun_crds::contract::link::PROCESSED))
        .is_some_and(|c| c.status == "False" && c.reason == why && c.message == message);
    if !known {
        events::warn(&ctx.client, &nc.object_ref(&()), why, "Process", message).await;
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
                kubetun_crds::contract::link::PROCESSED,
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
            mark_unprocessed(
                &mut status,
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
    let before = nc;
    let nc = if nc.status.as_ref() == Some(&status) {
        nc
    } else {
        written = write_status(ctx, &name, &status).await?;
        &written
    };
    if let Err(error) = &outcome {
        announce_rejection(before, ctx, error.reason(), &error.to_string()).await;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use kubetun_crds::{ClusterRef, NetworkConfigSpec};

    fn config(
        name: &str,
        labels: &[(&str, &str)],
        source: &str,
        destination: &str,
    ) -> NetworkConfig {
        let mut nc = NetworkConfig::new(
            name,
            NetworkConfigSpec {
                source_cluster: ClusterRef {
                    id: source.into(),
                    name: String::new(),
                },
                destination_cluster: ClusterRef {
                    id: destination.into(),
                    name: String::new(),
                },
                ..NetworkConfigSpec::default()
            },
        );
        if !labels.is_empty() {
            nc.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            );
        }
        nc
    }

    #[test]
    fn the_unlabelled_example_is_told_its_name_and_labels_from_its_spec() {
        let nc = config("rome", &[], "rome", "europe");
        assert_eq!(role_of(&nc), None);
        let suggestion = suggest(&nc, "europe").expect("addressed to us");
        assert_eq!(
            (
                suggestion.role,
                suggestion.peer.as_str(),
                suggestion.name.as_str()
            ),
            (ROLE_REMOTE, "rome", "from-rome")
        );
        let message = unlabelled_message(&nc, "europe", "kubetun-system");
        for part in [
            "neither label net.kubetun.io/role nor net.kubetun.io/peer",
            "Its spec says rome sent it to europe (this cluster)",
            "create it as from-rome with labels net.kubetun.io/role=remote and \
             net.kubetun.io/peer=rome, then delete \"rome\"",
        ] {
            assert!(message.contains(part), "{part:?} in {message}");
        }
    }

    #[test]
    fn a_well_named_config_is_told_the_labels_to_add() {
        let nc = config("from-rome", &[(PEER_LABEL, "rome")], "rome", "europe");
        let message = unlabelled_message(&nc, "europe", "kubetun-system");
        assert!(
            message.contains("it has no label net.kubetun.io/role,"),
            "{message}"
        );
        assert!(
            message.contains(
                "kubectl -n kubetun-system label networkconfig from-rome \
                 net.kubetun.io/role=remote net.kubetun.io/peer=rome --overwrite"
            ),
            "{message}"
        );
        // Our own announcement, by its name or by its spec.
        let ours = config("to-milan", &[], "europe", "milan");
        assert_eq!(suggest(&ours, "europe").map(|s| s.role), Some(ROLE_LOCAL));
        let ours = config("milan", &[], "europe", "milan");
        assert_eq!(
            suggest(&ours, "europe").map(|s| s.name),
            Some("to-milan".to_owned())
        );
    }

    #[test]
    fn an_unknown_role_and_a_stranger_are_named_as_such() {
        let nc = config(
            "paris",
            &[(ROLE_LABEL, "peer"), (PEER_LABEL, "paris")],
            "paris",
            "milan",
        );
        assert_eq!(suggest(&nc, "europe"), None);
        let message = unlabelled_message(&nc, "europe", "kubetun-system");
        assert!(
            message.contains("label net.kubetun.io/role is \"peer\", which is neither"),
            "{message}"
        );
        assert!(message.contains("is it in the right cluster?"), "{message}");
    }
}
