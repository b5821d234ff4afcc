//! How long the services demo's changes take: polling until a condition holds, and the
//! median of a series of rounds.

use std::time::{Duration, Instant};

/// How long a change may take to show in the client pod.
pub(super) const CONVERGE: Duration = Duration::from_secs(20);

/// Median, minimum and maximum in milliseconds.
pub(super) fn summary(times: &mut [Duration]) -> String {
    times.sort();
    let ms = |d: &Duration| d.as_millis();
    match (times.first(), times.get(times.len() / 2), times.last()) {
        (Some(min), Some(median), Some(max)) => format!(
            "median {} ms (min {}, max {}, n={})",
            ms(median),
            ms(min),
            ms(max),
            times.len()
        ),
        _ => "no rounds".to_owned(),
    }
}

/// Polls `done` until true (the time it took) or [`CONVERGE`] passes (`None`).
pub(super) fn wait_until(mut done: impl FnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < CONVERGE {
        if done() {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}
