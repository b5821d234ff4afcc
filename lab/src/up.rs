//! Bringing a lab up: host preflight, namespaces and gateways, linking, and the report.

use std::io::Write;
use std::path::Path;

use kubetun_controller::plumbing::exports::Exports;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use serde::Serialize;

use crate::checks::Check;
use crate::control_plane;

use crate::error::LabError;
use crate::fabric::{self, Fabric};
use crate::keys::write_key;
use crate::layout::planned_state;
use crate::linking::RunningLab;
use crate::naming::Naming;
use crate::options::LabOptions;
use crate::output::say;
use crate::plan::{self, ControlPlanes};
use crate::state::LabState;
use crate::table::{self, ClusterTable};
use crate::teardown::{Teardown, down};
use kubetun_testenv::netns;

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
    if options.topology.service.is_some() {
        tools.extend(["curl", "nft"]);
    }
    for tool in tools {
        if !netns::command_exists(tool) {
            return Err(LabError::Host(format!(
                "`{tool}` is not installed (needs iproute2, iputils-ping, procps, coreutils, iperf3, curl, nftables)"
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
        exports: vec![Exports::default(); topology.clusters.len()],
    };

    if options.apiserver {
        lab.link_through_apiservers(out)?;
    } else {
        lab.link_in_process(out)?;
    }
    crate::services::run(&mut lab, out)?;
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
                    control_plane::NAMESPACE
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
