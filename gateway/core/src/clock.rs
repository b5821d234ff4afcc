//! [`Now`]: the time the core is handed. Nothing in the core reads a clock; the shell reads
//! both and passes them in, so tests can set time.

use std::time::Duration;

use boringtun::noise::Instant;

/// A reading of both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Milliseconds since the Unix epoch: handshake and send times (the persistent
    /// keepalive compares them), and the timestamps of handshake initiations.
    pub unix_ms: u64,
    /// Microseconds of a monotonic clock: the connectivity check's RTTs and boringtun's
    /// timers.
    pub mono_us: u64,
}

impl Now {
    /// The monotonic reading as boringtun's `Instant`, for its `*_at` functions.
    ///
    /// Made from [`Now::mono_us`] (boringtun's `Instant::from_elapsed`, a constructor the
    /// project's boringtun patch adds) rather than read from boringtun's own clock: so
    /// boringtun's timers (handshake retries, rekey, expiry, the rate limiter's second and
    /// cookie epoch) run on the one time the shell reads and a test sets, the same as the
    /// core's probes. Every `Tunn` and rate limiter is made and called with such instants
    /// only (they do not compare with `Instant::now`).
    pub fn instant(self) -> Instant {
        Instant::from_elapsed(Duration::from_micros(self.mono_us))
    }

    /// The wall-clock reading as boringtun takes it (since the Unix epoch).
    pub fn unix_time(self) -> Duration {
        Duration::from_millis(self.unix_ms)
    }
}
