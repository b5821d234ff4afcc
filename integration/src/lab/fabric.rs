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

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::lab::LabError;
use crate::lab::state::{ClusterState, LabState, Member};
use crate::netns::{self, Netns};
use crate::topology::{ClusterSpec, Topology};

/// The underlay bridge (in the underlay namespace).
const UNDERLAY_BRIDGE: &str = "br0";
/// The gateway's underlay interface (in its namespace).
const UNDERLAY_IF: &str = "ul0";
/// The gateway's LAN bridge (in its namespace).
const LAN_BRIDGE: &str = "lan0";
/// A pod's or external endpoint's interface (in its namespace).
const MEMBER_IF: &str = "eth0";
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
    pub fn build(
        topology: &Topology,
        state: &LabState,
        underlay_ns: &str,
    ) -> Result<Self, LabError> {
        let mut fabric = Self::default();
        let underlay = fabric.create(underlay_ns)?;
        underlay.exec(&["ip", "link", "add", UNDERLAY_BRIDGE, "type", "bridge"])?;
        underlay.exec(&["ip", "link", "set", UNDERLAY_BRIDGE, "up"])?;

        for (index, (spec, cluster)) in topology.clusters.iter().zip(&state.clusters).enumerate() {
            fabric.build_gateway_ns(topology, index, spec, cluster, underlay_ns)?;
            for (n, member) in (1..).zip(&cluster.pods) {
                fabric.attach_member(
                    cluster,
                    member,
                    &format!("p{n}"),
                    spec.gateway_pod_address(),
                )?;
            }
            for (n, member) in (1..).zip(&cluster.externals) {
                let gateway = spec
                    .gateway_external_address()
                    .expect("topology validation: externals need an external CIDR");
                fabric.attach_member(cluster, member, &format!("e{n}"), gateway)?;
            }
        }
        Ok(fabric)
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
        topology: &Topology,
        index: usize,
        spec: &ClusterSpec,
        cluster: &ClusterState,
        underlay_ns: &str,
    ) -> Result<(), LabError> {
        let gw = self.create(&cluster.namespace)?;
        for sysctl in [
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ] {
            gw.exec(&["sysctl", "-q", "-w", sysctl])?;
        }
        let gw_name = gw.name().to_owned();
        let underlay = self.ns(underlay_ns)?;
        let gw = self.ns(&gw_name)?;
        netns::veth(gw, UNDERLAY_IF, underlay, &cluster.id)?;
        underlay.exec(&["ip", "link", "set", &cluster.id, "master", UNDERLAY_BRIDGE])?;
        let underlay_cidr = format!(
            "{}/{}",
            topology.underlay_address(index),
            topology.underlay.prefix_len()
        );
        gw.exec(&["ip", "addr", "add", &underlay_cidr, "dev", UNDERLAY_IF])?;

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

    fn attach_member(
        &mut self,
        cluster: &ClusterState,
        member: &Member,
        gw_side_if: &str,
        gateway: std::net::Ipv4Addr,
    ) -> Result<(), LabError> {
        self.create(&member.namespace)?;
        let ns = self.ns(&member.namespace)?;
        let gw = self.ns(&cluster.namespace)?;
        netns::veth(ns, MEMBER_IF, gw, gw_side_if)?;
        gw.exec(&["ip", "link", "set", gw_side_if, "master", LAN_BRIDGE])?;
        let prefix_len = if cluster.pod_cidr.contains(&member.address) {
            cluster.pod_cidr.prefix_len()
        } else {
            cluster.external_cidr.map_or(32, |cidr| cidr.prefix_len())
        };
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

/// Starts the gateway of `cluster` in its namespace, detached from the terminal's process
/// group so it outlives `up`; its log goes to `cluster.log`. Returns its PID once its gRPC
/// socket exists.
pub fn start_gateway(
    fabric: &Fabric,
    cluster: &ClusterState,
    binary: &Path,
) -> Result<u32, LabError> {
    let ns = fabric.ns(&cluster.namespace)?;
    let log = File::create(&cluster.log).map_err(|error| LabError::Io {
        path: cluster.log.clone(),
        error,
    })?;
    let log_err = log.try_clone().map_err(|error| LabError::Io {
        path: cluster.log.clone(),
        error,
    })?;
    let binary = binary.to_string_lossy();
    let grpc = cluster.grpc_socket.to_string_lossy();
    let mut cmd = ns.command(&binary);
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
                    log_tail(&cluster.log)
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
                    log_tail(&cluster.log)
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last lines of a log file (or why it cannot be read).
pub fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(10)..].join("\n")
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
