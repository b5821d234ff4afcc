//! The remap table of every cluster, rendered in the format of the seed topology document:
//!
//! ```text
//! CLUSTER EUROPE
//!
//! Europe -> Rome
//!   Pod CIDR: 10.202.0.0/16 → Remapped to 10.202.0.0/16
//!   External CIDR: 10.70.0.0/16 → Remapped to 10.201.0.0/16
//! ```
//!
//! Each line is a peer's real CIDR and the CIDR this cluster uses for it.

use std::fmt::Write as _;

use kubetun_crds::CidrMapping;
use serde::{Deserialize, Serialize};

/// How one cluster addresses one peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerMapping {
    /// The peer's display name.
    pub peer: String,
    /// The peer's pod CIDRs and this cluster's view of each.
    pub pod_cidrs: Vec<CidrMapping>,
    /// The peer's external CIDRs and this cluster's view of each.
    pub external_cidrs: Vec<CidrMapping>,
}

/// The remap table of one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTable {
    /// The cluster's display name.
    pub cluster: String,
    /// One entry per peer, in link order.
    pub peers: Vec<PeerMapping>,
}

/// Renders the tables of all clusters, one block per cluster.
pub fn render(tables: &[ClusterTable]) -> String {
    let mut out = String::new();
    for (i, table) in tables.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        render_cluster(&mut out, table);
    }
    out
}

fn render_cluster(out: &mut String, table: &ClusterTable) {
    let _ = writeln!(out, "CLUSTER {}", table.cluster.to_uppercase());
    if table.peers.is_empty() {
        let _ = writeln!(out, "\n  (no peers)");
    }
    for peer in &table.peers {
        let _ = writeln!(out, "\n{} -> {}", table.cluster, peer.peer);
        for mapping in &peer.pod_cidrs {
            render_line(out, "Pod CIDR", mapping);
        }
        for mapping in &peer.external_cidrs {
            render_line(out, "External CIDR", mapping);
        }
    }
}

fn render_line(out: &mut String, label: &str, mapping: &CidrMapping) {
    let _ = writeln!(
        out,
        "  {label}: {} → Remapped to {}",
        mapping.real, mapping.view
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(real: &str, view: &str) -> CidrMapping {
        CidrMapping {
            real: real.into(),
            view: view.into(),
        }
    }

    #[test]
    fn renders_the_seed_format() {
        let tables = [
            ClusterTable {
                cluster: "Europe".into(),
                peers: vec![
                    PeerMapping {
                        peer: "Rome".into(),
                        pod_cidrs: vec![mapping("10.202.0.0/16", "10.202.0.0/16")],
                        external_cidrs: vec![mapping("10.70.0.0/16", "10.201.0.0/16")],
                    },
                    PeerMapping {
                        peer: "Milan".into(),
                        pod_cidrs: vec![mapping("10.203.0.0/16", "10.203.0.0/16")],
                        external_cidrs: vec![mapping("10.70.0.0/16", "10.68.0.0/16")],
                    },
                ],
            },
            ClusterTable {
                cluster: "Rome".into(),
                peers: vec![PeerMapping {
                    peer: "Europe".into(),
                    pod_cidrs: vec![mapping("10.200.0.0/16", "10.200.0.0/16")],
                    external_cidrs: vec![mapping("10.70.0.0/16", "10.201.0.0/16")],
                }],
            },
        ];
        let expected = "\
CLUSTER EUROPE

Europe -> Rome
  Pod CIDR: 10.202.0.0/16 → Remapped to 10.202.0.0/16
  External CIDR: 10.70.0.0/16 → Remapped to 10.201.0.0/16

Europe -> Milan
  Pod CIDR: 10.203.0.0/16 → Remapped to 10.203.0.0/16
  External CIDR: 10.70.0.0/16 → Remapped to 10.68.0.0/16

CLUSTER ROME

Rome -> Europe
  Pod CIDR: 10.200.0.0/16 → Remapped to 10.200.0.0/16
  External CIDR: 10.70.0.0/16 → Remapped to 10.201.0.0/16
";
        assert_eq!(render(&tables), expected);
    }

    #[test]
    fn a_cluster_without_peers_says_so() {
        let table = ClusterTable {
            cluster: "Milan".into(),
            peers: vec![],
        };
        assert_eq!(render(&[table]), "CLUSTER MILAN\n\n  (no peers)\n");
    }

    #[test]
    fn several_cidrs_of_a_kind_each_get_a_line() {
        let table = ClusterTable {
            cluster: "Rome".into(),
            peers: vec![PeerMapping {
                peer: "Europe".into(),
                pod_cidrs: vec![
                    mapping("10.200.0.0/16", "10.200.0.0/16"),
                    mapping("fd00:200::/64", "fd00:200::/64"),
                ],
                external_cidrs: vec![],
            }],
        };
        let text = render(&[table]);
        assert_eq!(text.matches("Pod CIDR:").count(), 2);
        assert!(!text.contains("External CIDR"));
    }
}
