//! Clusters for connector and shortcut scenarios: an in-memory API server per cluster that
//! counts writes and can be made unreachable, the real controller driven by `sync_once` in a
//! background loop, and a fake gateway reporting every peer connected.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kube::api::Api;
use kube_fake_client::{ClientBuilder, Error as FakeError, interceptor};
use kubetun_controller::connector::{ClusterHandle, Progress, WaitOptions};
use kubetun_controller::ipam::IpamConfig;
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::operator::network_config;
use kubetun_controller::operator::network_config::context::{Context, ControllerConfig};
use kubetun_controller::planner::GatewaySettings;
use kubetun_controller::plumbing::cluster_info::ClusterInfo;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_controller_testing::FakeGateway;
use kubetun_crds::{ClusterRef, Endpoint, NetworkConfig, ShortcutConnection, TunnelEndpoint};
use tokio::task::JoinHandle;

pub const NAMESPACE: &str = "kubetun-system";

/// Switches shared by a cluster's API server interceptors.
#[derive(Debug, Default)]
pub struct Switches {
    /// Every write (create, patch, update, delete, status) served so far.
    pub writes: AtomicUsize,
    /// When set, every request fails like an API server that cannot be reached.
    pub unreachable: AtomicBool,
}

impl Switches {
    fn check(&self, write: bool) -> Result<(), FakeError> {
        if self.unreachable.load(Ordering::SeqCst) {
            return Err(FakeError::Internal(
                "connection refused (test: API server down)".into(),
            ));
        }
        if write {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

fn interceptors(switches: &Arc<Switches>) -> interceptor::Funcs {
    let s = switches.clone();
    let funcs = interceptor::Funcs::new().get(move |_| s.check(false).map(|()| None));
    let s = switches.clone();
    let funcs = funcs.list(move |_| s.check(false).map(|()| None));
    let s = switches.clone();
    let funcs = funcs.create(move |_| s.check(true).map(|()| None));
    let s = switches.clone();
    let funcs = funcs.patch(move |_| s.check(true).map(|()| None));
    let s = switches.clone();
    let funcs = funcs.update(move |_| s.check(true).map(|()| None));
    let s = switches.clone();
    let funcs = funcs.replace(move |_| s.check(true).map(|()| None));
    let s = switches.clone();
    let funcs = funcs.delete(move |_| s.check(true).map(|()| None));
    let s = switches.clone();
    let funcs = funcs.patch_status(move |_| s.check(true).map(|()| None));
    let s = switches.clone();
    funcs.replace_status(move |_| s.check(true).map(|()| None))
}

/// An in-memory API server serving the kubetun resources, with the given switches.
pub async fn api_server(switches: &Arc<Switches>) -> kube::Client {
    ClientBuilder::new()
        .with_resource::<NetworkConfig>()
        .with_resource::<TunnelEndpoint>()
        .with_resource::<ShortcutConnection>()
        .with_status_subresource::<NetworkConfig>()
        .with_status_subresource::<TunnelEndpoint>()
        .with_status_subresource::<ShortcutConnection>()
        .with_interceptor_funcs(interceptors(switches))
        .build()
        .await
        .unwrap()
}

/// One cluster: API server, published cluster info, controller context and fake gateway.
pub struct Cluster {
    pub info: ClusterInfo,
    pub client: kube::Client,
    pub ctx: Arc<Context>,
    pub gateway: FakeGateway,
    pub switches: Arc<Switches>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("id", &self.info.cluster.id)
            .finish()
    }
}

impl Cluster {
    /// A cluster with the given pod CIDR and external CIDR; publishes its cluster info.
    pub async fn start(id: &str, name: &str, pod: &str, external: &str) -> Self {
        let key = GatewayKey::generate();
        let info = ClusterInfo {
            cluster: ClusterRef {
                id: id.into(),
                name: name.into(),
            },
            pod_cidrs: vec![pod.parse().unwrap()],
            external_cidrs: vec![external.parse().unwrap()],
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
            endpoint: Endpoint {
                address: format!("{id}.gateway.example"),
                port: 51820,
            },
            public_key: key.public_base64().to_owned(),
            mtu: 1420,
        };
        let switches = Arc::new(Switches::default());
        let client = api_server(&switches).await;
        info.publish(&client, NAMESPACE).await.unwrap();
        let gateway = FakeGateway::start().await.unwrap();
        let settings = GatewaySettings {
            private_key: key.private_base64(),
            public_key: key.public_base64().to_owned(),
            listen_port: 51820,
            mtu: info.mtu,
            addresses: vec![],
            local_prefixes: info
                .local_ranges()
                .iter()
                .map(ToString::to_string)
                .collect(),
            manage_routes: false,
            persistent_keepalive: 25,
            ..GatewaySettings::default()
        };
        let ctx = Context::new(
            client.clone(),
            ControllerConfig {
                namespace: NAMESPACE.into(),
                cluster: info.clone(),
                ipam: IpamConfig::default(),
                gateway: settings,
            },
            Some(GatewayClient::new(gateway.socket())),
        )
        .await
        .unwrap();
        Self {
            info,
            client,
            ctx,
            gateway,
            switches,
        }
    }

    pub fn id(&self) -> &str {
        &self.info.cluster.id
    }

    /// A connector handle on this cluster labelled `label`.
    pub fn handle(&self, label: &str) -> ClusterHandle {
        ClusterHandle::new(label, self.client.clone(), NAMESPACE)
    }

    pub fn configs(&self) -> Api<NetworkConfig> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    pub fn endpoints(&self) -> Api<TunnelEndpoint> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    pub async fn config(&self, name: &str) -> Option<NetworkConfig> {
        self.configs().get_opt(name).await.unwrap()
    }

    pub async fn endpoint(&self, peer: &str) -> Option<TunnelEndpoint> {
        self.endpoints().get_opt(peer).await.unwrap()
    }

    /// Names of the NetworkConfigs present, sorted.
    pub async fn config_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .configs()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|nc| nc.metadata.name)
            .collect();
        names.sort();
        names
    }

    pub fn writes(&self) -> usize {
        self.switches.writes.load(Ordering::SeqCst)
    }

    pub fn set_unreachable(&self, down: bool) {
        self.switches.unreachable.store(down, Ordering::SeqCst);
    }
}

/// The clusters' controllers, each running `sync_once` in a loop until dropped.
#[derive(Debug)]
pub struct Controllers(Vec<JoinHandle<()>>);

impl Controllers {
    pub fn run(clusters: &[&Cluster]) -> Self {
        Self(
            clusters
                .iter()
                .map(|cluster| {
                    let ctx = cluster.ctx.clone();
                    let switches = cluster.switches.clone();
                    tokio::spawn(async move {
                        loop {
                            if !switches.unreachable.load(Ordering::SeqCst) {
                                // Errors are transient here (a peer half-written); the next pass retries.
                                let _ = network_config::sync_once(&ctx).await;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    })
                })
                .collect(),
        )
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Runs `sync_once` on every cluster `passes` times, in order (controllers stopped).
pub async fn settle(clusters: &[&Cluster], passes: usize) {
    for _ in 0..passes {
        for cluster in clusters {
            network_config::sync_once(&cluster.ctx).await.unwrap();
        }
    }
}

/// Wait options for tests: short polls, bounded.
pub fn quick(wait: bool) -> WaitOptions {
    WaitOptions {
        wait,
        timeout: Duration::from_secs(20),
        poll_interval: Duration::from_millis(20),
    }
}

/// Progress sink recording every line as `kind (cluster) message`.
#[derive(Debug, Default)]
pub struct Recorder(pub std::sync::Mutex<Vec<String>>);

impl Recorder {
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn push(&self, kind: &str, cluster: &str, message: &str) {
        self.0
            .lock()
            .unwrap()
            .push(format!("{kind} ({cluster}) {message}"));
    }
}

impl Progress for Recorder {
    fn done(&self, cluster: &str, message: &str) {
        self.push("done", cluster, message);
    }
    fn waiting(&self, cluster: &str, message: &str) {
        self.push("waiting", cluster, message);
    }
    fn waited(&self, cluster: &str, message: &str) {
        self.push("waited", cluster, message);
    }
    fn failed(&self, cluster: &str, message: &str) {
        self.push("failed", cluster, message);
    }
}
