//! The route agent against an in-memory API server: TunnelEndpoints, Nodes and the gateway pod
//! become the node's plan, a gateway pod moved to another node moves every route with it, and
//! only a deleted DaemonSet (not a restart) counts as an uninstall.

#![allow(clippy::unwrap_used)]

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeSpec, NodeStatus, Pod, PodCondition, PodStatus,
};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use kube_fake_client::ClientBuilder;
use kubetun_agent::daemon::AgentError;
use kubetun_agent::daemon::{AgentConfig, AttachmentMode, DEFAULT_GATEWAY_SELECTOR, desired_state};
use kubetun_agent::netlink::Underlay;
use kubetun_agent::plan::{AgentSettings, RuleSelector};
use kubetun_agent::source::{GatewayLocator, SourceError};
use kubetun_crds::{CidrMapping, ClusterRef, TunnelEndpoint, TunnelEndpointSpec};

const NS: &str = "kubetun-system";

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn node(name: &str, address: &str, pods: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            pod_cidrs: Some(vec![pods.to_owned()]),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".to_owned(),
                address: address.to_owned(),
            }]),
            ..NodeStatus::default()
        }),
    }
}

fn gateway_pod(name: &str, host: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(NS.to_owned()),
            labels: Some(
                [
                    ("app.kubernetes.io/name".to_owned(), "kubetun".to_owned()),
                    (
                        "app.kubernetes.io/component".to_owned(),
                        "gateway".to_owned(),
                    ),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: Some("Running".to_owned()),
            host_ip: Some(host.to_owned()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        }),
    }
}

fn tunnel_endpoint(peer: &str, pod_view: &str, external_view: &str) -> TunnelEndpoint {
    let mut te = TunnelEndpoint::new(
        peer,
        TunnelEndpointSpec {
            cluster: ClusterRef {
                id: peer.to_owned(),
                name: peer.to_owned(),
            },
            remote_pod_cidrs: vec![CidrMapping {
                real: "10.70.0.0/16".to_owned(),
                view: pod_view.to_owned(),
            }],
            remote_external_cidrs: vec![CidrMapping {
                real: "10.80.0.0/16".to_owned(),
                view: external_view.to_owned(),
            }],
            mtu: Some(1400),
            ..TunnelEndpointSpec::default()
        },
    );
    te.metadata.namespace = Some(NS.to_owned());
    te
}

async fn fake_api(pods: Vec<Pod>) -> Client {
    ClientBuilder::new()
        .with_resource::<TunnelEndpoint>()
        .with_objects(vec![
            tunnel_endpoint("rome", "10.201.0.0/16", "10.211.0.0/16"),
            tunnel_endpoint("milan", "10.202.0.0/16", "10.212.0.0/16"),
        ])
        .with_objects(vec![
            node("gw", "192.168.0.10", "10.0.0.0/24"),
            node("a", "192.168.0.11", "10.0.1.0/24"),
            node("b", "192.168.0.12", "10.0.2.0/24"),
        ])
        .with_objects(pods)
        .build()
        .await
        .unwrap()
}

fn config(node: &str, attachment: AttachmentMode) -> AgentConfig {
    AgentConfig {
        namespace: NS.to_owned(),
        node_name: node.to_owned(),
        node_ip: None,
        locator: GatewayLocator::Pod {
            selector: DEFAULT_GATEWAY_SELECTOR.to_owned(),
        },
        attachment,
        settings: AgentSettings::default(),
    }
}

const UNDERLAY: Underlay = Underlay {
    mtu: 1500,
    network: IpNet::V4(ipnet::Ipv4Net::new_assert(
        std::net::Ipv4Addr::new(192, 168, 0, 0),
        24,
    )),
};

#[tokio::test]
async fn a_member_node_routes_every_view_to_the_gateway_pods_node() {
    let client = fake_api(vec![gateway_pod("gateway-0", "192.168.0.10")]).await;
    let (desired, view) = desired_state(&client, &config("a", AttachmentMode::Auto), UNDERLAY)
        .await
        .unwrap();
    assert_eq!(view.gateway_ip, ip("192.168.0.10"));
    assert_eq!(view.endpoints.len(), 2);
    let views = [
        "10.201.0.0/16",
        "10.202.0.0/16",
        "10.211.0.0/16",
        "10.212.0.0/16",
    ]
    .map(net);
    assert_eq!(
        desired.rules,
        views.iter().map(|v| RuleSelector::To(*v)).collect()
    );
    for view in views {
        let route = &desired.routes[&view];
        assert_eq!(route.via, Some(ip("192.168.0.10")));
        assert_eq!((route.mtu, route.advmss), (Some(1400), Some(1360)));
    }
    assert_eq!(desired.overlay, None, "same subnet: direct");
}

#[tokio::test]
async fn the_gateway_node_routes_pod_cidrs_back() {
    let client = fake_api(vec![gateway_pod("gateway-0", "192.168.0.10")]).await;
    let (desired, _) = desired_state(&client, &config("gw", AttachmentMode::Overlay), UNDERLAY)
        .await
        .unwrap();
    assert!(
        desired
            .rules
            .iter()
            .all(|r| matches!(r, RuleSelector::From(_)))
    );
    assert_eq!(
        desired.routes.keys().copied().collect::<Vec<_>>(),
        vec![net("10.0.1.0/24"), net("10.0.2.0/24")]
    );
    let link = desired.overlay.unwrap();
    assert_eq!(link.flood_to.len(), 2);
}

#[tokio::test]
async fn a_rescheduled_gateway_pod_moves_the_routes() {
    let client = fake_api(vec![gateway_pod("gateway-0", "192.168.0.10")]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("gateway-0", &Default::default()).await.unwrap();
    pods.create(
        &PostParams::default(),
        &gateway_pod("gateway-1", "192.168.0.12"),
    )
    .await
    .unwrap();
    let (desired, view) = desired_state(&client, &config("a", AttachmentMode::Direct), UNDERLAY)
        .await
        .unwrap();
    assert_eq!(view.gateway_ip, ip("192.168.0.12"));
    assert!(
        desired
            .routes
            .values()
            .all(|r| r.via == Some(ip("192.168.0.12")))
    );

    let (on_new_gateway, _) =
        desired_state(&client, &config("b", AttachmentMode::Direct), UNDERLAY)
            .await
            .unwrap();
    assert!(
        on_new_gateway
            .rules
            .iter()
            .all(|r| matches!(r, RuleSelector::From(_)))
    );
}

#[tokio::test]
async fn no_gateway_pod_is_an_error_not_an_empty_plan() {
    let client = fake_api(vec![]).await;
    let error = desired_state(&client, &config("a", AttachmentMode::Auto), UNDERLAY)
        .await
        .unwrap_err();
    assert!(
        matches!(error, AgentError::Source(SourceError::NoGateway { .. })),
        "{error}"
    );
}

#[tokio::test]
async fn a_fixed_gateway_ip_needs_no_pod() {
    let client = fake_api(vec![]).await;
    let mut config = config("a", AttachmentMode::Overlay);
    config.locator = GatewayLocator::Fixed(ip("192.168.0.11"));
    let (desired, _) = desired_state(&client, &config, UNDERLAY).await.unwrap();
    assert!(
        desired
            .rules
            .iter()
            .all(|r| matches!(r, RuleSelector::From(_))),
        "a is the gateway node now"
    );
}

#[tokio::test]
async fn only_a_deleted_daemonset_means_uninstall() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use kubetun_agent::daemon::uninstalling;

    let daemonset = DaemonSet {
        metadata: ObjectMeta {
            name: Some("kubetun-route-agent".to_owned()),
            namespace: Some(NS.to_owned()),
            ..ObjectMeta::default()
        },
        ..DaemonSet::default()
    };
    let client = ClientBuilder::new()
        .with_object(daemonset)
        .build()
        .await
        .unwrap();
    assert!(
        !uninstalling(&client, NS, "kubetun-route-agent").await,
        "a restart keeps the routes"
    );
    Api::<DaemonSet>::namespaced(client.clone(), NS)
        .delete("kubetun-route-agent", &Default::default())
        .await
        .unwrap();
    assert!(
        uninstalling(&client, NS, "kubetun-route-agent").await,
        "the DaemonSet is gone"
    );
}
