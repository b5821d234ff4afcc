//! Services across clusters at scale: one hub `kubetun-controller` on a real API server
//! importing the exported Services of many linked clusters.
//!
//! The clusters are linked to the hub as `kubetun network connect` links them (the hub bench's
//! simulated remotes: half of them share a pod CIDR, so the hub remaps them). Their exports
//! live on a second real API server, one kubetun namespace per cluster, written by the bench
//! as each cluster's controller would write them (`services` ExportedServices per cluster, each
//! with `endpoints` endpoints in the cluster's pod CIDR). Then the bench hands the hub one
//! credential Secret per cluster (a kubeconfig whose context namespace is that cluster's), and
//! measures until every Service is imported with its ClusterSetIP and EndpointSlices: the
//! time, the hub controller's RSS, the API requests on the hub and on the exporters' server
//! per Service, and the time from one exporter's endpoint change to the hub's slice.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kubetun_controller::plumbing::cluster_info::ClusterInfo;
use kubetun_controller_testing::FakeGateway;
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;
use kubetun_crds::contract::services::{
    CREDENTIAL_KEY, CREDENTIAL_LABEL, MANAGED_BY, MANAGED_BY_LABEL,
};
use kubetun_crds::mcs::v1beta1::ServiceImport;
use kubetun_crds::mcs::{ServiceImportType, ServicePort};
use kubetun_crds::{
    ExportedEndpoint, ExportedEndpointPort, ExportedService, ExportedServiceSpec, ExportedSlice,
    TunnelEndpoint,
};
use kubetun_testenv::{Assets, TestCluster};
use serde::Serialize;

use super::hub::{Remote, connect, connected, difference, install, remote, request_counts};
use super::{ScaleError, read_memory};

const NAMESPACE: &str = DEFAULT_NAMESPACE;
const POLL: Duration = Duration::from_millis(250);
/// Namespaces the Services are spread over (on every cluster).
const APP_NAMESPACES: usize = 20;

/// What to run.
#[derive(Debug, Clone)]
pub struct ServicesScaleConfig {
    /// Clusters linked to the hub, each exporting `services`.
    pub clusters: usize,
    /// Services each cluster exports.
    pub services: usize,
    /// Endpoints of each Service.
    pub endpoints: usize,
    /// The `kubetun-controller` executable.
    pub controller: PathBuf,
    /// The repository (for `deploy/`).
    pub repo_root: PathBuf,
    /// How long convergence may take.
    pub converge_timeout: Duration,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ServicesScaleReport {
    /// Linked clusters.
    pub clusters: usize,
    /// Exported (and imported) Services in all.
    pub services: usize,
    /// Endpoints per Service.
    pub endpoints: usize,
    /// Links: the bench's connects until every TunnelEndpoint is connected, seconds.
    pub linked_s: f64,
    /// From the credentials' write until every Service is imported with its ClusterSetIP
    /// and every EndpointSlice written, seconds.
    pub converged_s: f64,
    /// Hub controller RSS after convergence / peak, KiB.
    pub controller_rss_kib: u64,
    /// Its peak RSS (`VmHWM`), KiB.
    pub controller_peak_kib: u64,
    /// The hub API server's requests of the convergence, the bench's own left out.
    pub hub_requests: u64,
    /// `hub_requests` per Service.
    pub hub_requests_per_service: f64,
    /// The exporters' API server's requests of the convergence (the hub's lists and watches).
    pub exporter_requests: u64,
    /// From one exporter's endpoint change to the hub's EndpointSlice, ms.
    pub change_ms: f64,
}

/// An exported Service of cluster `remote`, `index` of its `services`.
fn offer(remote: &Remote, index: usize, endpoints: usize) -> ExportedService {
    let cluster = remote.info.cluster.clone();
    let namespace = format!("app-{:02}", index % APP_NAMESPACES);
    let name = format!("{}-s{index:03}", cluster.id);
    let pod = remote.info.pod_cidrs[0];
    let address = |n: usize| match pod.network() {
        std::net::IpAddr::V4(v4) => {
            std::net::Ipv4Addr::from(u32::from(v4) + 2 + (index * endpoints + n) as u32).to_string()
        }
        std::net::IpAddr::V6(v6) => v6.to_string(),
    };
    let spec = ExportedServiceSpec {
        cluster,
        namespace: namespace.clone(),
        name: name.clone(),
        export_created: Time(Timestamp::now()),
        type_: ServiceImportType::ClusterSetIP,
        ports: vec![ServicePort {
            name: Some("http".into()),
            protocol: "TCP".into(),
            app_protocol: None,
            port: 80,
        }],
        session_affinity: None,
        session_affinity_config: None,
        ip_families: vec!["IPv4".into()],
        internal_traffic_policy: None,
        traffic_distribution: None,
        labels: Default::default(),
        annotations: Default::default(),
        slices: vec![ExportedSlice {
            address_type: "IPv4".into(),
            ports: vec![ExportedEndpointPort {
                name: Some("http".into()),
                protocol: "TCP".into(),
                port: 8080,
                app_protocol: None,
            }],
            endpoints: (0..endpoints)
                .map(|n| ExportedEndpoint {
                    addresses: vec![address(n)],
                    ready: true,
                    serving: true,
                    terminating: false,
                    hostname: None,
                })
                .collect(),
        }],
        consumers: None,
        client_selectors: Vec::new(),
    };
    ExportedService::new(&format!("{namespace}.{name}"), spec)
}

/// The exporter's namespace of cluster `id` on the exporters' API server.
fn exporter_namespace(id: &str) -> String {
    format!("kubetun-{id}")
}

async fn create_namespace(client: &kube::Client, name: &str) -> Result<(), ScaleError> {
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
            .map_err(|e| ScaleError::Setup(e.to_string()))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(ScaleError::kube(format!("create namespace {name}"))(e)),
    }
}

/// Runs the scenario described in the module documentation.
pub async fn run(config: &ServicesScaleConfig) -> Result<ServicesScaleReport, ScaleError> {
    kubetun_testenv::install_tls_provider();
    let assets = Assets::find()?;
    let (hub_cluster, exporters_cluster) = tokio::join!(
        TestCluster::start(&assets, "hub"),
        TestCluster::start(&assets, "exporters")
    );
    let (hub_cluster, exporters_cluster) = (hub_cluster?, exporters_cluster?);
    install(&hub_cluster, &config.repo_root).await?;
    install(&exporters_cluster, &config.repo_root).await?;
    let path = config.repo_root.join("deploy/crds/multicluster.yaml");
    hub_cluster
        .kubectl(&["apply", "-f", &path.display().to_string()])
        .map_err(|e| ScaleError::Setup(format!("kubectl apply multicluster.yaml: {e}")))?;
    while hub_cluster
        .kubectl(&["get", "serviceimports.multicluster.x-k8s.io", "-A"])
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hub = hub_cluster.client().await?;
    let exporters = exporters_cluster.client().await?;
    let dir = tempfile::tempdir().map_err(ScaleError::io("temp dir"))?;
    let socket = dir.path().join("gateway.grpc.sock");
    let gateway = FakeGateway::start_at(&socket)
        .await
        .map_err(ScaleError::io("fake gateway"))?;
    let log_path = dir.path().join("controller.log");
    let log = std::fs::File::create(&log_path).map_err(ScaleError::io("controller log"))?;
    let log_err = log.try_clone().map_err(ScaleError::io("controller log"))?;
    let mut controller = tokio::process::Command::new(&config.controller)
        .arg("--kubeconfig")
        .arg(hub_cluster.kubeconfig_path())
        .arg("--gateway-socket")
        .arg(&socket)
        .env_clear()
        .env("KUBETUN_CLUSTER_ID", "hub")
        .env("KUBETUN_POD_CIDR", "10.200.0.0/16")
        .env("KUBETUN_SERVICE_CIDR", "10.96.0.0/12")
        .env("KUBETUN_ENDPOINT_ADDRESS", "198.51.100.10")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .kill_on_drop(true)
        .spawn()
        .map_err(ScaleError::io("start kubetun-controller"))?;
    let pid = controller
        .id()
        .ok_or(ScaleError::Setup("the controller exited at once".into()))?;
    let result = measure(config, &hub, &exporters, &exporters_cluster, pid).await;
    let _ = controller.start_kill();
    let _ = controller.wait().await;
    if result.is_err() {
        super::print_log_tail(&log_path);
    }
    drop(gateway);
    result
}

/// Waits for `done` (polled), failing after `timeout` with `what`.
async fn wait_for<F, Fut>(
    what: &str,
    timeout: Duration,
    mut done: F,
) -> Result<Duration, ScaleError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, ScaleError>>,
{
    let start = Instant::now();
    loop {
        if done().await? {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            return Err(ScaleError::Timeout {
                what: what.to_owned(),
                after: timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn measure(
    config: &ServicesScaleConfig,
    hub: &kube::Client,
    exporters: &kube::Client,
    exporters_cluster: &TestCluster,
    controller_pid: u32,
) -> Result<ServicesScaleReport, ScaleError> {
    let info = wait_for(
        "the controller to publish the cluster info",
        Duration::from_secs(30),
        || async { Ok(ClusterInfo::load(hub, NAMESPACE).await.is_ok()) },
    )
    .await;
    info?;
    let hub_info = ClusterInfo::load(hub, NAMESPACE)
        .await
        .map_err(|e| ScaleError::Setup(format!("cluster info: {e}")))?;
    let remotes: Vec<Remote> = (0..config.clusters).map(remote).collect::<Result<_, _>>()?;
    let requests = AtomicU64::new(0);

    // Links, as `network connect` makes them.
    let configs = Api::namespaced(hub.clone(), NAMESPACE);
    futures::stream::iter(
        remotes
            .iter()
            .map(|r| connect(&configs, &hub_info, r, &requests)),
    )
    .buffer_unordered(8)
    .try_collect::<Vec<()>>()
    .await?;
    let tunnels: Api<TunnelEndpoint> = Api::namespaced(hub.clone(), NAMESPACE);
    let linked = wait_for("every link connected", config.converge_timeout, || async {
        let listed = tunnels
            .list(&ListParams::default())
            .await
            .map_err(ScaleError::kube("list TunnelEndpoints"))?;
        Ok(listed.items.iter().filter(|te| connected(te)).count() == config.clusters)
    })
    .await?;

    // Every cluster's exports, as its controller writes them, and the hub's namespaces.
    for k in 0..APP_NAMESPACES.min(config.services) {
        create_namespace(hub, &format!("app-{k:02}")).await?;
    }
    let mut offers = Vec::new();
    for r in &remotes {
        create_namespace(exporters, &exporter_namespace(&r.info.cluster.id)).await?;
        for index in 0..config.services {
            offers.push((
                exporter_namespace(&r.info.cluster.id),
                offer(r, index, config.endpoints),
            ));
        }
    }
    futures::stream::iter(offers.iter().map(|(namespace, offer)| async move {
        let api: Api<ExportedService> = Api::namespaced(exporters.clone(), namespace);
        api.create(&PostParams::default(), offer)
            .await
            .map(|_| ())
            .map_err(ScaleError::kube("create ExportedService"))
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<()>>()
    .await?;

    // The credentials: each cluster's kubeconfig names its own namespace.
    let kubeconfig = std::fs::read(exporters_cluster.kubeconfig_path())
        .map_err(ScaleError::io("exporters' kubeconfig"))?;
    let base: serde_json::Value =
        serde_yaml::from_slice(&kubeconfig).map_err(|e| ScaleError::Setup(e.to_string()))?;
    let total = config.clusters * config.services;
    let hub_before = request_counts(hub).await?;
    let exporters_before = request_counts(exporters).await?;
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), NAMESPACE);
    let started = Instant::now();
    for r in &remotes {
        let id = &r.info.cluster.id;
        let mut config = base.clone();
        config["contexts"][0]["context"]["namespace"] = exporter_namespace(id).into();
        let mut secret = Secret::default();
        secret.metadata.name = Some(format!("kubetun-services-{id}"));
        secret.metadata.labels = Some([(CREDENTIAL_LABEL.to_owned(), id.clone())].into());
        let text = serde_yaml::to_string(&config).map_err(|e| ScaleError::Setup(e.to_string()))?;
        secret.data = Some([(CREDENTIAL_KEY.to_owned(), ByteString(text.into_bytes()))].into());
        requests.fetch_add(1, Ordering::Relaxed);
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .map_err(ScaleError::kube("create credential Secret"))?;
    }
    let imports: Api<ServiceImport> = Api::all(hub.clone());
    let slices: Api<EndpointSlice> = Api::all(hub.clone());
    let managed = format!("{MANAGED_BY_LABEL}={MANAGED_BY}");
    wait_for(
        "every Service imported",
        config.converge_timeout,
        || async {
            requests.fetch_add(2, Ordering::Relaxed);
            let listed = imports
                .list(&ListParams::default())
                .await
                .map_err(ScaleError::kube("list ServiceImports"))?;
            let with_ip = listed
                .items
                .iter()
                .filter(|i| !i.spec.ips.is_empty())
                .count();
            let written = slices
                .list(&ListParams::default().labels(&managed))
                .await
                .map_err(ScaleError::kube("list EndpointSlices"))?
                .items
                .len();
            Ok(with_ip >= total && written >= total)
        },
    )
    .await?;
    let converged = started.elapsed();
    let memory = read_memory(controller_pid)?;
    let hub_window: u64 = difference(&request_counts(hub).await?, &hub_before)
        .values()
        .sum();
    let exporter_window: u64 = difference(&request_counts(exporters).await?, &exporters_before)
        .values()
        .sum();
    // The bench's own: its writes and polls, and one metrics scrape on each server.
    let hub_requests = hub_window.saturating_sub(requests.load(Ordering::Relaxed) + 1);
    let exporter_requests = exporter_window.saturating_sub(1);

    // One exporter's endpoint changes.
    let (namespace, changed) = &offers[offers.len() / 2];
    let mut spec = changed.spec.clone();
    let new_address = "10.255.255.254";
    let pod = remotes[offers.len() / 2 / config.services.max(1)]
        .info
        .pod_cidrs[0];
    let address = match pod.network() {
        std::net::IpAddr::V4(v4) => std::net::Ipv4Addr::from(u32::from(v4) + 1).to_string(),
        std::net::IpAddr::V6(_) => new_address.to_owned(),
    };
    spec.slices[0].endpoints.push(ExportedEndpoint {
        addresses: vec![address],
        ready: true,
        serving: true,
        terminating: false,
        hostname: None,
    });
    let api: Api<ExportedService> = Api::namespaced(exporters.clone(), namespace);
    let name = changed.metadata.name.clone().unwrap_or_default();
    let object = ExportedService::new(&name, spec.clone());
    let change_started = Instant::now();
    api.patch(
        &name,
        &PatchParams::apply("bench").force(),
        &Patch::Apply(&object),
    )
    .await
    .map_err(ScaleError::kube("change an ExportedService"))?;
    let want = config.endpoints + 1;
    let hub_slices: Api<EndpointSlice> = Api::namespaced(hub.clone(), &spec.namespace);
    let selector = format!("multicluster.kubernetes.io/service-name={}", spec.name);
    loop {
        let listed = hub_slices
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(ScaleError::kube("list the changed Service's slices"))?;
        let count: usize = listed
            .items
            .iter()
            .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
            .sum();
        if count >= want {
            break;
        }
        if change_started.elapsed() > Duration::from_secs(30) {
            return Err(ScaleError::Timeout {
                what: "the change to reach the hub".into(),
                after: Duration::from_secs(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let change_ms = change_started.elapsed().as_secs_f64() * 1e3;
    Ok(ServicesScaleReport {
        clusters: config.clusters,
        services: total,
        endpoints: config.endpoints,
        linked_s: linked.as_secs_f64(),
        converged_s: converged.as_secs_f64(),
        controller_rss_kib: memory.rss_kib,
        controller_peak_kib: memory.peak_kib,
        hub_requests,
        hub_requests_per_service: hub_requests as f64 / total.max(1) as f64,
        exporter_requests,
        change_ms,
    })
}
