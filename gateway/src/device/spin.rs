//! The spin window: after the data path handled a batch, its thread keeps polling the TUN
//! device and the sockets for a short while (`--spin-window-us`, e.g.
//! [`LATENCY_SPIN_WINDOW`]) before it parks in
//! `epoll_wait`, so the answer to what it just sent is read without a thread wake-up.
//!
//! Why. At idle every packet of a round trip finds the gateway's thread asleep, and on a
//! virtual machine a wake-up of a thread whose vCPU halted costs tens of µs (an IPI to the
//! halted vCPU and the host scheduling it again; ~60 µs measured on the 2-vCPU benchmark
//! machine). With a multi-threaded runtime that parks at once, a ping through two gateways
//! woke a thread at every userspace hop (sender TUN read, receiver UDP read, the receiver's
//! TUN read of the echo reply its own write produced, often on the other worker, and the
//! reply back at the sender). With the window the sender is still polling when the reply
//! comes back, and the receiver reads the echo reply on the thread that wrote the request.
//! What is left are the wake-ups nothing but a core spinning for ever avoids (the first
//! packet after silence, on each side: `--busy-poll`), and the first packet's work on a
//! cold CPU (70–80 µs per gateway there, measured with `perf sched`).
//!
//! How. The window only works when one thread polls every data-path descriptor: the binary
//! runs the gateway on a current-thread tokio runtime when the window is on (one queue), and
//! [`spin_loop`] is a task on it that, while data moved in the last window, yields to the
//! scheduler (which then polls the I/O driver with a zero timeout and runs the reader tasks
//! whose descriptors are ready) and to the kernel (`sched_yield`, so that a thread woken on
//! the same CPU — the peer gateway, the application — runs at once instead of waiting for
//! the spinner's time slice to end). A yield that lets another thread run ends the window
//! early: the CPU is wanted, and a thread that parks is woken with priority where one that
//! keeps yielding waits for the others' time slices. Without traffic the spinner waits on
//! a [`Notify`]: an idle gateway costs nothing, and a spin costs at most one window per
//! burst of traffic.
//! On a multi-threaded runtime the I/O driver belongs to whichever worker parked in it, so
//! a spinning worker could not poll it; the device starts no spinner there.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The window measured for latency (`--spin-window-us 200`): it must outlast the round trip
/// to the peer gateway and back, wake-up of the peer included (100–150 µs on the benchmark
/// machine), and costs at most this much CPU per burst of traffic. Off by default: the
/// window puts the whole gateway on one thread (both directions' crypto, the control API),
/// the opposite of spreading a fat peer over several cores, and costs 10–15 % more CPU under
/// load for 23–62 µs of idle round trip on the benchmark machine.
pub const LATENCY_SPIN_WINDOW: Duration = Duration::from_micros(200);

/// A `sched_yield` that returns later than this let another thread run: the spinner parks
/// instead of competing for the CPU (a bare `sched_yield` takes 1–3 µs on the benchmark VM).
const CONTENDED: Duration = Duration::from_micros(30);

/// The data path's activity, as the spinner sees it: a batch counter and whether the
/// spinner waits for the next batch.
#[derive(Debug, Default)]
pub struct Activity {
    /// Whether a spinner runs; set once when it starts, so without one (the default) the
    /// readers touch no line another thread writes.
    spinning: AtomicBool,
    batches: AtomicU64,
    parked: AtomicBool,
    wake: Notify,
}

impl Activity {
    /// Called by the reader tasks for every batch read: without a spinner nothing; with
    /// one, a relaxed increment, plus a notification when the spinner waits (the first batch
    /// after silence).
    #[inline]
    pub fn mark(&self) {
        if !self.spinning.load(Ordering::Relaxed) {
            return;
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        if self.parked.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }
}

/// Whether a spinner can work on the runtime the caller runs on (a current-thread one).
pub fn runtime_supports_spinning() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// Spins for `window` after every batch the data path marks in `activity` (see the module
/// docs). Runs until aborted with the device's other tasks.
pub async fn spin_loop(activity: Arc<Activity>, window: Duration) {
    activity.spinning.store(true, Ordering::Relaxed);
    loop {
        activity.parked.store(true, Ordering::SeqCst);
        activity.wake.notified().await;
        activity.parked.store(false, Ordering::SeqCst);
        let mut seen = activity.batches.load(Ordering::Relaxed);
        let mut until = Instant::now() + window;
        loop {
            tokio::task::yield_now().await;
            let yielded = Instant::now();
            std::thread::yield_now();
            let now = Instant::now();
            // Another thread ran on this CPU meanwhile: the CPU is wanted, and a spinner
            // that keeps yielding to it could wait a whole time slice for its turn, where
            // a parked thread would be woken at once.
            if now - yielded > CONTENDED {
                break;
            }
            let batches = activity.batches.load(Ordering::Relaxed);
            if batches != seen {
                seen = batches;
                until = now + window;
            } else if now >= until {
                break;
            }
        }
    }
}
