use k8s_openapi::jiff::Timestamp;
use kubetun_crds::ClusterRef;
use kubetun_crds::mcs::{ClientIpConfig, ServiceImportType};
use proptest::prelude::*;

use super::*;

fn offer(cluster: &str, second: i64, type_: ServiceImportType) -> ExportedServiceSpec {
    ExportedServiceSpec {
        cluster: ClusterRef {
            id: cluster.to_owned(),
            name: cluster.to_owned(),
        },
        namespace: "shop".into(),
        name: "web".into(),
        export_created: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::from_second(second).expect("valid"),
        ),
        type_,
        ports: vec![port(Some("http"), 80, "TCP")],
        session_affinity: None,
        session_affinity_config: None,
        ip_families: vec!["IPv4".into()],
        internal_traffic_policy: None,
        traffic_distribution: None,
        labels: Default::default(),
        annotations: Default::default(),
        slices: Vec::new(),
        consumers: None,
        client_selectors: Vec::new(),
    }
}

fn port(name: Option<&str>, number: i32, protocol: &str) -> ServicePort {
    ServicePort {
        name: name.map(str::to_owned),
        protocol: protocol.to_owned(),
        app_protocol: None,
        port: number,
    }
}

#[test]
fn identical_exports_merge_without_conflicts() {
    let milan = offer("milan", 10, ServiceImportType::ClusterSetIP);
    let paris = offer("paris", 5, ServiceImportType::ClusterSetIP);
    let merged = merge(&[&milan, &paris]).expect("two offers");
    assert_eq!(merged.winner, "paris");
    assert_eq!(merged.clusters, ["milan", "paris"]);
    assert_eq!(merged.serving, ["milan", "paris"]);
    assert!(merged.conflicts.is_empty(), "{:?}", merged.conflicts);
    assert_eq!(merged.conflict_reason(), None);
}

#[test]
fn different_port_sets_give_the_union_and_a_conflict_for_the_whole_set() {
    let milan = offer("milan", 10, ServiceImportType::ClusterSetIP);
    let mut paris = offer("paris", 5, ServiceImportType::ClusterSetIP);
    paris.ports.push(port(Some("metrics"), 9090, "SCTP"));
    let merged = merge(&[&milan, &paris]).expect("two offers");
    assert_eq!(
        merged.ports,
        [
            port(Some("http"), 80, "TCP"),
            port(Some("metrics"), 9090, "SCTP")
        ]
    );
    assert_eq!(merged.conflict_reason().as_deref(), Some("PortConflict"));
    let message = &merged.conflicts[0].message;
    assert!(
        message.contains("metrics 9090/SCTP") && message.contains("union"),
        "{message}"
    );
}

#[test]
fn the_oldest_export_wins_and_the_conflicts_name_both_sides() {
    let mut milan = offer("milan", 10, ServiceImportType::ClusterSetIP);
    milan.ports = vec![port(Some("http"), 8080, "TCP")];
    milan.session_affinity = Some("ClientIP".into());
    let paris = offer("paris", 20, ServiceImportType::ClusterSetIP);
    let merged = merge(&[&paris, &milan]).expect("two offers");
    assert_eq!(merged.winner, "milan");
    assert_eq!(merged.ports, [port(Some("http"), 8080, "TCP")]);
    assert_eq!(merged.session_affinity.as_deref(), Some("ClientIP"));
    let kinds: Vec<ConflictKind> = merged.conflicts.iter().map(|c| c.kind).collect();
    assert_eq!(kinds, [ConflictKind::Port, ConflictKind::SessionAffinity]);
    assert_eq!(
        merged.conflict_reason().as_deref(),
        Some("PortConflict,SessionAffinityConflict")
    );
    let message = &merged.conflicts[0].message;
    assert!(
        message.contains("80/TCP in paris") && message.contains("8080/TCP in milan (older)"),
        "{message}"
    );
}

#[test]
fn a_type_conflict_keeps_the_younger_clusters_endpoints_out() {
    let milan = offer("milan", 10, ServiceImportType::Headless);
    let paris = offer("paris", 20, ServiceImportType::ClusterSetIP);
    let merged = merge(&[&paris, &milan]).expect("two offers");
    assert_eq!(merged.type_, ServiceImportType::Headless);
    assert_eq!(merged.serving, ["milan"]);
    assert_eq!(merged.clusters, ["milan", "paris"]);
    assert_eq!(merged.conflicts.len(), 1, "{:?}", merged.conflicts);
    assert_eq!(merged.conflict_reason().as_deref(), Some("TypeConflict"));
}

#[test]
fn different_affinity_timeouts_conflict() {
    let mut milan = offer("milan", 10, ServiceImportType::ClusterSetIP);
    let mut paris = offer("paris", 20, ServiceImportType::ClusterSetIP);
    for (offer, seconds) in [(&mut milan, 60), (&mut paris, 120)] {
        offer.session_affinity = Some("ClientIP".into());
        offer.session_affinity_config = Some(affinity_for(seconds));
    }
    let merged = merge(&[&milan, &paris]).expect("two offers");
    assert_eq!(
        merged.conflicts[0].kind,
        ConflictKind::SessionAffinityConfig
    );
    assert_eq!(merged.session_affinity_config, Some(affinity_for(60)));
}

fn affinity_for(seconds: i32) -> SessionAffinityConfig {
    SessionAffinityConfig {
        client_ip: Some(ClientIpConfig {
            timeout_seconds: Some(seconds),
        }),
    }
}

#[test]
fn affinity_settings_the_api_server_would_refuse_are_not_imported() {
    let mut milan = offer("milan", 10, ServiceImportType::ClusterSetIP);
    // Settings without ClientIP affinity, then a timeout out of range.
    milan.session_affinity_config = Some(affinity_for(60));
    assert_eq!(merge(&[&milan]).unwrap().session_affinity_config, None);
    milan.session_affinity = Some("ClientIP".into());
    milan.session_affinity_config = Some(affinity_for(0));
    assert_eq!(merge(&[&milan]).unwrap().session_affinity_config, None);
    milan.session_affinity_config = Some(affinity_for(86_400));
    assert_eq!(
        merge(&[&milan]).unwrap().session_affinity_config,
        Some(affinity_for(86_400))
    );
}

#[test]
fn traffic_policy_and_distribution_come_from_the_oldest_and_differences_conflict() {
    let mut milan = offer("milan", 10, ServiceImportType::ClusterSetIP);
    milan.internal_traffic_policy = Some("Cluster".into());
    milan.traffic_distribution = Some("PreferClose".into());
    let mut paris = offer("paris", 20, ServiceImportType::ClusterSetIP);
    // No policy is the API server's default, `Cluster`: no conflict there.
    paris.internal_traffic_policy = None;
    let merged = merge(&[&milan, &paris]).expect("two offers");
    assert_eq!(merged.internal_traffic_policy.as_deref(), Some("Cluster"));
    assert_eq!(merged.traffic_distribution.as_deref(), Some("PreferClose"));
    assert_eq!(
        merged.conflict_reason().as_deref(),
        Some("TrafficDistributionConflict")
    );
    paris.internal_traffic_policy = Some("Local".into());
    paris.traffic_distribution = Some("PreferClose".into());
    let merged = merge(&[&milan, &paris]).expect("two offers");
    assert_eq!(
        merged.conflict_reason().as_deref(),
        Some("InternalTrafficPolicyConflict")
    );
}

#[test]
fn exported_labels_and_annotations_that_differ_conflict() {
    let mut milan = offer("milan", 10, ServiceImportType::ClusterSetIP);
    milan.labels.insert("tier".into(), "web".into());
    milan.annotations.insert("owner".into(), "shop".into());
    let mut paris = offer("paris", 20, ServiceImportType::ClusterSetIP);
    paris.labels.insert("tier".into(), "api".into());
    let merged = merge(&[&milan, &paris]).expect("two offers");
    assert_eq!(
        merged.conflict_reason().as_deref(),
        Some("LabelsConflict,AnnotationsConflict")
    );
    assert!(
        merged.conflicts[0].message.contains("tier=api")
            && merged.conflicts[0].message.contains("tier=web"),
        "{}",
        merged.conflicts[0].message
    );
    paris.labels = milan.labels.clone();
    paris.annotations = milan.annotations.clone();
    assert!(merge(&[&milan, &paris]).unwrap().conflicts.is_empty());
}

#[test]
fn nothing_to_merge_gives_nothing() {
    assert_eq!(merge(&[]), None);
}

fn arbitrary_offer() -> impl Strategy<Value = ExportedServiceSpec> {
    (
        prop::sample::select(vec!["a", "b", "c", "d", "e"]),
        0i64..4,
        any::<bool>(),
        prop::collection::vec((0usize..3, 1i32..4, any::<bool>()), 0..4),
        prop::option::of(Just("ClientIP".to_owned())),
    )
        .prop_map(|(cluster, second, headless, ports, affinity)| {
            let mut offer = offer(
                cluster,
                second,
                if headless {
                    ServiceImportType::Headless
                } else {
                    ServiceImportType::ClusterSetIP
                },
            );
            offer.ports = ports
                .into_iter()
                .map(|(name, number, udp)| {
                    port(
                        Some(["http", "grpc", "dns"][name]),
                        number,
                        if udp { "UDP" } else { "TCP" },
                    )
                })
                .collect();
            offer.session_affinity = affinity;
            offer
        })
}

proptest! {
    /// KEP-1645's rules, for any set of offers (one per cluster): the result does not depend
    /// on the order; the oldest export wins; every cluster is listed; a cluster serves exactly
    /// when it agrees on the type; any difference from the oldest export is a conflict of the
    /// set, and no conflict means every export is alike; port names are unique and every port
    /// comes from a serving cluster.
    #[test]
    fn merge_follows_the_rules(offers in prop::collection::vec(arbitrary_offer(), 1..5), seed in any::<u64>()) {
        let mut unique: BTreeMap<String, ExportedServiceSpec> = BTreeMap::new();
        for o in offers {
            unique.entry(o.cluster.id.clone()).or_insert(o);
        }
        let offers: Vec<&ExportedServiceSpec> = unique.values().collect();
        let merged = merge(&offers).expect("offers");
        let mut shuffled = offers.clone();
        let by = (seed as usize) % shuffled.len();
        shuffled.rotate_left(by);
        shuffled.reverse();
        prop_assert_eq!(&merge(&shuffled).expect("offers"), &merged);

        let oldest = offers.iter().min_by_key(|o| (o.export_created.0, o.cluster.id.clone())).expect("one");
        prop_assert_eq!(&merged.winner, &oldest.cluster.id);
        prop_assert_eq!(merged.type_, oldest.type_);
        prop_assert_eq!(merged.clusters.len(), offers.len());
        let kinds: Vec<ConflictKind> = merged.conflicts.iter().map(|c| c.kind).collect();
        let set = |o: &ExportedServiceSpec| o.ports.iter().cloned().collect::<std::collections::BTreeSet<_>>();
        for o in &offers {
            let serving = merged.serving.contains(&o.cluster.id);
            prop_assert_eq!(serving, o.type_ == oldest.type_);
            if !serving {
                prop_assert!(kinds.contains(&ConflictKind::Type));
            } else if set(o) != set(oldest) {
                prop_assert!(kinds.contains(&ConflictKind::Port));
            }
            if serving && o.session_affinity != oldest.session_affinity {
                prop_assert!(kinds.contains(&ConflictKind::SessionAffinity));
            }
        }
        // No conflict: every export is the oldest one's twin.
        if merged.conflicts.is_empty() {
            prop_assert!(offers.iter().all(|o| o.type_ == oldest.type_ && set(o) == set(oldest)));
            prop_assert_eq!(merged.conflict_reason(), None);
        }
        let mut names: Vec<_> = merged.ports.iter().map(|p| p.name.clone()).collect();
        names.dedup();
        prop_assert_eq!(names.len(), merged.ports.len());
        for p in &merged.ports {
            prop_assert!(offers.iter().any(|o| merged.serving.contains(&o.cluster.id) && o.ports.contains(p)));
        }
    }
}
