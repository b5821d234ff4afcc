//! Scenario support: clusters as in-memory API servers with a fake gateway each, and a
//! minimal stand-in for the connector that carries NetworkConfigs between them.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube_fake_client::ClientBuilder;
use kubetun_controller::ipam::IpamConfig;
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::operator::network_config::context::{Context, ControllerConfig};
use kubetun_controller::operator::network_config::{self, SyncReport};
use kubetun_controller::planner;
use kubetun_controller::plumbing::cluster_info::ClusterInfo;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_controller_testing::FakeGateway;
use kubetun_crds::contract::link::{PEER_LABEL, ROLE_LABEL, ROLE_LOCAL, ROLE_REMOTE};
use kubetun_crds::{
    Network, NetworkConfig, NetworkConfigSpec, NetworkConfigStatus, TunnelEndpoint,
};

pub const NAMESPACE: &str = "kubetun-system";

/// An API server backed by memory that serves the kubetun resources.
pub async fn api_server() -> kube::Client {
    api_server_builder().build().await.unwrap()
}

/// The builder behind [`api_server`], to seed objects.
pub fn api_server_builder() -> ClientBuilder {
    ClientBuilder::new()
        .with_resource::<NetworkConfig>()
        .with_resource::<TunnelEndpoint>()
        .with_resource::<Network>()
        .with_status_subresource::<NetworkConfig>()
        .with_status_subresource::<TunnelEndpoint>()
        .with_status_subresource::<Network>()
}

/// One cluster: API server, controller context, gateway.
pub struct Cluster {
    pub info: ClusterInfo,
    pub client: kube::Client,
    pub ctx: Arc<Context>,
    pub gateway: FakeGateway,
    pub key: GatewayKey,
    pub ipam: IpamConfig,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("id", &self.info.cluster.id)
            .finish()
    }
}

pub use kubetun_controller_testing::{cluster_info, gateway_settings as settings};

impl Cluster {
    pub async fn start(id: &str, pod: &str, external: &str) -> Self {
        Self::start_with(id, pod, external, IpamConfig::default()).await
    }

    pub async fn start_with(id: &str, pod: &str, external: &str, ipam: IpamConfig) -> Self {
        Self::start_on(api_server().await, id, pod, external, ipam).await
    }

    /// A cluster whose API server already holds objects.
    pub async fn start_on(
        client: kube::Client,
        id: &str,
        pod: &str,
        external: &str,
        ipam: IpamConfig,
    ) -> Self {
        let key = GatewayKey::generate();
        let info = cluster_info(id, pod, external, &key);
        let gateway = FakeGateway::start().await.unwrap();
        let ctx = context(&client, &info, &key, &ipam, &gateway).await;
        Self {
            info,
            client,
            ctx,
            gateway,
            key,
            ipam,
        }
    }

    /// A new controller on the same API server and gateway (a controller restart).
    pub async fn restart_controller(&mut self) {
        self.ctx = context(
            &self.client,
            &self.info,
            &self.key,
            &self.ipam,
            &self.gateway,
        )
        .await;
    }

    pub fn id(&self) -> &str {
        &self.info.cluster.id
    }

    pub async fn sync(&self) -> SyncReport {
        network_config::sync_once(&self.ctx).await.unwrap()
    }

    pub fn configs(&self) -> Api<NetworkConfig> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    pub fn endpoints(&self) -> Api<TunnelEndpoint> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    pub async fn config(&self, name: &str) -> Option<NetworkConfig> {
        self.configs().get_opt(name).await.unwrap()
    }

    pub async fn status_of(&self, name: &str) -> NetworkConfigStatus {
        self.config(name)
            .await
            .and_then(|nc| nc.status)
            .unwrap_or_default()
    }

    pub async fn endpoint(&self, peer: &str) -> Option<TunnelEndpoint> {
        self.endpoints().get_opt(peer).await.unwrap()
    }

    /// The view this cluster has of `peer`'s CIDR `real`.
    pub async fn view_of(&self, peer: &str, real: &str) -> Option<String> {
        let status = self.status_of(&planner::remote_config_name(peer)).await;
        status
            .pod_cidrs
            .iter()
            .chain(&status.external_cidrs)
            .find(|m| m.real == real)
            .map(|m| m.view.clone())
    }
}

async fn context(
    client: &kube::Client,
    info: &ClusterInfo,
    key: &GatewayKey,
    ipam: &IpamConfig,
    gateway: &FakeGateway,
) -> Arc<Context> {
    Context::new(
        client.clone(),
        ControllerConfig {
            namespace: NAMESPACE.into(),
            cluster: info.clone(),
            ipam: ipam.clone(),
            gateway: settings(key, info),
        },
        Some(GatewayClient::new(gateway.socket())),
    )
    .await
    .unwrap()
}

pub fn labelled(name: String, role: &str, peer: &str, spec: NetworkConfigSpec) -> NetworkConfig {
    NetworkConfig {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(NAMESPACE.into()),
            labels: Some(BTreeMap::from([
                (ROLE_LABEL.to_owned(), role.to_owned()),
                (PEER_LABEL.to_owned(), peer.to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// Creates (or replaces the spec of) `name` in `api`.
pub async fn put(api: &Api<NetworkConfig>, nc: &NetworkConfig) {
    let name = nc.metadata.name.clone().unwrap();
    match api.get_opt(&name).await.unwrap() {
        None => {
            api.create(&PostParams::default(), nc).await.unwrap();
        }
        Some(_) => {
            let patch = serde_json::json!({ "spec": nc.spec });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    }
}

/// What a connector does for one direction: `from` announces itself to `to`.
pub async fn announce(from: &Cluster, to: &Cluster) {
    let spec = from.info.network_config_for(&to.info.cluster);
    announce_spec(from, to, spec).await;
}

/// Like [`announce`] with an explicit (possibly invalid) spec.
pub async fn announce_spec(from: &Cluster, to: &Cluster, spec: NetworkConfigSpec) {
    let local = labelled(
        planner::local_config_name(to.id()),
        ROLE_LOCAL,
        to.id(),
        spec.clone(),
    );
    put(&from.configs(), &local).await;
    let remote = labelled(
        planner::remote_config_name(from.id()),
        ROLE_REMOTE,
        from.id(),
        spec,
    );
    put(&to.configs(), &remote).await;
}

/// Mirrors how `to` processed `from`'s NetworkConfig back onto `from`'s `to-` copy.
pub async fn mirror(from: &Cluster, to: &Cluster) {
    let Some(processed) = to.config(&planner::remote_config_name(from.id())).await else {
        return;
    };
    let status = processed.status.unwrap_or_default();
    let patch = serde_json::json!({ "status": status });
    from.configs()
        .patch_status(
            &planner::local_config_name(to.id()),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

/// Links two clusters and drives both controllers until the link is complete.
pub async fn connect(a: &Cluster, b: &Cluster) {
    announce(a, b).await;
    announce(b, a).await;
    settle(&[a, b]).await;
}

/// Syncs every cluster and mirrors every status until nothing changes (bounded).
pub async fn settle(clusters: &[&Cluster]) {
    for _ in 0..3 {
        for c in clusters {
            c.sync().await;
        }
        for a in clusters {
            for b in clusters {
                if a.id() != b.id()
                    && a.config(&planner::local_config_name(b.id()))
                        .await
                        .is_some()
                {
                    mirror(a, b).await;
                }
            }
        }
    }
    for c in clusters {
        c.sync().await;
    }
}
