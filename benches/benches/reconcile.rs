//! Reconciling 500 peer clusters on one hub: the pure IPAM + planner path, and complete
//! `sync_once` passes against an in-memory API server with an in-process gateway.
//!
//! Worst case on purpose: every peer announces the same pod (/20) and external (/24) CIDRs,
//! so all but the first of each need a remap.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kube::api::ObjectMeta;
use kube_fake_client::ClientBuilder;
use kubetun_controller::ipam::{Ipam, IpamConfig};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::operator::network_config as reconcile;
use kubetun_controller::operator::network_config::context::{Context, ControllerConfig};
use kubetun_controller::planner::{self, GatewaySettings};
use kubetun_controller::plumbing::cluster_info::ClusterInfo;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_controller_testing::FakeGateway;
use kubetun_crds::contract::link::{PEER_LABEL, ROLE_LABEL, ROLE_LOCAL, ROLE_REMOTE};
use kubetun_crds::{
    CidrMapping, ClusterRef, Endpoint, Network, NetworkConfig, NetworkConfigSpec,
    NetworkConfigStatus, TunnelEndpoint,
};

const PEERS: usize = 500;
const NAMESPACE: &str = "kubetun-system";

fn hub(key: &GatewayKey) -> ClusterInfo {
    ClusterInfo {
        cluster: ClusterRef {
            id: "europe".into(),
            name: "Europe".into(),
        },
        pod_cidrs: vec!["10.200.0.0/16".parse().expect("valid")],
        external_cidrs: vec!["10.70.0.0/16".parse().expect("valid")],
        service_cidrs: vec!["10.96.0.0/12".parse().expect("valid")],
        endpoint: Endpoint {
            address: "europe.example".into(),
            port: 51820,
        },
        public_key: key.public_base64().to_owned(),
        mtu: 1420,
    }
}

fn hub_ipam(info: &ClusterInfo) -> IpamConfig {
    let mut config = IpamConfig::default();
    config.reserved.extend(info.local_ranges());
    config
}

fn peer_spec(i: usize, key: &GatewayKey) -> NetworkConfigSpec {
    NetworkConfigSpec {
        source_cluster: ClusterRef {
            id: format!("peer-{i:03}"),
            name: String::new(),
        },
        destination_cluster: ClusterRef {
            id: "europe".into(),
            name: "Europe".into(),
        },
        pod_cidrs: vec!["10.100.0.0/20".into()],
        external_cidrs: vec!["10.70.0.0/24".into()],
        endpoint: Endpoint {
            address: format!("peer-{i}.example"),
            port: 51820,
        },
        public_key: key.public_base64().to_owned(),
        mtu: Some(1420),
        ..Default::default()
    }
}

fn settings(key: &GatewayKey, info: &ClusterInfo) -> GatewaySettings {
    GatewaySettings {
        private_key: key.private_base64(),
        public_key: key.public_base64().to_owned(),
        listen_port: 51820,
        mtu: info.mtu,
        local_prefixes: info
            .local_ranges()
            .iter()
            .map(ToString::to_string)
            .collect(),
        persistent_keepalive: 25,
        ..GatewaySettings::default()
    }
}

fn pure_path(c: &mut Criterion) {
    let key = GatewayKey::generate();
    let info = hub(&key);
    let peer_keys: Vec<GatewayKey> = (0..PEERS).map(|_| GatewayKey::generate()).collect();
    let specs: Vec<NetworkConfigSpec> = peer_keys
        .iter()
        .enumerate()
        .map(|(i, k)| peer_spec(i, k))
        .collect();

    let mut group = c.benchmark_group("reconcile_pure");
    group.sample_size(20);
    group.bench_function("ipam_process_500_peers", |b| {
        b.iter(|| {
            let mut ipam = Ipam::new(hub_ipam(&info));
            for spec in &specs {
                black_box(
                    planner::process_network_config(&mut ipam, spec).expect("room for 500 peers"),
                );
            }
            ipam
        });
    });

    // Both sides processed: TunnelEndpoints, then the gateway state of all of them.
    let mut ipam = Ipam::new(hub_ipam(&info));
    let pairs: Vec<(NetworkConfig, NetworkConfig)> = specs
        .iter()
        .map(|spec| {
            let view = planner::process_network_config(&mut ipam, spec).expect("room");
            let mut remote = NetworkConfig::new(
                &planner::remote_config_name(&spec.source_cluster.id),
                spec.clone(),
            );
            remote.status = Some(NetworkConfigStatus {
                processed: true,
                pod_cidrs: view.pod_cidrs,
                external_cidrs: view.external_cidrs,
                ..NetworkConfigStatus::default()
            });
            let local = local_config(&info, spec);
            (local, remote)
        })
        .collect();
    group.bench_function("tunnel_endpoints_and_desired_state_500_peers", |b| {
        let settings = settings(&key, &info);
        b.iter(|| {
            let endpoints: Vec<_> = pairs
                .iter()
                .map(|(local, remote)| {
                    planner::tunnel_endpoint_spec(local, remote).expect("processed")
                })
                .collect();
            black_box(planner::desired_state(&settings, &endpoints))
        });
    });
    group.finish();
}

/// Our `to-` NetworkConfig for the peer, as the peer processed it (nothing remapped there).
fn local_config(info: &ClusterInfo, peer: &NetworkConfigSpec) -> NetworkConfig {
    let spec = info.network_config_for(&peer.source_cluster);
    let kept = |cidrs: &[String]| {
        cidrs
            .iter()
            .map(|c| CidrMapping {
                real: c.clone(),
                view: c.clone(),
            })
            .collect()
    };
    let status = NetworkConfigStatus {
        processed: true,
        pod_cidrs: kept(&spec.pod_cidrs),
        external_cidrs: kept(&spec.external_cidrs),
        ..NetworkConfigStatus::default()
    };
    let mut local = NetworkConfig::new(&planner::local_config_name(&peer.source_cluster.id), spec);
    local.status = Some(status);
    local
}

fn labelled(mut nc: NetworkConfig, role: &str, peer: &str) -> NetworkConfig {
    nc.metadata = ObjectMeta {
        namespace: Some(NAMESPACE.into()),
        labels: Some(
            [
                (ROLE_LABEL.to_owned(), role.to_owned()),
                (PEER_LABEL.to_owned(), peer.to_owned()),
            ]
            .into(),
        ),
        ..nc.metadata
    };
    nc
}

/// A hub API server holding 500 peers' `from-` NetworkConfigs (unprocessed) and our `to-`
/// ones (processed by the peers), plus its controller context and gateway.
struct Hub {
    ctx: Arc<Context>,
    _gateway: FakeGateway,
}

async fn hub_with_peers(peers: &[(GatewayKey, NetworkConfigSpec)]) -> Hub {
    let key = GatewayKey::generate();
    let info = hub(&key);
    let mut objects = Vec::with_capacity(2 * peers.len());
    for (_, spec) in peers {
        let id = &spec.source_cluster.id;
        let mut remote = NetworkConfig::new(&planner::remote_config_name(id), spec.clone());
        remote.status = None;
        objects.push(labelled(remote, ROLE_REMOTE, id));
        objects.push(labelled(local_config(&info, spec), ROLE_LOCAL, id));
    }
    let client = ClientBuilder::new()
        .with_resource::<NetworkConfig>()
        .with_resource::<TunnelEndpoint>()
        .with_resource::<Network>()
        .with_status_subresource::<NetworkConfig>()
        .with_status_subresource::<TunnelEndpoint>()
        .with_objects(objects)
        .build()
        .await
        .expect("fake API server");
    let gateway = FakeGateway::start().await.expect("fake gateway");
    let ctx = Context::new(
        client,
        ControllerConfig {
            namespace: NAMESPACE.into(),
            ipam: hub_ipam(&info),
            gateway: settings(&key, &info),
            cluster: info,
        },
        Some(GatewayClient::new(gateway.socket())),
    )
    .await
    .expect("context");
    Hub {
        ctx,
        _gateway: gateway,
    }
}

fn api_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let peers: Vec<(GatewayKey, NetworkConfigSpec)> = (0..PEERS)
        .map(|i| {
            let key = GatewayKey::generate();
            let spec = peer_spec(i, &key);
            (key, spec)
        })
        .collect();

    let mut group = c.benchmark_group("reconcile_api");
    group.sample_size(10);
    group.bench_function("sync_once_first_pass_500_peers", |b| {
        b.iter_batched(
            || runtime.block_on(hub_with_peers(&peers)),
            |hub| {
                let report = runtime
                    .block_on(reconcile::sync_once(&hub.ctx))
                    .expect("sync");
                assert_eq!(report.tunnel_endpoints.len(), PEERS);
                hub
            },
            BatchSize::PerIteration,
        );
    });

    let steady = runtime.block_on(async {
        let hub = hub_with_peers(&peers).await;
        reconcile::sync_once(&hub.ctx).await.expect("first pass");
        hub
    });
    group.bench_function("sync_once_steady_state_500_peers", |b| {
        b.iter(|| {
            let report = runtime
                .block_on(reconcile::sync_once(&steady.ctx))
                .expect("sync");
            assert!(report.gateway.as_ref().is_some_and(|g| !g.applied));
            report
        });
    });
    group.finish();
}

criterion_group!(benches, pure_path, api_path);
criterion_main!(benches);
