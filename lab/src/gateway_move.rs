//! Moving the gateway of a multi-node cluster to another node, as a rescheduled gateway pod
//! would move, and checking the cluster's links afterwards.

use std::io::Write;
use std::path::Path;

use kubetun_controller::planner::desired_state;
use kubetun_controller::plumbing::gateway_client::GatewayClient;

use crate::agents::converge_agents;
use crate::checks::{self, Check};
use crate::connectivity::{connected_check, link_checks, not_connected};
use crate::error::LabError;
use crate::keys::read_key;
use crate::options::default_gateway_binary;
use crate::output::{report_check, say};
use crate::state::LabState;
use crate::{fabric, plan};
use kubetun_testenv::netns;

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
    let step = Move::plan(&state, cluster, node)?;
    say(
        out,
        &format!(
            "moving the gateway of {} from {} to {}",
            state.clusters[step.index].name, step.from_node, step.to_node
        ),
    );
    step.relocate(&mut state, state_dir, out)?;
    step.restart(&mut state, state_dir, out)?;
    let (runtime, client) = step.reapply(&state, out)?;
    Ok(step.check(&state, &runtime, &client, out))
}

/// One gateway move, fixed before anything changes: the names and namespaces of both ends
/// are needed again after the state has been rewritten to the new node.
struct Move {
    /// The cluster's index in the lab state.
    index: usize,
    /// The target node's index within the cluster.
    node: usize,
    /// The namespace the gateway leaves; checked afterwards for leftovers.
    from_namespace: String,
    to_namespace: String,
    from_node: String,
    to_node: String,
}

impl Move {
    /// Refuses a move that does not fit the lab: an unknown cluster, a single-node one, an
    /// unknown node or the node the gateway already runs on.
    fn plan(state: &LabState, cluster: &str, node: usize) -> Result<Self, LabError> {
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
        Ok(Self {
            index,
            node,
            from_namespace: current.namespace.clone(),
            to_namespace: target.namespace.clone(),
            from_node: current.nodes[current.gateway_node].name.clone(),
            to_node: target.name.clone(),
        })
    }

    /// Stops the old process and moves the underlay endpoint; the state records the new node
    /// before a gateway runs there, so `down` finds the right namespace after a failure.
    fn relocate(
        &self,
        state: &mut LabState,
        state_dir: &Path,
        out: &mut dyn Write,
    ) -> Result<(), LabError> {
        let current = &state.clusters[self.index];
        if let Some(pid) = current.pid
            && fabric::stop_gateway(pid)
        {
            say(
                out,
                &format!("  stopped the gateway on {} (pid {pid})", self.from_node),
            );
        }
        fabric::move_underlay(&self.from_namespace, &self.to_namespace)?;
        say(
            out,
            &format!(
                "  underlay endpoint {}:{} moved to {}; the peers keep it",
                current.underlay_address, current.listen_port, self.to_node
            ),
        );
        let cluster = &mut state.clusters[self.index];
        cluster.namespace = self.to_namespace.clone();
        cluster.gateway_node = self.node;
        cluster.pid = None;
        state.save(state_dir)?;
        Ok(())
    }

    /// Starts a gateway process on the new node and records its PID.
    fn restart(
        &self,
        state: &mut LabState,
        state_dir: &Path,
        out: &mut dyn Write,
    ) -> Result<(), LabError> {
        let cluster = &state.clusters[self.index];
        // A state written before the lab recorded its binary names none.
        let binary = if state.gateway_binary.as_os_str().is_empty() {
            default_gateway_binary()
        } else {
            state.gateway_binary.clone()
        };
        let pid = fabric::start_gateway(cluster, &binary)?;
        state.clusters[self.index].pid = Some(pid);
        state.save(state_dir)?;
        let cluster = &state.clusters[self.index];
        say(
            out,
            &format!(
                "  started the gateway on {} (pid {pid}) in {}",
                self.to_node, cluster.namespace
            ),
        );
        Ok(())
    }

    /// Applies the state the gateway had before to the new process and re-converges the route
    /// agents; returns the runtime and client the checks keep using.
    fn reapply(
        &self,
        state: &LabState,
        out: &mut dyn Write,
    ) -> Result<(tokio::runtime::Runtime, GatewayClient), LabError> {
        let cluster = &state.clusters[self.index];
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
        Ok((runtime, client))
    }

    /// The checks after the move: every link of the cluster, its agent routes, nothing left
    /// on the old node, and every link Connected again.
    fn check(
        &self,
        state: &LabState,
        runtime: &tokio::runtime::Runtime,
        client: &GatewayClient,
        out: &mut dyn Write,
    ) -> Vec<Check> {
        let cluster = &state.clusters[self.index];
        let phase = "move";
        say(
            out,
            &format!("  checks after the move to {}:", self.to_node),
        );
        let mut results = Vec::new();
        let mut peer_clients = Vec::new();
        for te in &cluster.tunnel_endpoints {
            let Some(peer) = state.clusters.iter().find(|c| c.id == te.cluster.id) else {
                continue;
            };
            // The moved cluster speaks first: its new gateway's handshake replaces the session
            // the peer still holds with the stopped process.
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

        let check = self.leftovers_check(phase, &cluster.interface);
        report_check(out, &check);
        results.push(check);

        let check = connected_check(
            phase,
            format!("{} and its peers report every link Connected", cluster.name),
            || {
                let mut pairs = vec![(cluster, client)];
                pairs.extend(peer_clients.iter().map(|(c, client)| (*c, client)));
                not_connected(runtime, pairs.into_iter())
            },
        );
        report_check(out, &check);
        results.push(check);
        results
    }

    /// The old node must have lost both the TUN `interface` and the underlay interface.
    fn leftovers_check(&self, phase: &str, interface: &str) -> Check {
        let mut left = Vec::new();
        if netns::exec_in(&self.from_namespace, &["ip", "link", "show", interface]).is_ok() {
            left.push(format!("the TUN {interface}"));
        }
        if fabric::holds_underlay(&self.from_namespace) {
            left.push("the underlay interface".to_owned());
        }
        Check {
            phase: phase.to_owned(),
            description: format!(
                "{} no longer has the TUN {interface} nor the underlay",
                self.from_node
            ),
            passed: left.is_empty(),
            detail: if left.is_empty() {
                "both gone".to_owned()
            } else {
                format!("{} still has {}", self.from_node, left.join(" and "))
            },
        }
    }
}
