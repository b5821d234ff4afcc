//! Export policies at scale, in one exporter: 50 linked clusters in exported mode (every one on
//! the same pod CIDR, each at its own view), 200 exported Services of 5 endpoints, 1 000
//! ExportPolicies (5 per Service, each naming 5 clusters) and 10 000 client pods (200 per
//! cluster, 40 behind each of the 5 selectors). Measured, same run:
//!
//! - `planner`: the controller's pass from the offers, policies and answers to the gateway's
//!   admissions (`planner::admission::admissions`);
//! - `gateway_build`: the gateway turning that Apply into its admission snapshot (parse,
//!   validate, build the keyed sets), what an Apply costs on top of the rest of the state;
//! - the snapshot's size (printed once: entries and slots of the two sets).
//!
//! Run: `cargo bench -p kubetun-benches --bench policy_scale`.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubetun_controller::gateway_api;
use kubetun_controller::planner::admission::{Answers, admissions};
use kubetun_controller::planner::{ExportEndpoints, PolicyPlan};
use kubetun_crds::mcs::{ServiceImportType, ServicePort};
use kubetun_crds::{
    CidrMapping, ClientIdentitySpec, ClusterRef, ExportedEndpoint, ExportedEndpointPort,
    ExportedServiceSpec, ExportedSlice, IdentitySelection, Isolation, TunnelEndpointSpec,
};
use kubetun_gateway_core::admission::allowed::Admissions;

const CLUSTERS: usize = 50;
const SERVICES: usize = 200;
const ENDPOINTS: usize = 5;
const POLICIES_PER_SERVICE: usize = 5;
const CLUSTERS_PER_POLICY: usize = 5;
const PODS_PER_CLUSTER: usize = 200;

fn cluster(i: usize) -> String {
    format!("c{i:02}")
}

fn tunnel_endpoint(i: usize) -> TunnelEndpointSpec {
    TunnelEndpointSpec {
        cluster: ClusterRef {
            id: cluster(i),
            name: cluster(i),
        },
        remote_pod_cidrs: vec![CidrMapping {
            real: "10.1.0.0/16".into(),
            view: format!("10.{}.0.0/16", 100 + i),
        }],
        isolation: Isolation::Exported,
        ..TunnelEndpointSpec::default()
    }
}

fn offer(s: usize) -> ExportedServiceSpec {
    ExportedServiceSpec {
        cluster: ClusterRef {
            id: "exporter".into(),
            name: "exporter".into(),
        },
        namespace: "shop".into(),
        name: format!("svc{s}"),
        export_created: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        type_: ServiceImportType::ClusterSetIP,
        ports: vec![ServicePort {
            name: None,
            protocol: "TCP".into(),
            app_protocol: None,
            port: 80,
        }],
        session_affinity: None,
        session_affinity_config: None,
        ip_families: Vec::new(),
        internal_traffic_policy: None,
        traffic_distribution: None,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        slices: vec![ExportedSlice {
            address_type: "IPv4".into(),
            ports: vec![ExportedEndpointPort {
                name: None,
                protocol: "TCP".into(),
                port: 8080,
                app_protocol: None,
            }],
            endpoints: (0..ENDPOINTS)
                .map(|e| ExportedEndpoint {
                    addresses: vec![format!("10.20.{}.{}", s / 50, (s % 50) * 5 + e)],
                    ..ExportedEndpoint::default()
                })
                .collect(),
        }],
        consumers: None,
        client_selectors: Vec::new(),
    }
}

/// The exports, each Service guarded by its 5 policies; policy `p` of Service `s` asks 5
/// clusters about selector `k<p>`.
fn exports() -> Vec<ExportEndpoints> {
    (0..SERVICES)
        .map(|s| {
            let offer = offer(s);
            let mut export = ExportEndpoints::of_offer(&offer);
            export.policies = (0..POLICIES_PER_SERVICE)
                .map(|p| PolicyPlan {
                    name: format!("shop/svc{s}-p{p}"),
                    endpoints: export.endpoints.clone(),
                    from: vec![(
                        (0..CLUSTERS_PER_POLICY)
                            .map(|k| cluster((s * POLICIES_PER_SERVICE + p + k * 10) % CLUSTERS))
                            .collect(),
                        format!("k{p}"),
                    )],
                })
                .collect();
            export
        })
        .collect()
}

/// Every cluster's answer: 40 of its 200 pods behind each selector.
fn answers() -> Answers {
    (0..CLUSTERS)
        .map(|i| {
            let selections = (0..POLICIES_PER_SERVICE)
                .map(|p| IdentitySelection {
                    key: format!("k{p}"),
                    addresses: (0..PODS_PER_CLUSTER)
                        .filter(|pod| pod % POLICIES_PER_SERVICE == p)
                        .map(|pod| format!("10.1.{}.{}", pod / 250, pod % 250 + 1))
                        .collect(),
                })
                .collect();
            (
                cluster(i),
                ClientIdentitySpec {
                    cluster: cluster(i),
                    exporter: "exporter".into(),
                    selections,
                },
            )
        })
        .collect()
}

fn apply_request(admissions: Vec<gateway_api::Admission>) -> gateway_api::DesiredState {
    gateway_api::DesiredState {
        version: "scale".into(),
        interface: Some(gateway_api::Interface {
            private_key: kubetun_gateway_core::key::Key::from_bytes([1; 32]).to_base64(),
            ..Default::default()
        }),
        peers: Vec::new(),
        admissions,
    }
}

fn bench(c: &mut Criterion) {
    let tunnel_endpoints: Vec<TunnelEndpointSpec> = (0..CLUSTERS).map(tunnel_endpoint).collect();
    let specs: Vec<&TunnelEndpointSpec> = tunnel_endpoints.iter().collect();
    let exports = exports();
    let answers = answers();
    let (planned, _) = admissions(&specs, &exports, &answers);
    let sources: usize = planned
        .iter()
        .flat_map(|a| &a.policies)
        .map(|p| p.sources.len())
        .sum();
    let state =
        kubetun_gateway::state::from_proto(apply_request(planned.clone()), &Default::default())
            .expect("a valid state");
    let built = Admissions::build(&state, &Admissions::default());
    let (endpoints, groups, sets) = built.sizes();
    eprintln!(
        "policy scale: {CLUSTERS} clusters, {} policies, {} client pods; the gateway is given \
         {} source policies with {sources} sources; its snapshot holds {endpoints} endpoint \
         entries, {groups} groups and {sets} (group, source) entries in {} KiB",
        SERVICES * POLICIES_PER_SERVICE,
        CLUSTERS * PODS_PER_CLUSTER,
        planned.iter().map(|a| a.policies.len()).sum::<usize>(),
        built.memory() / 1024
    );
    let mut group = c.benchmark_group("policy_scale");
    group.sample_size(10);
    group.bench_function("planner", |b| {
        b.iter(|| black_box(admissions(&specs, &exports, &answers)))
    });
    group.bench_function("gateway_build", |b| {
        b.iter(|| {
            let state = kubetun_gateway::state::from_proto(
                apply_request(planned.clone()),
                &Default::default(),
            )
            .expect("valid");
            black_box(Admissions::build(&state, &Admissions::default()))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
