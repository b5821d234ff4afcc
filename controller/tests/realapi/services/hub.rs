//! Services across clusters through a hub: Rome and Milan (both 10.70.0.0/16) linked only by a
//! hub-only ShortcutConnection on Europe. The hub's operator gives each leaf a credential for
//! the other's exports, Milan's Service is imported in Rome at Rome's view of Milan (the same
//! view whichever path carries it), and deleting the shortcut removes import and credentials.

use crate::realapi_support::{self, Leaf, NAMESPACE};
use crate::services_support::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kubetun_controller::operator::shortcut;
use kubetun_crds::TunnelEndpoint;
use kubetun_crds::mcs::v1beta1::ServiceImport;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_is_imported_across_a_hub_only_shortcut() {
    let Some([hub, rome_cluster, milan_cluster]) =
        realapi_support::clusters(["hub", "rome", "milan"]).await
    else {
        return;
    };
    install_services_on(&[&hub, &rome_cluster, &milan_cluster]).await;
    let _europe = Leaf::start(&hub, "europe", "10.200.0.0/16", "10.80.0.0/16").await;
    let _rome_leaf = Leaf::start(&rome_cluster, "rome", "10.70.0.0/16", "10.90.0.0/16").await;
    let _milan_leaf = Leaf::start(&milan_cluster, "milan", "10.70.0.0/16", "10.91.0.0/16").await;
    let hub_client = hub.client().await.unwrap();
    let _operator = tokio::spawn(shortcut::run(
        hub_client.clone(),
        Some(NAMESPACE.to_owned()),
        "europe".to_owned(),
        kubetun_controller::plumbing::runtime::ApiHealth::new(hub_client.clone()),
    ));
    let rome = rome_cluster.client().await.unwrap();
    let milan = milan_cluster.client().await.unwrap();
    let tasks = [
        run_services(&rome_cluster, "rome", "10.70.0.0/16").await,
        run_services(&milan_cluster, "milan", "10.70.0.0/16").await,
    ];
    create_shop(&[&rome, &milan]).await;
    apply(&milan, Some(SHOP), web_service(80)).await;
    apply(
        &milan,
        Some(SHOP),
        web_slice("web-1", &[("10.70.3.9", true)]),
    )
    .await;
    apply(&milan, Some(SHOP), export("web")).await;

    let paths = [
        hub.kubeconfig_path(),
        rome_cluster.kubeconfig_path(),
        milan_cluster.kubeconfig_path(),
    ];
    let [hub_k, rome_k, milan_k] = paths.each_ref().map(|p| p.to_str().unwrap());
    for leaf in [rome_k, milan_k] {
        cli_ok(&[
            "network",
            "connect",
            "--kubeconfig",
            hub_k,
            "--remote-kubeconfig",
            leaf,
            "--wait",
            "--timeout",
            "60s",
        ])
        .await;
    }
    cli_ok(&[
        "shortcut",
        "create",
        "rome-milan",
        "--kubeconfig",
        hub_k,
        "--left-name",
        "rome",
        "--left-kubeconfig",
        rome_k,
        "--right-name",
        "milan",
        "--right-kubeconfig",
        milan_k,
        "--transit",
        "--hub-only",
        "--wait",
        "--timeout",
        "60s",
    ])
    .await;

    // Rome reaches Milan only through the hub, at its own view of Milan's pods.
    let tunnels: Api<TunnelEndpoint> = Api::namespaced(rome.clone(), NAMESPACE);
    let (te, _) = until("Rome's hub-only TunnelEndpoint of Milan", || async {
        tunnels
            .get_opt("milan")
            .await
            .unwrap()
            .filter(|te| te.spec.hub_only)
    })
    .await;
    let view: ipnet::Ipv4Net = te.spec.remote_pod_cidrs[0].view.parse().unwrap();
    let expected = std::net::Ipv4Addr::from(u32::from(view.network()) | 0x0309).to_string();
    let imports: Api<ServiceImport> = Api::namespaced(rome.clone(), SHOP);
    let (_, took) = until("Rome's import through the hub", || async {
        let endpoints = imported_endpoints(&rome).await;
        (endpoints.get(&expected) == Some(&true)
            && imports.get_opt("web").await.ok()??.spec.ips.len() == 1)
            .then_some(())
    })
    .await;
    println!(
        "hub-only shortcut: Milan's web imported in Rome at {expected} ({took:?} after the shortcut)"
    );
    // The hub's own links to the leaves carry credentials too (it may import their exports).
    let hub_secrets = Api::<Secret>::namespaced(hub_client.clone(), NAMESPACE);
    for leaf in ["rome", "milan"] {
        let credential = hub_secrets
            .get_opt(&format!("kubetun-services-{leaf}"))
            .await
            .unwrap();
        assert!(
            credential.is_some(),
            "the hub imports from {leaf} over its own link"
        );
    }
    let rome_secrets = Api::<Secret>::namespaced(rome.clone(), NAMESPACE);
    assert!(
        rome_secrets
            .get_opt("kubetun-services-milan")
            .await
            .unwrap()
            .is_some()
    );

    // The shortcut goes: Rome's credential for Milan and the import go with it.
    cli_ok(&[
        "shortcut",
        "delete",
        "rome-milan",
        "--kubeconfig",
        hub_k,
        "--wait",
        "--timeout",
        "60s",
    ])
    .await;
    until("import gone with the shortcut", || async {
        (imports.get_opt("web").await.unwrap().is_none()
            && rome_secrets
                .get_opt("kubetun-services-milan")
                .await
                .unwrap()
                .is_none())
        .then_some(())
    })
    .await;
    for task in tasks {
        task.abort();
    }
}
