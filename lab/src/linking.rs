//! Linking the clusters of a lab being brought up (in-process or through API servers),
//! applying each gateway's state and checking every link as it comes up.

use std::io::Write;
use std::time::Instant;

use kubetun_controller::plumbing::exports::Exports;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_crds::Isolation;

use crate::agents::converge_agents;
use crate::apiserver;
use crate::checks::{self, Check, Ends, Kind};
use crate::connectivity::{connected_check, link_checks, not_connected};
use crate::control_plane;
use crate::error::LabError;
use crate::fabric::Fabric;
use crate::options::LabOptions;
use crate::output::{report_check, say};
use crate::plan::ControlPlanes;
use crate::state::LabState;
use crate::topology::{NodeHop, Topology};

/// The lab while `up` links and checks it.
pub(super) struct RunningLab<'a> {
    pub(super) topology: &'a Topology,
    pub(super) options: &'a LabOptions,
    pub(super) fabric: &'a Fabric,
    pub(super) planes: &'a mut ControlPlanes,
    pub(super) state: &'a mut LabState,
    pub(super) runtime: &'a tokio::runtime::Runtime,
    pub(super) clients: &'a [GatewayClient],
    pub(super) checks: Vec<Check>,
    /// In-process: what each cluster exports (by cluster index), what its gateway admits
    /// from the clusters it is offered to; the services demo sets it.
    pub(super) exports: Vec<Exports>,
}

impl RunningLab<'_> {
    /// Links and shortcuts with the controller's IPAM and planner run in-process, every
    /// state applied over the gateways' gRPC sockets.
    pub(super) fn link_in_process(&mut self, out: &mut dyn Write) -> Result<(), LabError> {
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

        // Phase 2: the shortcuts and the pairs only their hub links, re-applying both ends
        // (and the hub, when it carries them); every link is checked again.
        if topology.has_leaf_pairs() {
            let mut touched = Vec::new();
            for (link, hub_only) in topology.leaf_pairs() {
                self.link(&link.0, &link.1, out)?;
                let (a, b) = (self.index(&link.0)?, self.index(&link.1)?);
                touched.extend([a, b]);
                if !(topology.transit || hub_only) {
                    continue;
                }
                let hub = self.hub_index(link)?;
                self.planes
                    .add_transit(hub, a, b, hub_only)
                    .map_err(|error| LabError::Plan {
                        cluster: format!("{} <-> {} through its hub", link.0, link.1),
                        error: Box::new(error),
                    })?;
                touched.push(hub);
                let how = if hub_only {
                    "reach each other only"
                } else {
                    "fall back"
                };
                say(
                    out,
                    &format!(
                        "  {} <-> {} {how} through {} (transit)",
                        link.0, link.1, self.state.clusters[hub].name
                    ),
                );
            }
            touched.sort_unstable();
            touched.dedup();
            for index in touched {
                self.apply(index, out)?;
            }
            let all: Vec<_> = topology.all_links().map(|(_, l)| l.clone()).collect();
            self.check_links("shortcuts", &all, out);
            self.check_through_hub(out)?;
            self.check_fallbacks(out)?;
        }
        Ok(())
    }

    /// The hub of a shortcut: the cluster linked to both leaves.
    fn hub_index(&self, link: &crate::topology::LinkSpec) -> Result<usize, LabError> {
        let hub = self.topology.hub_of(&link.0, &link.1).ok_or_else(|| {
            LabError::Usage(format!(
                "shortcut {} <-> {}: no cluster is linked to both (the hub that owns it)",
                link.0, link.1
            ))
        })?;
        self.index(&hub)
    }

    /// Each pair only its hub links, between external endpoints in overlapping CIDRs: a TCP
    /// client is seen at the address the other leaf uses for it (remapped on both hops), a
    /// UDP datagram to a closed port gets the ICMP error back through the hub, and (with
    /// `iperf_seconds`) one bounded iperf3 run crosses both hops.
    fn check_through_hub(&mut self, out: &mut dyn Write) -> Result<(), LabError> {
        for link in &self.topology.hub_only {
            let (a, b) = (self.index(&link.0)?, self.index(&link.1)?);
            if self.options.iperf_seconds > 0 {
                self.iperf("through the hub", a, b, out);
            }
            for (from, to) in [(a, b), (b, a)] {
                let clusters = &self.state.clusters;
                // External endpoints: their CIDRs overlap, so every hop remaps them.
                let Some(ends) = Ends::first(Kind::External, &clusters[from], &clusters[to]) else {
                    continue;
                };
                for check in [
                    checks::tcp("through the hub", ends),
                    checks::port_unreachable("through the hub", ends),
                ] {
                    report_check(out, &check);
                    self.checks.push(check);
                }
            }
        }
        Ok(())
    }

    /// With `transit`, each shortcut is cut, must move to its hub, and is healed.
    fn check_fallbacks(&mut self, out: &mut dyn Write) -> Result<(), LabError> {
        if !self.topology.transit {
            return Ok(());
        }
        say(out, "  fallback checks (each shortcut cut and healed):");
        for link in &self.topology.shortcuts {
            let (a, b) = (self.index(&link.0)?, self.index(&link.1)?);
            let hub = self.hub_index(link)?;
            let clusters = &self.state.clusters;
            for check in crate::transit::fallback_checks(
                self.runtime,
                (&clusters[a], &self.clients[a]),
                (&clusters[b], &self.clients[b]),
                &clusters[hub],
            ) {
                report_check(out, &check);
                self.checks.push(check);
            }
        }
        Ok(())
    }

    /// Links through real control planes: an API server and controller per cluster, the
    /// links made with `kubetun network connect`, the shortcuts by the hub's operator
    /// (`kubetun shortcut create`); the checks read the TunnelEndpoints the controllers wrote.
    pub(super) fn link_through_apiservers(&mut self, out: &mut dyn Write) -> Result<(), LabError> {
        let topology = self.topology;
        let state_dir = self.options.state_dir.clone();
        let started = Instant::now();
        let hubs: Vec<String> = topology
            .shortcuts
            .iter()
            .filter_map(|l| topology.hub_of(&l.0, &l.1))
            .collect();
        let state = &mut *self.state;
        // Saved as each control plane comes up, so `down` finds its processes also when a
        // later cluster fails to install.
        let mut saved = state.clone();
        apiserver::start(
            self.runtime,
            &mut state.clusters,
            topology.underlay,
            &hubs,
            topology.service.as_ref().map(|s| s.client.as_str()),
            &state_dir,
            out,
            |clusters| {
                saved.clusters = clusters.to_vec();
                Ok(saved.save(&state_dir)?)
            },
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
                    control_plane::NAMESPACE,
                    control_plane::SERVICE_ACCOUNT
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
            control_plane::connect(&self.state.clusters[a], &self.state.clusters[b], &[])?;
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
        if topology.has_leaf_pairs() {
            for (link, hub_only) in topology.leaf_pairs() {
                let (a, b) = (self.index(&link.0)?, self.index(&link.1)?);
                let hub = self.hub_index(link)?;
                let started = Instant::now();
                let clusters = &self.state.clusters;
                let flag = shortcut_flag(hub_only, topology.transit);
                control_plane::shortcut(
                    &clusters[hub],
                    &clusters[a],
                    &clusters[b],
                    flag.as_slice(),
                )?;
                say(
                    out,
                    &format!(
                        "  kubetun shortcut create{} on {}: {} <-> {} connected in {:.1} s",
                        flag.map(|f| format!(" {f}")).unwrap_or_default(),
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
            self.check_through_hub(out)?;
            self.check_fallbacks(out)?;
        }
        Ok(())
    }

    /// Reads every cluster's TunnelEndpoints (and its gateway key) back from its API server.
    fn refresh_tunnel_endpoints(&mut self) -> Result<(), LabError> {
        for cluster in &mut self.state.clusters {
            cluster.tunnel_endpoints = self
                .runtime
                .block_on(control_plane::tunnel_endpoints(cluster))?;
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
    pub(super) fn apply(&mut self, index: usize, out: &mut dyn Write) -> Result<(), LabError> {
        let name = self.state.clusters[index].name.clone();
        let endpoints = self
            .planes
            .tunnel_endpoints(index)
            .map_err(|error| LabError::Plan {
                cluster: name.clone(),
                error: Box::new(error),
            })?;
        let none = Exports::default();
        let exports = self.exports.get(index).unwrap_or(&none);
        let desired =
            self.planes
                .desired_state(index, &endpoints, &exports.endpoints, &exports.answers);
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

    /// Sets the isolation of every link of the lab: with real control planes as users do
    /// (`kubetun network connect --isolation` again on every hub link, `kubetun shortcut
    /// create --isolation` again on the hub for every leaf pair), else as the controllers
    /// would (every cluster's default, every gateway applied again).
    pub(super) fn set_isolation(
        &mut self,
        isolation: Isolation,
        out: &mut dyn Write,
    ) -> Result<(), LabError> {
        let flag = ["--isolation", isolation.as_str()];
        if !self.options.apiserver {
            for index in 0..self.state.clusters.len() {
                self.planes.set_isolation(index, isolation);
            }
            for index in 0..self.state.clusters.len() {
                self.apply(index, out)?;
            }
            return Ok(());
        }
        let topology = self.topology;
        for link in &topology.links {
            let (a, b) = (self.index(&link.0)?, self.index(&link.1)?);
            control_plane::connect(&self.state.clusters[a], &self.state.clusters[b], &flag)?;
        }
        for (link, hub_only) in topology.leaf_pairs() {
            let (a, b, hub) = (
                self.index(&link.0)?,
                self.index(&link.1)?,
                self.hub_index(link)?,
            );
            let clusters = &self.state.clusters;
            let mut flags = flag.to_vec();
            flags.extend(shortcut_flag(hub_only, topology.transit));
            control_plane::shortcut(&clusters[hub], &clusters[a], &clusters[b], &flags)?;
        }
        say(
            out,
            &format!(
                "  every link set to {isolation} with kubetun network connect and shortcut create"
            ),
        );
        self.refresh_tunnel_endpoints()
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
                self.iperf(phase, b, a, out);
            }
        }
    }

    /// One bounded iperf3 run between the first external endpoints of clusters `from` and
    /// `to`.
    fn iperf(&mut self, phase: &str, from: usize, to: usize, out: &mut dyn Write) {
        let check = checks::iperf_external(
            self.fabric,
            phase,
            &self.state.clusters[from],
            &self.state.clusters[to],
            self.options.iperf_seconds,
            &self.options.state_dir,
        );
        report_check(out, &check);
        self.checks.push(check);
    }

    /// Every linked peer of every gateway must report Connected (bounded wait).
    pub(super) fn check_connected(&mut self, out: &mut dyn Write) {
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

/// The `kubetun shortcut create` flag of a leaf pair: `--hub-only`, `--transit` or none.
fn shortcut_flag(hub_only: bool, transit: bool) -> Option<&'static str> {
    match (hub_only, transit) {
        (true, _) => Some("--hub-only"),
        (false, true) => Some("--transit"),
        (false, false) => None,
    }
}
