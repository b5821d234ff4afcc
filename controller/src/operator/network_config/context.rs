//! The NetworkConfig controller's [`Context`]: [`runtime::Context`] around the [`State`] its
//! reconcilers and the process's other loops share: the watch-fed caches, this cluster's
//! identity and settings, the IPAM (rebuilt from the API on start), the gateway connection
//! and the metrics.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use kubetun_crds::NetworkConfig;
use kubetun_crds::contract::link::{ROLE_LABEL, ROLE_REMOTE};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use crate::gateway_api::StatusResponse;
use crate::ipam::{Ipam, IpamConfig};
use crate::keys::GatewayKeys;
use crate::operator::network_config::cache::Cache;
use crate::operator::network_config::error::Error;
use crate::planner::{self, GatewaySettings};
use crate::plumbing::cluster_info::ClusterInfo;
use crate::plumbing::exports::ExportBoard;
use crate::plumbing::gateway_client::GatewayClient;
pub use crate::plumbing::runtime::FailureLabels;
use crate::plumbing::runtime::{self, ApiHealth, ReconcileError as _};

/// The NetworkConfig controller's name in metrics, logs and backoff keys.
pub(crate) const KIND: &str = "networkconfig";

/// Static configuration of one controller instance.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Namespace of every kubetun object of this cluster.
    pub namespace: String,
    /// What this cluster announces.
    pub cluster: ClusterInfo,
    /// IPAM pools and extra reserved ranges (local CIDRs of `cluster` are added).
    pub ipam: IpamConfig,
    /// The local gateway's interface settings.
    pub gateway: GatewaySettings,
}

/// Labels of the per-controller counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `networkconfig`, `gateway`.
    pub controller: &'static str,
}

/// Controller metrics (`kubetun_controller_*`).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Reconciliations run.
    pub reconciliations: Family<ControllerLabels, Counter>,
    /// Reconciliations that failed, by error class.
    pub failures: Family<FailureLabels, Counter>,
    /// Desired states pushed to the gateway.
    pub gateway_applies: Counter,
    /// Desired states the gateway refused.
    pub gateway_rejections: Counter,
}

impl Metrics {
    /// Registers every metric under `kubetun_controller`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("kubetun_controller");
        sub.register(
            "reconciliations",
            "Reconciliations run",
            self.reconciliations.clone(),
        );
        sub.register(
            "reconcile_failures",
            "Reconciliations that failed",
            self.failures.clone(),
        );
        sub.register(
            "gateway_applies",
            "Desired states pushed to the gateway",
            self.gateway_applies.clone(),
        );
        sub.register(
            "gateway_rejections",
            "Desired states the gateway refused",
            self.gateway_rejections.clone(),
        );
    }

    /// Counts one reconciliation.
    pub fn reconciled(&self, controller: &'static str) {
        self.reconciliations
            .get_or_create(&ControllerLabels { controller })
            .inc();
    }

    /// Counts one failure.
    pub fn failed(&self, controller: &'static str, error: &Error) {
        self.failures
            .get_or_create(&FailureLabels {
                controller,
                error: error.metric_label(),
            })
            .inc();
    }
}

/// What the NetworkConfig reconcilers, the gateway sync, the key rotation and the services
/// sync share besides [`runtime::Context`]'s parts.
pub struct State {
    /// Namespace of every kubetun object.
    pub namespace: String,
    /// What the reconcilers read: watch-fed while [`crate::operator::network_config::run`] runs.
    pub cache: Cache,
    /// This cluster's identity and CIDRs.
    pub cluster: ClusterInfo,
    /// The local gateway's interface settings; the keys change with a rotation.
    gateway_settings: RwLock<GatewaySettings>,
    /// The local gateway, if one is configured.
    pub gateway: Option<GatewayClient>,
    pub metrics: Metrics,
    /// This cluster's exports: published by the services operator, read by the gateway
    /// sync into the admissions.
    pub exports: ExportBoard,
    ipam: Mutex<Ipam>,
    gateway_status: Mutex<Option<StatusResponse>>,
    gateway_wakeup: Notify,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("namespace", &self.namespace)
            .field("cluster", &self.cluster.cluster)
            .field("gateway", &self.gateway)
            .finish_non_exhaustive()
    }
}

/// Everything a reconciler needs. Shared behind an `Arc`.
pub type Context = runtime::Context<State>;

impl Context {
    /// Builds the context and rebuilds the IPAM from the statuses of the processed `from-`
    /// NetworkConfigs (sorted by name), so every peer keeps its views across restarts.
    /// A status that cannot be restored is skipped; that peer is processed afresh.
    pub async fn new(
        client: kube::Client,
        config: ControllerConfig,
        gateway: Option<GatewayClient>,
    ) -> Result<Arc<Self>, Error> {
        let mut ipam_config = config.ipam;
        ipam_config.reserved.extend(config.cluster.local_ranges());
        let mut ipam = Ipam::new(ipam_config);

        let configs: Api<NetworkConfig> = Api::namespaced(client.clone(), &config.namespace);
        let mut remote = configs
            .list(&ListParams::default().labels(&format!("{ROLE_LABEL}={ROLE_REMOTE}")))
            .await?
            .items;
        remote.sort_by_key(|nc| nc.name_any());
        for nc in &remote {
            let Some(status) = &nc.status else { continue };
            match planner::restore_from_status(&mut ipam, &nc.spec, status) {
                Ok(true) => tracing::debug!(networkconfig = %nc.name_any(), "restored views"),
                Ok(false) => {}
                Err(error) => tracing::warn!(
                    networkconfig = %nc.name_any(), %error,
                    "persisted views cannot be restored; the peer will be processed again"
                ),
            }
        }
        let metrics = Metrics::default();
        let failures = metrics.failures.clone();
        let state = State {
            cache: Cache::new(client.clone(), config.namespace.clone()),
            namespace: config.namespace,
            cluster: config.cluster,
            gateway_settings: RwLock::new(config.gateway),
            gateway,
            metrics,
            exports: ExportBoard::default(),
            ipam: Mutex::new(ipam),
            gateway_status: Mutex::new(None),
            gateway_wakeup: Notify::new(),
        };
        let kind = KIND;
        Ok(Arc::new(
            Self::with_state(kind, client.clone(), ApiHealth::new(client), state)
                .counting_failures(failures),
        ))
    }
}

impl State {
    /// The IPAM. Never held across an `.await`.
    pub fn ipam(&self) -> MutexGuard<'_, Ipam> {
        self.ipam.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks the gateway sync to push the desired state again.
    pub fn wake_gateway_sync(&self) {
        self.gateway_wakeup.notify_one();
    }

    /// Resolves when [`Self::wake_gateway_sync`] was called (a call made while nobody waits
    /// is remembered).
    pub async fn gateway_sync_requested(&self) {
        self.gateway_wakeup.notified().await;
    }

    /// The local gateway's interface settings as of now.
    pub fn gateway_settings(&self) -> GatewaySettings {
        self.gateway_settings
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts `keys` into the gateway settings; true if they changed (the caller wakes the
    /// gateway sync).
    pub fn set_gateway_keys(&self, keys: &GatewayKeys) -> bool {
        let mut settings = self
            .gateway_settings
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let before = settings.clone();
        settings.set_keys(&keys.current, keys.previous.as_ref());
        *settings != before
    }

    /// The latest status the gateway reported, if any.
    pub fn gateway_status(&self) -> Option<StatusResponse> {
        self.gateway_status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records the latest gateway status (`None`: the gateway is unreachable).
    pub fn set_gateway_status(&self, status: Option<StatusResponse>) {
        *self
            .gateway_status
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = status;
    }
}
