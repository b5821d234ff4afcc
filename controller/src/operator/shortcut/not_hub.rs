//! ShortcutConnections in a cluster whose controller is not the hub: only a hub's operator
//! links leaves, so here each one gets `Ready=False` (reason `NotHub`) saying where it
//! belongs, and a Warning Event. No finalizer is added: nothing here would remove it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Resource as _, ResourceExt as _};
use kubetun_crds::contract::shortcut::{READY, reason};
use kubetun_crds::{ShortcutConnection, ShortcutPhase};

use super::objects::key_of;
use super::reconcile::KIND;
use super::status::write_status;
use super::{Intervals, ShortcutError};
use crate::plumbing::conditions;
use crate::plumbing::events;
use crate::plumbing::runtime::{self, ApiHealth, ErrorBackoff};

/// Longest retry after a failed status write (the message changes with nothing else).
const NOT_HUB_RETRY_MAX: Duration = Duration::from_secs(60);

/// What [`explain`] needs besides [`runtime::Context`]'s parts.
#[derive(Debug)]
pub struct NotHub {
    /// This cluster's id, named in the message.
    pub cluster_id: String,
}

/// What [`explain`] needs.
pub type NotHubContext = runtime::Context<NotHub>;

impl NotHubContext {
    /// The context of cluster `cluster_id`'s controller.
    pub fn new(client: kube::Client, cluster_id: impl Into<String>, health: ApiHealth) -> Self {
        let state = NotHub {
            cluster_id: cluster_id.into(),
        };
        let backoff = ErrorBackoff::new(Intervals::default().backoff_base, NOT_HUB_RETRY_MAX);
        Self::with_state(KIND, client, health, state).with_backoff(backoff)
    }
}

/// The condition message of a ShortcutConnection in cluster `cluster_id`, which is no hub.
pub fn not_hub_message(cluster_id: &str) -> String {
    format!(
        "not linked: the controller of this cluster ({cluster_id}) is not a hub, and only a \
         hub's controller (KUBETUN_HUB: \"true\", --hub) acts on ShortcutConnections. Create it \
         in the hub cluster both leaves are linked to (`kubetun shortcut create` with the hub's \
         kubeconfig) and delete it here; or, if this cluster is that hub, set KUBETUN_HUB: \
         \"true\" in its config.yaml and restart the controller"
    )
}

/// Marks `shortcut` as not acted on here (unchanged statuses are not written again).
pub async fn explain(
    shortcut: Arc<ShortcutConnection>,
    ctx: Arc<NotHubContext>,
) -> Result<Action, ShortcutError> {
    if shortcut.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = shortcut
        .namespace()
        .ok_or_else(|| ShortcutError::NoNamespace(shortcut.name_any()))?;
    let api: Api<ShortcutConnection> = Api::namespaced(ctx.client.clone(), &namespace);
    let message = not_hub_message(&ctx.cluster_id);
    let generation = shortcut.metadata.generation;
    let mut status = shortcut.status.clone().unwrap_or_default();
    let known = conditions::find(&status.conditions, READY).is_some_and(|c| {
        c.status == "False" && c.reason == reason::NOT_HUB && c.message == message
    });
    status.phase = ShortcutPhase::Error;
    status.observed_generation = generation;
    conditions::set(
        &mut status.conditions,
        READY,
        false,
        reason::NOT_HUB,
        &message,
        generation,
        ctx.now(),
    );
    write_status(&api, &shortcut, status).await?;
    if !known {
        tracing::info!(shortcut = %key_of(&shortcut), "not linked: this cluster is not a hub");
        events::warn(
            &ctx.client,
            &shortcut.object_ref(&()),
            reason::NOT_HUB,
            "Link",
            &message,
        )
        .await;
    }
    ctx.reconciled(&*shortcut);
    Ok(Action::await_change())
}

/// Runs [`explain`] on every ShortcutConnection of `namespace` until the process is
/// signalled: what a controller that is not the hub runs instead of the operator. Fails at
/// once when the CRD is not installed.
pub async fn run_not_hub(
    client: kube::Client,
    namespace: String,
    cluster_id: String,
    health: ApiHealth,
) -> Result<(), ShortcutError> {
    let shortcuts: Api<ShortcutConnection> = Api::namespaced(client.clone(), &namespace);
    super::objects::require_crd(&shortcuts).await?;
    let ctx = Arc::new(NotHubContext::new(client, cluster_id, health.clone()));
    runtime::controller(
        shortcuts,
        watcher::Config::default(),
        &health,
        "ShortcutConnection",
    )
    .graceful_shutdown_on(crate::plumbing::shutdown::signal())
    .run(explain, runtime::error_policy, ctx)
    .for_each(|result| async move {
        if let Err(error) = result {
            tracing::debug!("{error}");
        }
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_says_where_a_shortcut_belongs() {
        let message = not_hub_message("rome");
        assert!(message.contains("(rome) is not a hub"), "{message}");
        assert!(message.contains("KUBETUN_HUB: \"true\""), "{message}");
        assert!(message.contains("kubetun shortcut create"), "{message}");
    }
}
