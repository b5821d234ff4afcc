//! Sharing one peer's batch between threads: the [`Workers`] the shell supplies, and how a
//! run of packets is cut into parts for them.
//!
//! A peer's datagrams are sealed (egress) or opened (ingress) outside its `Tunn` lock, with
//! the session's own nonce counter and replay window (the patched boringtun's
//! `Session`). A long run is cut into contiguous parts, at most one per worker: the nonces
//! are reserved in read order before any part is sealed, and every part writes into its own
//! place of the arena, so the datagrams leave in read order whichever thread sealed them.

use parking_lot::Mutex;

/// Fewest packets a part is worth: a thread handing work to another costs a few
/// microseconds, about what sealing eight full-size packets costs.
pub const MIN_PART: usize = 8;
/// Most parts one run is cut into (the widest pool used).
pub const MAX_PARTS: usize = 16;

/// Threads that work on parts of one batch beside the calling thread.
pub trait Workers: Sync {
    /// How many threads may work on one run, the caller's included (1: the caller alone).
    fn width(&self) -> usize;
    /// Runs `job(part)` once for every `part < parts`, on the calling thread and on others;
    /// returns when every call has returned.
    fn run(&self, parts: usize, job: &(dyn Fn(usize) + Sync));
}

/// No other thread: every part runs on the caller, in order.
#[derive(Debug, Clone, Copy, Default)]
pub struct Alone;

impl Workers for Alone {
    fn width(&self) -> usize {
        1
    }

    fn run(&self, parts: usize, job: &(dyn Fn(usize) + Sync)) {
        (0..parts).for_each(job);
    }
}

/// Whether a peer's runs are sealed and opened outside its `Tunn` lock: only when helpers
/// can share them. One worker gains nothing from it (measured no faster, RESULTS.md) and
/// would take the lock twice per run instead of once, so it keeps boringtun's
/// `encapsulate`/`decapsulate` under the lock.
pub fn outside_the_lock(workers: &impl Workers) -> bool {
    workers.width() > 1
}

/// How many parts a run of `len` packets is cut into for `workers`: two per worker when the
/// run is long enough, so a helper that joins late still finds parts left; one without
/// helpers.
pub fn parts_for(len: usize, workers: &impl Workers) -> usize {
    match workers.width() {
        0 | 1 => 1,
        width => (len / MIN_PART).clamp(1, (2 * width).min(MAX_PARTS)),
    }
}

/// Runs `work` on each of `parts` (at most [`MAX_PARTS`] are taken) on `workers`, and
/// returns when all are done. The parts wait on the caller's stack, one lock each.
pub fn run_parts<T: Send>(
    workers: &impl Workers,
    parts: impl IntoIterator<Item = T>,
    work: impl Fn(T) + Sync,
) {
    let slots: [Mutex<Option<T>>; MAX_PARTS] = std::array::from_fn(|_| Mutex::new(None));
    let mut count = 0;
    for (slot, part) in slots.iter().zip(parts) {
        *slot.lock() = Some(part);
        count += 1;
    }
    workers.run(count, &|index| {
        if let Some(part) = slots[index].lock().take() {
            work(part);
        }
    });
}

/// The end of part `part` of `parts` over `len` items (the parts differ by at most one).
pub fn part_end(len: usize, parts: usize, part: usize) -> usize {
    len * (part + 1) / parts
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Wide(usize);
    impl Workers for Wide {
        fn width(&self) -> usize {
            self.0
        }
        fn run(&self, parts: usize, job: &(dyn Fn(usize) + Sync)) {
            (0..parts).for_each(job);
        }
    }

    #[test]
    fn short_runs_stay_whole_and_long_ones_get_a_part_per_worker() {
        assert_eq!(parts_for(64, &Alone), 1);
        assert_eq!(parts_for(MIN_PART * 2 - 1, &Wide(4)), 1);
        assert_eq!(parts_for(MIN_PART * 2, &Wide(4)), 2);
        assert_eq!(parts_for(64, &Wide(2)), 4);
        assert_eq!(parts_for(64, &Wide(4)), 8);
        assert_eq!(parts_for(1024, &Wide(64)), MAX_PARTS);
        assert_eq!(parts_for(0, &Wide(0)), 1);
    }

    #[test]
    fn parts_cover_the_run_in_order_without_gaps() {
        for len in [8, 9, 63, 64, 128] {
            for parts in 1..=4 {
                let ends: Vec<_> = (0..parts).map(|p| part_end(len, parts, p)).collect();
                assert_eq!(*ends.last().unwrap(), len);
                assert!(
                    ends.windows(2)
                        .all(|w| w[0] <= w[1] && w[1] - w[0] <= len / parts + 1)
                );
            }
        }
    }
}
