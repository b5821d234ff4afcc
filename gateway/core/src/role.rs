//! Whether this gateway carries traffic. A gateway alone is active for ever. One replica of
//! several is active only while its controller holds the cluster's gateway lease: every
//! renewal extends a deadline on the monotonic clock, and when the deadline passes the
//! gateway falls back to standby by itself, before another replica can take the lease over.
//! That covers a controller that died, hangs or lost the API server while its gateway lives
//! on (without it, two gateways would answer for the cluster: split brain).
//!
//! A standby holds the applied state but sends nothing (no initiations, keepalives or probes)
//! and drops everything it reads, so a remote's endpoint never roams to it. When it becomes
//! active it initiates a handshake with every peer, session or not, which moves each
//! remote's endpoint to it (WireGuard roaming).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The deadline of a gateway that was never put under a lease.
const FOREVER: u64 = u64::MAX;

/// The active deadline, in microseconds of the monotonic clock of [`crate::clock::Now`]; see
/// the module docs.
#[derive(Debug)]
pub struct Role {
    active_until_us: AtomicU64,
    promotions: AtomicU64,
}

/// What a [`Role::hold`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub was_active: bool,
    pub active: bool,
}

impl Transition {
    /// Standby (or lapsed) before, active now: the peers must hear from this replica.
    pub fn promoted(self) -> bool {
        !self.was_active && self.active
    }
}

impl Default for Role {
    fn default() -> Self {
        Self {
            active_until_us: AtomicU64::new(FOREVER),
            promotions: AtomicU64::new(0),
        }
    }
}

impl Role {
    /// Whether traffic may flow at monotonic time `now_us`.
    #[inline]
    pub fn is_active(&self, now_us: u64) -> bool {
        now_us < self.active_until_us.load(Ordering::Relaxed)
    }

    /// Active for `active_for` from `now_us` (a lease renewal); zero is standby now.
    pub fn hold(&self, active_for: Duration, now_us: u64) -> Transition {
        let for_us = u64::try_from(active_for.as_micros()).unwrap_or(FOREVER);
        let until = if for_us == 0 {
            0
        } else {
            now_us.saturating_add(for_us).min(FOREVER - 1)
        };
        let before = self.active_until_us.swap(until, Ordering::Relaxed);
        let transition = Transition {
            was_active: now_us < before,
            active: now_us < until,
        };
        if transition.promoted() {
            self.promotions.fetch_add(1, Ordering::Relaxed);
        }
        transition
    }

    /// Whether a lease governs this gateway (it was put on hold at least once).
    pub fn is_leased(&self) -> bool {
        self.active_until_us.load(Ordering::Relaxed) != FOREVER
    }

    /// How long the gateway stays active without another renewal; `None` without a lease.
    pub fn remaining(&self, now_us: u64) -> Option<Duration> {
        let until = self.active_until_us.load(Ordering::Relaxed);
        (until != FOREVER).then(|| Duration::from_micros(until.saturating_sub(now_us)))
    }

    /// How often a hold made this gateway active.
    pub fn promotions(&self) -> u64 {
        self.promotions.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_without_a_lease_is_active_for_ever() {
        let role = Role::default();
        assert!(role.is_active(0));
        assert!(role.is_active(u64::MAX - 1));
        assert!(!role.is_leased());
        assert_eq!(role.remaining(5), None);
    }

    #[test]
    fn a_hold_lapses_at_its_deadline_and_a_renewal_extends_it() {
        let role = Role::default();
        let first = role.hold(Duration::from_millis(0), 1_000);
        assert_eq!(
            first,
            Transition {
                was_active: true,
                active: false
            }
        );
        let promoted = role.hold(Duration::from_millis(2), 1_000);
        assert!(promoted.promoted());
        assert!(role.is_active(2_999));
        assert!(!role.is_active(3_000), "the deadline is exclusive");
        let renewed = role.hold(Duration::from_millis(2), 2_500);
        assert!(!renewed.promoted(), "a renewal in time is no promotion");
        assert!(role.is_active(4_499));
        assert_eq!(role.remaining(4_000), Some(Duration::from_micros(500)));
        // Lapsed, then held again: a second promotion.
        assert!(role.hold(Duration::from_millis(1), 10_000).promoted());
        assert_eq!(role.promotions(), 2);
    }

    #[test]
    fn standby_now_ends_activity_at_once() {
        let role = Role::default();
        role.hold(Duration::from_secs(10), 0);
        let t = role.hold(Duration::ZERO, 5);
        assert!(t.was_active && !t.active);
        assert!(!role.is_active(5));
        assert_eq!(role.remaining(5), Some(Duration::ZERO));
    }
}
