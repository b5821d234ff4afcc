//! Fallback paths, as a pure state machine on injected time. A peer whose views other peers
//! back up (fallback routes) is a *primary*; when its connectivity check finds it
//! unreachable, its backed-up views move to their fallback routes at once; they move back
//! only once it has answered every probe for [`RETURN_HOLD_US`] (hysteresis: a link that
//! flaps does not drag the traffic along). The shells feed it one reading per probe round
//! (`probe.rs`) and re-plan the snapshot on a switch (`Device::replan`).

use crate::clock::Now;

/// How long a failed-over primary must answer every probe before its views return to it.
pub const RETURN_HOLD_US: u64 = 3_000_000;

/// One primary peer's path: direct, or failed over to its fallbacks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathState {
    failed_over: bool,
    /// While failed over: since when every probe was answered.
    answering_since_us: Option<u64>,
    switches: u64,
    /// Unix time of the last switch; 0 = never.
    changed_unix_ms: u64,
}

impl PathState {
    /// Whether the primary's backed-up views go through their fallbacks.
    pub fn failed_over(&self) -> bool {
        self.failed_over
    }

    /// How often the path switched (either way).
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// Unix milliseconds of the last switch; 0 = never.
    pub fn changed_unix_ms(&self) -> u64 {
        self.changed_unix_ms
    }

    /// One probe round's reading of the primary: `losses` unanswered probes in a row,
    /// unreachable from `threshold` on. Returns the new state on a switch.
    pub fn observe(&mut self, losses: u32, threshold: u32, now: Now) -> Option<bool> {
        if losses >= threshold {
            self.answering_since_us = None;
            return (!self.failed_over).then(|| self.switch(true, now));
        }
        if !self.failed_over {
            return None;
        }
        if losses > 0 {
            // A loss during the hold starts it again.
            self.answering_since_us = None;
            return None;
        }
        let since = *self.answering_since_us.get_or_insert(now.mono_us);
        (now.mono_us.saturating_sub(since) >= RETURN_HOLD_US).then(|| self.switch(false, now))
    }

    fn switch(&mut self, failed_over: bool, now: Now) -> bool {
        self.failed_over = failed_over;
        self.answering_since_us = None;
        self.switches += 1;
        self.changed_unix_ms = now.unix_ms;
        failed_over
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Now {
        Now {
            unix_ms: 1_700_000_000_000 + ms,
            mono_us: ms * 1000,
        }
    }

    #[test]
    fn fails_over_at_the_threshold_and_returns_after_the_hold_without_a_loss() {
        let mut path = PathState::default();
        assert_eq!(path.observe(4, 5, at(0)), None, "below the threshold");
        assert_eq!(path.observe(5, 5, at(200)), Some(true));
        assert!(path.failed_over());
        assert_eq!(path.observe(6, 5, at(400)), None, "already failed over");
        // Answering again: the hold starts with the first answered round.
        assert_eq!(path.observe(0, 5, at(1_000)), None);
        assert_eq!(path.observe(0, 5, at(3_999)), None);
        assert_eq!(path.observe(0, 5, at(4_000)), Some(false));
        assert!(!path.failed_over());
        assert_eq!(path.switches(), 2);
        assert_eq!(path.changed_unix_ms(), at(4_000).unix_ms);
    }

    #[test]
    fn a_loss_during_the_hold_starts_it_again_so_a_flapping_link_keeps_the_fallback() {
        let mut path = PathState::default();
        path.observe(5, 5, at(0));
        for round in 0..40u64 {
            // Every fourth probe lost: never 3 s without a loss.
            let losses = u32::from(round % 4 == 3);
            assert_eq!(path.observe(losses, 5, at(1_000 + round * 250)), None);
        }
        assert!(path.failed_over());
        assert_eq!(path.switches(), 1);
    }
}
