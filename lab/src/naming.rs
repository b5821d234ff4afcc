//! Names of everything the lab creates, derived from the cluster names and an optional prefix,
//! so that several labs (e.g. tests running in parallel next to a user's lab) never collide.
//!
//! Without a prefix: namespaces `<cluster>-gw`, `<cluster>-pod<N>`, `<cluster>-ext<N>` and
//! `kt-underlay`, TUN devices `kt-<cluster>`; multi-node clusters have `<cluster>-l2` (their
//! L2), `<cluster>-node<I>` and `<cluster>-node<I>-pod<N>` instead of the gateway and pods. With prefix `t1`: `t1-<cluster>-gw`, …,
//! `t1-kt-underlay`, `t1-kt-<cluster>`. A lab with real control planes adds the host end of a
//! veth per DNS-serving cluster, `kd-<cluster>` (see `ClusterState::dns_link`). Cluster names
//! contain no `-`, so prefixed and unprefixed names never coincide.

use crate::topology::MAX_CLUSTER_NAME;

/// The longest prefix: `<prefix>-kt-<cluster>` must fit the 15-byte interface name limit.
pub const MAX_PREFIX: usize = 15 - 4 - MAX_CLUSTER_NAME;

/// Why a prefix was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "prefix {0:?} must start with a lowercase letter, contain only lowercase letters and digits \
     and have at most {MAX_PREFIX} characters"
)]
pub struct PrefixError(pub String);

/// Derives namespace, interface and file names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    prefix: String,
}

impl Naming {
    /// Names with `prefix` (empty: the user's lab).
    pub fn new(prefix: &str) -> Result<Self, PrefixError> {
        let valid = prefix.is_empty()
            || (prefix.len() <= MAX_PREFIX
                && prefix.starts_with(|c: char| c.is_ascii_lowercase())
                && prefix
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        if valid {
            Ok(Self {
                prefix: prefix.to_owned(),
            })
        } else {
            Err(PrefixError(prefix.to_owned()))
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn with_prefix(&self, name: String) -> String {
        if self.prefix.is_empty() {
            name
        } else {
            format!("{}-{name}", self.prefix)
        }
    }

    /// The namespace holding the bridge that joins all gateways.
    pub fn underlay_ns(&self) -> String {
        self.with_prefix("kt-underlay".to_owned())
    }

    /// The gateway namespace of cluster `id`.
    pub fn gateway_ns(&self, id: &str) -> String {
        self.with_prefix(format!("{id}-gw"))
    }

    /// The namespace of pod `n` (1-based) of cluster `id`.
    pub fn pod_ns(&self, id: &str, n: u8) -> String {
        self.with_prefix(format!("{id}-pod{n}"))
    }

    /// The namespace of external endpoint `n` (1-based) of cluster `id`.
    pub fn external_ns(&self, id: &str, n: u8) -> String {
        self.with_prefix(format!("{id}-ext{n}"))
    }

    /// The namespace holding the L2 bridge of multi-node cluster `id`.
    pub fn l2_ns(&self, id: &str) -> String {
        self.with_prefix(format!("{id}-l2"))
    }

    /// The namespace of node `index` (0-based; named from 1) of cluster `id`.
    pub fn node_ns(&self, id: &str, index: u8) -> String {
        self.with_prefix(format!("{id}-{}", node_name(index)))
    }

    /// The namespace of pod `n` (1-based) behind node `index` (0-based) of cluster `id`.
    pub fn node_pod_ns(&self, id: &str, index: u8, n: u8) -> String {
        self.with_prefix(format!("{id}-{}-pod{n}", node_name(index)))
    }

    /// The gateway's TUN device (also names its UAPI and gRPC sockets, which live in the
    /// shared filesystem, so it is unique across labs).
    pub fn tun(&self, id: &str) -> String {
        self.with_prefix(format!("kt-{id}"))
    }
}

/// The name of node `index` (0-based): `node1`, `node2`, …
pub fn node_name(index: u8) -> String {
    format!("node{}", u32::from(index) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unprefixed_names() {
        let naming = Naming::new("").unwrap();
        assert_eq!(naming.gateway_ns("europe"), "europe-gw");
        assert_eq!(naming.pod_ns("rome", 1), "rome-pod1");
        assert_eq!(naming.external_ns("milan", 2), "milan-ext2");
        assert_eq!(naming.underlay_ns(), "kt-underlay");
        assert_eq!(naming.tun("europe"), "kt-europe");
        assert_eq!(naming.node_ns("paris", 0), "paris-node1");
        assert_eq!(naming.node_pod_ns("paris", 2, 1), "paris-node3-pod1");
        assert_eq!(naming.l2_ns("paris"), "paris-l2");
    }

    #[test]
    fn prefixed_names_fit_interface_limits() {
        let naming = Naming::new("t12").unwrap();
        assert_eq!(naming.gateway_ns("rome"), "t12-rome-gw");
        let longest = naming.tun(&"x".repeat(MAX_CLUSTER_NAME));
        assert_eq!(longest.len(), 15, "{longest}");
    }

    #[test]
    fn rejects_bad_prefixes() {
        for bad in ["T1", "1t", "t-1", "toolong", "t 1"] {
            assert!(Naming::new(bad).is_err(), "{bad}");
        }
    }
}
