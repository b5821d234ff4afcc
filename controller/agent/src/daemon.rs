//! The agent process (`kubetun-agent`): flags, the reconcile pass and its loop.
//!
//! A pass reads the cluster ([`source`](super::source)), plans ([`plan`](super::plan)) and
//! converges the kernel ([`crate::converge`]). Passes run on start (which repairs
//! whatever a previous run left behind), on every change of a TunnelEndpoint, Node or gateway
//! pod, and every resync period. A missing gateway leaves the routes in place.
//!
//! Stopping keeps the routes (an agent restart or upgrade does not interrupt traffic), unless
//! the agent's DaemonSet is gone or being deleted: then it is an uninstall and the agent
//! removes everything it installed. `--cleanup` does the same on demand.

use std::net::IpAddr;
use std::pin::pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use ipnet::Ipv4Net;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use kube::runtime::utils::PredicateConfig;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use kubetun_crds::TunnelEndpoint;
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;

use super::diff::Change;
use super::netlink::{Kernel, NetlinkError, Underlay};
use super::plan::{
    AgentSettings, Attachment, DesiredState, OverlaySettings, PlanInput, RoutePlanError, plan,
};
use super::source::{
    ClusterView, GatewayLocator, SourceError, lease_fingerprint, node_fingerprint, read_cluster,
};
use crate::apply::{cleanup, converge};
use kubetun_controller::plumbing::runtime::{ApiHealth, watch};

/// Label selector of the gateway pod unless configured otherwise.
pub const DEFAULT_GATEWAY_SELECTOR: &str =
    "app.kubernetes.io/name=kubetun,app.kubernetes.io/component=gateway";

/// How nodes reach the gateway node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachmentMode {
    /// Direct towards nodes in the local underlay subnet, VXLAN beyond it.
    Auto,
    /// Always `via <node IP>` (all nodes share an L2 segment).
    Direct,
    /// Always over the VXLAN overlay.
    Overlay,
}

/// Flags of `kubetun-agent`, each also settable by its `KUBETUN_*` variable.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "kubetun-agent",
    version,
    about = "kubetun route agent: routes every node's traffic for remote clusters through the gateway"
)]
pub struct AgentArgs {
    /// Kubeconfig to use (default: in-cluster config, else $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Context of the kubeconfig (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// This node's name (downward API `spec.nodeName`).
    #[arg(long, env = "KUBETUN_NODE_NAME")]
    pub node_name: String,
    /// This node's underlay IP (default: the Node's InternalIP).
    #[arg(long, env = "KUBETUN_NODE_IP")]
    pub node_ip: Option<IpAddr>,
    /// Namespace of the TunnelEndpoints and the gateway pod.
    #[arg(long, env = "KUBETUN_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Underlay IP of the gateway's node; default: the host of the gateway pod.
    #[arg(long, env = "KUBETUN_GATEWAY_NODE_IP")]
    pub gateway_node_ip: Option<IpAddr>,
    /// Label selector of the gateway pod.
    #[arg(long, env = "KUBETUN_GATEWAY_SELECTOR", default_value = DEFAULT_GATEWAY_SELECTOR)]
    pub gateway_selector: String,
    /// Replicated gateways: follow the active replica's node, which this Lease names
    /// (the controllers' `--lease-name`), instead of the gateway pod.
    #[arg(
        long,
        env = "KUBETUN_GATEWAY_LEASE",
        conflicts_with = "gateway_node_ip"
    )]
    pub gateway_lease: Option<String>,
    /// How nodes reach the gateway node.
    #[arg(long, env = "KUBETUN_ATTACHMENT", value_enum, default_value_t = AttachmentMode::Auto)]
    pub attachment: AttachmentMode,
    /// Routing table of the agent's routes.
    #[arg(long, env = "KUBETUN_ROUTE_TABLE", default_value_t = AgentSettings::default().table)]
    pub table: u32,
    /// Priority of the agent's policy rules.
    #[arg(long, env = "KUBETUN_RULE_PRIORITY", default_value_t = AgentSettings::default().rule_priority)]
    pub rule_priority: u32,
    /// Protocol number tagging the agent's routes and rules.
    #[arg(long, env = "KUBETUN_ROUTE_PROTOCOL", default_value_t = AgentSettings::default().protocol)]
    pub protocol: u8,
    /// Name of the VXLAN device.
    #[arg(long, env = "KUBETUN_VXLAN_NAME", default_value_t = OverlaySettings::default().link_name)]
    pub vxlan_name: String,
    /// VXLAN network identifier.
    #[arg(long, env = "KUBETUN_VXLAN_VNI", default_value_t = OverlaySettings::default().vni)]
    pub vxlan_vni: u32,
    /// VXLAN UDP port.
    #[arg(long, env = "KUBETUN_VXLAN_PORT", default_value_t = OverlaySettings::default().port)]
    pub vxlan_port: u16,
    /// Overlay network; a node's overlay address keeps the host bits of its underlay IP.
    #[arg(long, env = "KUBETUN_OVERLAY_CIDR", default_value_t = OverlaySettings::default().network)]
    pub overlay_cidr: Ipv4Net,
    /// Seconds between passes when nothing changes.
    #[arg(long, env = "KUBETUN_RESYNC_SECONDS", default_value_t = 30)]
    pub resync_seconds: u64,
    /// The agent's DaemonSet: when it is gone or being deleted at shutdown, clean up.
    #[arg(long, env = "KUBETUN_AGENT_DAEMONSET")]
    pub daemonset: Option<String>,
    /// Remove everything the agent installed on this node, then exit.
    #[arg(long)]
    pub cleanup: bool,
    /// Run one pass, then exit.
    #[arg(long)]
    pub once: bool,
}

impl AgentArgs {
    /// The tags and overlay parameters.
    pub fn settings(&self) -> AgentSettings {
        AgentSettings {
            table: self.table,
            rule_priority: self.rule_priority,
            protocol: self.protocol,
            overlay: OverlaySettings {
                link_name: self.vxlan_name.clone(),
                vni: self.vxlan_vni,
                port: self.vxlan_port,
                network: self.overlay_cidr,
            },
        }
    }

    /// Where the gateway's node is looked up.
    pub fn locator(&self) -> GatewayLocator {
        if let Some(name) = &self.gateway_lease {
            return GatewayLocator::Lease { name: name.clone() };
        }
        self.gateway_node_ip.map_or_else(
            || GatewayLocator::Pod {
                selector: self.gateway_selector.clone(),
            },
            GatewayLocator::Fixed,
        )
    }
}

/// What the agent needs to plan one node, independent of flags.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Namespace of the TunnelEndpoints and the gateway pod.
    pub namespace: String,
    /// This node's name.
    pub node_name: String,
    /// This node's underlay IP, when not taken from its Node.
    pub node_ip: Option<IpAddr>,
    /// Where the gateway runs.
    pub locator: GatewayLocator,
    /// How nodes reach the gateway node.
    pub attachment: AttachmentMode,
    /// Tags and overlay parameters.
    pub settings: AgentSettings,
}

impl From<&AgentArgs> for AgentConfig {
    fn from(args: &AgentArgs) -> Self {
        Self {
            namespace: args.namespace.clone(),
            node_name: args.node_name.clone(),
            node_ip: args.node_ip,
            locator: args.locator(),
            attachment: args.attachment,
            settings: args.settings(),
        }
    }
}

/// Anything the agent can fail with.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Reading the cluster failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// No client could be built from the kubeconfig or the in-cluster configuration.
    #[error(transparent)]
    Client(#[from] kubetun_controller::plumbing::kubeconfig::KubeconfigError),
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The kernel refused a read or a change.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// No plan can be made for this node.
    #[error(transparent)]
    Plan(#[from] RoutePlanError),
    /// The configured node is not among the Nodes and has no configured IP.
    #[error("node {0} is not in the cluster and no --node-ip was given")]
    UnknownNode(String),
}

/// The node's desired state from the cluster as the API shows it now.
pub async fn desired_state(
    client: &Client,
    config: &AgentConfig,
    underlay: Underlay,
) -> Result<(DesiredState, ClusterView), AgentError> {
    let view = read_cluster(client, &config.namespace, &config.locator).await?;
    let desired = plan_view(config, &view, underlay)?;
    Ok((desired, view))
}

/// Plans this node from an already read cluster view.
pub fn plan_view(
    config: &AgentConfig,
    view: &ClusterView,
    underlay: Underlay,
) -> Result<DesiredState, AgentError> {
    let mut local = view
        .nodes
        .iter()
        .find(|node| node.name == config.node_name)
        .cloned()
        .or_else(|| {
            config.node_ip.map(|ip| super::plan::Node {
                name: config.node_name.clone(),
                ip,
                pod_cidrs: Vec::new(),
            })
        })
        .ok_or_else(|| AgentError::UnknownNode(config.node_name.clone()))?;
    if let Some(ip) = config.node_ip {
        local.ip = ip;
    }
    let attachment = match config.attachment {
        AttachmentMode::Auto => Attachment::Auto(underlay.network),
        AttachmentMode::Direct => Attachment::Direct,
        AttachmentMode::Overlay => Attachment::Overlay,
    };
    Ok(plan(&PlanInput {
        settings: &config.settings,
        attachment,
        local: &local,
        underlay_mtu: underlay.mtu,
        gateway_ip: view.gateway_ip,
        gateway_pod_ip: view.gateway_pod_ip,
        nodes: &view.nodes,
        endpoints: &view.endpoints,
    })?)
}

/// Runs the agent until it is stopped (or for one pass with `--once`, or `--cleanup`).
pub async fn run(args: AgentArgs) -> Result<(), AgentError> {
    let config = AgentConfig::from(&args);
    let kernel = Kernel::connect(config.settings.clone())?;
    if args.cleanup {
        let removed = cleanup(&kernel).await?;
        tracing::info!(
            changes = removed.len(),
            "removed everything the agent installed"
        );
        return Ok(());
    }
    let client = kubetun_controller::plumbing::kubeconfig::KubeconfigSource {
        path: args.kubeconfig.clone(),
        context: args.context.clone(),
    }
    .client_or_in_cluster("local")
    .await?;
    let node_ip = match config.node_ip {
        Some(ip) => ip,
        None => {
            let node = Api::<KubeNode>::all(client.clone())
                .get(&config.node_name)
                .await?;
            super::source::node_facts(&node)?.ip
        }
    };
    let underlay = kernel.underlay(node_ip).await?;
    tracing::info!(node = config.node_name, %node_ip, underlay = %underlay.network, mtu = underlay.mtu, "route agent starting");

    if args.once {
        return pass(&client, &kernel, &config, underlay).await.map(drop);
    }
    let health = kubetun_controller::plumbing::runtime::ApiHealth::new(client.clone());
    let mut triggers = pin!(changes(&client, &config, &health));
    let resync = Duration::from_secs(args.resync_seconds.max(1));
    let mut shutdown = pin!(shutdown_signal());
    loop {
        if let Err(error) = pass(&client, &kernel, &config, underlay).await {
            tracing::warn!(%error, "pass failed; routes left as they are");
        }
        tokio::select! {
            () = &mut shutdown => break,
            trigger = triggers.next() => {
                // Let a burst of changes (a gateway rollout) settle into one pass; a failover
                // is one change, and every millisecond of it is traffic lost.
                if trigger != Some(Trigger::Failover) {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
            () = tokio::time::sleep(resync) => {}
        }
    }
    if let Some(daemonset) = &args.daemonset
        && uninstalling(&client, &config.namespace, daemonset).await
    {
        let removed = cleanup(&kernel).await?;
        tracing::info!(changes = removed.len(), "agent uninstalled: routes removed");
    } else {
        tracing::info!("agent stopping; routes stay in place");
    }
    Ok(())
}

async fn pass(
    client: &Client,
    kernel: &Kernel,
    config: &AgentConfig,
    underlay: Underlay,
) -> Result<Vec<Change>, AgentError> {
    let (desired, view) = desired_state(client, config, underlay).await?;
    for skipped in &desired.skipped {
        tracing::warn!(cidr = skipped.cidr, reason = skipped.reason, "not routed");
    }
    for node in &view.unaddressed {
        tracing::warn!(node, "node has no InternalIP; no return route to it");
    }
    let changes = converge(kernel, &desired).await?;
    if !changes.is_empty() {
        tracing::info!(
            gateway = %view.gateway_ip,
            routes = desired.routes.len(),
            rules = desired.rules.len(),
            ?changes,
            "kernel state updated"
        );
    }
    Ok(changes)
}

/// What woke the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// A TunnelEndpoint, Node or gateway pod changed.
    Change,
    /// The gateway Lease names another holder or node.
    Failover,
}

/// One item per change of anything the plan reads. The watches retry on their own within
/// a second (not kube's default of up to 30 s after an API-server outage): a failover the
/// agent notices late is traffic lost.
fn changes(
    client: &Client,
    config: &AgentConfig,
    health: &ApiHealth,
) -> impl Stream<Item = Trigger> + use<> {
    let endpoints = Api::<TunnelEndpoint>::namespaced(client.clone(), &config.namespace);
    let nodes = Api::<KubeNode>::all(client.clone());
    let pods = Api::<Pod>::namespaced(client.clone(), &config.namespace);
    let pod_selector = match &config.locator {
        GatewayLocator::Pod { selector } => selector.clone(),
        GatewayLocator::Fixed(_) | GatewayLocator::Lease { .. } => {
            DEFAULT_GATEWAY_SELECTOR.to_owned()
        }
    };
    let mut streams = vec![
        watch(
            endpoints,
            watcher::Config::default(),
            health,
            "TunnelEndpoint",
        )
        .touched_objects()
        .map(|_| Trigger::Change)
        .boxed(),
        // Node heartbeats are frequent and irrelevant: only address or pod CIDR changes count
        // (a deleted node is noticed at the next resync).
        watch(nodes, watcher::Config::default(), health, "Node")
            .touched_objects()
            .predicate_filter(node_fingerprint, PredicateConfig::default())
            .map(|_| Trigger::Change)
            .boxed(),
        watch(
            pods,
            watcher::Config::default().labels(&pod_selector),
            health,
            "Pod",
        )
        .touched_objects()
        .map(|_| Trigger::Change)
        .boxed(),
    ];
    if let GatewayLocator::Lease { name } = &config.locator {
        let leases = Api::<Lease>::namespaced(client.clone(), &config.namespace);
        streams.push(
            watch(
                leases,
                watcher::Config::default().fields(&format!("metadata.name={name}")),
                health,
                "Lease",
            )
            .touched_objects()
            .predicate_filter(lease_fingerprint, PredicateConfig::default())
            .map(|_| Trigger::Failover)
            .boxed(),
        );
    }
    futures::stream::select_all(streams)
}

/// True when the agent's DaemonSet is gone or being deleted (an uninstall, not a restart).
/// An API error answers false: keeping routes is the safe side.
pub async fn uninstalling(client: &Client, namespace: &str, daemonset: &str) -> bool {
    match Api::<DaemonSet>::namespaced(client.clone(), namespace)
        .get_opt(daemonset)
        .await
    {
        Ok(None) => true,
        Ok(Some(ds)) => ds.metadata.deletion_timestamp.is_some(),
        Err(error) => {
            tracing::warn!(%error, "cannot tell whether the agent is being uninstalled; keeping routes");
            false
        }
    }
}

async fn shutdown_signal() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
