//! The handshake worker: one thread at a lower priority that drains the
//! [`super::handshake_queue`] and hands each message to the core's
//! [`Handshake::process`], then sends what it returned straight from the thread (the
//! sockets are non-blocking).

use std::sync::Weak;

use super::handshake_queue::HandshakeReceiver;
use super::net::Sender;
use super::shared::Shared;
use crate::clock;
use kubetun_gateway_core::context::Context;
use kubetun_gateway_core::handshake::Handshake;
use kubetun_gateway_core::transmits::Transmits;
use kubetun_gateway_core::{MAX_PACKET, OVERHEAD, Step};

/// The worker's nice value: below the data path's, so a flood yields the CPU to it.
const WORKER_NICE: i32 = 10;
/// Datagrams one handshake message may answer with before they are sent.
const TRANSMITS: usize = 64;

/// Starts the worker thread. It holds the device weakly and ends when the queue's sender is
/// dropped with the device.
pub fn spawn_worker(shared: Weak<Shared>, queue: HandshakeReceiver) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("kubetun-handshake".into())
        .spawn(move || run_worker(&shared, &queue))
        .map(drop)
}

fn run_worker(shared: &Weak<Shared>, queue: &HandshakeReceiver) {
    lower_priority();
    let mut handshake = Handshake::new();
    // A reply, and the packets a peer queued during its handshake (flushed when full).
    let mut out = Transmits::new(TRANSMITS, 2 * (MAX_PACKET + OVERHEAD));
    while let Some(message) = queue.recv() {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let now = clock::now();
        // Answering would move the remote's endpoint to a standby.
        if shared.drops_on_standby(now.mono_us, || 1) {
            continue;
        }
        let snapshot = shared.snapshot.load();
        let sockets = shared.sockets.load();
        let mut sender = Sender::new(&sockets, &shared.drops);
        let (source, datagram) = (message.source(), message.datagram());
        let cx = Context::new(&snapshot, &shared.drops, now);
        let mut step = handshake.process(&cx, source, datagram, &mut out);
        sender.send(&mut out);
        while step == Step::Flush {
            step = handshake.resume(&cx, &mut out);
            sender.send(&mut out);
        }
    }
}

/// Lowers this thread's priority (Linux nice values are per thread). Failing leaves the
/// default priority, which is still correct, only less protective.
fn lower_priority() {
    // SAFETY: setpriority only reads its integer arguments; `who = 0` is the calling thread.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, WORKER_NICE) };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "could not lower the handshake worker's priority"
        );
    }
}
