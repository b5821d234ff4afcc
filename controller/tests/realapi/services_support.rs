//! Shared by the services tests on real API servers: the MCS CRDs and RBAC installed, an
//! in-process services loop per cluster, the objects of an exported Service, waits.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kubetun_controller::ipam::IpamConfig;
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::operator::network_config::context::{Context, ControllerConfig};
use kubetun_controller::operator::services::dns_server::SharedTable;
use kubetun_controller::operator::services::metrics::ServiceMetrics;
use kubetun_controller::operator::services::sync;
use kubetun_crds::contract::services::{CREDENTIAL_KEY, CREDENTIAL_LABEL};
use kubetun_crds::mcs::v1beta1::ServiceExport;
use kubetun_crds::{CidrMapping, ClusterRef, TunnelEndpoint, TunnelEndpointSpec};
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

/// [`install_services`] on every cluster at once.
pub async fn install_services_on(clusters: &[&TestCluster]) {
    futures::future::join_all(clusters.iter().map(|c| install_services(c))).await;
}

/// Creates the namespace of the test's Services in each cluster.
pub async fn create_shop(clients: &[&Client]) {
    for client in clients {
        let namespace: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": SHOP}})).unwrap();
        Api::<k8s_openapi::api::core::v1::Namespace>::all((*client).clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
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
    let info = kubetun_controller_testing::cluster_info(id, pod, "192.168.250.0/24", &key);
    let settings = kubetun_controller_testing::gateway_settings(&key, &info);
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

/// Links Rome to Milan by hand, as `network connect` would (tested on its own): a reader of
/// Milan's ExportedServices and its kubeconfig in Rome's credential Secret, and Rome's
/// TunnelEndpoint of Milan (Milan's 10.70.0.0/16 seen as 10.71.0.0/16). Returns the reader's
/// kubeconfig.
pub async fn link_by_hand(rome: &Client, milan_cluster: &TestCluster) -> PathBuf {
    let milan = milan_cluster.client().await.unwrap();
    // Milan's credential for Rome: it may read ExportedServices in kubetun's namespace only.
    apply(&milan, Some(NAMESPACE), json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "rome-reader", "namespace": NAMESPACE}})).await;
    apply(&milan, Some(NAMESPACE), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "rome-reader", "namespace": NAMESPACE},
        "rules": [{"apiGroups": ["net.kubetun.io"], "resources": ["exportedservices"], "verbs": ["get", "list", "watch"]}]})).await;
    apply(
        &milan,
        Some(NAMESPACE),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "rome-reader", "namespace": NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rome-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "rome-reader", "namespace": NAMESPACE}]}),
    )
    .await;
    let reader_path = milan_cluster
        .service_account_kubeconfig(NAMESPACE, "rome-reader")
        .await
        .unwrap();
    // Its context namespace is Milan's kubetun namespace, where the exports are.
    let mut config: serde_json::Value =
        serde_yaml::from_slice(&std::fs::read(&reader_path).unwrap()).unwrap();
    config["contexts"][0]["context"]["namespace"] = NAMESPACE.into();
    let reader_kubeconfig = serde_yaml::to_string(&config).unwrap().into_bytes();
    std::fs::write(&reader_path, &reader_kubeconfig).unwrap();
    let mut secret = Secret::default();
    secret.metadata.name = Some("kubetun-services-milan".into());
    secret.metadata.labels = Some(BTreeMap::from([(
        CREDENTIAL_LABEL.to_owned(),
        "milan".to_owned(),
    )]));
    secret.data = Some(BTreeMap::from([(
        CREDENTIAL_KEY.to_owned(),
        ByteString(reader_kubeconfig),
    )]));
    Api::<Secret>::namespaced(rome.clone(), NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    // Rome's link to Milan: Milan's pods 10.70.0.0/16 are 10.71.0.0/16 here.
    let te = TunnelEndpoint::new(
        "milan",
        TunnelEndpointSpec {
            cluster: ClusterRef {
                id: "milan".into(),
                name: "Milan".into(),
            },
            remote_pod_cidrs: vec![CidrMapping {
                real: "10.70.0.0/16".into(),
                view: "10.71.0.0/16".into(),
            }],
            public_key: "x".repeat(43) + "=",
            endpoint: kubetun_crds::Endpoint {
                address: "192.0.2.1".into(),
                port: 51820,
            },
            ..TunnelEndpointSpec::default()
        },
    );
    Api::<TunnelEndpoint>::namespaced(rome.clone(), NAMESPACE)
        .create(&PostParams::default(), &te)
        .await
        .unwrap();
    reader_path
}
