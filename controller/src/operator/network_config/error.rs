//! The reconcilers' error type, classified for the failure metric and the error policy
//! ([`ReconcileError`]).

use crate::keys::KeyError;
use crate::planner::PlanError;
use crate::plumbing::cluster_info::ClusterInfoError;
use crate::plumbing::gateway_client::GatewayClientError;
use crate::plumbing::runtime::ReconcileError;

/// Anything a reconciliation pass can fail with. Invalid user input is *not* an error here:
/// it ends in a condition on the object; these are the failures worth a retry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Adding or removing the finalizer, or the cleanup behind it, failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The planner refused persisted state it cannot recover from.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The gateway could not be reached or refused the state.
    #[error(transparent)]
    Gateway(#[from] GatewayClientError),
    /// The gateway key could not be loaded.
    #[error(transparent)]
    Keys(#[from] KeyError),
    /// The cluster info could not be read or published.
    #[error(transparent)]
    ClusterInfo(#[from] ClusterInfoError),
    /// An object came back from the API without a field the API always sets.
    #[error("{kind} object has no {field}")]
    MissingField {
        /// Resource kind.
        kind: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// A status could not be serialized.
    #[error("serializing status: {0}")]
    Serialize(#[from] serde_json::Error),
}

impl From<kube::runtime::finalizer::Error<Error>> for Error {
    fn from(e: kube::runtime::finalizer::Error<Error>) -> Self {
        Self::Finalizer(Box::new(e))
    }
}

impl ReconcileError for Error {
    /// A failed API request that found the API server away ([`crate::plumbing::runtime::is_transient`]).
    fn is_transient(&self) -> bool {
        matches!(self, Self::Kube(e) if crate::plumbing::runtime::is_transient(e))
    }

    fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube",
            Self::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.metric_label(),
                _ => "finalizer",
            },
            Self::Plan(_) => "plan",
            Self::Gateway(_) => "gateway",
            Self::Keys(_) => "keys",
            Self::ClusterInfo(_) => "cluster_info",
            Self::MissingField { .. } => "missing_field",
            Self::Serialize(_) => "serialize",
        }
    }
}
