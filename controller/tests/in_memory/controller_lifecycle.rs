//! Finalizer cleanup of a peer that is being deleted, and Network ACLs reaching the gateway.

use crate::controller_support;

use std::collections::BTreeSet;

use controller_support::{Cluster, NAMESPACE, api_server_builder, connect};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kubetun_controller::gateway_api::DesiredState;
use kubetun_controller::ipam::IpamConfig;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_controller_testing::FakeGateway;
use kubetun_crds::contract::link::FINALIZER;
use kubetun_crds::{
    Network, NetworkPeering, NetworkPeeringStatus, NetworkRef, NetworkSpec, NetworkStatus,
    PeeringState,
};

#[tokio::test]
async fn a_deleting_peer_is_cleaned_up_through_the_finalizer() {
    // Rome's NetworkConfig and TunnelEndpoint as a previous controller left them, then the
    // user deleted the NetworkConfig: it waits on our finalizer.
    let europe = Cluster::start("europe", "10.200.0.0/16", "10.70.0.0/16").await;
    let rome = Cluster::start("rome", "10.202.0.0/16", "10.70.0.0/16").await;
    connect(&europe, &rome).await;
    let mut deleting = europe.config("from-rome").await.unwrap();
    assert_eq!(deleting.finalizers(), [FINALIZER]);
    let view = europe.view_of("rome", "10.70.0.0/16").await.unwrap();
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    deleting.metadata.resource_version = None;
    let mut endpoint = europe.endpoint("rome").await.unwrap();
    endpoint.metadata.resource_version = None;
    let to_rome = europe.config("to-rome").await.unwrap();

    let client = api_server_builder()
        .with_object(deleting)
        .with_object(endpoint)
        .with_object(to_rome)
        .build()
        .await
        .unwrap();
    let restarted = Cluster::start_on(
        client,
        "europe",
        "10.200.0.0/16",
        "10.70.0.0/16",
        IpamConfig::default(),
    )
    .await;
    // The view is restored from the status even though the object is going away ...
    let restored: BTreeSet<String> = restarted
        .ctx
        .ipam()
        .allocations()
        .filter(|a| a.owner == "rome")
        .map(|a| a.view.to_string())
        .collect();
    assert_eq!(restored, BTreeSet::from(["10.202.0.0/16".to_owned(), view]));
    restarted.sync().await;
    // ... and released by the cleanup, which also removed the TunnelEndpoint and let the
    // object go.
    assert!(restarted.config("from-rome").await.is_none());
    assert!(restarted.endpoint("rome").await.is_none());
    assert_eq!(restarted.ctx.ipam().allocations().count(), 0);
    assert!(restarted.gateway.current().unwrap().peers.is_empty());
}

fn network(name: &str, cluster_id: Option<&str>, prefixes: &[&str], peer: Option<&str>) -> Network {
    let mut network = Network::new(
        name,
        NetworkSpec {
            id: None,
            cluster_id: cluster_id.map(str::to_owned),
            prefixes: prefixes.iter().map(|p| (*p).to_owned()).collect(),
            peerings: peer
                .map(|peer| NetworkPeering {
                    name: peer.to_owned(),
                    network_ref: NetworkRef {
                        name: peer.to_owned(),
                        namespace: None,
                    },
                    prefixes: vec![],
                })
                .into_iter()
                .collect(),
        },
    );
    network.metadata.namespace = Some(NAMESPACE.to_owned());
    network
}

#[tokio::test]
async fn ready_network_peerings_become_the_gateway_acl_and_unready_ones_fail_closed() {
    let europe = Cluster::start("europe", "10.200.0.0/16", "10.70.0.0/16").await;
    let rome = Cluster::start("rome", "10.202.0.0/16", "10.70.0.0/16").await;
    let milan = Cluster::start("milan", "10.203.0.0/16", "10.70.0.0/16").await;

    // Rome's network peers with Europe's; Milan's network exists but nothing peers with it.
    let networks: Api<Network> = Api::namespaced(europe.client.clone(), NAMESPACE);
    let pp = PostParams::default();
    let rome_net = networks
        .create(
            &pp,
            &network(
                "rome-apps",
                Some("rome"),
                &["10.202.1.0/24"],
                Some("europe-apps"),
            ),
        )
        .await
        .unwrap();
    networks
        .create(
            &pp,
            &network("milan-apps", Some("milan"), &["10.203.1.0/24"], None),
        )
        .await
        .unwrap();
    networks
        .create(
            &pp,
            &network("europe-apps", None, &["10.200.1.0/24"], Some("rome-apps")),
        )
        .await
        .unwrap();
    // What the Network controller writes once both sides reference each other.
    let status = NetworkStatus {
        peerings: vec![NetworkPeeringStatus {
            name: "rome-apps".into(),
            state: PeeringState::Ready,
            message: String::new(),
            prefixes: vec!["10.202.1.0/24".into()],
            peer_uid: rome_net.uid(),
        }],
        ..NetworkStatus::default()
    };
    networks
        .patch_status(
            "europe-apps",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({ "status": status })),
        )
        .await
        .unwrap();

    connect(&europe, &rome).await;
    connect(&europe, &milan).await;

    let te = europe.endpoint("rome").await.unwrap();
    assert_eq!(
        te.spec.allowed_prefixes,
        Some(vec!["10.202.1.0/24".to_owned()])
    );
    assert_eq!(
        europe
            .endpoint("milan")
            .await
            .unwrap()
            .spec
            .allowed_prefixes,
        Some(vec![])
    );

    let state = europe.gateway.current().unwrap();
    let acl = |name: &str| {
        state
            .peers
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .acl
            .clone()
    };
    assert_eq!(acl("rome").unwrap().allowed, ["10.202.1.0/24"]);
    assert!(
        acl("milan").unwrap().allowed.is_empty(),
        "no Ready peering: nothing passes"
    );
    // Rome's own gateway has no Network objects: no ACL at all.
    assert_eq!(rome.gateway.current().unwrap().peers[0].acl, None);
}

/// The client the controller talks to its gateway with: Apply, Status and a rejection.
#[tokio::test]
async fn apply_status_and_rejection_round_trip() {
    let gateway = FakeGateway::start().await.unwrap();
    let client = GatewayClient::new(gateway.socket());
    let state = DesiredState {
        version: "v1".into(),
        ..DesiredState::default()
    };
    let response = client.apply(state.clone()).await.unwrap();
    assert!(response.changed);
    assert!(!client.apply(state).await.unwrap().changed);
    assert_eq!(client.status().await.unwrap().version, "v1");

    gateway.reject_with(Some("route 10.0.0.0/8 overlaps"));
    let error = client.apply(DesiredState::default()).await.unwrap_err();
    assert!(error.is_rejection());
    assert!(
        error.to_string().contains("route 10.0.0.0/8 overlaps"),
        "{error}"
    );
}
