//! The harness itself against a real API server: it starts, serves TLS with RBAC, survives an
//! API-server crash with its data, and hands out ServiceAccount identities RBAC applies to.

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::Api;
use kube::api::PostParams;

#[tokio::test]
async fn starts_restarts_and_keeps_data() {
    let Some(mut cluster) = kubetun_testenv::cluster_or_skip("harness").await else {
        return;
    };
    let client = cluster.client().await.expect("admin client");
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut map = ConfigMap::default();
    map.metadata.name = Some("survivor".into());
    maps.create(&PostParams::default(), &map)
        .await
        .expect("create");

    cluster
        .restart_apiserver(true)
        .await
        .expect("restart after SIGKILL");
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client().await.expect("client"), "default");
    assert!(
        maps.get_opt("survivor").await.expect("get").is_some(),
        "etcd kept the object across the API-server crash"
    );

    // RBAC is on: a fresh ServiceAccount may not read ConfigMaps.
    let accounts: Api<ServiceAccount> =
        Api::namespaced(cluster.client().await.expect("client"), "default");
    let mut account = ServiceAccount::default();
    account.metadata.name = Some("nobody".into());
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("create ServiceAccount");
    let kubeconfig = cluster
        .service_account_kubeconfig("default", "nobody")
        .await
        .expect("TokenRequest");
    let as_nobody: Api<ConfigMap> = Api::namespaced(
        kubetun_testenv::client_for(&kubeconfig)
            .await
            .expect("client"),
        "default",
    );
    match as_nobody.get("survivor").await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("RBAC must forbid the read, got {other:?}"),
    }
}
