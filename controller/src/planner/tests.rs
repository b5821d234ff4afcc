use super::*;
use crate::ipam::{IpamConfig, rfc1918_pools};
use crate::keys::GatewayKey;
use crate::planner::admission::Answers;
use kube::api::ObjectMeta;
use kubetun_crds::{ClusterRef, Endpoint};

fn net(s: &str) -> IpNet {
    s.parse().expect("valid CIDR in test")
}

fn cluster(id: &str) -> ClusterRef {
    ClusterRef {
        id: id.into(),
        name: id.into(),
    }
}

fn spec(from: &str, to: &str, pod: &str, ext: &str, key: &str) -> NetworkConfigSpec {
    NetworkConfigSpec {
        source_cluster: cluster(from),
        destination_cluster: cluster(to),
        pod_cidrs: vec![pod.into()],
        external_cidrs: vec![ext.into()],
        endpoint: Endpoint {
            address: format!("{from}.example"),
            port: 51820,
        },
        public_key: key.into(),
        mtu: Some(1420),
        ..Default::default()
    }
}

fn europe_ipam() -> Ipam {
    Ipam::new(IpamConfig {
        pools: rfc1918_pools(),
        reserved: vec![net("10.200.0.0/16"), net("10.70.0.0/16")],
    })
}

fn mapping(real: &str, view: &str) -> CidrMapping {
    CidrMapping {
        real: real.into(),
        view: view.into(),
    }
}

#[test]
fn seed_topology_views_on_europe() {
    let key = GatewayKey::generate();
    let mut ipam = europe_ipam();
    let rome = process_network_config(
        &mut ipam,
        &spec(
            "rome",
            "europe",
            "10.202.0.0/16",
            "10.70.0.0/16",
            key.public_base64(),
        ),
    )
    .unwrap();
    let milan = process_network_config(
        &mut ipam,
        &spec(
            "milan",
            "europe",
            "10.203.0.0/16",
            "10.70.0.0/16",
            key.public_base64(),
        ),
    )
    .unwrap();
    assert_eq!(
        rome.pod_cidrs,
        vec![mapping("10.202.0.0/16", "10.202.0.0/16")]
    );
    assert_eq!(
        milan.pod_cidrs,
        vec![mapping("10.203.0.0/16", "10.203.0.0/16")]
    );
    assert!(rome.external_cidrs[0].is_remapped());
    assert!(milan.external_cidrs[0].is_remapped());
    assert_ne!(rome.external_cidrs[0].view, milan.external_cidrs[0].view);
}

#[test]
fn invalid_specs_have_actionable_errors() {
    let key = GatewayKey::generate();
    let mut ipam = europe_ipam();
    let err = process_network_config(
        &mut ipam,
        &spec(
            "rome",
            "europe",
            "10.202.0.1/16",
            "10.70.0.0/16",
            key.public_base64(),
        ),
    )
    .unwrap_err();
    assert_eq!(err.reason(), "InvalidCIDR");
    assert!(
        err.to_string().contains("did you mean 10.202.0.0/16"),
        "{err}"
    );

    let err = process_network_config(
        &mut ipam,
        &spec("rome", "europe", "10.202.0.0/16", "10.70.0.0/16", "short"),
    )
    .unwrap_err();
    assert_eq!(err.reason(), "InvalidPublicKey");

    let s = spec(
        "rome",
        "milan",
        "10.202.0.0/16",
        "10.70.0.0/16",
        key.public_base64(),
    );
    let err = check_addressing("from-rome", &s, "europe", Some("rome")).unwrap_err();
    assert_eq!(err.reason(), "WrongDestination");
    assert!(err.to_string().contains("\"milan\""), "{err}");
    let s = spec(
        "rome",
        "europe",
        "10.202.0.0/16",
        "10.70.0.0/16",
        key.public_base64(),
    );
    assert_eq!(
        check_addressing("from-rome", &s, "europe", Some("milan"))
            .unwrap_err()
            .reason(),
        "InvalidSource"
    );
    assert!(check_addressing("from-rome", &s, "europe", Some("rome")).is_ok());
    let err = check_addressing("from-milan", &s, "europe", None).unwrap_err();
    assert_eq!(err.reason(), "InvalidSource");
    assert!(err.to_string().contains("\"from-rome\""), "{err}");
    assert_eq!(
        ipam.allocations().count(),
        0,
        "failed processing allocates nothing"
    );
}

#[test]
fn exhaustion_rolls_back_partial_allocations() {
    let key = GatewayKey::generate();
    let mut ipam = Ipam::new(IpamConfig {
        pools: vec![net("10.0.0.0/23")],
        reserved: vec![net("10.0.0.0/24")],
    });
    // The pod CIDR fits (kept), the external overlaps the local range and there is no room
    // left once the pod CIDR holds the only free /24.
    let err = process_network_config(
        &mut ipam,
        &spec(
            "rome",
            "europe",
            "10.0.1.0/24",
            "10.0.0.0/24",
            key.public_base64(),
        ),
    )
    .unwrap_err();
    assert_eq!(err.reason(), "PoolExhausted");
    assert_eq!(ipam.allocations().count(), 0);
}

#[test]
fn spec_changes_release_prefixes_no_longer_announced() {
    let key = GatewayKey::generate();
    let mut ipam = europe_ipam();
    let mut s = spec(
        "rome",
        "europe",
        "10.202.0.0/16",
        "10.70.0.0/16",
        key.public_base64(),
    );
    process_network_config(&mut ipam, &s).unwrap();
    s.external_cidrs.clear();
    process_network_config(&mut ipam, &s).unwrap();
    assert_eq!(ipam.allocations().count(), 1);
}

#[test]
fn restore_from_status_gives_the_same_views() {
    let key = GatewayKey::generate();
    let mut ipam = europe_ipam();
    let s = spec(
        "rome",
        "europe",
        "10.202.0.0/16",
        "10.70.0.0/16",
        key.public_base64(),
    );
    let view = process_network_config(&mut ipam, &s).unwrap();
    let status = NetworkConfigStatus {
        processed: true,
        pod_cidrs: view.pod_cidrs.clone(),
        external_cidrs: view.external_cidrs.clone(),
        ..NetworkConfigStatus::default()
    };
    let mut restarted = europe_ipam();
    assert!(restore_from_status(&mut restarted, &s, &status).unwrap());
    assert_eq!(process_network_config(&mut restarted, &s).unwrap(), view);

    let mut stale = s.clone();
    stale.pod_cidrs = vec!["10.99.0.0/16".into()];
    assert!(!restore_from_status(&mut europe_ipam(), &stale, &status).unwrap());
}

fn config(
    name: &str,
    spec: NetworkConfigSpec,
    status: Option<NetworkConfigStatus>,
) -> NetworkConfig {
    NetworkConfig {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec,
        status,
    }
}

fn processed(pod: CidrMapping, ext: CidrMapping) -> Option<NetworkConfigStatus> {
    Some(NetworkConfigStatus {
        processed: true,
        pod_cidrs: vec![pod],
        external_cidrs: vec![ext],
        ..NetworkConfigStatus::default()
    })
}

#[test]
fn tunnel_endpoint_merges_both_sides() {
    let europe_key = GatewayKey::generate();
    let rome_key = GatewayKey::generate();
    let mut to_rome = config(
        "to-rome",
        spec(
            "europe",
            "rome",
            "10.200.0.0/16",
            "10.70.0.0/16",
            europe_key.public_base64(),
        ),
        None,
    );
    let from_rome = config(
        "from-rome",
        spec(
            "rome",
            "europe",
            "10.202.0.0/16",
            "10.70.0.0/16",
            rome_key.public_base64(),
        ),
        processed(
            mapping("10.202.0.0/16", "10.202.0.0/16"),
            mapping("10.70.0.0/16", "10.71.0.0/16"),
        ),
    );
    let err = tunnel_endpoint_spec(&to_rome, &from_rome).unwrap_err();
    assert!(matches!(err, PlanError::NotProcessed { ref name, .. } if name == "to-rome"));

    to_rome.status = processed(
        mapping("10.200.0.0/16", "10.200.0.0/16"),
        mapping("10.70.0.0/16", "10.201.0.0/16"),
    );
    let te = tunnel_endpoint_spec(&to_rome, &from_rome).unwrap();
    assert_eq!(te.cluster.id, "rome");
    assert_eq!(te.public_key, rome_key.public_base64());
    assert_eq!(te.local_external_cidrs[0].view, "10.201.0.0/16");
    assert_eq!(te.remote_external_cidrs[0].view, "10.71.0.0/16");
    assert_eq!(te.endpoint.to_string(), "rome.example:51820");
    assert_eq!(te.allowed_prefixes, None);

    // A status describing an older spec is not good enough.
    let mut changed = from_rome.clone();
    changed.spec.external_cidrs = vec!["10.80.0.0/16".into()];
    assert!(tunnel_endpoint_spec(&to_rome, &changed).is_err());
}

fn te(id: &str, real: &str, view: &str, key: &str) -> TunnelEndpointSpec {
    TunnelEndpointSpec {
        cluster: cluster(id),
        local_pod_cidrs: vec![],
        local_external_cidrs: vec![],
        remote_pod_cidrs: vec![mapping(real, real)],
        remote_external_cidrs: vec![mapping("10.70.0.0/16", view)],
        endpoint: Endpoint {
            address: format!("{id}.example"),
            port: 51820,
        },
        public_key: key.into(),
        mtu: None,
        allowed_prefixes: None,
        ..Default::default()
    }
}

#[test]
fn desired_state_is_sorted_versioned_and_keeps_the_key_out_of_the_version() {
    let key = GatewayKey::generate();
    let settings = GatewaySettings {
        private_key: key.private_base64(),
        public_key: key.public_base64().to_owned(),
        listen_port: 51820,
        mtu: 1420,
        ..GatewaySettings::default()
    };
    let milan = te("milan", "10.203.0.0/16", "10.201.0.0/16", "M");
    let mut rome = te("rome", "10.202.0.0/16", "10.71.0.0/16", "R");
    rome.allowed_prefixes = Some(vec!["10.202.1.0/24".into()]);

    let state = desired_state(&settings, &[rome.clone(), milan.clone()]);
    let names: Vec<_> = state.peers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["milan", "rome"]);
    assert_eq!(state.peers[1].routes[1].real, "10.70.0.0/16");
    assert_eq!(state.peers[1].routes[1].view, "10.71.0.0/16");
    assert_eq!(
        state.peers[1].acl.as_ref().map(|a| a.allowed.clone()),
        Some(vec!["10.202.1.0/24".to_owned()])
    );
    assert_eq!(state.peers[0].acl, None);
    assert_eq!(
        state.interface.as_ref().map(|i| i.private_key.as_str()),
        Some(settings.private_key.as_str())
    );

    let again = desired_state(&settings, &[milan.clone(), rome.clone()]);
    assert_eq!(again, state, "input order does not matter");
    rome.allowed_prefixes = None;
    assert_ne!(
        desired_state(&settings, &[milan, rome]).version,
        state.version
    );
    assert!(!format!("{settings:?}").contains(&settings.private_key));
}

#[test]
fn a_rotation_sends_both_keys_and_versions_them_by_their_public_halves() {
    let (old, new) = (GatewayKey::generate(), GatewayKey::generate());
    let settings = GatewaySettings {
        private_key: new.private_base64(),
        public_key: new.public_base64().to_owned(),
        listen_port: 51820,
        mtu: 1420,
        ..GatewaySettings::default()
    };
    let rotating = GatewaySettings {
        previous_private_key: old.private_base64(),
        previous_public_key: old.public_base64().to_owned(),
        ..settings.clone()
    };
    let before = desired_state(&settings, &[]);
    let during = desired_state(&rotating, &[]);
    let interface = during.interface.as_ref().expect("interface");
    assert_eq!(interface.previous_private_key, old.private_base64());
    assert_eq!(
        before
            .interface
            .as_ref()
            .map(|i| i.previous_private_key.as_str()),
        Some("")
    );
    assert_ne!(
        before.version, during.version,
        "ending a rotation is a change"
    );
    let mut other_previous = during.clone();
    if let Some(interface) = other_previous.interface.as_mut() {
        interface.previous_private_key = GatewayKey::generate().private_base64();
    }
    assert_eq!(version_of(&other_previous), version_of(&during));
    assert!(!format!("{rotating:?}").contains(&rotating.previous_private_key));
    assert!(format!("{rotating:?}").contains(old.public_base64()));
}

#[test]
fn desired_state_turns_the_connectivity_check_on_for_every_peer() {
    let settings = GatewaySettings::default();
    let state = desired_state(
        &settings,
        &[te("rome", "10.202.0.0/16", "10.71.0.0/16", "R")],
    );
    let conncheck = state
        .interface
        .as_ref()
        .and_then(|i| i.conncheck.as_ref())
        .expect("the check is on");
    assert_eq!(conncheck.interval_ms, CONNCHECK_INTERVAL_MS);
    assert_eq!(conncheck.loss_threshold, CONNCHECK_LOSS_THRESHOLD);
    assert_eq!(
        conncheck.fallback_interval_ms,
        CONNCHECK_FALLBACK_INTERVAL_MS
    );
    assert!(state.peers.iter().all(|p| !p.conncheck_disabled));

    let tuned = GatewaySettings {
        conncheck_interval_ms: 500,
        conncheck_loss_threshold: 3,
        conncheck_fallback_interval_ms: 100,
        ..settings.clone()
    };
    let state = desired_state(&tuned, &[te("rome", "10.202.0.0/16", "10.71.0.0/16", "R")]);
    let conncheck = state.interface.and_then(|i| i.conncheck).expect("on");
    assert_eq!(
        (
            conncheck.interval_ms,
            conncheck.loss_threshold,
            conncheck.fallback_interval_ms
        ),
        (500, 3, 100)
    );
}

#[test]
fn state_files_carry_the_connectivity_check() {
    // The format of `kubetun gateway apply -f`: the proto in camelCase.
    let yaml = "\
interface:
  listenPort: 51820
  conncheck:
    intervalMs: 500
    lossThreshold: 3
peers:
  - publicKey: K
    conncheckDisabled: true
  - publicKey: L
";
    let state: DesiredState = serde_yaml::from_str(yaml).expect("a valid state file");
    let conncheck = state.interface.and_then(|i| i.conncheck);
    assert_eq!(
        conncheck.map(|c| (c.interval_ms, c.loss_threshold)),
        Some((500, 3))
    );
    assert!(state.peers[0].conncheck_disabled);
    assert!(!state.peers[1].conncheck_disabled, "probed unless disabled");
}

/// Leaf Rome's processed link to leaf Milan (both pod CIDRs 10.70.0.0/16, Milan seen at
/// 10.73.0.0/16): Rome's key, its `to-milan` and `from-milan` NetworkConfigs.
fn rome_and_milan() -> (GatewayKey, NetworkConfig, NetworkConfig) {
    let (rome, milan) = (GatewayKey::generate(), GatewayKey::generate());
    let to_milan = config(
        "to-milan",
        spec(
            "rome",
            "milan",
            "10.70.0.0/16",
            "10.90.0.0/16",
            rome.public_base64(),
        ),
        processed(
            mapping("10.70.0.0/16", "10.74.0.0/16"),
            mapping("10.90.0.0/16", "10.90.0.0/16"),
        ),
    );
    let from_milan = config(
        "from-milan",
        spec(
            "milan",
            "rome",
            "10.70.0.0/16",
            "10.91.0.0/16",
            milan.public_base64(),
        ),
        processed(
            mapping("10.70.0.0/16", "10.73.0.0/16"),
            mapping("10.91.0.0/16", "10.91.0.0/16"),
        ),
    );
    (rome, to_milan, from_milan)
}

#[test]
fn a_fallback_through_the_hub_keeps_the_peers_views_and_the_hub_allows_transit_sources() {
    let (rome, to_milan, mut from_milan) = rome_and_milan();
    // The hub sees Milan's CIDRs as 10.72.0.0/16 and 10.91.0.0/16.
    from_milan.spec.fallback = Some(FallbackPath {
        hub: cluster("europe"),
        pod_cidrs: vec!["10.72.0.0/16".into()],
        external_cidrs: vec!["10.91.0.0/16".into()],
    });
    let te = tunnel_endpoint_spec(&to_milan, &from_milan).expect("valid");
    let fallback = te.fallback.as_ref().expect("a fallback");
    assert_eq!(fallback.hub.id, "europe");
    assert_eq!(
        fallback.routes,
        vec![
            mapping("10.72.0.0/16", "10.73.0.0/16"),
            mapping("10.91.0.0/16", "10.91.0.0/16")
        ],
        "the hub's addresses on the wire, this cluster's views"
    );

    let hub = te_for(
        "europe",
        "10.200.0.0/16",
        "10.71.0.0/16",
        &GatewayKey::generate(),
    );
    let settings = GatewaySettings::default();
    let state = desired_state(&settings, &[te.clone(), hub]);
    let europe = state
        .peers
        .iter()
        .find(|p| p.name == "europe")
        .expect("hub");
    let fallbacks: Vec<(&str, &str)> = europe
        .routes
        .iter()
        .filter(|r| r.fallback)
        .map(|r| (r.real.as_str(), r.view.as_str()))
        .collect();
    assert_eq!(
        fallbacks,
        [
            ("10.72.0.0/16", "10.73.0.0/16"),
            ("10.91.0.0/16", "10.91.0.0/16")
        ]
    );
    let direct = state
        .peers
        .iter()
        .find(|p| p.name == "milan")
        .expect("milan");
    assert!(direct.routes.iter().all(|r| !r.fallback));

    // On the hub: a leaf that allows transit adds its views to the allowed sources.
    let mut leaf = te_for("rome", "10.70.0.0/16", "10.71.0.0/16", &rome);
    leaf.transit = true;
    let hub_state = desired_state(&settings, &[leaf]);
    let local = &hub_state
        .interface
        .as_ref()
        .expect("interface")
        .local_prefixes;
    assert!(local.contains(&"10.71.0.0/16".to_owned()), "{local:?}");

    // A fallback that does not fit the peer's CIDRs is refused with the reason.
    from_milan
        .spec
        .fallback
        .as_mut()
        .expect("fallback")
        .external_cidrs
        .clear();
    let error = tunnel_endpoint_spec(&to_milan, &from_milan).expect_err("mismatch");
    assert_eq!(
        error.to_string(),
        "spec.fallback: 1 pod and 0 external CIDRs at the hub for 1 and 1 here"
    );
}

#[test]
fn a_hub_only_peer_has_no_tunnel_and_its_views_are_plain_routes_on_the_hub() {
    let (_, to_milan, mut from_milan) = rome_and_milan();
    from_milan.spec.hub_only = true;
    let error = tunnel_endpoint_spec(&to_milan, &from_milan).expect_err("no path");
    assert_eq!(
        error.to_string(),
        "spec.fallback: hubOnly needs a fallback: the hub path is the only one"
    );

    from_milan.spec.fallback = Some(FallbackPath {
        hub: cluster("europe"),
        pod_cidrs: vec!["10.72.0.0/16".into()],
        external_cidrs: vec!["10.91.0.0/16".into()],
    });
    let te = tunnel_endpoint_spec(&to_milan, &from_milan).expect("valid");
    assert!(te.hub_only);
    let hub = te_for(
        "europe",
        "10.200.0.0/16",
        "10.71.0.0/16",
        &GatewayKey::generate(),
    );
    let state = desired_state(&GatewaySettings::default(), &[te, hub]);
    let names: Vec<&str> = state.peers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["europe"], "no tunnel to milan");
    let routes: Vec<(&str, &str, bool)> = state.peers[0]
        .routes
        .iter()
        .map(|r| (r.real.as_str(), r.view.as_str(), r.fallback))
        .collect();
    assert_eq!(
        routes,
        [
            ("10.200.0.0/16", "10.71.0.0/16", false),
            ("10.72.0.0/16", "10.73.0.0/16", false),
            ("10.91.0.0/16", "10.91.0.0/16", false)
        ],
        "milan at the hub's address on the wire, at this cluster's view, always"
    );
}

/// A TunnelEndpoint of `id` with one pod CIDR `real` seen as `view`.
fn te_for(id: &str, real: &str, view: &str, key: &GatewayKey) -> TunnelEndpointSpec {
    TunnelEndpointSpec {
        remote_pod_cidrs: vec![mapping(real, view)],
        remote_external_cidrs: vec![],
        ..te(id, real, view, key.public_base64())
    }
}

#[test]
fn the_isolation_is_our_own_links_setting_else_the_cluster_default_never_the_peers() {
    let (_, mut to_milan, mut from_milan) = rome_and_milan();
    // Milan (the peer) asks for an open link in what it sends us: not read.
    from_milan.spec.isolation = Some(Isolation::Open);
    let te = tunnel_endpoint_spec_with(&to_milan, &from_milan, Isolation::Exported).unwrap();
    assert_eq!(te.isolation, Isolation::Exported, "the cluster default");
    let te = tunnel_endpoint_spec_with(&to_milan, &from_milan, Isolation::Open).unwrap();
    assert_eq!(te.isolation, Isolation::Open);
    from_milan.spec.isolation = Some(Isolation::Exported);
    let te = tunnel_endpoint_spec_with(&to_milan, &from_milan, Isolation::Open).unwrap();
    assert_eq!(
        te.isolation,
        Isolation::Open,
        "the peer cannot narrow it either"
    );

    // Our `to-milan` decides, whatever the default.
    to_milan.spec.isolation = Some(Isolation::Exported);
    from_milan.spec.isolation = Some(Isolation::Open);
    let te = tunnel_endpoint_spec_with(&to_milan, &from_milan, Isolation::Open).unwrap();
    assert_eq!(te.isolation, Isolation::Exported);
    to_milan.spec.isolation = Some(Isolation::Open);
    let te = tunnel_endpoint_spec_with(&to_milan, &from_milan, Isolation::Exported).unwrap();
    assert_eq!(te.isolation, Isolation::Open);
    // Without a default, an existing install keeps today's behaviour.
    to_milan.spec.isolation = None;
    assert_eq!(
        tunnel_endpoint_spec(&to_milan, &from_milan)
            .unwrap()
            .isolation,
        Isolation::Open
    );
}

fn endpoint(
    address: &str,
    protocol: gateway_api::Protocol,
    port: u32,
) -> gateway_api::AdmittedEndpoint {
    gateway_api::AdmittedEndpoint {
        address: address.into(),
        protocol: protocol as i32,
        port,
    }
}

/// An offer of `name` with endpoints `addresses` on TCP 8080 and UDP 53.
fn offer(
    name: &str,
    addresses: &[&str],
    consumers: Option<&[&str]>,
) -> kubetun_crds::ExportedServiceSpec {
    use kubetun_crds::{ExportedEndpoint, ExportedEndpointPort, ExportedSlice};
    kubetun_crds::ExportedServiceSpec {
        cluster: cluster("europe"),
        namespace: "shop".into(),
        name: name.into(),
        export_created: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        type_: kubetun_crds::mcs::ServiceImportType::ClusterSetIP,
        ports: vec![],
        session_affinity: None,
        session_affinity_config: None,
        ip_families: vec![],
        internal_traffic_policy: None,
        traffic_distribution: None,
        labels: Default::default(),
        annotations: Default::default(),
        slices: vec![ExportedSlice {
            address_type: "IPv4".into(),
            ports: vec![
                ExportedEndpointPort {
                    name: Some("http".into()),
                    protocol: "TCP".into(),
                    port: 8080,
                    app_protocol: None,
                },
                ExportedEndpointPort {
                    name: Some("dns".into()),
                    protocol: "UDP".into(),
                    port: 53,
                    app_protocol: None,
                },
                ExportedEndpointPort {
                    name: Some("odd".into()),
                    protocol: "QUIC".into(),
                    port: 443,
                    app_protocol: None,
                },
            ],
            endpoints: addresses
                .iter()
                .map(|a| ExportedEndpoint {
                    addresses: vec![(*a).to_owned()],
                    ready: true,
                    serving: true,
                    ..Default::default()
                })
                .collect(),
        }],
        consumers: consumers.map(|c| c.iter().map(|s| (*s).to_owned()).collect()),
        client_selectors: Vec::new(),
    }
}

#[test]
fn an_offer_admits_every_address_on_its_target_ports_sorted() {
    use gateway_api::Protocol::{Tcp, Udp};
    let export = ExportEndpoints::of_offer(&offer("web", &["10.200.0.9", "10.200.0.5"], None));
    assert_eq!(
        export.endpoints,
        [
            endpoint("10.200.0.5", Tcp, 8080),
            endpoint("10.200.0.5", Udp, 53),
            endpoint("10.200.0.9", Tcp, 8080),
            endpoint("10.200.0.9", Udp, 53),
        ],
        "an unknown protocol admits nothing"
    );
    assert_eq!(export.consumers, None);
}

#[test]
fn admissions_one_per_link_open_or_with_the_endpoints_exported_to_that_cluster() {
    use gateway_api::Protocol::{Tcp, Udp};
    let key = GatewayKey::generate();
    let mut milan = te("milan", "10.203.0.0/16", "10.201.0.0/16", "M");
    milan.isolation = Isolation::Exported;
    let mut rome = te("rome", "10.202.0.0/16", "10.71.0.0/16", "R");
    rome.isolation = Isolation::Exported;
    let paris = te("paris", "10.204.0.0/16", "10.72.0.0/16", "P");
    let exports = [
        ExportEndpoints::of_offer(&offer("db", &["10.200.0.7"], Some(&["rome"]))),
        ExportEndpoints::of_offer(&offer("web", &["10.200.0.5"], None)),
    ];
    let settings = GatewaySettings {
        public_key: key.public_base64().to_owned(),
        ..GatewaySettings::default()
    };
    let state = desired_state_with(
        &settings,
        &[rome.clone(), paris, milan.clone()],
        &exports,
        &Answers::new(),
    );
    let summary: Vec<(&str, i32, Vec<&str>, usize)> = state
        .admissions
        .iter()
        .map(|a| {
            (
                a.cluster.as_str(),
                a.isolation,
                a.views.iter().map(String::as_str).collect(),
                a.endpoints.len(),
            )
        })
        .collect();
    let (open, exported) = (
        gateway_api::Isolation::Open as i32,
        gateway_api::Isolation::Exported as i32,
    );
    assert_eq!(
        summary,
        [
            ("milan", exported, vec!["10.201.0.0/16", "10.203.0.0/16"], 2),
            ("paris", open, vec!["10.204.0.0/16", "10.72.0.0/16"], 0),
            ("rome", exported, vec!["10.202.0.0/16", "10.71.0.0/16"], 4),
        ]
    );
    assert_eq!(
        state.admissions[2].endpoints,
        [
            endpoint("10.200.0.5", Tcp, 8080),
            endpoint("10.200.0.5", Udp, 53),
            endpoint("10.200.0.7", Tcp, 8080),
            endpoint("10.200.0.7", Udp, 53),
        ],
        "rome is a consumer of db; milan is not"
    );
    assert_eq!(
        state.admissions[0].endpoints,
        [
            endpoint("10.200.0.5", Tcp, 8080),
            endpoint("10.200.0.5", Udp, 53)
        ]
    );

    // Unchanged inputs in another order: the same state and version (no needless Apply).
    let again = desired_state_with(
        &settings,
        &[
            milan.clone(),
            rome.clone(),
            te("paris", "10.204.0.0/16", "10.72.0.0/16", "P"),
        ],
        &exports,
        &Answers::new(),
    );
    assert_eq!(again, state);
    // The version covers the admissions: an export going changes it.
    let fewer = desired_state_with(
        &settings,
        &[
            milan,
            rome,
            te("paris", "10.204.0.0/16", "10.72.0.0/16", "P"),
        ],
        &exports[1..],
        &Answers::new(),
    );
    assert_ne!(fewer.version, state.version);
    assert_eq!(fewer.admissions[2].endpoints.len(), 2);
}

#[test]
fn fallback_and_hub_only_links_are_admitted_at_their_views_on_the_hubs_peer() {
    let (_, mut to_milan, mut from_milan) = rome_and_milan();
    to_milan.spec.isolation = Some(Isolation::Exported);
    from_milan.spec.fallback = Some(FallbackPath {
        hub: cluster("europe"),
        pod_cidrs: vec!["10.72.0.0/16".into()],
        external_cidrs: vec!["10.91.0.0/16".into()],
    });
    let hub = te_for(
        "europe",
        "10.200.0.0/16",
        "10.71.0.0/16",
        &GatewayKey::generate(),
    );
    let exports = [ExportEndpoints::of_offer(&offer(
        "web",
        &["10.70.0.5"],
        Some(&["milan"]),
    ))];
    for hub_only in [false, true] {
        from_milan.spec.hub_only = hub_only;
        let te = tunnel_endpoint_spec_with(&to_milan, &from_milan, Isolation::Open).unwrap();
        assert_eq!(te.isolation, Isolation::Exported);
        let state = desired_state_with(
            &GatewaySettings::default(),
            &[te, hub.clone()],
            &exports,
            &Answers::new(),
        );
        let milan = state
            .admissions
            .iter()
            .find(|a| a.cluster == "milan")
            .expect("an admission even without a tunnel");
        assert_eq!(milan.isolation, gateway_api::Isolation::Exported as i32);
        assert_eq!(
            milan.views,
            ["10.73.0.0/16", "10.91.0.0/16"],
            "the views its fallback or hub-only routes carry (hub_only={hub_only})"
        );
        assert_eq!(milan.endpoints.len(), 2);
        let europe = state
            .admissions
            .iter()
            .find(|a| a.cluster == "europe")
            .unwrap();
        assert_eq!(europe.isolation, gateway_api::Isolation::Open as i32);
        assert!(europe.endpoints.is_empty());
    }
}
