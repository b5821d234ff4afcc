//! What happens to peers by time rather than by traffic: boringtun's timers and the
//! persistent keepalive every tick, the initiations after an apply, and connectivity probes.

use std::sync::atomic::Ordering;

use boringtun::noise::TunnResult;

use super::{Endpoint, Now, Transmit, transmit_to_peer};
use crate::conncheck::Probe;
use crate::dispatch::is_initiation;
use crate::peer::Peer;
use crate::snapshot::{PeerSlot, Snapshot};

/// Runs boringtun's timers for every peer of `snapshot` (handshake retries, rekey, expiry,
/// passive keepalive) and sends the persistent keepalive of those due at `now`. `out` must
/// hold a handshake initiation or a keepalive (148 bytes).
pub fn tick(snapshot: &Snapshot, now: Now, transmit: &mut impl Transmit, out: &mut [u8]) {
    for (_, slot) in snapshot.slots() {
        tick_peer(slot, now, transmit, out);
    }
}

fn tick_peer(slot: &PeerSlot, now: Now, transmit: &mut impl Transmit, out: &mut [u8]) {
    let Some(peer) = &slot.runtime else { return };
    let endpoint = peer.endpoint();
    let result = match peer.tunn.lock().0.made_mut() {
        Some(tunn) => tunn.update_timers(out),
        None => TunnResult::Done,
    };
    match result {
        TunnResult::WriteToNetwork(datagram) => {
            if let Some(endpoint) = endpoint {
                transmit_to_peer(transmit, peer, datagram, endpoint, now);
            }
        }
        TunnResult::Err(error) => tracing::trace!(?error, "peer timer"),
        _ => {}
    }
    let keepalive_ms = u64::from(slot.config.persistent_keepalive) * 1000;
    let Some(endpoint) = endpoint else { return };
    let last_sent = peer.stats.last_sent_ms.load(Ordering::Relaxed);
    if keepalive_ms > 0 && now.unix_ms.saturating_sub(last_sent) >= keepalive_ms {
        let result = peer.tunn.lock().0.get().encapsulate(&[], out);
        if let TunnResult::WriteToNetwork(datagram) = result {
            transmit_to_peer(transmit, peer, datagram, endpoint, now);
        }
    }
}

/// Resets the counts of the handshake rate limiters (once a second).
pub fn reset_rate_limiters(snapshot: &Snapshot) {
    if let Some(identity) = &snapshot.identity {
        identity.reset_rate_limiters();
    }
}

/// Sends a handshake initiation to `slot`'s peer if it has an endpoint, no session and no
/// handshake in flight, or with `force` (a promotion) whenever it has an endpoint; true when
/// one was sent.
/// `out` must hold 148 bytes.
pub fn initiate_session(
    slot: &PeerSlot,
    now: Now,
    transmit: &mut impl Transmit,
    out: &mut [u8],
    force: bool,
) -> bool {
    let Some(peer) = &slot.runtime else {
        return false;
    };
    let Some(endpoint) = peer.endpoint() else {
        return false;
    };
    initiate_to(peer, endpoint, now, transmit, out, force)
}

/// Sends a handshake initiation to `peer` at `endpoint` unless it has a session or a
/// handshake in flight (with `force`: always); true when one was sent. `out` must hold 148
/// bytes.
pub fn initiate_to(
    peer: &Peer,
    endpoint: Endpoint,
    now: Now,
    transmit: &mut impl Transmit,
    out: &mut [u8],
    force: bool,
) -> bool {
    let length = {
        let mut cell = peer.tunn.lock();
        let tunn = cell.0.get();
        if !force && tunn.stats().0.is_some() {
            return false;
        }
        if force {
            // A promoted replica's timers did not run on standby (the shells skip them), and
            // boringtun dates a new session by its last timer run: bring that up to date, or
            // a session made after a standby longer than 180 s expires at the next tick.
            // What the timers would send now is superseded by this initiation.
            let _superseded = tunn.update_timers(out);
        }
        match tunn.format_handshake_initiation(out, force) {
            TunnResult::WriteToNetwork(datagram) => datagram.len(),
            _ => return false,
        }
    };
    transmit_to_peer(transmit, peer, &out[..length], endpoint, now);
    true
}

/// Encrypts `probe` with the peer's session and sends it; true when it left at once. Without
/// a session boringtun queues it (sent once a handshake completes) and sends a handshake
/// initiation instead, so probes also bring a tunnel up.
pub fn send_probe(
    peer: &Peer,
    endpoint: Endpoint,
    probe: Probe,
    transmit: &mut impl Transmit,
    out: &mut [u8],
    now: Now,
) -> bool {
    let packet = probe.encode();
    let result = peer.tunn.lock().0.get().encapsulate(&packet, out);
    match result {
        TunnResult::WriteToNetwork(datagram) => {
            let direct = !is_initiation(datagram);
            tracing::trace!(index = peer.index, seq = probe.seq, kind = ?probe.kind, direct, "probe sent");
            transmit_to_peer(transmit, peer, datagram, endpoint, now);
            direct
        }
        TunnResult::Err(error) => {
            tracing::trace!(?error, "probe not encrypted");
            false
        }
        _ => false,
    }
}
