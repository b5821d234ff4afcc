//! Services across clusters with real workloads: Milan runs kube-controller-manager and
//! fake-kubelet, so its exported Service's EndpointSlices come from a real Deployment's pods
//! (addresses from Milan's pod CIDR 10.70.0.0/16); Rome imports them at its view 10.71.0.0/16.
//! Scaling the Deployment and deleting a pod reach Rome's slices; the time each took is
//! printed (it includes the EndpointSlice controller and fake-kubelet's 0.5 s polling).

use std::time::Instant;

use crate::realapi_support;
use crate::services_support::*;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

fn deployment(replicas: i32) -> serde_json::Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": SHOP},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1",
                    "ports": [{"name": "http", "containerPort": 8080}]}]}}}})
}

/// Rome's imported ready addresses of shop/web, all in 10.71.0.0/16.
async fn ready_in_rome(rome: &kube::Client) -> Vec<String> {
    let endpoints = imported_endpoints(rome).await;
    let ready: Vec<String> = endpoints
        .into_iter()
        .filter(|(_, r)| *r)
        .map(|(a, _)| a)
        .collect();
    for address in &ready {
        assert!(
            address.starts_with("10.71."),
            "{address} is not Rome's view of Milan"
        );
    }
    ready
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployments_pods_in_milan_are_endpoints_in_rome() {
    let Some([rome_cluster, milan_cluster]) = realapi_support::clusters(["rome", "milan"]).await
    else {
        return;
    };
    let _workloads = match milan_cluster.start_workloads("10.70.0.0/16", "milan-node-1") {
        Ok(workloads) => workloads,
        Err(e) => {
            assert!(!kubetun_testenv::required(), "CI=true: {e}");
            eprintln!("skipping: {e}");
            return;
        }
    };
    install_services_on(&[&rome_cluster, &milan_cluster]).await;
    let rome = rome_cluster.client().await.unwrap();
    let milan = milan_cluster.client().await.unwrap();
    create_shop(&[&rome, &milan]).await;
    link_by_hand(&rome, &milan_cluster).await;
    let tasks = [
        run_services(&milan_cluster, "milan", "10.70.0.0/16").await,
        run_services(&rome_cluster, "rome", "10.60.0.0/16").await,
    ];
    apply(&milan, Some(SHOP), deployment(3)).await;
    apply(
        &milan,
        Some(SHOP),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": SHOP},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
    )
    .await;
    let started = Instant::now();
    apply(&milan, Some(SHOP), export("web")).await;
    let (ready, took) = until("three pods as Rome's endpoints", || async {
        let ready = ready_in_rome(&rome).await;
        (ready.len() == 3).then_some(ready)
    })
    .await;
    println!(
        "Deployment of 3 + export -> 3 endpoints in Rome: {took:?} ({:?} in all)",
        started.elapsed()
    );
    let pods = Api::<Pod>::namespaced(milan.clone(), SHOP)
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    let mut milan_ips: Vec<String> = pods
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    let mut rome_ips: Vec<String> = ready
        .iter()
        .map(|a| a.replacen("10.71.", "10.70.", 1))
        .collect();
    milan_ips.sort();
    rome_ips.sort();
    assert_eq!(
        milan_ips, rome_ips,
        "Rome's endpoints are Milan's pods, in Rome's view"
    );

    // A pod deleted: its replacement's address replaces it in Rome.
    let victim = pods.items[0].name_any();
    let victim_ip = pods.items[0]
        .status
        .as_ref()
        .unwrap()
        .pod_ip
        .clone()
        .unwrap()
        .replacen("10.70.", "10.71.", 1);
    let churn = Instant::now();
    Api::<Pod>::namespaced(milan.clone(), SHOP)
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    until("the replacement pod in Rome", || async {
        let ready = ready_in_rome(&rome).await;
        (ready.len() == 3 && !ready.contains(&victim_ip)).then_some(())
    })
    .await;
    println!(
        "pod deleted in Milan -> replaced in Rome's slice: {:?}",
        churn.elapsed()
    );

    // Scaled down to one: one endpoint in Rome.
    let scale = Instant::now();
    apply(&milan, Some(SHOP), deployment(1)).await;
    until("one endpoint in Rome", || async {
        (ready_in_rome(&rome).await.len() == 1).then_some(())
    })
    .await;
    println!(
        "scaled to 1 in Milan -> 1 endpoint in Rome: {:?}",
        scale.elapsed()
    );
    for task in tasks {
        task.abort();
    }
}
