//! A failure of the operator ([`ShortcutError`]).

use kube::runtime::finalizer;
use kubetun_crds::contract::shortcut::{FINALIZER, LEAF_REACHABLE, READY, reason};

use super::leaf::LeafError;
use crate::connector;

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
    pub(super) fn condition(&self) -> (&'static str, &'static str) {
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
