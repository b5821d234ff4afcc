use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use kubetun_crds::{CidrMapping, ClusterRef, TunnelEndpointSpec};

use super::*;

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn node(name: &str, address: &str, pods: &[&str]) -> Node {
    Node {
        name: name.to_owned(),
        ip: ip(address),
        pod_cidrs: pods.iter().map(|p| net(p)).collect(),
    }
}

fn endpoint(
    peer: &str,
    pods: &[(&str, &str)],
    external: &[(&str, &str)],
    mtu: Option<u32>,
) -> TunnelEndpointSpec {
    let mappings = |list: &[(&str, &str)]| {
        list.iter()
            .map(|(real, view)| CidrMapping {
                real: (*real).to_owned(),
                view: (*view).to_owned(),
            })
            .collect()
    };
    TunnelEndpointSpec {
        cluster: ClusterRef {
            id: peer.to_owned(),
            name: peer.to_owned(),
        },
        remote_pod_cidrs: mappings(pods),
        remote_external_cidrs: mappings(external),
        mtu,
        ..TunnelEndpointSpec::default()
    }
}

fn nodes() -> Vec<Node> {
    vec![
        node("gw", "192.168.0.10", &["10.0.0.0/24"]),
        node("a", "192.168.0.11", &["10.0.1.0/24"]),
        node("b", "192.168.0.12", &["10.0.2.0/24", "fd00:0:2::/64"]),
    ]
}

fn endpoints() -> Vec<TunnelEndpointSpec> {
    vec![
        endpoint(
            "rome",
            &[("10.70.0.0/16", "10.201.0.0/16")],
            &[("10.80.0.0/16", "10.80.0.0/16")],
            None,
        ),
        endpoint(
            "milan",
            &[("10.70.0.0/16", "10.202.0.0/16")],
            &[],
            Some(1380),
        ),
    ]
}

fn plan_for(local: &str, gateway: &str, attachment: Attachment) -> DesiredState {
    let settings = AgentSettings::default();
    let nodes = nodes();
    let endpoints = endpoints();
    let local = nodes.iter().find(|n| n.name == local).unwrap();
    plan(&PlanInput {
        settings: &settings,
        attachment,
        local,
        underlay_mtu: 1500,
        gateway_ip: ip(gateway),
        gateway_pod_ip: None,
        nodes: &nodes,
        endpoints: &endpoints,
    })
    .unwrap()
}

#[test]
fn member_node_steers_every_remote_view_to_the_gateway_node() {
    let state = plan_for("a", "192.168.0.10", Attachment::Direct);
    assert_eq!(state.overlay, None);
    let views = [
        net("10.80.0.0/16"),
        net("10.201.0.0/16"),
        net("10.202.0.0/16"),
    ];
    assert_eq!(
        state.rules,
        views.iter().map(|v| RuleSelector::To(*v)).collect()
    );
    assert_eq!(state.routes.keys().copied().collect::<Vec<_>>(), views);
    for route in state.routes.values() {
        assert_eq!(route.via, Some(ip("192.168.0.10")));
        assert!(!route.via_overlay);
    }
    assert!(state.skipped.is_empty());
}

#[test]
fn route_mtu_and_mss_follow_each_tunnel() {
    let state = plan_for("a", "192.168.0.10", Attachment::Direct);
    let rome = &state.routes[&net("10.201.0.0/16")];
    assert_eq!((rome.mtu, rome.advmss), (Some(1420), Some(1380)));
    let milan = &state.routes[&net("10.202.0.0/16")];
    assert_eq!((milan.mtu, milan.advmss), (Some(1380), Some(1340)));
}

#[test]
fn the_overlay_caps_the_route_mtu() {
    let settings = AgentSettings::default();
    let nodes = nodes();
    let endpoints = vec![endpoint(
        "big",
        &[("10.70.0.0/16", "10.70.0.0/16")],
        &[],
        Some(9000),
    )];
    let state = plan(&PlanInput {
        settings: &settings,
        attachment: Attachment::Overlay,
        local: &nodes[1],
        underlay_mtu: 1500,
        gateway_ip: nodes[0].ip,
        gateway_pod_ip: None,
        nodes: &nodes,
        endpoints: &endpoints,
    })
    .unwrap();
    let route = &state.routes[&net("10.70.0.0/16")];
    assert_eq!((route.mtu, route.advmss), (Some(1450), Some(1410)));
    assert_eq!(state.overlay.unwrap().mtu, 1450);
}

#[test]
fn gateway_node_routes_pod_cidrs_back_to_their_nodes() {
    let state = plan_for("gw", "192.168.0.10", Attachment::Direct);
    assert_eq!(
        state.rules,
        [
            net("10.80.0.0/16"),
            net("10.201.0.0/16"),
            net("10.202.0.0/16")
        ]
        .iter()
        .map(|v| RuleSelector::From(*v))
        .collect()
    );
    let routes: Vec<(IpNet, Option<IpAddr>)> = state
        .routes
        .values()
        .map(|r| (r.destination, r.via))
        .collect();
    assert_eq!(
        routes,
        vec![
            (net("10.0.1.0/24"), Some(ip("192.168.0.11"))),
            (net("10.0.2.0/24"), Some(ip("192.168.0.12"))),
        ]
    );
    assert_eq!(
        state.skipped.len(),
        1,
        "the IPv6 pod CIDR has no IPv4 next hop"
    );
    assert_eq!(state.skipped[0].cidr, "fd00:0:2::/64");
}

#[test]
fn overlay_member_points_its_vxlan_at_the_gateway_node() {
    let state = plan_for("a", "192.168.0.10", Attachment::Overlay);
    let link = state.overlay.unwrap();
    assert_eq!(link.local, Ipv4Addr::new(192, 168, 0, 11));
    assert_eq!(link.remote, Some(Ipv4Addr::new(192, 168, 0, 10)));
    assert_eq!(link.address, "240.168.0.11/8".parse().unwrap());
    assert!(link.flood_to.is_empty());
    for route in state.routes.values() {
        assert_eq!(route.via, Some(ip("240.168.0.10")));
        assert!(route.via_overlay);
    }
}

#[test]
fn overlay_gateway_floods_to_every_member_node() {
    let state = plan_for("gw", "192.168.0.10", Attachment::Overlay);
    let link = state.overlay.unwrap();
    assert_eq!(link.remote, None);
    assert_eq!(
        link.flood_to,
        [
            Ipv4Addr::new(192, 168, 0, 11),
            Ipv4Addr::new(192, 168, 0, 12)
        ]
        .into()
    );
    assert_eq!(
        state.routes[&net("10.0.1.0/24")].via,
        Some(ip("240.168.0.11"))
    );
}

#[test]
fn a_moved_gateway_changes_every_next_hop_and_the_roles() {
    let before = plan_for("b", "192.168.0.10", Attachment::Overlay);
    let after = plan_for("b", "192.168.0.11", Attachment::Overlay);
    assert_eq!(
        before.overlay.unwrap().remote,
        Some(Ipv4Addr::new(192, 168, 0, 10))
    );
    assert_eq!(
        after.overlay.unwrap().remote,
        Some(Ipv4Addr::new(192, 168, 0, 11))
    );
    assert!(
        after
            .routes
            .values()
            .all(|r| r.via == Some(ip("240.168.0.11")))
    );

    let old_gateway = plan_for("gw", "192.168.0.11", Attachment::Direct);
    assert!(
        old_gateway
            .rules
            .iter()
            .all(|r| matches!(r, RuleSelector::To(_)))
    );
    let new_gateway = plan_for("a", "192.168.0.11", Attachment::Direct);
    assert!(
        new_gateway
            .rules
            .iter()
            .all(|r| matches!(r, RuleSelector::From(_)))
    );
    assert_eq!(
        new_gateway.routes[&net("10.0.0.0/24")].via,
        Some(ip("192.168.0.10"))
    );
}

#[test]
fn no_endpoints_means_no_routes_and_no_rules() {
    let settings = AgentSettings::default();
    let nodes = nodes();
    let state = plan(&PlanInput {
        settings: &settings,
        attachment: Attachment::Direct,
        local: &nodes[1],
        underlay_mtu: 1500,
        gateway_ip: nodes[0].ip,
        gateway_pod_ip: None,
        nodes: &nodes,
        endpoints: &[],
    })
    .unwrap();
    assert_eq!(state, DesiredState::default());
}

#[test]
fn bad_views_are_skipped_not_fatal() {
    let endpoints = vec![endpoint(
        "odd",
        &[
            ("10.70.0.0/16", "10.201.0.1/16"),
            ("10.71.0.0/16", "nonsense"),
            ("10.72.0.0/16", "10.203.0.0/16"),
        ],
        &[],
        None,
    )];
    let (views, skipped) = remote_views(&endpoints);
    assert_eq!(
        views.keys().copied().collect::<Vec<_>>(),
        vec![net("10.203.0.0/16")]
    );
    assert_eq!(skipped.len(), 2);
    assert!(skipped[0].reason.contains("host bits"), "{skipped:?}");
}

#[test]
fn a_view_shared_by_two_endpoints_takes_the_smaller_mtu() {
    let endpoints = vec![
        endpoint("x", &[("10.70.0.0/16", "10.201.0.0/16")], &[], Some(1400)),
        endpoint("y", &[("10.71.0.0/16", "10.201.0.0/16")], &[], Some(1300)),
    ];
    let (views, _) = remote_views(&endpoints);
    assert_eq!(views[&net("10.201.0.0/16")], 1300);
}

#[test]
fn ipv6_views_route_over_an_ipv6_gateway_address() {
    let settings = AgentSettings::default();
    let nodes = vec![node("gw", "fd00::10", &[]), node("a", "fd00::11", &[])];
    let endpoints = vec![endpoint(
        "v6",
        &[("fd70::/48", "fd71::/48")],
        &[("10.80.0.0/16", "10.80.0.0/16")],
        None,
    )];
    let state = plan(&PlanInput {
        settings: &settings,
        attachment: Attachment::Direct,
        local: &nodes[1],
        underlay_mtu: 1500,
        gateway_ip: nodes[0].ip,
        gateway_pod_ip: None,
        nodes: &nodes,
        endpoints: &endpoints,
    })
    .unwrap();
    let route = &state.routes[&net("fd71::/48")];
    assert_eq!(route.advmss, Some(1360));
    assert_eq!(state.skipped.len(), 1, "the IPv4 view has no IPv6 next hop");
}

#[test]
fn the_overlay_refuses_ipv6_nodes_and_tiny_underlays() {
    let settings = AgentSettings::default();
    let nodes = vec![node("gw", "fd00::10", &[]), node("a", "fd00::11", &[])];
    let input = PlanInput {
        settings: &settings,
        attachment: Attachment::Overlay,
        local: &nodes[1],
        underlay_mtu: 1500,
        gateway_ip: nodes[0].ip,
        gateway_pod_ip: None,
        nodes: &nodes,
        endpoints: &[],
    };
    assert!(matches!(
        plan(&input),
        Err(RoutePlanError::OverlayNeedsIpv4 { .. })
    ));

    let nodes = self::nodes();
    let input = PlanInput {
        local: &nodes[1],
        gateway_ip: nodes[0].ip,
        gateway_pod_ip: None,
        nodes: &nodes,
        underlay_mtu: 1300,
        ..input
    };
    assert_eq!(
        plan(&input),
        Err(RoutePlanError::UnderlayMtuTooSmall { mtu: 1300 })
    );
}

#[test]
fn overlay_addresses_keep_the_node_host_bits() {
    let overlay = OverlaySettings::default();
    assert_eq!(
        overlay.address_of(Ipv4Addr::new(172, 18, 0, 3)),
        Some(Ipv4Addr::new(240, 18, 0, 3))
    );
    assert_eq!(overlay.address_of(Ipv4Addr::new(10, 0, 0, 0)), None);
    assert_eq!(overlay.address_of(Ipv4Addr::new(10, 255, 255, 255)), None);
}

#[test]
fn auto_attachment_goes_direct_inside_the_subnet_and_overlay_beyond_it() {
    let settings = AgentSettings::default();
    let mut nodes = nodes();
    nodes.push(node("far", "172.16.5.20", &["10.0.9.0/24"]));
    let endpoints = endpoints();
    let subnet = net("192.168.0.0/24");
    let input = |local: usize, gateway: usize| PlanInput {
        settings: &settings,
        attachment: Attachment::Auto(subnet),
        local: &nodes[local],
        underlay_mtu: 1500,
        gateway_ip: nodes[gateway].ip,
        gateway_pod_ip: None,
        nodes: &nodes,
        endpoints: &endpoints,
    };

    let near = plan(&input(1, 0)).unwrap();
    assert_eq!(near.overlay, None);
    assert!(
        near.routes
            .values()
            .all(|r| r.via == Some(ip("192.168.0.10")))
    );

    let gateway = plan(&input(0, 0)).unwrap();
    let link = gateway.overlay.unwrap();
    assert_eq!(link.flood_to, [Ipv4Addr::new(172, 16, 5, 20)].into());
    let far_route = &gateway.routes[&net("10.0.9.0/24")];
    assert!(far_route.via_overlay);
    assert_eq!(far_route.via, Some(ip("240.16.5.20")));
    assert!(!gateway.routes[&net("10.0.1.0/24")].via_overlay);
}

#[test]
fn auto_gateway_node_without_far_nodes_needs_no_overlay() {
    let settings = AgentSettings::default();
    let nodes = nodes();
    let state = plan(&PlanInput {
        settings: &settings,
        attachment: Attachment::Auto(net("192.168.0.0/24")),
        local: &nodes[0],
        underlay_mtu: 1500,
        gateway_ip: nodes[0].ip,
        gateway_pod_ip: None,
        nodes: &nodes,
        endpoints: &endpoints(),
    })
    .unwrap();
    assert_eq!(state.overlay, None);
}

#[test]
fn a_gateway_in_its_own_pod_gets_the_views_from_its_node() {
    let settings = AgentSettings::default();
    let nodes = nodes();
    let endpoints = endpoints();
    let state = plan(&PlanInput {
        settings: &settings,
        attachment: Attachment::Direct,
        local: &nodes[0],
        underlay_mtu: 1500,
        gateway_ip: nodes[0].ip,
        gateway_pod_ip: Some(ip("10.0.0.7")),
        nodes: &nodes,
        endpoints: &endpoints,
    })
    .unwrap();
    let rome = &state.routes[&net("10.201.0.0/16")];
    assert_eq!(rome.via, Some(ip("10.0.0.7")));
    assert_eq!(rome.mtu, Some(1420));
    assert!(
        state
            .rules
            .contains(&RuleSelector::To(net("10.201.0.0/16")))
    );
    assert!(
        state
            .rules
            .contains(&RuleSelector::From(net("10.201.0.0/16")))
    );
    assert_eq!(
        state.routes[&net("10.0.1.0/24")].via,
        Some(ip("192.168.0.11"))
    );

    let member = plan(&PlanInput {
        settings: &settings,
        attachment: Attachment::Direct,
        local: &nodes[1],
        underlay_mtu: 1500,
        gateway_ip: nodes[0].ip,
        gateway_pod_ip: Some(ip("10.0.0.7")),
        nodes: &nodes,
        endpoints: &endpoints,
    })
    .unwrap();
    assert_eq!(
        member.routes[&net("10.201.0.0/16")].via,
        Some(ip("192.168.0.10")),
        "members still go through the gateway's node"
    );
}
