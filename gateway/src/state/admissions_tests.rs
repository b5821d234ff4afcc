use super::*;
use crate::state::from_proto as state_from_proto;
use kubetun_gateway_core::key::Key;
use kubetun_gateway_core::state::DesiredState;

fn endpoint(address: &str, protocol: proto::Protocol, port: u32) -> proto::AdmittedEndpoint {
    proto::AdmittedEndpoint {
        address: address.into(),
        protocol: protocol as i32,
        port,
    }
}

fn admission(cluster: &str, views: &[&str]) -> proto::Admission {
    proto::Admission {
        cluster: cluster.into(),
        isolation: proto::Isolation::Exported as i32,
        views: views.iter().map(|v| (*v).into()).collect(),
        endpoints: vec![endpoint("10.0.0.5", proto::Protocol::Tcp, 80)],
        policies: Vec::new(),
    }
}

fn policy(name: &str, sources: &[&str]) -> proto::SourcePolicy {
    proto::SourcePolicy {
        name: name.into(),
        endpoints: vec![endpoint("10.0.0.5", proto::Protocol::Tcp, 80)],
        sources: sources.iter().map(|s| (*s).into()).collect(),
    }
}

fn request(admissions: Vec<proto::Admission>) -> proto::DesiredState {
    proto::DesiredState {
        version: "v1".into(),
        interface: Some(proto::Interface {
            private_key: Key::from_bytes([1; 32]).to_base64(),
            ..Default::default()
        }),
        peers: Vec::new(),
        admissions,
    }
}

fn rejection(admissions: Vec<proto::Admission>) -> String {
    state_from_proto(request(admissions), &DesiredState::default())
        .expect_err("rejected")
        .to_string()
}

#[test]
fn accepts_open_and_exported_clusters_of_both_families() {
    let mut b = admission("b", &["10.68.0.0/16", "fd68::/64"]);
    b.endpoints
        .push(endpoint("fd00::5", proto::Protocol::Sctp, 3868));
    b.endpoints
        .push(endpoint("10.0.0.5", proto::Protocol::Udp, 53));
    let mut c = admission("c", &["10.69.0.0/16"]);
    c.isolation = proto::Isolation::Open as i32;
    let state = state_from_proto(request(vec![b, c]), &DesiredState::default()).expect("valid");
    assert_eq!(state.admissions.len(), 2);
    let b = &state.admissions[0];
    assert_eq!(b.isolation, Isolation::Exported);
    assert_eq!(b.views.len(), 2);
    assert_eq!(
        b.endpoints[1],
        AdmittedEndpoint {
            address: "fd00::5".parse().expect("address"),
            protocol: Protocol::Sctp,
            port: 3868,
        }
    );
    assert_eq!(state.admissions[1].isolation, Isolation::Open);
}

#[test]
fn rejects_malformed_admissions_with_readable_messages() {
    let mut bad_address = admission("b", &["10.68.0.0/16"]);
    bad_address.endpoints[0].address = "10.0.0.300".into();
    assert_eq!(
        rejection(vec![bad_address]),
        "admission b: endpoint address \"10.0.0.300\" is not an IP address"
    );
    let mut port_zero = admission("b", &["10.68.0.0/16"]);
    port_zero.endpoints[0].port = 0;
    assert_eq!(
        rejection(vec![port_zero]),
        "admission b: endpoint 10.0.0.5 Tcp: port 0 is out of range 1..=65535"
    );
    let mut port_high = admission("b", &["10.68.0.0/16"]);
    port_high.endpoints[0].port = 70_000;
    assert!(rejection(vec![port_high]).contains("port 70000 is out of range"));
    let mut isolation = admission("b", &["10.68.0.0/16"]);
    isolation.isolation = 7;
    assert_eq!(
        rejection(vec![isolation]),
        "admission b: unknown isolation 7 (expected ISOLATION_OPEN or ISOLATION_EXPORTED)"
    );
    let mut protocol = admission("b", &["10.68.0.0/16"]);
    protocol.endpoints[0].protocol = 9;
    assert!(rejection(vec![protocol]).contains("unknown protocol 9"));
    assert_eq!(
        rejection(vec![admission("b", &["10.68.0.0/33"])]),
        "admission b: view: invalid CIDR \"10.68.0.0/33\""
    );
    assert!(rejection(vec![admission("b", &["10.68.0.1/16"])]).contains("host bits set"));
}

#[test]
fn rejects_duplicate_clusters_and_views_that_overlap_another_clusters() {
    assert_eq!(
        rejection(vec![
            admission("b", &["10.68.0.0/16"]),
            admission("b", &["10.69.0.0/16"]),
        ]),
        "admission b: a second admission for the same cluster"
    );
    assert_eq!(
        rejection(vec![
            admission("b", &["10.0.0.0/8"]),
            admission("c", &["10.69.0.0/16"]),
        ]),
        "admission c: view 10.69.0.0/16 overlaps view 10.0.0.0/8 of cluster b"
    );
    assert!(
        rejection(vec![
            admission("b", &["fd68::/64"]),
            admission("c", &["fd68::/64"]),
        ])
        .contains("overlaps view fd68::/64 of cluster")
    );
    assert_eq!(
        rejection(vec![admission("", &["10.68.0.0/16"])]),
        "admission #0: the cluster id is empty"
    );
    // Nested views of one cluster, and neighbours of two, are fine.
    state_from_proto(
        request(vec![
            admission("b", &["10.0.0.0/8", "10.68.0.0/16"]),
            admission("c", &["11.0.0.0/8"]),
        ]),
        &DesiredState::default(),
    )
    .expect("valid");
}

#[test]
fn accepts_source_policies_and_rejects_malformed_ones_with_readable_messages() {
    let mut b = admission("b", &["10.68.0.0/16", "fd68::/64"]);
    b.policies = vec![
        policy("shop/web", &["10.68.0.7", "fd68::7"]),
        policy("shop/none", &[]),
    ];
    let state = state_from_proto(request(vec![b]), &DesiredState::default()).expect("valid");
    let policies = &state.admissions[0].policies;
    assert_eq!(policies.len(), 2);
    assert_eq!(policies[0].name, "shop/web");
    assert_eq!(policies[0].sources.len(), 2);
    assert!(
        policies[1].sources.is_empty(),
        "a policy that selects nothing"
    );

    let with = |policies: Vec<proto::SourcePolicy>| {
        let mut b = admission("b", &["10.68.0.0/16"]);
        b.policies = policies;
        rejection(vec![b])
    };
    assert_eq!(
        with(vec![policy("shop/web", &["10.68.0.700"])]),
        "admission b: policy shop/web: source \"10.68.0.700\" is not an IP address"
    );
    assert_eq!(
        with(vec![policy("shop/web", &["10.99.0.7"])]),
        "admission b: policy shop/web: source 10.99.0.7 is in none of the cluster's views"
    );
    assert_eq!(
        with(vec![policy("shop/web", &[]), policy("shop/web", &[])]),
        "admission b: policy shop/web: a second policy of that name"
    );
    assert_eq!(
        with(vec![policy("", &[])]),
        "admission b: a policy without a name"
    );
    let mut elsewhere = policy("shop/web", &[]);
    elsewhere.endpoints[0].port = 81;
    assert_eq!(
        with(vec![elsewhere]),
        "admission b: policy shop/web: endpoint 10.0.0.5 Tcp 81 is not among the admitted endpoints"
    );
    let mut port_zero = policy("shop/web", &[]);
    port_zero.endpoints[0].port = 0;
    assert_eq!(
        with(vec![port_zero]),
        "admission b: policy shop/web: endpoint 10.0.0.5 Tcp: port 0 is out of range 1..=65535"
    );
}
