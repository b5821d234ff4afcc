//! `kubetun-controller`: publishes this cluster's info, reconciles NetworkConfigs and
//! TunnelEndpoints, keeps the local gateway on the desired state, and runs the Network
//! controllers. Configured by flags or the matching `KUBETUN_*` environment variables.
//! `kubetun-controller agent` runs the per-node route agent instead (see `--help` there).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use ipnet::IpNet;
use kubetun_controller::cluster_info::{ClusterInfo, DEFAULT_NAMESPACE};
use kubetun_controller::context::{Context, ControllerConfig};
use kubetun_controller::gateway_client::{DEFAULT_SOCKET, GatewayClient};
use kubetun_controller::ipam::{IpamConfig, rfc1918_pools};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::network::{self, NetworkOptions};
use kubetun_controller::planner::{self, GatewaySettings};
use kubetun_controller::reconcile;
use kubetun_controller::shortcut;
use kubetun_crds::{ClusterRef, Endpoint};
use prometheus_client::registry::Registry;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "kubetun-controller",
    version,
    about = "kubetun controller: IPAM, NetworkConfig/TunnelEndpoint reconcilers, gateway sync"
)]
struct Args {
    /// Stable unique id of this cluster.
    #[arg(long, env = "KUBETUN_CLUSTER_ID")]
    cluster_id: String,
    /// Human readable name of this cluster (default: the id).
    #[arg(long, env = "KUBETUN_CLUSTER_NAME")]
    cluster_name: Option<String>,
    /// Namespace of every kubetun object of this cluster.
    #[arg(long, env = "KUBETUN_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    namespace: String,
    /// Pod CIDRs of this cluster.
    #[arg(long, env = "KUBETUN_POD_CIDR", value_delimiter = ',', required = true)]
    pod_cidr: Vec<IpNet>,
    /// Service CIDRs of this cluster (never announced, never used as a view).
    #[arg(long, env = "KUBETUN_SERVICE_CIDR", value_delimiter = ',')]
    service_cidr: Vec<IpNet>,
    /// External CIDRs of this cluster (non-pod addresses reachable through it).
    #[arg(long, env = "KUBETUN_EXTERNAL_CIDR", value_delimiter = ',')]
    external_cidr: Vec<IpNet>,
    /// Further local ranges IPAM must never hand out (node subnets, ...).
    #[arg(long, env = "KUBETUN_RESERVED", value_delimiter = ',')]
    reserved: Vec<IpNet>,
    /// Pools remapped views are taken from (default: the RFC 1918 ranges).
    #[arg(long, env = "KUBETUN_POOLS", value_delimiter = ',')]
    pools: Vec<IpNet>,
    /// Address (IP or DNS name) peers reach this cluster's gateway at.
    #[arg(long, env = "KUBETUN_ENDPOINT_ADDRESS")]
    endpoint_address: String,
    /// UDP port peers reach this cluster's gateway at.
    #[arg(long, env = "KUBETUN_ENDPOINT_PORT", default_value_t = 51820)]
    endpoint_port: u16,
    /// UDP port the gateway listens on (default: the endpoint port).
    #[arg(long, env = "KUBETUN_LISTEN_PORT")]
    listen_port: Option<u16>,
    /// The gateway's control socket.
    #[arg(long, env = "KUBETUN_GATEWAY_SOCKET", default_value = DEFAULT_SOCKET)]
    gateway_socket: PathBuf,
    /// Run without a local gateway (TunnelEndpoints are still maintained).
    #[arg(long, env = "KUBETUN_NO_GATEWAY")]
    no_gateway: bool,
    /// Addresses (CIDR) of the gateway's TUN device.
    #[arg(long, env = "KUBETUN_TUNNEL_ADDRESS", value_delimiter = ',')]
    tunnel_address: Vec<IpNet>,
    /// Let the gateway install a route to the TUN device for every view.
    #[arg(long, env = "KUBETUN_MANAGE_ROUTES")]
    manage_routes: bool,
    /// Persistent keepalive towards every peer, seconds (0: off).
    #[arg(long, env = "KUBETUN_PERSISTENT_KEEPALIVE", default_value_t = 25)]
    persistent_keepalive: u32,
    /// Milliseconds between the gateway's connectivity probes to each peer.
    #[arg(long, env = "KUBETUN_CONNCHECK_INTERVAL_MS", default_value_t = planner::CONNCHECK_INTERVAL_MS, value_parser = clap::value_parser!(u32).range(100..=60_000))]
    conncheck_interval_ms: u32,
    /// Consecutive unanswered probes after which a peer is reported unreachable (Error).
    #[arg(long, env = "KUBETUN_CONNCHECK_LOSS_THRESHOLD", default_value_t = planner::CONNCHECK_LOSS_THRESHOLD, value_parser = clap::value_parser!(u32).range(1..=100))]
    conncheck_loss_threshold: u32,
    /// Tunnel MTU.
    #[arg(long, env = "KUBETUN_MTU", default_value_t = 1420, value_parser = clap::value_parser!(u32).range(1280..=9000))]
    mtu: u32,
    /// Smallest Network ID (VNI) handed out.
    #[arg(long, env = "KUBETUN_MIN_VNI", default_value_t = NetworkOptions::default().min_vni)]
    min_vni: u32,
    /// Largest Network ID (VNI) handed out.
    #[arg(long, env = "KUBETUN_MAX_VNI", default_value_t = NetworkOptions::default().max_vni)]
    max_vni: u32,
    /// Serve /metrics, /healthz and /readyz on this address.
    #[arg(long, env = "KUBETUN_METRICS_ADDR", default_value = "0.0.0.0:9587")]
    metrics_addr: SocketAddr,
    /// Log as JSON lines.
    #[arg(long, env = "KUBETUN_LOG_JSON")]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args_os().nth(1).is_some_and(|arg| arg == "agent") {
        let args = kubetun_controller::agent::AgentArgs::parse_from(std::env::args_os().skip(1));
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
        tracing_subscriber::fmt().with_env_filter(filter).init();
        return kubetun_controller::agent::run(args)
            .await
            .context("route agent failed");
    }
    let args = Args::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if args.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }

    kubetun_controller::cli::install_tls_provider();
    let client = kube::Client::try_default()
        .await
        .context("cannot build a Kubernetes client (in-cluster config or kubeconfig)")?;
    let key = GatewayKey::load_or_create(client.clone(), &args.namespace).await?;
    let info = ClusterInfo {
        cluster: ClusterRef {
            id: args.cluster_id.clone(),
            name: args
                .cluster_name
                .clone()
                .unwrap_or_else(|| args.cluster_id.clone()),
        },
        pod_cidrs: args.pod_cidr.clone(),
        external_cidrs: args.external_cidr.clone(),
        service_cidrs: args.service_cidr.clone(),
        endpoint: Endpoint {
            address: args.endpoint_address.clone(),
            port: args.endpoint_port,
        },
        public_key: key.public_base64().to_owned(),
        mtu: args.mtu,
    };
    info.publish(&client, &args.namespace)
        .await
        .context("cannot publish the cluster info")?;
    tracing::info!(cluster = %info.cluster.id, public_key = info.public_key, "cluster info published");

    let settings = GatewaySettings {
        private_key: key.private_base64(),
        public_key: key.public_base64().to_owned(),
        listen_port: u32::from(args.listen_port.unwrap_or(args.endpoint_port)),
        mtu: args.mtu,
        addresses: args
            .tunnel_address
            .iter()
            .map(ToString::to_string)
            .collect(),
        local_prefixes: info
            .local_ranges()
            .iter()
            .map(ToString::to_string)
            .collect(),
        manage_routes: args.manage_routes,
        persistent_keepalive: args.persistent_keepalive,
        conncheck_interval_ms: args.conncheck_interval_ms,
        conncheck_loss_threshold: args.conncheck_loss_threshold,
    };
    let config = ControllerConfig {
        namespace: args.namespace.clone(),
        cluster: info,
        ipam: IpamConfig {
            pools: if args.pools.is_empty() {
                rfc1918_pools()
            } else {
                args.pools.clone()
            },
            reserved: args.reserved.clone(),
        },
        gateway: settings,
    };
    let gateway = (!args.no_gateway).then(|| GatewayClient::new(&args.gateway_socket));
    let ctx = Context::new(client.clone(), config, gateway).await?;

    let mut registry = Registry::default();
    ctx.metrics.register(&mut registry);
    ctx.health.register(&mut registry);
    let network_options = NetworkOptions {
        min_vni: args.min_vni,
        max_vni: args.max_vni,
        ..NetworkOptions::default()
    };

    tokio::select! {
        () = reconcile::run(ctx.clone()) => tracing::info!("controller stopped"),
        result = shortcut::run(client.clone(), Some(args.namespace.clone()), &ctx.health) => {
            result.context("the ShortcutConnection operator failed")?;
        }
        result = network::run(client, None, network_options, &ctx.health) => {
            result.context("the Network controllers failed")?;
        }
        result = serve_http(args.metrics_addr, Arc::new(registry), ctx.clone()) => {
            result.with_context(|| format!("cannot serve metrics on {}", args.metrics_addr))?;
        }
    }
    Ok(())
}

/// `/metrics` (OpenMetrics text), `/healthz` (the process runs) and `/readyz` (the gateway,
/// if any, answered the last sync).
async fn serve_http(
    addr: SocketAddr,
    registry: Arc<Registry>,
    ctx: Arc<Context>,
) -> std::io::Result<()> {
    use axum::http::{StatusCode, header};
    use axum::routing::get;

    let metrics = move || {
        let registry = registry.clone();
        async move {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, &registry) {
                Ok(()) => (
                    StatusCode::OK,
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    body,
                ),
                Err(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    [(header::CONTENT_TYPE, "text/plain")],
                    "cannot encode metrics".to_owned(),
                ),
            }
        }
    };
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ctx.gateway.is_none() || ctx.gateway_status().is_some();
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "gateway unreachable")
                    }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}
