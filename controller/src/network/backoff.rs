//! Per-object exponential backoff for `error_policy`: each consecutive failure of the same
//! object doubles its requeue delay up to a cap; a successful reconcile resets it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Failure counters keyed by object (e.g. `namespace/name`).
#[derive(Debug)]
pub struct ErrorBackoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl ErrorBackoff {
    /// Delays start at `base` and never exceed `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let count = failures.entry(key.to_owned()).or_insert(0);
        let exponent = (*count).min(16);
        *count = count.saturating_add(1);
        self.base.saturating_mul(1u32 << exponent).min(self.max)
    }

    /// Forgets the failures of `key`.
    pub fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

impl Default for ErrorBackoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(300))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_per_object_up_to_the_cap_and_reset_on_success() {
        let backoff = ErrorBackoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let delays: Vec<u64> = (0..5).map(|_| backoff.failed("a").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5]);
        assert_eq!(
            backoff.failed("b"),
            Duration::from_secs(1),
            "objects are independent"
        );
        backoff.succeeded("a");
        assert_eq!(backoff.failed("a"), Duration::from_secs(1));
    }
}
