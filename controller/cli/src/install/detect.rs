//! What `kubetun install` reads from the cluster, each fact with where it came from: the pod
//! CIDRs (the Nodes' `spec.podCIDRs`), the service CIDR (`ServiceCIDR` objects, else inferred
//! from the `kubernetes` Service), the node subnets (the Nodes' InternalIPs), the endpoint
//! (the gateway Service's load balancer, else a NodePort on a node). The range arithmetic and
//! the overlap check are pure.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::ApiResource;

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

/// Where peers reach the gateway: the Service's load balancer ingress, else its NodePort on
/// a node's ExternalIP (else InternalIP; the first Node by name). `None` when the Service
/// has neither.
pub async fn endpoint(
    client: &kube::Client,
    namespace: &str,
    service: &str,
) -> Result<Option<(String, u16, String)>, kube::Error> {
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
        return Ok(Some((
            address,
            u16::try_from(port.port).unwrap_or(51820),
            "the load balancer ingress of Service kubetun-gateway".into(),
        )));
    }
    let Some(node_port) = port.and_then(|p| p.node_port) else {
        return Ok(None);
    };
    let mut nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for wanted in ["ExternalIP", "InternalIP"] {
        for node in &nodes {
            let addresses = node
                .status
                .as_ref()
                .and_then(|s| s.addresses.clone())
                .unwrap_or_default();
            if let Some(address) = addresses.iter().find(|a| a.type_ == wanted) {
                return Ok(Some((
                    address.address.clone(),
                    u16::try_from(node_port).unwrap_or(51820),
                    format!(
                        "Service kubetun-gateway has no load balancer address (yet): its NodePort \
                         on the {wanted} of Node {}; run kubetun install again once the load \
                         balancer has one, or pass --endpoint-address",
                        node.metadata.name.as_deref().unwrap_or_default()
                    ),
                )));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn node_pod_cidrs_are_covered_per_family() {
        assert_eq!(
            covering(&nets(&[
                "10.244.0.0/24",
                "10.244.1.0/24",
                "10.244.3.0/24",
                "fd00::/64"
            ])),
            nets(&["10.244.0.0/22", "fd00::/64"])
        );
    }

    #[test]
    fn node_addresses_give_their_subnets() {
        let ips: Vec<IpAddr> = ["192.168.1.10", "192.168.1.11", "192.168.0.5"]
            .iter()
            .map(|i| i.parse().unwrap())
            .collect();
        assert_eq!(node_subnets(&ips), nets(&["192.168.0.0/23"]));
    }

    #[test]
    fn overlaps_are_named_with_both_ranges() {
        let pod = nets(&["10.0.0.0/8"]);
        let node = nets(&["10.1.2.0/24"]);
        let service = nets(&["172.20.0.0/16"]);
        let error = check_overlaps(&[
            ("pod CIDR", &pod),
            ("service CIDR", &service),
            ("node subnet", &node),
        ])
        .unwrap_err();
        assert!(
            error.contains("the pod CIDR 10.0.0.0/8 overlaps the node subnet 10.1.2.0/24"),
            "{error}"
        );
        assert_eq!(
            service_from_cluster_ip("10.96.0.1".parse().unwrap()),
            Some("10.96.0.0/12".parse().unwrap())
        );
    }
}
