//! The lab: a topology's clusters as network namespaces, each with a real `kubetun-gateway`
//! configured over its gRPC socket with state computed by the controller's own IPAM and
//! planner, proven by ping and iperf3 across remapped addresses.
//!
//! - [`up`] builds the topology (cleaning a previous lab first), links the clusters (first
//!   `links`, then `shortcuts`, re-applying both ends), runs the checks and prints the remap
//!   table of every cluster. The lab stays up afterwards, also when a check failed, so it can
//!   be inspected; [`UpReport::passed`] says whether everything passed.
//! - [`status`] reports, per cluster and peer, the CIDRs and views, the addresses and the link
//!   state read from each gateway.
//! - [`move_gateway`] moves the gateway of a multi-node cluster to another node: the old
//!   process stops, the underlay endpoint moves along, a new process starts with the same key
//!   and is re-applied the same state over gRPC, the route agents re-converge, and the
//!   cluster's links are checked again.
//! - [`down`] removes everything recorded in the state file, also after a crash.
//!
//! In a multi-node cluster the route agent's logic (plan, then converge) runs in-process on
//! every node after every apply and move, fed the cluster's TunnelEndpoints: what the
//! `kubetun-controller agent` DaemonSet does on each watch event, without an API server.

pub mod apiserver;
pub mod checks;
pub mod fabric;
pub mod named;
pub mod naming;
pub mod plan;
pub mod state;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use std::net::IpAddr;

use ipnet::IpNet;
use kubetun_controller::agent::plan::{Attachment, Node};
use kubetun_controller::gateway_api::ConnectionState;
use kubetun_controller::gateway_client::{GatewayClient, GatewayClientError};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::planner::{PlanError, desired_state};
use serde::Serialize;

use crate::multinode::{self, MultiNodeError};
use crate::netns::{self, NetnsError};
use crate::table::{self, ClusterTable, PeerMapping};
use crate::topology::{GATEWAY_PORT, NodeHop, Topology};
use checks::Check;
use fabric::Fabric;
use naming::{Naming, PrefixError};
use plan::ControlPlanes;
use state::{ClusterState, LabState, Member, NodeState, StateError};

/// Where the user's lab keeps its state, sockets and logs.
pub const DEFAULT_STATE_DIR: &str = "/run/kubetun-lab";
/// How long every link may take to report Connected after the checks.
const CONNECTED_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the lab could not be built, inspected or removed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A precondition of the host is missing (root, /dev/net/tun, a tool).
    #[error("{0}")]
    Host(String),
    /// The naming prefix is invalid.
    #[error(transparent)]
    Prefix(#[from] PrefixError),
    /// A namespace, link or process operation failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The state file could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// A file could not be created.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// The controller's planner refused a NetworkConfig or TunnelEndpoint.
    #[error("{cluster}: {error}")]
    Plan {
        /// The cluster whose state was being computed.
        cluster: String,
        /// The planner's error.
        error: Box<PlanError>,
    },
    /// A gateway failed to start or rejected its state.
    #[error("gateway of {cluster}: {message}")]
    Gateway {
        /// The cluster.
        cluster: String,
        /// What happened.
        message: String,
    },
    /// The gRPC call to a gateway failed.
    #[error("gateway of {cluster}: {error}")]
    Rpc {
        /// The cluster.
        cluster: String,
        /// The client's error.
        error: Box<GatewayClientError>,
    },
    /// The async runtime for the gRPC clients could not start.
    #[error("cannot start the gRPC client runtime: {0}")]
    Runtime(std::io::Error),
    /// No lab is up (no state file).
    #[error("no lab is up (no state in {0})")]
    NotUp(PathBuf),
    /// The request does not fit the lab (unknown cluster or node, a single-node cluster).
    #[error("{0}")]
    Usage(String),
    /// The route agent failed on a node.
    #[error("route agent on {node}: {error}")]
    Agent {
        /// The node's namespace.
        node: String,
        /// What failed.
        error: Box<MultiNodeError>,
    },
    /// The gateway key file could not be read back.
    #[error("{path}: not a gateway key ({message})")]
    Key {
        /// The key file.
        path: PathBuf,
        /// Why it was refused.
        message: String,
    },
    /// A bug: the lab's own bookkeeping is inconsistent.
    #[error("internal error: {0}")]
    Internal(String),
}

/// How to build a lab.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// The topology.
    pub topology: Topology,
    /// Prefix of every name (empty for the user's lab; tests use their own).
    pub prefix: String,
    /// Directory of the state file, sockets and logs.
    pub state_dir: PathBuf,
    /// The `kubetun-gateway` binary.
    pub gateway_binary: PathBuf,
    /// Seconds of each iperf3 check; 0 skips them.
    pub iperf_seconds: u32,
    /// Run a real API server and `kubetun-controller` per cluster and link the clusters with
    /// the `kubetun` CLI, instead of computing the gateway states in-process.
    pub apiserver: bool,
}

/// What [`up`] found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpReport {
    /// Every check, in the order run.
    pub checks: Vec<Check>,
    /// The remap table of every cluster.
    pub tables: Vec<ClusterTable>,
}

impl UpReport {
    /// True when every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    /// The checks that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| !c.passed)
    }
}

/// Checks that the host can run a lab: root, /dev/net/tun, the tools used.
pub fn preflight(options: &LabOptions) -> Result<(), LabError> {
    if !netns::is_root() {
        return Err(LabError::Host(
            "the lab creates network namespaces and TUN devices: run it as root".to_owned(),
        ));
    }
    if !Path::new("/dev/net/tun").exists() {
        return Err(LabError::Host(
            "/dev/net/tun is missing: load the tun module (modprobe tun) or give the container \
             the device"
                .to_owned(),
        ));
    }
    let mut tools = vec!["ip", "ping", "sysctl", "timeout"];
    if options.iperf_seconds > 0 {
        tools.push("iperf3");
    }
    for tool in tools {
        if !netns::command_exists(tool) {
            return Err(LabError::Host(format!(
                "`{tool}` is not installed (needs iproute2, iputils-ping, procps, coreutils, iperf3)"
            )));
        }
    }
    if !options.gateway_binary.is_file() {
        return Err(LabError::Host(format!(
            "gateway binary {} not found: build it with `cargo build --release -p kubetun-gateway` \
             or pass --gateway",
            options.gateway_binary.display()
        )));
    }
    Ok(())
}

/// Builds the lab, links it, checks it and prints progress and the remap tables to `out`.
///
/// Any previous lab in the same state directory is removed first. If building fails,
/// everything created so far is removed again; once built, the lab stays up.
pub fn up(options: &LabOptions, out: &mut dyn Write) -> Result<UpReport, LabError> {
    preflight(options)?;
    let naming = Naming::new(&options.prefix)?;
    let topology = &options.topology;
    if LabState::load(&options.state_dir)?.is_some() {
        say(out, "removing the previous lab");
        down(&options.state_dir, out)?;
    }
    let mut state = planned_state(topology, &naming, &options.state_dir);
    // A lab whose state file was lost still holds these names.
    for name in state.namespaces.iter().rev() {
        netns::delete_netns(name);
    }
    state.save(&options.state_dir)?;
    let mut teardown = Teardown::armed(&options.state_dir);

    say(out, &format!("kubetun lab: {}", topology.description));
    state.gateway_binary = options.gateway_binary.clone();
    state.save(&options.state_dir)?;
    let fabric = Fabric::build(topology, &state, &naming)?;
    say(
        out,
        &format!("  {} namespaces created", state.namespaces.len()),
    );

    let mut planes = ControlPlanes::new(topology);
    for (index, cluster) in state.clusters.iter_mut().enumerate() {
        cluster.public_key = planes.public_key(index).to_owned();
        write_key(&cluster.key_file, planes.key(index))?;
    }
    for index in 0..state.clusters.len() {
        let pid = fabric::start_gateway(&state.clusters[index], &options.gateway_binary)?;
        state.clusters[index].pid = Some(pid);
        state.save(&options.state_dir)?;
        let cluster = &state.clusters[index];
        say(
            out,
            &format!(
                "  {} gateway {} (pid {pid}) in {}, gRPC {}",
                cluster.name,
                cluster.interface,
                cluster.namespace,
                cluster.grpc_socket.display()
            ),
        );
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LabError::Runtime)?;
    let clients: Vec<GatewayClient> = {
        let _guard = runtime.enter();
        state
            .clusters
            .iter()
            .map(|c| GatewayClient::new(&c.grpc_socket))
            .collect()
    };
    let mut lab = RunningLab {
        topology,
        options,
        fabric: &fabric,
        planes: &mut planes,
        state: &mut state,
        runtime: &runtime,
        clients: &clients,
        checks: Vec::new(),
    };

    if options.apiserver {
        lab.link_through_apiservers(out)?;
    } else {
        lab.link_in_process(out)?;
    }
    lab.check_connected(out);

    let tables: Vec<ClusterTable> = topology
        .clusters
        .iter()
        .zip(&lab.state.clusters)
        .map(|(spec, cluster)| plan::remap_table(topology, spec, &cluster.tunnel_endpoints))
        .collect();
    let checks = std::mem::take(&mut lab.checks);
    state.tables = tables.clone();
    state.save(&options.state_dir)?;
    fabric.keep();
    teardown.disarm();

    say(out, "");
    say(out, &table::render(&tables));
    for cluster in &state.clusters {
        if let Some(plane) = &cluster.control_plane {
            say(
                out,
                &format!(
                    "{}: kubectl --kubeconfig {} get networkconfigs,tunnelendpoints -n {}",
                    cluster.name,
                    plane.kubeconfig.display(),
                    apiserver::NAMESPACE
                ),
            );
        }
    }
    let report = UpReport { checks, tables };
    let failed = report.failures().count();
    if failed == 0 {
        say(
            out,
            &format!(
                "all {} checks passed; `kubetun-lab down` removes the lab",
                report.checks.len()
            ),
        );
    } else {
        say(
            out,
            &format!(
                "{failed} of {} checks FAILED; the lab stays up for inspection (`kubetun-lab down` removes it)",
                report.checks.len()
            ),
        );
    }
    Ok(report)
}

/// The lab while `up` links and checks it.
struct RunningLab<'a> {
    topology: &'a Topology,
    options: &'a LabOptions,
    fabric: &'a Fabric,
    planes: &'a mut ControlPlanes,
    state: &'a mut LabState,
    runtime: &'a tokio::runtime::Runtime,
    clients: &'a [GatewayClient],
    checks: Vec<Check>,
}

impl RunningLab<'_> {
    /// Links and shortcuts with the controller's IPAM and planner run in-process, every
    /// state applied over the gateways' gRPC sockets.
    fn link_in_process(&mut self, out: &mut dyn Write) -> Result<(), LabError> {
        let topology = self.topology;
        // Phase 1: the links (hub to leaves); every gateway gets its key and port even
        // without peers.
        for link in &topology.links {
            self.link(&link.0, &link.1, out)?;
        }
        for index in 0..topology.clusters.len() {
            self.apply(index, out)?;
        }
        self.check_links("links", &topology.links, out);

        // Phase 2: the shortcuts, re-applying both ends; every link is checked again.
        if !topology.shortcuts.is_empty() {
            let mut touched = Vec::new();
            for link in &topology.shortcuts {
                self.link(&link.0, &link.1, out)?;
                touched.extend([self.index(&link.0)?, self.index(&link.1)?]);
            }
            touched.sort_unstable();
            touched.dedup();
            for index in touched {
                self.apply(index, out)?;
            }
            let all: Vec<_> = topology.all_links().map(|(_, l)| l.clone()).collect();
            self.check_links("shortcuts", &all, out);
        }
        Ok(())
    }

    /// Links through real control planes: an API server and controller per cluster, the
    /// links made with `kubetun network connect`, the shortcuts by the hub's operator
    /// (`kubetun shortcut create`); the checks read the TunnelEndpoints the controllers wrote.
    fn link_through_apiservers(&mut self, out: &mut dyn Write) -> Result<(), LabError> {
        let topology = self.topology;
        let state_dir = self.options.state_dir.clone();
        let started = Instant::now();
        let hubs: Vec<String> = topology
            .shortcuts
            .iter()
            .filter_map(|l| topology.hub_of(&l.0, &l.1))
            .collect();
        let state = &mut *self.state;
        apiserver::start(
            self.runtime,
            &mut state.clusters,
            topology.underlay,
            &hubs,
            &state_dir,
            |_| Ok(()),
        )?;
        self.state.save(&state_dir)?;
        for cluster in &self.state.clusters {
            let plane = cluster.control_plane.as_ref().expect("started");
            say(
                out,
                &format!(
                    "  {} API server {} and controller (pid {}) as ServiceAccount {}/{}",
                    cluster.name,
                    plane.dir.display(),
                    plane.controller_pid.unwrap_or_default(),
                    apiserver::NAMESPACE,
                    apiserver::SERVICE_ACCOUNT
                ),
            );
        }
        say(
            out,
            &format!(
                "  control planes up in {:.1} s",
                started.elapsed().as_secs_f64()
            ),
        );
        for link in &topology.links {
            let (a, b) = (self.index(&link.0)?, self.index(&link.1)?);
            let started = Instant::now();
            apiserver::connect(&self.state.clusters[a], &self.state.clusters[b])?;
            say(
                out,
                &format!(
                    "  kubetun network connect {} <-> {}: connected in {:.1} s",
                    link.0,
                    link.1,
                    started.elapsed().as_secs_f64()
                ),
            );
        }
        self.refresh_tunnel_endpoints()?;
        self.check_links("links", &topology.links, out);
        if !topology.shortcuts.is_empty() {
            for link in &topology.shortcuts {
                let (a, b) = (self.index(&link.0)?, self.index(&link.1)?);
                let hub = topology.hub_of(&link.0, &link.1).ok_or_else(|| {
                    LabError::Usage(format!(
                        "shortcut {} <-> {}: no cluster is linked to both (the hub that owns it)",
                        link.0, link.1
                    ))
                })?;
                let hub = self.index(&hub)?;
                let started = Instant::now();
                let clusters = &self.state.clusters;
                apiserver::shortcut(&clusters[hub], &clusters[a], &clusters[b])?;
                say(
                    out,
                    &format!(
                        "  kubetun shortcut create on {}: {} <-> {} connected in {:.1} s",
                        clusters[hub].name,
                        link.0,
                        link.1,
                        started.elapsed().as_secs_f64()
                    ),
                );
            }
            self.refresh_tunnel_endpoints()?;
            let all: Vec<_> = topology.all_links().map(|(_, l)| l.clone()).collect();
            self.check_links("shortcuts", &all, out);
        }
        Ok(())
    }

    /// Reads every cluster's TunnelEndpoints (and its gateway key) back from its API server.
    fn refresh_tunnel_endpoints(&mut self) -> Result<(), LabError> {
        for cluster in &mut self.state.clusters {
            cluster.tunnel_endpoints = self
                .runtime
                .block_on(apiserver::tunnel_endpoints(cluster))?;
        }
        let keys: Vec<(usize, String)> = self
            .state
            .clusters
            .iter()
            .flat_map(|c| &c.tunnel_endpoints)
            .filter_map(|te| {
                let index = self.topology.cluster_index(&te.cluster.id)?;
                Some((index, te.public_key.clone()))
            })
            .collect();
        for (index, key) in keys {
            self.state.clusters[index].public_key = key;
        }
        Ok(self.state.save(&self.options.state_dir)?)
    }

    fn index(&self, name: &str) -> Result<usize, LabError> {
        self.topology
            .cluster_index(name)
            .ok_or_else(|| LabError::Internal(format!("unknown cluster {name}")))
    }

    fn link(&mut self, a: &str, b: &str, out: &mut dyn Write) -> Result<(), LabError> {
        let (ia, ib) = (self.index(a)?, self.index(b)?);
        self.planes.link(ia, ib).map_err(|error| LabError::Plan {
            cluster: format!("{a} <-> {b}"),
            error: Box::new(error),
        })?;
        say(
            out,
            &format!(
                "  linked {} <-> {}: NetworkConfigs exchanged, each processed by the other side's IPAM",
                self.state.clusters[ia].name, self.state.clusters[ib].name
            ),
        );
        Ok(())
    }

    /// Computes the cluster's TunnelEndpoints and gateway state with the planner and applies
    /// it over the gateway's gRPC socket.
    fn apply(&mut self, index: usize, out: &mut dyn Write) -> Result<(), LabError> {
        let name = self.state.clusters[index].name.clone();
        let endpoints = self
            .planes
            .tunnel_endpoints(index)
            .map_err(|error| LabError::Plan {
                cluster: name.clone(),
                error: Box::new(error),
            })?;
        let desired = self.planes.desired_state(index, &endpoints);
        let version = desired.version.clone();
        let peers = desired.peers.len();
        let response = self
            .runtime
            .block_on(self.clients[index].apply(desired))
            .map_err(|error| LabError::Rpc {
                cluster: name.clone(),
                error: Box::new(error),
            })?;
        let cluster = &mut self.state.clusters[index];
        cluster.tunnel_endpoints = endpoints;
        cluster.applied_version = version.clone();
        self.state.save(&self.options.state_dir)?;
        say(
            out,
            &format!(
                "  applied {name}: {peers} peer(s), version {version}, generation {}{}",
                response.generation,
                if response.changed { "" } else { " (unchanged)" }
            ),
        );
        let cluster = &self.state.clusters[index];
        if cluster.is_multi_node() {
            let changes = converge_agents(cluster)?;
            say(
                out,
                &format!(
                    "  route agent on {} nodes of {name}: {changes} change(s), gateway on {}, {} hop",
                    cluster.nodes.len(),
                    cluster.nodes[cluster.gateway_node].name,
                    match cluster.node_hop {
                        NodeHop::Direct => "direct",
                        NodeHop::Overlay => "VXLAN",
                    }
                ),
            );
        }
        Ok(())
    }

    fn check_links(
        &mut self,
        phase: &str,
        links: &[crate::topology::LinkSpec],
        out: &mut dyn Write,
    ) {
        say(out, &format!("  checks after {phase}:"));
        for link in links {
            let (Ok(a), Ok(b)) = (self.index(&link.0), self.index(&link.1)) else {
                continue;
            };
            let (ca, cb) = (&self.state.clusters[a], &self.state.clusters[b]);
            for check in link_checks(phase, ca, cb) {
                report_check(out, &check);
                self.checks.push(check);
            }
        }
        for cluster in self.state.clusters.iter().filter(|c| c.is_multi_node()) {
            let check = checks::agent_routes(phase, cluster);
            report_check(out, &check);
            self.checks.push(check);
        }
        // One bounded iperf3 run over the last link of the phase (leaf to hub, then over the
        // shortcut), between overlapping external CIDRs.
        if self.options.iperf_seconds > 0 {
            let last = match phase {
                "shortcuts" => self.topology.shortcuts.last(),
                _ => self.topology.links.last(),
            };
            if let Some(link) = last
                && let (Ok(a), Ok(b)) = (self.index(&link.0), self.index(&link.1))
            {
                let check = checks::iperf_external(
                    self.fabric,
                    phase,
                    &self.state.clusters[b],
                    &self.state.clusters[a],
                    self.options.iperf_seconds,
                    &self.options.state_dir,
                );
                report_check(out, &check);
                self.checks.push(check);
            }
        }
    }

    /// Every linked peer of every gateway must report Connected (bounded wait).
    fn check_connected(&mut self, out: &mut dyn Write) {
        let check = connected_check(
            "status",
            "every gateway reports every peer Connected".to_owned(),
            || self.not_connected(),
        );
        report_check(out, &check);
        self.checks.push(check);
    }

    fn not_connected(&self) -> Vec<String> {
        not_connected(self.runtime, self.state.clusters.iter().zip(self.clients))
    }
}

/// The links of `clusters` whose gateway does not report the peer Connected.
fn not_connected<'a>(
    runtime: &tokio::runtime::Runtime,
    clusters: impl Iterator<Item = (&'a ClusterState, &'a GatewayClient)>,
) -> Vec<String> {
    let mut pending = Vec::new();
    for (cluster, client) in clusters {
        match runtime.block_on(client.status()) {
            Ok(status) => {
                for te in &cluster.tunnel_endpoints {
                    let peer = status.peers.iter().find(|p| p.public_key == te.public_key);
                    if peer.is_none_or(|p| p.state() != ConnectionState::Connected) {
                        pending.push(format!("{} -> {}", cluster.name, te.cluster.name));
                    }
                }
            }
            Err(e) => pending.push(format!("{} ({e})", cluster.name)),
        }
    }
    pending
}

/// The checks of one link: first pods and external endpoints both ways, and with a
/// multi-node side pods behind non-gateway nodes both ways (ping and TCP).
fn link_checks(phase: &str, a: &ClusterState, b: &ClusterState) -> Vec<Check> {
    let mut checks = checks::ping_both_ways(phase, a, b);
    checks.extend(checks::ping_off_gateway(phase, a, b));
    checks.extend(checks::tcp_off_gateway(phase, a, b));
    checks
}

/// One route agent pass on every node of a multi-node cluster, with the gateway where the
/// state says; returns how many changes were applied in total.
pub fn converge_agents(cluster: &ClusterState) -> Result<usize, LabError> {
    let nodes: Vec<Node> = cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            // The external endpoints hang off the first node: declaring their CIDR among its
            // routed CIDRs gives them the same symmetric return path from the gateway's node
            // as pods (over the overlay too, where the main table's route would take the L2).
            let external = cluster.external_cidr.filter(|_| index == 0);
            agent_node(node, external)
        })
        .collect();
    let gateway = nodes
        .get(cluster.gateway_node)
        .ok_or_else(|| LabError::Internal(format!("{} has no gateway node", cluster.name)))?;
    let mut changes = 0;
    let attachment = match cluster.node_hop {
        NodeHop::Direct => Attachment::Direct,
        NodeHop::Overlay => Attachment::Overlay,
    };
    for (node, facts) in cluster.nodes.iter().zip(&nodes) {
        changes += multinode::converge_node(
            &node.namespace,
            facts,
            &nodes,
            gateway.ip,
            attachment,
            &cluster.tunnel_endpoints,
        )
        .map_err(|error| LabError::Agent {
            node: node.namespace.clone(),
            error: Box::new(error),
        })?
        .len();
    }
    Ok(changes)
}

/// A lab node as the route agent reads it from its Node object, with `external` routed behind
/// it too.
fn agent_node(node: &NodeState, external: Option<ipnet::Ipv4Net>) -> Node {
    Node {
        name: node.name.clone(),
        ip: IpAddr::V4(node.address),
        pod_cidrs: std::iter::once(node.pod_cidr)
            .chain(external)
            .map(IpNet::V4)
            .collect(),
    }
}

/// Writes a gateway's private key to a file only root can read.
fn write_key(path: &Path, key: &GatewayKey) -> Result<(), LabError> {
    crate::write_private(path, key.private_base64().as_bytes()).map_err(|error| LabError::Io {
        path: path.to_owned(),
        error,
    })
}

fn read_key(path: &Path) -> Result<GatewayKey, LabError> {
    let text = std::fs::read_to_string(path).map_err(|error| LabError::Io {
        path: path.to_owned(),
        error,
    })?;
    GatewayKey::from_private_base64(text.trim()).map_err(|e| LabError::Key {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

fn report_check(out: &mut dyn Write, check: &Check) {
    let mark = if check.passed { "ok  " } else { "FAIL" };
    say(
        out,
        &format!("    [{mark}] {} — {}", check.description, check.detail),
    );
}

fn say(out: &mut dyn Write, line: &str) {
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The names, addresses and files of a lab before anything exists.
fn planned_state(topology: &Topology, naming: &Naming, state_dir: &Path) -> LabState {
    let mut namespaces = vec![naming.underlay_ns()];
    let clusters = topology
        .clusters
        .iter()
        .enumerate()
        .map(|(index, spec)| {
            let id = spec.id();
            let interface = naming.tun(&id);
            let nodes: Vec<NodeState> = if spec.is_multi_node() {
                (0..spec.nodes)
                    .map(|i| NodeState {
                        name: naming::node_name(i),
                        namespace: naming.node_ns(&id, i),
                        address: spec.node_address(i),
                        pod_cidr: spec.node_pod_cidr(i),
                        pods: (1..=spec.pods)
                            .map(|n| Member {
                                namespace: naming.node_pod_ns(&id, i, n),
                                address: spec.node_pod_address(i, n),
                            })
                            .collect(),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let pods: Vec<Member> = if nodes.is_empty() {
                (1..=spec.pods)
                    .map(|n| Member {
                        namespace: naming.pod_ns(&id, n),
                        address: spec.pod_address(n),
                    })
                    .collect()
            } else {
                nodes.iter().flat_map(|n| n.pods.clone()).collect()
            };
            let externals: Vec<Member> = (1..=spec.externals)
                .filter_map(|n| {
                    spec.external_address(n).map(|address| Member {
                        namespace: naming.external_ns(&id, n),
                        address,
                    })
                })
                .collect();
            // The gateway starts on the first node of a multi-node cluster.
            let namespace = nodes
                .first()
                .map_or_else(|| naming.gateway_ns(&id), |n| n.namespace.clone());
            if nodes.is_empty() {
                namespaces.push(namespace.clone());
            } else {
                namespaces.push(naming.l2_ns(&id));
                namespaces.extend(nodes.iter().map(|n| n.namespace.clone()));
            }
            namespaces.extend(pods.iter().chain(&externals).map(|m| m.namespace.clone()));
            ClusterState {
                name: spec.name.clone(),
                namespace,
                grpc_socket: state_dir.join(format!("{interface}.grpc.sock")),
                uapi_socket: PathBuf::from(format!("/var/run/wireguard/{interface}.sock")),
                log: state_dir.join(format!("{interface}.log")),
                key_file: state_dir.join(format!("{interface}.key")),
                control_plane: None,
                interface,
                pid: None,
                public_key: String::new(),
                underlay_address: topology.underlay_address(index),
                listen_port: GATEWAY_PORT,
                pod_cidr: spec.pod_cidr,
                external_cidr: spec.external_cidr,
                pods,
                externals,
                tunnel_endpoints: Vec::new(),
                applied_version: String::new(),
                nodes,
                node_hop: spec.node_hop,
                gateway_node: 0,
                mtu: topology.mtu,
                id,
            }
        })
        .collect();
    LabState {
        prefix: naming.prefix().to_owned(),
        description: topology.description.clone(),
        namespaces,
        clusters,
        tables: Vec::new(),
        gateway_binary: PathBuf::new(),
    }
}

/// Moves the gateway of multi-node cluster `cluster` to node `node` (0-based) of a running
/// lab, as a rescheduled gateway pod would move: the old process stops (its TUN goes with it),
/// the underlay endpoint moves to the new node (same address, so the peers' TunnelEndpoints do
/// not change and nothing is re-applied to them), a new process starts there with the same key
/// and gets the same state over gRPC, and the route agent re-converges on every node. Then the
/// cluster's links are checked again; the checks are returned.
pub fn move_gateway(
    state_dir: &Path,
    cluster: &str,
    node: usize,
    out: &mut dyn Write,
) -> Result<Vec<Check>, LabError> {
    let mut state =
        LabState::load(state_dir)?.ok_or_else(|| LabError::NotUp(state_dir.to_owned()))?;
    let index = state
        .clusters
        .iter()
        .position(|c| c.name.eq_ignore_ascii_case(cluster))
        .ok_or_else(|| LabError::Usage(format!("the lab has no cluster {cluster:?}")))?;
    let current = &state.clusters[index];
    if !current.is_multi_node() {
        return Err(LabError::Usage(format!(
            "{} has a single node: its gateway cannot move",
            current.name
        )));
    }
    let Some(target) = current.nodes.get(node) else {
        return Err(LabError::Usage(format!(
            "{} has nodes 1..={}",
            current.name,
            current.nodes.len()
        )));
    };
    if node == current.gateway_node {
        return Err(LabError::Usage(format!(
            "the gateway of {} already runs on {}",
            current.name, target.name
        )));
    }
    let (from, to) = (current.namespace.clone(), target.namespace.clone());
    let (from_node, to_node) = (
        current.nodes[current.gateway_node].name.clone(),
        target.name.clone(),
    );
    say(
        out,
        &format!(
            "moving the gateway of {} from {from_node} to {to_node}",
            current.name
        ),
    );

    if let Some(pid) = current.pid
        && fabric::stop_gateway(pid)
    {
        say(
            out,
            &format!("  stopped the gateway on {from_node} (pid {pid})"),
        );
    }
    fabric::move_underlay(&from, &to)?;
    say(
        out,
        &format!(
            "  underlay endpoint {}:{} moved to {to_node}; the peers keep it",
            current.underlay_address, current.listen_port
        ),
    );
    let cluster = &mut state.clusters[index];
    cluster.namespace = to;
    cluster.gateway_node = node;
    cluster.pid = None;
    state.save(state_dir)?;

    let cluster = &state.clusters[index];
    // A state written before the lab recorded its binary names none.
    let binary = if state.gateway_binary.as_os_str().is_empty() {
        default_gateway_binary()
    } else {
        state.gateway_binary.clone()
    };
    let pid = fabric::start_gateway(cluster, &binary)?;
    state.clusters[index].pid = Some(pid);
    state.save(state_dir)?;
    let cluster = &state.clusters[index];
    say(
        out,
        &format!(
            "  started the gateway on {to_node} (pid {pid}) in {}",
            cluster.namespace
        ),
    );

    // The same state the controller would push: recomputed from the key and the
    // TunnelEndpoints, so the version matches the one applied before.
    let key = read_key(&cluster.key_file)?;
    let settings = plan::gateway_settings(
        &key,
        cluster.mtu,
        plan::local_prefixes(cluster.pod_cidr, cluster.external_cidr),
    );
    let desired = desired_state(&settings, &cluster.tunnel_endpoints);
    let version = desired.version.clone();
    if version != cluster.applied_version {
        return Err(LabError::Internal(format!(
            "recomputed state version {version} differs from the applied {}",
            cluster.applied_version
        )));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LabError::Runtime)?;
    let client = {
        let _guard = runtime.enter();
        GatewayClient::new(&cluster.grpc_socket)
    };
    let response = runtime
        .block_on(client.apply(desired))
        .map_err(|error| LabError::Rpc {
            cluster: cluster.name.clone(),
            error: Box::new(error),
        })?;
    say(
        out,
        &format!(
            "  applied {}: {} peer(s), version {version}, generation {}",
            cluster.name,
            cluster.tunnel_endpoints.len(),
            response.generation
        ),
    );
    let changes = converge_agents(cluster)?;
    say(
        out,
        &format!(
            "  route agent on {} nodes: {changes} change(s)",
            cluster.nodes.len()
        ),
    );

    let phase = "move";
    say(out, &format!("  checks after the move to {to_node}:"));
    let mut results = Vec::new();
    let mut peer_clients = Vec::new();
    for te in &cluster.tunnel_endpoints {
        let Some(peer) = state.clusters.iter().find(|c| c.id == te.cluster.id) else {
            continue;
        };
        // The moved cluster speaks first: its new gateway's handshake replaces the session the
        // peer still holds with the stopped process.
        for check in link_checks(phase, cluster, peer) {
            report_check(out, &check);
            results.push(check);
        }
        let _guard = runtime.enter();
        peer_clients.push((peer, GatewayClient::new(&peer.grpc_socket)));
    }
    let check = checks::agent_routes(phase, cluster);
    report_check(out, &check);
    results.push(check);

    let mut left = Vec::new();
    if named::exec(&from, &["ip", "link", "show", &cluster.interface]).is_ok() {
        left.push(format!("the TUN {}", cluster.interface));
    }
    if fabric::holds_underlay(&from) {
        left.push("the underlay interface".to_owned());
    }
    let check = Check {
        phase: phase.to_owned(),
        description: format!(
            "{from_node} no longer has the TUN {} nor the underlay",
            cluster.interface
        ),
        passed: left.is_empty(),
        detail: if left.is_empty() {
            "both gone".to_owned()
        } else {
            format!("{from_node} still has {}", left.join(" and "))
        },
    };
    report_check(out, &check);
    results.push(check);

    let check = connected_check(
        phase,
        format!("{} and its peers report every link Connected", cluster.name),
        || {
            let mut pairs = vec![(cluster, &client)];
            pairs.extend(peer_clients.iter().map(|(c, client)| (*c, client)));
            not_connected(&runtime, pairs.into_iter())
        },
    );
    report_check(out, &check);
    results.push(check);
    Ok(results)
}

/// Polls `not_connected` (the links not reporting Connected) until it is empty or
/// [`CONNECTED_TIMEOUT`] passes.
fn connected_check(
    phase: &str,
    description: String,
    mut not_connected: impl FnMut() -> Vec<String>,
) -> Check {
    let deadline = Instant::now() + CONNECTED_TIMEOUT;
    let mut pending = not_connected();
    while !pending.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        pending = not_connected();
    }
    let outcome = if pending.is_empty() {
        Ok("all links connected".to_owned())
    } else {
        Err(format!("not connected: {}", pending.join(", ")))
    };
    Check::new(phase, description, outcome)
}

/// Runs [`down`] on `state_dir` when dropped, also during a panic: a lab that a failed test
/// or program built does not outlive it.
#[derive(Debug)]
pub struct DownOnDrop(pub PathBuf);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        let _ = down(&self.0, &mut std::io::sink());
    }
}

/// Removes the lab recorded in `state_dir`: stops each gateway by PID, deletes the
/// namespaces by name (stopping anything left inside), removes sockets and the state file.
/// Without a state file there is nothing to do.
pub fn down(state_dir: &Path, out: &mut dyn Write) -> Result<(), LabError> {
    let Some(state) = LabState::load(state_dir)? else {
        say(
            out,
            &format!("no lab state in {}: nothing to remove", state_dir.display()),
        );
        return Ok(());
    };
    for cluster in &state.clusters {
        if let Some(pid) = cluster.pid
            && fabric::stop_gateway(pid)
        {
            say(
                out,
                &format!("  stopped {} gateway (pid {pid})", cluster.name),
            );
        }
        for socket in [&cluster.grpc_socket, &cluster.uapi_socket] {
            let _ = std::fs::remove_file(socket);
        }
        if let Some(plane) = &cluster.control_plane {
            apiserver::stop(plane);
            let _ = std::fs::remove_dir_all(&plane.dir);
            let _ = std::fs::remove_file(&plane.controller_log);
            say(
                out,
                &format!("  stopped {} API server and controller", cluster.name),
            );
        }
    }
    let _ = std::fs::remove_dir(state_dir.join("apiserver"));
    for name in state.namespaces.iter().rev() {
        netns::delete_netns(name);
    }
    say(
        out,
        &format!("  deleted {} namespaces", state.namespaces.len()),
    );
    remove_files(state_dir, &state);
    LabState::remove(state_dir)?;
    // The directory goes too when nothing else is in it.
    let _ = std::fs::remove_dir(state_dir);
    Ok(())
}

/// Removes the gateway logs and keys and iperf3 reports the lab wrote into its state
/// directory.
fn remove_files(state_dir: &Path, state: &LabState) {
    for cluster in &state.clusters {
        let _ = std::fs::remove_file(&cluster.log);
        if !cluster.key_file.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&cluster.key_file);
        }
    }
    let reports = state
        .clusters
        .iter()
        .flat_map(|c| c.externals.iter())
        .map(|m| state_dir.join(checks::iperf_log_name(&m.namespace)));
    for report in reports {
        let _ = std::fs::remove_file(report);
    }
}

/// Removes a half-built lab when `up` fails or panics.
struct Teardown {
    state_dir: Option<PathBuf>,
}

impl Teardown {
    fn armed(state_dir: &Path) -> Self {
        Self {
            state_dir: Some(state_dir.to_owned()),
        }
    }

    fn disarm(&mut self) {
        self.state_dir = None;
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Some(dir) = self.state_dir.take() {
            let _ = down(&dir, &mut std::io::sink());
        }
    }
}

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
    /// The pod CIDR.
    pub pod_cidr: String,
    /// The external CIDR.
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
                .and_then(|s| s.peers.iter().find(|p| p.public_key == te.public_key));
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

/// The `kubetun-gateway` next to the running executable, else on `PATH`.
pub fn default_gateway_binary() -> PathBuf {
    netns::sibling_binary("kubetun-gateway")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::MULTINODE_YAML;

    #[test]
    fn multi_node_clusters_plan_nodes_slices_and_namespaces() {
        let topology = Topology::from_yaml(MULTINODE_YAML).unwrap();
        let naming = Naming::new("t1").unwrap();
        let state = planned_state(&topology, &naming, Path::new("/run/x"));
        let paris = &state.clusters[0];
        assert!(paris.is_multi_node());
        assert_eq!(
            paris.namespace, "t1-paris-node1",
            "the gateway starts on node1"
        );
        let slices: Vec<String> = paris.nodes.iter().map(|n| n.pod_cidr.to_string()).collect();
        assert_eq!(
            slices,
            ["10.100.0.0/18", "10.100.64.0/18", "10.100.128.0/18"]
        );
        let pods: Vec<&str> = paris.pods.iter().map(|m| m.namespace.as_str()).collect();
        assert_eq!(
            pods,
            [
                "t1-paris-node1-pod1",
                "t1-paris-node2-pod1",
                "t1-paris-node3-pod1"
            ]
        );
        let off: Vec<&str> = paris
            .pods_off_gateway()
            .map(|m| m.namespace.as_str())
            .collect();
        assert_eq!(off, ["t1-paris-node2-pod1", "t1-paris-node3-pod1"]);
        assert_eq!(
            paris.key_file,
            Path::new("/run/x/t1-kt-paris.key"),
            "the key file is named after the TUN"
        );
        // Underlay, then per cluster its L2, nodes, pods and externals.
        assert_eq!(
            state.namespaces.len(),
            1 + (1 + 3 + 3 + 1) + (1 + 2 + 2 + 1)
        );
        for name in ["t1-paris-l2", "t1-berlin-node2", "t1-berlin-ext1"] {
            assert!(state.namespaces.iter().any(|n| n == name), "{name}");
        }
    }

    #[test]
    fn single_node_clusters_keep_the_gateway_namespace() {
        let state = planned_state(
            &Topology::seed(),
            &Naming::new("").unwrap(),
            Path::new("/run/x"),
        );
        let rome = &state.clusters[1];
        assert!(!rome.is_multi_node());
        assert_eq!(rome.namespace, "rome-gw");
        assert_eq!(rome.pods[0].namespace, "rome-pod1");
        assert_eq!(state.namespaces.len(), 10);
    }
}
