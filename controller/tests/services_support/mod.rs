//! Shared by the services tests on real API servers: the MCS CRDs and RBAC installed, an
//! in-process services loop per cluster, the objects of an exported Service, waits.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kubetun_controller::context::{Context, ControllerConfig};
use kubetun_controller::ipam::IpamConfig;
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::services::dns_server::SharedTable;
use kubetun_controller::services::metrics::ServiceMetrics;
use kubetun_controller::services::sync;
use kubetun_crds::mcs::v1beta1::ServiceExport;
use kubetun_testenv::TestCluster;
use serde_json::json;

use crate::realapi_support::{self, NAMESPACE, repo_root};

pub const SHOP: &str = "shop";

pub async fn install_services(cluster: &TestCluster) {
    for file in ["deploy/crds/multicluster.yaml", "deploy/rbac.yaml"] {
        let path = repo_root().join(file);
        cluster
            .kubectl(&["apply", "-f", path.to_str().unwrap()])
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster
        .kubectl(&["get", "serviceexports.multicluster.x-k8s.io", "-A"])
        .is_err()
    {
        assert!(Instant::now() < deadline, "ServiceExports do not answer");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The services loop of one cluster, in-process, as the controller's ServiceAccount (so
/// `deploy/rbac.yaml` is what it may do).
pub async fn run_services(
    cluster: &TestCluster,
    id: &str,
    pod: &str,
) -> tokio::task::JoinHandle<()> {
    run_services_with_dns(
        cluster,
        id,
        pod,
        SharedTable::default(),
        ServiceMetrics::default(),
    )
    .await
}

pub async fn run_services_with_dns(
    cluster: &TestCluster,
    id: &str,
    pod: &str,
    dns: SharedTable,
    metrics: ServiceMetrics,
) -> tokio::task::JoinHandle<()> {
    let key = GatewayKey::generate();
    let info = kubetun_controller::testing::cluster_info(id, pod, "192.168.250.0/24", &key);
    let settings = kubetun_controller::testing::gateway_settings(&key, &info);
    let kubeconfig = cluster
        .service_account_kubeconfig(NAMESPACE, "kubetun-controller")
        .await
        .unwrap();
    let client = kubetun_testenv::client_for(&kubeconfig).await.unwrap();
    let ctx = Context::new(
        client,
        ControllerConfig {
            namespace: NAMESPACE.into(),
            cluster: info,
            ipam: IpamConfig::default(),
            gateway: settings,
        },
        None,
    )
    .await
    .unwrap();
    assert!(sync::available(&ctx).await, "the MCS CRDs are installed");
    tokio::spawn(sync::run(Arc::<Context>::clone(&ctx), dns, metrics))
}

pub async fn apply(client: &Client, namespace: Option<&str>, object: serde_json::Value) {
    let kind = object["kind"].as_str().unwrap().to_owned();
    let name = object["metadata"]["name"].as_str().unwrap().to_owned();
    let gvk = kube::api::GroupVersionKind::try_from(&kube::api::TypeMeta {
        api_version: object["apiVersion"].as_str().unwrap().to_owned(),
        kind,
    })
    .unwrap();
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    let api: Api<kube::api::DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        &name,
        &PatchParams::apply("test").force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("{name}: {e}"));
}

pub fn web_service(port: i32) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": SHOP},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}})
}

pub fn web_slice(name: &str, endpoints: &[(&str, bool)]) -> serde_json::Value {
    let endpoints: Vec<_> = endpoints
        .iter()
        .map(|(ip, ready)| json!({"addresses": [ip], "conditions": {"ready": ready}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": SHOP, "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

pub fn export(name: &str) -> serde_json::Value {
    json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
        "metadata": {"name": name, "namespace": SHOP}})
}

/// Waits (≤ 15 s) until `check` gives `Some`, returning it and how long that took.
pub async fn until<T, F, Fut>(what: &str, mut check: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return (value, start.elapsed());
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rome's imported endpoints of shop/web: address → ready.
pub async fn imported_endpoints(rome: &Client) -> BTreeMap<String, bool> {
    let slices: Api<EndpointSlice> = Api::namespaced(rome.clone(), SHOP);
    let list = slices
        .list(&ListParams::default().labels("multicluster.kubernetes.io/service-name=web,multicluster.kubernetes.io/source-cluster=milan"))
        .await
        .unwrap();
    list.items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .flat_map(|e| {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
            e.addresses.iter().map(move |a| (a.clone(), ready))
        })
        .collect()
}

pub fn condition(export: &ServiceExport, type_: &str) -> Option<(String, String, String)> {
    let status = export.status.as_ref()?;
    let c = status.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Runs the CLI, which must succeed; its stdout.
pub async fn cli_ok(args: &[&str]) -> String {
    let out = realapi_support::kubetun(args).await;
    let stdout = realapi_support::text(&out.stdout);
    assert!(
        out.status.success(),
        "kubetun {args:?}: {stdout}{}",
        realapi_support::text(&out.stderr)
    );
    stdout
}
