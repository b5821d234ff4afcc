//! The lease election as a pure state machine: what a replica does with the Lease it read,
//! given the time on its own monotonic clock.
//!
//! As in client-go, a candidate never compares the record's `renewTime` with its own clock:
//! it notes when *it* saw the record change and takes the lease over only once the record
//! stayed unchanged for a whole lease duration by that clock. Clock skew between nodes
//! therefore cannot shorten a lease. The holder counts its leadership from the moment it
//! *sent* its last successful renewal, for a renew deadline shorter than the lease duration,
//! so it stops leading (and its gateway stops carrying traffic) before any candidate may
//! take over.

use std::time::{Duration, Instant};

/// How long a lease lasts and how often it is renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// A candidate takes over a record unchanged for this long.
    pub lease_duration: Duration,
    /// The holder leads for this long after sending its last successful renewal; shorter
    /// than `lease_duration`, by at least the longest delay of a Hold to the gateway.
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl Default for Timing {
    /// One second leases, renewed every 150 ms: a failover within 1.2 s of the holder's last
    /// renewal, about 13 API requests a second for two replicas.
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(1),
            renew_deadline: Duration::from_millis(700),
            retry_period: Duration::from_millis(150),
        }
    }
}

/// Why a timing cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// The holder would lead past the moment a candidate may take over.
    #[error(
        "the renew deadline ({renew_ms} ms) must be shorter than the lease duration ({lease_ms} ms)"
    )]
    DeadlineNotShorter { renew_ms: u128, lease_ms: u128 },
    /// A renewal could never be attempted twice before the deadline.
    #[error(
        "the retry period ({retry_ms} ms) must be at most half the renew deadline ({renew_ms} ms)"
    )]
    RetryTooLong { retry_ms: u128, renew_ms: u128 },
    /// The Lease object counts whole seconds.
    #[error("the lease duration must be a whole number of seconds, at least 1")]
    NotWholeSeconds,
}

impl Timing {
    /// Checks the relations the safety argument (module docs) needs.
    pub fn validate(self) -> Result<Self, TimingError> {
        let (lease, renew, retry) = (self.lease_duration, self.renew_deadline, self.retry_period);
        if lease.subsec_nanos() != 0 || lease.is_zero() {
            return Err(TimingError::NotWholeSeconds);
        }
        if renew >= lease {
            return Err(TimingError::DeadlineNotShorter {
                renew_ms: renew.as_millis(),
                lease_ms: lease.as_millis(),
            });
        }
        if retry.is_zero() || retry * 2 > renew {
            return Err(TimingError::RetryTooLong {
                retry_ms: retry.as_millis(),
                renew_ms: renew.as_millis(),
            });
        }
        Ok(self)
    }
}

/// What a replica read of the Lease: enough to tell whether it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// `spec.holderIdentity`; `None` or empty when released.
    pub holder: Option<String>,
    /// `spec.renewTime` as written, compared as text only.
    pub renew_time: Option<String>,
    pub transitions: i32,
}

/// What to do after reading the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Write a record naming this replica: a renewal (`takeover` false) or an acquisition
    /// (`takeover` true: the lease transitions count goes up).
    Claim { takeover: bool },
    /// Another replica holds a lease that has not expired.
    Follow { holder: String },
}

/// One replica's view of the election.
#[derive(Debug, Clone)]
pub struct Election {
    identity: String,
    timing: Timing,
    /// The record last seen and when it was first seen that way.
    seen: Option<(Observed, Instant)>,
    /// When the last successful claim was sent; leadership runs from it.
    claimed_at: Option<Instant>,
}

impl Election {
    pub fn new(identity: impl Into<String>, timing: Timing) -> Self {
        Self {
            identity: identity.into(),
            timing,
            seen: None,
            claimed_at: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// Decides on the record read at `now` (`None`: there is no Lease yet).
    pub fn observe(&mut self, record: Option<&Observed>, now: Instant) -> Decision {
        let Some(record) = record else {
            return Decision::Claim { takeover: true };
        };
        let holder = record.holder.as_deref().filter(|h| !h.is_empty());
        match holder {
            Some(holder) if holder == self.identity => {
                return Decision::Claim { takeover: false };
            }
            None => return Decision::Claim { takeover: true },
            Some(_) => {}
        }
        let since = match &self.seen {
            Some((seen, since)) if seen == record => *since,
            _ => {
                self.seen = Some((record.clone(), now));
                now
            }
        };
        if now.duration_since(since) >= self.timing.lease_duration {
            Decision::Claim { takeover: true }
        } else {
            Decision::Follow {
                holder: holder.unwrap_or_default().to_owned(),
            }
        }
    }

    /// The claim sent at `sent` was written: this replica leads until `sent` plus the renew
    /// deadline.
    pub fn claimed(&mut self, sent: Instant) {
        self.claimed_at = Some(sent);
        self.seen = None;
    }

    /// Whether this replica leads at `now`.
    pub fn leads(&self, now: Instant) -> bool {
        self.remaining(now) > Duration::ZERO
    }

    /// How long this replica still leads without another successful claim.
    pub fn remaining(&self, now: Instant) -> Duration {
        self.claimed_at.map_or(Duration::ZERO, |sent| {
            (sent + self.timing.renew_deadline).saturating_duration_since(now)
        })
    }

    /// Forgets the record seen (a read failed): a takeover waits a whole lease duration
    /// from the next successful read, which gives the holder time to renew first.
    pub fn forget(&mut self) {
        self.seen = None;
    }

    /// Gives up leadership at once (stepping down, or a claim that failed for good).
    pub fn resign(&mut self) {
        self.claimed_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, renew: &str) -> Observed {
        Observed {
            holder: Some(holder.to_owned()),
            renew_time: Some(renew.to_owned()),
            transitions: 0,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_default_timing_is_valid_and_bad_ones_are_refused_with_the_reason() {
        assert!(Timing::default().validate().is_ok());
        let bad = Timing {
            renew_deadline: Duration::from_secs(1),
            ..Timing::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "the renew deadline (1000 ms) must be shorter than the lease duration (1000 ms)"
        );
        let slow = Timing {
            retry_period: ms(400),
            ..Timing::default()
        };
        assert!(matches!(
            slow.validate(),
            Err(TimingError::RetryTooLong { .. })
        ));
        let fractional = Timing {
            lease_duration: ms(1500),
            ..Timing::default()
        };
        assert_eq!(fractional.validate(), Err(TimingError::NotWholeSeconds));
    }

    #[test]
    fn a_missing_or_released_lease_is_claimed_at_once() {
        let now = Instant::now();
        let mut election = Election::new("b", Timing::default());
        assert_eq!(
            election.observe(None, now),
            Decision::Claim { takeover: true }
        );
        let released = Observed {
            holder: Some(String::new()),
            renew_time: None,
            transitions: 3,
        };
        assert_eq!(
            election.observe(Some(&released), now),
            Decision::Claim { takeover: true }
        );
    }

    #[test]
    fn a_live_holder_is_followed_and_a_silent_one_taken_over_after_a_full_duration_by_our_clock() {
        let start = Instant::now();
        let mut election = Election::new("b", Timing::default());
        let first = record("a", "2026-01-01T00:00:00.000000Z");
        assert_eq!(
            election.observe(Some(&first), start),
            Decision::Follow { holder: "a".into() }
        );
        // Renewed: the clock starts again, whatever renewTime says.
        let renewed = record("a", "1999-01-01T00:00:00.000000Z");
        assert!(matches!(
            election.observe(Some(&renewed), start + ms(900)),
            Decision::Follow { .. }
        ));
        assert!(matches!(
            election.observe(Some(&renewed), start + ms(1_899)),
            Decision::Follow { .. }
        ));
        assert_eq!(
            election.observe(Some(&renewed), start + ms(1_900)),
            Decision::Claim { takeover: true }
        );
    }

    #[test]
    fn the_holder_renews_and_leads_for_the_renew_deadline_after_sending() {
        let start = Instant::now();
        let mut election = Election::new("a", Timing::default());
        assert!(!election.leads(start));
        assert_eq!(
            election.observe(Some(&record("a", "t")), start),
            Decision::Claim { takeover: false }
        );
        election.claimed(start);
        assert!(election.leads(start + ms(699)));
        assert_eq!(election.remaining(start + ms(500)), ms(200));
        assert!(!election.leads(start + ms(700)));
        election.claimed(start + ms(600));
        assert!(election.leads(start + ms(1_000)));
        election.resign();
        assert!(!election.leads(start + ms(1_000)));
    }

    #[test]
    fn after_a_failed_read_a_candidate_waits_a_whole_duration_again() {
        let start = Instant::now();
        let mut election = Election::new("b", Timing::default());
        let rec = record("a", "r1");
        assert!(matches!(
            election.observe(Some(&rec), start),
            Decision::Follow { .. }
        ));
        // The API server was away for 5 s; the record did not change meanwhile.
        election.forget();
        assert!(matches!(
            election.observe(Some(&rec), start + ms(5_000)),
            Decision::Follow { .. }
        ));
        assert_eq!(
            election.observe(Some(&rec), start + ms(6_000)),
            Decision::Claim { takeover: true }
        );
    }

    /// The property that rules out two active gateways: whenever a candidate may take over,
    /// the holder's leadership (counted from before its last successful write, which the
    /// candidate can only have seen afterwards) has ended.
    #[test]
    fn a_takeover_never_overlaps_the_previous_holders_leadership() {
        let timing = Timing::default();
        let start = Instant::now();
        for write_latency in [0u64, 1, 50, 300, 699] {
            for read_delay in [0u64, 10, 149, 500] {
                let mut holder = Election::new("a", timing);
                let mut candidate = Election::new("b", timing);
                // The holder sends its renewal at `start`; it lands `write_latency` later;
                // the candidate reads it `read_delay` after that.
                holder.claimed(start);
                let seen_at = start + ms(write_latency + read_delay);
                let rec = record("a", "r1");
                let mut now = seen_at;
                loop {
                    match candidate.observe(Some(&rec), now) {
                        Decision::Claim { takeover } => {
                            assert!(takeover);
                            break;
                        }
                        Decision::Follow { .. } => now += ms(10),
                    }
                }
                assert!(
                    !holder.leads(now),
                    "latency {write_latency} ms, read {read_delay} ms: overlap at takeover"
                );
                assert!(now - start >= timing.renew_deadline);
            }
        }
    }
}
