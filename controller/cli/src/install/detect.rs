//! What `kubetun install` reads from the cluster, each fact with where it came from: the pod
//! CIDRs (the Nodes' `spec.podCIDRs`), the service CIDR (`ServiceCIDR` objects, else inferred
//! from the `kubernetes` Service), the node subnets (the Nodes' InternalIPs), the endpoint
//! (the gateway Service's load balancer, else a NodePort on the gateway pod's node). The
//! range arithmetic, the overlap check and the choice of the NodePort's node are pure.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::ApiResource;

use super::manifests::GATEWAY_POD_LABELS;

/// Prefix length assumed around the `kubernetes` Service's ClusterIP when no ServiceCIDR
/// object says better: kubeadm's default service CIDR is 10.96.0.0/12.
pub const INFERRED_SERVICE_PREFIX_V4: u8 = 12;
/// The IPv6 counterpart (the largest IPv6 service range kube-apiserver accepts is /108;
/// /112 is the common choice).
pub const INFERRED_SERVICE_PREFIX_V6: u8 = 112;
/// Prefix length of the subnet assumed around a node's InternalIP (Nodes carry no mask).
pub const NODE_SUBNET_PREFIX_V4: u8 = 24;
/// The IPv6 counterpart.
pub const NODE_SUBNET_PREFIX_V6: u8 = 64;

/// One detected fact, printed as one line: `<what>: <value> (<source>)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    pub what: &'static str,
    pub value: String,
    pub source: String,
}

impl std::fmt::Display for Fact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.what, self.value, self.source)
    }
}

/// What the cluster said.
#[derive(Debug, Clone, Default)]
pub struct Detected {
    pub pod_cidrs: Vec<IpNet>,
    pub service_cidrs: Vec<IpNet>,
    pub node_subnets: Vec<IpNet>,
    pub facts: Vec<Fact>,
}

pub fn join(nets: &[IpNet]) -> String {
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The smallest prefix per address family that covers every one of `nets`.
pub fn covering(nets: &[IpNet]) -> Vec<IpNet> {
    let mut out = Vec::new();
    for v4 in [true, false] {
        let family: Vec<IpNet> = nets
            .iter()
            .filter(|n| matches!(n, IpNet::V4(_)) == v4)
            .map(IpNet::trunc)
            .collect();
        let Some(mut cover) = family.first().copied() else {
            continue;
        };
        while !family.iter().all(|n| cover.contains(n)) {
            match cover.supernet() {
                Some(wider) => cover = wider,
                None => break,
            }
        }
        out.push(cover);
    }
    out
}

/// The subnet assumed around each address (/24, /64), adjacent ones aggregated.
pub fn node_subnets(addresses: &[IpAddr]) -> Vec<IpNet> {
    let nets: Vec<IpNet> = addresses
        .iter()
        .filter_map(|ip| {
            let len = if ip.is_ipv4() {
                NODE_SUBNET_PREFIX_V4
            } else {
                NODE_SUBNET_PREFIX_V6
            };
            IpNet::new(*ip, len).ok().map(|n| n.trunc())
        })
        .collect();
    IpNet::aggregate(&nets)
}

/// The service range inferred from one ClusterIP of the `kubernetes` Service.
pub fn service_from_cluster_ip(ip: IpAddr) -> Option<IpNet> {
    let len = if ip.is_ipv4() {
        INFERRED_SERVICE_PREFIX_V4
    } else {
        INFERRED_SERVICE_PREFIX_V6
    };
    IpNet::new(ip, len).ok().map(|n| n.trunc())
}

/// Refuses ranges of this cluster that overlap: kubetun remaps *remote* ranges, never the
/// cluster's own, so its pod, service and node ranges must be disjoint. Each entry is
/// `(name, ranges)`; the error names both ranges.
pub fn check_overlaps(ranges: &[(&str, &[IpNet])]) -> Result<(), String> {
    let mut problems = Vec::new();
    for (i, (left_name, left)) in ranges.iter().enumerate() {
        for (right_name, right) in &ranges[i + 1..] {
            for a in *left {
                for b in *right {
                    if a.contains(&b.network()) || b.contains(&a.network()) {
                        problems.push(format!("the {left_name} {a} overlaps the {right_name} {b}"));
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}: kubetun remaps remote clusters' ranges, never this cluster's own, so they must \
             not overlap; pass the right ranges with --pod-cidr/--service-cidr (or --reserved \
             for the node subnets)",
            problems.join("; ")
        ))
    }
}

/// Reads the pod CIDRs, the service CIDR and the node subnets (each unless given).
pub async fn detect(
    client: &kube::Client,
    pod_flag: &[IpNet],
    service_flag: &[IpNet],
) -> Result<Detected, kube::Error> {
    let mut detected = Detected::default();
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;

    // Pod CIDRs.
    if pod_flag.is_empty() {
        let node_cidrs: Vec<IpNet> = nodes
            .items
            .iter()
            .flat_map(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.pod_cidrs.clone())
                    .unwrap_or_default()
            })
            .filter_map(|c| c.parse().ok())
            .collect();
        detected.pod_cidrs = covering(&node_cidrs);
        let source = if node_cidrs.is_empty() {
            "no Node has spec.podCIDRs: pass --pod-cidr".to_owned()
        } else {
            format!(
                "covering prefix of the spec.podCIDRs of {} Node(s): {}; a node added later may \
                 get a podCIDR outside it, pass --pod-cidr with the cluster's --cluster-cidr to \
                 cover those",
                nodes.items.len(),
                join(&IpNet::aggregate(&node_cidrs))
            )
        };
        detected.facts.push(Fact {
            what: "pod CIDR",
            value: join(&detected.pod_cidrs),
            source,
        });
    } else {
        detected.pod_cidrs = pod_flag.to_vec();
        detected.facts.push(Fact {
            what: "pod CIDR",
            value: join(pod_flag),
            source: "--pod-cidr".into(),
        });
    }

    // Service CIDR.
    if service_flag.is_empty() {
        let (cidrs, source) = service_cidrs(client).await?;
        detected.service_cidrs = cidrs;
        detected.facts.push(Fact {
            what: "service CIDR",
            value: join(&detected.service_cidrs),
            source,
        });
    } else {
        detected.service_cidrs = service_flag.to_vec();
        detected.facts.push(Fact {
            what: "service CIDR",
            value: join(service_flag),
            source: "--service-cidr".into(),
        });
    }

    // Node subnets.
    let addresses: Vec<IpAddr> = nodes
        .items
        .iter()
        .flat_map(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.addresses.clone())
                .unwrap_or_default()
        })
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    detected.node_subnets = node_subnets(&addresses);
    detected.facts.push(Fact {
        what: "node subnets",
        value: if detected.node_subnets.is_empty() {
            "none".into()
        } else {
            join(&detected.node_subnets)
        },
        source: format!(
            "the /{NODE_SUBNET_PREFIX_V4} (IPv6: /{NODE_SUBNET_PREFIX_V6}) around the InternalIP \
             of each of {} Node(s), reserved from IPAM; Nodes carry no prefix length, add \
             wider subnets with --reserved",
            nodes.items.len()
        ),
    });
    Ok(detected)
}

/// The service CIDRs from the ServiceCIDR objects (networking.k8s.io v1, else v1beta1) when
/// the API server serves them, else the inference from the `kubernetes` Service.
async fn service_cidrs(client: &kube::Client) -> Result<(Vec<IpNet>, String), kube::Error> {
    for version in ["v1", "v1beta1"] {
        let group_version = format!("networking.k8s.io/{version}");
        let Ok(resources) = client.list_api_group_resources(&group_version).await else {
            continue;
        };
        if !resources.resources.iter().any(|r| r.name == "servicecidrs") {
            continue;
        }
        let resource = ApiResource {
            group: "networking.k8s.io".into(),
            version: version.into(),
            api_version: group_version.clone(),
            kind: "ServiceCIDR".into(),
            plural: "servicecidrs".into(),
        };
        let list = Api::<DynamicObject>::all_with(client.clone(), &resource)
            .list(&ListParams::default())
            .await?;
        let cidrs: Vec<IpNet> = list
            .items
            .iter()
            .filter_map(|o| {
                o.data
                    .pointer("/spec/cidrs")
                    .and_then(|c| c.as_array())
                    .cloned()
            })
            .flatten()
            .filter_map(|c| c.as_str().and_then(|c| c.parse().ok()))
            .collect();
        if !cidrs.is_empty() {
            return Ok((
                IpNet::aggregate(&cidrs),
                format!(
                    "spec.cidrs of {} ServiceCIDR object(s), {group_version}",
                    list.items.len()
                ),
            ));
        }
    }
    let service = Api::<Service>::namespaced(client.clone(), "default")
        .get_opt("kubernetes")
        .await?;
    let mut ips: Vec<IpAddr> = service
        .and_then(|s| s.spec)
        .map(|s| {
            s.cluster_ips
                .unwrap_or_default()
                .into_iter()
                .chain(s.cluster_ip)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    ips.sort();
    ips.dedup();
    let cidrs = IpNet::aggregate(
        &ips.iter()
            .filter_map(|ip| service_from_cluster_ip(*ip))
            .collect(),
    );
    let source = if cidrs.is_empty() {
        "no ServiceCIDR objects and no ClusterIP on Service default/kubernetes: pass --service-cidr"
            .to_owned()
    } else {
        format!(
            "inferred: ClusterIP {} of Service default/kubernetes with the default prefix length \
             /{INFERRED_SERVICE_PREFIX_V4} (IPv6 /{INFERRED_SERVICE_PREFIX_V6}); this API server \
             serves no ServiceCIDR objects; pass --service-cidr if the cluster's \
             --service-cluster-ip-range differs",
            ips.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    Ok((cidrs, source))
}

/// Where peers reach the gateway, and why there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayEndpoint {
    pub address: String,
    pub port: u16,
    /// Where it came from, for the user.
    pub why: String,
    /// A NodePort on a node (no load balancer address yet): worth detecting again once the
    /// gateway pod runs.
    pub node_port: bool,
}

/// Where peers reach the gateway: the Service's load balancer ingress, else its NodePort on
/// a node (see [`node_port_endpoint`]: the node the gateway pod runs on, else one matching
/// `gateway_node_selector`, else the first). `None` when the Service has neither.
pub async fn endpoint(
    client: &kube::Client,
    namespace: &str,
    service: &str,
    gateway_node_selector: &BTreeMap<String, String>,
) -> Result<Option<GatewayEndpoint>, kube::Error> {
    let Some(service) = Api::<Service>::namespaced(client.clone(), namespace)
        .get_opt(service)
        .await?
    else {
        return Ok(None);
    };
    let port = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first().cloned());
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .and_then(|i| i.first())
        .and_then(|i| i.ip.clone().or_else(|| i.hostname.clone()));
    if let (Some(address), Some(port)) = (ingress, &port) {
        return Ok(Some(GatewayEndpoint {
            address,
            port: u16::try_from(port.port).unwrap_or(51820),
            why: "the load balancer ingress of Service kubetun-gateway".into(),
            node_port: false,
        }));
    }
    let Some(node_port) = port.and_then(|p| p.node_port) else {
        return Ok(None);
    };
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let pod_selector = GATEWAY_POD_LABELS
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods = match Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&pod_selector))
        .await
    {
        Ok(list) => list.items,
        // Not allowed to list pods: the rules that need none still apply.
        Err(kube::Error::Api(s)) if s.code == 403 => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(node_port_endpoint(
        u16::try_from(node_port).unwrap_or(51820),
        &pods,
        &nodes,
        gateway_node_selector,
    ))
}

/// The Nodes the gateway pod may run on (`--gateway-node-selector`), as a fact.
pub async fn gateway_nodes(
    client: &kube::Client,
    selector: &BTreeMap<String, String>,
    replicas: usize,
) -> Result<Fact, kube::Error> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    Ok(gateway_nodes_fact(&nodes, selector, replicas))
}

/// The Nodes matching `selector`, and what too few of them mean for `replicas` gateway pods.
pub fn gateway_nodes_fact(
    nodes: &[Node],
    selector: &BTreeMap<String, String>,
    replicas: usize,
) -> Fact {
    let matching = matching_nodes(nodes, selector);
    let labels = selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>();
    let mut source = format!(
        "the Nodes labelled {} (--gateway-node-selector), of {} Node(s)",
        labels.join(","),
        nodes.len()
    );
    if matching.is_empty() {
        source.push_str(&format!(
            "; the gateway pod stays Pending until one is: `kubectl label node <node> {}`",
            labels.join(" ")
        ));
    } else if matching.len() < replicas {
        source.push_str(&format!(
            "; the {replicas} replicas of --ha need as many Nodes (never two on one): {} stay \
             Pending until more are labelled",
            replicas - matching.len()
        ));
    }
    Fact {
        what: "gateway nodes",
        value: if matching.is_empty() {
            "none".into()
        } else {
            matching.join(",")
        },
        source,
    }
}

/// Whether `node` has every label of `selector`.
pub fn matches_selector(node: &Node, selector: &BTreeMap<String, String>) -> bool {
    let labels = node.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The names of the Nodes matching `selector`, sorted.
pub fn matching_nodes(nodes: &[Node], selector: &BTreeMap<String, String>) -> Vec<String> {
    let mut names: Vec<String> = nodes
        .iter()
        .filter(|n| matches_selector(n, selector))
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    names.sort();
    names
}

/// The ExternalIP of the first of `nodes` (by name) that has one, else the InternalIP of the
/// first that has one: `(node, address type, address)`.
fn first_address<'a>(nodes: &[&'a Node]) -> Option<(&'a Node, &'static str, String)> {
    let mut nodes = nodes.to_vec();
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for wanted in ["ExternalIP", "InternalIP"] {
        for node in &nodes {
            let addresses = node.status.as_ref().and_then(|s| s.addresses.as_ref());
            if let Some(address) = addresses.into_iter().flatten().find(|a| a.type_ == wanted) {
                return Some((node, wanted, address.address.clone()));
            }
        }
    }
    None
}

/// The gateway pod peers should reach: scheduled, not being deleted, not finished; a ready
/// one first, then a running one, then by name.
fn gateway_pod(pods: &[Pod]) -> Option<&Pod> {
    let mut candidates: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty())
        })
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .collect();
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    };
    let running = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    candidates.sort_by_key(|p| (!ready(p), !running(p), p.metadata.name.clone()));
    candidates.first().copied()
}

/// The NodePort endpoint. The Service has `externalTrafficPolicy: Local`, so only a node
/// running the gateway pod answers on it: the node of the gateway pod (`pods`, those with the
/// gateway's labels; its node's ExternalIP, else InternalIP, else the pod's `status.hostIP`),
/// else, before the pod is scheduled, the first of the Nodes matching `gateway_node_selector`
/// (when given), else the first Node by name; ExternalIPs before InternalIPs.
pub fn node_port_endpoint(
    node_port: u16,
    pods: &[Pod],
    nodes: &[Node],
    gateway_node_selector: &BTreeMap<String, String>,
) -> Option<GatewayEndpoint> {
    const NO_LB: &str = "Service kubetun-gateway has no load balancer address (yet)";
    const LOCAL: &str = "externalTrafficPolicy: Local, so only a node running the gateway pod \
                         answers";
    const AGAIN: &str = "run kubetun install again once the load balancer has one, or pass \
                         --endpoint-address";
    let found = |address: String, why: String| GatewayEndpoint {
        address,
        port: node_port,
        why,
        node_port: true,
    };
    if let Some(pod) = gateway_pod(pods) {
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        let node: Vec<&Node> = nodes
            .iter()
            .filter(|n| n.metadata.name.as_deref() == Some(node_name))
            .collect();
        if let Some((_, wanted, address)) = first_address(&node) {
            return Some(found(
                address,
                format!(
                    "{NO_LB}: its NodePort on the {wanted} of Node {node_name}, where the gateway \
                     pod {pod_name} runs ({LOCAL}); {AGAIN}"
                ),
            ));
        }
        if let Some(host_ip) = pod
            .status
            .as_ref()
            .and_then(|s| s.host_ip.clone())
            .filter(|ip| !ip.is_empty())
        {
            return Some(found(
                host_ip,
                format!(
                    "{NO_LB}: its NodePort on the status.hostIP of the gateway pod {pod_name} \
                     (Node {node_name}) ({LOCAL}); {AGAIN}"
                ),
            ));
        }
    }
    if !gateway_node_selector.is_empty() {
        let matching: Vec<&Node> = nodes
            .iter()
            .filter(|n| matches_selector(n, gateway_node_selector))
            .collect();
        if let Some((node, wanted, address)) = first_address(&matching) {
            let selector = gateway_node_selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            return Some(found(
                address,
                format!(
                    "{NO_LB}: its NodePort on the {wanted} of Node {}, the first of the {} Node(s) \
                     matching --gateway-node-selector {selector}, as no gateway pod is scheduled \
                     yet ({LOCAL}: with several, the pod may land on another; --wait detects it \
                     again); {AGAIN}",
                    node.metadata.name.as_deref().unwrap_or_default(),
                    matching.len()
                ),
            ));
        }
    }
    let all: Vec<&Node> = nodes.iter().collect();
    let (node, wanted, address) = first_address(&all)?;
    let unmatched = if gateway_node_selector.is_empty() {
        ""
    } else {
        ", no Node matching --gateway-node-selector has an address"
    };
    Some(found(
        address,
        format!(
            "{NO_LB}: its NodePort on the {wanted} of Node {}, the first by name, as no gateway \
             pod is scheduled yet{unmatched} ({LOCAL}: the pod may land on another; --wait \
             detects it again); {AGAIN}",
            node.metadata.name.as_deref().unwrap_or_default()
        ),
    ))
}

#[cfg(test)]
mod tests;
