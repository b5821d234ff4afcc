//! What `kubetun-lab status` reports: the lab's state joined with each gateway's own status.

use std::path::Path;

use kubetun_controller::gateway_api::ConnectionState;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use serde::Serialize;

use crate::error::LabError;
use crate::state::{ClusterState, LabState, Member, NodeState};
use crate::table::PeerMapping;
use crate::{checks, fabric};

/// The lab as [`status`] reports it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LabStatus {
    /// The topology's description.
    pub description: String,
    /// The naming prefix.
    pub prefix: String,
    /// One entry per cluster.
    pub clusters: Vec<ClusterStatus>,
}

/// One cluster in [`LabStatus`].
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// Display name.
    pub name: String,
    /// The gateway namespace.
    pub namespace: String,
    /// The gateway's TUN device.
    pub interface: String,
    /// The gateway's PID.
    pub pid: Option<u32>,
    /// Whether that PID still runs the gateway.
    pub running: bool,
    /// The gateway's public key.
    pub public_key: String,
    /// The gateway's underlay endpoint.
    pub endpoint: String,
    /// The node the gateway runs on (multi-node clusters).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_node: Option<String>,
    /// The nodes of a multi-node cluster.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeState>,
    pub pod_cidr: String,
    pub external_cidr: Option<String>,
    /// The pods and their addresses.
    pub pods: Vec<Member>,
    /// The external endpoints and their addresses.
    pub externals: Vec<Member>,
    /// The version of the state the gateway runs (from Status).
    pub gateway_version: Option<String>,
    /// Why the gateway could not be queried.
    pub error: Option<String>,
    /// One entry per peer.
    pub peers: Vec<PeerStatus>,
}

/// One peer of a cluster in [`LabStatus`].
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerStatus {
    /// The peer's real CIDRs and the CIDRs this cluster uses for them.
    #[serde(flatten)]
    pub mapping: PeerMapping,
    /// The peer's gateway endpoint.
    pub endpoint: String,
    /// The peer's pods and external endpoints at the addresses this cluster reaches them.
    pub reachable_at: Vec<Member>,
    /// Connected, Connecting, Error or Unknown (gateway Status).
    pub state: String,
    /// The gateway's explanation of the state.
    pub message: String,
    /// Unix time of the last handshake in milliseconds (0: never).
    pub last_handshake_unix_ms: i64,
    /// Bytes received from the peer.
    pub rx_bytes: u64,
    /// Bytes sent to the peer.
    pub tx_bytes: u64,
}

/// Reads the lab's state and asks every gateway for its status.
pub fn status(state_dir: &Path) -> Result<LabStatus, LabError> {
    let state = LabState::load(state_dir)?.ok_or_else(|| LabError::NotUp(state_dir.to_owned()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LabError::Runtime)?;
    let clusters = state
        .clusters
        .iter()
        .map(|cluster| cluster_status(&runtime, &state, cluster))
        .collect();
    Ok(LabStatus {
        description: state.description.clone(),
        prefix: state.prefix.clone(),
        clusters,
    })
}

fn cluster_status(
    runtime: &tokio::runtime::Runtime,
    state: &LabState,
    cluster: &ClusterState,
) -> ClusterStatus {
    let running = cluster.pid.is_some_and(fabric::runs_gateway);
    let gateway = if running {
        let client = {
            let _guard = runtime.enter();
            GatewayClient::new(&cluster.grpc_socket)
        };
        runtime.block_on(client.status()).map_err(|e| e.to_string())
    } else {
        Err("the gateway is not running".to_owned())
    };
    let peers = cluster
        .tunnel_endpoints
        .iter()
        .map(|te| {
            let peer_status = gateway
                .as_ref()
                .ok()
                .and_then(|s| s.peers.iter().find(|p| p.name == te.tunnel_peer()));
            let remote = state.clusters.iter().find(|c| c.id == te.cluster.id);
            let reachable_at = remote
                .map(|remote| {
                    remote
                        .pods
                        .iter()
                        .chain(&remote.externals)
                        .filter_map(|m| {
                            checks::reach_address(cluster, remote, m.address).map(|address| {
                                Member {
                                    namespace: m.namespace.clone(),
                                    address,
                                }
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            PeerStatus {
                mapping: PeerMapping {
                    peer: remote.map_or_else(|| te.cluster.id.clone(), |r| r.name.clone()),
                    pod_cidrs: te.remote_pod_cidrs.clone(),
                    external_cidrs: te.remote_external_cidrs.clone(),
                },
                endpoint: te.endpoint.to_string(),
                reachable_at,
                state: peer_status.map_or_else(|| "Unknown".to_owned(), |p| state_name(p.state())),
                message: peer_status.map(|p| p.message.clone()).unwrap_or_default(),
                last_handshake_unix_ms: peer_status.map_or(0, |p| p.last_handshake_unix_ms),
                rx_bytes: peer_status.map_or(0, |p| p.rx_bytes),
                tx_bytes: peer_status.map_or(0, |p| p.tx_bytes),
            }
        })
        .collect();
    ClusterStatus {
        name: cluster.name.clone(),
        namespace: cluster.namespace.clone(),
        interface: cluster.interface.clone(),
        pid: cluster.pid,
        running,
        public_key: cluster.public_key.clone(),
        endpoint: format!("{}:{}", cluster.underlay_address, cluster.listen_port),
        gateway_node: cluster
            .nodes
            .get(cluster.gateway_node)
            .map(|n| n.name.clone()),
        nodes: cluster.nodes.clone(),
        pod_cidr: cluster.pod_cidr.to_string(),
        external_cidr: cluster.external_cidr.map(|c| c.to_string()),
        pods: cluster.pods.clone(),
        externals: cluster.externals.clone(),
        gateway_version: gateway.as_ref().ok().map(|s| s.version.clone()),
        error: gateway.err(),
        peers,
    }
}

fn state_name(state: ConnectionState) -> String {
    match state {
        ConnectionState::Connected => "Connected",
        ConnectionState::Connecting => "Connecting",
        ConnectionState::Error => "Error",
        ConnectionState::Unspecified => "Unknown",
    }
    .to_owned()
}

/// The status as text: per cluster its gateway and addresses, per peer the remap table lines
/// and the link state.
pub fn render_status(status: &LabStatus) -> String {
    use std::fmt::Write as _;
    let mut text = String::new();
    let _ = writeln!(text, "kubetun lab: {}", status.description);
    for cluster in &status.clusters {
        let _ = writeln!(
            text,
            "\nCLUSTER {} — gateway {} in {}{} (pid {}, {}), endpoint {}",
            cluster.name.to_uppercase(),
            cluster.interface,
            cluster.namespace,
            cluster
                .gateway_node
                .as_ref()
                .map_or_else(String::new, |n| format!(" (on {n})")),
            cluster
                .pid
                .map_or_else(|| "-".to_owned(), |p| p.to_string()),
            if cluster.running {
                "running"
            } else {
                "NOT running"
            },
            cluster.endpoint
        );
        let members: Vec<String> = cluster
            .pods
            .iter()
            .chain(&cluster.externals)
            .map(|m| format!("{} {}", m.namespace, m.address))
            .collect();
        if !cluster.nodes.is_empty() {
            let nodes: Vec<String> = cluster
                .nodes
                .iter()
                .map(|n| format!("{} {} pods {}", n.name, n.address, n.pod_cidr))
                .collect();
            let _ = writeln!(text, "  nodes: {}", nodes.join(", "));
        }
        let _ = writeln!(text, "  members: {}", members.join(", "));
        if let Some(error) = &cluster.error {
            let _ = writeln!(text, "  gateway status unavailable: {error}");
        }
        for peer in &cluster.peers {
            let _ = writeln!(
                text,
                "  {} -> {}: {}{} (rx {} B, tx {} B)",
                cluster.name,
                peer.mapping.peer,
                peer.state,
                if peer.message.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", peer.message)
                },
                peer.rx_bytes,
                peer.tx_bytes
            );
            for (label, mappings) in [
                ("Pod CIDR", &peer.mapping.pod_cidrs),
                ("External CIDR", &peer.mapping.external_cidrs),
            ] {
                for m in mappings {
                    let _ = writeln!(text, "    {label}: {} → Remapped to {}", m.real, m.view);
                }
            }
            let reach: Vec<String> = peer
                .reachable_at
                .iter()
                .map(|m| format!("{} at {}", m.namespace, m.address))
                .collect();
            let _ = writeln!(text, "    reaches {}", reach.join(", "));
        }
    }
    text
}
