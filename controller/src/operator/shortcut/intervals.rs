//! When to look at a shortcut again: the requeue [`Intervals`], and the bounds of the
//! per-shortcut exponential backoff after errors.

use std::time::Duration;

use crate::plumbing::runtime::ErrorBackoff;

/// When to look at a shortcut again.
#[derive(Debug, Clone, Copy)]
pub struct Intervals {
    /// While the leaves process the NetworkConfigs or the tunnels connect.
    pub pending: Duration,
    /// Once connected (refreshes the tunnel state in the status).
    pub connected: Duration,
    /// First retry after an error; doubles per consecutive error.
    pub backoff_base: Duration,
    /// Longest retry interval.
    pub backoff_max: Duration,
}

impl Default for Intervals {
    fn default() -> Self {
        // Events drive the operator (see the module docs); these catch what a watch missed.
        Self {
            pending: Duration::from_secs(30),
            connected: Duration::from_secs(60),
            backoff_base: Duration::from_secs(5),
            backoff_max: Duration::from_secs(300),
        }
    }
}

impl Intervals {
    /// The per-shortcut backoff after errors, between `backoff_base` and `backoff_max`.
    pub fn backoff(&self) -> ErrorBackoff {
        ErrorBackoff::new(self.backoff_base, self.backoff_max)
    }
}
