//! The lab's state file (`<state dir>/state.json`): every name and PID the lab created, written
//! before anything is created and updated as the lab comes up, so `down` can remove everything
//! even after a crash.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;
use kubetun_agent::plan::AgentSettings;
use kubetun_crds::TunnelEndpointSpec;
use serde::{Deserialize, Serialize};

use crate::table::ClusterTable;
use crate::topology::NodeHop;

/// File name of the state inside the state directory.
pub const STATE_FILE: &str = "state.json";

/// Why the state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading, writing or renaming failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// The file is not a lab state.
    #[error("{path} is not a lab state file: {error}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What did not parse.
        error: serde_json::Error,
    },
}

/// A pod or external endpoint: its namespace and address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    pub namespace: String,
    /// Its address (in the cluster's pod or external CIDR).
    pub address: Ipv4Addr,
}

/// One node of a multi-node cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    /// Node name (`node1`, …), as the route agent knows it.
    pub name: String,
    /// The node's namespace (its host network).
    pub namespace: String,
    /// The node's underlay (InternalIP) address on the cluster L2.
    pub address: Ipv4Addr,
    /// The node's slice of the pod CIDR.
    pub pod_cidr: Ipv4Net,
    /// The pods behind the node.
    pub pods: Vec<Member>,
}

/// What the lab keeps about one cluster's control plane (in the state file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneState {
    /// The API server's directory (data, certificates, logs, admin kubeconfig).
    pub dir: PathBuf,
    /// The admin's kubeconfig, what `kubectl` and the CLI use.
    pub kubeconfig: PathBuf,
    /// The controller's kubeconfig (its ServiceAccount's token).
    pub controller_kubeconfig: PathBuf,
    /// The controller's log.
    pub controller_log: PathBuf,
    /// The controller's PID once started.
    #[serde(default)]
    pub controller_pid: Option<u32>,
    /// The controller's arguments, so a test can restart it the same way: the installed
    /// ConfigMap's settings as flags and the lab's own (`install::controller_args`).
    pub controller_args: Vec<String>,
    /// Where the controller serves `clusterset.local` DNS (the cluster the lab's Service is
    /// fetched from; the others serve none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_addr: Option<std::net::SocketAddrV4>,
    /// The PID of the cluster's `kubetun-lab kube-proxy`, once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_pid: Option<u32>,
}

/// One cluster of the lab.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterState {
    /// Display name.
    pub name: String,
    /// Cluster ID (lowercase name).
    pub id: String,
    /// The gateway namespace (of a multi-node cluster: the namespace of the gateway's node).
    pub namespace: String,
    /// The gateway's TUN device.
    pub interface: String,
    /// The gateway's gRPC control socket.
    pub grpc_socket: PathBuf,
    /// The gateway's WireGuard UAPI socket.
    pub uapi_socket: PathBuf,
    /// The gateway's log file.
    pub log: PathBuf,
    /// The gateway's PID once started.
    #[serde(default)]
    pub pid: Option<u32>,
    /// The gateway's WireGuard public key (base64).
    #[serde(default)]
    pub public_key: String,
    /// The gateway's address on the underlay.
    pub underlay_address: Ipv4Addr,
    /// The gateway's UDP port.
    pub listen_port: u16,
    /// The cluster's pod CIDR.
    pub pod_cidr: Ipv4Net,
    /// The cluster's external CIDR.
    #[serde(default)]
    pub external_cidr: Option<Ipv4Net>,
    /// The pods (of a multi-node cluster: every node's, in node order).
    pub pods: Vec<Member>,
    /// The external endpoints.
    pub externals: Vec<Member>,
    /// The TunnelEndpoints last applied to the gateway (computed by the controller's planner).
    #[serde(default)]
    pub tunnel_endpoints: Vec<TunnelEndpointSpec>,
    /// The version of the desired state last applied.
    #[serde(default)]
    pub applied_version: String,
    /// The nodes of a multi-node cluster; empty for a single gateway namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeState>,
    /// How the nodes reach the gateway's node (multi-node clusters).
    #[serde(default, skip_serializing_if = "NodeHop::is_direct")]
    pub node_hop: NodeHop,
    /// Index into `nodes` of the node running the gateway.
    #[serde(default)]
    pub gateway_node: usize,
    /// The tunnel MTU the gateway is configured with.
    #[serde(default)]
    pub mtu: u32,
    /// The 0600 file holding the gateway's private key, so that a gateway started on another
    /// node runs with the same key (what the cluster's Secret is to the controller).
    #[serde(default)]
    pub key_file: PathBuf,
    /// The real API server and controller of a lab started with `--apiserver`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<ControlPlaneState>,
}

impl ClusterState {
    /// Every remote CIDR as this cluster sees it (the views its route agent routes).
    pub fn remote_views(&self) -> Vec<String> {
        self.tunnel_endpoints
            .iter()
            .flat_map(|te| te.remote_pod_cidrs.iter().chain(&te.remote_external_cidrs))
            .map(|m| m.view.clone())
            .collect()
    }

    /// The route agent's next hop towards the gateway's node: its IP, or with the overlay its
    /// overlay address.
    pub fn gateway_next_hop(&self) -> Option<Ipv4Addr> {
        let address = self.nodes.get(self.gateway_node)?.address;
        match self.node_hop {
            NodeHop::Direct => Some(address),
            NodeHop::Overlay => AgentSettings::default().overlay.address_of(address),
        }
    }

    /// The route agent's next hop towards node `index` from the gateway's node.
    pub fn node_next_hop(&self, index: usize) -> Option<Ipv4Addr> {
        let address = self.nodes.get(index)?.address;
        match self.node_hop {
            NodeHop::Direct => Some(address),
            NodeHop::Overlay => AgentSettings::default().overlay.address_of(address),
        }
    }

    /// The host end of the veth that joins the host, where a lab controller runs, to the
    /// gateway's namespace: the TUN device's name with `kd-` for `kt-` (as unique).
    pub fn dns_link(&self) -> String {
        let stem = self.interface.strip_suffix(&format!("kt-{}", self.id));
        format!("{}kd-{}", stem.unwrap_or_default(), self.id)
    }

    /// True when the cluster has node namespaces and a route agent on each.
    pub fn is_multi_node(&self) -> bool {
        !self.nodes.is_empty()
    }

    /// Pods that are behind a node other than the gateway's, in node order.
    pub fn pods_off_gateway(&self) -> impl Iterator<Item = &Member> {
        self.nodes
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i != self.gateway_node)
            .flat_map(|(_, node)| &node.pods)
    }
}

/// Everything the lab created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabState {
    /// The naming prefix (empty for the user's lab).
    pub prefix: String,
    /// The topology's description.
    pub description: String,
    /// The namespaces, in creation order (deleted in reverse).
    pub namespaces: Vec<String>,
    /// The clusters, in topology order.
    pub clusters: Vec<ClusterState>,
    /// The remap table of every cluster, once applied.
    #[serde(default)]
    pub tables: Vec<ClusterTable>,
    /// The `kubetun-gateway` binary the lab runs (also for a moved gateway).
    #[serde(default)]
    pub gateway_binary: PathBuf,
}

impl LabState {
    /// The state file inside `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(STATE_FILE)
    }

    /// Loads the state from `dir`; `None` when there is none.
    pub fn load(dir: &Path) -> Result<Option<Self>, StateError> {
        let path = Self::path(dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(StateError::Io { path, error }),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|error| StateError::Json { path, error })
    }

    /// Writes the state to `dir` atomically (a temporary file renamed over the old one).
    pub fn save(&self, dir: &Path) -> Result<(), StateError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |error| StateError::Io { path, error }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = Self::path(dir);
        let tmp = dir.join(format!("{STATE_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self).map_err(|error| StateError::Json {
            path: path.clone(),
            error,
        })?;
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))
    }

    /// Removes the state file from `dir` (absent is fine).
    pub fn remove(dir: &Path) -> Result<(), StateError> {
        let path = Self::path(dir);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StateError::Io { path, error: e })
            }
            _ => Ok(()),
        }
    }

    /// The cluster with ID `id`.
    pub fn cluster_mut(&mut self, id: &str) -> Option<&mut ClusterState> {
        self.clusters.iter_mut().find(|c| c.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LabState {
        LabState {
            prefix: "t1".into(),
            description: "test".into(),
            namespaces: vec!["t1-kt-underlay".into(), "t1-rome-gw".into()],
            clusters: vec![ClusterState {
                name: "Rome".into(),
                id: "rome".into(),
                namespace: "t1-rome-gw".into(),
                interface: "t1-kt-rome".into(),
                grpc_socket: "/run/x/t1-kt-rome.grpc.sock".into(),
                uapi_socket: "/var/run/wireguard/t1-kt-rome.sock".into(),
                log: "/run/x/t1-kt-rome.log".into(),
                pid: Some(42),
                public_key: String::new(),
                underlay_address: Ipv4Addr::new(198, 18, 0, 2),
                listen_port: 51820,
                pod_cidr: "10.202.0.0/16".parse().unwrap(),
                external_cidr: Some("10.70.0.0/16".parse().unwrap()),
                pods: vec![Member {
                    namespace: "t1-rome-pod1".into(),
                    address: Ipv4Addr::new(10, 202, 0, 11),
                }],
                externals: vec![],
                tunnel_endpoints: vec![],
                applied_version: String::new(),
                nodes: vec![],
                node_hop: NodeHop::Direct,
                gateway_node: 0,
                mtu: 1420,
                key_file: "/run/x/t1-kt-rome.key".into(),
                control_plane: None,
            }],
            tables: vec![],
            gateway_binary: "kubetun-gateway".into(),
        }
    }

    #[test]
    fn state_round_trips_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(LabState::load(dir.path()).unwrap(), None);
        let state = sample();
        state.save(dir.path()).unwrap();
        assert_eq!(LabState::load(dir.path()).unwrap(), Some(state));
        LabState::remove(dir.path()).unwrap();
        LabState::remove(dir.path()).unwrap();
        assert_eq!(LabState::load(dir.path()).unwrap(), None);
    }

    #[test]
    fn a_foreign_file_is_a_readable_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(LabState::path(dir.path()), "{}").unwrap();
        let message = LabState::load(dir.path()).unwrap_err().to_string();
        assert!(message.contains("is not a lab state file"), "{message}");
    }
}
