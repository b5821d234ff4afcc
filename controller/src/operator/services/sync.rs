//! IO shell of services across clusters: watches this cluster's ServiceExports, Services,
//! EndpointSlices and TunnelEndpoints, and each linked cluster's ExportedServices (with the
//! credential `kubetun network connect` left in a Secret labelled [`CREDENTIAL_LABEL`]), and
//! after every change (debounced) brings the cluster to what the pure core says: this
//! cluster's ExportedServices and ServiceExport conditions, and its ServiceImports, derived
//! Services and imported EndpointSlices. Level-triggered: every pass computes everything from
//! the watched state, and writes only what differs from the last write.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource as _, ResourceExt as _};
use kubetun_crds::contract::services::{
    CONSUMERS_ANNOTATION, CREDENTIAL_KEY, CREDENTIAL_LABEL, KUBE_SERVICE_NAME_LABEL, MANAGED_BY,
    MANAGED_BY_LABEL, MANAGED_LABEL, identity_name,
};
use kubetun_crds::mcs::v1beta1::{ServiceExport, ServiceExportStatus, ServiceImport};
use kubetun_crds::{
    ClientIdentity, ClientSelector, ExportPolicy, ExportedService, ExportedServiceSpec,
    TunnelEndpoint,
};
use tokio::sync::Notify;

use super::desired::{AddressViews, DesiredImport, Source, desired_imports};

use super::dns_server::SharedTable;
use super::metrics::ServiceMetrics;
use super::offer::{ExportRequest, offer, offered_to};
use super::writes::{FIELD_MANAGER, apply_changed, delete, hash, key};
use crate::operator::network_config::context::Context;
use crate::planner::admission::Answers;
use crate::planner::{ExportEndpoints, PolicyPlan};
use crate::plumbing::exports::Exports;
use crate::plumbing::kubeconfig::peer_client;
use crate::plumbing::runtime::{self, ApiHealth};

/// Under churn, passes start at most this often (changes meanwhile make one pass).
const DEBOUNCE: Duration = Duration::from_millis(50);
/// After a quiet spell a change is acted on this soon: long enough for the rest of its
/// burst (one write seen by several watches) to arrive.
const SETTLE: Duration = Duration::from_millis(5);
/// How often every object is written again even without a change (the memory of what was
/// written does not see edits by others).
const RESYNC: Duration = Duration::from_secs(300);
/// How long a newly followed peer's first list may take before the peer counts as offering
/// nothing (its imports go).
const PEER_SYNC_WAIT: Duration = Duration::from_secs(30);
/// The wait before a failed pass is retried.
const RETRY: Duration = Duration::from_secs(1);

/// What this cluster watches of itself.
pub(super) struct Local {
    pub(super) exports: Store<ServiceExport>,
    pub(super) services: Store<Service>,
    pub(super) slices: Store<EndpointSlice>,
    pub(super) offered: Store<ExportedService>,
    pub(super) imports: Store<ServiceImport>,
    pub(super) imported_slices: Store<EndpointSlice>,
    pub(super) credentials: Store<Secret>,
    pub(super) tunnels: Store<TunnelEndpoint>,
    pub(super) namespaces: Store<Namespace>,
    /// ExportPolicies, and the answers this cluster gives; `None` where their CRDs are
    /// missing ([`policies_available`]).
    pub(super) policies: Option<Store<ExportPolicy>>,
    pub(super) answers: Option<Store<ClientIdentity>>,
}

/// A linked cluster's ExportedServices and its answer to this cluster's policies, watched
/// with its credential.
struct Peer {
    credential: u64,
    offers: Store<ExportedService>,
    answer: Option<Store<ClientIdentity>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    started: tokio::time::Instant,
}

impl Peer {
    /// Whether its first list arrived; after [`PEER_SYNC_WAIT`] without one, the peer counts
    /// as offering nothing.
    fn settled(&self) -> bool {
        ready(&self.offers) || self.started.elapsed() >= PEER_SYNC_WAIT
    }

    /// Whether its answer to this cluster's policies is known (or, after
    /// [`PEER_SYNC_WAIT`] without it, counts as empty).
    fn answered(&self) -> bool {
        self.answer.as_ref().is_none_or(ready) || self.started.elapsed() >= PEER_SYNC_WAIT
    }
}

/// Whether `store` holds its first full list.
fn ready<K: kube::Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> bool {
    store.wait_until_ready().now_or_never().is_some()
}

impl Drop for Peer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Whether this cluster serves the MCS API and kubetun's ExportedService (else services
/// across clusters stay off: watches of a missing resource would fail for ever). Says why
/// once, at INFO.
pub async fn available(ctx: &Context) -> bool {
    let probe = ListParams::default().limit(1);
    let exports = Api::<ServiceExport>::all(ctx.client.clone())
        .list(&probe)
        .await;
    let offered = Api::<ExportedService>::namespaced(ctx.client.clone(), &ctx.namespace)
        .list(&probe)
        .await;
    match (exports, offered) {
        (Ok(_), Ok(_)) => true,
        (Err(kube::Error::Api(s)), _) | (_, Err(kube::Error::Api(s))) if s.code == 404 => {
            tracing::info!(
                "services across clusters are off: the ServiceExport or ExportedService CRD is \
                 not installed (deploy/crds/multicluster.yaml, deploy/crds/kubetun.yaml)"
            );
            false
        }
        // Anything else (an outage) is the watches' to report; they retry.
        _ => true,
    }
}

/// Whether this cluster serves ExportPolicy and ClientIdentity (an install from before
/// them does not; policies stay off there and every exported Service stays open to its
/// consumers' pods). Says why once, at INFO.
pub(super) async fn policies_available(client: &kube::Client, namespace: &str) -> bool {
    let probe = ListParams::default().limit(1);
    let policies = Api::<ExportPolicy>::all(client.clone()).list(&probe).await;
    let answers = Api::<ClientIdentity>::namespaced(client.clone(), namespace)
        .list(&probe)
        .await;
    match (policies, answers) {
        (Err(kube::Error::Api(s)), _) | (_, Err(kube::Error::Api(s))) if s.code == 404 => {
            tracing::info!(
                "export policies are off: the ExportPolicy or ClientIdentity CRD is not \
                 installed (deploy/crds/kubetun.yaml)"
            );
            false
        }
        _ => true,
    }
}

/// What a pass found of the policies: the plans per offer (by offer name) and the invalid
/// policies with why.
#[derive(Default)]
pub(super) struct Plans {
    pub(super) by_offer: BTreeMap<String, Vec<PolicyPlan>>,
    pub(super) invalid: Vec<(Arc<ExportPolicy>, String)>,
}

/// Runs until the process stops, publishing what DNS answers into `dns`.
pub async fn run(ctx: Arc<Context>, dns: SharedTable, metrics: ServiceMetrics) {
    let changed = Arc::new(Notify::new());
    let client = &ctx.client;
    let ns = &ctx.namespace;
    let all = watcher::Config::default();
    let mut local = Local {
        exports: watch(Api::all(client.clone()), all.clone(), &ctx.health, &changed),
        services: watch(Api::all(client.clone()), all.clone(), &ctx.health, &changed),
        slices: watch(Api::all(client.clone()), all.clone(), &ctx.health, &changed),
        offered: watch(
            Api::namespaced(client.clone(), ns),
            all.clone(),
            &ctx.health,
            &changed,
        ),
        imports: watch(
            Api::all(client.clone()),
            all.clone().labels(&format!("{MANAGED_LABEL}={MANAGED_BY}")),
            &ctx.health,
            &changed,
        ),
        imported_slices: watch(
            Api::all(client.clone()),
            all.clone()
                .labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")),
            &ctx.health,
            &changed,
        ),
        credentials: watch(
            Api::namespaced(client.clone(), ns),
            all.clone().labels(CREDENTIAL_LABEL),
            &ctx.health,
            &changed,
        ),
        tunnels: watch(
            Api::namespaced(client.clone(), ns),
            all.clone(),
            &ctx.health,
            &changed,
        ),
        namespaces: watch(Api::all(client.clone()), all.clone(), &ctx.health, &changed),
        policies: None,
        answers: None,
    };
    if policies_available(client, ns).await {
        local.policies = Some(watch(
            Api::all(client.clone()),
            all.clone(),
            &ctx.health,
            &changed,
        ));
        local.answers = Some(watch(
            Api::namespaced(client.clone(), ns),
            all,
            &ctx.health,
            &changed,
        ));
    }
    let policy_stores = [
        local
            .policies
            .as_ref()
            .map(|s| s.wait_until_ready().boxed()),
        local.answers.as_ref().map(|s| s.wait_until_ready().boxed()),
    ];
    // Nothing is written before this cluster's own state is known.
    for ready in [
        local.exports.wait_until_ready().boxed(),
        local.services.wait_until_ready().boxed(),
        local.slices.wait_until_ready().boxed(),
        local.offered.wait_until_ready().boxed(),
        local.imports.wait_until_ready().boxed(),
        local.imported_slices.wait_until_ready().boxed(),
        local.credentials.wait_until_ready().boxed(),
        local.tunnels.wait_until_ready().boxed(),
        local.namespaces.wait_until_ready().boxed(),
    ]
    .into_iter()
    .chain(policy_stores.into_iter().flatten())
    {
        if ready.await.is_err() {
            return;
        }
    }
    let mut sync = Pass {
        metrics: metrics.clone(),
        ctx: ctx.clone(),
        local,
        peers: HashMap::new(),
        pods: None,
        written: HashMap::new(),
        cluster_ips: HashMap::new(),
        dns,
        changed: changed.clone(),
    };
    // The last failure logged: a failure repeating on every retry is logged once.
    let mut failing: Option<String> = None;
    let mut resynced = tokio::time::Instant::now();
    let mut last_pass: Option<tokio::time::Instant> = None;
    loop {
        // A change, or the periodic resync that also rewrites what someone else changed.
        let _ = tokio::time::timeout(RESYNC, changed.notified()).await;
        let woken = tokio::time::Instant::now();
        let earliest = last_pass.map_or(woken, |last| last + DEBOUNCE);
        tokio::time::sleep_until(earliest.max(woken + SETTLE)).await;
        last_pass = Some(tokio::time::Instant::now());
        if resynced.elapsed() >= RESYNC {
            sync.written.clear();
            resynced = tokio::time::Instant::now();
        }
        let result = sync.pass().await;
        metrics.pass_seconds.observe(woken.elapsed().as_secs_f64());
        match result {
            Ok(()) => {
                if failing.take().is_some() {
                    tracing::info!("services: in sync again");
                }
            }
            Err(error) => {
                let message = error.to_string();
                if !ctx.health.is_down() && failing.as_ref() != Some(&message) {
                    tracing::warn!(error = %message, "services: a write failed; retrying every second until it succeeds");
                }
                failing = Some(message);
                metrics.pass_failures.inc();
                tokio::time::sleep(RETRY).await;
                changed.notify_one();
            }
        }
    }
}

/// A reflector of `api` that wakes `changed` on every event (for the process's life).
fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    health: &ApiHealth,
    changed: &Arc<Notify>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    reflect(api, config, health, "services", changed).0
}

/// A reflector of `api` that wakes `changed` on every event, and its task.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    health: &ApiHealth,
    what: &'static str,
    changed: &Arc<Notify>,
) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let changed = changed.clone();
    let stream = runtime::watch(api, config, health, what).reflect(writer);
    let task = tokio::spawn(stream.for_each(move |_| {
        changed.notify_one();
        std::future::ready(())
    }));
    (reader, task)
}

pub(super) struct Pass {
    pub(super) metrics: ServiceMetrics,
    pub(super) ctx: Arc<Context>,
    pub(super) local: Local,
    peers: HashMap<String, Peer>,
    /// This cluster's pods, watched from the first time an exporter asks about them.
    pods: Option<Store<Pod>>,
    /// Hash of what was last written per object, so a pass writes only what changed.
    pub(super) written: HashMap<String, u64>,
    /// The ClusterIPs of the derived Services, by import.
    pub(super) cluster_ips: HashMap<(String, String), Vec<String>>,
    /// What the DNS server answers from.
    pub(super) dns: SharedTable,
    pub(super) changed: Arc<Notify>,
}

impl Pass {
    async fn pass(&mut self) -> Result<(), kube::Error> {
        let (offers, plans) = self.export().await?;
        self.follow_peers().await;
        // The gateway's admissions follow the offers (sorted by name: an unchanged world is
        // an unchanged list, and no Apply), guarded by their policies with the peers' answers.
        let exports: Vec<ExportEndpoints> = offers
            .iter()
            .map(|(name, offer)| {
                let mut endpoints = ExportEndpoints::of_offer(offer);
                endpoints.policies = plans.by_offer.get(name).cloned().unwrap_or_default();
                endpoints
            })
            .collect();
        let own_id = self.ctx.cluster.cluster.id.clone();
        let answers: Answers = self
            .peers
            .iter()
            .filter_map(|(id, peer)| {
                let answer = peer.answer.as_ref()?.state().into_iter().find(|a| {
                    a.name_any() == identity_name(&own_id) && a.spec.exporter == own_id
                })?;
                Some((id.clone(), answer.spec.clone()))
            })
            .collect();
        // A policy naming a peer whose answer has not arrived yet (a restart, a new link)
        // would admit none of its pods: the gateway keeps its last state until it arrives.
        let unanswered = self.peers.iter().any(|(id, peer)| {
            !peer.answered()
                && exports
                    .iter()
                    .flat_map(|e| &e.policies)
                    .any(|p| p.names(id))
        });
        if unanswered {
            self.retry_soon();
        } else {
            let published = Exports {
                endpoints: exports.clone(),
                answers: answers.clone(),
            };
            if self.ctx.exports.publish(published) {
                tracing::debug!(
                    offers = offers.len(),
                    "services: exports published to the gateway sync"
                );
            }
        }
        self.policy_status(&plans, &exports, &answers).await?;
        // Imports are computed from every peer's offers or not at all: a peer whose first list
        // has not arrived (a restart, a slow API server) would otherwise look like a peer that
        // exports nothing, and its imports would be deleted and made again.
        if !self.peers.values().all(Peer::settled) {
            self.retry_soon();
            return Ok(());
        }
        let tunnels: HashMap<String, AddressViews> = self
            .local
            .tunnels
            .state()
            .iter()
            .map(|te| (te.spec.cluster.id.clone(), AddressViews::of_peer(&te.spec)))
            .collect();
        let local_views = AddressViews::local();
        let peer_offers: Vec<(String, Vec<Arc<ExportedService>>)> = self
            .peers
            .iter()
            .map(|(id, peer)| (id.clone(), peer.offers.state()))
            .collect();
        let mut sources: Vec<Source<'_>> = offers
            .values()
            .map(|offer| Source {
                offer,
                views: &local_views,
            })
            .collect();
        let local_id = self.ctx.cluster.cluster.id.clone();
        for (id, offers) in &peer_offers {
            let Some(views) = tunnels.get(id) else {
                continue;
            };
            for offer in offers {
                // An export that names its consumers is imported by them only.
                if !offered_to(&offer.spec, &local_id) {
                    tracing::trace!(peer = %id, object = %offer.name_any(), "services: not a consumer of this offer");
                    continue;
                }
                // A cluster speaks for itself only, about the object it names.
                let named = format!("{}.{}", offer.spec.namespace, offer.spec.name);
                if offer.spec.cluster.id == *id && offer.name_any() == named {
                    sources.push(Source {
                        offer: &offer.spec,
                        views,
                    });
                } else {
                    tracing::debug!(peer = %id, object = %offer.name_any(), "services: ignored an offer that does not match its cluster or name");
                }
            }
        }
        let asked: BTreeMap<String, Vec<ClientSelector>> = peer_offers
            .iter()
            .map(|(id, offers)| {
                let selectors = offers
                    .iter()
                    .filter(|offer| {
                        offer.spec.cluster.id == *id && offered_to(&offer.spec, &local_id)
                    })
                    .flat_map(|offer| offer.spec.client_selectors.iter().cloned())
                    .filter(|s| s.clusters.contains(&local_id))
                    .collect();
                (id.clone(), selectors)
            })
            .collect();
        self.answer(asked).await?;
        let imports = desired_imports(&sources);
        self.metrics.exports.set(offers.len() as i64);
        self.metrics.peers.set(self.peers.len() as i64);
        self.conditions(&offers, &imports).await?;
        self.import(&imports).await
    }

    /// This cluster's offers: ExportedServices written for valid exports, removed for the
    /// rest; `Valid=False` conditions for the invalid ones. Returns the offers by name.
    async fn export(
        &mut self,
    ) -> Result<(BTreeMap<String, ExportedServiceSpec>, Plans), kube::Error> {
        let cluster = self.ctx.cluster.cluster.clone();
        // Indexed once per pass: the exports look their Service and slices up by name.
        let services: HashMap<(String, String), Arc<Service>> = self
            .local
            .services
            .state()
            .into_iter()
            .map(|s| ((s.namespace().unwrap_or_default(), s.name_any()), s))
            .collect();
        let mut slices: HashMap<(String, String), Vec<Arc<EndpointSlice>>> = HashMap::new();
        for slice in self.local.slices.state() {
            let labels = slice.labels();
            let imported = labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY);
            if let (false, Some(service)) = (imported, labels.get(KUBE_SERVICE_NAME_LABEL)) {
                let key = (slice.namespace().unwrap_or_default(), service.clone());
                slices.entry(key).or_default().push(slice);
            }
        }
        let mut offers = BTreeMap::new();
        let mut plans = Plans::default();
        for export in self.local.exports.state() {
            let namespace = export.namespace().unwrap_or_default();
            let name = export.name_any();
            if export.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let key = (namespace.clone(), name.clone());
            let service = services.get(&key);
            let own_slices: Vec<&EndpointSlice> = slices
                .get(&key)
                .into_iter()
                .flatten()
                .map(AsRef::as_ref)
                .collect();
            let request = ExportRequest {
                namespace: namespace.clone(),
                name: name.clone(),
                created: export.metadata.creation_timestamp.clone(),
                labels: export.spec.exported_labels.clone(),
                annotations: export.spec.exported_annotations.clone(),
                consumers: export.annotations().get(CONSUMERS_ANNOTATION).cloned(),
            };
            match offer(&cluster, &request, service.map(AsRef::as_ref), &own_slices) {
                Ok(mut spec) => {
                    let offer_name = format!("{namespace}.{name}");
                    self.guard(&offer_name, &mut spec, &mut plans);
                    offers.insert(offer_name, spec);
                }
                Err(invalid) => {
                    let conditions = vec![
                        condition("Valid", "False", invalid.reason, &invalid.message),
                        condition("Ready", "False", "Pending", "not exported while invalid"),
                    ];
                    self.export_status(&namespace, &name, conditions).await?;
                }
            }
        }
        let api: Api<ExportedService> =
            Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace);
        for (name, spec) in &offers {
            let object = ExportedService::new(name, spec.clone());
            self.apply(&api, name, &object).await?;
        }
        for stale in self.local.offered.state() {
            if !offers.contains_key(&stale.name_any()) {
                delete(&api, &stale.name_any()).await?;
                self.written
                    .remove(&key::<ExportedService>("", &stale.name_any()));
            }
        }
        Ok((offers, plans))
    }

    /// `Valid`, `Ready` and `Conflict` of this cluster's valid exports.
    async fn conditions(
        &mut self,
        offers: &BTreeMap<String, ExportedServiceSpec>,
        imports: &[DesiredImport],
    ) -> Result<(), kube::Error> {
        for offer in offers.values() {
            let import = imports
                .iter()
                .find(|i| i.namespace == offer.namespace && i.name == offer.name);
            // Every constituent export reports the set's conflicts (KEP-1645).
            let conflict = match import.and_then(|i| Some((i.merged.conflict_reason()?, i))) {
                Some((reason, import)) => condition(
                    "Conflict",
                    "True",
                    &reason,
                    &import
                        .merged
                        .conflicts
                        .iter()
                        .map(|c| c.message.as_str())
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                None => condition(
                    "Conflict",
                    "False",
                    "NoConflicts",
                    "no conflicts with other exports",
                ),
            };
            let clusters = import
                .map(|i| i.merged.clusters.join(", "))
                .unwrap_or_default();
            let to = match &offer.consumers {
                Some(consumers) => format!("offered to {} only", consumers.join(", ")),
                None => "offered to the linked clusters".to_owned(),
            };
            let conditions = vec![
                condition("Valid", "True", "Valid", "the Service is exported"),
                condition(
                    "Ready",
                    "True",
                    "Exported",
                    &format!("{to}; exported by {clusters}"),
                ),
                conflict,
            ];
            self.export_status(&offer.namespace, &offer.name, conditions)
                .await?;
        }
        Ok(())
    }

    async fn export_status(
        &mut self,
        namespace: &str,
        name: &str,
        mut conditions: Vec<Condition>,
    ) -> Result<(), kube::Error> {
        let key = format!("ServiceExport/status/{namespace}/{name}");
        let digest = hash(
            &conditions
                .iter()
                .map(|c| (&c.type_, &c.status, &c.reason, &c.message))
                .collect::<Vec<_>>(),
        );
        if self.written.get(&key) == Some(&digest) {
            return Ok(());
        }
        // Keep the transition time of a condition whose status did not change.
        let export = self
            .local
            .exports
            .state()
            .into_iter()
            .find(|e| e.namespace().as_deref() == Some(namespace) && e.name_any() == name);
        let old = export
            .as_ref()
            .and_then(|e| e.status.clone())
            .unwrap_or_default();
        // An Event when a problem appears or changes (not when the same one is written again,
        // e.g. after a restart).
        let problem = conditions.iter().find(|c| {
            (c.type_ == "Conflict" && c.status == "True")
                || (c.type_ == "Valid" && c.status == "False")
        });
        if let (Some(problem), Some(export)) = (problem, &export) {
            let known = old.conditions.iter().any(|o| {
                o.type_ == problem.type_
                    && o.status == problem.status
                    && o.message == problem.message
            });
            if !known {
                crate::plumbing::events::warn(
                    &self.ctx.client,
                    &export.object_ref(&()),
                    &problem.reason,
                    "Export",
                    &problem.message,
                )
                .await;
            }
        }
        for c in &mut conditions {
            if let Some(before) = old
                .conditions
                .iter()
                .find(|o| o.type_ == c.type_ && o.status == c.status)
            {
                c.last_transition_time = before.last_transition_time.clone();
            }
            c.observed_generation = None;
        }
        let api: Api<ServiceExport> = Api::namespaced(self.ctx.client.clone(), namespace);
        match runtime::apply_status(
            &api,
            name,
            FIELD_MANAGER,
            &ServiceExportStatus { conditions },
        )
        .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
        self.written.insert(key, digest);
        Ok(())
    }

    /// Starts a watch of every linked cluster with a credential, stops the others.
    async fn follow_peers(&mut self) {
        let linked: Vec<String> = self
            .local
            .tunnels
            .state()
            .iter()
            .map(|te| te.spec.cluster.id.clone())
            .collect();
        let mut credentials: HashMap<String, Vec<u8>> = HashMap::new();
        for secret in self.local.credentials.state() {
            let Some(peer) = secret.labels().get(CREDENTIAL_LABEL) else {
                continue;
            };
            if let Some(kubeconfig) = secret.data.as_ref().and_then(|d| d.get(CREDENTIAL_KEY)) {
                credentials.insert(peer.clone(), kubeconfig.0.clone());
            }
        }
        self.peers.retain(|id, peer| {
            linked.contains(id) && credentials.get(id).map(hash) == Some(peer.credential)
        });
        for id in linked {
            if self.peers.contains_key(&id) {
                continue;
            }
            let Some(kubeconfig) = credentials.get(&id) else {
                continue;
            };
            match peer_client(kubeconfig).await {
                Ok(client) => {
                    let health = ApiHealth::new(client.clone());
                    // The exporter's kubetun namespace is the credential's context namespace.
                    let (offers, offers_task) = reflect(
                        Api::<ExportedService>::default_namespaced(client.clone()),
                        watcher::Config::default(),
                        &health,
                        "peer ExportedServices",
                        &self.changed,
                    );
                    let mut tasks = vec![offers_task];
                    // The peer's answer to this cluster: the one object its credential reads.
                    let answer = self.local.policies.is_some().then(|| {
                        let name = identity_name(&self.ctx.cluster.cluster.id);
                        let (answer, task) = reflect(
                            Api::<ClientIdentity>::default_namespaced(client),
                            watcher::Config::default().fields(&format!("metadata.name={name}")),
                            &health,
                            "peer ClientIdentity",
                            &self.changed,
                        );
                        tasks.push(task);
                        answer
                    });
                    tracing::info!(peer = %id, "services: following the peer's exports");
                    self.peers.insert(
                        id,
                        Peer {
                            credential: hash(kubeconfig),
                            offers,
                            answer,
                            tasks,
                            started: tokio::time::Instant::now(),
                        },
                    );
                }
                // The error names what is wrong, never the kubeconfig's contents.
                Err(error) => {
                    tracing::warn!(peer = %id, %error, "services: the peer's credential is not usable")
                }
            }
        }
    }

    /// Wakes another pass after [`RETRY`] (a peer's first list may arrive without an event
    /// this pass would see).
    fn retry_soon(&self) {
        let changed = self.changed.clone();
        tokio::spawn(async move {
            tokio::time::sleep(RETRY).await;
            changed.notify_one();
        });
    }

    /// This cluster's pods once their first list arrived; starts their watch the first
    /// time (and returns `None` until then: the list wakes a pass).
    pub(super) fn pods(&mut self) -> Option<&Store<Pod>> {
        if self.pods.is_none() {
            tracing::info!(
                "services: a linked cluster's policies ask about this cluster's pods; watching them"
            );
            self.pods = Some(watch(
                Api::all(self.ctx.client.clone()),
                watcher::Config::default(),
                &self.ctx.health,
                &self.changed,
            ));
        }
        self.pods.as_ref().filter(|store| ready(store))
    }

    /// Server-side applies `object` unless it is what was last written.
    pub(super) async fn apply<K>(
        &mut self,
        api: &Api<K>,
        name: &str,
        object: &K,
    ) -> Result<(), kube::Error>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        if let Some((key, digest)) = apply_changed(api, name, object, &self.written).await? {
            self.written.insert(key, digest);
        }
        Ok(())
    }
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ),
        observed_generation: None,
    }
}
