//! Failures of the Network controllers ([`NetworkError`]).

use super::{allocator, ids};
use crate::plumbing::runtime::ReconcileError;

/// Failures of the network controllers.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// `--min-vni`/`--max-vni` do not form a usable range.
    #[error("invalid network ID range: {0}")]
    InvalidRange(#[from] ids::RangeError),
    /// The Network or NetworkId CRD is not served (install `deploy/crds/kubetun.yaml`).
    #[error("the {kind} API is not available; are the kubetun CRDs installed? ({source})")]
    CrdNotInstalled {
        /// The missing kind.
        kind: &'static str,
        /// What the API server said.
        #[source]
        source: Box<kube::Error>,
    },
    /// An object lacks a field the API server always sets (name, namespace, UID).
    #[error("object has no {0}")]
    MissingMetadata(&'static str),
    /// A Kubernetes API request failed.
    #[error("kube API request failed: {0}")]
    Kube(#[source] Box<kube::Error>),
    /// Claiming an ID failed for a reason that is not reported as a condition.
    #[error(transparent)]
    Allocation(Box<allocator::AllocError>),
    /// Adding or removing the finalizer, or the wrapped reconcile, failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<NetworkError>>),
}

impl ReconcileError for NetworkError {
    /// The API server's being away (see [`crate::plumbing::runtime::is_transient`]), also inside the
    /// finalizer's wrapping.
    fn is_transient(&self) -> bool {
        use kube::runtime::finalizer::Error as Finalizer;
        match self {
            Self::Kube(e) => crate::plumbing::runtime::is_transient(e),
            Self::Finalizer(inner) => match inner.as_ref() {
                Finalizer::ApplyFailed(e) | Finalizer::CleanupFailed(e) => e.is_transient(),
                Finalizer::AddFinalizer(e) | Finalizer::RemoveFinalizer(e) => {
                    crate::plumbing::runtime::is_transient(e)
                }
                _ => false,
            },
            _ => false,
        }
    }

    fn metric_label(&self) -> &'static str {
        match self {
            Self::InvalidRange(_) => "invalid_range",
            Self::CrdNotInstalled { .. } => "crd_not_installed",
            Self::MissingMetadata(_) => "missing_metadata",
            Self::Kube(_) => "kube",
            Self::Allocation(_) => "allocation",
            Self::Finalizer(_) => "finalizer",
        }
    }
}

impl From<kube::Error> for NetworkError {
    fn from(err: kube::Error) -> Self {
        Self::Kube(Box::new(err))
    }
}

impl From<allocator::AllocError> for NetworkError {
    fn from(err: allocator::AllocError) -> Self {
        Self::Allocation(Box::new(err))
    }
}
