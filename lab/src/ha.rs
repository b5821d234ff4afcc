//! Replicated gateways on a real API server, in network namespaces: what `kubetun-lab ha`
//! runs and `tests/e2e/gateway_ha.rs` measures.
//!
//! Cluster A has three nodes on one L2 (100.64.10.0/24), each with a slice of the pod CIDR
//! 10.1.0.0/16 and the routes a CNI would give it; a pod sits behind node 3. Nodes 1 and 2
//! each run a gateway replica (`kubetun-gateway --standby`) with its controller beside it
//! (`kubetun-controller --replica`), each with its own underlay address; every node runs the
//! route agent following the gateway Lease. The controllers and agents reach A's API server
//! through a relay that listens on the node's own loopback, the way a node's processes reach
//! their API server, so cutting a node off cuts its control plane too.
//!
//! Cluster B is one gateway (the remote side) configured once over gRPC with replica 1 or 2
//! as its peer's endpoint; it is never touched again: a failover must need nothing from it.
//! A 20 ms ping train from B to A's pod measures each outage.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kubetun_controller::gateway_api::{self, StatusResponse};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::plumbing::cluster_info::ClusterInfo;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_controller_testing::link_as_connector;
use kubetun_crds::contract::lease::DEFAULT_LEASE_NAME;
use kubetun_crds::{ClusterRef, Endpoint, NetworkConfig};
use kubetun_testenv::{Assets, TestCluster};

mod error;
mod ping;
mod relay;

pub use self::error::HaError;
pub use self::ping::{PingTrain, unix_now};
use self::relay::Relay;
use crate::control_plane::{NAMESPACE, apply_manifests, wait_crds_served};
use kubetun_testenv::netns::{Netns, NsChild, command_in, gateway_command, spawn_gateway, veth};
use kubetun_testenv::workspace_program;

/// The manifests a user applies, less the gateway Deployment the lab replaces.
const MANIFESTS: [&str; 4] = [
    include_str!("../../deploy/namespace.yaml"),
    include_str!("../../deploy/crds/kubetun.yaml"),
    include_str!("../../deploy/rbac.yaml"),
    include_str!("../../deploy/agent/rbac.yaml"),
];
const PORT: u16 = 51820;
const A_POD_CIDR: &str = "10.1.0.0/16";
const B_POD_CIDR: &str = "10.2.0.0/16";
/// The pod behind node 3 the ping train reaches.
pub const POD: &str = "10.1.3.10";
/// B's address, the ping train's source.
pub const REMOTE: &str = "10.2.0.1";
const GATEWAY_IF: &str = "kt-a";
/// How long bring-up steps may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(90);

/// What A's API server goes through while the replicas run ([`HaLab::api_fault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFault {
    /// Killed (`kill -9`), down for `down_for`, started again.
    Restart { down_for: Duration },
    /// Frozen (SIGSTOP) for `frozen_for`: it accepts connections and answers nothing, then
    /// answers what waited, late, as a server does that is starting or starved.
    Stall { frozen_for: Duration },
}

/// How a gateway node fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// `kill -9` of the node's gateway, controller and route agent: the node died.
    Kill,
    /// `kill -9` of the node's gateway and route agent; its controller lives on and must
    /// notice that its gateway is gone.
    KillGateway,
    /// SIGTERM to the node's controller (a rolling update): it hands the lease over.
    Stop,
    /// The node's links go down and its control-plane relay closes: everything on it runs
    /// on, unreachable.
    Cut,
    /// The node's controller freezes (SIGSTOP) while its gateway runs on, connected: only
    /// the gateway's own lease deadline stops it.
    Freeze,
}

/// What one [`HaLab::failover`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailoverReport {
    /// The replica whose node failed (0 or 1).
    pub failed: usize,
    /// The replica that took over.
    pub took_over: usize,
    /// From the failure until the Lease named the other replica.
    pub lease_moved: Duration,
    /// The longest silence of the 20 ms ping train from B to A's pod.
    pub outage: Duration,
    /// The longest silence in the 3 s after the failed node came back (it must not draw
    /// traffic away from the new active replica).
    pub after_restore: Duration,
}

/// One node's name, namespace and addresses.
#[derive(Debug, Clone)]
struct NodeSpecLab {
    name: String,
    ns: String,
    l2: String,
    underlay: Option<String>,
    pod_cidr: String,
}

/// A gateway replica's processes.
#[derive(Debug, Default)]
struct ReplicaProcs {
    gateway: Option<NsChild>,
    controller: Option<NsChild>,
}

/// The running HA lab; [`HaLab::down`] (or drop) removes it.
pub struct HaLab {
    dir: PathBuf,
    cluster: TestCluster,
    nodes: Vec<NodeSpecLab>,
    replicas: [ReplicaProcs; 2],
    agents: Vec<Option<NsChild>>,
    relays: Vec<Relay>,
    remote: Option<NsChild>,
    controller_kubeconfig: PathBuf,
    agent_kubeconfig: PathBuf,
    /// Last: deleted after every process in them stopped.
    namespaces: Vec<Netns>,
}

impl std::fmt::Debug for HaLab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaLab")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl HaLab {
    /// Builds the namespaces, starts A's API server, replicas, agents and B, and waits until
    /// the ping train's path works.
    pub async fn up(assets: &Assets, dir: &Path, prefix: &str) -> Result<Self, HaError> {
        std::fs::create_dir_all(dir)?;
        let nodes: Vec<NodeSpecLab> = (1..=3)
            .map(|i| NodeSpecLab {
                name: format!("node-{i}"),
                ns: format!("{prefix}-n{i}"),
                l2: format!("100.64.10.{i}"),
                underlay: (i <= 2).then(|| format!("198.18.10.{}", 10 + i)),
                pod_cidr: format!("10.1.{i}.0/24"),
            })
            .collect();
        let cluster = TestCluster::start(assets, &format!("{prefix}-a")).await?;
        let mut lab = Self {
            dir: dir.to_owned(),
            cluster,
            nodes,
            replicas: Default::default(),
            agents: Vec::new(),
            relays: Vec::new(),
            remote: None,
            controller_kubeconfig: PathBuf::new(),
            agent_kubeconfig: PathBuf::new(),
            namespaces: Vec::new(),
        };
        lab.build_network(prefix)?;
        lab.install().await?;
        let port = api_port(&lab.cluster)?;
        for node in &lab.nodes {
            lab.relays.push(Relay::start(&node.ns, port)?);
        }
        lab.create_nodes().await?;
        // Replica 1 first, so it is the first holder; then the standby.
        lab.start_replica(0)?;
        let first = lab.wait_holder(None, SETUP_TIMEOUT).await?;
        lab.start_replica(1)?;
        for index in 0..lab.nodes.len() {
            lab.start_agent(index)?;
        }
        lab.link_remote(first).await?;
        lab.wait_path(SETUP_TIMEOUT)?;
        Ok(lab)
    }

    /// The lab's directory (logs, sockets, kubeconfigs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A's admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.cluster.kubeconfig_path()
    }

    /// The namespace B's gateway (and the ping train) runs in.
    fn remote_ns_name(&self) -> String {
        self.namespaces
            .iter()
            .map(Netns::name)
            .find(|n| n.ends_with("-b"))
            .unwrap_or_default()
            .to_owned()
    }

    /// The replica (0 or 1) the Lease names, if any.
    pub async fn holder(&self) -> Result<Option<usize>, HaError> {
        let leases: Api<Lease> = Api::namespaced(self.cluster.client().await?, NAMESPACE);
        let holder = leases
            .get_opt(DEFAULT_LEASE_NAME)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        Ok(holder.and_then(|h| self.nodes.iter().position(|n| n.name == h)))
    }

    /// Waits until the Lease names a replica other than `other`.
    pub async fn wait_holder(
        &self,
        other: Option<usize>,
        timeout: Duration,
    ) -> Result<usize, HaError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(holder) = self.holder().await.ok().flatten()
                && Some(holder) != other
            {
                return Ok(holder);
            }
            if Instant::now() > deadline {
                return Err(HaError::Step(format!(
                    "no replica took the gateway lease within {timeout:?}; logs in {}",
                    self.dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The notes of the failover events the replicas recorded, oldest first.
    pub async fn failover_events(&self) -> Result<Vec<String>, HaError> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.cluster.client().await?, NAMESPACE);
        let mut found: Vec<_> = events
            .list(&kube::api::ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("GatewayFailover"))
            .map(|e| (e.event_time.map(|t| t.0), e.note.unwrap_or_default()))
            .collect();
        found.sort();
        Ok(found.into_iter().map(|(_, note)| note).collect())
    }

    /// The gateway status of replica `replica` (0 or 1).
    pub async fn gateway_status(&self, replica: usize) -> Option<StatusResponse> {
        GatewayClient::with_timeout(self.socket(replica), Duration::from_secs(2))
            .status()
            .await
            .ok()
    }

    /// Fails the node of replica `replica`.
    pub fn fail(&mut self, replica: usize, failure: Failure) -> Result<(), HaError> {
        let node = self.nodes[replica].clone();
        match failure {
            Failure::Kill | Failure::KillGateway => {
                let procs = &mut self.replicas[replica];
                let controller = procs
                    .controller
                    .as_mut()
                    .filter(|_| failure == Failure::Kill);
                for child in [procs.gateway.as_mut(), controller]
                    .into_iter()
                    .flatten()
                    .chain(self.agents[replica].as_mut())
                {
                    let _ = child.kill_hard();
                }
            }
            Failure::Stop => {
                if let Some(controller) = &self.replicas[replica].controller {
                    signal(controller.pid(), nix::sys::signal::Signal::SIGTERM);
                }
            }
            Failure::Cut => {
                for link in ["l2", "ul"] {
                    kubetun_testenv::netns::exec_in(
                        &node.ns,
                        &["ip", "link", "set", link, "down"],
                    )?;
                }
                self.relays[replica].cut();
            }
            Failure::Freeze => {
                if let Some(controller) = &self.replicas[replica].controller {
                    signal(controller.pid(), nix::sys::signal::Signal::SIGSTOP);
                }
            }
        }
        Ok(())
    }

    /// Brings the node of replica `replica` back after `failure`: links up, relay open,
    /// processes running (restarted where they died, as the kubelet would).
    pub fn restore(&mut self, replica: usize, failure: Failure) -> Result<(), HaError> {
        let node = self.nodes[replica].clone();
        match failure {
            Failure::Kill | Failure::KillGateway => {}
            Failure::Stop => {
                // Restarted only once it is gone: the handover must not race a second one.
                let deadline = Instant::now() + Duration::from_secs(10);
                while self.controller_running(replica) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Failure::Cut => {
                for link in ["l2", "ul"] {
                    kubetun_testenv::netns::exec_in(&node.ns, &["ip", "link", "set", link, "up"])?;
                }
                // The routes over the L2 went down with it.
                for other in self.nodes.iter().filter(|o| o.name != node.name) {
                    kubetun_testenv::netns::exec_in(
                        &node.ns,
                        &["ip", "route", "replace", &other.pod_cidr, "via", &other.l2],
                    )?;
                }
                self.relays[replica].resume();
            }
            Failure::Freeze => {
                if let Some(controller) = &self.replicas[replica].controller {
                    signal(controller.pid(), nix::sys::signal::Signal::SIGCONT);
                }
            }
        }
        self.start_replica(replica)?;
        if self.agents[replica]
            .as_mut()
            .is_none_or(|agent| !agent.is_running())
        {
            self.start_agent(replica)?;
        }
        Ok(())
    }

    /// Whether replica `replica`'s controller process runs.
    pub fn controller_running(&mut self, replica: usize) -> bool {
        self.replicas[replica]
            .controller
            .as_mut()
            .is_some_and(NsChild::is_running)
    }

    /// Waits until both gateways answer and run the same state version, one active and one
    /// on standby, the active one the Lease holder. Restarts what exited meanwhile, as the
    /// kubelet would (a controller that lost the Lease exits).
    pub async fn wait_settled(&mut self, timeout: Duration) -> Result<usize, HaError> {
        let deadline = Instant::now() + timeout;
        loop {
            for replica in 0..self.replicas.len() {
                self.start_replica(replica)?;
            }
            let holder = self.holder().await.ok().flatten();
            let (a, b) = (self.gateway_status(0).await, self.gateway_status(1).await);
            if let (Some(holder), Some(a), Some(b)) = (holder, &a, &b) {
                let active = [a.active, b.active];
                if a.version == b.version
                    && !a.version.is_empty()
                    && active[holder]
                    && !active[1 - holder]
                {
                    return Ok(holder);
                }
            }
            if Instant::now() > deadline {
                return Err(HaError::Step(format!(
                    "the replicas did not settle within {timeout:?} (holder {holder:?}, active {:?}/{:?}, versions {:?}/{:?}); logs in {}",
                    a.as_ref().map(|s| s.active),
                    b.as_ref().map(|s| s.active),
                    a.as_ref().map(|s| s.version.clone()),
                    b.as_ref().map(|s| s.version.clone()),
                    self.dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One failover: waits until the replicas are settled, starts a ping train, fails the
    /// active replica's node, waits for the other replica to take the lease and for
    /// traffic to flow again, then restores the node.
    pub async fn failover(&mut self, failure: Failure) -> Result<FailoverReport, HaError> {
        let failed = self.wait_settled(Duration::from_secs(60)).await?;
        let train = self.ping_train()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        if train.replies() < 20 {
            return Err(HaError::Step(format!(
                "the link does not work before the failure ({} replies in 1 s)",
                train.replies()
            )));
        }
        let failed_at = unix_now();
        let started = Instant::now();
        self.fail(failed, failure)?;
        let took_over = self
            .wait_holder(Some(failed), Duration::from_secs(20))
            .await?;
        let lease_moved = started.elapsed();
        // The outage ends with the first reply; a few seconds show that it stays over.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let outage = self.silence_since(&train, failed_at, &format!("{failure:?} failover"))?;
        let restored_at = unix_now();
        self.restore(failed, failure)?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after_restore = self.silence_since(
            &train,
            restored_at,
            &format!("{failure:?}: the node's return"),
        )?;
        Ok(FailoverReport {
            failed,
            took_over,
            lease_moved,
            outage,
            after_restore,
        })
    }

    /// Puts A's API server through `fault` under a ping train; the longest silence of the
    /// train from the fault until 3 s after the API server is back.
    pub async fn api_fault(&mut self, fault: ApiFault) -> Result<Duration, HaError> {
        let train = self.ping_train()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let since = unix_now();
        match fault {
            ApiFault::Restart { down_for } => {
                self.cluster.stop_apiserver(true).await;
                tokio::time::sleep(down_for).await;
                self.cluster.start_apiserver().await?;
            }
            ApiFault::Stall { frozen_for } => {
                self.cluster.freeze_apiserver(true);
                tokio::time::sleep(frozen_for).await;
                self.cluster.freeze_apiserver(false);
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.silence_since(&train, since, &format!("{fault:?}"))
    }

    /// The longest silence of `train` from `since` (Unix seconds) until now; an error when
    /// no reply came after `what`.
    fn silence_since(
        &self,
        train: &PingTrain,
        since: f64,
        what: &str,
    ) -> Result<Duration, HaError> {
        train
            .longest_gap(since, unix_now())
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                HaError::Step(format!(
                    "no reply after {what}; logs in {}",
                    self.dir.display()
                ))
            })
    }

    /// A ping train from B to A's pod, one every 20 ms.
    pub fn ping_train(&self) -> Result<PingTrain, HaError> {
        PingTrain::start(&self.remote_ns_name(), REMOTE, POD)
    }

    /// Stops every process and removes namespaces and the API server.
    pub fn down(self) {
        drop(self);
    }

    fn socket(&self, replica: usize) -> PathBuf {
        self.dir.join(format!("gateway-{}.grpc.sock", replica + 1))
    }

    fn build_network(&mut self, prefix: &str) -> Result<(), HaError> {
        let underlay = Netns::new(&format!("{prefix}-u"))?;
        let l2 = Netns::new(&format!("{prefix}-l"))?;
        for switch in [&underlay, &l2] {
            switch.exec(&["ip", "link", "add", "br0", "type", "bridge"])?;
            switch.exec(&["ip", "link", "set", "br0", "up"])?;
        }
        let pod = Netns::new(&format!("{prefix}-p"))?;
        let remote = Netns::new(&format!("{prefix}-b"))?;
        let mut namespaces = vec![underlay, l2];
        for (index, node) in self.nodes.iter().enumerate() {
            let ns = Netns::new(&node.ns)?;
            for key in [
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ] {
                ns.exec(&["sysctl", "-qw", key])?;
            }
            let port = format!("n{}", index + 1);
            veth(&ns, "l2", &namespaces[1], &port)?;
            namespaces[1].exec(&["ip", "link", "set", &port, "master", "br0"])?;
            ns.exec(&["ip", "addr", "add", &format!("{}/24", node.l2), "dev", "l2"])?;
            if let Some(address) = &node.underlay {
                let port = format!("u{}", index + 1);
                veth(&ns, "ul", &namespaces[0], &port)?;
                namespaces[0].exec(&["ip", "link", "set", &port, "master", "br0"])?;
                ns.exec(&["ip", "addr", "add", &format!("{address}/24"), "dev", "ul"])?;
            }
            // What the CNI gives every node: the other nodes' pod slices over the L2.
            for other in self.nodes.iter().filter(|o| o.name != node.name) {
                ns.exec(&["ip", "route", "add", &other.pod_cidr, "via", &other.l2])?;
            }
            namespaces.push(ns);
        }
        // The pod behind node 3.
        let node3 = &namespaces[4];
        veth(node3, "pod0", &pod, "eth0")?;
        node3.exec(&["ip", "addr", "add", "10.1.3.1/24", "dev", "pod0"])?;
        pod.exec(&["ip", "addr", "add", &format!("{POD}/24"), "dev", "eth0"])?;
        pod.exec(&["ip", "route", "add", "default", "via", "10.1.3.1"])?;
        // B on the underlay.
        veth(&remote, "ul", &namespaces[0], "ub")?;
        namespaces[0].exec(&["ip", "link", "set", "ub", "master", "br0"])?;
        remote.exec(&["ip", "addr", "add", "198.18.10.2/24", "dev", "ul"])?;
        namespaces.push(pod);
        namespaces.push(remote);
        self.namespaces = namespaces;
        Ok(())
    }

    async fn install(&mut self) -> Result<(), HaError> {
        let client = self.cluster.client().await?;
        for manifest in MANIFESTS {
            apply_manifests(&client, manifest)
                .await
                .map_err(|e| HaError::Step(format!("cannot apply the manifests: {e}")))?;
        }
        wait_crds_served(&client).await?;
        self.controller_kubeconfig = self
            .cluster
            .service_account_kubeconfig(NAMESPACE, "kubetun-controller")
            .await?;
        self.agent_kubeconfig = self
            .cluster
            .service_account_kubeconfig(NAMESPACE, "kubetun-route-agent")
            .await?;
        Ok(())
    }

    /// The Node objects the agents read (no kubelet registers them here).
    async fn create_nodes(&self) -> Result<(), HaError> {
        let nodes: Api<Node> = Api::all(self.cluster.client().await?);
        for node in &self.nodes {
            let object = Node {
                metadata: ObjectMeta {
                    name: Some(node.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(NodeSpec {
                    pod_cidr: Some(node.pod_cidr.clone()),
                    pod_cidrs: Some(vec![node.pod_cidr.clone()]),
                    ..NodeSpec::default()
                }),
                status: None,
            };
            nodes.create(&PostParams::default(), &object).await?;
            let status = NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".to_owned(),
                    address: node.l2.clone(),
                }]),
                ..NodeStatus::default()
            };
            nodes
                .patch_status(
                    &node.name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({ "status": status })),
                )
                .await?;
        }
        Ok(())
    }

    /// Appends `cmd`'s stdout (where the daemons log) and stderr (their exit reason) to the
    /// log `name` in the lab's directory.
    fn log_to(&self, cmd: &mut std::process::Command, name: &str) -> Result<(), HaError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(name))?;
        cmd.stdout(log.try_clone()?).stderr(log);
        Ok(())
    }

    /// Starts what of replica `replica` is not running: its gateway (standby) and controller.
    fn start_replica(&mut self, replica: usize) -> Result<(), HaError> {
        let node = self.nodes[replica].clone();
        let socket = self.socket(replica);
        let gateway_running = self.replicas[replica]
            .gateway
            .as_mut()
            .is_some_and(NsChild::is_running);
        if !gateway_running {
            let gateway = self.spawn_gateway(
                &node.ns,
                GATEWAY_IF,
                &socket,
                &format!("gateway-{}", replica + 1),
                &["--standby"],
            )?;
            self.replicas[replica].gateway = Some(gateway);
        }
        if !self.controller_running(replica) {
            let underlay = node.underlay.clone().unwrap_or_default();
            let mut cmd = command_in(
                &node.ns,
                &workspace_program("kubetun-controller")?.to_string_lossy(),
            );
            cmd.arg("--kubeconfig")
                .arg(&self.controller_kubeconfig)
                .args(["--cluster-id", "a", "--pod-cidr", A_POD_CIDR])
                .args(["--endpoint-address", &underlay])
                .args(["--endpoint-port", &PORT.to_string()])
                .arg("--gateway-socket")
                .arg(&socket)
                .args(["--manage-routes", "--replica", &node.name])
                .args(["--node-ip", &node.l2])
                .env("RUST_LOG", "info")
                // The exit reason without a backtrace: the log's tail is the story.
                .env("RUST_LIB_BACKTRACE", "0")
                .stdin(Stdio::null());
            self.log_to(&mut cmd, &format!("controller-{}.log", replica + 1))?;
            self.replicas[replica].controller = Some(NsChild::spawn(&mut cmd)?);
        }
        Ok(())
    }

    /// Starts a gateway on interface `ifname` in namespace `ns` with control socket `socket`,
    /// its UAPI socket and log named after `name` in the lab's directory, and waits for it.
    fn spawn_gateway(
        &self,
        ns: &str,
        ifname: &str,
        socket: &Path,
        name: &str,
        extra: &[&str],
    ) -> Result<NsChild, HaError> {
        let _ = std::fs::remove_file(socket);
        let uapi_dir = self.dir.join(format!("uapi-{name}"));
        std::fs::create_dir_all(&uapi_dir)?;
        let log = self.dir.join(format!("{name}.log"));
        let mut cmd = gateway_command(ns, ifname, socket, &log, "info")?;
        cmd.arg("--uapi-dir").arg(&uapi_dir).args(extra);
        spawn_gateway(&mut cmd, socket, Duration::from_secs(20))
            .map_err(|error| HaError::Step(format!("{name}: {error}; log in {}", log.display())))
    }

    fn start_agent(&mut self, index: usize) -> Result<(), HaError> {
        let node = self.nodes[index].clone();
        let mut cmd = command_in(
            &node.ns,
            &workspace_program("kubetun-agent")?.to_string_lossy(),
        );
        cmd.arg("--kubeconfig")
            .arg(&self.agent_kubeconfig)
            .args(["--node-name", &node.name])
            .args(["--gateway-lease", DEFAULT_LEASE_NAME])
            .args(["--attachment", "direct"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null());
        self.log_to(&mut cmd, &format!("agent-{}.log", index + 1))?;
        let child = NsChild::spawn(&mut cmd)?;
        if self.agents.len() <= index {
            self.agents.resize_with(index + 1, || None);
        }
        self.agents[index] = Some(child);
        Ok(())
    }

    /// Writes B's objects into A as the connector would, and configures B's gateway with
    /// replica `holder` as its peer's endpoint.
    async fn link_remote(&mut self, holder: usize) -> Result<(), HaError> {
        let client = self.cluster.client().await?;
        let deadline = Instant::now() + SETUP_TIMEOUT;
        let a = loop {
            match ClusterInfo::load(&client, NAMESPACE).await {
                Ok(info) => break info,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => {
                    return Err(HaError::Step(format!(
                        "A published no cluster info: {error}"
                    )));
                }
            }
        };
        let key = GatewayKey::generate();
        let b = ClusterInfo {
            cluster: ClusterRef {
                id: "b".to_owned(),
                name: "b".to_owned(),
            },
            pod_cidrs: vec![B_POD_CIDR.parse().expect("CIDR")],
            external_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            endpoint: Endpoint {
                address: "198.18.10.2".to_owned(),
                port: PORT,
            },
            public_key: key.public_base64().to_owned(),
            mtu: 1420,
        };
        let configs: Api<NetworkConfig> = Api::namespaced(client.clone(), NAMESPACE);
        link_as_connector(&configs, NAMESPACE, &a, &b).await?;

        let remote_ns = self.remote_ns_name();
        let socket = self.dir.join("remote.grpc.sock");
        self.remote = Some(self.spawn_gateway(&remote_ns, "kt-b", &socket, "gateway-b", &[])?);
        let endpoint: SocketAddr = format!(
            "{}:{PORT}",
            self.nodes[holder].underlay.as_deref().unwrap_or_default()
        )
        .parse()
        .map_err(|_| HaError::Step("bad endpoint".into()))?;
        let state = gateway_api::DesiredState {
            version: "b-1".to_owned(),
            interface: Some(gateway_api::Interface {
                private_key: key.private_base64(),
                listen_port: u32::from(PORT),
                mtu: 1420,
                addresses: vec![format!("{REMOTE}/32")],
                local_prefixes: vec![B_POD_CIDR.to_owned()],
                manage_routes: true,
                ..gateway_api::Interface::default()
            }),
            peers: vec![gateway_api::Peer {
                public_key: a.public_key.clone(),
                name: "a".to_owned(),
                endpoint: endpoint.to_string(),
                routes: vec![gateway_api::Route {
                    real: A_POD_CIDR.to_owned(),
                    view: A_POD_CIDR.to_owned(),
                    fallback: false,
                }],
                ..gateway_api::Peer::default()
            }],
            admissions: Vec::new(),
        };
        GatewayClient::new(&socket)
            .apply(state)
            .await
            .map_err(|e| HaError::Step(format!("cannot configure B's gateway: {e}")))?;
        Ok(())
    }

    /// Waits until B reaches A's pod.
    fn wait_path(&self, timeout: Duration) -> Result<(), HaError> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if kubetun_testenv::netns::ping_from(&self.remote_ns_name(), POD, 1) {
                return Ok(());
            }
        }
        Err(HaError::Step(format!(
            "B cannot reach A's pod {POD} within {timeout:?}; logs in {}",
            self.dir.display()
        )))
    }
}

impl Drop for HaLab {
    fn drop(&mut self) {
        // Processes first (their namespaces go with `namespaces`), then the relays.
        self.remote = None;
        self.agents.clear();
        for replica in &mut self.replicas {
            if let Some(controller) = &replica.controller {
                // A frozen controller would not see the SIGTERM.
                signal(controller.pid(), nix::sys::signal::Signal::SIGCONT);
            }
            replica.controller = None;
            replica.gateway = None;
        }
        self.relays.clear();
        if std::thread::panicking() {
            self.print_log_tails();
        }
    }
}

impl HaLab {
    /// The last lines of every process's log, for a failed test's output (the lab's
    /// directory goes with the test).
    fn print_log_tails(&self) {
        const LINES: usize = 40;
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut logs: Vec<_> = entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
            .collect();
        logs.sort();
        for log in logs {
            println!("--- last lines of {}:", log.display());
            println!("{}", crate::fabric::log_tail(&log, LINES));
        }
    }
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

fn api_port(cluster: &TestCluster) -> Result<u16, HaError> {
    cluster
        .apiserver_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| HaError::Step("the API server URL has no port".into()))
}
