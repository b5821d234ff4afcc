//! [`Progress`]: where the connector reports its steps and waits; the CLI prints them, the
//! operator logs them ([`TracingProgress`]).

/// Receives the connector's progress: the CLI prints it, the operator logs it.
///
/// A wait starts with [`waiting`](Self::waiting) and ends with [`waited`](Self::waited) or
/// [`failed`](Self::failed); [`done`](Self::done) steps may happen while a wait runs.
pub trait Progress: Send + Sync {
    /// A step on `cluster` completed (an object written, found up to date, deleted).
    fn done(&self, cluster: &str, message: &str);
    /// A wait on `cluster` begins.
    fn waiting(&self, cluster: &str, message: &str);
    /// The running wait on `cluster` ended well.
    fn waited(&self, cluster: &str, message: &str);
    /// The current step or wait on `cluster` failed.
    fn failed(&self, cluster: &str, message: &str);
}

/// Progress sink that emits `tracing` events.
#[derive(Debug, Default, Clone, Copy)]
pub struct TracingProgress;

impl Progress for TracingProgress {
    fn done(&self, cluster: &str, message: &str) {
        tracing::info!(cluster, "{message}");
    }
    fn waiting(&self, cluster: &str, message: &str) {
        tracing::debug!(cluster, "{message}");
    }
    fn waited(&self, cluster: &str, message: &str) {
        tracing::info!(cluster, "{message}");
    }
    fn failed(&self, cluster: &str, message: &str) {
        tracing::warn!(cluster, "{message}");
    }
}
