//! One handshake message (initiation, response, cookie reply): the shared rate limiter, the
//! peer lookup, the peer's `Tunn`, and what it answers, into the caller's [`Transmits`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::{Packet, TunnResult};

use super::timers::initiate_to;
use super::{Endpoint, MAX_PACKET, OVERHEAD, Step};
use crate::context::Context;
use crate::dispatch::{Incoming, classify, is_cookie_reply};
use crate::drops::DeviceDrop;
use crate::key::Key;
use crate::peer::Peer;
use crate::remap::{DropReason, PeerId};
use crate::snapshot::{Identity, PeerSlot, Snapshot};
use crate::transmits::Transmits;
use crate::workers::Workers;

/// The handshake worker's state: scratch space for boringtun's answers, and the peer whose
/// queued packets are still to be sent when the last call's [`Transmits`] filled up.
pub struct Handshake {
    scratch: Box<[u8]>,
    queued: Option<(Arc<Peer>, Endpoint)>,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field(
                "flushing",
                &self.queued.as_ref().map(|(peer, _)| peer.index),
            )
            .finish_non_exhaustive()
    }
}

impl Default for Handshake {
    fn default() -> Self {
        Self::new()
    }
}

/// One handshake message and where it came from.
#[derive(Clone, Copy)]
struct Message<'a> {
    source: Endpoint,
    datagram: &'a [u8],
    kind: Incoming,
}

impl Handshake {
    /// Scratch space for the largest datagram boringtun writes.
    pub fn new() -> Self {
        Self {
            scratch: vec![0; MAX_PACKET + OVERHEAD].into_boxed_slice(),
            queued: None,
        }
    }

    /// Finds the peer of the handshake message `datagram` from `source`, lets its `Tunn`
    /// process it and queues what that answers into `out` (a response, a cookie reply, the
    /// keepalive that confirms a session, the packets queued while there was none).
    /// [`Step::Flush`] when `out` filled up before every queued packet was in: send it, then
    /// call [`Self::resume`].
    pub fn process<W: Workers>(
        &mut self,
        cx: &Context<'_, W>,
        source: Endpoint,
        datagram: &[u8],
        out: &mut Transmits,
    ) -> Step {
        let (snapshot, drops, now) = (cx.snapshot, cx.drops, cx.now);
        self.queued = None;
        let message = Message {
            source,
            datagram,
            kind: classify(datagram),
        };
        if let Incoming::Data { .. } = message.kind {
            initiate_for_unknown_session(cx, source, out);
            return Step::Done;
        }
        let scratch = &mut self.scratch[..];
        let Some((id, addressed)) = find_peer(cx, message, scratch, out) else {
            return Step::Done;
        };
        let Some(slot) = snapshot.peer(id) else {
            drops.remap(DropReason::UnknownPeer);
            return Step::Done;
        };
        let Some(peer) = &slot.runtime else {
            drops.device(DeviceDrop::NoPrivateKey);
            return Step::Done;
        };
        let (kind, len) = (message.kind, datagram.len());
        match decapsulate(cx, slot, addressed, message, scratch) {
            TunnResult::Err(error) => {
                tracing::trace!(?error, %source, "handshake message rejected");
                drops.device(DeviceDrop::Rejected);
            }
            TunnResult::WriteToNetwork(reply) if is_cookie_reply(reply) => {
                // The limiter tripped between our check and the peer's: the sender is
                // unproven.
                drops.device(DeviceDrop::UnderLoad);
                out.push(reply, source, None, now);
            }
            TunnResult::WriteToNetwork(reply) => {
                accepted(peer, kind, source, len);
                if matches!(kind, Incoming::Initiation | Incoming::Response { .. }) {
                    peer.record_handshake(now.unix_ms);
                    tracing::debug!(
                        peer = %slot.config.display_name(),
                        endpoint = %source,
                        "handshake completed"
                    );
                }
                out.push(reply, source, Some(peer), now);
                self.queued = Some((Arc::clone(peer), source));
                return self.resume(cx, out);
            }
            TunnResult::Done => accepted(peer, kind, source, len),
            TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {
                // Only transport data decrypts to a packet, and data never reaches this path.
                drops.device(DeviceDrop::InvalidDatagram);
            }
        }
        Step::Done
    }

    /// Queues into `out` the packets the peer's `Tunn` kept while it had no session, now
    /// that the last message processed gave it one: [`Step::Flush`] while some are left.
    pub fn resume<W: Workers>(&mut self, cx: &Context<'_, W>, out: &mut Transmits) -> Step {
        let Some((peer, endpoint)) = &self.queued else {
            return Step::Done;
        };
        let instant = cx.now.instant();
        loop {
            if !out.has_room(self.scratch.len()) && !out.is_empty() {
                return Step::Flush;
            }
            let result = peer.tunn.lock().0.get(cx.now).decapsulate_at(
                None,
                &[],
                &mut self.scratch,
                instant,
            );
            match result {
                TunnResult::WriteToNetwork(datagram) => {
                    out.push(datagram, *endpoint, Some(peer), cx.now);
                }
                _ => break,
            }
        }
        self.queued = None;
        Step::Done
    }
}

/// The peer's `Tunn` processes the message. During a key rotation an initiation addressed
/// to the other one of our two keys is answered by a `Tunn` made with that key, which
/// replaces the peer's only if the handshake checks out (anyone can address an initiation to
/// our public key in the peer's name; only the peer can complete it). That is the new key
/// once the peer has learned it (it dropped its old-key sessions then), or the previous one
/// while it has not (after a restart our tunnels start on the new key; once one is proven by
/// a handshake, old-key initiations, which may be replays, no longer move it back).
fn decapsulate<'o, W: Workers>(
    cx: &Context<'_, W>,
    slot: &PeerSlot,
    addressed: Option<&Identity>,
    message: Message<'_>,
    out: &'o mut [u8],
) -> TunnResult<'o> {
    let (snapshot, now) = (cx.snapshot, cx.now);
    let Message {
        source, datagram, ..
    } = message;
    let Some(peer) = slot.runtime.as_deref() else {
        return TunnResult::Done;
    };
    let instant = now.instant();
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
            let result =
                moved
                    .0
                    .get(now)
                    .decapsulate_at(Some(source.remote.ip()), datagram, out, instant);
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
            .get(now)
            .decapsulate_at(Some(source.remote.ip()), datagram, out, instant),
    }
}

/// The peer at `source` sent data on a session we do not have (queued by the ingress core's
/// `report_unknown_session`): initiates a handshake, from our address the data arrived at,
/// unless the peer has a session or a handshake under way by now. The initiation is not
/// forced, so boringtun's own limit of one per REKEY_TIMEOUT holds.
fn initiate_for_unknown_session<W: Workers>(
    cx: &Context<'_, W>,
    source: Endpoint,
    out: &mut Transmits,
) {
    let Some((slot, peer)) = cx.snapshot.peer_at(source.remote) else {
        return;
    };
    peer.unknown_session_handled();
    let Some(peer) = &slot.runtime else { return };
    if initiate_to(peer, source, cx.now, out, false) {
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

/// The receiver lookup: by index for responses and cookies; by decrypting the initiator's
/// static key for initiations. Initiations and unsolicited responses pass the shared rate
/// limiter first, which answers with a cookie reply when over the allowance; a response to
/// an initiation of ours still unanswered only has its MAC checked (see
/// [`Identity::tunnel_limiter`]). During a key rotation a message
/// whose MAC does not match the current key is tried with the previous one; for an initiation
/// the pair it was addressed to is returned too (its peer's tunnel may have to move to it).
fn find_peer<'s, W: Workers>(
    cx: &Context<'s, W>,
    message: Message<'_>,
    scratch: &mut [u8],
    out: &mut Transmits,
) -> Option<(PeerId, Option<&'s Identity>)> {
    let (snapshot, drops, now) = (cx.snapshot, cx.drops, cx.now);
    let Message {
        source,
        datagram,
        kind,
    } = message;
    let instant = now.instant();
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
            let mut verified = limiter(current).verify_packet_at(
                Some(source.remote.ip()),
                datagram,
                scratch,
                instant,
            );
            if matches!(verified, Err(TunnResult::Err(WireGuardError::InvalidMac)))
                && let Some(previous) = current.previous.as_deref()
            {
                identity = previous;
                verified = limiter(previous).verify_packet_at(
                    Some(source.remote.ip()),
                    datagram,
                    scratch,
                    instant,
                );
            }
            let packet = match verified {
                Ok(packet) => packet,
                Err(TunnResult::WriteToNetwork(cookie)) => {
                    drops.device(DeviceDrop::UnderLoad);
                    out.push(cookie, source, None, now);
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
