//! When to look at a shortcut again: the requeue [`Intervals`] and the per-shortcut
//! exponential [`Backoff`] after errors.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

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

/// Per-shortcut exponential backoff: the delay doubles with each consecutive failure, up to
/// a cap, and starts over after a success.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The retry delay after one more failure of `key`.
    pub fn next(&self, key: &str, intervals: &Intervals) -> Duration {
        let mut failures = self.failures();
        let count = failures.entry(key.to_owned()).or_insert(0);
        let delay = intervals.backoff_base.saturating_mul(1 << (*count).min(16));
        *count = count.saturating_add(1);
        delay.min(intervals.backoff_max)
    }

    /// Forgets the failures of `key`.
    pub fn reset(&self, key: &str) {
        self.failures().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets_on_success() {
        let intervals = Intervals {
            backoff_base: Duration::from_secs(5),
            backoff_max: Duration::from_secs(30),
            ..Intervals::default()
        };
        let backoff = Backoff::default();
        let seconds: Vec<u64> = (0..5)
            .map(|_| backoff.next("ns/a", &intervals).as_secs())
            .collect();
        assert_eq!(seconds, [5, 10, 20, 30, 30]);
        assert_eq!(
            backoff.next("ns/b", &intervals).as_secs(),
            5,
            "shortcuts back off independently"
        );
        backoff.reset("ns/a");
        assert_eq!(backoff.next("ns/a", &intervals).as_secs(), 5);
    }
}
