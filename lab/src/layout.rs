//! The names, addresses and files of a lab, planned from the topology before anything exists.

use std::path::{Path, PathBuf};

use crate::naming::{self, Naming};
use crate::state::{ClusterState, LabState, Member, NodeState};
use crate::topology::{GATEWAY_PORT, Topology};

/// The names, addresses and files of a lab before anything exists.
pub(super) fn planned_state(topology: &Topology, naming: &Naming, state_dir: &Path) -> LabState {
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
        assert_eq!(
            state.namespaces.len(),
            13,
            "a gateway, a pod and an external endpoint per cluster, and the underlay"
        );
    }
}
