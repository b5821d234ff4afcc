//! Isolation through the NetworkConfig controller: our own `to-` NetworkConfig sets a link's
//! isolation (what the peer sends does not), and a state with an `exported` link waits for
//! this cluster's exports instead of being applied without them (the last state stays).

use crate::controller_support;

use controller_support::{Cluster, announce_spec, connect, settle};
use kubetun_controller::gateway_api::{self, Admission, AdmittedEndpoint};
use kubetun_controller::planner::ExportEndpoints;
use kubetun_crds::Isolation;

fn rome_admission(europe: &Cluster) -> Admission {
    europe
        .gateway
        .current()
        .expect("a state")
        .admissions
        .into_iter()
        .find(|a| a.cluster == "rome")
        .expect("an admission of rome")
}

#[tokio::test]
async fn our_own_setting_decides_and_an_exported_state_waits_for_the_exports() {
    let europe = Cluster::start("europe", "10.200.0.0/16", "10.70.0.0/16").await;
    let rome = Cluster::start("rome", "10.202.0.0/16", "10.70.0.0/16").await;
    connect(&europe, &rome).await;
    assert_eq!(
        rome_admission(&europe).isolation,
        gateway_api::Isolation::Open as i32,
        "no setting and no default: open, as before"
    );

    // Rome asks Europe for `exported` in what it sends: Europe's link stays open.
    let mut rome_wish = rome.info.network_config_for(&europe.info.cluster);
    rome_wish.isolation = Some(Isolation::Exported);
    announce_spec(&rome, &europe, rome_wish).await;
    settle(&[&europe, &rome]).await;
    assert_eq!(
        europe.endpoint("rome").await.unwrap().spec.isolation,
        Isolation::Open
    );
    assert_eq!(
        rome.endpoint("europe").await.unwrap().spec.isolation,
        Isolation::Exported,
        "Rome's own setting is Rome's to enforce"
    );

    // Europe's own setting: the TunnelEndpoint follows at once, the gateway keeps its last
    // state until Europe's exports are known.
    let mut own = europe.info.network_config_for(&rome.info.cluster);
    own.isolation = Some(Isolation::Exported);
    announce_spec(&europe, &rome, own).await;
    settle(&[&europe, &rome]).await;
    assert_eq!(
        europe.endpoint("rome").await.unwrap().spec.isolation,
        Isolation::Exported
    );
    assert_eq!(
        rome_admission(&europe).isolation,
        gateway_api::Isolation::Open as i32,
        "held back while the exports are unknown"
    );
    let web = AdmittedEndpoint {
        address: "10.200.0.5".into(),
        protocol: gateway_api::Protocol::Tcp as i32,
        port: 8080,
    };
    europe
        .ctx
        .exports
        .publish(kubetun_controller::plumbing::exports::Exports {
            endpoints: vec![ExportEndpoints {
                consumers: None,
                endpoints: vec![web.clone()],
                policies: Vec::new(),
            }],
            answers: Default::default(),
        });
    europe.sync().await;
    let admission = rome_admission(&europe);
    assert_eq!(admission.isolation, gateway_api::Isolation::Exported as i32);
    assert_eq!(admission.endpoints, [web]);
}
