//! Lab topologies: which clusters exist (pod and external CIDRs, how many nodes, pods and
//! external endpoints each has), the underlay that joins their gateways, and which clusters are
//! linked — first the hub `links`, then the leaf-to-leaf `shortcuts` and the leaf pairs linked
//! only through their hub (`hubOnly`).
//!
//! A cluster with `nodes: 1` (the default) is one gateway namespace with its pods behind it. With
//! `nodes: N >= 2` it has N node namespaces on one cluster L2 at [`NODE_NETWORK`], node `i`
//! holding the `i`-th of N equal slices of the pod CIDR (rounded up to a power of two) with
//! `pods` pods behind it; the external endpoints sit behind the first node.
//!
//! A topology is a YAML file; [`Topology::seed`] is the built-in Europe/Rome/Milan topology
//! (`examples/seed.yaml`). Parsing validates everything the lab relies on, so a bad file fails
//! before any namespace exists.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::service_demo::ServiceDemo;

/// The seed topology (Europe hub; Rome and Milan leaves; all with external CIDR 10.70.0.0/16).
pub const SEED_YAML: &str = include_str!("../../examples/seed.yaml");
/// Two multi-node clusters with identical pod and external CIDRs (`examples/multinode.yaml`).
pub const MULTINODE_YAML: &str = include_str!("../../examples/multinode.yaml");

/// Host offset of the gateway's own address in every local CIDR (`.1`).
pub const GATEWAY_HOST: u32 = 1;
/// Host offset of the first pod or external endpoint; endpoint `n` (1-based) gets
/// `FIRST_ENDPOINT_HOST + n - 1`.
pub const FIRST_ENDPOINT_HOST: u32 = 11;
/// The most pods or external endpoints a cluster may have.
pub const MAX_ENDPOINTS: u8 = 32;
/// The longest cluster name: namespace and interface names are derived from it and an
/// interface name has at most 15 bytes.
pub const MAX_CLUSTER_NAME: usize = 8;
/// UDP port every lab gateway listens on (each in its own namespace).
pub const GATEWAY_PORT: u16 = 51820;
/// The most nodes a cluster may have.
pub const MAX_NODES: u8 = 8;
/// The node network of every multi-node cluster (each cluster has its own L2, so they may all
/// use the same one). RFC 6598 shared space: outside the RFC 1918 pools IPAM remaps into, so
/// it is never a view.
pub const NODE_NETWORK: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(100, 64, 0, 0), 24);
/// Host offset of node 0 in [`NODE_NETWORK`]; node `i` (0-based) gets `FIRST_NODE_HOST + i`.
pub const FIRST_NODE_HOST: u32 = 11;

/// Why a topology was rejected.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// Not valid YAML, or fields of the wrong type.
    #[error("topology is not valid YAML: {0}")]
    Yaml(serde_yaml::Error),
    /// No clusters.
    #[error("topology has no clusters")]
    NoClusters,
    /// A cluster name cannot be used in namespace and interface names.
    #[error(
        "cluster name {0:?} must start with a letter, contain only ASCII letters and digits and \
         have at most {MAX_CLUSTER_NAME} characters"
    )]
    ClusterName(String),
    /// Two clusters have the same name (case-insensitively).
    #[error("cluster {0:?} is defined twice")]
    DuplicateCluster(String),
    /// A CIDR has host bits set.
    #[error("{context}: {value} has host bits set (did you mean {canonical}?)")]
    HostBits {
        /// Where it was found.
        context: String,
        /// The value as written.
        value: Ipv4Net,
        /// The value with host bits cleared.
        canonical: Ipv4Net,
    },
    /// A CIDR is too small for the addresses the lab assigns in it.
    #[error("{context}: {cidr} is too small for {needed} addresses")]
    TooSmall {
        /// Where it was found.
        context: String,
        cidr: Ipv4Net,
        /// How many host addresses are needed.
        needed: u32,
    },
    /// Two CIDRs that must be disjoint overlap.
    #[error("{first} overlaps {second}")]
    Overlap {
        /// The first CIDR, with where it was found.
        first: String,
        /// The second CIDR, with where it was found.
        second: String,
    },
    /// External endpoints without an external CIDR, or too many endpoints.
    #[error("cluster {cluster}: {message}")]
    Endpoints {
        cluster: String,
        /// What is wrong.
        message: String,
    },
    /// The `service` section does not fit the topology.
    #[error("service: {0}")]
    Service(String),
    /// A link names a cluster that does not exist.
    #[error("{kind} {a} <-> {b}: unknown cluster {unknown:?}")]
    UnknownCluster {
        /// `link`, `shortcut` or `hub-only`.
        kind: &'static str,
        /// First end.
        a: String,
        /// Second end.
        b: String,
        /// The name that matched no cluster.
        unknown: String,
    },
    /// A link joins a cluster to itself.
    #[error("{kind} {name} <-> {name} joins a cluster to itself")]
    SelfLink {
        /// `link`, `shortcut` or `hub-only`.
        kind: &'static str,
        /// The cluster.
        name: String,
    },
    /// A pair that goes through a hub has none: no cluster is linked to both.
    #[error("{kind} {a} <-> {b}: no cluster is linked to both, to carry their traffic")]
    NoHub {
        /// `shortcut` (with `transit`) or `hub-only`.
        kind: &'static str,
        /// First end.
        a: String,
        /// Second end.
        b: String,
    },
    /// The same pair of clusters is linked twice.
    #[error("{a} <-> {b} is linked twice")]
    DuplicateLink {
        /// First end.
        a: String,
        /// Second end.
        b: String,
    },
    /// The tunnel MTU is out of range.
    #[error("mtu {0} is outside 1280..=9000")]
    Mtu(u32),
    /// Too few or too many nodes, or a pod CIDR too small to give each node a slice.
    #[error("cluster {cluster}: {message}")]
    Nodes {
        cluster: String,
        /// What is wrong.
        message: String,
    },
}

/// A topology as written in YAML.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Topology {
    /// A short description printed by the lab.
    #[serde(default)]
    pub description: String,
    /// The network joining the gateways (one address per gateway, in cluster order from
    /// `.1`). Keep it outside the private pools IPAM hands out (e.g. 198.18.0.0/24, RFC 2544).
    pub underlay: Ipv4Net,
    /// Tunnel MTU of every gateway.
    #[serde(default = "default_mtu")]
    pub mtu: u32,
    /// The clusters, in order (the first one gets the first underlay address).
    pub clusters: Vec<ClusterSpec>,
    /// Links set up first (e.g. hub to leaves).
    #[serde(default)]
    pub links: Vec<LinkSpec>,
    /// Links added afterwards, each re-applying both ends (leaf-to-leaf shortcuts).
    #[serde(default)]
    pub shortcuts: Vec<LinkSpec>,
    /// The shortcuts fall back through the hub linked to both leaves while they are down
    /// (a ShortcutConnection with `transit`), at the same addresses.
    #[serde(default)]
    pub transit: bool,
    /// Leaf pairs without a tunnel of their own, linked through the hub linked to both (a
    /// ShortcutConnection with `hubOnly`), at the addresses a shortcut would give.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hub_only: Vec<LinkSpec>,
    /// A Service exported across the clusters and fetched by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceDemo>,
}

fn default_mtu() -> u32 {
    1420
}

fn default_one() -> u8 {
    1
}

fn is_one(value: &u8) -> bool {
    *value == 1
}

/// One cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    /// Display name (e.g. `Europe`); its lowercase form names namespaces and interfaces.
    pub name: String,
    /// The cluster's pod CIDR.
    pub pod_cidr: Ipv4Net,
    /// The cluster's external CIDR (non-pod endpoints reachable through its gateway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_cidr: Option<Ipv4Net>,
    /// How many nodes: 1 is a single gateway namespace with everything behind it; 2 or more
    /// are node namespaces on one cluster L2, the gateway running on one of them.
    #[serde(default = "default_one", skip_serializing_if = "is_one")]
    pub nodes: u8,
    /// How a multi-node cluster's nodes reach the gateway's node: `direct` (over the shared
    /// L2) or `overlay` (through the route agent's VXLAN device).
    #[serde(default, skip_serializing_if = "NodeHop::is_direct")]
    pub node_hop: NodeHop,
    /// How many pod namespaces to create (behind each node when there are several).
    #[serde(default = "default_one")]
    pub pods: u8,
    /// How many external-endpoint namespaces to create (needs `externalCidr`).
    #[serde(default = "default_one")]
    pub externals: u8,
}

impl ClusterSpec {
    /// The lowercase identifier used in namespace and interface names and as the cluster ID.
    pub fn id(&self) -> String {
        self.name.to_ascii_lowercase()
    }

    /// The gateway's own address in the pod CIDR.
    pub fn gateway_pod_address(&self) -> Ipv4Addr {
        host(self.pod_cidr, GATEWAY_HOST)
    }

    /// The gateway's own address in the external CIDR.
    pub fn gateway_external_address(&self) -> Option<Ipv4Addr> {
        self.external_cidr.map(|cidr| host(cidr, GATEWAY_HOST))
    }

    /// The address of pod `n` (1-based).
    pub fn pod_address(&self, n: u8) -> Ipv4Addr {
        host(self.pod_cidr, endpoint_host(n))
    }

    /// The address of external endpoint `n` (1-based), if the cluster has an external CIDR.
    pub fn external_address(&self, n: u8) -> Option<Ipv4Addr> {
        self.external_cidr.map(|cidr| host(cidr, endpoint_host(n)))
    }

    /// True when the cluster has two or more node namespaces.
    pub fn is_multi_node(&self) -> bool {
        self.nodes >= 2
    }

    /// The slice of the pod CIDR that node `index` (0-based) holds: the pod CIDR split into the
    /// smallest power of two of equal parts that is at least the number of nodes.
    pub fn node_pod_cidr(&self, index: u8) -> Ipv4Net {
        let bits = u32::from(self.nodes.max(1))
            .next_power_of_two()
            .trailing_zeros();
        let len = u32::from(self.pod_cidr.prefix_len()) + bits;
        let size = 1u32.checked_shl(32 - len).unwrap_or(0);
        let network = u32::from(self.pod_cidr.network()) + u32::from(index) * size;
        Ipv4Net::new_assert(Ipv4Addr::from(network), len as u8)
    }

    /// The underlay (InternalIP) address of node `index` (0-based) on [`NODE_NETWORK`].
    pub fn node_address(&self, index: u8) -> Ipv4Addr {
        host(NODE_NETWORK, FIRST_NODE_HOST + u32::from(index))
    }

    /// The address of pod `n` (1-based) behind node `index` (0-based).
    pub fn node_pod_address(&self, index: u8, n: u8) -> Ipv4Addr {
        host(self.node_pod_cidr(index), endpoint_host(n))
    }
}

/// How the route agent sends a node's traffic for remote clusters to the gateway's node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeHop {
    /// `via <gateway node IP>` over the shared L2.
    #[default]
    Direct,
    /// Over the agent's VXLAN device (`kubetun.vxlan`).
    Overlay,
}

impl NodeHop {
    /// True for [`NodeHop::Direct`].
    pub fn is_direct(&self) -> bool {
        *self == Self::Direct
    }
}

/// Two clusters to link, written `[Europe, Rome]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkSpec(pub String, pub String);

impl Topology {
    /// Parses and validates a topology.
    pub fn from_yaml(text: &str) -> Result<Self, TopologyError> {
        let topology: Topology = serde_yaml::from_str(text).map_err(TopologyError::Yaml)?;
        topology.validate()?;
        Ok(topology)
    }

    /// The built-in seed topology.
    pub fn seed() -> Self {
        Self::from_yaml(SEED_YAML).expect("examples/seed.yaml is a valid topology")
    }

    /// Checks everything the lab relies on; see [`TopologyError`] for the rules.
    pub fn validate(&self) -> Result<(), TopologyError> {
        if self.clusters.is_empty() {
            return Err(TopologyError::NoClusters);
        }
        if !(1280..=9000).contains(&self.mtu) {
            return Err(TopologyError::Mtu(self.mtu));
        }
        check_canonical("underlay", self.underlay)?;
        check_size("underlay", self.underlay, self.clusters.len() as u32)?;
        let multi_node = self.clusters.iter().any(ClusterSpec::is_multi_node);
        if multi_node && overlaps(self.underlay, NODE_NETWORK) {
            return Err(TopologyError::Overlap {
                first: format!("underlay {}", self.underlay),
                second: format!("the node network {NODE_NETWORK}"),
            });
        }

        let mut ids = HashSet::new();
        for cluster in &self.clusters {
            validate_cluster(cluster)?;
            if !ids.insert(cluster.id()) {
                return Err(TopologyError::DuplicateCluster(cluster.name.clone()));
            }
            for (kind, cidr) in cluster_cidrs(cluster) {
                if overlaps(cidr, self.underlay) {
                    return Err(TopologyError::Overlap {
                        first: format!("underlay {}", self.underlay),
                        second: format!("{} {kind} CIDR {cidr}", cluster.name),
                    });
                }
                if cluster.is_multi_node() && overlaps(cidr, NODE_NETWORK) {
                    return Err(TopologyError::Overlap {
                        first: format!("the node network {NODE_NETWORK}"),
                        second: format!("{} {kind} CIDR {cidr}", cluster.name),
                    });
                }
            }
        }

        let mut pairs = HashSet::new();
        for (kind, link) in self.all_links() {
            let a = self.cluster(&link.0);
            let b = self.cluster(&link.1);
            for (name, found) in [(&link.0, a), (&link.1, b)] {
                if found.is_none() {
                    return Err(TopologyError::UnknownCluster {
                        kind,
                        a: link.0.clone(),
                        b: link.1.clone(),
                        unknown: name.clone(),
                    });
                }
            }
            let (a, b) = (link.0.to_ascii_lowercase(), link.1.to_ascii_lowercase());
            if a == b {
                return Err(TopologyError::SelfLink {
                    kind,
                    name: link.0.clone(),
                });
            }
            let pair = if a < b { (a, b) } else { (b, a) };
            if !pairs.insert(pair) {
                return Err(TopologyError::DuplicateLink {
                    a: link.0.clone(),
                    b: link.1.clone(),
                });
            }
            let needs_hub = kind == "hub-only" || (kind == "shortcut" && self.transit);
            if needs_hub && self.hub_of(&link.0, &link.1).is_none() {
                return Err(TopologyError::NoHub {
                    kind,
                    a: link.0.clone(),
                    b: link.1.clone(),
                });
            }
        }
        if let Some(service) = &self.service {
            service.validate(self).map_err(TopologyError::Service)?;
        }
        Ok(())
    }

    /// The cluster named `name` (case-insensitively).
    pub fn cluster(&self, name: &str) -> Option<&ClusterSpec> {
        self.clusters
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case(name))
    }

    /// Index of the cluster named `name` (case-insensitively).
    pub fn cluster_index(&self, name: &str) -> Option<usize> {
        self.clusters
            .iter()
            .position(|c| c.name.eq_ignore_ascii_case(name))
    }

    /// The underlay address of the gateway of cluster `index`.
    pub fn underlay_address(&self, index: usize) -> Ipv4Addr {
        host(self.underlay, index as u32 + 1)
    }

    /// The cluster linked to both `a` and `b` (the hub that owns their shortcut).
    pub fn hub_of(&self, a: &str, b: &str) -> Option<String> {
        let linked = |x: &str, y: &str| {
            self.links.iter().any(|l| {
                (l.0.eq_ignore_ascii_case(x) && l.1.eq_ignore_ascii_case(y))
                    || (l.0.eq_ignore_ascii_case(y) && l.1.eq_ignore_ascii_case(x))
            })
        };
        self.clusters
            .iter()
            .find(|c| linked(&c.name, a) && linked(&c.name, b))
            .map(|c| c.name.clone())
    }

    /// The leaf pairs of the second phase: each shortcut, then each pair only its hub links
    /// (`true`).
    pub fn leaf_pairs(&self) -> impl Iterator<Item = (&LinkSpec, bool)> {
        self.shortcuts
            .iter()
            .map(|l| (l, false))
            .chain(self.hub_only.iter().map(|l| (l, true)))
    }

    /// Whether there is a second phase (shortcuts or pairs through a hub).
    pub fn has_leaf_pairs(&self) -> bool {
        self.leaf_pairs().next().is_some()
    }

    /// Every link with its kind (`link` first, then `shortcut`, then `hub-only`).
    pub fn all_links(&self) -> impl Iterator<Item = (&'static str, &LinkSpec)> {
        self.links
            .iter()
            .map(|l| ("link", l))
            .chain(self.shortcuts.iter().map(|l| ("shortcut", l)))
            .chain(self.hub_only.iter().map(|l| ("hub-only", l)))
    }

    /// The peers of cluster `name` over `links`, plus over `shortcuts` and `hubOnly` when
    /// `with_shortcuts`, in link order.
    pub fn peers_of(&self, name: &str, with_shortcuts: bool) -> Vec<&ClusterSpec> {
        let links = self.links.iter().chain(
            self.shortcuts
                .iter()
                .chain(&self.hub_only)
                .filter(move |_| with_shortcuts),
        );
        links
            .filter_map(|link| {
                if link.0.eq_ignore_ascii_case(name) {
                    self.cluster(&link.1)
                } else if link.1.eq_ignore_ascii_case(name) {
                    self.cluster(&link.0)
                } else {
                    None
                }
            })
            .collect()
    }
}

fn validate_cluster(cluster: &ClusterSpec) -> Result<(), TopologyError> {
    let name = &cluster.name;
    let valid_name = name.len() <= MAX_CLUSTER_NAME
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric());
    if !valid_name {
        return Err(TopologyError::ClusterName(name.clone()));
    }
    if cluster.pods > MAX_ENDPOINTS || cluster.externals > MAX_ENDPOINTS {
        return Err(TopologyError::Endpoints {
            cluster: name.clone(),
            message: format!("at most {MAX_ENDPOINTS} pods and {MAX_ENDPOINTS} externals"),
        });
    }
    if cluster.nodes == 0 || cluster.nodes > MAX_NODES {
        return Err(TopologyError::Nodes {
            cluster: name.clone(),
            message: format!("nodes must be 1..={MAX_NODES}"),
        });
    }
    let needed = endpoint_host(cluster.pods.max(cluster.externals).max(1));
    check_canonical(&format!("{name} pod CIDR"), cluster.pod_cidr)?;
    check_size(&format!("{name} pod CIDR"), cluster.pod_cidr, needed)?;
    if cluster.is_multi_node() {
        let bits = u32::from(cluster.nodes)
            .next_power_of_two()
            .trailing_zeros();
        if u32::from(cluster.pod_cidr.prefix_len()) + bits > 30 {
            return Err(TopologyError::Nodes {
                cluster: name.clone(),
                message: format!(
                    "pod CIDR {} is too small to give each of {} nodes a slice",
                    cluster.pod_cidr, cluster.nodes
                ),
            });
        }
        let slice = cluster.node_pod_cidr(0);
        check_size(
            &format!("{name} pod CIDR slice of a node"),
            slice,
            endpoint_host(cluster.pods.max(1)),
        )?;
    }
    match cluster.external_cidr {
        Some(cidr) => {
            check_canonical(&format!("{name} external CIDR"), cidr)?;
            check_size(&format!("{name} external CIDR"), cidr, needed)?;
            if cidr.contains(&cluster.pod_cidr.network())
                || cluster.pod_cidr.contains(&cidr.network())
            {
                return Err(TopologyError::Overlap {
                    first: format!("{name} pod CIDR {}", cluster.pod_cidr),
                    second: format!("{name} external CIDR {cidr}"),
                });
            }
        }
        None if cluster.externals > 0 => {
            return Err(TopologyError::Endpoints {
                cluster: name.clone(),
                message: format!(
                    "{} external endpoints need an externalCidr (or set externals: 0)",
                    cluster.externals
                ),
            });
        }
        None => {}
    }
    Ok(())
}

fn overlaps(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

fn cluster_cidrs(cluster: &ClusterSpec) -> impl Iterator<Item = (&'static str, Ipv4Net)> {
    std::iter::once(("pod", cluster.pod_cidr)).chain(cluster.external_cidr.map(|c| ("external", c)))
}

fn check_canonical(context: &str, cidr: Ipv4Net) -> Result<(), TopologyError> {
    if cidr.trunc() == cidr {
        Ok(())
    } else {
        Err(TopologyError::HostBits {
            context: context.to_owned(),
            value: cidr,
            canonical: cidr.trunc(),
        })
    }
}

/// Usable host offsets are 1..=2^(32-len)-2 (no network or broadcast address).
fn check_size(context: &str, cidr: Ipv4Net, needed: u32) -> Result<(), TopologyError> {
    let host_bits = 32 - u32::from(cidr.prefix_len());
    let usable = if host_bits >= 32 {
        u32::MAX
    } else {
        (1u32 << host_bits).saturating_sub(2)
    };
    if needed <= usable {
        Ok(())
    } else {
        Err(TopologyError::TooSmall {
            context: context.to_owned(),
            cidr,
            needed,
        })
    }
}

fn endpoint_host(n: u8) -> u32 {
    FIRST_ENDPOINT_HOST + u32::from(n.max(1)) - 1
}

/// The address at host offset `offset` inside `cidr`.
pub fn host(cidr: Ipv4Net, offset: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(cidr.network()) | (offset & !u32::from(cidr.netmask())))
}

/// The address in `view` with the same host bits as `addr` has in its own prefix: where a
/// cluster reaches `addr` of a peer whose prefix it sees as `view`.
pub fn translate(addr: Ipv4Addr, view: Ipv4Net) -> Ipv4Addr {
    let host_bits = u32::from(addr) & !u32::from(view.netmask());
    Ipv4Addr::from(u32::from(view.network()) | host_bits)
}

/// The Service demo checked against the topology it is exported in.
impl ServiceDemo {
    /// Checks the demo against `topology`; the error says what is wrong.
    pub fn validate(&self, topology: &Topology) -> Result<(), String> {
        for (what, value) in [("name", &self.name), ("namespace", &self.namespace)] {
            if !is_dns_label(value) {
                return Err(format!(
                    "{what} {value:?} is not a DNS label (lowercase letters, digits and '-', at \
                     most 63 characters)"
                ));
            }
        }
        let client = topology
            .cluster(&self.client)
            .ok_or_else(|| format!("client {:?} is not a cluster", self.client))?;
        if client.pods == 0 || client.is_multi_node() {
            return Err(format!(
                "client {} must be a single-node cluster with a pod",
                client.name
            ));
        }
        if self.exporters.is_empty() {
            return Err("no exporters".to_owned());
        }
        for (index, name) in self.exporters.iter().enumerate() {
            let exporter = topology
                .cluster(name)
                .ok_or_else(|| format!("exporter {name:?} is not a cluster"))?;
            if exporter.external_cidr.is_none() || exporter.externals == 0 {
                return Err(format!(
                    "exporter {name} has no external endpoint to serve the Service"
                ));
            }
            if exporter.id() == client.id() {
                return Err(format!("{name} is both exporter and client"));
            }
            if self.exporters[..index]
                .iter()
                .any(|other| other.eq_ignore_ascii_case(name))
            {
                return Err(format!("exporter {name} is listed twice"));
            }
            let linked = topology.all_links().any(|(_, link)| {
                let ends = [&link.0, &link.1];
                ends.iter().any(|e| e.eq_ignore_ascii_case(name))
                    && ends.iter().any(|e| e.eq_ignore_ascii_case(&self.client))
            });
            if !linked {
                return Err(format!(
                    "exporter {name} is not linked to the client {} (link, shortcut or hub-only)",
                    client.name
                ));
            }
        }
        Ok(())
    }
}

fn is_dns_label(value: &str) -> bool {
    (1..=63).contains(&value.len())
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !value.starts_with('-')
        && !value.ends_with('-')
}

#[cfg(test)]
mod tests;
