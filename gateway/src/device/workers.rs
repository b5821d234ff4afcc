//! The crypto helpers: threads that seal or open parts of one peer's run beside the data-path
//! task that owns it ([`Workers`], see `kubetun_gateway_core::workers`).
//!
//! The task offers its run, wakes helpers and works on it itself; parts are claimed one at a
//! time from an atomic counter, so a helper that wakes late (or not at all: another task's
//! run holds the helpers) costs nothing but the parts the task sealed alone. The offer lives
//! on the task's stack: it is withdrawn, and every helper that joined it has left, before
//! [`Workers::run`] returns. Hand-written rather than rayon because a rayon scope allocates a
//! job per spawn and a rayon `join` from outside its pool parks the calling thread instead of
//! letting it work: both cost the packet path what the split should win.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use kubetun_gateway_core::workers::Workers;

/// A run offered to the helpers: `job(part)` for every part below `parts`.
struct Offer<'a> {
    parts: usize,
    /// The next part to claim.
    next: AtomicUsize,
    /// Parts whose job returned.
    done: AtomicUsize,
    /// Helpers working on this offer.
    joined: AtomicUsize,
    job: &'a (dyn Fn(usize) + Sync),
}

impl Offer<'_> {
    /// Claims and runs parts until none is left.
    fn work(&self) {
        loop {
            let part = self.next.fetch_add(1, Ordering::Relaxed);
            if part >= self.parts {
                return;
            }
            (self.job)(part);
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

/// A pointer to the offer on the offering task's stack.
#[derive(Clone, Copy)]
struct OfferRef(*const Offer<'static>);

// SAFETY: the offer is only read through `&` (atomics and a `Sync` closure), and it outlives
// every use: `run` withdraws it under the lock helpers join under, then waits until `joined`
// is zero before its stack frame ends.
#[allow(unsafe_code)]
unsafe impl Send for OfferRef {}

#[derive(Default)]
struct Inner {
    offered: Mutex<Option<OfferRef>>,
    /// Offers made so far: a helper that just finished watches it for a while.
    offers: AtomicUsize,
    wake: Condvar,
    stop: AtomicBool,
}

/// How long a helper that finished its parts watches for the next offer before it sleeps.
/// Under load offers come every few tens of µs (each batch's runs, both directions), and a
/// sleeping helper takes about as long to wake on a virtual machine as a run takes to seal;
/// an idle gateway's helpers sleep after this.
const WATCH: std::time::Duration = std::time::Duration::from_micros(50);

/// `width - 1` helper threads; the caller of [`Workers::run`] is the other worker.
pub struct CryptoWorkers {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for CryptoWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CryptoWorkers")
            .field("width", &self.width())
            .finish()
    }
}

impl CryptoWorkers {
    /// Workers for runs `width` threads wide (at least 1: the caller alone, no thread).
    pub fn new(width: usize) -> std::io::Result<Self> {
        let inner = Arc::new(Inner::default());
        let threads = (1..width.max(1))
            .map(|n| {
                let inner = Arc::clone(&inner);
                std::thread::Builder::new()
                    .name(format!("kubetun-crypto-{n}"))
                    .spawn(move || help(&inner))
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Self { inner, threads })
    }
}

/// A helper's life: wait for an offer with parts left, join it, work, leave; until stopped.
fn help(inner: &Inner) {
    // The offer last joined (a count of offers), so an offer made while we worked is seen.
    let mut joined = 0;
    loop {
        watch(inner, joined);
        let offer = {
            let mut offered = inner.offered.lock();
            loop {
                if inner.stop.load(Ordering::Relaxed) {
                    return;
                }
                if let Some(offer) = *offered {
                    // SAFETY: an offer in the slot is alive (see `OfferRef`).
                    #[allow(unsafe_code)]
                    let live = unsafe { &*offer.0 };
                    if live.next.load(Ordering::Relaxed) < live.parts {
                        live.joined.fetch_add(1, Ordering::Relaxed);
                        joined = inner.offers.load(Ordering::Relaxed);
                        break offer;
                    }
                }
                inner.wake.wait(&mut offered);
            }
        };
        // SAFETY: joined under the lock while offered, so `run` waits for us to leave.
        #[allow(unsafe_code)]
        let live = unsafe { &*offer.0 };
        let leave = Leave(&live.joined);
        live.work();
        drop(leave);
    }
}

/// Spins until an offer after the one `joined` names is made, or [`WATCH`] passes.
fn watch(inner: &Inner, joined: usize) {
    let start = std::time::Instant::now();
    while inner.offers.load(Ordering::Relaxed) == joined && start.elapsed() < WATCH {
        for _ in 0..32 {
            std::hint::spin_loop();
        }
    }
}

/// Leaves an offer (also when a job panicked): the last access to it.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl Workers for CryptoWorkers {
    fn width(&self) -> usize {
        self.threads.len() + 1
    }

    fn run(&self, parts: usize, job: &(dyn Fn(usize) + Sync)) {
        let offer = Offer {
            parts,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            joined: AtomicUsize::new(0),
            job,
        };
        let offered = parts > 1 && !self.threads.is_empty() && {
            let mut slot = self.inner.offered.lock();
            // One offer at a time: another task's run has the helpers, so this one runs here.
            slot.is_none() && {
                // SAFETY (lifetime erased): withdrawn below before `offer` goes out of scope.
                let erased = (&raw const offer).cast::<Offer<'static>>();
                *slot = Some(OfferRef(erased));
                self.inner.offers.fetch_add(1, Ordering::Relaxed);
                true
            }
        };
        if offered {
            for _ in 1..parts.min(self.width()) {
                self.inner.wake.notify_one();
            }
        }
        offer.work();
        if offered {
            *self.inner.offered.lock() = None;
            let mut spins = 0u32;
            while offer.joined.load(Ordering::Acquire) != 0 {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        assert_eq!(
            offer.done.load(Ordering::Acquire),
            parts,
            "a crypto worker's job panicked"
        );
    }
}

impl Drop for CryptoWorkers {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        {
            let _slot = self.inner.offered.lock();
            self.inner.wake.notify_all();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Mutex as StdMutex;
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn every_part_runs_once_and_helpers_take_some() {
        let workers = CryptoWorkers::new(2).expect("threads");
        assert_eq!(workers.width(), 2);
        let threads = StdMutex::new(HashSet::new());
        let deadline = Instant::now() + Duration::from_secs(10);
        // A helper wakes within microseconds; give it parts slow enough to be worth stealing.
        while threads.lock().unwrap().len() < 2 {
            assert!(Instant::now() < deadline, "no helper ever took a part");
            let ran: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
            workers.run(8, &|part| {
                std::thread::sleep(Duration::from_millis(1));
                ran[part].fetch_add(1, Ordering::Relaxed);
                threads.lock().unwrap().insert(std::thread::current().id());
            });
            assert!(ran.iter().all(|n| n.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn runs_from_several_threads_at_once_all_complete() {
        let workers = CryptoWorkers::new(3).expect("threads");
        let total = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for parts in 1..200 {
                        let count = AtomicUsize::new(0);
                        workers.run(parts % 16 + 1, &|_| {
                            count.fetch_add(1, Ordering::Relaxed);
                        });
                        assert_eq!(count.load(Ordering::Relaxed), parts % 16 + 1);
                        total.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * 199);
    }

    #[test]
    fn a_single_worker_runs_everything_on_the_caller() {
        let workers = CryptoWorkers::new(1).expect("no thread");
        let me = std::thread::current().id();
        workers.run(4, &|_| assert_eq!(std::thread::current().id(), me));
    }
}
