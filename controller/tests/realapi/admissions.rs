//! Isolation and admissions on real API servers: Milan's controller (NetworkConfig
//! reconcilers, gateway sync and services loop on one context, an in-process gateway) linked
//! to Rome. Its TunnelEndpoint of Rome takes the isolation Milan wrote (never what Rome
//! sends), its gateway's admission of Rome follows Milan's exports within 2 s (measured), and
//! a ServiceExport's consumers narrow both the exporter's admissions and the importers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kubetun_controller::gateway_api::{self, DesiredState};
use kubetun_controller::ipam::IpamConfig;
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::operator::network_config;
use kubetun_controller::operator::network_config::context::{Context, ControllerConfig};
use kubetun_controller::operator::services::sync;
use kubetun_controller::plumbing::cluster_info::ClusterInfo;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_controller_testing::FakeGateway;
use kubetun_crds::contract::services::CONSUMERS_ANNOTATION;
use kubetun_crds::mcs::v1beta1::{ServiceExport, ServiceImport};
use kubetun_crds::{ExportedService, Isolation, NetworkConfig, TunnelEndpoint};
use serde_json::json;

use crate::realapi_support::{self, NAMESPACE};
use crate::services_support::*;

/// Milan's controller in-process: reconcilers, gateway sync and services on one context.
pub(crate) struct Exporter {
    pub(crate) info: ClusterInfo,
    pub(crate) gateway: FakeGateway,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

pub(crate) async fn start_exporter(
    cluster: &kubetun_testenv::TestCluster,
    isolation: Isolation,
) -> Exporter {
    let key = GatewayKey::generate();
    let info =
        kubetun_controller_testing::cluster_info("milan", "10.70.0.0/16", "10.80.0.0/16", &key);
    let admin = cluster.client().await.unwrap();
    info.publish(&admin, NAMESPACE).await.unwrap();
    let mut settings = kubetun_controller_testing::gateway_settings(&key, &info);
    settings.isolation = isolation;
    let gateway = FakeGateway::start().await.unwrap();
    let kubeconfig = cluster
        .service_account_kubeconfig(NAMESPACE, "kubetun-controller")
        .await
        .unwrap();
    let client = kubetun_testenv::client_for(&kubeconfig).await.unwrap();
    let ctx = Context::new(
        client,
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
    assert!(sync::available(&ctx).await, "the MCS CRDs are installed");
    let tasks = vec![
        tokio::spawn(network_config::run(Arc::clone(&ctx))),
        tokio::spawn(sync::run(
            Arc::clone(&ctx),
            Default::default(),
            Default::default(),
        )),
    ];
    Exporter {
        info,
        gateway,
        tasks,
    }
}

/// Milan's admission of Rome in `state`, if any.
fn rome_admission(state: &DesiredState) -> Option<&gateway_api::Admission> {
    state.admissions.iter().find(|a| a.cluster == "rome")
}

fn admits(state: &DesiredState, address: &str, port: u32) -> bool {
    rome_admission(state).is_some_and(|a| {
        a.isolation == gateway_api::Isolation::Exported as i32
            && a.endpoints.iter().any(|e| {
                e.address == address
                    && e.port == port
                    && e.protocol == gateway_api::Protocol::Tcp as i32
            })
    })
}

/// Waits (≤ 15 s) until the gateway runs a state for which `check` holds.
pub(crate) async fn until_gateway(
    gateway: &FakeGateway,
    what: &str,
    check: impl Fn(&DesiredState) -> bool,
) -> Duration {
    let (_, took) = until(what, || async {
        gateway.current().filter(|s| check(s)).map(|_| ())
    })
    .await;
    took
}

async fn tunnel_isolation(client: &kube::Client) -> Option<Isolation> {
    Api::<TunnelEndpoint>::namespaced(client.clone(), NAMESPACE)
        .get_opt("rome")
        .await
        .unwrap()
        .map(|te| te.spec.isolation)
}

pub(crate) fn median(mut figures: Vec<Duration>) -> Duration {
    figures.sort();
    figures[figures.len() / 2]
}

fn export_with_consumers(value: Option<&str>) -> serde_json::Value {
    let mut object = export("web");
    if let Some(value) = value {
        object["metadata"]["annotations"] = json!({ CONSUMERS_ANNOTATION: value });
    }
    object
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_reach_the_admissions_within_two_seconds_and_the_peer_cannot_open_its_link() {
    let Some([milan_cluster]) = realapi_support::clusters(["milan"]).await else {
        return;
    };
    install_services(&milan_cluster).await;
    let milan = milan_cluster.client().await.unwrap();
    create_shop(&[&milan]).await;
    let exporter = start_exporter(&milan_cluster, Isolation::Exported).await;
    let gateway = &exporter.gateway;

    // Linked to Rome as the connector links it; Rome asks for an open link in what it
    // sends (its `to-milan`, our `from-rome`).
    let rome_info = kubetun_controller_testing::cluster_info(
        "rome",
        "10.60.0.0/16",
        "10.61.0.0/16",
        &GatewayKey::generate(),
    );
    let configs: Api<NetworkConfig> = Api::namespaced(milan.clone(), NAMESPACE);
    kubetun_controller_testing::link_as_connector(&configs, NAMESPACE, &exporter.info, &rome_info)
        .await
        .unwrap();
    let connector = PatchParams::apply(kubetun_controller::connector::FIELD_MANAGER).force();
    let mut rome_wish = rome_info.network_config_for(&exporter.info.cluster);
    rome_wish.isolation = Some(Isolation::Open);
    configs
        .patch(
            "from-rome",
            &connector,
            &Patch::Apply(&kubetun_controller::connector::network_config(
                "from-rome",
                NAMESPACE,
                kubetun_crds::contract::link::ROLE_REMOTE,
                "rome",
                &rome_wish,
            )),
        )
        .await
        .unwrap();
    until("Milan's TunnelEndpoint of Rome", || async {
        tunnel_isolation(&milan).await
    })
    .await;
    until_gateway(gateway, "an admission of Rome", |s| {
        rome_admission(s).is_some()
    })
    .await;
    assert_eq!(
        tunnel_isolation(&milan).await,
        Some(Isolation::Exported),
        "Milan's default, whatever Rome sends"
    );
    let admission = rome_admission(&gateway.current().unwrap()).unwrap().clone();
    assert_eq!(admission.isolation, gateway_api::Isolation::Exported as i32);
    assert_eq!(admission.views, ["10.60.0.0/16", "10.61.0.0/16"]);
    assert!(admission.endpoints.is_empty(), "nothing exported yet");

    // A NetworkConfig with an isolation that is neither is refused with the reason.
    let refused = configs
        .patch(
            "to-rome",
            &PatchParams::apply("test"),
            &Patch::Apply(
                json!({"apiVersion": "net.kubetun.io/v1alpha1", "kind": "NetworkConfig",
                "metadata": {"name": "to-rome"}, "spec": {"isolation": "wide"}}),
            ),
        )
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("supported values: \"open\", \"exported\""),
        "{refused}"
    );

    // Export and unexport, timed from the ServiceExport's write to the Apply.
    apply(&milan, Some(SHOP), web_service(80)).await;
    apply(
        &milan,
        Some(SHOP),
        web_slice("web-1", &[("10.70.1.5", true), ("10.70.1.6", false)]),
    )
    .await;
    let exports: Api<ServiceExport> = Api::namespaced(milan.clone(), SHOP);
    let (mut exported, mut unexported) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let start = Instant::now();
        apply(&milan, Some(SHOP), export("web")).await;
        until_gateway(gateway, "the export admitted", |s| {
            admits(s, "10.70.1.5", 8080) && admits(s, "10.70.1.6", 8080)
        })
        .await;
        exported.push(start.elapsed());
        let start = Instant::now();
        exports
            .delete("web", &DeleteParams::default())
            .await
            .unwrap();
        until_gateway(gateway, "the unexport refused", |s| {
            rome_admission(s).is_some_and(|a| a.endpoints.is_empty())
        })
        .await;
        unexported.push(start.elapsed());
    }
    println!(
        "export -> Apply admitting it: {exported:?}, median {:?}",
        median(exported.clone())
    );
    println!(
        "unexport -> Apply refusing it: {unexported:?}, median {:?}",
        median(unexported.clone())
    );
    assert!(median(exported) <= Duration::from_secs(2));
    assert!(median(unexported) <= Duration::from_secs(2));

    // Endpoints changing reach the admission too.
    apply(&milan, Some(SHOP), export("web")).await;
    until_gateway(gateway, "exported again", |s| admits(s, "10.70.1.5", 8080)).await;
    let start = Instant::now();
    apply(
        &milan,
        Some(SHOP),
        web_slice("web-1", &[("10.70.1.5", true), ("10.70.2.7", true)]),
    )
    .await;
    until_gateway(gateway, "the new endpoint", |s| {
        admits(s, "10.70.2.7", 8080) && !admits(s, "10.70.1.6", 8080)
    })
    .await;
    println!("endpoint change -> Apply: {:?}", start.elapsed());

    // Consumers: an export for Paris only admits nothing of Rome's; a typo fails closed with
    // a condition; naming Rome admits it again.
    let start = Instant::now();
    apply(&milan, Some(SHOP), export_with_consumers(Some("paris"))).await;
    until_gateway(gateway, "not for Rome", |s| {
        rome_admission(s).is_some_and(|a| a.endpoints.is_empty())
    })
    .await;
    println!("consumers without Rome -> Apply: {:?}", start.elapsed());
    apply(
        &milan,
        Some(SHOP),
        export_with_consumers(Some("paris,,rome")),
    )
    .await;
    let (invalid, _) = until("InvalidConsumers", || async {
        condition(&exports.get("web").await.unwrap(), "Valid").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(invalid.1, "InvalidConsumers");
    assert!(invalid.2.contains("an entry is empty"), "{}", invalid.2);
    until("no offer while invalid", || async {
        Api::<ExportedService>::namespaced(milan.clone(), NAMESPACE)
            .get_opt("shop.web")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    apply(
        &milan,
        Some(SHOP),
        export_with_consumers(Some("paris, rome")),
    )
    .await;
    until_gateway(gateway, "for Rome again", |s| admits(s, "10.70.2.7", 8080)).await;
    let offer = Api::<ExportedService>::namespaced(milan.clone(), NAMESPACE)
        .get("shop.web")
        .await
        .unwrap();
    assert_eq!(
        offer.spec.consumers,
        Some(vec!["paris".to_owned(), "rome".to_owned()])
    );

    // The link's own setting (Milan's `to-rome`) decides: open, then exported again, each
    // applied within 2 s.
    for (isolation, expected) in [
        (Isolation::Open, gateway_api::Isolation::Open),
        (Isolation::Exported, gateway_api::Isolation::Exported),
    ] {
        let start = Instant::now();
        configs
            .patch(
                "to-rome",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"isolation": isolation.as_str()}})),
            )
            .await
            .unwrap();
        let took = until_gateway(gateway, "the link's isolation", |s| {
            rome_admission(s).is_some_and(|a| a.isolation == expected as i32)
        })
        .await;
        let took = took.max(start.elapsed());
        println!("isolation {isolation} -> Apply: {took:?}");
        assert!(took <= Duration::from_secs(2), "{took:?}");
        assert_eq!(tunnel_isolation(&milan).await, Some(isolation));
    }
    // Rome writing `open` into everything it can write (its copy in Milan) changed nothing.
    assert_eq!(
        configs.get("from-rome").await.unwrap().spec.isolation,
        Some(Isolation::Open)
    );
    assert_eq!(tunnel_isolation(&milan).await, Some(Isolation::Exported));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_importer_not_named_in_the_consumers_gets_no_import_and_loses_it() {
    let Some([rome_cluster, milan_cluster]) = realapi_support::clusters(["rome", "milan"]).await
    else {
        return;
    };
    install_services_on(&[&rome_cluster, &milan_cluster]).await;
    let rome = rome_cluster.client().await.unwrap();
    let milan = milan_cluster.client().await.unwrap();
    create_shop(&[&rome, &milan]).await;
    link_by_hand(&rome, &milan_cluster).await;
    let _rome_task = run_services(&rome_cluster, "rome", "10.60.0.0/16").await;
    let _milan_task = run_services(&milan_cluster, "milan", "10.70.0.0/16").await;

    apply(&milan, Some(SHOP), web_service(80)).await;
    apply(
        &milan,
        Some(SHOP),
        web_slice("web-1", &[("10.70.1.5", true)]),
    )
    .await;
    apply(&milan, Some(SHOP), export_with_consumers(Some("paris"))).await;
    let offers: Api<ExportedService> = Api::namespaced(milan.clone(), NAMESPACE);
    until("Milan's offer for Paris", || async {
        offers
            .get_opt("shop.web")
            .await
            .unwrap()
            .filter(|o| o.spec.consumers.as_deref() == Some(&["paris".to_owned()][..]))
    })
    .await;
    // Milan imports its own export; Rome, not named, imports nothing (given time to).
    until("Milan's own import", || async {
        Api::<ServiceImport>::namespaced(milan.clone(), SHOP)
            .get_opt("web")
            .await
            .unwrap()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let imports: Api<ServiceImport> = Api::namespaced(rome.clone(), SHOP);
    assert!(imports.get_opt("web").await.unwrap().is_none());
    assert!(imported_endpoints(&rome).await.is_empty());

    // Named: imported, in Rome's views.
    apply(
        &milan,
        Some(SHOP),
        export_with_consumers(Some("paris,rome")),
    )
    .await;
    let (_, took) = until("Rome's import", || async {
        let e = imported_endpoints(&rome).await;
        (e.len() == 1).then_some(())
    })
    .await;
    println!("named as a consumer -> Rome's endpoints: {took:?}");
    assert!(imports.get_opt("web").await.unwrap().is_some());
    assert!(
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(rome.clone(), SHOP)
            .get_opt("mcs-web")
            .await
            .unwrap()
            .is_some()
    );

    // No longer named: the import, its derived Service and slices go.
    apply(&milan, Some(SHOP), export_with_consumers(Some("paris"))).await;
    let (_, took) = until("Rome's import gone", || async {
        imports
            .get_opt("web")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    println!("consumer removed -> Rome's import gone: {took:?}");
    until("Rome's derived Service and slices gone", || async {
        let derived = Api::<k8s_openapi::api::core::v1::Service>::namespaced(rome.clone(), SHOP)
            .get_opt("mcs-web")
            .await
            .unwrap();
        (derived.is_none() && imported_endpoints(&rome).await.is_empty()).then_some(())
    })
    .await;
}
