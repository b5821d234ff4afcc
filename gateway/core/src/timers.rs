//! What happens to peers by time rather than by traffic: boringtun's timers and the
//! persistent keepalive every tick, the initiations after an apply, and connectivity probes.
//! What they send goes into the caller's [`Transmits`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use boringtun::noise::TunnResult;

use super::{Endpoint, HANDSHAKE_ROOM, Now, PROBE_ROOM, Step};
use crate::conncheck::Probe;
use crate::context::Context;
use crate::dispatch::is_initiation;
use crate::peer::Peer;
use crate::snapshot::{PeerSlot, Snapshot};
use crate::transmits::Transmits;
use crate::workers::Workers;

/// Runs of boringtun's timers over every peer of a snapshot, resumed where the last call
/// stopped when its [`Transmits`] filled up.
#[derive(Debug, Default)]
pub struct Tick {
    /// The next peer slot to tick.
    next: usize,
}

impl Tick {
    /// Runs boringtun's timers for every peer of the context's snapshot (handshake
    /// retries, rekey, expiry, passive keepalive) and queues the persistent keepalive of those
    /// due at its time into `out`. [`Step::Flush`] when `out` is full: send it, then call
    /// again (with the same snapshot) to tick the rest.
    pub fn run<W: Workers>(&mut self, cx: &Context<'_, W>, out: &mut Transmits) -> Step {
        for (_, slot) in cx.snapshot.slots().skip(self.next) {
            // A peer sends at most a timer message and a keepalive.
            if !out.has_room_for(2, 2 * HANDSHAKE_ROOM) && !out.is_empty() {
                return Step::Flush;
            }
            tick_peer(slot, cx.now, out);
            self.next += 1;
        }
        self.next = 0;
        Step::Done
    }
}

fn tick_peer(slot: &PeerSlot, now: Now, out: &mut Transmits) {
    let Some(peer) = &slot.runtime else { return };
    let endpoint = peer.endpoint();
    let mut queued = false;
    {
        let mut cell = peer.tunn.lock();
        if let Some(tunn) = cell.0.made_mut()
            && let Some(space) = out.space(HANDSHAKE_ROOM)
        {
            match tunn.update_timers_at(space, now.instant()) {
                TunnResult::WriteToNetwork(datagram) => {
                    if let Some(endpoint) = endpoint {
                        let len = datagram.len();
                        out.commit(endpoint, len, Some(peer), now);
                        queued = true;
                    }
                }
                TunnResult::Err(error) => tracing::trace!(?error, "peer timer"),
                _ => {}
            }
        }
    }
    let keepalive_ms = u64::from(slot.config.persistent_keepalive) * 1000;
    let Some(endpoint) = endpoint else { return };
    let last_sent = peer.stats.last_sent_ms.load(Ordering::Relaxed);
    // A message the timers just queued is sent at `now` (it is counted once it left).
    if keepalive_ms > 0 && !queued && now.unix_ms.saturating_sub(last_sent) >= keepalive_ms {
        let mut cell = peer.tunn.lock();
        if let Some(space) = out.space(HANDSHAKE_ROOM)
            && let TunnResult::WriteToNetwork(datagram) =
                cell.0.get(now).encapsulate_at(&[], space, now.instant())
        {
            let len = datagram.len();
            out.commit(endpoint, len, Some(peer), now);
        }
    }
}

/// Resets the counts of the handshake rate limiters (once a second).
pub fn reset_rate_limiters(snapshot: &Snapshot, now: Now) {
    if let Some(identity) = &snapshot.identity {
        identity.reset_rate_limiters(now);
    }
}

/// Queues a handshake initiation to `slot`'s peer into `out` if it has an endpoint, no
/// session and no handshake in flight, or with `force` (a promotion) whenever it has an
/// endpoint; true when one was queued (false too when `out` has no room left).
pub fn initiate_session(slot: &PeerSlot, now: Now, out: &mut Transmits, force: bool) -> bool {
    let Some(peer) = &slot.runtime else {
        return false;
    };
    let Some(endpoint) = peer.endpoint() else {
        return false;
    };
    initiate_to(peer, endpoint, now, out, force)
}

/// Queues a handshake initiation to `peer` at `endpoint` into `out` unless it has a session
/// or a handshake in flight (with `force`: always); true when one was queued.
pub fn initiate_to(
    peer: &Arc<Peer>,
    endpoint: Endpoint,
    now: Now,
    out: &mut Transmits,
    force: bool,
) -> bool {
    let instant = now.instant();
    let length = {
        let mut cell = peer.tunn.lock();
        let tunn = cell.0.get(now);
        if !force && tunn.stats_at(instant).0.is_some() {
            return false;
        }
        let Some(space) = out.space(HANDSHAKE_ROOM) else {
            return false;
        };
        if force {
            // A promoted replica's timers did not run on standby (the shells skip them), and
            // boringtun dates a new session by its last timer run: bring that up to date, or
            // a session made after a standby longer than 180 s expires at the next tick.
            // What the timers would send now is superseded by this initiation.
            let _superseded = tunn.update_timers_at(space, instant);
        }
        match tunn.format_handshake_initiation_at(space, force, instant) {
            TunnResult::WriteToNetwork(datagram) => datagram.len(),
            _ => return false,
        }
    };
    out.commit(endpoint, length, Some(peer), now);
    true
}

/// Encrypts `probe` with the peer's session and queues it into `out`; true when it goes as
/// a probe at once. Without a session boringtun queues it (sent once a handshake completes)
/// and starts a handshake instead, whose initiation is queued, so probes also bring a tunnel
/// up.
pub fn send_probe(
    peer: &Arc<Peer>,
    endpoint: Endpoint,
    probe: Probe,
    now: Now,
    out: &mut Transmits,
) -> bool {
    let packet = probe.encode();
    let Some(space) = out.space(PROBE_ROOM) else {
        tracing::trace!(index = peer.index, "probe not sent: no room");
        return false;
    };
    let result = peer
        .tunn
        .lock()
        .0
        .get(now)
        .encapsulate_at(&packet, space, now.instant());
    match result {
        TunnResult::WriteToNetwork(datagram) => {
            let direct = !is_initiation(datagram);
            tracing::trace!(index = peer.index, seq = probe.seq, kind = ?probe.kind, direct, "probe sent");
            let len = datagram.len();
            out.commit(endpoint, len, Some(peer), now);
            direct
        }
        TunnResult::Err(error) => {
            tracing::trace!(?error, "probe not encrypted");
            false
        }
        _ => false,
    }
}
