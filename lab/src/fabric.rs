//! The lab's network: an underlay namespace with a bridge joining one gateway namespace per
//! cluster; in each gateway namespace a LAN bridge carrying the gateway's address in the pod
//! and external CIDRs, with every pod and external-endpoint namespace attached by a veth and
//! routed through it; and the `kubetun-gateway` process of each cluster.
//!
//! ```text
//!  <c>-pod1 ─┐                                ┌─ <d>-pod1
//!  <c>-ext1 ─┴ lan0 [<c>-gw] ul0 ── br0 [kt-underlay] ── ul0 [<d>-gw] lan0 ┴─ <d>-ext1
//!                     TUN kt-<c>                                TUN kt-<d>
//! ```
//!
//! A multi-node cluster has node namespaces on its own L2 bridge (`<c>-l2`), each with a LAN
//! bridge holding its slice of the pod CIDR and its pods (the first node also the external
//! endpoints), plain routes to the other nodes' slices (what a host-gateway CNI installs) and
//! strict reverse-path filtering, so an asymmetric return path would drop. The gateway runs on
//! one node; the underlay interface `ul0` (with the endpoint address and its MAC) is attached to
//! that node and moves with the gateway, like a floating IP or a re-attached cloud NIC, so peers
//! keep the endpoint they were given.
//!
//! ```text
//!  <c>-node1-pod1 ─┐ lan0 [<c>-node1] eth0 ─┐                ul0 ── br0 [kt-underlay]
//!  <c>-ext1 ───────┘        TUN kt-<c>     ├─ br0 [<c>-l2]   (on the gateway's node)
//!  <c>-node2-pod1 ── lan0 [<c>-node2] eth0 ─┘
//! ```

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::error::LabError;
use crate::naming::Naming;
use crate::state::{ClusterState, LabState, Member};
use crate::topology::{ClusterSpec, NODE_NETWORK, Topology, host};
use kubetun_testenv::netns::{self, Netns};

/// The underlay bridge (in the underlay namespace).
const UNDERLAY_BRIDGE: &str = "br0";
/// The gateway's underlay interface (in its namespace).
const UNDERLAY_IF: &str = "ul0";
/// The gateway's LAN bridge (in its namespace).
const LAN_BRIDGE: &str = "lan0";
/// A pod's or external endpoint's interface (in its namespace).
const MEMBER_IF: &str = "eth0";
/// A node's interface on the cluster L2 (in its namespace).
const NODE_IF: &str = "eth0";
/// The cluster L2 bridge of a multi-node cluster (in its L2 namespace).
const CLUSTER_BRIDGE: &str = "br0";
/// How long a gateway may take to open its control socket.
const GATEWAY_STARTUP: Duration = Duration::from_secs(10);

/// The lab's namespaces, by name, while `up` runs. Dropping it deletes them; [`Fabric::keep`]
/// leaves them for `down`.
#[derive(Debug, Default)]
pub struct Fabric {
    namespaces: BTreeMap<String, Netns>,
}

impl Fabric {
    /// Creates every namespace, link and address of the topology as recorded in `state`.
    pub fn build(topology: &Topology, state: &LabState, naming: &Naming) -> Result<Self, LabError> {
        let underlay_ns = &naming.underlay_ns();
        let mut fabric = Self::default();
        let underlay = fabric.create(underlay_ns)?;
        underlay.exec(&["ip", "link", "add", UNDERLAY_BRIDGE, "type", "bridge"])?;
        underlay.exec(&["ip", "link", "set", UNDERLAY_BRIDGE, "up"])?;

        for (index, (spec, cluster)) in topology.clusters.iter().zip(&state.clusters).enumerate() {
            if cluster.is_multi_node() {
                fabric.build_nodes(spec, cluster, &naming.l2_ns(&cluster.id))?;
                let gateway_node = &cluster.nodes[cluster.gateway_node].namespace;
                fabric.attach_underlay(topology, index, cluster, gateway_node, underlay_ns)?;
                continue;
            }
            fabric.build_gateway_ns(spec, cluster)?;
            fabric.attach_underlay(topology, index, cluster, &cluster.namespace, underlay_ns)?;
            for (n, member) in (1..).zip(&cluster.pods) {
                fabric.attach_member(
                    &cluster.namespace,
                    member,
                    &format!("p{n}"),
                    spec.gateway_pod_address(),
                    spec.pod_cidr.prefix_len(),
                )?;
            }
            fabric.attach_externals(spec, cluster, &cluster.namespace)?;
        }
        Ok(fabric)
    }

    fn attach_externals(
        &mut self,
        spec: &ClusterSpec,
        cluster: &ClusterState,
        router_ns: &str,
    ) -> Result<(), LabError> {
        for (n, member) in (1..).zip(&cluster.externals) {
            let (Some(gateway), Some(cidr)) = (spec.gateway_external_address(), spec.external_cidr)
            else {
                return Err(LabError::Internal(
                    "topology validation: externals need an external CIDR".to_owned(),
                ));
            };
            self.attach_member(
                router_ns,
                member,
                &format!("e{n}"),
                gateway,
                cidr.prefix_len(),
            )?;
        }
        Ok(())
    }

    /// The node namespaces of a multi-node cluster on their L2, pods behind each node, the
    /// external endpoints behind the first, and routes between the nodes' pod slices.
    fn build_nodes(
        &mut self,
        spec: &ClusterSpec,
        cluster: &ClusterState,
        l2_ns: &str,
    ) -> Result<(), LabError> {
        let l2 = self.create(l2_ns)?;
        l2.exec(&["ip", "link", "add", CLUSTER_BRIDGE, "type", "bridge"])?;
        l2.exec(&["ip", "link", "set", CLUSTER_BRIDGE, "up"])?;
        for (index, node) in cluster.nodes.iter().enumerate() {
            let ns = self.create(&node.namespace)?;
            for sysctl in [
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.rp_filter=1",
                "net.ipv4.conf.default.rp_filter=1",
            ] {
                ns.exec(&["sysctl", "-q", "-w", sysctl])?;
            }
            let port = format!("n{}", index + 1);
            let (ns, l2) = (self.ns(&node.namespace)?, self.ns(l2_ns)?);
            netns::veth(ns, NODE_IF, l2, &port)?;
            l2.exec(&["ip", "link", "set", &port, "master", CLUSTER_BRIDGE])?;
            let address = format!("{}/{}", node.address, NODE_NETWORK.prefix_len());
            ns.exec(&["ip", "addr", "add", &address, "dev", NODE_IF])?;
            ns.exec(&["ip", "link", "add", LAN_BRIDGE, "type", "bridge"])?;
            ns.exec(&["ip", "link", "set", LAN_BRIDGE, "up"])?;
            let gateway = host(node.pod_cidr, crate::topology::GATEWAY_HOST);
            let lan = format!("{gateway}/{}", node.pod_cidr.prefix_len());
            ns.exec(&["ip", "addr", "add", &lan, "dev", LAN_BRIDGE])?;
            if index == 0
                && let (Some(addr), Some(cidr)) =
                    (spec.gateway_external_address(), spec.external_cidr)
            {
                let ext = format!("{addr}/{}", cidr.prefix_len());
                ns.exec(&["ip", "addr", "add", &ext, "dev", LAN_BRIDGE])?;
            }
            for peer in cluster.nodes.iter().filter(|n| n.name != node.name) {
                let (slice, via) = (peer.pod_cidr.to_string(), peer.address.to_string());
                ns.exec(&["ip", "route", "add", &slice, "via", &via])?;
            }
            if index != 0
                && let Some(cidr) = spec.external_cidr
            {
                let via = cluster.nodes[0].address.to_string();
                ns.exec(&["ip", "route", "add", &cidr.to_string(), "via", &via])?;
            }
            for (n, member) in (1..).zip(&node.pods) {
                self.attach_member(
                    &node.namespace,
                    member,
                    &format!("p{n}"),
                    gateway,
                    node.pod_cidr.prefix_len(),
                )?;
            }
        }
        self.attach_externals(spec, cluster, &cluster.nodes[0].namespace)
    }

    /// Connects `holder` (the gateway's namespace) to the underlay bridge through `ul0`, with
    /// the cluster's underlay address.
    fn attach_underlay(
        &mut self,
        topology: &Topology,
        index: usize,
        cluster: &ClusterState,
        holder: &str,
        underlay_ns: &str,
    ) -> Result<(), LabError> {
        let underlay = self.ns(underlay_ns)?;
        let gw = self.ns(holder)?;
        netns::veth(gw, UNDERLAY_IF, underlay, &cluster.id)?;
        underlay.exec(&["ip", "link", "set", &cluster.id, "master", UNDERLAY_BRIDGE])?;
        let underlay_cidr = format!(
            "{}/{}",
            topology.underlay_address(index),
            topology.underlay.prefix_len()
        );
        gw.exec(&["ip", "addr", "add", &underlay_cidr, "dev", UNDERLAY_IF])?;
        Ok(())
    }

    fn create(&mut self, name: &str) -> Result<&Netns, LabError> {
        let ns = Netns::new(name)?;
        Ok(self.namespaces.entry(name.to_owned()).or_insert(ns))
    }

    /// The namespace named `name`.
    pub fn ns(&self, name: &str) -> Result<&Netns, LabError> {
        self.namespaces
            .get(name)
            .ok_or_else(|| LabError::Internal(format!("namespace {name} is not part of the lab")))
    }

    fn build_gateway_ns(
        &mut self,
        spec: &ClusterSpec,
        cluster: &ClusterState,
    ) -> Result<(), LabError> {
        let gw = self.create(&cluster.namespace)?;
        for sysctl in [
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ] {
            gw.exec(&["sysctl", "-q", "-w", sysctl])?;
        }
        gw.exec(&["ip", "link", "add", LAN_BRIDGE, "type", "bridge"])?;
        gw.exec(&["ip", "link", "set", LAN_BRIDGE, "up"])?;
        let pod_gw = format!(
            "{}/{}",
            spec.gateway_pod_address(),
            spec.pod_cidr.prefix_len()
        );
        gw.exec(&["ip", "addr", "add", &pod_gw, "dev", LAN_BRIDGE])?;
        if let (Some(addr), Some(cidr)) = (spec.gateway_external_address(), spec.external_cidr) {
            let ext_gw = format!("{addr}/{}", cidr.prefix_len());
            gw.exec(&["ip", "addr", "add", &ext_gw, "dev", LAN_BRIDGE])?;
        }
        Ok(())
    }

    /// Attaches `member` to the LAN bridge of `router_ns`, its default route via `gateway`.
    fn attach_member(
        &mut self,
        router_ns: &str,
        member: &Member,
        gw_side_if: &str,
        gateway: std::net::Ipv4Addr,
        prefix_len: u8,
    ) -> Result<(), LabError> {
        self.create(&member.namespace)?;
        let ns = self.ns(&member.namespace)?;
        let gw = self.ns(router_ns)?;
        netns::veth(ns, MEMBER_IF, gw, gw_side_if)?;
        gw.exec(&["ip", "link", "set", gw_side_if, "master", LAN_BRIDGE])?;
        let cidr = format!("{}/{prefix_len}", member.address);
        ns.exec(&["ip", "addr", "add", &cidr, "dev", MEMBER_IF])?;
        ns.exec(&["ip", "route", "add", "default", "via", &gateway.to_string()])?;
        Ok(())
    }

    /// Leaves every namespace in place after the handles drop (the lab outlives `up`).
    pub fn keep(self) {
        for (_, ns) in self.namespaces {
            ns.into_persistent();
        }
    }
}

/// Moves the underlay interface `ul0` of a cluster, with its addresses, from namespace `from`
/// to namespace `to`: a floating endpoint (same address, same MAC), so neither the peers nor
/// the underlay bridge need an update.
pub fn move_underlay(from: &str, to: &str) -> Result<(), LabError> {
    let shown = netns::exec_in(
        from,
        &["ip", "-o", "-4", "addr", "show", "dev", UNDERLAY_IF],
    )?;
    // `3: ul0    inet 198.18.0.1/24 brd … scope global ul0`: moving a link drops its addresses.
    let addresses: Vec<String> = shown
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next().map(str::to_owned)
        })
        .collect();
    netns::exec_in(from, &["ip", "link", "set", UNDERLAY_IF, "netns", to])?;
    for cidr in &addresses {
        netns::exec_in(to, &["ip", "addr", "add", cidr, "dev", UNDERLAY_IF])?;
    }
    netns::exec_in(to, &["ip", "link", "set", UNDERLAY_IF, "up"])?;
    Ok(())
}

/// Whether namespace `ns` holds the underlay interface.
pub fn holds_underlay(ns: &str) -> bool {
    netns::exec_in(ns, &["ip", "link", "show", UNDERLAY_IF]).is_ok()
}

/// A log file opened for appending, twice: a child's stdout and stderr.
pub fn open_log(path: &Path) -> Result<(std::fs::File, std::fs::File), LabError> {
    let io = |error| LabError::Io {
        path: path.to_owned(),
        error,
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    let log_err = log.try_clone().map_err(io)?;
    Ok((log, log_err))
}

/// Starts the gateway of `cluster` in its namespace, detached from the terminal's process
/// group so it outlives `up`; its log goes to `cluster.log` (appended to, so a moved gateway
/// keeps the history). Returns its PID once its gRPC socket exists.
pub fn start_gateway(cluster: &ClusterState, binary: &Path) -> Result<u32, LabError> {
    let (log, log_err) = open_log(&cluster.log)?;
    let binary = binary.to_string_lossy();
    let grpc = cluster.grpc_socket.to_string_lossy();
    let mut cmd = netns::command_in(&cluster.namespace, &binary);
    cmd.args(["-f", "--grpc-socket", &grpc, &cluster.interface])
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0);
    let mut child = cmd.spawn().map_err(|error| LabError::Io {
        path: binary.as_ref().into(),
        error,
    })?;
    let pid = child.id();
    let deadline = Instant::now() + GATEWAY_STARTUP;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(LabError::Gateway {
                cluster: cluster.name.clone(),
                message: format!(
                    "exited during startup ({status}); its log {} ends with:\n{}",
                    cluster.log.display(),
                    log_tail(&cluster.log, 10)
                ),
            });
        }
        if std::os::unix::net::UnixStream::connect(&cluster.grpc_socket).is_ok() {
            return Ok(pid);
        }
        if Instant::now() >= deadline {
            return Err(LabError::Gateway {
                cluster: cluster.name.clone(),
                message: format!(
                    "did not open {} within {GATEWAY_STARTUP:?}; log {}:\n{}",
                    cluster.grpc_socket.display(),
                    cluster.log.display(),
                    log_tail(&cluster.log, 10)
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last `count` lines of a log file (or why it cannot be read).
pub fn log_tail(path: &Path, count: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(count)..].join("\n")
        }
        Err(e) => format!("(cannot read: {e})"),
    }
}

/// Stops a lab gateway by PID: only if that PID still runs `kubetun-gateway` (PIDs are
/// reused), SIGTERM, then SIGKILL after three seconds. Returns whether it was running.
pub fn stop_gateway(pid: u32) -> bool {
    if !runs_gateway(pid) {
        return false;
    }
    let pid_text = pid.to_string();
    let signal = |sig: &str| {
        let _ = std::process::Command::new("kill")
            .args([sig, &pid_text])
            .stderr(Stdio::null())
            .status();
    };
    signal("-TERM");
    let deadline = Instant::now() + Duration::from_secs(3);
    while is_alive(pid) {
        if Instant::now() >= deadline {
            signal("-KILL");
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// True when `pid` is a live (not zombie) process whose command is `kubetun-gateway`.
pub fn runs_gateway(pid: u32) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    is_alive(pid) && String::from_utf8_lossy(argv0).ends_with("kubetun-gateway")
}

/// True when `pid` exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may contain spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}
