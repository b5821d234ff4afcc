//! The ShortcutConnection operator: runs on the hub and links two leaf clusters directly,
//! with the same [`Connector`] the `kubetun network` CLI uses.
//!
//! For each ShortcutConnection it builds a client per leaf (by default from the kubeconfig
//! Secrets the spec names; injectable through [`LeafClients`]), runs one non-blocking
//! [`Connector::sync`] pass and writes, with server-side apply on the status, how each leaf
//! sees the other (every CIDR and its remapped CIDR) and each tunnel's state. A finalizer
//! tears the link down on both leaves when the ShortcutConnection is deleted, then deletes
//! the kubeconfig Secrets `kubetun shortcut create` made for it (their owner reference only
//! helps where a garbage collector runs). A leaf that cannot be reached shows up as a
//! `LeafReachable=False` condition and is retried with exponential backoff.
//!
//! The operator reacts to events, not a timer: besides its own objects and the labelled
//! kubeconfig Secrets, it watches, through each shortcut's leaf clients, the leaves'
//! NetworkConfigs and TunnelEndpoints ([`LeafWatches`]) and reconciles the shortcut when one
//! changes in a way that can change the outcome (processed, rejected, connection state).
//! The requeue intervals are only a safety net. An error that changes the condition is also
//! a Warning Event on the ShortcutConnection.
//!
//! A controller that is not the hub runs [`run_not_hub`] instead: every ShortcutConnection
//! there gets `Ready=False` (`NotHub`) and an Event saying it belongs on the hub.
//!
//! [`Connector`]: crate::connector::Connector
//! [`Connector::sync`]: crate::connector::Connector::sync

mod intervals;
mod leaf;
mod not_hub;
mod reconcile;
mod status;
mod watch;

use kube::ResourceExt as _;
use kube::runtime::finalizer;
use kubetun_crds::ShortcutConnection;
use kubetun_crds::contract::shortcut::{FINALIZER, LEAF_REACHABLE, READY, reason};

use crate::connector;

pub use intervals::Intervals;
pub use leaf::{LeafClients, LeafError, SecretKubeconfigs};
pub use not_hub::{
    NotHub, NotHubContext, explain as explain_not_hub, not_hub_message, run_not_hub,
};
pub use reconcile::{Context, Operator, reconcile, run};
pub use status::status_from;
pub use watch::LeafWatches;

/// Fails unless the API server serves ShortcutConnections here (one list of one object).
async fn require_crd(shortcuts: &kube::Api<ShortcutConnection>) -> Result<(), ShortcutError> {
    shortcuts
        .list(&kube::api::ListParams::default().limit(1))
        .await
        .map(drop)
        .map_err(|source| ShortcutError::Hub {
            action: "list ShortcutConnections (is the CRD installed?)".to_owned(),
            source,
        })
}

/// Field manager of the operator's status writes.
pub const FIELD_MANAGER: &str = "kubetun-shortcut";

/// A failure of the operator.
#[derive(Debug, thiserror::Error)]
pub enum ShortcutError {
    /// A leaf client cannot be built.
    #[error(transparent)]
    Leaf(#[from] LeafError),
    /// The connector failed on a leaf.
    #[error(transparent)]
    Connector(#[from] connector::ConnectError),
    /// The hub's API failed.
    #[error("hub: cannot {action}")]
    Hub {
        /// What was attempted.
        action: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The finalizer could not be added or removed.
    #[error("finalizer {FINALIZER}")]
    Finalizer(#[source] Box<finalizer::Error<ShortcutError>>),
    /// The object has no namespace (the CRD is namespaced; this is a bug elsewhere).
    #[error("ShortcutConnection {0} has no namespace")]
    NoNamespace(String),
}

impl crate::plumbing::runtime::ReconcileError for ShortcutError {
    /// The hub's API server being away (see [`crate::plumbing::runtime::is_transient`]).
    fn is_transient(&self) -> bool {
        matches!(self, Self::Hub { source, .. } if crate::plumbing::runtime::is_transient(source))
    }

    fn metric_label(&self) -> &'static str {
        match self {
            Self::Leaf(_) => "leaf",
            Self::Connector(_) => "connector",
            Self::Hub { .. } => "hub",
            Self::Finalizer(_) => "finalizer",
            Self::NoNamespace(_) => "no_namespace",
        }
    }
}

impl ShortcutError {
    /// Condition type and reason describing this error.
    fn condition(&self) -> (&'static str, &'static str) {
        match self {
            Self::Leaf(leaf) => (LEAF_REACHABLE, leaf.reason),
            Self::Connector(connector::ConnectError::ClusterInfo { source, .. }) => match source {
                crate::plumbing::cluster_info::ClusterInfoError::Kube(_) => {
                    (LEAF_REACHABLE, reason::LEAF_UNREACHABLE)
                }
                _ => (READY, reason::KUBETUN_MISSING),
            },
            Self::Connector(connector::ConnectError::Api { .. }) => {
                (LEAF_REACHABLE, reason::LEAF_UNREACHABLE)
            }
            Self::Connector(connector::ConnectError::Rejected { .. }) => (READY, reason::REJECTED),
            Self::Connector(_) => (READY, reason::INVALID_SPEC),
            Self::Hub { .. } | Self::Finalizer(_) | Self::NoNamespace(_) => {
                (READY, reason::INVALID_SPEC)
            }
        }
    }
}

/// `namespace/name`: the key of a shortcut's backoff and leaf watches.
fn key_of(shortcut: &ShortcutConnection) -> String {
    format!(
        "{}/{}",
        shortcut.namespace().unwrap_or_default(),
        shortcut.name_any()
    )
}
