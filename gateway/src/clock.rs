//! The clocks the gateway reads: wall-clock time in Unix milliseconds (the unit of every
//! timestamp it reports) and a monotonic microsecond clock (probe RTTs), read together as
//! [`Now`] (the core's type), the time the data-path core is handed.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub use kubetun_gateway_core::clock::Now;

/// Both clocks, now.
pub fn now() -> Now {
    Now {
        unix_ms: unix_ms(),
        mono_us: mono_us(),
    }
}

/// Now, in milliseconds since the Unix epoch (0 if the clock is before the epoch).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Monotonic microseconds since the first call.
pub fn mono_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
}
