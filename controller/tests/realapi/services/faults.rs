//! Services across clusters survive their faults: Rome's controller restarting does not delete
//! and remake what it imported, and Milan's API server going away (SIGKILL) leaves Rome's
//! imports as they were until it is back, when Milan's next endpoint change arrives.

use std::time::{Duration, Instant};

use crate::realapi_support;
use crate::services_support::*;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use kubetun_crds::mcs::v1beta1::ServiceImport;

/// The uids and resourceVersions of everything Rome imported for shop/web.
async fn imported_objects(rome: &kube::Client) -> Vec<(String, String, String)> {
    let mut objects = Vec::new();
    let import = Api::<ServiceImport>::namespaced(rome.clone(), SHOP)
        .get("web")
        .await
        .unwrap();
    let derived = Api::<Service>::namespaced(rome.clone(), SHOP)
        .get("mcs-web")
        .await
        .unwrap();
    objects.push((
        "ServiceImport".into(),
        import.uid().unwrap(),
        import.resource_version().unwrap(),
    ));
    objects.push((
        "Service".into(),
        derived.uid().unwrap(),
        derived.resource_version().unwrap(),
    ));
    let slices = Api::<EndpointSlice>::namespaced(rome.clone(), SHOP)
        .list(&ListParams::default().labels("multicluster.kubernetes.io/service-name=web"))
        .await
        .unwrap();
    for slice in slices {
        objects.push((
            slice.name_any(),
            slice.uid().unwrap(),
            slice.resource_version().unwrap(),
        ));
    }
    objects.sort();
    objects
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imports_survive_a_controller_restart_and_the_exporters_api_server_going_away() {
    let Some([rome_cluster, mut milan_cluster]) =
        realapi_support::clusters(["rome", "milan"]).await
    else {
        return;
    };
    install_services_on(&[&rome_cluster, &milan_cluster]).await;
    let rome = rome_cluster.client().await.unwrap();
    let milan = milan_cluster.client().await.unwrap();
    create_shop(&[&rome, &milan]).await;
    link_by_hand(&rome, &milan_cluster).await;
    let milan_task = run_services(&milan_cluster, "milan", "10.70.0.0/16").await;
    let mut rome_task = run_services(&rome_cluster, "rome", "10.60.0.0/16").await;
    apply(&milan, Some(SHOP), web_service(80)).await;
    apply(
        &milan,
        Some(SHOP),
        web_slice("web-1", &[("10.70.1.5", true)]),
    )
    .await;
    apply(&milan, Some(SHOP), export("web")).await;
    until("imported", || async {
        let endpoints = imported_endpoints(&rome).await;
        (endpoints.len() == 1).then_some(())
    })
    .await;
    // Let the first writes settle (the import's status, the ClusterSetIP).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = imported_objects(&rome).await;

    // Rome's controller restarts: the same objects, not one of them written again.
    rome_task.abort();
    rome_task = run_services(&rome_cluster, "rome", "10.60.0.0/16").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        imported_objects(&rome).await,
        before,
        "a restart rewrites nothing"
    );

    // Milan's API server is killed: Rome keeps what it imported.
    milan_cluster.stop_apiserver(true).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        imported_objects(&rome).await,
        before,
        "an exporter's outage removes nothing"
    );
    assert_eq!(imported_endpoints(&rome).await.len(), 1);

    // Back: Milan's next change reaches Rome.
    milan_cluster.start_apiserver().await.unwrap();
    let back = Instant::now();
    let milan = milan_cluster.client().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let slice = web_slice("web-1", &[("10.70.1.5", true), ("10.70.1.8", true)]);
        let applied = tokio::time::timeout(Duration::from_secs(2), async {
            let gvk_api: Api<EndpointSlice> = Api::namespaced(milan.clone(), SHOP);
            gvk_api
                .patch(
                    "web-1",
                    &kube::api::PatchParams::apply("test").force(),
                    &kube::api::Patch::Apply(&slice),
                )
                .await
        })
        .await;
        if matches!(applied, Ok(Ok(_))) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Milan's API server does not come back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, took) = until("Milan's change in Rome after the outage", || async {
        (imported_endpoints(&rome).await.get("10.71.1.8") == Some(&true)).then_some(())
    })
    .await;
    println!(
        "exporter's API server back -> its change in Rome: {:?} (of which {took:?} after the change was accepted)",
        back.elapsed()
    );
    rome_task.abort();
    milan_task.abort();
}
