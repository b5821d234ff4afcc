//! `kubetun-controller`: publishes this cluster's info, reconciles NetworkConfigs and
//! TunnelEndpoints, keeps the local gateway on the desired state, and runs the Network
//! controllers. Configured by flags or the matching `KUBETUN_*` environment variables.
//! Only the hub (`--hub`) runs the ShortcutConnection operator.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use ipnet::IpNet;
use kubetun_controller::ipam::{IpamConfig, rfc1918_pools};
use kubetun_controller::keys::GatewayKeys;
use kubetun_controller::operator::ha::{self, Election, Elector, HaMetrics, Timing};
use kubetun_controller::operator::isolation::{self, NetworkOptions};
use kubetun_controller::operator::network_config;
use kubetun_controller::operator::network_config::context::{Context, ControllerConfig};
use kubetun_controller::operator::services;
use kubetun_controller::operator::shortcut;
use kubetun_controller::planner::{self, GatewaySettings};
use kubetun_controller::plumbing::cluster_info::{Cidrs, ClusterInfo, parse_cidrs};
use kubetun_controller::plumbing::gateway_client::{
    DEFAULT_INTERFACE, GatewayClient, grpc_socket_path,
};
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;
use kubetun_crds::contract::lease::DEFAULT_LEASE_NAME;
use kubetun_crds::{ClusterRef, Endpoint};
use prometheus_client::registry::Registry;

#[derive(Debug, Parser)]
#[command(
    name = "kubetun-controller",
    version,
    about = "kubetun controller: IPAM, NetworkConfig/TunnelEndpoint reconcilers, gateway sync"
)]
struct Args {
    /// Kubeconfig to use (default: in-cluster config, else $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig (default: its current context).
    #[arg(long)]
    context: Option<String>,
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
    #[arg(long, env = "KUBETUN_SERVICE_CIDR", value_parser = parse_cidrs)]
    service_cidr: Vec<Cidrs>,
    /// External CIDRs of this cluster (non-pod addresses reachable through it).
    #[arg(long, env = "KUBETUN_EXTERNAL_CIDR", value_parser = parse_cidrs)]
    external_cidr: Vec<Cidrs>,
    /// Further local ranges IPAM must never hand out (node subnets, ...).
    #[arg(long, env = "KUBETUN_RESERVED", value_parser = parse_cidrs)]
    reserved: Vec<Cidrs>,
    /// Pools remapped views are taken from (default: the RFC 1918 ranges).
    #[arg(long, env = "KUBETUN_POOLS", value_parser = parse_cidrs)]
    pools: Vec<Cidrs>,
    /// Address (IP or DNS name) peers reach this cluster's gateway at.
    #[arg(long, env = "KUBETUN_ENDPOINT_ADDRESS")]
    endpoint_address: String,
    /// UDP port peers reach this cluster's gateway at.
    #[arg(long, env = "KUBETUN_ENDPOINT_PORT", default_value_t = 51820)]
    endpoint_port: u16,
    /// UDP port the gateway listens on (default: the endpoint port).
    #[arg(long, env = "KUBETUN_LISTEN_PORT")]
    listen_port: Option<u16>,
    /// Interface name of the local gateway (`kubetun-gateway <name>`); its control socket is
    /// derived from it the way the gateway derives it (`/var/run/kubetun/<name>.grpc.sock`).
    #[arg(long, env = "KUBETUN_GATEWAY_INTERFACE", default_value = DEFAULT_INTERFACE)]
    gateway_interface: String,
    /// The gateway's control socket, only when the gateway runs with `--grpc-socket`
    /// (default: derived from --gateway-interface).
    #[arg(long, env = "KUBETUN_GATEWAY_SOCKET")]
    gateway_socket: Option<PathBuf>,
    /// This cluster is the hub: run the ShortcutConnection operator, which links leaf
    /// clusters directly. Leaves leave it off.
    #[arg(long, env = "KUBETUN_HUB")]
    hub: bool,
    /// Run without a local gateway (TunnelEndpoints are still maintained).
    #[arg(long, env = "KUBETUN_NO_GATEWAY")]
    no_gateway: bool,
    /// Addresses (CIDR) of the gateway's TUN device.
    #[arg(long, env = "KUBETUN_TUNNEL_ADDRESS", value_parser = parse_cidrs)]
    tunnel_address: Vec<Cidrs>,
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
    /// Milliseconds between probes of a peer whose traffic a hub takes over while it is
    /// unreachable (a shortcut with transit): how soon that traffic moves.
    #[arg(long, env = "KUBETUN_CONNCHECK_FALLBACK_INTERVAL_MS", default_value_t = planner::CONNCHECK_FALLBACK_INTERVAL_MS, value_parser = clap::value_parser!(u32).range(100..=60_000))]
    conncheck_fallback_interval_ms: u32,
    /// Tunnel MTU.
    #[arg(long, env = "KUBETUN_MTU", default_value_t = 1420, value_parser = clap::value_parser!(u32).range(1280..=9000))]
    mtu: u32,
    /// Smallest Network ID (VNI) handed out.
    #[arg(long, env = "KUBETUN_MIN_VNI", default_value_t = NetworkOptions::default().min_vni)]
    min_vni: u32,
    /// Largest Network ID (VNI) handed out.
    #[arg(long, env = "KUBETUN_MAX_VNI", default_value_t = NetworkOptions::default().max_vni)]
    max_vni: u32,
    /// Serve /metrics, /healthz and /readyz on this address (`:9587`, `127.0.0.1:9587`);
    /// `0` (the default) serves nothing, so several controllers can share a host.
    #[arg(long, alias = "metrics-bind-address", env = "KUBETUN_METRICS_ADDR", default_value = "0", value_parser = parse_listen_addr)]
    metrics_addr: ListenAddr,
    /// Answer DNS for `clusterset.local` (the imported Services) on this address, UDP and TCP
    /// (`:5353`); `0` (the default) serves nothing. deploy/ serves it behind Service
    /// kubetun-dns, which CoreDNS forwards `clusterset.local` to.
    #[arg(long, env = "KUBETUN_DNS_ADDR", default_value = "0", value_parser = parse_listen_addr)]
    dns_addr: ListenAddr,
    /// Log as JSON lines.
    #[arg(long, env = "KUBETUN_LOG_JSON")]
    log_json: bool,
    /// Gateway replicas (high availability).
    #[command(flatten)]
    replicas: ReplicaArgs,
}

/// With `--replica`, this controller and its gateway are one of several replicas of the
/// cluster's gateway: a Lease elects the active one, the others keep their gateways on
/// standby with the same state.
#[derive(Debug, clap::Args)]
struct ReplicaArgs {
    /// This replica's unique name (the pod name); enables the gateway lease election. The
    /// gateway must then run with `--standby`.
    #[arg(long, env = "KUBETUN_REPLICA")]
    replica: Option<String>,
    /// Name of the gateway Lease in the kubetun namespace.
    #[arg(long, env = "KUBETUN_LEASE_NAME", default_value = DEFAULT_LEASE_NAME)]
    lease_name: String,
    /// Underlay IP of this replica's node; the Lease names it so that the route agents send
    /// traffic for remote clusters to the active replica's node.
    #[arg(long, env = "KUBETUN_NODE_IP")]
    node_ip: Option<IpAddr>,
    /// A replica takes the lease over once it saw it unrenewed this long (whole seconds).
    #[arg(long, env = "KUBETUN_LEASE_DURATION_SECONDS", default_value_t = Timing::default().lease_duration.as_secs(), value_parser = clap::value_parser!(u64).range(1..=300))]
    lease_duration_seconds: u64,
    /// The active replica steps down when it could not renew for this long.
    #[arg(long, env = "KUBETUN_RENEW_DEADLINE_MS", default_value_t = millis(Timing::default().renew_deadline))]
    renew_deadline_ms: u64,
    /// Time between attempts to acquire or renew the lease.
    #[arg(long, env = "KUBETUN_RETRY_PERIOD_MS", default_value_t = millis(Timing::default().retry_period))]
    retry_period_ms: u64,
}

const fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

impl ReplicaArgs {
    fn timing(&self) -> anyhow::Result<Timing> {
        Timing {
            lease_duration: Duration::from_secs(self.lease_duration_seconds),
            renew_deadline: Duration::from_millis(self.renew_deadline_ms),
            retry_period: Duration::from_millis(self.retry_period_ms),
        }
        .validate()
        .context("invalid lease timing (--lease-duration-seconds, --renew-deadline-ms, --retry-period-ms)")
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    kubetun_controller::plumbing::logging::init_daemon(args.log_json);
    run_controller(args).await
}

/// This cluster's info as the flags give it (its public key comes from the key Secret).
fn cluster_info(args: &Args) -> ClusterInfo {
    ClusterInfo {
        cluster: ClusterRef {
            id: args.cluster_id.clone(),
            name: args
                .cluster_name
                .clone()
                .unwrap_or_else(|| args.cluster_id.clone()),
        },
        pod_cidrs: args.pod_cidr.clone(),
        external_cidrs: flatten(&args.external_cidr),
        service_cidrs: flatten(&args.service_cidr),
        endpoint: Endpoint {
            address: args.endpoint_address.clone(),
            port: args.endpoint_port,
        },
        public_key: String::new(),
        mtu: args.mtu,
    }
}

/// What the planner puts into every state for the local gateway (its keys come later).
fn gateway_settings(args: &Args, info: &ClusterInfo) -> GatewaySettings {
    GatewaySettings {
        listen_port: u32::from(args.listen_port.unwrap_or(args.endpoint_port)),
        mtu: args.mtu,
        addresses: flatten(&args.tunnel_address)
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
        conncheck_fallback_interval_ms: args.conncheck_fallback_interval_ms,
        ..GatewaySettings::default()
    }
}

/// A replica before it holds the gateway lease.
struct Standby<'a> {
    client: &'a kube::Client,
    args: &'a Args,
    replica: &'a str,
    gateway: Option<GatewayClient>,
    settings: &'a GatewaySettings,
    metrics: &'a HaMetrics,
}

impl Standby<'_> {
    /// Keeps the local gateway a standby with the cluster's state until this replica holds
    /// the gateway lease (the controllers' writes must come from one replica at a time);
    /// `None` when a signal stopped it first.
    async fn until_leading(self) -> anyhow::Result<Option<Elector>> {
        let Some(gateway) = self.gateway else {
            bail!(
                "--replica elects the active gateway: it needs a local gateway (drop --no-gateway)"
            );
        };
        let replicas = &self.args.replicas;
        let mut elector = Elector::new(
            self.client.clone(),
            &self.args.namespace,
            &replicas.lease_name,
            replicas.node_ip,
            Election::new(self.replica.to_owned(), replicas.timing()?),
            Some(gateway.clone()),
            self.metrics.clone(),
        );
        tracing::info!(
            replica = self.replica,
            lease = replicas.lease_name,
            "replica: standby until it holds the gateway lease"
        );
        let namespace = self.args.namespace.clone();
        tokio::select! {
            () = elector.acquire() => Ok(Some(elector)),
            () = ha::standby::run(self.client.clone(), namespace, self.settings.clone(), gateway) => Ok(Some(elector)),
            () = kubetun_controller::plumbing::shutdown::signal() => {
                tracing::info!("stopped while on standby");
                Ok(None)
            }
        }
    }
}

/// The controller: metrics, the standby wait of a replica, then every reconciler until one
/// stops, the lease is lost or a signal comes.
async fn run_controller(args: Args) -> anyhow::Result<()> {
    let client = kubetun_controller::plumbing::kubeconfig::KubeconfigSource {
        path: args.kubeconfig.clone(),
        context: args.context.clone(),
    }
    .client_or_in_cluster("local")
    .await?;
    let listeners = Listeners::bind(&args).await?;
    let socket = args
        .gateway_socket
        .clone()
        .unwrap_or_else(|| grpc_socket_path(&args.gateway_interface));
    let gateway = (!args.no_gateway).then(|| GatewayClient::new(&socket));

    let metrics = Metrics::default();
    let dns_table = services::dns_server::SharedTable::default();
    let dns = async {
        match listeners.dns {
            Some(sockets) => {
                services::dns_server::serve(sockets, dns_table.clone(), metrics.dns.clone()).await
            }
            None => std::future::pending().await,
        }
    };
    let ctx_slot: Arc<OnceLock<Arc<Context>>> = Arc::default();
    let mut http = match listeners.metrics {
        Some(listener) => tokio::spawn(serve_http(
            listener,
            metrics.registry.clone(),
            ctx_slot.clone(),
        )),
        None => tokio::spawn(std::future::pending()),
    };

    let info = cluster_info(&args);
    let settings = gateway_settings(&args, &info);
    let mut elector = match &args.replicas.replica {
        Some(replica) => {
            let standby = Standby {
                client: &client,
                args: &args,
                replica,
                gateway: gateway.clone(),
                settings: &settings,
                metrics: &metrics.ha,
            };
            match standby.until_leading().await? {
                Some(elector) => Some(elector),
                None => return Ok(()),
            }
        }
        None => None,
    };

    let config = publish_cluster(&client, &args, info, settings).await?;
    let ctx = Context::new(client.clone(), config, gateway).await?;
    metrics.register_controller(&ctx);
    let _ = ctx_slot.set(ctx.clone());
    let network_options = NetworkOptions {
        min_vni: args.min_vni,
        max_vni: args.max_vni,
        ..NetworkOptions::default()
    };
    let lease_lost = async {
        match elector.as_mut() {
            Some(elector) => elector.keep().await,
            None => std::future::pending().await,
        }
    };
    let services = async {
        if services::sync::available(&ctx).await {
            services::sync::run(ctx.clone(), dns_table.clone(), metrics.services.clone()).await;
        }
        std::future::pending().await
    };
    tracing::info!("running; SIGTERM or ctrl+c stops gracefully");
    tokio::select! {
        () = network_config::run(ctx.clone()) => tracing::info!("controller stopped"),
        () = services => {}
        () = dns => {}
        result = shortcut_operator(&client, &args, &ctx) => {
            result.context("the ShortcutConnection operator failed")?;
        }
        result = isolation::run(client.clone(), None, network_options, ctx.health.clone()) => {
            result.context("the Network controllers failed")?;
        }
        result = &mut http => {
            result.context("the metrics server stopped")?.context("cannot serve metrics (--metrics-addr)")?;
        }
        () = lease_lost => {
            bail!("this replica lost the gateway lease; exiting to start again as a standby");
        }
    }
    if let Some(elector) = elector.as_mut() {
        elector.release().await;
    }
    Ok(())
}

/// The sockets the controller serves on, bound before anything else so that a taken port
/// fails the start instead of later.
struct Listeners {
    metrics: Option<tokio::net::TcpListener>,
    dns: Option<(tokio::net::UdpSocket, tokio::net::TcpListener)>,
}

impl Listeners {
    async fn bind(args: &Args) -> anyhow::Result<Self> {
        let metrics = match args.metrics_addr {
            ListenAddr::Disabled => None,
            ListenAddr::Listen(addr) => {
                Some(tokio::net::TcpListener::bind(addr).await.with_context(|| {
                    format!(
                        "cannot listen on {addr} (--metrics-addr / KUBETUN_METRICS_ADDR; 0 disables it)"
                    )
                })?)
            }
        };
        let dns = match args.dns_addr {
            ListenAddr::Disabled => None,
            ListenAddr::Listen(addr) => {
                Some(services::dns_server::bind(addr).await.with_context(|| {
                    format!(
                        "cannot serve DNS on {addr} (--dns-addr / KUBETUN_DNS_ADDR; 0 disables it)"
                    )
                })?)
            }
        };
        Ok(Self { metrics, dns })
    }
}

/// The metrics `/metrics` serves: registered at start, the reconcilers' once they run.
struct Metrics {
    registry: Arc<RwLock<Registry>>,
    ha: HaMetrics,
    dns: services::dns_server::DnsMetrics,
    services: services::metrics::ServiceMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Self {
            registry: Arc::default(),
            ha: HaMetrics::default(),
            dns: services::dns_server::DnsMetrics::default(),
            services: services::metrics::ServiceMetrics::default(),
        };
        {
            let mut registry = metrics.registry();
            metrics.ha.register(&mut registry);
            metrics.dns.register(&mut registry);
            metrics.services.register(&mut registry);
        }
        metrics
    }
}

impl Metrics {
    fn registry(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.registry
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn register_controller(&self, ctx: &Context) {
        let mut registry = self.registry();
        ctx.metrics.register(&mut registry);
        ctx.health.register(&mut registry);
    }
}

/// Loads (or creates) the gateway keys, publishes this cluster's info with its public key,
/// and returns what the reconcilers are configured with.
async fn publish_cluster(
    client: &kube::Client,
    args: &Args,
    mut info: ClusterInfo,
    mut settings: GatewaySettings,
) -> anyhow::Result<ControllerConfig> {
    let keys = GatewayKeys::load_or_create(client.clone(), &args.namespace).await?;
    info.public_key = keys.current.public_base64().to_owned();
    info.publish(client, &args.namespace)
        .await
        .context("cannot publish the cluster info")?;
    tracing::info!(cluster = %info.cluster.id, public_key = info.public_key, "cluster info published");
    settings.set_keys(&keys.current, keys.previous.as_ref());
    let pools = flatten(&args.pools);
    Ok(ControllerConfig {
        namespace: args.namespace.clone(),
        cluster: info,
        ipam: IpamConfig {
            pools: if pools.is_empty() {
                rfc1918_pools()
            } else {
                pools
            },
            reserved: flatten(&args.reserved),
        },
        gateway: settings,
    })
}

/// On the hub (`--hub`) the ShortcutConnection operator. Elsewhere ShortcutConnections are
/// marked as such (NotHub), so none sits unexplained; a leaf without that CRD runs on without
/// it.
async fn shortcut_operator(
    client: &kube::Client,
    args: &Args,
    ctx: &Context,
) -> Result<(), shortcut::ShortcutError> {
    if args.hub {
        tracing::info!("hub: running the ShortcutConnection operator");
        return shortcut::run(
            client.clone(),
            Some(args.namespace.clone()),
            args.cluster_id.clone(),
            ctx.health.clone(),
        )
        .await;
    }
    let explained = shortcut::run_not_hub(
        client.clone(),
        args.namespace.clone(),
        args.cluster_id.clone(),
        ctx.health.clone(),
    )
    .await;
    if let Err(error) = explained {
        tracing::warn!(
            "ShortcutConnections are not watched: {}",
            kubetun_controller::connector::error_chain(&error)
        );
        std::future::pending::<()>().await;
    }
    Ok(())
}

/// The CIDRs of a flag given several times (each a comma-separated list; empty means none,
/// so a ConfigMap can list a setting without a value).
fn flatten(lists: &[Cidrs]) -> Vec<IpNet> {
    lists.iter().flat_map(|l| l.0.iter().copied()).collect()
}

/// Where a server listens: kubebuilder's `--metrics-bind-address` convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListenAddr {
    /// `0`: not served.
    Disabled,
    /// An address to listen on.
    Listen(SocketAddr),
}

/// `0` (off), `:PORT` (every address) or `HOST:PORT`.
fn parse_listen_addr(text: &str) -> Result<ListenAddr, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(ListenAddr::Disabled);
    }
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_owned(),
    };
    full.parse().map(ListenAddr::Listen).map_err(|_| {
        format!("{text:?} is not a listen address (0 disables; examples: :9587, 127.0.0.1:9587)")
    })
}

/// `/metrics` (OpenMetrics text), `/healthz` (the process runs) and `/readyz` (the gateway,
/// if any, answered the last sync).
async fn serve_http(
    listener: tokio::net::TcpListener,
    registry: Arc<RwLock<Registry>>,
    ctx: Arc<OnceLock<Arc<Context>>>,
) -> std::io::Result<()> {
    use axum::http::{StatusCode, header};
    use axum::routing::get;

    let metrics = move || {
        let registry = registry.clone();
        async move {
            let mut body = String::new();
            let encoded = {
                let registry = registry.read().unwrap_or_else(PoisonError::into_inner);
                prometheus_client::encoding::text::encode(&mut body, &registry)
            };
            match encoded {
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
                // A standby replica (no context yet) is ready: it runs as it should.
                let ready = ctx
                    .get()
                    .is_none_or(|ctx| ctx.gateway.is_none() || ctx.gateway_status().is_some());
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "gateway unreachable")
                    }
                }
            }),
        );
    axum::serve(listener, app).await
}
