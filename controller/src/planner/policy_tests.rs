use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Pod, PodIP, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kubetun_crds::mcs::{ServiceImportType, ServicePort};
use kubetun_crds::{
    CidrMapping, ClientIdentitySpec, ClusterRef, ExportPolicySpec, ExportedEndpoint,
    ExportedEndpointPort, ExportedServiceSpec, ExportedSlice, Isolation, PolicyPeer,
    TunnelEndpointSpec,
};

use super::*;
use crate::planner::admission::{Answers, admissions};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn selector(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(labels(pairs)),
        ..LabelSelector::default()
    })
}

/// Service web in shop: ports http 80 → 8080 and metrics 9090 → 9090, endpoint 10.20.0.5.
fn offer() -> ExportedServiceSpec {
    let port = |name: &str, number: i32| ExportedEndpointPort {
        name: Some(name.into()),
        protocol: "TCP".into(),
        port: number,
        app_protocol: None,
    };
    ExportedServiceSpec {
        cluster: ClusterRef {
            id: "milan".into(),
            name: "milan".into(),
        },
        namespace: "shop".into(),
        name: "web".into(),
        export_created: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        type_: ServiceImportType::ClusterSetIP,
        ports: vec![
            ServicePort {
                name: Some("http".into()),
                protocol: "TCP".into(),
                app_protocol: None,
                port: 80,
            },
            ServicePort {
                name: Some("metrics".into()),
                protocol: "TCP".into(),
                app_protocol: None,
                port: 9090,
            },
        ],
        session_affinity: None,
        session_affinity_config: None,
        ip_families: Vec::new(),
        internal_traffic_policy: None,
        traffic_distribution: None,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        slices: vec![ExportedSlice {
            address_type: "IPv4".into(),
            ports: vec![port("http", 8080), port("metrics", 9090)],
            endpoints: vec![ExportedEndpoint {
                addresses: vec!["10.20.0.5".into()],
                ..ExportedEndpoint::default()
            }],
        }],
        consumers: None,
        client_selectors: Vec::new(),
    }
}

fn frontend_policy(ports: Vec<i32>) -> ExportPolicySpec {
    ExportPolicySpec {
        service: "web".into(),
        ports,
        from: vec![PolicyPeer {
            clusters: vec!["rome".into()],
            namespace_selector: selector(&[("kubernetes.io/metadata.name", "shop")]),
            pod_selector: selector(&[("app", "frontend")]),
        }],
    }
}

fn namespace(name: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels(&[("kubernetes.io/metadata.name", name)])),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

fn pod(namespace: &str, app: &str, ip: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("{app}-{ip}")),
            namespace: Some(namespace.into()),
            labels: Some(labels(&[("app", app)])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec::default()),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.into()),
            pod_ips: Some(vec![PodIP { ip: ip.into() }]),
            ..PodStatus::default()
        }),
    }
}

/// Rome's TunnelEndpoint in Milan: pod CIDRs 10.1.0.0/16 and fd01::/64 seen at
/// 10.71.0.0/16 and fd71::/64.
fn rome(isolation: Isolation) -> TunnelEndpointSpec {
    TunnelEndpointSpec {
        cluster: ClusterRef {
            id: "rome".into(),
            name: "rome".into(),
        },
        remote_pod_cidrs: vec![
            CidrMapping {
                real: "10.1.0.0/16".into(),
                view: "10.71.0.0/16".into(),
            },
            CidrMapping {
                real: "fd01::/64".into(),
                view: "fd71::/64".into(),
            },
        ],
        isolation,
        ..TunnelEndpointSpec::default()
    }
}

fn answer(key: &str, addresses: &[&str]) -> ClientIdentitySpec {
    ClientIdentitySpec {
        cluster: "rome".into(),
        exporter: "milan".into(),
        selections: vec![IdentitySelection {
            key: key.into(),
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
        }],
    }
}

#[test]
fn a_policy_guards_the_endpoints_of_its_ports_and_asks_its_clusters() {
    let (all, selectors) = plan("shop/frontend", &frontend_policy(Vec::new()), &offer()).unwrap();
    assert_eq!(all.endpoints.len(), 2, "every port: {:?}", all.endpoints);
    assert_eq!(selectors.len(), 1);
    assert_eq!(selectors[0].clusters, ["rome"]);
    assert!(all.names("rome") && !all.names("paris"));

    let (http, again) = plan("shop/frontend", &frontend_policy(vec![80]), &offer()).unwrap();
    assert_eq!(http.endpoints.len(), 1);
    assert_eq!(
        http.endpoints[0].port, 8080,
        "the target port of Service port 80"
    );
    assert_eq!(
        again[0].key, selectors[0].key,
        "the key depends on the selectors only"
    );

    let error = plan("shop/frontend", &frontend_policy(vec![81]), &offer()).unwrap_err();
    assert_eq!(
        error,
        "port 81 is not a port of Service web (its ports: 80, 9090)"
    );
    let mut bad = frontend_policy(Vec::new());
    bad.from[0].pod_selector = Some(LabelSelector {
        match_expressions: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                key: "app".into(),
                operator: "Near".into(),
                values: None,
            },
        ]),
        ..LabelSelector::default()
    });
    let error = plan("shop/frontend", &bad, &offer()).unwrap_err();
    assert!(error.starts_with("from[0].podSelector: "), "{error}");
}

#[test]
fn a_client_answers_with_its_matching_pods_only() {
    let (_, selectors) = plan("shop/frontend", &frontend_policy(Vec::new()), &offer()).unwrap();
    let namespaces = [namespace("shop"), namespace("other")];
    let mut terminating = pod("shop", "frontend", "10.1.0.9");
    terminating.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let mut host = pod("shop", "frontend", "192.168.0.4");
    host.spec.as_mut().unwrap().host_network = Some(true);
    let pods = [
        pod("shop", "frontend", "10.1.0.7"),
        pod("shop", "frontend", "10.1.0.8"),
        pod("shop", "backend", "10.1.0.10"),
        pod("other", "frontend", "10.1.0.11"),
        terminating,
        host,
    ];
    let answer = select("rome", &selectors, &namespaces, &pods);
    assert_eq!(answer.len(), 1);
    assert_eq!(answer[0].key, selectors[0].key);
    assert_eq!(answer[0].addresses, ["10.1.0.7", "10.1.0.8"]);
    // A cluster the selector does not name answers nothing.
    assert!(select("paris", &selectors, &namespaces, &pods).is_empty());
}

#[test]
fn answers_map_into_every_view_and_addresses_outside_the_cidrs_are_dropped() {
    let (plan, selectors) = plan("shop/frontend", &frontend_policy(Vec::new()), &offer()).unwrap();
    let key = selectors[0].key.clone();
    let te = rome(Isolation::Exported);
    let given = answer(
        &key,
        &[
            "10.1.0.7",
            "fd01::7",
            "10.9.0.1",
            "not-an-address",
            "10.1.0.7",
        ],
    );
    let (policies, tallies) = source_policies(&te, &[&plan], Some(&given));
    assert_eq!(policies.len(), 1);
    assert_eq!(policies[0].sources, ["10.71.0.7", "fd71::7"]);
    assert_eq!(tallies.len(), 1);
    assert_eq!((tallies[0].selected, tallies[0].rejected), (2, 2));
    assert!(!tallies[0].unanswered);

    // No answer yet: the policy guards its endpoints with no source.
    let (policies, tallies) = source_policies(&te, &[&plan], None);
    assert!(policies[0].sources.is_empty());
    assert!(tallies[0].unanswered);

    // An answer that claims to be another cluster's counts for nothing.
    let mut forged = given.clone();
    forged.cluster = "paris".into();
    let (policies, _) = source_policies(&te, &[&plan], Some(&forged));
    assert!(policies[0].sources.is_empty());
}

#[test]
fn the_admission_of_an_exported_cluster_carries_the_policies_of_what_is_offered_to_it() {
    let offer = offer();
    let (plan, selectors) = plan("shop/frontend", &frontend_policy(vec![80]), &offer).unwrap();
    let mut export = ExportEndpoints::of_offer(&offer);
    export.policies = vec![plan];
    let mut answers = Answers::new();
    answers.insert("rome".into(), answer(&selectors[0].key, &["10.1.0.7"]));
    let rome = rome(Isolation::Exported);
    let mut paris = rome.clone();
    paris.cluster.id = "paris".into();
    paris.remote_pod_cidrs = vec![CidrMapping {
        real: "10.1.0.0/16".into(),
        view: "10.72.0.0/16".into(),
    }];
    let open = {
        let mut te = rome.clone();
        te.cluster.id = "vienna".into();
        te.isolation = Isolation::Open;
        te.remote_pod_cidrs.clear();
        te
    };
    let (admissions, _) = admissions(&[&paris, &rome, &open], &[export], &answers);
    let policies = |i: usize| &admissions[i].policies;
    // Paris is not named: the guarded port is closed to it, the other stays open.
    assert_eq!(admissions[0].endpoints.len(), 2);
    assert_eq!(policies(0).len(), 1);
    assert!(policies(0)[0].sources.is_empty());
    assert_eq!(policies(1)[0].sources, ["10.71.0.7"]);
    assert_eq!(policies(1)[0].endpoints.len(), 1);
    assert!(policies(2).is_empty(), "an open link carries no policy");
}
