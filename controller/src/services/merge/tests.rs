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
        labels: Default::default(),
        annotations: Default::default(),
        slices: Vec::new(),
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
fn agreeing_exports_merge_without_conflicts_and_ports_are_the_union() {
    let milan = offer("milan", 10, ServiceImportType::ClusterSetIP);
    let mut paris = offer("paris", 5, ServiceImportType::ClusterSetIP);
    paris.ports.push(port(Some("metrics"), 9090, "TCP"));
    let merged = merge(&[&milan, &paris]).expect("two offers");
    assert_eq!(merged.winner, "paris");
    assert_eq!(merged.clusters, ["milan", "paris"]);
    assert_eq!(merged.serving, ["milan", "paris"]);
    assert!(merged.conflicts.is_empty(), "{:?}", merged.conflicts);
    assert_eq!(
        merged.ports,
        [
            port(Some("http"), 80, "TCP"),
            port(Some("metrics"), 9090, "TCP")
        ]
    );
}

#[test]
fn the_oldest_export_wins_and_the_younger_one_gets_the_conflict() {
    let mut milan = offer("milan", 10, ServiceImportType::ClusterSetIP);
    milan.ports = vec![port(Some("http"), 8080, "TCP")];
    milan.session_affinity = Some("ClientIP".into());
    let paris = offer("paris", 20, ServiceImportType::ClusterSetIP);
    let merged = merge(&[&paris, &milan]).expect("two offers");
    assert_eq!(merged.winner, "milan");
    assert_eq!(merged.ports, [port(Some("http"), 8080, "TCP")]);
    assert_eq!(merged.session_affinity.as_deref(), Some("ClientIP"));
    let kinds: Vec<ConflictKind> = merged.conflicts["paris"].iter().map(|c| c.kind).collect();
    assert_eq!(kinds, [ConflictKind::SessionAffinity, ConflictKind::Port]);
    assert!(!merged.conflicts.contains_key("milan"));
    let message = &merged.conflicts["paris"][1].message;
    assert!(
        message.contains("80/TCP") && message.contains("8080/TCP"),
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
    assert_eq!(merged.conflicts["paris"][0].kind, ConflictKind::Type);
    assert_eq!(merged.conflicts["paris"][0].kind.reason(), "TypeConflict");
}

#[test]
fn different_affinity_timeouts_conflict() {
    let mut milan = offer("milan", 10, ServiceImportType::ClusterSetIP);
    let mut paris = offer("paris", 20, ServiceImportType::ClusterSetIP);
    for (offer, seconds) in [(&mut milan, 60), (&mut paris, 120)] {
        offer.session_affinity = Some("ClientIP".into());
        offer.session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIpConfig {
                timeout_seconds: Some(seconds),
            }),
        });
    }
    let merged = merge(&[&milan, &paris]).expect("two offers");
    assert_eq!(
        merged.conflicts["paris"][0].kind,
        ConflictKind::SessionAffinityConfig
    );
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
    /// on the order; the oldest export wins and never conflicts; every cluster is listed; a
    /// cluster serves exactly when it agrees on the type; port names are unique and every
    /// port comes from a serving cluster.
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
        prop_assert!(!merged.conflicts.contains_key(&merged.winner));
        prop_assert_eq!(merged.type_, oldest.type_);
        prop_assert_eq!(merged.clusters.len(), offers.len());
        for o in &offers {
            let serving = merged.serving.contains(&o.cluster.id);
            prop_assert_eq!(serving, o.type_ == oldest.type_);
            if !serving {
                prop_assert_eq!(merged.conflicts[&o.cluster.id][0].kind, ConflictKind::Type);
            }
        }
        let mut names: Vec<_> = merged.ports.iter().map(|p| p.name.clone()).collect();
        names.dedup();
        prop_assert_eq!(names.len(), merged.ports.len());
        for p in &merged.ports {
            prop_assert!(offers.iter().any(|o| merged.serving.contains(&o.cluster.id) && o.ports.contains(p)));
        }
    }
}
