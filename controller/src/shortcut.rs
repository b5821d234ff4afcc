//! The ShortcutConnection operator: runs on the hub and links two leaf clusters directly,
//! with the same [`Connector`] the `kubetun network` CLI uses.
//!
//! For each ShortcutConnection it builds a client per leaf (by default from the kubeconfig
//! Secrets the spec names; injectable through [`LeafClients`]), runs one non-blocking
//! [`Connector::sync`] pass and writes, with server-side apply on the status, how each leaf
//! sees the other (every CIDR and its remapped CIDR) and each tunnel's state. A finalizer
//! tears the link down on both leaves when the ShortcutConnection is deleted, then deletes
//! the kubeconfig Secrets `kubetun shortcut create` made for it (their owner reference only
//! helps where a garbage collector runs). A leaf that cannot be reached shows up as a
//! `LeafReachable=False` condition and is retried with exponential backoff.
//!
//! The operator reacts to events, not a timer: besides its own objects and the labelled
//! kubeconfig Secrets, it watches, through each shortcut's leaf clients, the leaves'
//! NetworkConfigs and TunnelEndpoints ([`LeafWatches`]) and reconciles the shortcut when one
//! changes in a way that can change the outcome (processed, rejected, connection state).
//! The requeue intervals are only a safety net.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, Event, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource as _, ResourceExt as _};
use kubetun_crds::{
    Condition, LeafCluster, ShortcutConnection, ShortcutConnectionStatus, ShortcutDirection,
    ShortcutPhase,
};

use crate::cluster_info::DEFAULT_NAMESPACE;
use crate::conditions;
use crate::connector::{
    self, ClusterHandle, Connector, Direction, LinkOwner, LinkState, TracingProgress, WaitOptions,
};
use crate::runtime::{self, ApiHealth};

/// Finalizer that keeps a ShortcutConnection until the link is removed from both leaves.
pub const FINALIZER: &str = "net.kubetun.io/shortcut-cleanup";
/// Field manager of the operator's status writes.
pub const FIELD_MANAGER: &str = "kubetun-shortcut";
/// Key of the kubeconfig in a leaf's Secret unless the spec names another.
pub const DEFAULT_SECRET_KEY: &str = "kubeconfig";
/// Label on the kubeconfig Secrets `kubetun shortcut create` makes, naming the shortcut; the
/// operator watches Secrets with this label and retries the shortcut when one changes.
pub const SHORTCUT_LABEL: &str = "net.kubetun.io/shortcut";

/// Condition type: both tunnels are connected.
pub const READY: &str = "Ready";
/// Condition type: the hub reaches both leaves.
pub const LEAF_REACHABLE: &str = "LeafReachable";

/// Condition reasons of a ShortcutConnection.
pub mod reason {
    /// Both leaves answered.
    pub const REACHABLE: &str = "Reachable";
    /// The kubeconfig Secret or its key does not exist.
    pub const KUBECONFIG_MISSING: &str = "KubeconfigMissing";
    /// The kubeconfig does not parse or has no usable context.
    pub const KUBECONFIG_INVALID: &str = "KubeconfigInvalid";
    /// A leaf's API server does not answer or refuses the credentials.
    pub const LEAF_UNREACHABLE: &str = "LeafUnreachable";
    /// kubetun is not running on a leaf (no cluster info).
    pub const KUBETUN_MISSING: &str = "KubetunMissing";
    /// Both leaves are the same cluster, or an object is in the way.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A leaf refused the other's NetworkConfig.
    pub const REJECTED: &str = "Rejected";
    /// Waiting for the leaves to process each other's NetworkConfig.
    pub const PROCESSING: &str = "Processing";
    /// Waiting for the tunnels.
    pub const CONNECTING: &str = "Connecting";
    /// A tunnel reports an error.
    pub const CONNECTION_ERROR: &str = "ConnectionError";
    /// Both tunnels are up.
    pub const CONNECTED: &str = "Connected";
    /// The link is being removed.
    pub const DELETING: &str = "Deleting";
}

/// Why a leaf client cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("leaf {leaf}: {message}")]
pub struct LeafError {
    /// Name of the leaf.
    pub leaf: String,
    /// Condition reason ([`reason::KUBECONFIG_MISSING`], [`reason::KUBECONFIG_INVALID`], ...).
    pub reason: &'static str,
    /// What is wrong and what to do.
    pub message: String,
}

/// A failure of the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A leaf client cannot be built.
    #[error(transparent)]
    Leaf(#[from] LeafError),
    /// The connector failed on a leaf.
    #[error(transparent)]
    Connector(#[from] connector::Error),
    /// The hub's API failed.
    #[error("hub: cannot {action}")]
    Hub {
        /// What was attempted.
        action: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The finalizer could not be added or removed.
    #[error("finalizer {FINALIZER}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
    /// The object has no namespace (the CRD is namespaced; this is a bug elsewhere).
    #[error("ShortcutConnection {0} has no namespace")]
    NoNamespace(String),
}

impl Error {
    /// Condition type and reason describing this error.
    fn condition(&self) -> (&'static str, &'static str) {
        match self {
            Self::Leaf(leaf) => (LEAF_REACHABLE, leaf.reason),
            Self::Connector(connector::Error::ClusterInfo { source, .. }) => match source {
                crate::cluster_info::ClusterInfoError::Kube(_) => {
                    (LEAF_REACHABLE, reason::LEAF_UNREACHABLE)
                }
                _ => (READY, reason::KUBETUN_MISSING),
            },
            Self::Connector(connector::Error::Api { .. }) => {
                (LEAF_REACHABLE, reason::LEAF_UNREACHABLE)
            }
            Self::Connector(connector::Error::Rejected { .. }) => (READY, reason::REJECTED),
            Self::Connector(_) => (READY, reason::INVALID_SPEC),
            Self::Hub { .. } | Self::Finalizer(_) | Self::NoNamespace(_) => {
                (READY, reason::INVALID_SPEC)
            }
        }
    }
}

/// Builds the client of a leaf cluster. The operator reads kubeconfig Secrets
/// ([`SecretKubeconfigs`]); tests hand in clients directly (any
/// `Fn(&str, &LeafCluster) -> Result<kube::Client, LeafError>` is a `LeafClients`).
pub trait LeafClients: Send + Sync {
    /// The client of `leaf`, whose Secret lives in `namespace` on the hub.
    fn client<'a>(
        &'a self,
        namespace: &'a str,
        leaf: &'a LeafCluster,
    ) -> BoxFuture<'a, Result<kube::Client, LeafError>>;
}

impl<F> LeafClients for F
where
    F: Fn(&str, &LeafCluster) -> Result<kube::Client, LeafError> + Send + Sync,
{
    fn client<'a>(
        &'a self,
        namespace: &'a str,
        leaf: &'a LeafCluster,
    ) -> BoxFuture<'a, Result<kube::Client, LeafError>> {
        Box::pin(std::future::ready(self(namespace, leaf)))
    }
}

/// Leaf clients from the kubeconfig Secrets on the hub.
#[derive(Clone)]
pub struct SecretKubeconfigs {
    hub: kube::Client,
}

impl fmt::Debug for SecretKubeconfigs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretKubeconfigs").finish_non_exhaustive()
    }
}

impl SecretKubeconfigs {
    /// Reads Secrets through `hub`.
    pub fn new(hub: kube::Client) -> Self {
        Self { hub }
    }

    async fn build(&self, namespace: &str, leaf: &LeafCluster) -> Result<kube::Client, LeafError> {
        let secret_ref = &leaf.kubeconfig_secret;
        let key = secret_ref.key.as_deref().unwrap_or(DEFAULT_SECRET_KEY);
        let fail = |reason: &'static str, message: String| LeafError {
            leaf: leaf.name.clone(),
            reason,
            message,
        };
        let secrets: Api<Secret> = Api::namespaced(self.hub.clone(), namespace);
        let secret = secrets
            .get_opt(&secret_ref.name)
            .await
            .map_err(|e| fail(reason::KUBECONFIG_MISSING, format!("cannot read Secret {namespace}/{}: {e}", secret_ref.name)))?
            .ok_or_else(|| {
                fail(
                    reason::KUBECONFIG_MISSING,
                    format!("Secret {namespace}/{} does not exist: create it with the leaf's kubeconfig", secret_ref.name),
                )
            })?;
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| {
                fail(
                    reason::KUBECONFIG_MISSING,
                    format!("Secret {namespace}/{} has no key {key:?}", secret_ref.name),
                )
            })?;
        let invalid = |e: &dyn fmt::Display| {
            fail(
                reason::KUBECONFIG_INVALID,
                format!(
                    "Secret {namespace}/{} key {key:?} is not a usable kubeconfig: {e}",
                    secret_ref.name
                ),
            )
        };
        let text = std::str::from_utf8(&bytes.0).map_err(|e| invalid(&e))?;
        let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| invalid(&e))?;
        crate::cli::install_tls_provider();
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| invalid(&e))?;
        kube::Client::try_from(config).map_err(|e| invalid(&e))
    }
}

impl LeafClients for SecretKubeconfigs {
    fn client<'a>(
        &'a self,
        namespace: &'a str,
        leaf: &'a LeafCluster,
    ) -> BoxFuture<'a, Result<kube::Client, LeafError>> {
        Box::pin(self.build(namespace, leaf))
    }
}

/// When to look at a shortcut again.
#[derive(Debug, Clone, Copy)]
pub struct Intervals {
    /// While the leaves process the NetworkConfigs or the tunnels connect.
    pub pending: Duration,
    /// Once connected (refreshes the tunnel state in the status).
    pub connected: Duration,
    /// First retry after an error; doubles per consecutive error.
    pub backoff_base: Duration,
    /// Longest retry interval.
    pub backoff_max: Duration,
}

impl Default for Intervals {
    fn default() -> Self {
        // Events drive the operator (see the module docs); these catch what a watch missed.
        Self {
            pending: Duration::from_secs(30),
            connected: Duration::from_secs(60),
            backoff_base: Duration::from_secs(5),
            backoff_max: Duration::from_secs(300),
        }
    }
}

/// Per-shortcut exponential backoff: the delay doubles with each consecutive failure, up to
/// a cap, and starts over after a success.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The retry delay after one more failure of `key`.
    pub fn next(&self, key: &str, intervals: &Intervals) -> Duration {
        let mut failures = self.failures();
        let count = failures.entry(key.to_owned()).or_insert(0);
        let delay = intervals.backoff_base.saturating_mul(1 << (*count).min(16));
        *count = count.saturating_add(1);
        delay.min(intervals.backoff_max)
    }

    /// Forgets the failures of `key`.
    pub fn reset(&self, key: &str) {
        self.failures().remove(key);
    }
}

/// Watches of each shortcut's leaves (NetworkConfigs and TunnelEndpoints in kubetun's
/// namespace there) that ask for a reconcile of the shortcut when something that decides its
/// outcome changes. One set of watch tasks per shortcut, started by its first successful
/// connection to both leaves and stopped when it is deleted or a kubeconfig Secret changes.
#[derive(Debug, Default)]
pub struct LeafWatches {
    trigger: Mutex<Option<tokio::sync::mpsc::UnboundedSender<ObjectRef<ShortcutConnection>>>>,
    running: Mutex<HashMap<String, WatchTasks>>,
}

/// The spec generation a shortcut's leaf watches were started for, and their tasks.
type WatchTasks = (Option<i64>, Vec<tokio::task::JoinHandle<()>>);

impl LeafWatches {
    /// Watches that send the shortcuts to reconcile into the returned stream.
    pub fn new() -> (
        Self,
        tokio_stream::wrappers::UnboundedReceiverStream<ObjectRef<ShortcutConnection>>,
    ) {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let watches = Self {
            trigger: Mutex::new(Some(sender)),
            running: Mutex::default(),
        };
        (
            watches,
            tokio_stream::wrappers::UnboundedReceiverStream::new(receiver),
        )
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, WatchTasks>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Number of shortcuts whose leaves are watched.
    pub fn len(&self) -> usize {
        self.running().len()
    }

    /// Whether no leaves are watched.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts watching the leaves of `shortcut` through `connector`'s clients, unless they
    /// are watched already for this generation of its spec. Without a trigger (tests that
    /// call [`reconcile`] directly) this does nothing.
    fn ensure(&self, shortcut: &ShortcutConnection, connector: &Connector) {
        let Some(trigger) = self
            .trigger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
        else {
            return;
        };
        let key = key_of(shortcut);
        let generation = shortcut.metadata.generation;
        let mut running = self.running();
        if running
            .get(&key)
            .is_some_and(|(g, tasks)| *g == generation && tasks.iter().all(|t| !t.is_finished()))
        {
            return;
        }
        if let Some((_, old)) = running.remove(&key) {
            old.iter().for_each(tokio::task::JoinHandle::abort);
        }
        let target = ObjectRef::from_obj(shortcut);
        let mut tasks = Vec::new();
        for handle in [connector.local(), connector.remote()] {
            let configs: Api<kubetun_crds::NetworkConfig> =
                Api::namespaced(handle.client.clone(), &handle.namespace);
            let config = watcher::Config::default().labels(&format!(
                "{}={}",
                connector::MANAGED_BY_LABEL,
                connector::MANAGED_BY_CONNECTOR
            ));
            tasks.push(tokio::spawn(forward_changes(
                watcher(configs, config),
                config_fingerprint,
                trigger.clone(),
                target.clone(),
            )));
            let tunnels: Api<kubetun_crds::TunnelEndpoint> =
                Api::namespaced(handle.client.clone(), &handle.namespace);
            tasks.push(tokio::spawn(forward_changes(
                watcher(tunnels, watcher::Config::default()),
                tunnel_fingerprint,
                trigger.clone(),
                target.clone(),
            )));
        }
        running.insert(key, (generation, tasks));
    }

    /// Stops watching the leaves of shortcut `key` (`namespace/name`).
    pub fn stop(&self, key: &str) {
        if let Some((_, tasks)) = self.running().remove(key) {
            tasks.iter().for_each(tokio::task::JoinHandle::abort);
        }
    }
}

impl Drop for LeafWatches {
    fn drop(&mut self) {
        for (_, tasks) in self.running().values() {
            tasks.iter().for_each(tokio::task::JoinHandle::abort);
        }
    }
}

/// What of a leaf's NetworkConfig can change a shortcut's outcome.
fn config_fingerprint(nc: &kubetun_crds::NetworkConfig) -> String {
    let status = nc.status.as_ref();
    format!(
        "{:?} {:?} {:?} {:?}",
        nc.metadata.generation,
        status.map(|s| s.processed),
        status.and_then(|s| s.observed_generation),
        status.map(|s| {
            s.conditions
                .iter()
                .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
                .collect::<Vec<_>>()
        }),
    )
}

/// What of a leaf's TunnelEndpoint can change a shortcut's outcome: not the counters and
/// latency the gateway sync refreshes all the time.
fn tunnel_fingerprint(te: &kubetun_crds::TunnelEndpoint) -> String {
    let status = te.status.as_ref();
    format!(
        "{:?} {:?} {:?}",
        te.metadata.generation,
        status.and_then(|s| s.observed_generation),
        status.and_then(|s| s.connection.as_ref().map(|c| c.status)),
    )
}

/// Sends `target` whenever an object of `events` appears, goes, or changes its fingerprint
/// (and once per complete (re)list, which also covers what a broken watch missed).
async fn forward_changes<K>(
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    fingerprint: fn(&K) -> String,
    trigger: tokio::sync::mpsc::UnboundedSender<ObjectRef<ShortcutConnection>>,
    target: ObjectRef<ShortcutConnection>,
) where
    K: kube::Resource + Send,
{
    use kube::runtime::WatchStreamExt as _;
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut listing: HashMap<String, String> = HashMap::new();
    let events = events.default_backoff();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        let changed = match event {
            Ok(watcher::Event::Apply(obj)) => {
                let print = fingerprint(&obj);
                seen.insert(obj.name_any(), print.clone()) != Some(print)
            }
            Ok(watcher::Event::Delete(obj)) => seen.remove(&obj.name_any()).is_some(),
            Ok(watcher::Event::Init) => {
                listing.clear();
                false
            }
            Ok(watcher::Event::InitApply(obj)) => {
                listing.insert(obj.name_any(), fingerprint(&obj));
                false
            }
            Ok(watcher::Event::InitDone) => {
                let changed = listing != seen;
                seen = std::mem::take(&mut listing);
                changed
            }
            // Backed off and retried by the stream; the leaf's reachability shows up in the
            // shortcut's status through its reconciles.
            Err(_) => false,
        };
        if changed && trigger.send(target.clone()).is_err() {
            return;
        }
    }
}

/// What the reconciler needs.
pub struct Context {
    /// Client of the hub.
    pub hub: kube::Client,
    /// The hub's cluster id, recorded on the leaves' NetworkConfigs so a leaf can tell whose
    /// link it is.
    pub hub_id: String,
    /// Builds leaf clients.
    pub leaves: Arc<dyn LeafClients>,
    /// Requeue and backoff intervals.
    pub intervals: Intervals,
    /// Consecutive failures per shortcut (`namespace/name`).
    pub backoff: Backoff,
    /// Watches of the leaves that trigger reconciles.
    pub leaf_watches: LeafWatches,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("intervals", &self.intervals)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context with default intervals, no leaf watches and no hub id.
    pub fn new(hub: kube::Client, leaves: Arc<dyn LeafClients>) -> Self {
        Self {
            hub,
            hub_id: String::new(),
            leaves,
            intervals: Intervals::default(),
            backoff: Backoff::default(),
            leaf_watches: LeafWatches::default(),
        }
    }

    /// Sets the hub's cluster id.
    #[must_use]
    pub fn with_hub_id(mut self, hub_id: impl Into<String>) -> Self {
        self.hub_id = hub_id.into();
        self
    }

    /// Uses `watches` to trigger reconciles on leaf changes.
    #[must_use]
    pub fn with_leaf_watches(mut self, watches: LeafWatches) -> Self {
        self.leaf_watches = watches;
        self
    }
}

fn key_of(shortcut: &ShortcutConnection) -> String {
    format!(
        "{}/{}",
        shortcut.namespace().unwrap_or_default(),
        shortcut.name_any()
    )
}

/// One reconciliation of a ShortcutConnection (adds the finalizer first; on deletion tears
/// the link down and releases the finalizer).
pub async fn reconcile(
    shortcut: Arc<ShortcutConnection>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let namespace = shortcut
        .namespace()
        .ok_or_else(|| Error::NoNamespace(shortcut.name_any()))?;
    let api: Api<ShortcutConnection> = Api::namespaced(ctx.hub.clone(), &namespace);
    let key = key_of(&shortcut);
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
        other => Error::Finalizer(Box::new(other)),
    })?;
    ctx.backoff.reset(&key);
    Ok(action)
}

/// Adds [`FINALIZER`] unless present or the object is going away, with a merge patch guarded
/// by the resourceVersion (a concurrent writer makes it fail and retry rather than lose a
/// finalizer). `finalizer()` would add it with a JSON patch testing for an absent list,
/// which only real API servers accept.
async fn with_finalizer(
    api: &Api<ShortcutConnection>,
    shortcut: Arc<ShortcutConnection>,
) -> Result<Arc<ShortcutConnection>, Error> {
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
        .map_err(|source| Error::Hub {
            action: format!(
                "add finalizer {FINALIZER} to ShortcutConnection {}",
                key_of(&shortcut)
            ),
            source,
        })?;
    Ok(Arc::new(updated))
}

/// Retry with exponential backoff per shortcut.
pub fn error_policy(shortcut: Arc<ShortcutConnection>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.next(&key_of(&shortcut), &ctx.intervals);
    tracing::warn!(shortcut = %key_of(&shortcut), retry_in = ?delay, "{}", connector::error_chain(error));
    Action::requeue(delay)
}

async fn connector_for(
    shortcut: &ShortcutConnection,
    namespace: &str,
    ctx: &Context,
) -> Result<Connector, Error> {
    let spec = &shortcut.spec;
    let handle = |leaf: &LeafCluster, client: kube::Client| ClusterHandle {
        label: leaf.name.clone(),
        client,
        namespace: leaf
            .namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
        endpoint_override: leaf.endpoint_override.clone(),
    };
    let left = ctx.leaves.client(namespace, &spec.left).await?;
    let right = ctx.leaves.client(namespace, &spec.right).await?;
    let owner = LinkOwner {
        shortcut: key_of(shortcut),
        hub: ctx.hub_id.clone(),
    };
    Ok(
        Connector::new(handle(&spec.left, left), handle(&spec.right, right))
            .with_mtu(spec.mtu)
            .with_owner(Some(owner)),
    )
}

async fn apply(
    api: &Api<ShortcutConnection>,
    shortcut: &ShortcutConnection,
    ctx: &Context,
) -> Result<Action, Error> {
    let namespace = shortcut.namespace().unwrap_or_default();
    let outcome = match connector_for(shortcut, &namespace, ctx).await {
        Ok(connector) => {
            ctx.leaf_watches.ensure(shortcut, &connector);
            connector.sync(&TracingProgress).await.map_err(Error::from)
        }
        Err(error) => Err(error),
    };
    let current = shortcut.status.clone().unwrap_or_default();
    let generation = shortcut.metadata.generation;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    match outcome {
        Ok(state) => {
            let status = status_from(&state, shortcut, current, generation, now);
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
            write_status(api, shortcut, status).await?;
            Err(error)
        }
    }
}

async fn cleanup(
    api: &Api<ShortcutConnection>,
    shortcut: &ShortcutConnection,
    ctx: &Context,
) -> Result<Action, Error> {
    let namespace = shortcut.namespace().unwrap_or_default();
    let generation = shortcut.metadata.generation;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut status = shortcut.status.clone().unwrap_or_default();
    status.phase = ShortcutPhase::Deleting;
    let outcome = match connector_for(shortcut, &namespace, ctx).await {
        Ok(connector) => connector
            .disconnect(WaitOptions::default(), &TracingProgress)
            .await
            .map_err(Error::from),
        Err(error) => Err(error),
    };
    match outcome {
        Ok(_) => {
            ctx.leaf_watches.stop(&key_of(shortcut));
            delete_kubeconfig_secrets(ctx, shortcut, &namespace).await?;
            Ok(Action::await_change())
        }
        Err(error) => {
            record_error(&mut status.conditions, &error, generation, now);
            let ready = conditions::find(&status.conditions, READY).map(|c| c.message.clone());
            tracing::warn!(?ready, "teardown of {} failed", key_of(shortcut));
            write_status(api, shortcut, status).await?;
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
) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(ctx.hub.clone(), namespace);
    let name = shortcut.name_any();
    for leaf in [&shortcut.spec.left, &shortcut.spec.right] {
        let secret_name = &leaf.kubeconfig_secret.name;
        let hub_error = |source| Error::Hub {
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

/// Records `error` in the condition it belongs to (`LeafReachable` or `Ready`), and marks
/// the link not ready.
fn record_error(
    conditions_list: &mut Vec<Condition>,
    error: &Error,
    generation: Option<i64>,
    now: Time,
) {
    let (type_, reason) = error.condition();
    let message = connector::error_chain(error);
    conditions::set(
        conditions_list,
        type_,
        false,
        reason,
        &message,
        generation,
        now.clone(),
    );
    if type_ == LEAF_REACHABLE {
        conditions::set(
            conditions_list,
            READY,
            false,
            reason,
            &message,
            generation,
            now,
        );
    }
}

/// The status a successful pass yields: both directions, phase and conditions.
pub fn status_from(
    state: &LinkState,
    shortcut: &ShortcutConnection,
    current: ShortcutConnectionStatus,
    generation: Option<i64>,
    now: Time,
) -> ShortcutConnectionStatus {
    let names = [&shortcut.spec.left.name, &shortcut.spec.right.name];
    let direction = |d: &Direction, from: &str, to: &str| ShortcutDirection {
        from: from.to_owned(),
        to: to.to_owned(),
        pod_cidrs: d.pod_cidrs.clone(),
        external_cidrs: d.external_cidrs.clone(),
        connection: d.connection.as_ref().map(|c| c.status),
    };
    let directions = vec![
        direction(&state.local_to_remote, names[0], names[1]),
        direction(&state.remote_to_local, names[1], names[0]),
    ];
    let (phase, ready, ready_reason, message) = summarize(state);
    let mut conditions_list = current.conditions;
    conditions::set(
        &mut conditions_list,
        LEAF_REACHABLE,
        true,
        reason::REACHABLE,
        "both leaves answered",
        generation,
        now.clone(),
    );
    conditions::set(
        &mut conditions_list,
        READY,
        ready,
        ready_reason,
        &message,
        generation,
        now,
    );
    ShortcutConnectionStatus {
        phase,
        directions,
        observed_generation: generation,
        conditions: conditions_list,
    }
}

/// Phase, readiness, reason and message of a link.
fn summarize(state: &LinkState) -> (ShortcutPhase, bool, &'static str, String) {
    let directions = state.directions();
    if let Some((d, rejection)) = directions
        .iter()
        .find_map(|d| d.rejection.as_ref().map(|r| (d, r)))
    {
        let message = format!(
            "{} rejected the NetworkConfig of {}: {}",
            d.from_label, d.to.id, rejection.message
        );
        return (ShortcutPhase::Error, false, reason::REJECTED, message);
    }
    if let Some(d) = directions.iter().find(|d| !d.processed) {
        let message = format!(
            "waiting for {} to process the NetworkConfig of {}",
            d.from_label, d.to.id
        );
        return (ShortcutPhase::Pending, false, reason::PROCESSING, message);
    }
    if state.is_connected() {
        return (
            ShortcutPhase::Connected,
            true,
            reason::CONNECTED,
            "both tunnels are connected".to_owned(),
        );
    }
    let failing = directions.iter().find(|d| {
        d.connection
            .as_ref()
            .is_some_and(|c| c.status == kubetun_crds::ConnectionState::Error)
    });
    if let Some(d) = failing {
        let detail = d
            .connection
            .as_ref()
            .map(|c| c.message.clone())
            .unwrap_or_default();
        let message = format!(
            "the tunnel of {} to {} fails: {detail}",
            d.from_label, d.to.id
        );
        return (
            ShortcutPhase::Pending,
            false,
            reason::CONNECTION_ERROR,
            message,
        );
    }
    let waiting: Vec<&str> = directions
        .iter()
        .filter(|d| !d.is_connected())
        .map(|d| d.from_label.as_str())
        .collect();
    let message = format!(
        "waiting for the tunnel of {} to connect",
        waiting.join(" and ")
    );
    (ShortcutPhase::Pending, false, reason::CONNECTING, message)
}

/// Server-side applies the status unless it is unchanged.
async fn write_status(
    api: &Api<ShortcutConnection>,
    shortcut: &ShortcutConnection,
    status: ShortcutConnectionStatus,
) -> Result<(), Error> {
    if shortcut.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let name = shortcut.name_any();
    let patch = serde_json::json!({
        "apiVersion": ShortcutConnection::api_version(&()),
        "kind": ShortcutConnection::kind(&()),
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|source| Error::Hub {
        action: format!(
            "update the status of ShortcutConnection {}",
            key_of(shortcut)
        ),
        source,
    })?;
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
) -> Result<(), Error> {
    let health = &health;
    let (shortcuts, secrets): (Api<ShortcutConnection>, Api<Secret>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    shortcuts
        .list(&ListParams::default().limit(1))
        .await
        .map_err(|source| Error::Hub {
            action: "list ShortcutConnections (is the CRD installed?)".to_owned(),
            source,
        })?;
    let (leaf_watches, leaf_changes) = LeafWatches::new();
    let ctx = Arc::new(
        Context::new(client.clone(), Arc::new(SecretKubeconfigs::new(client)))
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
        .graceful_shutdown_on(crate::shutdown::signal())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(shortcut = %object, "reconciled"),
                Err(error) => tracing::debug!("{error}"),
            }
        })
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets_on_success() {
        let intervals = Intervals {
            backoff_base: Duration::from_secs(5),
            backoff_max: Duration::from_secs(30),
            ..Intervals::default()
        };
        let backoff = Backoff::default();
        let seconds: Vec<u64> = (0..5)
            .map(|_| backoff.next("ns/a", &intervals).as_secs())
            .collect();
        assert_eq!(seconds, [5, 10, 20, 30, 30]);
        assert_eq!(
            backoff.next("ns/b", &intervals).as_secs(),
            5,
            "shortcuts back off independently"
        );
        backoff.reset("ns/a");
        assert_eq!(backoff.next("ns/a", &intervals).as_secs(), 5);
    }
}
