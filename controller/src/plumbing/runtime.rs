//! What every reconciler of the controller shares: how it watches, backs off, writes status
//! and stops.
//!
//! - [`watch`]: a watch stream with a per-stream backoff ([`WatchBackoff`], 100 ms doubling
//!   to 1 s) whose errors are reported to [`ApiHealth`] and kept out of the controller.
//!   kube-runtime's default puts one client-go style backoff (0.8 s doubling to 30 s) on
//!   the *merged* trigger streams of a controller, so after an API-server restart every
//!   stream's error (connection refused, then `410 Gone` on resume) grows one shared delay
//!   and the controller stayed blind for over a minute. Here each stream retries on its own,
//!   a relist follows a `410` at once, and the controller never sees a watch error.
//! - [`controller`]: a kube-runtime `Controller` fed by [`watch`].
//! - [`ApiHealth`]: one info line when the API server becomes unreachable, one when it is
//!   back (with the outage's length), nothing per retry above debug; a gauge for alerts.
//! - [`Context`]: what every controller's reconcile and error policy get: the client, the
//!   controller's kind, its [`ErrorBackoff`], the [`ApiHealth`], a recorder and a clock,
//!   around the controller's own state.
//! - [`error_policy`]: the one `error_policy` of every controller (back off, log); the
//!   error type says whether a failure is transient and how it is labelled
//!   ([`ReconcileError`]).
//! - [`ErrorBackoff`]: per-object exponential requeue delays for [`error_policy`].
//! - [`apply_status`]: server-side apply of a status subresource under one field manager.

use std::collections::HashMap;
use std::fmt::Debug;
use std::ops::Deref;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt as _, future};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector;
use kube::runtime::utils::Backoff;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource, ResourceExt as _};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Field manager of everything the controller process writes.
pub const FIELD_MANAGER: &str = "kubetun-controller";

/// Delay of the first retry of a failed watch.
pub const WATCH_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest delay between retries of a failed watch: what a change made right after an
/// API-server restart may wait at most, on top of the relist.
pub const WATCH_RETRY_MAX: Duration = Duration::from_secs(1);

/// Exponential backoff with full jitter between [`WATCH_RETRY_MIN`] and
/// [`WATCH_RETRY_MAX`], reset by the first event after an error.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
    seed: u64,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        Self {
            next: WATCH_RETRY_MIN,
            seed,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let ceiling = self.next;
        self.next = (self.next * 2).min(WATCH_RETRY_MAX);
        // xorshift: jitter only has to keep several watchers from retrying in lockstep.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let half = ceiling / 2;
        let spread = u64::try_from(half.as_micros()).unwrap_or(u64::MAX).max(1);
        Some(half + Duration::from_micros(self.seed % spread))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_RETRY_MIN;
    }
}

/// How long no watch may have failed before the outage is declared over: longer than the
/// longest retry delay, so a watch still failing has had the chance to say so. An API server
/// shutting down still answers some requests; one outage should read as one.
pub const SETTLE: Duration = Duration::from_millis(1500);
/// How often the API server is probed during an outage.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// Answers whether the API server responds (`GET /version` in the controller).
pub type Probe = Arc<dyn Fn() -> futures::future::BoxFuture<'static, bool> + Send + Sync>;

/// Whether the API server answers, logged once per outage: when the first watch fails, and
/// when the API server answers again and no watch has failed for [`SETTLE`]. A resumed watch
/// of a quiet resource delivers no event, so the end of an outage is probed, not inferred.
#[derive(Clone)]
pub struct ApiHealth {
    state: Arc<Mutex<HealthState>>,
    probe: Probe,
    /// 1 while reachable, 0 while not (`kubetun_controller_api_reachable`).
    reachable_gauge: prometheus_client::metrics::gauge::Gauge<i64, AtomicI64>,
}

impl Debug for ApiHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiHealth")
            .field("down", &self.is_down())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct HealthState {
    /// Since when the API server is considered unreachable; `None` while it is not.
    down_since: Option<tokio::time::Instant>,
    last_failure: Option<tokio::time::Instant>,
    failures: u64,
}

impl ApiHealth {
    /// Probes the end of an outage with `GET /version` through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self::with_probe(Arc::new(move || {
            let client = client.clone();
            Box::pin(async move { client.apiserver_version().await.is_ok() })
        }))
    }

    pub fn with_probe(probe: Probe) -> Self {
        let health = Self {
            state: Arc::default(),
            probe,
            reachable_gauge: Default::default(),
        };
        health.reachable_gauge.set(1);
        health
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watch `what` failed.
    pub fn failed(&self, what: &'static str, error: &watcher::Error) {
        if is_expired(error) {
            // Expected after a restart or a long disconnect: the watcher relists at once.
            tracing::debug!(watch = what, %error, "resourceVersion expired; relisting");
            return;
        }
        let mut state = self.lock();
        state.failures += 1;
        state.last_failure = Some(tokio::time::Instant::now());
        if state.down_since.is_some() {
            tracing::debug!(watch = what, %error, "watch still failing");
            return;
        }
        state.down_since = Some(tokio::time::Instant::now());
        drop(state);
        self.reachable_gauge.set(0);
        tracing::info!(
            watch = what,
            %error,
            retry_within = ?WATCH_RETRY_MAX,
            "API server unreachable or refusing the watches; reconciling paused until they resume"
        );
        let health = self.clone();
        tokio::spawn(async move { health.await_recovery().await });
    }

    async fn await_recovery(&self) {
        loop {
            tokio::time::sleep(PROBE_INTERVAL).await;
            let quiet = self
                .lock()
                .last_failure
                .is_none_or(|at| at.elapsed() >= SETTLE);
            if !quiet || !(self.probe)().await {
                continue;
            }
            let mut state = self.lock();
            if state.last_failure.is_some_and(|at| at.elapsed() < SETTLE) {
                continue;
            }
            if let Some(since) = state.down_since.take() {
                self.reachable_gauge.set(1);
                tracing::info!(
                    outage = ?since.elapsed(),
                    failed_attempts = state.failures,
                    "API server reachable again; watches resumed"
                );
                state.failures = 0;
            }
            return;
        }
    }

    /// True during an outage (reconcile errors are then expected, not news).
    pub fn is_down(&self) -> bool {
        self.lock().down_since.is_some()
    }

    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "kubetun_controller_api_reachable",
            "1 while the controller's watches reach the API server, 0 during an outage",
            self.reachable_gauge.clone(),
        );
    }
}

/// Whether a failed API request says the API server is away or starting (transport errors,
/// 5xx, 429) rather than that the request was wrong: such failures are retried quietly.
pub fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

fn is_expired(error: &watcher::Error) -> bool {
    use watcher::Error as E;
    match error {
        E::InitialListFailed(kube::Error::Api(s))
        | E::WatchStartFailed(kube::Error::Api(s))
        | E::WatchFailed(kube::Error::Api(s)) => s.code == 410,
        E::WatchError(s) => s.code == 410,
        _ => false,
    }
}

/// A watch of `api` that retries on its own ([`WatchBackoff`]), reports its errors to
/// `health` and yields only events.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    health: &ApiHealth,
    what: &'static str,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let health = health.clone();
    watcher(api, config)
        .backoff(WatchBackoff::default())
        .filter_map(move |event| {
            future::ready(match event {
                Ok(event) => Some(Ok(event)),
                Err(error) => {
                    health.failed(what, &error);
                    None
                }
            })
        })
}

/// A controller of `api`'s objects fed by [`watch`]; chain `owns_stream`/`watches_stream`
/// with more [`watch`]es, then `.graceful_shutdown_on(crate::plumbing::shutdown::signal())`.
pub fn controller<K>(
    api: Api<K>,
    config: watcher::Config,
    health: &ApiHealth,
    what: &'static str,
) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let objects = watch(api, config, health, what)
        .reflect(writer)
        .applied_objects();
    Controller::for_stream(objects, reader)
}

/// Writes `status` with server-side apply on the status subresource.
pub async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    field_manager: &str,
    status: &impl Serialize,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&patch),
    )
    .await
}

/// Per-object exponential backoff for `error_policy`: each consecutive failure of the same
/// object doubles its requeue delay up to a cap; a successful reconcile resets it.
#[derive(Debug)]
pub struct ErrorBackoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl ErrorBackoff {
    /// Delays start at `base` and never exceed `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        let count = failures.entry(key.to_owned()).or_insert(0);
        let exponent = (*count).min(16);
        *count = count.saturating_add(1);
        self.base.saturating_mul(1u32 << exponent).min(self.max)
    }

    /// Forgets the failures of `key`.
    pub fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}

impl Default for ErrorBackoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(300))
    }
}

/// Returns the current time; injected so tests control it.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Labels of the failure counter (`kubetun_controller_reconcile_failures`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// Which reconciler failed.
    pub controller: &'static str,
    /// [`ReconcileError::metric_label`].
    pub error: &'static str,
}

/// What [`error_policy`] asks of a controller's error type.
pub trait ReconcileError: std::error::Error + 'static {
    /// The API server is away (see [`is_transient`]): each failed retry is logged at debug,
    /// since [`ApiHealth`] says so once.
    fn is_transient(&self) -> bool;

    /// A short stable label for the failure metric.
    fn metric_label(&self) -> &'static str;
}

/// What every controller's reconcile and [`error_policy`] get, shared behind an `Arc`: the
/// parts all controllers have, and the controller's own `state` (reached through `Deref`).
pub struct Context<S> {
    /// The controller's name in logs, metrics and backoff keys (`networkconfig`, `shortcut`).
    pub kind: &'static str,
    /// API client of the cluster whose objects the controller reconciles.
    pub client: kube::Client,
    /// Per-object requeue delays after failed reconciles.
    pub backoff: ErrorBackoff,
    /// Whether the API server answers (reconcile errors are expected while it does not). A
    /// context's own, which no watch reports to, is never down: share the process's.
    pub health: ApiHealth,
    /// Publishes the controller's Events ([`Self::publish`]); none without one (tests).
    pub recorder: Option<Recorder>,
    clock: Clock,
    /// Where failures are counted, if this controller's are.
    failures: Option<Family<FailureLabels, Counter>>,
    /// What only this controller needs.
    pub state: S,
}

impl<S: Debug> Debug for Context<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("kind", &self.kind)
            .field("backoff", &self.backoff)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<S> Deref for Context<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.state
    }
}

impl<S> Context<S> {
    /// The context of controller `kind`: the default [`ErrorBackoff`], no recorder, the
    /// system clock, failures not counted. `health` is the process's view of the API server
    /// (the one its watches report to; a test's own): no default, since a context with an
    /// [`ApiHealth`] nobody reports to would warn about every object during an outage.
    pub fn with_state(
        kind: &'static str,
        client: kube::Client,
        health: ApiHealth,
        state: S,
    ) -> Self {
        Self {
            kind,
            health,
            client,
            backoff: ErrorBackoff::default(),
            recorder: None,
            clock: Arc::new(Timestamp::now),
            failures: None,
            state,
        }
    }

    /// Replaces the per-object backoff.
    #[must_use]
    pub fn with_backoff(mut self, backoff: ErrorBackoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Publishes Events through `recorder`.
    #[must_use]
    pub fn with_recorder(mut self, recorder: Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Replaces the clock.
    #[must_use]
    pub fn with_clock(mut self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Counts failed reconciles in `failures` (by [`Self::kind`] and error label).
    #[must_use]
    pub fn counting_failures(mut self, failures: Family<FailureLabels, Counter>) -> Self {
        self.failures = Some(failures);
        self
    }

    /// The current time, for conditions.
    pub fn now(&self) -> Time {
        Time((self.clock)())
    }

    /// Publishes an Event about `regarding` through [`Self::recorder`], if any; best effort.
    /// The recorder folds Events with the same reason and action into one series that keeps
    /// the first note: a note that changes with the object goes through
    /// [`crate::plumbing::events::warn`] instead.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        if let Some(recorder) = &self.recorder {
            crate::plumbing::events::publish_with(recorder, regarding, type_, reason, action, note)
                .await;
        }
    }

    /// Forgets the failures of `object` after a successful reconcile.
    pub fn reconciled(&self, object: &impl Resource) {
        self.backoff
            .succeeded(&backoff_key(self.kind, &object_key(object)));
    }
}

/// The one `error_policy` of every controller: counts the failure where the context says so
/// ([`Context::counting_failures`]), backs off per object and logs the failure.
pub fn error_policy<K, E, S>(object: Arc<K>, error: &E, ctx: Arc<Context<S>>) -> Action
where
    K: Resource,
    E: ReconcileError,
{
    if let Some(failures) = &ctx.failures {
        let labels = FailureLabels {
            controller: ctx.kind,
            error: error.metric_label(),
        };
        failures.get_or_create(&labels).inc();
    }
    let failure = Failure {
        kind: ctx.kind,
        key: &object_key(&*object),
        error,
        transient: error.is_transient(),
    };
    requeue_failed(&failure, &ctx.backoff, Some(&ctx.health))
}

/// An object's backoff key and log field: `namespace/name`, or `name` when cluster-scoped.
pub fn object_key(object: &impl Resource) -> String {
    match object.namespace() {
        Some(namespace) => format!("{namespace}/{}", object.name_any()),
        None => object.name_any(),
    }
}

/// A failed reconcile, as [`error_policy`] reports it to [`requeue_failed`].
#[derive(Debug)]
struct Failure<'a> {
    /// The kind reconciled (`networkconfig`, `shortcut`, …), the log field's name.
    pub kind: &'static str,
    /// The object (`namespace/name` or `name`), also its backoff key.
    pub key: &'a str,
    /// What failed.
    pub error: &'a dyn std::error::Error,
    /// The error is the API server's being away (a connection refused, a timeout, a 5xx).
    pub transient: bool,
}

/// The core of [`error_policy`]: back off per object and log the failure, at `warn` unless
/// the API server is away or the error is transient, since [`ApiHealth`] says that once and
/// each failed retry is no news. The error's causes are in the line.
fn requeue_failed(
    failure: &Failure<'_>,
    backoff: &ErrorBackoff,
    health: Option<&ApiHealth>,
) -> Action {
    let delay = backoff.failed(&backoff_key(failure.kind, failure.key));
    let error = error_chain(failure.error);
    let (kind, key) = (failure.kind, failure.key);
    if failure.transient || health.is_some_and(ApiHealth::is_down) {
        tracing::debug!(kind, key, retry_in = ?delay, %error, "reconcile failed");
    } else {
        tracing::warn!(kind, key, retry_in = ?delay, %error, "reconcile failed");
    }
    Action::requeue(delay)
}

/// The [`ErrorBackoff`] key of object `key` of controller `kind`.
fn backoff_key(kind: &str, key: &str) -> String {
    format!("{kind}/{key}")
}

/// `error` and its causes on one line, each cause once (a cause whose text the line holds
/// already is left out).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requeue_failed_backs_off_per_object_until_reconciled() {
        let backoff = ErrorBackoff::new(Duration::from_secs(1), Duration::from_secs(4));
        let error = std::io::Error::other("boom");
        let failure = |key| Failure {
            kind: "networkconfig",
            key,
            error: &error,
            transient: false,
        };
        let requeues: Vec<Action> = (0..4)
            .map(|_| requeue_failed(&failure("a"), &backoff, None))
            .collect();
        let expected = [1, 2, 4, 4].map(|s| Action::requeue(Duration::from_secs(s)));
        assert_eq!(requeues, expected);
        assert_eq!(
            requeue_failed(&failure("b"), &backoff, None),
            Action::requeue(Duration::from_secs(1)),
            "objects back off independently"
        );
        backoff.succeeded(&backoff_key("networkconfig", "a"));
        assert_eq!(
            requeue_failed(&failure("a"), &backoff, None),
            Action::requeue(Duration::from_secs(1))
        );
    }

    #[derive(Debug, thiserror::Error)]
    #[error("boom")]
    struct Boom;

    impl ReconcileError for Boom {
        fn is_transient(&self) -> bool {
            false
        }

        fn metric_label(&self) -> &'static str {
            "boom"
        }
    }

    #[tokio::test]
    async fn error_policy_counts_where_told_and_backs_off_per_controller_and_object() {
        let client = kube_fake_client::ClientBuilder::new()
            .build()
            .await
            .expect("fake API server");
        let backoff = || ErrorBackoff::new(Duration::from_secs(1), Duration::from_secs(4));
        let failures = Family::<FailureLabels, Counter>::default();
        let counting = Arc::new(
            Context::with_state(
                "networkconfig",
                client.clone(),
                ApiHealth::new(client.clone()),
                (),
            )
            .with_backoff(backoff())
            .counting_failures(failures.clone()),
        );
        let quiet = Arc::new(
            Context::with_state("shortcut", client.clone(), ApiHealth::new(client), ())
                .with_backoff(backoff()),
        );
        let object = Arc::new(k8s_openapi::api::core::v1::ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("a".to_owned()),
                namespace: Some("ns".to_owned()),
                ..Default::default()
            },
            ..Default::default()
        });
        let requeue = |s| Action::requeue(Duration::from_secs(s));

        assert_eq!(
            error_policy(object.clone(), &Boom, counting.clone()),
            requeue(1)
        );
        assert_eq!(
            error_policy(object.clone(), &Boom, counting.clone()),
            requeue(2)
        );
        assert_eq!(
            error_policy(object.clone(), &Boom, quiet.clone()),
            requeue(1)
        );
        let labels = FailureLabels {
            controller: "networkconfig",
            error: "boom",
        };
        assert_eq!(failures.get_or_create(&labels).get(), 2, "only where told");
        counting.reconciled(&*object);
        assert_eq!(error_policy(object.clone(), &Boom, counting), requeue(1));
        assert_eq!(error_policy(object, &Boom, quiet), requeue(2));
    }

    #[test]
    fn watch_backoff_doubles_to_one_second_with_jitter_and_resets() {
        let mut backoff = WatchBackoff::default();
        let delays: Vec<Duration> = (0..8).map(|_| backoff.next().expect("endless")).collect();
        let ceilings = [100, 200, 400, 800, 1000, 1000, 1000, 1000];
        for (delay, ceiling) in delays.iter().zip(ceilings) {
            let ceiling = Duration::from_millis(ceiling);
            assert!(
                *delay >= ceiling / 2 && *delay <= ceiling,
                "{delay:?} vs {ceiling:?}"
            );
        }
        backoff.reset();
        assert!(backoff.next().expect("endless") <= WATCH_RETRY_MIN);
    }

    #[test]
    fn error_backoff_doubles_per_object_up_to_the_cap_and_resets_on_success() {
        let backoff = ErrorBackoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let delays: Vec<u64> = (0..5).map(|_| backoff.failed("a").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5]);
        assert_eq!(
            backoff.failed("b"),
            Duration::from_secs(1),
            "objects are independent"
        );
        backoff.succeeded("a");
        assert_eq!(backoff.failed("a"), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn health_announces_one_outage_until_the_server_answers_and_watches_settle() {
        let answering = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let probe_answering = answering.clone();
        let health = ApiHealth::with_probe(Arc::new(move || {
            let up = probe_answering.load(std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move { up })
        }));
        let gone = watcher::Error::WatchError(Box::new(
            kube::core::Status::failure("too old", "Expired").with_code(410),
        ));
        health.failed("a", &gone);
        assert!(!health.is_down(), "410 means relist, not an outage");
        let refused =
            watcher::Error::WatchStartFailed(kube::Error::Service("connection refused".into()));
        health.failed("a", &refused);
        health.failed("b", &refused);
        assert!(health.is_down());
        assert_eq!(health.reachable_gauge.get(), 0);
        tokio::time::sleep(SETTLE * 2).await;
        assert!(health.is_down(), "the server does not answer yet");
        answering.store(true, std::sync::atomic::Ordering::SeqCst);
        health.failed("a", &refused);
        tokio::time::sleep(SETTLE / 2).await;
        assert!(health.is_down(), "a watch failed less than SETTLE ago");
        tokio::time::sleep(SETTLE).await;
        assert!(!health.is_down());
        assert_eq!(health.reachable_gauge.get(), 1);
    }
}
