//! The connector: links two clusters by exchanging their NetworkConfigs, the same way for the
//! `kubetun network` CLI and the hub's ShortcutConnection operator.
//!
//! For clusters A and B it
//! 1. reads both [`ClusterInfo`]s (endpoint and MTU overrides applied),
//! 2. applies A's `to-<B>` NetworkConfig in A and its copy `from-<A>` in B (and the reverse),
//! 3. once B has processed `from-<A>` (its status maps A's CIDRs), mirrors that status onto
//!    A's `to-<B>`, so A's controller can build the TunnelEndpoint (and the reverse),
//! 4. reads both TunnelEndpoints' connection state.
//!
//! [`Connector::sync`] does one non-blocking pass of these steps (what a reconciler calls);
//! [`Connector::connect`] repeats it until the link is processed (and, with `wait`,
//! connected) or a deadline passes. Every write is preceded by a comparison, so a second run
//! changes nothing. Every object the connector makes carries [`MANAGED_BY_LABEL`] and
//! [`PEER_LABEL`]; [`Connector::disconnect`] and [`forget`] delete exactly those.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use kubetun_crds::{
    CidrMapping, ClusterRef, Condition, ConnectionStatus, Endpoint, NetworkConfig,
    NetworkConfigSpec, NetworkConfigStatus, TunnelEndpoint,
};
use tokio::time::Instant;

use crate::cluster_info::{ClusterInfo, ClusterInfoError};
use crate::conditions;
use crate::planner::{
    PEER_LABEL, ROLE_LABEL, ROLE_LOCAL, ROLE_REMOTE, local_config_name, remote_config_name,
    status_matches_spec,
};

/// Label marking every object the connector creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// [`MANAGED_BY_LABEL`] value of the connector.
pub const MANAGED_BY_CONNECTOR: &str = "kubetun-connector";
/// Field manager of the connector's writes.
pub const FIELD_MANAGER: &str = "kubetun-connector";
/// Annotation on the NetworkConfigs of a link a hub manages: `namespace/name` of the
/// ShortcutConnection on the hub.
pub const SHORTCUT_ANNOTATION: &str = "net.kubetun.io/shortcut";
/// Annotation naming the hub (its cluster id) next to [`SHORTCUT_ANNOTATION`].
pub const HUB_ANNOTATION: &str = "net.kubetun.io/hub";

/// Who manages a link besides whoever runs the connector: the hub's ShortcutConnection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkOwner {
    /// `namespace/name` of the ShortcutConnection on the hub.
    pub shortcut: String,
    /// The hub's cluster id.
    pub hub: String,
}

/// A connector failure. Every message names the cluster (its role and, once known, its id),
/// the object involved and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cluster info ConfigMap cannot be read.
    #[error("({cluster}) cannot read kubetun's cluster info in namespace {namespace}")]
    ClusterInfo {
        /// Role of the cluster (`local`, `remote`, a leaf name).
        cluster: String,
        /// Namespace searched.
        namespace: String,
        /// Why.
        #[source]
        source: ClusterInfoError,
    },
    /// Both handles point at the same cluster.
    #[error(
        "({local}) and ({remote}) are the same cluster {id:?}: pass the kubeconfig of two different clusters"
    )]
    SameCluster {
        /// Role of the first handle.
        local: String,
        /// Role of the second handle.
        remote: String,
        /// The shared cluster id.
        id: String,
    },
    /// An API call failed.
    #[error(
        "({cluster}, cluster {cluster_id}) cannot {action} {object} (check that the cluster is reachable \
         and the credentials may manage kubetun resources in that namespace)"
    )]
    Api {
        /// Role of the cluster.
        cluster: String,
        /// Id of the cluster.
        cluster_id: String,
        /// What was attempted (`get`, `apply`, `delete`, ...).
        action: &'static str,
        /// `Kind namespace/name`.
        object: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// An object the connector needs exists but someone else made it.
    #[error(
        "({cluster}, cluster {cluster_id}) {object} exists but was not created by the connector (label \
         {MANAGED_BY_LABEL}={MANAGED_BY_CONNECTOR} missing): delete it first if it is stale"
    )]
    NotManaged {
        /// Role of the cluster.
        cluster: String,
        /// Id of the cluster.
        cluster_id: String,
        /// `Kind namespace/name`.
        object: String,
    },
    /// The receiving controller refused a NetworkConfig.
    #[error("({cluster}, cluster {cluster_id}) rejected {object}: {reason}: {message}")]
    Rejected {
        /// Role of the receiving cluster.
        cluster: String,
        /// Id of the receiving cluster.
        cluster_id: String,
        /// `Kind namespace/name`.
        object: String,
        /// Condition reason.
        reason: String,
        /// Condition message.
        message: String,
    },
    /// A wait ran out of time.
    #[error(
        "({cluster}, cluster {cluster_id}) timed out after {timeout:?} waiting for {what} (last seen: {last}); \
         check that kubetun-controller runs in both clusters and that each gateway endpoint is reachable \
         from the other, or raise --timeout"
    )]
    Timeout {
        /// Role of the cluster waited on.
        cluster: String,
        /// Id of the cluster.
        cluster_id: String,
        /// What was awaited.
        what: String,
        /// The configured timeout.
        timeout: Duration,
        /// The last observed state.
        last: String,
    },
    /// `reset` could not clean any of the two clusters.
    #[error("nothing was reset: {0}")]
    NothingReset(String),
    /// Deleted objects are still there after the wait, held by finalizers.
    #[error(
        "({cluster}, cluster {cluster_id}) still terminating after {timeout:?}: {objects}; \
         deletion completes once kubetun-controller in that cluster runs and releases them \
         (run the command again to wait longer)"
    )]
    StillTerminating {
        /// Role of the cluster.
        cluster: String,
        /// Id of the cluster.
        cluster_id: String,
        /// Each object with the finalizers holding it.
        objects: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// A link a hub's ShortcutConnection manages would be broken by a direct disconnect.
    #[error(
        "({cluster}, cluster {cluster_id}) the link to {peer_id} belongs to ShortcutConnection \
         {shortcut} on hub {hub}: disconnecting here breaks that shortcut (its tunnels go down \
         and the hub's operator re-creates the link). Delete it on the hub (`kubetun shortcut \
         delete`), or pass --force to disconnect anyway"
    )]
    OwnedByShortcut {
        /// Role of the cluster where the link was found.
        cluster: String,
        /// Id of that cluster.
        cluster_id: String,
        /// The peer.
        peer_id: String,
        /// `namespace/name` of the ShortcutConnection on the hub.
        shortcut: String,
        /// The hub's cluster id.
        hub: String,
    },
}

/// `error` and its sources as one line, `: `-separated, skipping a source whose text the line
/// already holds (many errors repeat their source in their own message).
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

/// How the connector reaches one cluster.
#[derive(Clone)]
pub struct ClusterHandle {
    /// Role shown in progress lines and errors: `local`, `remote` or a leaf name.
    pub label: String,
    /// Client of the cluster.
    pub client: kube::Client,
    /// Namespace kubetun runs in on that cluster.
    pub namespace: String,
    /// Replaces the endpoint the cluster's gateway announces (NAT, port forwarding).
    pub endpoint_override: Option<Endpoint>,
}

impl fmt::Debug for ClusterHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterHandle")
            .field("label", &self.label)
            .field("namespace", &self.namespace)
            .field("endpoint_override", &self.endpoint_override)
            .finish_non_exhaustive()
    }
}

impl ClusterHandle {
    /// A handle without endpoint override.
    pub fn new(
        label: impl Into<String>,
        client: kube::Client,
        namespace: impl Into<String>,
    ) -> Self {
        Self {
            label: label.into(),
            client,
            namespace: namespace.into(),
            endpoint_override: None,
        }
    }

    /// Reads the cluster info and applies the endpoint override.
    pub async fn load_info(&self) -> Result<ClusterInfo, Error> {
        let mut info = ClusterInfo::load(&self.client, &self.namespace)
            .await
            .map_err(|source| Error::ClusterInfo {
                cluster: self.label.clone(),
                namespace: self.namespace.clone(),
                source,
            })?;
        if let Some(endpoint) = &self.endpoint_override {
            info.endpoint = endpoint.clone();
        }
        Ok(info)
    }

    fn configs(&self) -> Api<NetworkConfig> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn tunnels(&self) -> Api<TunnelEndpoint> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn object<K: Resource<DynamicType = ()>>(&self, name: &str) -> String {
        format!("{} {}/{name}", K::kind(&()), self.namespace)
    }

    fn api_error<K: Resource<DynamicType = ()>>(
        &self,
        cluster_id: &str,
        action: &'static str,
        name: &str,
    ) -> impl FnOnce(kube::Error) -> Error {
        let cluster = self.label.clone();
        let cluster_id = cluster_id.to_owned();
        let object = self.object::<K>(name);
        move |source| Error::Api {
            cluster,
            cluster_id,
            action,
            object,
            source,
        }
    }
}

/// Receives the connector's progress: the CLI prints it, the operator logs it.
///
/// A wait starts with [`waiting`](Self::waiting) and ends with [`waited`](Self::waited) or
/// [`failed`](Self::failed); [`done`](Self::done) steps may happen while a wait runs.
pub trait Progress: Send + Sync {
    /// A step on `cluster` completed (an object written, found up to date, deleted).
    fn done(&self, cluster: &str, message: &str);
    /// A wait on `cluster` begins.
    fn waiting(&self, cluster: &str, message: &str);
    /// The running wait on `cluster` ended well.
    fn waited(&self, cluster: &str, message: &str);
    /// The current step or wait on `cluster` failed.
    fn failed(&self, cluster: &str, message: &str);
}

/// Progress sink that emits `tracing` events.
#[derive(Debug, Default, Clone, Copy)]
pub struct TracingProgress;

impl Progress for TracingProgress {
    fn done(&self, cluster: &str, message: &str) {
        tracing::info!(cluster, "{message}");
    }
    fn waiting(&self, cluster: &str, message: &str) {
        tracing::debug!(cluster, "{message}");
    }
    fn waited(&self, cluster: &str, message: &str) {
        tracing::info!(cluster, "{message}");
    }
    fn failed(&self, cluster: &str, message: &str) {
        tracing::warn!(cluster, "{message}");
    }
}

/// How one cluster sees the other and the state of its tunnel towards it.
#[derive(Debug, Clone, PartialEq)]
pub struct Direction {
    /// Role of the viewing cluster.
    pub from_label: String,
    /// The viewing cluster.
    pub from: ClusterRef,
    /// The viewed cluster.
    pub to: ClusterRef,
    /// `from` has mapped `to`'s CIDRs for the current spec.
    pub processed: bool,
    /// `to`'s pod CIDRs as `from` sees them (from the TunnelEndpoint when it is current).
    pub pod_cidrs: Vec<CidrMapping>,
    /// `to`'s external CIDRs as `from` sees them.
    pub external_cidrs: Vec<CidrMapping>,
    /// `from`'s TunnelEndpoint towards `to` exists, matches the current NetworkConfigs and
    /// has a status for its current spec.
    pub tunnel_endpoint: bool,
    /// Connection state of `from`'s TunnelEndpoint.
    pub connection: Option<ConnectionStatus>,
    /// `from`'s `Processed=False` condition, when it refused `to`'s NetworkConfig.
    pub rejection: Option<Condition>,
}

impl Direction {
    /// True when `from`'s tunnel reports Connected.
    pub fn is_connected(&self) -> bool {
        self.connection
            .as_ref()
            .is_some_and(|c| c.status == kubetun_crds::ConnectionState::Connected)
    }

    fn describe(&self) -> String {
        if let Some(rejection) = &self.rejection {
            return format!("rejected: {}: {}", rejection.reason, rejection.message);
        }
        if !self.processed {
            return "NetworkConfig not processed".to_owned();
        }
        match &self.connection {
            None if !self.tunnel_endpoint => "no up-to-date TunnelEndpoint yet".to_owned(),
            None => "the gateway has not reported the tunnel yet".to_owned(),
            Some(c) if c.message.is_empty() => c.status.to_string(),
            Some(c) => format!("{}: {}", c.status, c.message),
        }
    }
}

/// The link as observed by one [`Connector::sync`] pass.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkState {
    /// The local cluster's info (overrides applied).
    pub local: ClusterInfo,
    /// The remote cluster's info (overrides applied).
    pub remote: ClusterInfo,
    /// How local sees remote.
    pub local_to_remote: Direction,
    /// How remote sees local.
    pub remote_to_local: Direction,
    /// Objects created or changed by the pass.
    pub writes: usize,
}

impl LinkState {
    /// Both clusters have mapped each other's CIDRs.
    pub fn is_processed(&self) -> bool {
        self.local_to_remote.processed && self.remote_to_local.processed
    }

    /// Both tunnels report Connected.
    pub fn is_connected(&self) -> bool {
        self.local_to_remote.is_connected() && self.remote_to_local.is_connected()
    }

    /// Both directions, local first.
    pub fn directions(&self) -> [&Direction; 2] {
        [&self.local_to_remote, &self.remote_to_local]
    }
}

/// Bounds of [`Connector::connect`] and [`Connector::disconnect`].
#[derive(Debug, Clone, Copy)]
pub struct WaitOptions {
    /// Also wait for both tunnels to connect (connect) or both TunnelEndpoints to go (disconnect).
    pub wait: bool,
    /// Upper bound of the whole operation.
    pub timeout: Duration,
    /// Pause between two observations.
    pub poll_interval: Duration,
}

impl Default for WaitOptions {
    fn default() -> Self {
        Self {
            wait: false,
            timeout: Duration::from_secs(120),
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// What one side of a disconnect or reset deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// `Kind namespace/name` of every deleted object.
    pub objects: Vec<String>,
    /// The same objects as kind and name, for [`wait_removed`].
    pub deleted: Vec<(&'static str, String)>,
}

/// Links two clusters. `local` and `remote` are only names: the link is symmetric.
#[derive(Debug, Clone)]
pub struct Connector {
    local: ClusterHandle,
    remote: ClusterHandle,
    mtu: Option<u32>,
    owner: Option<LinkOwner>,
}

impl Connector {
    /// A connector between `local` and `remote`.
    pub fn new(local: ClusterHandle, remote: ClusterHandle) -> Self {
        Self {
            local,
            remote,
            mtu: None,
            owner: None,
        }
    }

    /// Marks the link's NetworkConfigs as managed by a hub's ShortcutConnection, so a direct
    /// `disconnect` on a leaf refuses to break it.
    #[must_use]
    pub fn with_owner(mut self, owner: Option<LinkOwner>) -> Self {
        self.owner = owner;
        self
    }

    /// Announces `mtu` on both sides instead of each cluster's own.
    #[must_use]
    pub fn with_mtu(mut self, mtu: Option<u32>) -> Self {
        self.mtu = mtu;
        self
    }

    /// The local handle.
    pub fn local(&self) -> &ClusterHandle {
        &self.local
    }

    /// The remote handle.
    pub fn remote(&self) -> &ClusterHandle {
        &self.remote
    }

    /// Reads both cluster infos (overrides applied) and checks they differ.
    pub async fn load_infos(&self) -> Result<(ClusterInfo, ClusterInfo), Error> {
        let (local, remote) = tokio::join!(self.local.load_info(), self.remote.load_info());
        let (mut local, mut remote) = (local?, remote?);
        if local.cluster.id == remote.cluster.id {
            return Err(Error::SameCluster {
                local: self.local.label.clone(),
                remote: self.remote.label.clone(),
                id: local.cluster.id,
            });
        }
        if let Some(mtu) = self.mtu {
            local.mtu = mtu;
            remote.mtu = mtu;
        }
        Ok((local, remote))
    }

    /// One pass: applies the four NetworkConfigs, mirrors processed statuses and reads both
    /// TunnelEndpoints. Writes only what differs from the desired state and reports only
    /// writes.
    pub async fn sync(&self, progress: &dyn Progress) -> Result<LinkState, Error> {
        self.pass(progress, false).await
    }

    /// [`sync`](Self::sync), also reporting the NetworkConfigs found up to date.
    async fn pass(
        &self,
        progress: &dyn Progress,
        report_unchanged: bool,
    ) -> Result<LinkState, Error> {
        let (local, remote) = self.load_infos().await?;
        let mut writes = 0;
        for (from, from_info, to, to_info) in [
            (&self.local, &local, &self.remote, &remote),
            (&self.remote, &remote, &self.local, &local),
        ] {
            let spec = from_info.network_config_for(&to_info.cluster);
            let outgoing = ConfigTarget {
                owner: self.owner.as_ref(),
                handle: from,
                cluster_id: &from_info.cluster.id,
                name: local_config_name(&to_info.cluster.id),
                role: ROLE_LOCAL,
                peer_id: &to_info.cluster.id,
            };
            writes += apply_config(outgoing, &spec, progress, report_unchanged).await?;
            let incoming = ConfigTarget {
                owner: self.owner.as_ref(),
                handle: to,
                cluster_id: &to_info.cluster.id,
                name: remote_config_name(&from_info.cluster.id),
                role: ROLE_REMOTE,
                peer_id: &from_info.cluster.id,
            };
            writes += apply_config(incoming, &spec, progress, report_unchanged).await?;
        }
        let remote_to_local = self
            .observe(
                &self.remote,
                &remote,
                &self.local,
                &local,
                progress,
                &mut writes,
            )
            .await?;
        let local_to_remote = self
            .observe(
                &self.local,
                &local,
                &self.remote,
                &remote,
                progress,
                &mut writes,
            )
            .await?;
        Ok(LinkState {
            local,
            remote,
            local_to_remote,
            remote_to_local,
            writes,
        })
    }

    /// How `viewer` sees `viewed`: reads `viewer`'s `from-<viewed>`, mirrors its status onto
    /// `viewed`'s `to-<viewer>` once processed, and reads `viewer`'s TunnelEndpoint.
    async fn observe(
        &self,
        viewer: &ClusterHandle,
        viewer_info: &ClusterInfo,
        viewed: &ClusterHandle,
        viewed_info: &ClusterInfo,
        progress: &dyn Progress,
        writes: &mut usize,
    ) -> Result<Direction, Error> {
        let viewer_id = &viewer_info.cluster.id;
        let viewed_id = &viewed_info.cluster.id;
        let incoming_name = remote_config_name(viewed_id);
        let incoming = viewer
            .configs()
            .get_opt(&incoming_name)
            .await
            .map_err(viewer.api_error::<NetworkConfig>(viewer_id, "get", &incoming_name))?;
        let processed_status = incoming.as_ref().and_then(current_processed_status);
        let rejection = incoming.as_ref().and_then(current_rejection);

        if let Some(status) = &processed_status {
            *writes += mirror_status(
                viewed,
                viewed_id,
                &local_config_name(viewer_id),
                status,
                progress,
            )
            .await?;
        }

        let tunnel = viewer
            .tunnels()
            .get_opt(viewed_id)
            .await
            .map_err(viewer.api_error::<TunnelEndpoint>(viewer_id, "get", viewed_id))?
            .filter(|te| te.spec.cluster.id == *viewed_id);
        // A TunnelEndpoint built from an older NetworkConfig (or whose status predates its
        // spec) does not describe this link yet.
        let announced = incoming.as_ref().map(|nc| &nc.spec);
        let tunnel = tunnel.filter(|te| {
            let spec_current = announced.is_some_and(|spec| {
                te.spec.endpoint == spec.endpoint && te.spec.public_key == spec.public_key
            });
            let status_current = te.status.as_ref().is_some_and(|status| {
                status.observed_generation.is_none()
                    || status.observed_generation >= te.metadata.generation
            });
            spec_current && status_current
        });
        let (pod_cidrs, external_cidrs) = match (&tunnel, &processed_status) {
            (Some(te), _) => (
                te.spec.remote_pod_cidrs.clone(),
                te.spec.remote_external_cidrs.clone(),
            ),
            (None, Some(status)) => (status.pod_cidrs.clone(), status.external_cidrs.clone()),
            (None, None) => (Vec::new(), Vec::new()),
        };
        Ok(Direction {
            from_label: viewer.label.clone(),
            from: viewer_info.cluster.clone(),
            to: viewed_info.cluster.clone(),
            processed: processed_status.is_some(),
            pod_cidrs,
            external_cidrs,
            tunnel_endpoint: tunnel.is_some(),
            connection: tunnel.and_then(|te| te.status).and_then(|s| s.connection),
            rejection,
        })
    }

    /// Links the clusters: repeats [`sync`](Self::sync) until both NetworkConfigs are
    /// processed and, with `options.wait`, both tunnels are connected. Fails fast when a
    /// cluster rejects a NetworkConfig.
    pub async fn connect(
        &self,
        options: WaitOptions,
        progress: &dyn Progress,
    ) -> Result<LinkState, Error> {
        let deadline = Instant::now() + options.timeout;
        let mut state = self.pass(progress, true).await?;
        let directions = [
            (Side::Remote, "to process our NetworkConfig"),
            (Side::Local, "to process the remote NetworkConfig"),
        ];
        for (side, what) in directions {
            let handle = self.handle(side);
            let message = format!("waiting {what}");
            progress.waiting(&handle.label, &message);
            loop {
                let direction = side.viewing(&state);
                if let Some(rejection) = &direction.rejection {
                    let error = Error::Rejected {
                        cluster: handle.label.clone(),
                        cluster_id: direction.from.id.clone(),
                        object: handle
                            .object::<NetworkConfig>(&remote_config_name(&direction.to.id)),
                        reason: rejection.reason.clone(),
                        message: rejection.message.clone(),
                    };
                    progress.failed(&handle.label, &error_chain(&error));
                    return Err(error);
                }
                if direction.processed {
                    progress.waited(
                        &handle.label,
                        &format!("processed: {}", describe_views(direction)),
                    );
                    break;
                }
                state = self
                    .next_pass(&state, side, &message, deadline, options, progress)
                    .await?;
            }
        }
        if !options.wait {
            return Ok(state);
        }
        for side in [Side::Local, Side::Remote] {
            let handle = self.handle(side);
            let message = format!(
                "waiting for the tunnel to {} to connect",
                side.viewing(&state).to.id
            );
            progress.waiting(&handle.label, &message);
            while !side.viewing(&state).is_connected() {
                state = self
                    .next_pass(&state, side, &message, deadline, options, progress)
                    .await?;
            }
            let latency = side
                .viewing(&state)
                .connection
                .as_ref()
                .and_then(|c| c.latency.clone())
                .map(|l| format!(" (latency {l})"))
                .unwrap_or_default();
            progress.waited(&handle.label, &format!("tunnel connected{latency}"));
        }
        Ok(state)
    }

    /// Sleeps one poll interval and runs the next pass, or fails when the deadline has passed.
    async fn next_pass(
        &self,
        state: &LinkState,
        side: Side,
        what: &str,
        deadline: Instant,
        options: WaitOptions,
        progress: &dyn Progress,
    ) -> Result<LinkState, Error> {
        if Instant::now() + options.poll_interval > deadline {
            let direction = side.viewing(state);
            let error = Error::Timeout {
                cluster: self.handle(side).label.clone(),
                cluster_id: direction.from.id.clone(),
                what: what.trim_start_matches("waiting ").to_owned(),
                timeout: options.timeout,
                last: direction.describe(),
            };
            progress.failed(&self.handle(side).label, &error_chain(&error));
            return Err(error);
        }
        tokio::time::sleep(options.poll_interval).await;
        self.sync(progress).await
    }

    fn handle(&self, side: Side) -> &ClusterHandle {
        match side {
            Side::Local => &self.local,
            Side::Remote => &self.remote,
        }
    }

    /// Removes the link: deletes, on both clusters, the NetworkConfigs the connector made for
    /// the other one. With `options.wait`, waits until both controllers have removed their
    /// TunnelEndpoint.
    pub async fn disconnect(
        &self,
        options: WaitOptions,
        progress: &dyn Progress,
    ) -> Result<[Removed; 2], Error> {
        let (local, remote) = self.load_infos().await?;
        let removed_local =
            remove_configs(&self.local, &local.cluster.id, &remote.cluster.id, progress).await?;
        let removed_remote = remove_configs(
            &self.remote,
            &remote.cluster.id,
            &local.cluster.id,
            progress,
        )
        .await?;
        if options.wait {
            let deadline = Instant::now() + options.timeout;
            for (handle, own, peer) in [
                (&self.local, &local, &remote),
                (&self.remote, &remote, &local),
            ] {
                let peer_id = &peer.cluster.id;
                let message = format!("waiting for TunnelEndpoint {peer_id} to be removed");
                progress.waiting(&handle.label, &message);
                loop {
                    let present = handle
                        .tunnels()
                        .get_opt(peer_id)
                        .await
                        .map_err(handle.api_error::<TunnelEndpoint>(
                            &own.cluster.id,
                            "get",
                            peer_id,
                        ))?
                        .is_some();
                    if !present {
                        progress
                            .waited(&handle.label, &format!("TunnelEndpoint {peer_id} removed"));
                        break;
                    }
                    if Instant::now() + options.poll_interval > deadline {
                        let error = Error::Timeout {
                            cluster: handle.label.clone(),
                            cluster_id: own.cluster.id.clone(),
                            what: format!("TunnelEndpoint {peer_id} to be removed"),
                            timeout: options.timeout,
                            last: "still present".to_owned(),
                        };
                        progress.failed(&handle.label, &error_chain(&error));
                        return Err(error);
                    }
                    tokio::time::sleep(options.poll_interval).await;
                }
            }
        }
        Ok([removed_local, removed_remote])
    }
}

/// Which handle of a connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Local,
    Remote,
}

impl Side {
    /// The direction this side views.
    fn viewing(self, state: &LinkState) -> &Direction {
        match self {
            Self::Local => &state.local_to_remote,
            Self::Remote => &state.remote_to_local,
        }
    }
}

/// Removes, on one cluster, everything the connector made for `peer_id` and the
/// TunnelEndpoint the controller built from it — for a peer that is gone or unreachable.
/// `cluster_id` only labels errors; pass the id if known, else the handle's label.
pub async fn forget(
    handle: &ClusterHandle,
    cluster_id: &str,
    peer_id: &str,
    progress: &dyn Progress,
) -> Result<Removed, Error> {
    let mut removed = remove_configs(handle, cluster_id, peer_id, progress).await?;
    let tunnels = handle.tunnels();
    let stale = tunnels
        .get_opt(peer_id)
        .await
        .map_err(handle.api_error::<TunnelEndpoint>(cluster_id, "get", peer_id))?;
    if stale.is_some_and(|te| te.spec.cluster.id == peer_id) {
        delete_ignoring_missing(&tunnels, peer_id)
            .await
            .map_err(handle.api_error::<TunnelEndpoint>(cluster_id, "delete", peer_id))?;
        let object = handle.object::<TunnelEndpoint>(peer_id);
        progress.done(&handle.label, &format!("deletion of {object} requested"));
        removed.objects.push(object);
        removed.deleted.push(("TunnelEndpoint", peer_id.to_owned()));
    }
    Ok(removed)
}

/// Disconnects and forgets: cleans every reachable side even when the other one is not.
/// `peer_ids` gives each side's peer id when the other cluster's info cannot be read
/// (`[id the local cluster knows the remote by, id the remote knows the local by]`).
pub async fn reset(
    local: &ClusterHandle,
    remote: &ClusterHandle,
    peer_ids: [Option<&str>; 2],
    progress: &dyn Progress,
) -> Result<[Option<Removed>; 2], Error> {
    let (local_info, remote_info) = tokio::join!(local.load_info(), remote.load_info());
    let mut problems = Vec::new();
    let mut result = [None, None];
    let sides = [
        (local, &local_info, &remote_info, peer_ids[0]),
        (remote, &remote_info, &local_info, peer_ids[1]),
    ];
    for (slot, (handle, own, peer, fallback_peer)) in result.iter_mut().zip(sides) {
        let own_id = match own {
            Ok(info) => info.cluster.id.clone(),
            Err(error) => {
                let message = error_chain(error);
                progress.failed(&handle.label, &format!("skipped: {message}"));
                problems.push(message);
                continue;
            }
        };
        let Some(peer_id) = peer
            .as_ref()
            .map(|info| info.cluster.id.clone())
            .ok()
            .or(fallback_peer.map(str::to_owned))
        else {
            // The flag of `kubetun network reset` that supplies this side's peer id.
            let flag = if std::ptr::eq(handle, local) {
                "--remote-cluster-id"
            } else {
                "--local-cluster-id"
            };
            let message = format!(
                "skipped: the peer's cluster id is unknown (its cluster info cannot be read); \
                 pass it with {flag}"
            );
            progress.failed(&handle.label, &message);
            problems.push(format!("({}) {message}", handle.label));
            continue;
        };
        match forget(handle, &own_id, &peer_id, progress).await {
            Ok(removed) => *slot = Some(removed),
            Err(error) => problems.push(error_chain(&error)),
        }
    }
    if result.iter().all(Option::is_none) {
        return Err(Error::NothingReset(problems.join("; ")));
    }
    Ok(result)
}

/// The NetworkConfig object the connector writes: spec plus identifying labels.
fn desired_config(
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
) -> Result<Option<LinkOwner>, Error> {
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

/// Waits until every object `removed` lists is gone from `handle` (finalizers done), or
/// fails after `timeout` naming what is left and the finalizers holding it.
pub async fn wait_removed(
    handle: &ClusterHandle,
    cluster_id: &str,
    removed: &Removed,
    options: WaitOptions,
    progress: &dyn Progress,
) -> Result<(), Error> {
    if removed.deleted.is_empty() {
        return Ok(());
    }
    let deadline = Instant::now() + options.timeout;
    progress.waiting(
        &handle.label,
        &format!(
            "waiting for {} object(s) to be removed",
            removed.deleted.len()
        ),
    );
    loop {
        let mut left = Vec::new();
        for (kind, name) in &removed.deleted {
            let finalizers = match *kind {
                "TunnelEndpoint" => handle
                    .tunnels()
                    .get_opt(name)
                    .await
                    .map_err(handle.api_error::<TunnelEndpoint>(cluster_id, "get", name))?
                    .map(|o| o.finalizers().to_vec()),
                _ => handle
                    .configs()
                    .get_opt(name)
                    .await
                    .map_err(handle.api_error::<NetworkConfig>(cluster_id, "get", name))?
                    .map(|o| o.finalizers().to_vec()),
            };
            if let Some(finalizers) = finalizers {
                let held = if finalizers.is_empty() {
                    "being deleted".to_owned()
                } else {
                    format!("finalizer {}", finalizers.join(", "))
                };
                left.push(format!("{kind} {}/{name} ({held})", handle.namespace));
            }
        }
        if left.is_empty() {
            progress.waited(
                &handle.label,
                &format!("removed {}", removed.objects.join(", ")),
            );
            return Ok(());
        }
        if Instant::now() + options.poll_interval > deadline {
            let error = Error::StillTerminating {
                cluster: handle.label.clone(),
                cluster_id: cluster_id.to_owned(),
                objects: left.join(", "),
                timeout: options.timeout,
            };
            progress.failed(
                &handle.label,
                &format!("still terminating: {}", left.join(", ")),
            );
            return Err(error);
        }
        tokio::time::sleep(options.poll_interval).await;
    }
}

fn connector_labels(role: &str, peer_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_CONNECTOR.to_owned()),
        (ROLE_LABEL.to_owned(), role.to_owned()),
        (PEER_LABEL.to_owned(), peer_id.to_owned()),
    ])
}

/// Where one NetworkConfig goes and who it is about.
struct ConfigTarget<'a> {
    owner: Option<&'a LinkOwner>,
    handle: &'a ClusterHandle,
    cluster_id: &'a str,
    name: String,
    role: &'static str,
    peer_id: &'a str,
}

/// Applies one NetworkConfig unless it already has the desired spec and labels. Returns the
/// number of writes (0 or 1).
async fn apply_config(
    target: ConfigTarget<'_>,
    spec: &NetworkConfigSpec,
    progress: &dyn Progress,
    report_unchanged: bool,
) -> Result<usize, Error> {
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
            return Err(Error::NotManaged {
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
    let mut desired = desired_config(name, &handle.namespace, role, peer_id, spec);
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

/// The status of a `from-` NetworkConfig when it is processed for its current spec.
fn current_processed_status(config: &NetworkConfig) -> Option<NetworkConfigStatus> {
    config
        .status
        .as_ref()
        .filter(|s| s.processed && status_matches_spec(&config.spec, s))
        .cloned()
}

/// The `Processed=False` condition of a NetworkConfig, when it describes the current spec.
fn current_rejection(config: &NetworkConfig) -> Option<Condition> {
    let status = config.status.as_ref()?;
    let condition = conditions::find(&status.conditions, conditions::PROCESSED)?;
    let current = match (condition.observed_generation, config.metadata.generation) {
        (Some(observed), Some(generation)) => observed == generation,
        _ => true,
    };
    (condition.status == "False" && current && !status.processed).then(|| condition.clone())
}

/// Copies the peer's processing of our NetworkConfig onto our `to-` NetworkConfig's status.
async fn mirror_status(
    handle: &ClusterHandle,
    cluster_id: &str,
    name: &str,
    processed: &NetworkConfigStatus,
    progress: &dyn Progress,
) -> Result<usize, Error> {
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

/// Deletes every NetworkConfig the connector made on `handle` for `peer_id`.
async fn remove_configs(
    handle: &ClusterHandle,
    cluster_id: &str,
    peer_id: &str,
    progress: &dyn Progress,
) -> Result<Removed, Error> {
    let api = handle.configs();
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_CONNECTOR},{PEER_LABEL}={peer_id}");
    let configs = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(handle.api_error::<NetworkConfig>(
            cluster_id,
            "list",
            &format!("-l {selector}"),
        ))?;
    let mut names: Vec<String> = configs.iter().map(ResourceExt::name_any).collect();
    names.sort();
    let mut removed = Removed::default();
    for name in names {
        delete_ignoring_missing(&api, &name)
            .await
            .map_err(handle.api_error::<NetworkConfig>(cluster_id, "delete", &name))?;
        let object = handle.object::<NetworkConfig>(&name);
        progress.done(&handle.label, &format!("deletion of {object} requested"));
        removed.objects.push(object);
        removed.deleted.push(("NetworkConfig", name));
    }
    if removed.objects.is_empty() {
        progress.done(
            &handle.label,
            &format!("no NetworkConfig for {peer_id} to delete"),
        );
    }
    Ok(removed)
}

async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(error) => Err(error),
    }
}

/// `real → view` pairs of a direction, remapped ones marked, for progress lines.
pub fn describe_views(direction: &Direction) -> String {
    let pairs: Vec<String> = direction
        .pod_cidrs
        .iter()
        .chain(&direction.external_cidrs)
        .map(|m| {
            if m.is_remapped() {
                format!("{} → {}", m.real, m.view)
            } else {
                m.real.clone()
            }
        })
        .collect();
    format!(
        "{} sees {} as {}",
        direction.from.id,
        direction.to.id,
        pairs.join(", ")
    )
}

/// One link of a cluster as `kubetun network status` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkStatus {
    /// The peer cluster.
    pub peer: ClusterRef,
    /// The peer gateway's endpoint.
    pub endpoint: Option<Endpoint>,
    /// Our CIDRs and how the peer sees them (empty until the peer has processed them).
    pub local_cidrs: Vec<(CidrKind, CidrMapping)>,
    /// The peer's CIDRs and how we see them (empty until we have processed them).
    pub remote_cidrs: Vec<(CidrKind, CidrMapping)>,
    /// The tunnel's state, once a TunnelEndpoint exists.
    pub connection: Option<ConnectionStatus>,
    /// What the link waits for, when it has no TunnelEndpoint yet.
    pub pending: Option<String>,
}

/// Whether a CIDR holds pods or external endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CidrKind {
    /// Pod CIDR.
    Pod,
    /// External CIDR.
    External,
}

impl fmt::Display for CidrKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pod => "pod",
            Self::External => "external",
        })
    }
}

fn tagged(pods: &[CidrMapping], externals: &[CidrMapping]) -> Vec<(CidrKind, CidrMapping)> {
    pods.iter()
        .map(|m| (CidrKind::Pod, m.clone()))
        .chain(externals.iter().map(|m| (CidrKind::External, m.clone())))
        .collect()
}

/// Every link of the cluster behind `handle`: one per TunnelEndpoint, plus one per peer
/// that has NetworkConfigs but no TunnelEndpoint yet. Sorted by peer id.
pub async fn link_statuses(handle: &ClusterHandle) -> Result<Vec<LinkStatus>, Error> {
    let own_id = handle.load_info().await?.cluster.id;
    let tunnels = handle
        .tunnels()
        .list(&ListParams::default())
        .await
        .map_err(handle.api_error::<TunnelEndpoint>(&own_id, "list", "*"))?;
    let configs = handle
        .configs()
        .list(&ListParams::default())
        .await
        .map_err(handle.api_error::<NetworkConfig>(&own_id, "list", "*"))?;
    let mut links: BTreeMap<String, LinkStatus> = BTreeMap::new();
    for te in tunnels {
        let spec = te.spec;
        links.insert(
            spec.cluster.id.clone(),
            LinkStatus {
                peer: spec.cluster,
                endpoint: Some(spec.endpoint),
                local_cidrs: tagged(&spec.local_pod_cidrs, &spec.local_external_cidrs),
                remote_cidrs: tagged(&spec.remote_pod_cidrs, &spec.remote_external_cidrs),
                connection: te.status.and_then(|s| s.connection),
                pending: None,
            },
        );
    }
    for config in &configs {
        let Some((peer, is_ours)) = peer_of(config) else {
            continue;
        };
        let peer = peer.clone();
        if links.get(&peer.id).is_some_and(|l| l.pending.is_none()) {
            continue;
        }
        let link = links.entry(peer.id.clone()).or_insert_with(|| LinkStatus {
            peer: peer.clone(),
            endpoint: None,
            local_cidrs: Vec::new(),
            remote_cidrs: Vec::new(),
            connection: None,
            pending: Some(String::new()),
        });
        let processed = current_processed_status(config);
        if let Some(status) = &processed {
            let cidrs = tagged(&status.pod_cidrs, &status.external_cidrs);
            if is_ours {
                link.local_cidrs = cidrs;
            } else {
                link.remote_cidrs = cidrs;
                link.endpoint = Some(config.spec.endpoint.clone());
            }
        }
    }
    for link in links.values_mut() {
        if link.pending.is_some() {
            let has = |role: bool| {
                configs.iter().any(|c| {
                    peer_of(c)
                        .is_some_and(|(peer, is_ours)| is_ours == role && peer.id == link.peer.id)
                })
            };
            link.pending = Some(
                if !has(true) || !has(false) {
                    "half configured: run `kubetun network connect` again, or `reset`"
                } else if link.local_cidrs.is_empty() {
                    "waiting for the peer to process our NetworkConfig"
                } else if link.remote_cidrs.is_empty() {
                    "waiting for this cluster to process the peer's NetworkConfig"
                } else {
                    "waiting for the controller to create the TunnelEndpoint"
                }
                .to_owned(),
            );
        }
    }
    Ok(links.into_values().collect())
}

/// The peer a NetworkConfig concerns, and whether it is ours (`to-`) rather than the peer's.
fn peer_of(config: &NetworkConfig) -> Option<(&ClusterRef, bool)> {
    match config.labels().get(ROLE_LABEL).map(String::as_str) {
        Some(ROLE_LOCAL) => Some((&config.spec.destination_cluster, true)),
        Some(ROLE_REMOTE) => Some((&config.spec.source_cluster, false)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle repeats: {0}")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn error_chains_join_causes_once() {
        let error = Outer(Middle(std::io::Error::other("connection refused")));
        assert_eq!(
            error_chain(&error),
            "outer: middle repeats: connection refused"
        );
    }
}
