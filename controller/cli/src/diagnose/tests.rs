//! Every hop broken one at a time on a healthy pair of clusters, and the report's JSON.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kubetun_crds::{
    CidrMapping, ClusterRef, ConnectionState, ConnectionStatus, Endpoint, NetworkConfig,
    NetworkConfigSpec, NetworkConfigStatus, TunnelEndpoint, TunnelEndpointSpec,
    TunnelEndpointStatus,
};

use super::{Outcome, Side, diagnose, render};
use crate::output;
use kubetun_controller::plumbing::cluster_info::ClusterInfo;

/// 2026-11-25T00:00:00Z.
const NOW: i64 = 1_795_564_800;

fn cref(id: &str) -> ClusterRef {
    ClusterRef {
        id: id.into(),
        name: id.into(),
    }
}

fn info(id: &str, pod: &str, port: u16) -> ClusterInfo {
    ClusterInfo {
        cluster: cref(id),
        pod_cidrs: vec![pod.parse().unwrap()],
        external_cidrs: vec!["10.70.0.0/16".parse().unwrap()],
        service_cidrs: Vec::new(),
        endpoint: Endpoint {
            address: "192.0.2.1".into(),
            port,
        },
        public_key: format!("{id}-key"),
        mtu: 1420,
    }
}

fn mapping(real: &str, view: &str) -> CidrMapping {
    CidrMapping {
        real: real.into(),
        view: view.into(),
    }
}

fn condition(type_: &str, status: &str, reason: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: String::new(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

fn config(from: &ClusterInfo, to: &ClusterInfo, processed: bool) -> NetworkConfig {
    let mut cfg = NetworkConfig::new(
        &format!("{}-{}", from.cluster.id, to.cluster.id),
        NetworkConfigSpec {
            source_cluster: from.cluster.clone(),
            destination_cluster: to.cluster.clone(),
            endpoint: from.endpoint.clone(),
            public_key: from.public_key.clone(),
            ..NetworkConfigSpec::default()
        },
    );
    cfg.status = Some(NetworkConfigStatus {
        processed,
        conditions: vec![condition(
            kubetun_crds::contract::link::PROCESSED,
            "True",
            "Processed",
        )],
        ..NetworkConfigStatus::default()
    });
    cfg
}

/// `own`'s TunnelEndpoint to `peer`; `own` sees the peer's external CIDR as `view`, and
/// the peer sees ours as `ours_seen_as`.
fn tunnel(own: &ClusterInfo, peer: &ClusterInfo, view: &str, ours_seen_as: &str) -> TunnelEndpoint {
    let mut te = TunnelEndpoint::new(
        &peer.cluster.id,
        TunnelEndpointSpec {
            cluster: peer.cluster.clone(),
            local_pod_cidrs: vec![mapping(
                &own.pod_cidrs[0].to_string(),
                &own.pod_cidrs[0].to_string(),
            )],
            local_external_cidrs: vec![mapping("10.70.0.0/16", ours_seen_as)],
            remote_pod_cidrs: vec![mapping(
                &peer.pod_cidrs[0].to_string(),
                &peer.pod_cidrs[0].to_string(),
            )],
            remote_external_cidrs: vec![mapping("10.70.0.0/16", view)],
            endpoint: peer.endpoint.clone(),
            public_key: peer.public_key.clone(),
            mtu: Some(1420),
            allowed_prefixes: None,
            ..Default::default()
        },
    );
    te.status = Some(TunnelEndpointStatus {
        connection: Some(ConnectionStatus {
            status: ConnectionState::Connected,
            latency: Some("1.0ms".into()),
            last_handshake: Some("2026-11-24T23:59:00Z".into()),
            ..ConnectionStatus::default()
        }),
        conditions: vec![condition(
            kubetun_crds::contract::link::APPLIED,
            "True",
            "Applied",
        )],
        ..TunnelEndpointStatus::default()
    });
    te
}

/// Europe and Rome, linked and healthy: each remaps the other's 10.70.0.0/16.
fn healthy() -> (Side, Side) {
    let europe = info("europe", "10.200.0.0/16", 51820);
    let rome = info("rome", "10.202.0.0/16", 51821);
    let local = Side {
        label: "local".into(),
        info: Ok(europe.clone()),
        configs: vec![config(&europe, &rome, true), config(&rome, &europe, true)],
        tunnels: vec![tunnel(&europe, &rome, "10.71.0.0/16", "10.72.0.0/16")],
        agent: Some((3, 3)),
    };
    let remote = Side {
        label: "remote".into(),
        info: Ok(rome.clone()),
        configs: vec![config(&rome, &europe, true), config(&europe, &rome, true)],
        tunnels: vec![tunnel(&rome, &europe, "10.72.0.0/16", "10.71.0.0/16")],
        agent: Some((2, 2)),
    };
    (local, remote)
}

fn broken_hop(local: &Side, remote: Option<&Side>) -> Option<(String, String)> {
    diagnose(local, remote, None, NOW)
        .broken()
        .map(|c| (c.cluster.clone(), c.hop.clone()))
}

fn hop(cluster: &str, hop: &str) -> Option<(String, String)> {
    Some((cluster.into(), hop.into()))
}

#[test]
fn a_healthy_link_passes_every_hop_from_both_ends() {
    let (local, remote) = healthy();
    let report = diagnose(&local, Some(&remote), None, NOW);
    assert_eq!(report.broken(), None, "{}", render(&report));
    let hops: Vec<&str> = report.checks.iter().map(|c| c.hop.as_str()).collect();
    for expected in [
        "api",
        "outgoing-config",
        "processed-by-peer",
        "incoming-config",
        "tunnel-endpoint",
        "gateway-applied",
        "tunnel",
        "handshake",
        "allowed-ips",
        "peer-key",
        "peer-endpoint",
        "remap",
        "mtu",
        "route-agent",
    ] {
        assert!(hops.contains(&expected), "{expected} not checked: {hops:?}");
    }
    assert!(render(&report).ends_with("Every hop works.\n"));
    // Only the local side: its links, no pair checks.
    let alone = diagnose(&local, None, None, NOW);
    assert_eq!(alone.broken(), None, "{}", render(&alone));
    assert!(!alone.checks.iter().any(|c| c.hop == "remap"));
}

#[test]
fn an_unreachable_cluster_is_the_first_broken_hop() {
    let (local, mut remote) = healthy();
    remote.info = Err("(remote) cannot load the kubeconfig: connection refused".into());
    assert_eq!(broken_hop(&local, Some(&remote)), hop("remote", "api"));
    let report = diagnose(&local, Some(&remote), None, NOW);
    assert!(
        render(&report).contains("What to do: check the kubeconfig"),
        "{}",
        render(&report)
    );
}

#[test]
fn missing_and_unprocessed_network_configs_are_named() {
    let (mut local, remote) = healthy();
    local
        .configs
        .retain(|c| c.spec.source_cluster.id != "europe");
    assert_eq!(
        broken_hop(&local, Some(&remote)),
        hop("local", "outgoing-config")
    );

    let (local, mut remote) = healthy();
    for cfg in &mut remote.configs {
        if cfg.spec.source_cluster.id == "rome" {
            cfg.status.as_mut().unwrap().processed = false;
        }
    }
    assert_eq!(
        broken_hop(&local, Some(&remote)),
        hop("remote", "processed-by-peer")
    );

    let (mut local, remote) = healthy();
    for cfg in &mut local.configs {
        if cfg.spec.source_cluster.id == "rome" {
            let status = cfg.status.as_mut().unwrap();
            status.processed = false;
            status.conditions = vec![condition(
                kubetun_crds::contract::link::PROCESSED,
                "False",
                "PoolExhausted",
            )];
        }
    }
    let report = diagnose(&local, Some(&remote), None, NOW);
    let broken = report.broken().unwrap();
    assert_eq!(
        (broken.cluster.as_str(), broken.hop.as_str()),
        ("local", "incoming-config")
    );
    assert!(broken.detail.contains("PoolExhausted"), "{}", broken.detail);
}

#[test]
fn gateway_tunnel_and_handshake_failures_are_named() {
    let (mut local, remote) = healthy();
    local.tunnels.clear();
    assert_eq!(
        broken_hop(&local, Some(&remote)),
        hop("local", "tunnel-endpoint")
    );

    let (mut local, remote) = healthy();
    local.tunnels[0].status.as_mut().unwrap().conditions = vec![condition(
        kubetun_crds::contract::link::APPLIED,
        "False",
        "GatewayUnavailable",
    )];
    assert_eq!(
        broken_hop(&local, Some(&remote)),
        hop("local", "gateway-applied")
    );

    let (local, mut remote) = healthy();
    let conn = remote.tunnels[0]
        .status
        .as_mut()
        .unwrap()
        .connection
        .as_mut()
        .unwrap();
    conn.status = ConnectionState::Connecting;
    let report = diagnose(&local, Some(&remote), None, NOW);
    let broken = report.broken().unwrap();
    assert_eq!(
        (broken.cluster.as_str(), broken.hop.as_str()),
        ("remote", "tunnel")
    );
    assert!(broken.fix.contains("UDP"), "{}", broken.fix);

    let (mut local, remote) = healthy();
    let conn = local.tunnels[0]
        .status
        .as_mut()
        .unwrap()
        .connection
        .as_mut()
        .unwrap();
    conn.last_handshake = Some("2026-11-24T23:50:00Z".into());
    let report = diagnose(&local, Some(&remote), None, NOW);
    let broken = report.broken().unwrap();
    assert_eq!(
        (broken.cluster.as_str(), broken.hop.as_str()),
        ("local", "handshake")
    );
    assert!(broken.detail.contains("600 s ago"), "{}", broken.detail);
}

#[test]
fn acl_remap_key_mtu_and_agent_problems_are_named() {
    let (mut local, remote) = healthy();
    local.tunnels[0].spec.allowed_prefixes = Some(Vec::new());
    assert_eq!(
        broken_hop(&local, Some(&remote)),
        hop("local", "allowed-ips")
    );

    // Rome believes Europe sees its 10.70.0.0/16 as 10.73.0.0/16; Europe uses 10.71.
    let (local, mut remote) = healthy();
    remote.tunnels[0].spec.local_external_cidrs = vec![mapping("10.70.0.0/16", "10.73.0.0/16")];
    let report = diagnose(&local, Some(&remote), None, NOW);
    let broken = report.broken().unwrap();
    assert_eq!(
        (broken.cluster.as_str(), broken.hop.as_str()),
        ("local", "remap")
    );
    assert!(
        broken.detail.contains("10.70.0.0/16→10.71.0.0/16"),
        "{}",
        broken.detail
    );
    assert!(
        broken.detail.contains("10.70.0.0/16→10.73.0.0/16"),
        "{}",
        broken.detail
    );

    let (mut local, remote) = healthy();
    local.tunnels[0].spec.public_key = "old-rome-key".into();
    assert_eq!(broken_hop(&local, Some(&remote)), hop("local", "peer-key"));

    let (local, mut remote) = healthy();
    remote.tunnels[0].spec.mtu = Some(1380);
    assert_eq!(broken_hop(&local, Some(&remote)), hop("both", "mtu"));

    let (local, mut remote) = healthy();
    remote.agent = Some((3, 1));
    assert_eq!(
        broken_hop(&local, Some(&remote)),
        hop("remote", "route-agent")
    );
    let (mut local, remote) = healthy();
    local.agent = None;
    let report = diagnose(&local, Some(&remote), None, NOW);
    assert_eq!(report.broken(), None);
    assert!(
        report
            .checks
            .iter()
            .any(|c| c.hop == "route-agent" && c.outcome == Outcome::Warning)
    );
}

#[test]
fn the_report_renders_as_json_with_stable_fields() {
    let (mut local, remote) = healthy();
    local.tunnels.clear();
    let report = diagnose(&local, Some(&remote), None, NOW);
    let text = output::render(output::Format::Json, &report)
        .unwrap()
        .unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let first = value["firstBroken"].as_u64().unwrap() as usize;
    let check = &value["checks"][first];
    assert_eq!(check["hop"], "tunnel-endpoint");
    assert_eq!(check["cluster"], "local");
    assert_eq!(check["peer"], "rome");
    assert_eq!(check["outcome"], "Broken");
    assert!(check["fix"].as_str().unwrap().contains("controller"));
}
