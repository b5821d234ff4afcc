//! What the agent reads from the Kubernetes API: the TunnelEndpoints of the kubetun namespace,
//! the Nodes (underlay IP and pod CIDRs) and where the gateway runs.
//!
//! The gateway's node is either fixed by configuration or found from the running gateway pod
//! (its `status.hostIP`), so a gateway rescheduled to another node moves every route with it.
//! The conversions from API objects are pure functions; [`read_cluster`] does the reads.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use kubetun_crds::TunnelEndpointSpec;
use kubetun_crds::contract::lease::NODE_IP_ANNOTATION;

use super::plan::Node;
use kubetun_controller::plumbing::tunnel_endpoints::list_specs;

/// How the agent finds the gateway's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayLocator {
    /// A fixed underlay IP.
    Fixed(IpAddr),
    /// The host of the running, ready pod matching `selector` in the kubetun namespace.
    Pod {
        /// Label selector of the gateway pod.
        selector: String,
    },
    /// The node the gateway Lease names (replicated gateways: the active replica's node).
    Lease {
        /// The Lease's name in the kubetun namespace.
        name: String,
    },
}

/// Why the cluster could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// No running gateway pod: there is nowhere to route to yet.
    #[error("no running gateway pod matches {selector:?} in namespace {namespace}")]
    NoGateway {
        /// The label selector.
        selector: String,
        /// The namespace searched.
        namespace: String,
    },
    /// The gateway Lease is missing or names no node: no replica is active.
    #[error("the gateway Lease {namespace}/{name} names no active node")]
    NoActiveReplica {
        /// The Lease's name.
        name: String,
        /// Its namespace.
        namespace: String,
    },
    /// A node has no usable InternalIP.
    #[error("node {0} has no InternalIP address")]
    NodeWithoutAddress(String),
}

/// Everything the plan needs from the API.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterView {
    /// The spec of every TunnelEndpoint of the namespace, sorted by name.
    pub endpoints: Vec<TunnelEndpointSpec>,
    /// Every node with an address; nodes without one are listed in `unaddressed`.
    pub nodes: Vec<Node>,
    /// Nodes skipped for lack of an InternalIP.
    pub unaddressed: Vec<String>,
    /// The underlay IP of the gateway's node.
    pub gateway_ip: IpAddr,
    /// The gateway pod's IP when it is not on the host network.
    pub gateway_pod_ip: Option<IpAddr>,
}

/// Where the gateway pod runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewayPlacement {
    /// Its node's IP (`status.hostIP`).
    pub host_ip: IpAddr,
    /// Its own IP (`status.podIP`) when that differs from the host's (no host network).
    pub pod_ip: Option<IpAddr>,
}

/// Reads TunnelEndpoints and Nodes, and locates the gateway.
pub async fn read_cluster(
    client: &Client,
    namespace: &str,
    locator: &GatewayLocator,
) -> Result<ClusterView, SourceError> {
    let endpoints = list_specs(client, namespace).await?;

    let mut nodes = Vec::new();
    let mut unaddressed = Vec::new();
    for node in Api::<KubeNode>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
    {
        match node_facts(&node) {
            Ok(facts) => nodes.push(facts),
            Err(SourceError::NodeWithoutAddress(name)) => unaddressed.push(name),
            Err(other) => return Err(other),
        }
    }
    nodes.sort_by(|a, b| a.name.cmp(&b.name));

    let placement = match locator {
        GatewayLocator::Fixed(ip) => GatewayPlacement {
            host_ip: *ip,
            pod_ip: None,
        },
        GatewayLocator::Pod { selector } => {
            let pods = Api::<Pod>::namespaced(client.clone(), namespace)
                .list(&ListParams::default().labels(selector))
                .await?
                .items;
            gateway_host(&pods).ok_or_else(|| SourceError::NoGateway {
                selector: selector.clone(),
                namespace: namespace.to_owned(),
            })?
        }
        GatewayLocator::Lease { name } => {
            let lease = Api::<Lease>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await?;
            lease
                .as_ref()
                .and_then(lease_holder_ip)
                .map(|host_ip| GatewayPlacement {
                    host_ip,
                    pod_ip: None,
                })
                .ok_or_else(|| SourceError::NoActiveReplica {
                    name: name.clone(),
                    namespace: namespace.to_owned(),
                })?
        }
    };
    Ok(ClusterView {
        endpoints,
        nodes,
        unaddressed,
        gateway_ip: placement.host_ip,
        gateway_pod_ip: placement.pod_ip,
    })
}

/// A node's name, InternalIP and pod CIDRs (unparsable CIDRs are left out).
pub fn node_facts(node: &KubeNode) -> Result<Node, SourceError> {
    let name = node.name_any();
    let ip = node
        .status
        .as_ref()
        .and_then(|status| status.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|address| address.type_ == "InternalIP")
        .find_map(|address| address.address.parse::<IpAddr>().ok())
        .ok_or_else(|| SourceError::NodeWithoutAddress(name.clone()))?;
    let spec = node.spec.as_ref();
    let mut texts: Vec<&String> = spec
        .and_then(|spec| spec.pod_cidrs.as_ref())
        .into_iter()
        .flatten()
        .collect();
    if texts.is_empty() {
        texts.extend(spec.and_then(|spec| spec.pod_cidr.as_ref()));
    }
    let pod_cidrs = texts
        .into_iter()
        .filter_map(|text| text.parse::<IpNet>().ok())
        .map(|net| net.trunc())
        .collect();
    Ok(Node {
        name,
        ip,
        pod_cidrs,
    })
}

/// The node IP the gateway Lease names, if it has a holder.
pub fn lease_holder_ip(lease: &Lease) -> Option<IpAddr> {
    let holder = lease.spec.as_ref()?.holder_identity.as_deref()?;
    if holder.is_empty() {
        return None;
    }
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(NODE_IP_ANNOTATION)?
        .parse()
        .ok()
}

/// What the plan reads from the gateway Lease (holder and node), so that renewals, several a
/// second, do not trigger passes.
pub fn lease_fingerprint(lease: &Lease) -> Option<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    lease_holder_ip(lease).hash(&mut hasher);
    Some(hasher.finish())
}

/// A hash of what the plan reads from a Node (its InternalIP and pod CIDRs), so that status
/// heartbeats do not trigger passes.
pub fn node_fingerprint(node: &KubeNode) -> Option<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    node_facts(node)
        .ok()
        .map(|facts| (facts.ip, facts.pod_cidrs))
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// Where the gateway pod that carries traffic runs: running, not being deleted, ready if any
/// is; the first by name when several match.
pub fn gateway_host(pods: &[Pod]) -> Option<GatewayPlacement> {
    let running = |pod: &&Pod| {
        pod.metadata.deletion_timestamp.is_none()
            && pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|phase| phase == "Running")
    };
    let ready = |pod: &&Pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    };
    let placement = |pod: &Pod| {
        let status = pod.status.as_ref()?;
        let host_ip = status.host_ip.as_deref()?.parse::<IpAddr>().ok()?;
        let pod_ip = status
            .pod_ip
            .as_deref()
            .and_then(|ip| ip.parse::<IpAddr>().ok())
            .filter(|ip| *ip != host_ip);
        Some(GatewayPlacement { host_ip, pod_ip })
    };
    let mut candidates: Vec<&Pod> = pods.iter().filter(running).collect();
    candidates.sort_by_key(|pod| (!ready(pod), pod.name_any()));
    candidates.into_iter().find_map(placement)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus, PodCondition, PodStatus};
    use kube::api::ObjectMeta;

    use super::*;

    fn kube_node(name: &str, addresses: &[(&str, &str)], cidrs: &[&str]) -> KubeNode {
        KubeNode {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: cidrs.first().map(|c| (*c).to_owned()),
                pod_cidrs: Some(cidrs.iter().map(|c| (*c).to_owned()).collect()),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(kind, address)| NodeAddress {
                            type_: (*kind).to_owned(),
                            address: (*address).to_owned(),
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
        }
    }

    fn pod(name: &str, phase: &str, ready: bool, host: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some(phase.to_owned()),
                host_ip: Some(host.to_owned()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".to_owned(),
                    status: if ready { "True" } else { "False" }.to_owned(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn node_facts_take_the_internal_ip_and_every_pod_cidr() {
        let node = kube_node(
            "n1",
            &[
                ("Hostname", "n1"),
                ("ExternalIP", "203.0.113.9"),
                ("InternalIP", "10.1.0.4"),
            ],
            &["10.244.1.0/24", "fd00:244:1::/64", "bogus"],
        );
        let facts = node_facts(&node).unwrap();
        assert_eq!(facts.ip, "10.1.0.4".parse::<IpAddr>().unwrap());
        assert_eq!(
            facts.pod_cidrs,
            vec![
                "10.244.1.0/24".parse::<IpNet>().unwrap(),
                "fd00:244:1::/64".parse().unwrap()
            ]
        );
        let bare = kube_node("n2", &[("Hostname", "n2")], &[]);
        assert!(matches!(node_facts(&bare), Err(SourceError::NodeWithoutAddress(n)) if n == "n2"));
    }

    #[test]
    fn node_fingerprints_ignore_everything_but_address_and_pod_cidrs() {
        let node = kube_node("n1", &[("InternalIP", "10.1.0.4")], &["10.244.1.0/24"]);
        let mut heartbeat = node.clone();
        heartbeat.metadata.resource_version = Some("42".to_owned());
        heartbeat.status.as_mut().unwrap().phase = Some("Running".to_owned());
        assert_eq!(node_fingerprint(&node), node_fingerprint(&heartbeat));
        let moved = kube_node("n1", &[("InternalIP", "10.1.0.5")], &["10.244.1.0/24"]);
        assert_ne!(node_fingerprint(&node), node_fingerprint(&moved));
    }

    #[test]
    fn the_gateway_is_the_ready_running_pod() {
        let pods = vec![
            pod("gw-a", "Pending", false, "10.1.0.1"),
            pod("gw-b", "Running", false, "10.1.0.2"),
            pod("gw-c", "Running", true, "10.1.0.3"),
        ];
        let host = |pods: &[Pod]| gateway_host(pods).map(|p| p.host_ip);
        assert_eq!(host(&pods), Some("10.1.0.3".parse().unwrap()));
        assert_eq!(host(&pods[..2]), Some("10.1.0.2".parse().unwrap()));
        assert_eq!(host(&pods[..1]), None);
    }

    #[test]
    fn a_pod_network_gateway_has_its_own_ip() {
        let mut in_pod = pod("gw", "Running", true, "10.1.0.3");
        let status = in_pod.status.as_mut().unwrap();
        status.pod_ip = Some("10.244.0.7".to_owned());
        let placement = gateway_host(&[in_pod.clone()]).unwrap();
        assert_eq!(placement.pod_ip, Some("10.244.0.7".parse().unwrap()));

        in_pod.status.as_mut().unwrap().pod_ip = Some("10.1.0.3".to_owned());
        assert_eq!(
            gateway_host(&[in_pod]).unwrap().pod_ip,
            None,
            "host network"
        );
    }
}
