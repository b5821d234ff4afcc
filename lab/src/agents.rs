//! The route agent's pass over every node of a multi-node cluster, run in-process.

use std::net::IpAddr;

use ipnet::IpNet;
use kubetun_agent::plan::{Attachment, Node};

use crate::error::LabError;
use crate::route_agent;
use crate::state::{ClusterState, NodeState};
use crate::topology::NodeHop;

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
        changes += route_agent::converge_node(
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
