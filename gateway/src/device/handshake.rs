//! The handshake worker: one thread at a lower priority that drains the
//! [`super::handshake_queue`] and hands each message to [`super::core::handshake::process`],
//! sending its replies straight from the thread (the sockets are non-blocking).

use std::sync::Weak;

use super::core::handshake::process;
use super::core::{MAX_PACKET, OVERHEAD};
use super::handshake_queue::HandshakeReceiver;
use super::net::Sender;
use super::shared::Shared;
use crate::clock;

/// The worker's nice value: below the data path's, so a flood yields the CPU to it.
const WORKER_NICE: i32 = 10;

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
    let mut out = vec![0u8; MAX_PACKET + OVERHEAD];
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
        process(
            &snapshot,
            &shared.drops,
            source,
            datagram,
            &mut out,
            &mut sender,
            now,
        );
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
