//! The connector's [`ConnectError`], whose messages name the cluster, the object and what to do,
//! and [`error_chain`], which prints an error and its sources on one line.

use kubetun_crds::contract::link::{MANAGED_BY_CONNECTOR, MANAGED_BY_LABEL};
use std::time::Duration;

use crate::plumbing::cluster_info::ClusterInfoError;

/// A connector failure. Every message names the cluster (its role and, once known, its id),
/// the object involved and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The cluster info ConfigMap cannot be read.
    #[error("({cluster}) cannot read kubetun's cluster info in namespace {namespace}")]
    ClusterInfo {
        /// Role of the cluster (`local`, `remote`, a leaf name).
        cluster: String,
        namespace: String,
        #[source]
        source: ClusterInfoError,
    },
    /// A ShortcutConnection allows transit, but a leaf is not linked to the hub.
    #[error(
        "transit through the hub needs both leaves linked to it: the hub has no processed NetworkConfig {name} in namespace {namespace} for {leaf} (link the leaf with `kubetun network connect`)"
    )]
    TransitUnlinked {
        leaf: String,
        name: String,
        namespace: String,
    },
    /// Both handles point at the same cluster.
    #[error(
        "({local}) and ({remote}) are the same cluster {id:?}: pass the kubeconfig of two different clusters"
    )]
    SameCluster {
        /// Role of the first handle.
        local: String,
        /// Role of the second handle.
        remote: String,
        /// The shared cluster id.
        id: String,
    },
    /// An API call failed.
    #[error(
        "({cluster}, cluster {cluster_id}) cannot {action} {object} (check that the cluster is reachable \
         and the credentials may manage kubetun resources in that namespace)"
    )]
    Api {
        /// Role of the cluster.
        cluster: String,
        cluster_id: String,
        /// What was attempted (`get`, `apply`, `delete`, ...).
        action: &'static str,
        /// `Kind namespace/name`.
        object: String,
        #[source]
        source: kube::Error,
    },
    /// An object the connector needs exists but someone else made it.
    #[error(
        "({cluster}, cluster {cluster_id}) {object} exists but was not created by the connector (label \
         {MANAGED_BY_LABEL}={MANAGED_BY_CONNECTOR} missing): delete it first if it is stale"
    )]
    NotManaged {
        /// Role of the cluster.
        cluster: String,
        cluster_id: String,
        /// `Kind namespace/name`.
        object: String,
    },
    /// The receiving controller refused a NetworkConfig.
    #[error("({cluster}, cluster {cluster_id}) rejected {object}: {reason}: {message}")]
    Rejected {
        /// Role of the receiving cluster.
        cluster: String,
        /// Id of the receiving cluster.
        cluster_id: String,
        /// `Kind namespace/name`.
        object: String,
        /// Condition reason.
        reason: String,
        /// Condition message.
        message: String,
    },
    /// A wait ran out of time.
    #[error(
        "({cluster}, cluster {cluster_id}) timed out after {timeout:?} waiting for {what} (last seen: {last}); \
         check that kubetun-controller runs in both clusters and that each gateway endpoint is reachable \
         from the other, or raise --timeout"
    )]
    Timeout {
        /// Role of the cluster waited on.
        cluster: String,
        cluster_id: String,
        what: String,
        timeout: Duration,
        /// The last observed state.
        last: String,
    },
    /// `reset` could not clean any of the two clusters.
    #[error("nothing was reset: {0}")]
    NothingReset(String),
    /// The API server answered a TokenRequest without a token or its expiry.
    #[error("({cluster}) the API server issued no token for ServiceAccount {service_account}")]
    NoToken {
        /// Role of the cluster.
        cluster: String,
        /// `namespace/name`.
        service_account: String,
    },
    /// Deleted objects are still there after the wait, held by finalizers.
    #[error(
        "({cluster}, cluster {cluster_id}) still terminating after {timeout:?}: {objects}; \
         deletion completes once kubetun-controller in that cluster runs and releases them \
         (run the command again to wait longer)"
    )]
    StillTerminating {
        /// Role of the cluster.
        cluster: String,
        cluster_id: String,
        /// Each object with the finalizers holding it.
        objects: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// A link a hub's ShortcutConnection manages would be broken by a direct disconnect.
    #[error(
        "({cluster}, cluster {cluster_id}) the link to {peer_id} belongs to ShortcutConnection \
         {shortcut} on hub {hub}: disconnecting here breaks that shortcut (its tunnels go down \
         and the hub's operator re-creates the link). Delete it on the hub (`kubetun shortcut \
         delete`), or pass --force to disconnect anyway"
    )]
    OwnedByShortcut {
        /// Role of the cluster where the link was found.
        cluster: String,
        cluster_id: String,
        peer_id: String,
        /// `namespace/name` of the ShortcutConnection on the hub.
        shortcut: String,
        /// The hub's cluster id.
        hub: String,
    },
}

pub use crate::plumbing::runtime::error_chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle repeats: {0}")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn error_chains_join_causes_once() {
        let error = Outer(Middle(std::io::Error::other("connection refused")));
        assert_eq!(
            error_chain(&error),
            "outer: middle repeats: connection refused"
        );
    }
}
