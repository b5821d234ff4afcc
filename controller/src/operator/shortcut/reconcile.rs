//! The operator's loop: [`run`] watches ShortcutConnections, their kubeconfig Secrets and
//! their leaves; [`reconcile`] links the leaves (or, on deletion, tears the link down).

use std::fmt;
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Resource as _;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::finalizer::{self, Event, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, watcher};
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;
use kubetun_crds::contract::shortcut::{FINALIZER, READY, SHORTCUT_LABEL};
use kubetun_crds::{LeafCluster, ShortcutConnection, ShortcutPhase};

use super::objects::key_of;
use super::status::{record_error, status_from, write_status};
use super::{Intervals, LeafClients, LeafWatches, SecretKubeconfigs, ShortcutError};
use crate::connector::{
    self, ClusterHandle, Connector, LinkOwner, TracingProgress, Transit, WaitOptions,
};
use crate::plumbing::conditions;
use crate::plumbing::events;
use crate::plumbing::runtime::{self, ApiHealth};

/// What the operator needs besides [`runtime::Context`]'s parts (whose client is the hub's).
pub struct Operator {
    /// The hub's cluster id, recorded on the leaves' NetworkConfigs so a leaf can tell whose
    /// link it is.
    pub hub_id: String,
    /// Builds leaf clients.
    pub leaves: Arc<dyn LeafClients>,
    /// Requeue intervals.
    pub intervals: Intervals,
    /// Watches of the leaves that trigger reconciles.
    pub leaf_watches: LeafWatches,
}

impl fmt::Debug for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operator")
            .field("hub_id", &self.hub_id)
            .field("intervals", &self.intervals)
            .finish_non_exhaustive()
    }
}

/// What the reconciler needs.
pub type Context = runtime::Context<Operator>;

impl Context {
    /// A context with default intervals, no leaf watches and no hub id; Events about
    /// ShortcutConnections (a direction switching path) go through the hub.
    pub fn new(hub: kube::Client, leaves: Arc<dyn LeafClients>, health: ApiHealth) -> Self {
        let intervals = Intervals::default();
        let recorder = Recorder::new(hub.clone(), Reporter::from(EVENT_REPORTER));
        let state = Operator {
            hub_id: String::new(),
            leaves,
            intervals,
            leaf_watches: LeafWatches::default(),
        };
        Self::with_state(KIND, hub, health, state)
            .with_backoff(intervals.backoff())
            .with_recorder(recorder)
    }

    /// Sets the hub's cluster id.
    #[must_use]
    pub fn with_hub_id(mut self, hub_id: impl Into<String>) -> Self {
        self.state.hub_id = hub_id.into();
        self
    }

    /// Uses `watches` to trigger reconciles on leaf changes.
    #[must_use]
    pub fn with_leaf_watches(mut self, watches: LeafWatches) -> Self {
        self.state.leaf_watches = watches;
        self
    }
}

/// One reconciliation of a ShortcutConnection (adds the finalizer first; on deletion tears
/// the link down and releases the finalizer).
pub async fn reconcile(
    shortcut: Arc<ShortcutConnection>,
    ctx: Arc<Context>,
) -> Result<Action, ShortcutError> {
    let namespace = shortcut
        .namespace()
        .ok_or_else(|| ShortcutError::NoNamespace(shortcut.name_any()))?;
    let api: Api<ShortcutConnection> = Api::namespaced(ctx.client.clone(), &namespace);
    let reconciled = shortcut.clone();
    let shortcut = with_finalizer(&api, shortcut).await?;
    let action = finalizer(&api, FINALIZER, shortcut, |event| async {
        match event {
            Event::Apply(shortcut) => apply(&api, &shortcut, &ctx).await,
            Event::Cleanup(shortcut) => cleanup(&api, &shortcut, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        finalizer::Error::ApplyFailed(inner) | finalizer::Error::CleanupFailed(inner) => inner,
        other => ShortcutError::Finalizer(Box::new(other)),
    })?;
    ctx.reconciled(&*reconciled);
    Ok(action)
}

/// Adds [`FINALIZER`] unless present or the object is going away, with a merge patch guarded
/// by the resourceVersion (a concurrent writer makes it fail and retry rather than lose a
/// finalizer). `finalizer()` would add it with a JSON patch testing for an absent list,
/// which only real API servers accept.
async fn with_finalizer(
    api: &Api<ShortcutConnection>,
    shortcut: Arc<ShortcutConnection>,
) -> Result<Arc<ShortcutConnection>, ShortcutError> {
    if shortcut.metadata.deletion_timestamp.is_some()
        || shortcut.finalizers().iter().any(|f| f == FINALIZER)
    {
        return Ok(shortcut);
    }
    let mut finalizers = shortcut.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    let patch = serde_json::json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": shortcut.resource_version() }
    });
    let updated = api
        .patch(
            &shortcut.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|source| ShortcutError::Hub {
            action: format!(
                "add finalizer {FINALIZER} to ShortcutConnection {}",
                key_of(&shortcut)
            ),
            source,
        })?;
    Ok(Arc::new(updated))
}

/// The operator's name in logs and backoff keys.
pub(super) const KIND: &str = "shortcut";

async fn connector_for(
    shortcut: &ShortcutConnection,
    namespace: &str,
    ctx: &Context,
) -> Result<Connector, ShortcutError> {
    let spec = &shortcut.spec;
    let handle = |leaf: &LeafCluster, client: kube::Client| ClusterHandle {
        label: leaf.name.clone(),
        client,
        namespace: leaf
            .namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
        endpoint_override: leaf.endpoint_override.clone(),
        server: None,
    };
    let left = ctx.leaves.client(namespace, &spec.left).await?;
    let right = ctx.leaves.client(namespace, &spec.right).await?;
    let left_server = ctx.leaves.server(namespace, &spec.left).await;
    let right_server = ctx.leaves.server(namespace, &spec.right).await;
    let owner = LinkOwner {
        shortcut: key_of(shortcut),
        hub: ctx.hub_id.clone(),
    };
    // With transit, the hub is each leaf's fallback (or its only path to the other).
    let transit = spec.transit.then(|| Transit {
        hub: hub_handle(ctx, namespace),
        hub_only: spec.hub_only,
        grant: transit_grant(shortcut),
    });
    Ok(Connector::new(
        handle(&spec.left, left).with_server(left_server),
        handle(&spec.right, right).with_server(right_server),
    )
    .with_mtu(spec.mtu)
    .with_isolation(spec.isolation, spec.isolation)
    .with_owner(Some(owner))
    .with_transit(transit))
}

/// The hub, as the connector sees it.
fn hub_handle(ctx: &Context, namespace: &str) -> ClusterHandle {
    ClusterHandle {
        label: "hub".to_owned(),
        client: ctx.client.clone(),
        namespace: namespace.to_owned(),
        endpoint_override: None,
        server: None,
    }
}

/// The name of the transit grant a shortcut puts on the hub's NetworkConfigs: its uid (a
/// valid annotation name, unlike `namespace/name`, and never reused by a later object).
fn transit_grant(shortcut: &ShortcutConnection) -> String {
    shortcut
        .uid()
        .unwrap_or_else(|| key_of(shortcut).replace('/', "."))
}

/// Withdraws the shortcut's transit grant from the hub where it no longer holds: the
/// shortcut went, or does not allow transit (any more).
async fn release_transit(
    ctx: &Context,
    shortcut: &ShortcutConnection,
    namespace: &str,
) -> Result<(), ShortcutError> {
    connector::transit::release(&hub_handle(ctx, namespace), &transit_grant(shortcut)).await?;
    Ok(())
}

/// Reporter of the operator's events.
const EVENT_REPORTER: &str = "kubetun-shortcut-operator";

/// An Event per direction whose path switched (direct <-> via the hub). Best effort.
async fn publish_path_changes(
    ctx: &Context,
    shortcut: &ShortcutConnection,
    before: &kubetun_crds::ShortcutConnectionStatus,
    after: &kubetun_crds::ShortcutConnectionStatus,
) {
    for direction in &after.directions {
        let previous = before
            .directions
            .iter()
            .find(|d| d.from == direction.from && d.to == direction.to)
            .and_then(|d| d.path);
        let (Some(was), Some(now)) = (previous, direction.path) else {
            continue;
        };
        if was == now {
            continue;
        }
        let note = match now {
            kubetun_crds::ShortcutPath::ViaHub => format!(
                "{} -> {}: the shortcut is down; the hub carries the traffic at the same addresses",
                direction.from, direction.to
            ),
            kubetun_crds::ShortcutPath::Direct => format!(
                "{} -> {}: back on the shortcut",
                direction.from, direction.to
            ),
        };
        tracing::info!(shortcut = %key_of(shortcut), "{note}");
        let type_ = match now {
            kubetun_crds::ShortcutPath::ViaHub => EventType::Warning,
            kubetun_crds::ShortcutPath::Direct => EventType::Normal,
        };
        // Per direction: the recorder folds events with the same reason and action on one
        // object into one series, which would hide the other direction's switch.
        let action = format!("SwitchPath-{}-{}", direction.from, direction.to);
        ctx.publish(
            &shortcut.object_ref(&()),
            type_,
            "PathChanged",
            &action,
            &note,
        )
        .await;
    }
}

async fn apply(
    api: &Api<ShortcutConnection>,
    shortcut: &ShortcutConnection,
    ctx: &Context,
) -> Result<Action, ShortcutError> {
    let namespace = shortcut.namespace().unwrap_or_default();
    let outcome = match connector_for(shortcut, &namespace, ctx).await {
        Ok(connector) => {
            ctx.leaf_watches.ensure(shortcut, &connector);
            let synced = connector
                .sync(&TracingProgress)
                .await
                .map_err(ShortcutError::from);
            match synced {
                Ok(state) if !shortcut.spec.transit => release_transit(ctx, shortcut, &namespace)
                    .await
                    .map(|()| state),
                other => other,
            }
        }
        Err(error) => Err(error),
    };
    let current = shortcut.status.clone().unwrap_or_default();
    let generation = shortcut.metadata.generation;
    let now = ctx.now();
    match outcome {
        Ok(state) => {
            let status = status_from(&state, shortcut, current.clone(), generation, now);
            publish_path_changes(ctx, shortcut, &current, &status).await;
            let connected = status.phase == ShortcutPhase::Connected;
            write_status(api, shortcut, status).await?;
            Ok(Action::requeue(if connected {
                ctx.intervals.connected
            } else {
                ctx.intervals.pending
            }))
        }
        Err(error) => {
            let mut status = current;
            status.phase = ShortcutPhase::Error;
            status.observed_generation = generation;
            record_error(&mut status.conditions, &error, generation, now);
            let before = shortcut.status.as_ref().map(|s| s.conditions.as_slice());
            let news = news_of_error(before.unwrap_or_default(), &status.conditions, &error);
            write_status(api, shortcut, status).await?;
            if let Some((why, message)) = news {
                events::warn(
                    &ctx.client,
                    &shortcut.object_ref(&()),
                    &why,
                    "Link",
                    &message,
                )
                .await;
            }
            Err(error)
        }
    }
}

/// The reason and message of the condition `error` was recorded in, when they are not what
/// `before` said (an Event is news only then).
fn news_of_error(
    before: &[kubetun_crds::Condition],
    after: &[kubetun_crds::Condition],
    error: &ShortcutError,
) -> Option<(String, String)> {
    let (type_, _) = error.condition();
    let now = conditions::find(after, type_)?;
    let unchanged = conditions::find(before, type_).is_some_and(|c| {
        c.status == now.status && c.reason == now.reason && c.message == now.message
    });
    (!unchanged).then(|| (now.reason.clone(), now.message.clone()))
}

async fn cleanup(
    api: &Api<ShortcutConnection>,
    shortcut: &ShortcutConnection,
    ctx: &Context,
) -> Result<Action, ShortcutError> {
    let namespace = shortcut.namespace().unwrap_or_default();
    let generation = shortcut.metadata.generation;
    let now = ctx.now();
    let mut status = shortcut.status.clone().unwrap_or_default();
    status.phase = ShortcutPhase::Deleting;
    let outcome = match connector_for(shortcut, &namespace, ctx).await {
        Ok(connector) => connector
            .disconnect(WaitOptions::default(), &TracingProgress)
            .await
            .map_err(ShortcutError::from),
        Err(error) => Err(error),
    };
    match outcome {
        Ok(_) => {
            ctx.leaf_watches.stop(&key_of(shortcut));
            release_transit(ctx, shortcut, &namespace).await?;
            delete_kubeconfig_secrets(ctx, shortcut, &namespace).await?;
            Ok(Action::await_change())
        }
        Err(error) => {
            record_error(&mut status.conditions, &error, generation, now);
            let ready = conditions::find(&status.conditions, READY).map(|c| c.message.clone());
            tracing::warn!(?ready, "teardown of {} failed", key_of(shortcut));
            let before = shortcut.status.as_ref().map(|s| s.conditions.as_slice());
            let news = news_of_error(before.unwrap_or_default(), &status.conditions, &error);
            write_status(api, shortcut, status).await?;
            if let Some((why, message)) = news {
                events::warn(
                    &ctx.client,
                    &shortcut.object_ref(&()),
                    &why,
                    "Unlink",
                    &message,
                )
                .await;
            }
            Err(error)
        }
    }
}

/// Deletes the kubeconfig Secrets `kubetun shortcut create` made for `shortcut` (labelled
/// with its name and named in its spec). Their owner reference would let a garbage collector
/// do it, but not every API server has one, and kubeconfigs must not linger.
async fn delete_kubeconfig_secrets(
    ctx: &Context,
    shortcut: &ShortcutConnection,
    namespace: &str,
) -> Result<(), ShortcutError> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let name = shortcut.name_any();
    for leaf in [&shortcut.spec.left, &shortcut.spec.right] {
        let secret_name = &leaf.kubeconfig_secret.name;
        let hub_error = |source| ShortcutError::Hub {
            action: format!("delete the kubeconfig Secret {namespace}/{secret_name} of {name}"),
            source,
        };
        let Some(secret) = secrets.get_opt(secret_name).await.map_err(hub_error)? else {
            continue;
        };
        // A Secret the user made and referenced is theirs to keep.
        if secret.labels().get(SHORTCUT_LABEL) != Some(&name) {
            continue;
        }
        match secrets
            .delete(secret_name, &kube::api::DeleteParams::default())
            .await
        {
            Ok(_) => {
                tracing::info!(shortcut = %key_of(shortcut), secret = %secret_name, "kubeconfig Secret deleted")
            }
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(source) => return Err(hub_error(source)),
        }
    }
    Ok(())
}

/// Runs the operator until the process is signalled: watches ShortcutConnections (in
/// `namespace`, or all), the labelled kubeconfig Secrets and each shortcut's leaves, reading
/// leaf kubeconfigs from Secrets. `hub_id` is this (the hub) cluster's id. Fails at once when
/// the CRD is not installed.
pub async fn run(
    client: kube::Client,
    namespace: Option<String>,
    hub_id: String,
    health: ApiHealth,
) -> Result<(), ShortcutError> {
    let health = &health;
    let (shortcuts, secrets): (Api<ShortcutConnection>, Api<Secret>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    super::objects::require_crd(&shortcuts).await?;
    let (leaf_watches, leaf_changes) = LeafWatches::new();
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            Arc::new(SecretKubeconfigs::new(client)),
            health.clone(),
        )
        .with_hub_id(hub_id)
        .with_leaf_watches(leaf_watches),
    );
    let controller = runtime::controller(
        shortcuts,
        watcher::Config::default(),
        health,
        "ShortcutConnection",
    );
    let store = controller.store();
    let secrets_ctx = ctx.clone();
    let secret_changes = runtime::watch(
        secrets,
        watcher::Config::default().labels(SHORTCUT_LABEL),
        health,
        "Secret",
    )
    .touched_objects();
    controller
        .watches_stream(secret_changes, move |secret: Secret| {
            let secret_name = secret.name_any();
            let secret_namespace = secret.namespace();
            let affected: Vec<_> = store
                .state()
                .into_iter()
                .filter(|sc| {
                    sc.namespace() == secret_namespace
                        && [&sc.spec.left, &sc.spec.right]
                            .iter()
                            .any(|leaf| leaf.kubeconfig_secret.name == secret_name)
                })
                .collect();
            // New credentials: the leaf watches restart with them on the next reconcile.
            for sc in &affected {
                secrets_ctx.leaf_watches.stop(&key_of(sc));
            }
            affected
                .iter()
                .map(|sc| ObjectRef::from_obj(&**sc))
                .collect::<Vec<_>>()
        })
        .reconcile_on(leaf_changes)
        .graceful_shutdown_on(crate::plumbing::shutdown::signal())
        .run(reconcile, runtime::error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(shortcut = %object, "reconciled"),
                Err(error) => tracing::debug!("{error}"),
            }
        })
        .await;
    Ok(())
}
