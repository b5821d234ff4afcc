//! `kubetun-controller`: publishes this cluster's info, reconciles NetworkConfigs and
//! TunnelEndpoints, keeps the local gateway on the desired state, and runs the Network
//! controllers. Configured by flags or the matching `KUBETUN_*` environment variables.
//! Only the hub (`--hub`) runs the ShortcutConnection operator.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use ipnet::IpNet;
use kubetun_controller::ipam::{IpamConfig, rfc1918_pools};
use kubetun_controller::operator::ha::Timing;
use kubetun_controller::operator::isolation::NetworkOptions;
use kubetun_controller::operator::process::listeners::{ListenAddr, parse_listen_addr};
use kubetun_controller::operator::process::{self, Options, Replica};
use kubetun_controller::planner::{self, GatewaySettings};
use kubetun_controller::plumbing::cluster_info::{Cidrs, ClusterInfo, parse_cidrs};
use kubetun_controller::plumbing::gateway_client::{
    DEFAULT_INTERFACE, GatewayClient, grpc_socket_path,
};
use kubetun_controller::plumbing::kubeconfig::KubeconfigSource;
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;
use kubetun_crds::contract::lease::DEFAULT_LEASE_NAME;
use kubetun_crds::{ClusterRef, Endpoint, Isolation};

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
    /// How the gateway admits a linked cluster whose link sets no isolation of its own:
    /// `open` (every pod and external address, as before isolation existed) or `exported`
    /// (only the endpoints of the Services exported to it, and replies).
    #[arg(long, env = "KUBETUN_ISOLATION", default_value_t = Isolation::Open, value_parser = parse_isolation)]
    isolation: Isolation,
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
    let client = KubeconfigSource {
        path: args.kubeconfig.clone(),
        context: args.context.clone(),
    }
    .client_or_in_cluster("local")
    .await?;
    let options = options(&args)?;
    process::run(client, options).await?;
    Ok(())
}

/// What the flags configure.
fn options(args: &Args) -> anyhow::Result<Options> {
    let socket = args
        .gateway_socket
        .clone()
        .unwrap_or_else(|| grpc_socket_path(&args.gateway_interface));
    let info = cluster_info(args);
    let settings = gateway_settings(args, &info);
    let pools = flatten(&args.pools);
    let replica = match &args.replicas.replica {
        Some(name) => Some(Replica {
            name: name.clone(),
            lease_name: args.replicas.lease_name.clone(),
            node_ip: args.replicas.node_ip,
            timing: args.replicas.timing()?,
        }),
        None => None,
    };
    Ok(Options {
        namespace: args.namespace.clone(),
        cluster_id: args.cluster_id.clone(),
        hub: args.hub,
        gateway: (!args.no_gateway).then(|| GatewayClient::new(&socket)),
        metrics_addr: args.metrics_addr,
        dns_addr: args.dns_addr,
        info,
        settings,
        ipam: IpamConfig {
            pools: if pools.is_empty() {
                rfc1918_pools()
            } else {
                pools
            },
            reserved: flatten(&args.reserved),
        },
        networks: NetworkOptions {
            min_vni: args.min_vni,
            max_vni: args.max_vni,
            ..NetworkOptions::default()
        },
        replica,
    })
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
        isolation: args.isolation,
        ..GatewaySettings::default()
    }
}

/// `open` or `exported` (an empty value, as a ConfigMap may list it: `open`).
fn parse_isolation(text: &str) -> Result<Isolation, String> {
    match text.trim() {
        "" => Ok(Isolation::Open),
        text => text.parse(),
    }
}

/// The CIDRs of a flag given several times (each a comma-separated list; empty means none,
/// so a ConfigMap can list a setting without a value).
fn flatten(lists: &[Cidrs]) -> Vec<IpNet> {
    lists.iter().flat_map(|l| l.0.iter().copied()).collect()
}
