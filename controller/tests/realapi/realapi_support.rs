//! Real API servers for the controller's tests: clusters from `kubetun-testenv` with the
//! committed CRDs (`deploy/crds/kubetun.yaml`) applied by kubectl and answering, kubetun's
//! namespace, and in-process leaves (published cluster info, reconcilers on watches, a fake
//! gateway that reports every peer connected). The binaries run as processes.

use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubetun_controller::plumbing::cluster_info::ClusterInfo;

use kubetun_controller::ipam::IpamConfig;
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::operator::network_config;
use kubetun_controller::operator::network_config::context::{Context, ControllerConfig};
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_controller_testing::FakeGateway;

use kubetun_testenv::TestCluster;
use tokio::task::JoinHandle;

pub const NAMESPACE: &str = DEFAULT_NAMESPACE;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Applies the namespace and the committed CRDs and waits until every kubetun resource
/// answers a list (a new CRD is Established before it serves).
pub async fn install(cluster: &TestCluster) {
    let root = repo_root();
    for file in ["deploy/namespace.yaml", "deploy/crds/kubetun.yaml"] {
        let path = root.join(file);
        cluster
            .kubectl(&["apply", "-f", path.to_str().unwrap()])
            .unwrap_or_else(|e| panic!("{}: {e}", cluster.name()));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for plural in [
        "networkconfigs.net.kubetun.io",
        "tunnelendpoints.net.kubetun.io",
        "shortcutconnections.net.kubetun.io",
        "networks.net.kubetun.io",
        "networkids.net.kubetun.io",
    ] {
        loop {
            match cluster.kubectl(&["get", plural, "-A", "-o", "name"]) {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => panic!("{plural} does not answer: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

/// Starts `names` as clusters with kubetun's CRDs and namespace, or `None` (skip).
pub async fn clusters<const N: usize>(names: [&str; N]) -> Option<[TestCluster; N]> {
    kubetun_controller::plumbing::kubeconfig::install_tls_provider();
    let clusters = kubetun_testenv::clusters_or_skip(names).await?;
    futures::future::join_all(clusters.iter().map(install)).await;
    Some(clusters)
}

/// A leaf as its controller would run it: cluster info published, reconcilers on watches
/// (`network_config::run`), a fake gateway.
pub struct Leaf {
    pub info: ClusterInfo,
    pub client: kube::Client,
    pub gateway: FakeGateway,
    task: Option<JoinHandle<()>>,
    ctx: Arc<Context>,
}

impl Leaf {
    pub async fn start(cluster: &TestCluster, id: &str, pod: &str, external: &str) -> Self {
        let client = cluster.client().await.unwrap();
        let key = GatewayKey::generate();
        let info = kubetun_controller_testing::cluster_info(id, pod, external, &key);
        info.publish(&client, NAMESPACE).await.unwrap();
        let gateway = FakeGateway::start().await.unwrap();
        let settings = kubetun_controller_testing::gateway_settings(&key, &info);
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
        let mut leaf = Self {
            info,
            client,
            gateway,
            task: None,
            ctx,
        };
        leaf.run_controller();
        leaf
    }

    /// (Re)starts the reconcilers.
    pub fn run_controller(&mut self) {
        self.stop_controller();
        self.task = Some(tokio::spawn(network_config::run(self.ctx.clone())));
    }

    /// Stops the reconcilers (an outage of this cluster's controller).
    pub fn stop_controller(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for Leaf {
    fn drop(&mut self) {
        self.stop_controller();
    }
}

/// Runs the `kubetun` CLI with `args`; colour is never forced (stdout/stderr are pipes).
pub async fn kubetun(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::process::Command::new(kubetun_testenv::bin_path("kubetun"))
        .args(&args)
        .env_remove("NO_COLOR")
        .env_remove("KUBETUN_LOG")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A kubeconfig whose API server does not listen (a cluster in an outage).
pub fn unreachable_kubeconfig(dir: &Path) -> PathBuf {
    let path = dir.join("unreachable.kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1
kind: Config
current-context: gone
clusters:
- name: gone
  cluster: {server: 'https://127.0.0.1:9', insecure-skip-tls-verify: true}
contexts:
- name: gone
  context: {cluster: gone, user: gone}
users:
- name: gone
  user: {token: not-a-token}
",
    )
    .unwrap();
    path
}
