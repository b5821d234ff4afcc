//! [`Now`]: the time the core is handed. Nothing in the core reads a clock; the shell reads
//! both and passes them in, so tests can set time.

/// A reading of both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Milliseconds since the Unix epoch: handshake and send times (the persistent
    /// keepalive compares them).
    pub unix_ms: u64,
    /// Microseconds of a monotonic clock: the connectivity check's RTTs.
    pub mono_us: u64,
}
