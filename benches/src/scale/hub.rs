//! One hub `kubetun-controller` on a real API server (etcd + kube-apiserver from
//! `kubetun-testenv`) with many remote clusters linked to it.
//!
//! Each remote's objects are written on the hub exactly as `kubetun network connect` writes
//! them there (connector labels and field manager): the hub's `to-<remote>` NetworkConfig,
//! the remote's `from-<remote>` NetworkConfig, and `to-<remote>`'s status mirrored from the
//! remote's processing (the remote side is simulated: it maps the hub's CIDRs unchanged).
//! The hub controller does the rest: finalizers, IPAM (half of the remotes announce the same
//! pod CIDR, so they need remapped views), statuses, TunnelEndpoints, and the gateway state
//! with one peer per remote, pushed to an in-process gateway that reports every peer
//! connected (`kubetun_controller_testing::FakeGateway`).
//!
//! Measured: the time from the first write until every remote's TunnelEndpoint reports the
//! gateway connected and the gateway runs every peer; the controller's RSS; the API requests
//! of the convergence (the API server's `apiserver_request_total`, less the bench's own
//! requests); the request rate while nothing changes; and the time from a change of one
//! remote's endpoint to the gateway running it, with the others steady.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kubetun_controller::connector::{FIELD_MANAGER, network_config};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::planner::remote_config_name;
use kubetun_controller::plumbing::cluster_info::ClusterInfo;
use kubetun_controller_testing::{FakeGateway, link_as_connector};
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;
use kubetun_crds::contract::link::ROLE_REMOTE;
use kubetun_crds::{ClusterRef, ConnectionState, Endpoint, NetworkConfig, TunnelEndpoint};
use kubetun_testenv::{Assets, TestCluster};
use serde::Serialize;

use super::{ScaleError, read_memory};

const NAMESPACE: &str = DEFAULT_NAMESPACE;
/// The pod CIDR every odd-numbered remote announces (they overlap each other).
const SHARED_POD_CIDR: &str = "10.244.0.0/20";
/// How often the bench lists the TunnelEndpoints while waiting.
const POLL: Duration = Duration::from_millis(500);

/// What to run.
#[derive(Debug, Clone)]
pub struct HubScaleConfig {
    /// Remote clusters linked to the hub.
    pub remotes: usize,
    /// The `kubetun-controller` executable.
    pub controller: PathBuf,
    /// The repository (for `deploy/namespace.yaml` and `deploy/crds/kubetun.yaml`).
    pub repo_root: PathBuf,
    /// How long convergence may take before the run fails.
    pub converge_timeout: Duration,
    /// Seconds of the steady-state request-rate window.
    pub steady_seconds: f64,
    /// Remotes the bench writes at once.
    pub concurrency: usize,
    /// Keep the controller's log here (default: a temporary file, its tail printed on
    /// failure), written at `log_level` (a `RUST_LOG` filter).
    pub controller_log: Option<PathBuf>,
    /// The controller's `RUST_LOG`.
    pub log_level: String,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct HubScaleReport {
    /// Remote clusters.
    pub remotes: usize,
    /// Remotes whose pod CIDR overlaps another's (remapped by the hub's IPAM).
    pub overlapping_remotes: usize,
    /// How long the bench's own writes took (they overlap the convergence), seconds.
    pub writes_s: f64,
    /// From the first write until every TunnelEndpoint is connected and the gateway runs
    /// every peer, seconds.
    pub converged_s: f64,
    /// Remote views the IPAM remapped, counted from the `from-` statuses.
    pub remapped_views: usize,
    /// Applies the gateway received during the convergence.
    pub gateway_applies: usize,
    /// Controller RSS after convergence, KiB.
    pub controller_rss_kib: u64,
    /// Controller peak RSS (`VmHWM`), KiB.
    pub controller_peak_kib: u64,
    /// API requests of the convergence, the bench's own left out.
    pub controller_requests: u64,
    /// `controller_requests` per remote.
    pub requests_per_remote: f64,
    /// The bench's own requests in the same window (writes, polls, metric scrapes).
    pub bench_requests: u64,
    /// Every request of the window by `VERB resource[/subresource]` (bench's included).
    pub requests_by_kind: BTreeMap<String, u64>,
    /// Requests per second while nothing changes, the bench's own left out.
    pub steady_requests_per_s: f64,
    /// Steady-state requests by kind (bench's scrape included).
    pub steady_by_kind: BTreeMap<String, u64>,
    /// From the write of one remote's new endpoint to the gateway running it, ms.
    pub change_to_gateway_ms: f64,
    /// From that write to the remote's TunnelEndpoint carrying it, ms.
    pub change_to_tunnel_endpoint_ms: f64,
}

/// One simulated remote cluster.
#[derive(Debug, Clone)]
pub(super) struct Remote {
    pub(super) info: ClusterInfo,
}

pub(super) fn remote(index: usize) -> Result<Remote, ScaleError> {
    let index32 = u32::try_from(index)
        .ok()
        .filter(|i| *i < 4000)
        .ok_or(ScaleError::TooMany {
            what: "remotes",
            most: 4000,
        })?;
    let id = format!("r{index:04}");
    // Even remotes: a /20 of their own in 10.128.0.0/10; odd ones: the shared /20.
    let pod = if index.is_multiple_of(2) {
        let base = u32::from(std::net::Ipv4Addr::new(10, 128, 0, 0)) + ((index32 / 2) << 12);
        format!("{}/20", std::net::Ipv4Addr::from(base))
    } else {
        SHARED_POD_CIDR.to_owned()
    };
    let key = GatewayKey::generate();
    let info = ClusterInfo {
        cluster: ClusterRef {
            id: id.clone(),
            name: id.clone(),
        },
        pod_cidrs: vec![pod.parse().map_err(|e| ScaleError::Setup(format!("{e}")))?],
        external_cidrs: Vec::new(),
        service_cidrs: Vec::new(),
        endpoint: Endpoint {
            address: format!(
                "192.0.2.{}",
                1 + index % 250 // documentation range; nothing is sent there
            ),
            port: 51820 + u16::try_from(index / 250).unwrap_or(0),
        },
        public_key: key.public_base64().to_owned(),
        mtu: 1420,
    };
    Ok(Remote { info })
}

/// Writes one remote's objects on the hub as the connector does: three requests.
pub(super) async fn connect(
    configs: &Api<NetworkConfig>,
    hub: &ClusterInfo,
    remote: &Remote,
    requests: &AtomicU64,
) -> Result<(), ScaleError> {
    let id = &remote.info.cluster.id;
    requests.fetch_add(3, Ordering::Relaxed);
    link_as_connector(configs, NAMESPACE, hub, &remote.info)
        .await
        .map_err(ScaleError::kube(format!("link {id} as the connector")))
}

/// `apiserver_request_total` summed by `VERB resource[/subresource]`.
pub(super) async fn request_counts(
    client: &kube::Client,
) -> Result<BTreeMap<String, u64>, ScaleError> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| ScaleError::Setup(format!("metrics request: {e}")))?;
    let text = client
        .request_text(request)
        .await
        .map_err(ScaleError::kube("GET /metrics"))?;
    Ok(parse_request_counts(&text))
}

fn parse_request_counts(metrics: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix("=\""))
                .map(|v| v.trim_end_matches('"'))
                .unwrap_or("")
        };
        let resource = match (label("resource"), label("subresource")) {
            ("", _) => "(non-resource)".to_owned(),
            (r, "") => r.to_owned(),
            (r, s) => format!("{r}/{s}"),
        };
        let key = format!("{} {resource}", label("verb"));
        let value = value.trim().parse::<f64>().unwrap_or(0.0);
        *counts.entry(key).or_insert(0) += value as u64;
    }
    counts
}

pub(super) fn difference(
    after: &BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Applies the namespace and the CRDs and waits until the kubetun resources answer.
pub(super) async fn install(cluster: &TestCluster, repo_root: &Path) -> Result<(), ScaleError> {
    for file in ["deploy/namespace.yaml", "deploy/crds/kubetun.yaml"] {
        let path = repo_root.join(file);
        let path = path
            .to_str()
            .ok_or(ScaleError::Setup("repository path is not UTF-8".into()))?;
        cluster
            .kubectl(&["apply", "-f", path])
            .map_err(|e| ScaleError::Setup(format!("kubectl apply {file}: {e}")))?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for plural in [
        "networkconfigs.net.kubetun.io",
        "tunnelendpoints.net.kubetun.io",
    ] {
        while cluster
            .kubectl(&["get", plural, "-A", "-o", "name"])
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(ScaleError::Timeout {
                    what: format!("{plural} to answer"),
                    after: Duration::from_secs(30),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Whether a TunnelEndpoint's status says the gateway runs it and it is connected.
pub(super) fn connected(te: &TunnelEndpoint) -> bool {
    te.status
        .as_ref()
        .and_then(|s| s.connection.as_ref())
        .is_some_and(|c| c.status == ConnectionState::Connected)
}

/// Runs the scenario described in the module documentation.
pub async fn run(config: &HubScaleConfig) -> Result<HubScaleReport, ScaleError> {
    kubetun_testenv::install_tls_provider();
    let assets = Assets::find()?;
    let cluster = TestCluster::start(&assets, "hub").await?;
    install(&cluster, &config.repo_root).await?;
    let client = cluster.client().await?;
    let dir = tempfile::tempdir().map_err(ScaleError::io("temp dir"))?;
    let socket = dir.path().join("gateway.grpc.sock");
    let gateway = FakeGateway::start_at(&socket)
        .await
        .map_err(ScaleError::io("fake gateway"))?;
    let log_path = config
        .controller_log
        .clone()
        .unwrap_or_else(|| dir.path().join("controller.log"));
    let log = std::fs::File::create(&log_path).map_err(ScaleError::io("controller log"))?;
    let log_err = log.try_clone().map_err(ScaleError::io("controller log"))?;
    let mut controller = tokio::process::Command::new(&config.controller)
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .arg("--gateway-socket")
        .arg(&socket)
        .arg("--hub")
        .env_clear()
        .env("KUBETUN_CLUSTER_ID", "hub")
        .env("KUBETUN_CLUSTER_NAME", "hub")
        .env("KUBETUN_POD_CIDR", "10.200.0.0/16")
        .env("KUBETUN_SERVICE_CIDR", "10.96.0.0/12")
        .env("KUBETUN_ENDPOINT_ADDRESS", "198.51.100.10")
        .env("RUST_LOG", &config.log_level)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .kill_on_drop(true)
        .spawn()
        .map_err(ScaleError::io("start kubetun-controller"))?;
    let pid = controller
        .id()
        .ok_or(ScaleError::Setup("the controller exited at once".into()))?;
    let result = measure(config, &client, &gateway, pid).await;
    let _ = controller.start_kill();
    let _ = controller.wait().await;
    if result.is_err() {
        super::print_log_tail(&log_path);
    }
    drop(gateway);
    drop(cluster);
    result
}

async fn measure(
    config: &HubScaleConfig,
    client: &kube::Client,
    gateway: &FakeGateway,
    controller_pid: u32,
) -> Result<HubScaleReport, ScaleError> {
    // The controller publishes the hub's cluster info and applies its (empty) state first.
    let started = Instant::now();
    let hub = loop {
        if let Ok(info) = ClusterInfo::load(client, NAMESPACE).await {
            break info;
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(ScaleError::Timeout {
                what: "the controller to publish the cluster info".into(),
                after: Duration::from_secs(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    while gateway.current().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            return Err(ScaleError::Timeout {
                what: "the controller's first Apply".into(),
                after: Duration::from_secs(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let remotes: Vec<Remote> = (0..config.remotes).map(remote).collect::<Result<_, _>>()?;
    let overlapping_remotes = remotes.len() / 2;
    let configs: Api<NetworkConfig> = Api::namespaced(client.clone(), NAMESPACE);
    let endpoints: Api<TunnelEndpoint> = Api::namespaced(client.clone(), NAMESPACE);
    let bench_requests = AtomicU64::new(0);
    let applies_before = gateway.applied().len();

    let before = request_counts(client).await?;
    bench_requests.fetch_add(1, Ordering::Relaxed);
    let start = Instant::now();
    let writes = futures::stream::iter(remotes.iter().map(|r| {
        let (configs, hub, requests) = (&configs, &hub, &bench_requests);
        async move { connect(configs, hub, r, requests).await }
    }))
    .buffer_unordered(config.concurrency.max(1))
    .try_collect::<Vec<()>>();
    let poll = async {
        // The writes run meanwhile; polling starts with them.
        loop {
            tokio::time::sleep(POLL).await;
            bench_requests.fetch_add(1, Ordering::Relaxed);
            let listed = endpoints
                .list(&ListParams::default())
                .await
                .map_err(ScaleError::kube("list TunnelEndpoints"))?;
            let ready = listed.items.iter().filter(|te| connected(te)).count();
            let peers = gateway.current().map_or(0, |s| s.peers.len());
            if ready == config.remotes && peers == config.remotes {
                return Ok::<_, ScaleError>(start.elapsed());
            }
            if start.elapsed() > config.converge_timeout {
                return Err(ScaleError::Timeout {
                    what: format!(
                        "convergence ({ready} of {} TunnelEndpoints connected, {peers} peers in the gateway)",
                        config.remotes
                    ),
                    after: config.converge_timeout,
                });
            }
        }
    };
    let writes_timed = async {
        let result = writes.await;
        (result, start.elapsed())
    };
    let ((written, writes_took), converged) = tokio::join!(writes_timed, poll);
    written?;
    let converged = converged?;
    let after = request_counts(client).await?;
    let gateway_applies = gateway.applied().len() - applies_before;
    let memory = read_memory(controller_pid)?;
    let window = difference(&after, &before);
    let total: u64 = window.values().sum();
    let own = bench_requests.load(Ordering::Relaxed);
    let controller_requests = total.saturating_sub(own);

    bench_requests.fetch_add(1, Ordering::Relaxed);
    let remapped_views = configs
        .list(&ListParams::default())
        .await
        .map_err(ScaleError::kube("list NetworkConfigs"))?
        .items
        .iter()
        .filter_map(|nc| nc.status.as_ref())
        .flat_map(|s| &s.pod_cidrs)
        .filter(|m| m.is_remapped())
        .count();

    // Nothing changes for a while.
    let steady_before = request_counts(client).await?;
    let steady_started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(config.steady_seconds)).await;
    let steady_after = request_counts(client).await?;
    let steady_elapsed = steady_started.elapsed().as_secs_f64();
    let steady_by_kind = difference(&steady_after, &steady_before);
    let steady_total: u64 = steady_by_kind.values().sum();
    // The first scrape of the window is counted in it.
    let steady_requests_per_s = steady_total.saturating_sub(1) as f64 / steady_elapsed;

    // One remote's gateway endpoint changes (its connector writes the new NetworkConfig).
    let changed = &remotes[remotes.len() / 2];
    let mut spec = changed.info.network_config_for(&hub.cluster);
    spec.endpoint.port += 1000;
    let new_endpoint = format!("{}:{}", spec.endpoint.address, spec.endpoint.port);
    let id = changed.info.cluster.id.clone();
    let object = network_config(&remote_config_name(&id), NAMESPACE, ROLE_REMOTE, &id, &spec);
    let change_started = Instant::now();
    configs
        .patch(
            &remote_config_name(&id),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(ScaleError::kube(format!("change from-{id}")))?;
    let deadline = Duration::from_secs(30);
    let change_to_gateway_ms = loop {
        let running = gateway.current().is_some_and(|s| {
            s.peers
                .iter()
                .any(|p| p.name == id && p.endpoint == new_endpoint)
        });
        if running {
            break change_started.elapsed().as_secs_f64() * 1e3;
        }
        if change_started.elapsed() > deadline {
            return Err(ScaleError::Timeout {
                what: format!("the gateway to run {id}'s new endpoint"),
                after: deadline,
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let change_to_tunnel_endpoint_ms = loop {
        let te = endpoints
            .get_opt(&id)
            .await
            .map_err(ScaleError::kube(format!("get TunnelEndpoint {id}")))?;
        if te.is_some_and(|te| te.spec.endpoint == spec.endpoint) {
            break change_started.elapsed().as_secs_f64() * 1e3;
        }
        if change_started.elapsed() > deadline {
            return Err(ScaleError::Timeout {
                what: format!("TunnelEndpoint {id} to carry the new endpoint"),
                after: deadline,
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };

    Ok(HubScaleReport {
        remotes: config.remotes,
        overlapping_remotes,
        writes_s: writes_took.as_secs_f64(),
        converged_s: converged.as_secs_f64(),
        remapped_views,
        gateway_applies,
        controller_rss_kib: memory.rss_kib,
        controller_peak_kib: memory.peak_kib,
        controller_requests,
        requests_per_remote: controller_requests as f64 / config.remotes.max(1) as f64,
        bench_requests: own,
        requests_by_kind: window,
        steady_requests_per_s,
        steady_by_kind,
        change_to_gateway_ms,
        change_to_tunnel_endpoint_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counts_sum_by_verb_and_resource() {
        let metrics = r#"# HELP apiserver_request_total x
apiserver_request_total{code="200",component="apiserver",dry_run="",group="net.kubetun.io",resource="networkconfigs",scope="resource",subresource="",verb="APPLY",version="v1alpha1"} 3
apiserver_request_total{code="409",component="apiserver",dry_run="",group="net.kubetun.io",resource="networkconfigs",scope="resource",subresource="",verb="APPLY",version="v1alpha1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="net.kubetun.io",resource="networkconfigs",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 4
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 1
apiserver_request_duration_seconds_bucket{verb="GET",le="0.1"} 9
"#;
        let counts = parse_request_counts(metrics);
        assert_eq!(counts["APPLY networkconfigs"], 5);
        assert_eq!(counts["PATCH networkconfigs/status"], 4);
        assert_eq!(counts["GET (non-resource)"], 1);
        assert_eq!(counts.len(), 3);
    }

    #[test]
    fn odd_remotes_overlap_and_even_ones_do_not() {
        let a = remote(0).unwrap();
        let b = remote(2).unwrap();
        let c = remote(1).unwrap();
        let d = remote(3).unwrap();
        assert_ne!(a.info.pod_cidrs, b.info.pod_cidrs);
        assert_eq!(c.info.pod_cidrs, d.info.pod_cidrs);
        assert_ne!(a.info.public_key, b.info.public_key);
    }
}
