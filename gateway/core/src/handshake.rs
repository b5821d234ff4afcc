//! One handshake message (initiation, response, cookie reply): the shared rate limiter, the
//! peer lookup, the peer's `Tunn`, and what it answers.

use std::sync::atomic::Ordering;

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::{Packet, TunnResult};

use super::timers::initiate_to;
use super::{Endpoint, Now, Transmit, transmit_to_peer};
use crate::dispatch::{Incoming, classify, is_cookie_reply};
use crate::drops::{DeviceDrop, Drops};
use crate::key::Key;
use crate::peer::Peer;
use crate::remap::{DropReason, PeerId};
use crate::snapshot::{Identity, PeerSlot, Snapshot};

/// Finds the peer of the handshake message `datagram` from `source`, lets its `Tunn`
/// process it and sends what that answers (a response, a cookie reply, the keepalive that
/// confirms a session, the packets queued while there was none). `out` is scratch space of
/// at least `MAX_PACKET + OVERHEAD` bytes.
pub fn process(
    snapshot: &Snapshot,
    drops: &Drops,
    source: Endpoint,
    datagram: &[u8],
    out: &mut [u8],
    transmit: &mut impl Transmit,
    now: Now,
) {
    let kind = classify(datagram);
    if let Incoming::Data { .. } = kind {
        initiate_for_unknown_session(snapshot, source, out, transmit, now);
        return;
    }
    let Some((id, addressed)) = find_peer(snapshot, drops, source, datagram, kind, out, transmit)
    else {
        return;
    };
    let Some(slot) = snapshot.peer(id) else {
        drops.remap(DropReason::UnknownPeer);
        return;
    };
    let Some(peer) = slot.runtime.as_deref() else {
        drops.device(DeviceDrop::NoPrivateKey);
        return;
    };
    let result = decapsulate(snapshot, slot, peer, addressed, source, datagram, out, now);
    match result {
        TunnResult::Err(error) => {
            tracing::trace!(?error, %source, "handshake message rejected");
            drops.device(DeviceDrop::Rejected);
        }
        TunnResult::WriteToNetwork(reply) if is_cookie_reply(reply) => {
            // The limiter tripped between our check and the peer's: the sender is unproven.
            drops.device(DeviceDrop::UnderLoad);
            transmit.transmit(reply, source);
        }
        TunnResult::WriteToNetwork(reply) => {
            accepted(peer, kind, source, datagram.len());
            if matches!(kind, Incoming::Initiation | Incoming::Response { .. }) {
                peer.record_handshake(now.unix_ms);
                tracing::debug!(
                    peer = %slot.config.display_name(),
                    endpoint = %source,
                    "handshake completed"
                );
            }
            transmit_to_peer(transmit, peer, reply, source, now);
            flush_queued(peer, source, out, transmit, now);
        }
        TunnResult::Done => accepted(peer, kind, source, datagram.len()),
        TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {
            // Only transport data decrypts to a packet, and data never reaches this path.
            drops.device(DeviceDrop::InvalidDatagram);
        }
    }
}

/// The peer's `Tunn` processes the message. During a key rotation an initiation addressed
/// to the other one of our two keys is answered by a `Tunn` made with that key, which
/// replaces the peer's only if the handshake checks out (anyone can address an initiation to
/// our public key in the peer's name; only the peer can complete it). That is the new key
/// once the peer has learned it (it dropped its old-key sessions then), or the previous one
/// while it has not (after a restart our tunnels start on the new key; once one is proven by
/// a handshake, old-key initiations, which may be replays, no longer move it back).
#[allow(clippy::too_many_arguments)]
fn decapsulate<'o>(
    snapshot: &Snapshot,
    slot: &PeerSlot,
    peer: &Peer,
    addressed: Option<&Identity>,
    source: Endpoint,
    datagram: &[u8],
    out: &'o mut [u8],
    now: Now,
) -> TunnResult<'o> {
    let mut tunn = peer.tunn.lock();
    let to_current = |identity: &Identity| {
        snapshot
            .identity
            .as_deref()
            .is_some_and(|current| current.public == identity.public)
    };
    match addressed {
        Some(identity)
            if tunn.1 != identity.public_key()
                && (to_current(identity) || !peer.proven_on_its_key()) =>
        {
            let mut moved = identity.tunn(&slot.config, peer.index);
            let result = moved
                .0
                .get()
                .decapsulate(Some(source.remote.ip()), datagram, out);
            if matches!(&result, TunnResult::WriteToNetwork(reply) if !is_cookie_reply(reply)) {
                *tunn = moved;
                peer.stats
                    .key_since_ms
                    .store(now.unix_ms, Ordering::Relaxed);
                let key = if to_current(identity) {
                    "new"
                } else {
                    "previous"
                };
                tracing::info!(peer = %slot.config.display_name(), key, "peer's tunnel moved to another of our keys");
            }
            result
        }
        _ => tunn
            .0
            .get()
            .decapsulate(Some(source.remote.ip()), datagram, out),
    }
}

/// The peer at `source` sent data on a session we do not have (queued by the ingress core's
/// `report_unknown_session`): initiates a handshake, from our address the data arrived at,
/// unless the peer has a session or a handshake under way by now. The initiation is not
/// forced, so boringtun's own limit of one per REKEY_TIMEOUT holds.
fn initiate_for_unknown_session(
    snapshot: &Snapshot,
    source: Endpoint,
    out: &mut [u8],
    transmit: &mut impl Transmit,
    now: Now,
) {
    let Some((slot, peer)) = snapshot.peer_at(source.remote) else {
        return;
    };
    peer.unknown_session_handled();
    if initiate_to(peer, source, now, transmit, out, false) {
        tracing::debug!(
            peer = %slot.config.display_name(),
            endpoint = %source,
            "the peer sends on a session we do not have; initiating a handshake"
        );
    }
}

/// Whether the peer with local index `receiver` has an initiation of ours unanswered.
fn awaits_response(snapshot: &Snapshot, receiver: u32) -> bool {
    snapshot
        .by_index
        .get(&receiver)
        .and_then(|id| snapshot.peer(*id)?.runtime.as_deref())
        .is_some_and(|peer| {
            peer.stats
                .handshake_pending_since_ms
                .load(Ordering::Relaxed)
                != 0
        })
}

fn accepted(peer: &Peer, kind: Incoming, source: Endpoint, len: usize) {
    if kind.authenticates_source() {
        peer.roam(source);
    }
    peer.record_received(len);
}

/// Sends the packets `Tunn` queued while it had no session, now that it has one.
fn flush_queued(
    peer: &Peer,
    endpoint: Endpoint,
    out: &mut [u8],
    transmit: &mut impl Transmit,
    now: Now,
) {
    loop {
        let result = peer.tunn.lock().0.get().decapsulate(None, &[], out);
        match result {
            TunnResult::WriteToNetwork(datagram) => {
                transmit_to_peer(transmit, peer, datagram, endpoint, now);
            }
            _ => return,
        }
    }
}

/// The receiver lookup: by index for responses and cookies; by decrypting the initiator's
/// static key for initiations. Initiations and unsolicited responses pass the shared rate
/// limiter first, which answers with a cookie reply when over the allowance; a response to
/// an initiation of ours still unanswered only has its MAC checked (see
/// [`Identity::tunnel_limiter`]). During a key rotation a message
/// whose MAC does not match the current key is tried with the previous one; for an initiation
/// the pair it was addressed to is returned too (its peer's tunnel may have to move to it).
fn find_peer<'s>(
    snapshot: &'s Snapshot,
    drops: &Drops,
    source: Endpoint,
    datagram: &[u8],
    kind: Incoming,
    out: &mut [u8],
    transmit: &mut impl Transmit,
) -> Option<(PeerId, Option<&'s Identity>)> {
    let Some(current) = snapshot.identity.as_deref() else {
        drops.device(DeviceDrop::NoPrivateKey);
        return None;
    };
    let mut identity = current;
    let receiver = match kind {
        Incoming::Invalid | Incoming::Data { .. } => {
            drops.device(DeviceDrop::InvalidDatagram);
            return None;
        }
        Incoming::Initiation | Incoming::Response { .. } => {
            let solicited = matches!(kind, Incoming::Response { receiver } if awaits_response(snapshot, receiver));
            let limiter = |identity: &'s Identity| {
                if solicited {
                    &identity.tunnel_limiter
                } else {
                    &identity.rate_limiter
                }
            };
            let mut verified =
                limiter(current).verify_packet(Some(source.remote.ip()), datagram, out);
            if matches!(verified, Err(TunnResult::Err(WireGuardError::InvalidMac)))
                && let Some(previous) = current.previous.as_deref()
            {
                identity = previous;
                verified = limiter(previous).verify_packet(Some(source.remote.ip()), datagram, out);
            }
            let packet = match verified {
                Ok(packet) => packet,
                Err(TunnResult::WriteToNetwork(cookie)) => {
                    drops.device(DeviceDrop::UnderLoad);
                    transmit.transmit(cookie, source);
                    return None;
                }
                Err(_) => {
                    drops.device(DeviceDrop::Rejected);
                    return None;
                }
            };
            match packet {
                Packet::HandshakeInit(init) => {
                    let Ok(half) = parse_handshake_anon(&identity.private, &identity.public, &init)
                    else {
                        drops.device(DeviceDrop::Rejected);
                        return None;
                    };
                    let key = Key::from_bytes(half.peer_static_public);
                    return match snapshot.by_key.get(&key) {
                        Some(id) => Some((*id, Some(identity))),
                        None => {
                            tracing::debug!(%source, "handshake from an unknown public key");
                            drops.device(DeviceDrop::UnknownInitiator);
                            None
                        }
                    };
                }
                Packet::HandshakeResponse(response) => response.receiver_idx >> 8,
                Packet::PacketCookieReply(_) | Packet::PacketData(_) => {
                    drops.device(DeviceDrop::InvalidDatagram);
                    return None;
                }
            }
        }
        Incoming::CookieReply { receiver } => receiver,
    };
    match snapshot.by_index.get(&receiver) {
        Some(id) => Some((*id, None)),
        None => {
            drops.device(DeviceDrop::UnknownReceiver);
            None
        }
    }
}
