//! Ingress: received datagrams → classification → `Tunn` → probes consumed → remap → IP
//! packets in the TUN write batch; handshake messages to the handshake queue.

use boringtun::noise::TunnResult;

use super::PacketSink;
use super::timers::send_probe;
use super::{HandshakeSink, Now, PROBE_ROOM, Step, Transmit};
use crate::batch::{Datagram, Position, RecvBatch};
use crate::conncheck::{self, Probe, ProbeKind};
use crate::dispatch::{Incoming, MIN_DATA_LEN, classify};
use crate::drops::{DeviceDrop, Drops};
use crate::peer::Peer;
use crate::remap::{DropReason, PeerId, Verdict};
use crate::snapshot::Snapshot;

/// One ingress task's batch state: the data messages grouped by peer and how far their
/// decryption got.
#[derive(Debug)]
pub struct Ingress {
    /// `(peer, arrival sequence, place in the batch)`, sorted: each peer's messages in
    /// arrival order.
    pending: Vec<(PeerId, u32, Position)>,
    /// The next entry of `pending` to decrypt.
    next: usize,
}

impl Ingress {
    /// Room for `datagrams` datagrams per batch.
    pub fn new(datagrams: usize) -> Self {
        Self {
            pending: Vec::with_capacity(datagrams),
            next: 0,
        }
    }

    /// Sorts a new batch: data messages are grouped by the peer their receiver index names,
    /// handshake messages go to `handshakes`, the rest is dropped and counted.
    pub fn classify(
        &mut self,
        snapshot: &Snapshot,
        drops: &Drops,
        batch: &RecvBatch,
        handshakes: &mut impl HandshakeSink,
    ) {
        self.pending.clear();
        self.next = 0;
        drops.device_many(DeviceDrop::InvalidDatagram, batch.rejected() as u64);
        for (sequence, datagram) in batch.datagrams().enumerate() {
            match classify(datagram.bytes) {
                Incoming::Data { receiver } => match snapshot.by_index.get(&receiver) {
                    Some(id) => self.pending.push((*id, sequence as u32, datagram.position)),
                    None => {
                        drops.device(DeviceDrop::UnknownReceiver);
                        report_unknown_session(snapshot, &datagram, handshakes);
                    }
                },
                Incoming::Invalid => drops.device(DeviceDrop::InvalidDatagram),
                // A handshake completing behind data of the same batch is harmless: a session's
                // first data message can only follow the handshake that created it.
                Incoming::Initiation | Incoming::Response { .. } | Incoming::CookieReply { .. } => {
                    if !handshakes.offer(datagram.reply_to(), datagram.bytes) {
                        drops.device(DeviceDrop::HandshakeQueueFull);
                    }
                }
            }
        }
        self.pending.sort_unstable();
    }

    /// Decrypts the data messages into `writer`, peer by peer, in arrival order per peer,
    /// under one `Tunn` lock per batch fill, translating each packet (source check, ACL,
    /// real → view) in place. Probe PINGs are answered through `transmit`. [`Step::Flush`]
    /// when the TUN batch is full: write it, then call again.
    pub fn decrypt(
        &mut self,
        snapshot: &Snapshot,
        drops: &Drops,
        batch: &RecvBatch,
        writer: &mut impl PacketSink,
        transmit: &mut impl Transmit,
        now: Now,
    ) -> Step {
        while self.next < self.pending.len() {
            let id = self.pending[self.next].0;
            let end = self.next
                + self.pending[self.next..]
                    .iter()
                    .take_while(|(peer, _, _)| *peer == id)
                    .count();
            let lost = (end - self.next) as u64;
            let Some(slot) = snapshot.peer(id) else {
                drops.remap_many(DropReason::UnknownPeer, lost);
                self.next = end;
                continue;
            };
            let Some(peer) = slot.runtime.as_deref() else {
                drops.device_many(DeviceDrop::NoPrivateKey, lost);
                self.next = end;
                continue;
            };
            let mut probes = ProbeInbox::default();
            let (mut bytes, mut accepted, mut rejected) = (0usize, 0u64, 0u64);
            let mut last_source = None;
            {
                let mut cell = peer.tunn.lock();
                let tunn = cell.0.get();
                while self.next < end {
                    let position = self.pending[self.next].2;
                    let Some(space) = writer.space() else { break };
                    self.next += 1;
                    let datagram = batch.get(position);
                    match tunn.decapsulate(Some(datagram.source.ip()), datagram.bytes, space) {
                        TunnResult::WriteToTunnelV4(packet, _)
                        | TunnResult::WriteToTunnelV6(packet, _) => {
                            bytes += datagram.bytes.len();
                            accepted += 1;
                            last_source = Some(datagram.reply_to());
                            if probes.take(drops, peer, packet, now) {
                                continue; // a connectivity probe, the gateway's own
                            }
                            let len = packet.len();
                            match snapshot.remap.ingress(id, packet) {
                                Verdict::Deliver => writer.commit(len),
                                Verdict::Drop(reason) => {
                                    tracing::trace!(%reason, peer = id, "ingress drop");
                                    drops.remap(reason);
                                }
                                Verdict::Forward(_) => drops.remap(DropReason::BadPacket),
                            }
                        }
                        TunnResult::Done => {
                            // A keepalive.
                            bytes += datagram.bytes.len();
                            accepted += 1;
                            last_source = Some(datagram.reply_to());
                        }
                        TunnResult::WriteToNetwork(_) => {
                            // Transport data never asks for a reply; nothing to send.
                            tracing::trace!("unexpected reply to a data message");
                        }
                        TunnResult::Err(error) => {
                            tracing::trace!(?error, source = %datagram.source, "datagram rejected");
                            rejected += 1;
                        }
                    }
                }
            }
            peer.record_received_batch(bytes, accepted);
            if let Some(source) = last_source {
                peer.roam(source);
            }
            probes.answer(peer, transmit, now);
            drops.device_many(DeviceDrop::Rejected, rejected);
            if self.next < end {
                return Step::Flush;
            }
        }
        Step::Done
    }
}

/// A data message for a session we do not have, from where a peer was configured to be: the
/// peer still holds a session with a previous run of this gateway (we restarted). Its header
/// goes to the handshake worker, which initiates at once ([`super::handshake::process`])
/// instead of leaving the peer to notice after 15 s of unanswered data; at most one per
/// peer waits in the queue, and none while a handshake of ours is under way.
fn report_unknown_session(
    snapshot: &Snapshot,
    datagram: &Datagram<'_>,
    handshakes: &mut impl HandshakeSink,
) {
    let Some((_, peer)) = snapshot.peer_at(datagram.source) else {
        return;
    };
    if peer.report_unknown_session()
        && !handshakes.offer(datagram.reply_to(), &datagram.bytes[..MIN_DATA_LEN])
    {
        peer.unknown_session_handled();
    }
}

/// Probes found among one peer's decrypted packets. A PONG is recorded at once; a PING is
/// kept and answered by [`ProbeInbox::answer`] after the `Tunn` lock is released.
#[derive(Debug, Default)]
struct ProbeInbox {
    ping: Option<Probe>,
}

impl ProbeInbox {
    /// Consumes `packet` when it is addressed to the probe prefix and returns true; such a
    /// packet never reaches the remap stage or the TUN device. One that is not a well-formed
    /// probe is counted as a bad packet. Every other packet: false, untouched.
    fn take(&mut self, drops: &Drops, peer: &Peer, packet: &[u8], now: Now) -> bool {
        if !conncheck::is_probe_destination(packet) {
            return false;
        }
        match conncheck::parse(packet) {
            Some(probe) if probe.kind == ProbeKind::Pong => {
                let outcome = peer.conncheck.lock().on_pong(probe.seq, now.mono_us);
                tracing::trace!(
                    index = peer.index,
                    seq = probe.seq,
                    ?outcome,
                    "probe answered"
                );
            }
            // Only the latest PING of a batch is answered; PINGs come one per interval.
            Some(ping) => self.ping = Some(ping),
            None => drops.remap(DropReason::BadPacket),
        }
        true
    }

    /// Sends the PONG for the PING taken, if any, through the same peer's session.
    fn answer(&mut self, peer: &Peer, transmit: &mut impl Transmit, now: Now) {
        let Some(ping) = self.ping.take() else { return };
        let Some(endpoint) = peer.endpoint() else {
            return;
        };
        let mut out = [0u8; PROBE_ROOM];
        send_probe(peer, endpoint, ping.answer(), transmit, &mut out, now);
    }
}
