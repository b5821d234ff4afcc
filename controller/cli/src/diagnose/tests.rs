//! Every hop broken one at a time on a healthy pair of clusters, and the report's JSON.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kubetun_crds::mcs::ServiceImportType;
use kubetun_crds::{
    CidrMapping, ClusterRef, ConnectionState, ConnectionStatus, Endpoint, ExportedService,
    ExportedServiceSpec, Isolation, NetworkConfig, NetworkConfigSpec, NetworkConfigStatus,
    TunnelEndpoint, TunnelEndpointSpec, TunnelEndpointStatus,
};

use super::{Check, Outcome, Report, Side, diagnose, render};
use crate::output;
use kubetun_controller::gateway_api::{
    AdmissionStatus, FlowTableStatus, Isolation as GatewayIsolation, PolicyStatus, StatusResponse,
};
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
        exports: Some(Vec::new()),
        gateway: None,
    };
    let remote = Side {
        label: "remote".into(),
        info: Ok(rome.clone()),
        configs: vec![config(&rome, &europe, true), config(&europe, &rome, true)],
        tunnels: vec![tunnel(&rome, &europe, "10.72.0.0/16", "10.71.0.0/16")],
        agent: Some((2, 2)),
        exports: Some(Vec::new()),
        gateway: None,
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
        "isolation",
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

/// An ExportedService of `cluster`, importable by `consumers` (`None`: every linked cluster).
fn export(cluster: &str, name: &str, consumers: Option<&[&str]>) -> ExportedService {
    ExportedService::new(
        &format!("default.{name}"),
        ExportedServiceSpec {
            cluster: cref(cluster),
            namespace: "default".into(),
            name: name.into(),
            export_created: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            type_: ServiceImportType::ClusterSetIP,
            ports: Vec::new(),
            session_affinity: None,
            session_affinity_config: None,
            ip_families: Vec::new(),
            internal_traffic_policy: None,
            traffic_distribution: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            slices: Vec::new(),
            consumers: consumers.map(|c| c.iter().map(|id| (*id).to_owned()).collect()),
            client_selectors: Vec::new(),
        },
    )
}

fn check<'a>(report: &'a Report, cluster: &str, hop: &str) -> &'a Check {
    report
        .checks
        .iter()
        .find(|c| c.cluster == cluster && c.hop == hop)
        .unwrap_or_else(|| panic!("no ({cluster}) {hop}: {}", render(report)))
}

/// A gateway status with an admission of `cluster` and a flow table.
fn gateway_status(cluster: &str, isolation: GatewayIsolation, endpoints: u32) -> StatusResponse {
    StatusResponse {
        admissions: vec![AdmissionStatus {
            cluster: cluster.into(),
            isolation: isolation as i32,
            endpoints,
            drops: [("not_exported".to_owned(), 12), ("no_flow".to_owned(), 0)]
                .into_iter()
                .collect(),
            policies: Vec::new(),
        }],
        flow_table: Some(FlowTableStatus {
            capacity: 65536,
            in_use: 40,
            full: 0,
        }),
        ..StatusResponse::default()
    }
}

#[test]
fn an_open_link_says_so() {
    let (local, remote) = healthy();
    let report = diagnose(&local, Some(&remote), None, NOW);
    let isolation = check(&report, "local", "isolation");
    assert_eq!(isolation.outcome, Outcome::Ok);
    assert!(
        isolation.detail.starts_with("open: rome reaches every pod"),
        "{}",
        isolation.detail
    );
    // Without --gateway-socket there is no gateway hop.
    assert!(
        !report
            .checks
            .iter()
            .any(|c| ["admission", "flow-table", "gateway-status"].contains(&c.hop.as_str())),
        "{}",
        render(&report)
    );
}

#[test]
fn an_exported_link_with_nothing_exported_names_the_fix() {
    let (mut local, remote) = healthy();
    local.tunnels[0].spec.isolation = Isolation::Exported;
    // Exported, but to milan only: rome may import nothing.
    local.exports = Some(vec![
        export("europe", "web", Some(&["milan"])),
        export("rome", "db", None),
    ]);
    let report = diagnose(&local, Some(&remote), None, NOW);
    assert_eq!(report.broken(), None, "a warning, not a broken hop");
    let isolation = check(&report, "local", "isolation");
    assert_eq!(isolation.outcome, Outcome::Warning);
    assert!(
        isolation
            .detail
            .contains("exported, and nothing is exported to rome"),
        "{}",
        isolation.detail
    );
    assert!(
        isolation
            .fix
            .starts_with("nothing is exported to rome: `kubectl apply` a ServiceExport")
            && isolation
                .fix
                .ends_with("or `kubetun network connect --isolation open`"),
        "{}",
        isolation.fix
    );
    let text = render(&report);
    assert!(
        text.contains("! (local → rome) isolation: exported, and nothing is exported to rome"),
        "{text}"
    );
}

#[test]
fn an_exported_link_names_what_the_peer_may_reach() {
    let (mut local, remote) = healthy();
    local.tunnels[0].spec.isolation = Isolation::Exported;
    let mut exports = vec![
        export("europe", "web", Some(&["rome", "milan"])),
        export("europe", "api", None),
        export("europe", "secret", Some(&["milan"])),
    ];
    for i in 0..5 {
        exports.push(export("europe", &format!("svc{i}"), None));
    }
    local.exports = Some(exports);
    let report = diagnose(&local, Some(&remote), None, NOW);
    let isolation = check(&report, "local", "isolation");
    assert_eq!(isolation.outcome, Outcome::Ok);
    assert!(
        isolation.detail.starts_with(
            "exported: rome reaches only the 7 Service(s) exported to it (default/api, \
             default/svc0"
        ),
        "{}",
        isolation.detail
    );
    assert!(
        isolation.detail.ends_with("and 2 more)"),
        "{}",
        isolation.detail
    );
    assert!(!isolation.detail.contains("secret"), "{}", isolation.detail);
}

#[test]
fn the_gateway_status_adds_refusals_and_the_flow_table() {
    let (mut local, remote) = healthy();
    local.tunnels[0].spec.isolation = Isolation::Exported;
    local.exports = Some(vec![export("europe", "web", None)]);
    local.gateway = Some(Ok(gateway_status("rome", GatewayIsolation::Exported, 3)));
    let report = diagnose(&local, Some(&remote), None, NOW);
    assert_eq!(report.broken(), None, "{}", render(&report));
    let admission = check(&report, "local", "admission");
    assert_eq!(admission.outcome, Outcome::Ok);
    assert_eq!(
        admission.detail,
        "gateway: 3 endpoint(s) admitted; refused: not_exported 12"
    );
    let table = check(&report, "local", "flow-table");
    assert_eq!(table.outcome, Outcome::Ok);
    assert!(
        table.detail.starts_with("40 of 65536 slots in use"),
        "{}",
        table.detail
    );

    // Source policies: who they select and what they refused.
    let mut status = gateway_status("rome", GatewayIsolation::Exported, 3);
    status.admissions[0].policies = vec![PolicyStatus {
        name: "shop/web".into(),
        sources: 2,
        drops: 5,
    }];
    local.gateway = Some(Ok(status));
    let report = diagnose(&local, Some(&remote), None, NOW);
    assert_eq!(
        check(&report, "local", "admission").detail,
        "gateway: 3 endpoint(s) admitted, policy shop/web selects 2 source(s), refused 5; \
         refused: not_exported 12"
    );

    // A full table is a warning that says what happened to the new connections.
    let mut status = gateway_status("rome", GatewayIsolation::Exported, 3);
    status.flow_table = Some(FlowTableStatus {
        capacity: 4,
        in_use: 4,
        full: 9,
    });
    local.gateway = Some(Ok(status));
    let report = diagnose(&local, Some(&remote), None, NOW);
    let table = check(&report, "local", "flow-table");
    assert_eq!(table.outcome, Outcome::Warning);
    assert!(
        table.detail.contains("9 new connection(s) found it full"),
        "{}",
        table.detail
    );

    // The gateway not yet on the TunnelEndpoint's isolation.
    local.gateway = Some(Ok(gateway_status("rome", GatewayIsolation::Open, 0)));
    let report = diagnose(&local, Some(&remote), None, NOW);
    let admission = check(&report, "local", "admission");
    assert_eq!(admission.outcome, Outcome::Warning);
    assert!(
        admission
            .detail
            .starts_with("the gateway admits rome as open, the TunnelEndpoint says exported"),
        "{}",
        admission.detail
    );
    // No admission at all counts as open.
    local.gateway = Some(Ok(StatusResponse::default()));
    let report = diagnose(&local, Some(&remote), None, NOW);
    assert_eq!(
        check(&report, "local", "admission").outcome,
        Outcome::Warning
    );

    // Exports, but no endpoint admitted.
    local.gateway = Some(Ok(gateway_status("rome", GatewayIsolation::Exported, 0)));
    let report = diagnose(&local, Some(&remote), None, NOW);
    let admission = check(&report, "local", "admission");
    assert_eq!(admission.outcome, Outcome::Warning);
    assert!(
        admission.detail.contains("admits no endpoint to rome"),
        "{}",
        admission.detail
    );

    // An unreachable socket is named, without failing the diagnosis.
    local.gateway = Some(Err("gateway at /run/x.sock is unavailable".into()));
    let report = diagnose(&local, Some(&remote), None, NOW);
    assert_eq!(report.broken(), None);
    let status = check(&report, "local", "gateway-status");
    assert_eq!(status.outcome, Outcome::Warning);
    assert!(status.detail.contains("/run/x.sock"), "{}", status.detail);
}

#[test]
fn an_open_gateway_admission_of_an_open_link_is_fine() {
    let (mut local, _) = healthy();
    local.gateway = Some(Ok(StatusResponse::default()));
    let report = diagnose(&local, None, None, NOW);
    let admission = check(&report, "local", "admission");
    assert_eq!(admission.outcome, Outcome::Ok, "{}", render(&report));
    assert!(
        admission.detail.contains("every packet of rome"),
        "{}",
        admission.detail
    );
}
