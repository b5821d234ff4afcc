//! Ingress: received datagrams → classification → opened with the peer's session → probes
//! consumed → remap → admission → IP packets in the TUN write batch; handshake messages to the handshake
//! queue.

use std::sync::Arc;

use boringtun::noise::{Packet, Session, Tunn, TunnResult};

use super::PacketSink;
use super::timers::send_probe;
use super::{Now, PROBE_ROOM, Step};
use crate::admission::flows::FlowTable;
use crate::batch::{Datagram, Position, RecvBatch};
use crate::conncheck::{self, Probe, ProbeKind};
use crate::context::{Context, PeerRun};
use crate::dispatch::{Incoming, MIN_DATA_LEN, classify};
use crate::drops::{DeviceDrop, Drops};
use crate::endpoint::Endpoint;
use crate::peer::Peer;
use crate::remap::{DropReason, PeerId, Verdict};
use crate::snapshot::Snapshot;
use crate::transmits::Transmits;
use crate::workers::{Workers, outside_the_lock, part_end, parts_for, run_parts};

/// One ingress task's batch state: the data messages grouped by peer and how far their
/// decryption got.
#[derive(Debug)]
pub struct Ingress {
    /// `(peer, arrival sequence, receiver index, place in the batch)`, sorted: each peer's
    /// messages in arrival order.
    pending: Vec<(PeerId, u32, u32, Position)>,
    /// The next entry of `pending` to decrypt.
    next: usize,
    /// Per datagram of a run opened in parts: its plaintext's length in its slot of the
    /// TUN batch, or `None` when it was refused.
    lengths: Vec<Option<u32>>,
    /// The handshake messages of the batch, for the shell's handshake queue.
    handshakes: Vec<Handoff>,
}

/// A handshake message of the batch (see [`Ingress::handshakes`]).
#[derive(Debug)]
struct Handoff {
    position: Position,
    /// How much of the datagram is handed on.
    len: usize,
    source: Endpoint,
    /// For the header of a data message on a session we do not have: its peer.
    unknown_session: Option<Arc<Peer>>,
}

/// A handshake message found by [`Ingress::classify`], to be queued for
/// [`crate::handshake::Handshake::process`].
#[derive(Debug, Clone, Copy)]
pub struct HandshakeMessage<'a> {
    /// Where it came from (where a reply goes).
    pub source: Endpoint,
    /// The message.
    pub datagram: &'a [u8],
    handoff: &'a Handoff,
}

impl HandshakeMessage<'_> {
    /// The queue refused it (full): counted as a `handshake_queue_full` drop; a report of a
    /// session we do not have lets its peer report again instead.
    pub fn refused(&self, drops: &Drops) {
        match &self.handoff.unknown_session {
            Some(peer) => peer.unknown_session_handled(),
            None => drops.device(DeviceDrop::HandshakeQueueFull),
        }
    }
}

impl Ingress {
    /// Room for `datagrams` datagrams per batch.
    pub fn new(datagrams: usize) -> Self {
        Self {
            pending: Vec::with_capacity(datagrams),
            next: 0,
            lengths: Vec::with_capacity(datagrams),
            handshakes: Vec::with_capacity(datagrams),
        }
    }

    /// The handshake messages of the batch last classified, in arrival order: the shell
    /// queues them, reporting those it could not as [`HandshakeMessage::refused`].
    pub fn handshakes<'b>(
        &'b self,
        batch: &'b RecvBatch,
    ) -> impl Iterator<Item = HandshakeMessage<'b>> {
        self.handshakes.iter().map(move |handoff| HandshakeMessage {
            source: handoff.source,
            datagram: &batch.get(handoff.position).bytes[..handoff.len],
            handoff,
        })
    }

    /// Sorts a new batch: data messages are grouped by the peer their receiver index names,
    /// handshake messages are kept for [`Self::handshakes`], the rest is dropped and
    /// counted.
    pub fn classify<W: Workers>(&mut self, cx: &Context<'_, W>, batch: &RecvBatch) {
        let (snapshot, drops) = (cx.snapshot, cx.drops);
        self.pending.clear();
        self.handshakes.clear();
        self.next = 0;
        drops.device_many(DeviceDrop::InvalidDatagram, batch.rejected() as u64);
        for (sequence, datagram) in batch.datagrams().enumerate() {
            match classify(datagram.bytes) {
                Incoming::Data { receiver } => match snapshot.by_index.get(&receiver) {
                    Some(id) => {
                        // The whole receiver index names the session (a data message's
                        // header is at least `MIN_DATA_LEN` bytes long).
                        let session = u32::from_le_bytes(
                            datagram.bytes[4..8].try_into().expect("four bytes"),
                        );
                        self.pending
                            .push((*id, sequence as u32, session, datagram.position));
                    }
                    None => {
                        drops.device(DeviceDrop::UnknownReceiver);
                        if let Some(report) = report_unknown_session(snapshot, &datagram) {
                            self.handshakes.push(report);
                        }
                    }
                },
                Incoming::Invalid => drops.device(DeviceDrop::InvalidDatagram),
                // A handshake completing behind data of the same batch is harmless: a session's
                // first data message can only follow the handshake that created it.
                Incoming::Initiation | Incoming::Response { .. } | Incoming::CookieReply { .. } => {
                    self.handshakes.push(Handoff {
                        position: datagram.position,
                        len: datagram.bytes.len(),
                        source: datagram.reply_to(),
                        unknown_session: None,
                    });
                }
            }
        }
        self.pending.sort_unstable();
    }

    /// Decrypts the data messages into `writer`, peer by peer, in arrival order per peer,
    /// translating each packet (source check, ACL, real → view) in place. With several
    /// workers, a run of one peer's messages on one session is opened outside the peer's
    /// `Tunn` lock, a long run in parts; the lock is taken to find the session and, after
    /// the run, to tick boringtun's timers. With one worker, `Tunn::decapsulate` opens them
    /// under one lock. Probe PINGs are answered into `out` (one per peer and call).
    /// [`Step::Flush`] when the TUN batch or `out` is full: write the batch, send `out`,
    /// then call again.
    pub fn decrypt<W: Workers>(
        &mut self,
        cx: &Context<'_, W>,
        batch: &RecvBatch,
        writer: &mut impl PacketSink,
        out: &mut Transmits,
    ) -> Step {
        let (drops, now, workers) = (cx.drops, cx.now, cx.workers);
        while self.next < self.pending.len() {
            if !out.has_room(PROBE_ROOM) && !out.is_empty() {
                return Step::Flush;
            }
            let PeerRun { id, end, peer } = cx.peer_run(&self.pending, self.next, |e| e.0);
            let Some(peer) = peer else {
                self.next = end;
                continue;
            };
            let mut run = Run {
                snapshot: cx.snapshot,
                flows: cx.flows,
                drops,
                peer,
                id,
                now,
                probes: ProbeInbox::default(),
                tally: Tally::default(),
            };
            if outside_the_lock(workers) {
                self.open_with_sessions(batch, end, &mut run, writer, workers);
            } else {
                self.decapsulate(batch, end, &mut run, writer);
            }
            let Run {
                tally, mut probes, ..
            } = run;
            peer.record_received_batch(tally.bytes, tally.accepted);
            if let Some(source) = tally.last_source {
                peer.roam(source);
            }
            probes.answer(peer, out, now);
            drops.device_many(DeviceDrop::Rejected, tally.rejected);
            if self.next < end {
                return Step::Flush;
            }
        }
        Step::Done
    }

    /// Opens the peer's datagrams (up to `end`, while the writer has room) run by run, a run
    /// being the datagrams of one session: the session is taken under the peer's `Tunn`
    /// lock, the run opened outside it (in parts on `workers` when long), then boringtun's
    /// timers are ticked for it under the lock.
    fn open_with_sessions(
        &mut self,
        batch: &RecvBatch,
        end: usize,
        run: &mut Run<'_>,
        writer: &mut impl PacketSink,
        workers: &impl Workers,
    ) {
        let tunn = &run.peer.tunn;
        while self.next < end && writer.room() > 0 {
            let receiver = self.pending[self.next].2;
            let run_end = self.next
                + self.pending[self.next..end]
                    .iter()
                    .take_while(|entry| entry.2 == receiver)
                    .count();
            let session = tunn.lock().0.made().and_then(|t| t.session_for(receiver));
            let Some(session) = session else {
                // Expired, replaced long ago, or never ours: what `decapsulate` refuses.
                run.tally.rejected += (run_end - self.next) as u64;
                self.next = run_end;
                continue;
            };
            let before = run.tally;
            let run_end = run_end.min(self.next + writer.room());
            if parts_for(run_end - self.next, workers) > 1 {
                self.open_in_parts(&session, batch, run_end, run, writer, workers);
            } else {
                self.open_in_place(&session, batch, run_end, run, writer);
            }
            let accepted = (run.tally.accepted - before.accepted) as usize;
            let data = run.tally.data - before.data;
            let plaintext = run.tally.plaintext - before.plaintext;
            if let Some(t) = tunn.lock().0.made_mut() {
                t.mark_received(receiver, accepted, data, plaintext);
            }
        }
    }

    /// Hands the peer's datagrams (up to `end`, while the writer has room) to
    /// `Tunn::decapsulate` under one lock: the path of a single worker.
    fn decapsulate(
        &mut self,
        batch: &RecvBatch,
        end: usize,
        run: &mut Run<'_>,
        writer: &mut impl PacketSink,
    ) {
        let mut cell = run.peer.tunn.lock();
        let now = run.now.instant();
        let tunn = cell.0.get(run.now);
        while self.next < end {
            let Some(space) = writer.space() else { break };
            let datagram = batch.get(self.pending[self.next].3);
            self.next += 1;
            match tunn.decapsulate_at(Some(datagram.source.ip()), datagram.bytes, space, now) {
                TunnResult::WriteToTunnelV4(packet, _) | TunnResult::WriteToTunnelV6(packet, _) => {
                    if let Some(len) = run.accept(&datagram, packet) {
                        writer.commit(len);
                    }
                }
                TunnResult::Done => {
                    run.accept(&datagram, &mut []); // a keepalive
                }
                TunnResult::WriteToNetwork(_) => {
                    // Transport data never asks for a reply; nothing to send.
                    tracing::trace!("unexpected reply to a data message");
                }
                TunnResult::Err(error) => {
                    tracing::trace!(?error, source = %datagram.source, "datagram rejected");
                    run.tally.rejected += 1;
                }
            }
        }
    }

    /// Opens the run's datagrams (up to `end`, at most the writer's room) one by one
    /// straight into the TUN batch.
    fn open_in_place(
        &mut self,
        session: &Session,
        batch: &RecvBatch,
        end: usize,
        run: &mut Run<'_>,
        writer: &mut impl PacketSink,
    ) {
        while self.next < end {
            let datagram = batch.get(self.pending[self.next].3);
            self.next += 1;
            let Some(space) = writer.space() else {
                unreachable!("the run fits into the writer's room")
            };
            match open(session, datagram.bytes, space) {
                Some(len) => {
                    if let Some(len) = run.accept(&datagram, &mut space[..len]) {
                        writer.commit(len);
                    }
                }
                None => run.tally.rejected += 1,
            }
        }
    }

    /// Opens the run's datagrams (up to `end`, at most the writer's room) in parts on
    /// `workers`, each straight into its own slot of the TUN batch; then accepts them in
    /// arrival order, committing the slots of the packets that pass.
    fn open_in_parts<W: PacketSink>(
        &mut self,
        session: &Session,
        batch: &RecvBatch,
        end: usize,
        run: &mut Run<'_>,
        writer: &mut W,
        workers: &impl Workers,
    ) {
        let entries = &self.pending[self.next..end];
        self.lengths.clear();
        self.lengths.resize(entries.len(), None);
        let parts = parts_for(entries.len(), workers);
        let (mut entries_left, mut slots_left, mut lengths_left, mut start) = (
            entries,
            &mut writer.free_slots()[..entries.len()],
            &mut self.lengths[..],
            0,
        );
        let cut = (0..parts).map(|part| {
            let end = part_end(entries.len(), parts, part);
            let (these, rest) = entries_left.split_at(end - start);
            let (slots, slots_rest) = std::mem::take(&mut slots_left).split_at_mut(these.len());
            let (lengths, lengths_rest) =
                std::mem::take(&mut lengths_left).split_at_mut(these.len());
            (entries_left, slots_left, lengths_left, start) = (rest, slots_rest, lengths_rest, end);
            OpenPart::<W> {
                session,
                batch,
                entries: these,
                slots,
                lengths,
            }
        });
        run_parts(workers, cut, OpenPart::open);
        let mut committed = 0;
        for (index, (entry, length)) in entries.iter().zip(&self.lengths).enumerate() {
            let Some(len) = *length else {
                run.tally.rejected += 1;
                continue;
            };
            let skip = index - committed;
            let slot = &mut writer.free_slots()[skip];
            let plaintext = &mut W::slot_space(slot)[..len as usize];
            if let Some(len) = run.accept(&batch.get(entry.3), plaintext) {
                writer.commit_slot(skip, len);
                committed += 1;
            }
        }
        self.next += entries.len();
    }
}

/// Opens `datagram` (a data message) with `session` into `dst`: the plaintext's length, or
/// `None` when it is malformed, forged or a replay.
fn open(session: &Session, datagram: &[u8], dst: &mut [u8]) -> Option<usize> {
    match Tunn::parse_incoming_packet(datagram) {
        Ok(Packet::PacketData(data)) => match session.receive_packet_data(data, dst) {
            Ok(plaintext) => Some(plaintext.len()),
            Err(error) => {
                tracing::trace!(?error, "datagram rejected");
                None
            }
        },
        _ => None,
    }
}

/// One part of a run, opened by one worker into its own slots of the TUN batch.
struct OpenPart<'a, W: PacketSink> {
    session: &'a Session,
    batch: &'a RecvBatch,
    entries: &'a [(PeerId, u32, u32, Position)],
    slots: &'a mut [W::Slot],
    lengths: &'a mut [Option<u32>],
}

impl<W: PacketSink> OpenPart<'_, W> {
    fn open(self) {
        let slots = self.slots.iter_mut().zip(self.lengths);
        for (entry, (slot, length)) in self.entries.iter().zip(slots) {
            let datagram = self.batch.get(entry.3).bytes;
            *length = open(self.session, datagram, W::slot_space(slot)).map(|len| len as u32);
        }
    }
}

/// What one peer's datagrams of a batch came to.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    /// Bytes of the datagrams accepted.
    bytes: usize,
    /// Datagrams accepted (keepalives included).
    accepted: u64,
    /// Of them, IP packets.
    data: usize,
    /// Their bytes.
    plaintext: usize,
    /// Datagrams refused.
    rejected: u64,
    /// Where the last accepted one came from.
    last_source: Option<Endpoint>,
}

/// One peer's share of a batch, as its opened datagrams are accepted.
struct Run<'a> {
    snapshot: &'a Snapshot,
    flows: &'a FlowTable,
    drops: &'a Drops,
    peer: &'a Arc<Peer>,
    id: PeerId,
    now: Now,
    probes: ProbeInbox,
    tally: Tally,
}

impl Run<'_> {
    /// Takes the plaintext of an authenticated datagram: a keepalive, a probe, or an IP
    /// packet that is translated in place. The length to hand to the TUN device, if any.
    fn accept(&mut self, datagram: &Datagram<'_>, plaintext: &mut [u8]) -> Option<usize> {
        self.tally.bytes += datagram.bytes.len();
        self.tally.accepted += 1;
        self.tally.last_source = Some(datagram.reply_to());
        if plaintext.is_empty() {
            return None; // a keepalive
        }
        let Some(len) = ip_length(plaintext) else {
            // Authentic, but not an IP packet whole: what `decapsulate` refuses.
            self.tally.rejected += 1;
            return None;
        };
        self.tally.data += 1;
        self.tally.plaintext += len;
        let packet = &mut plaintext[..len];
        if self.probes.take(self.drops, self.peer, packet, self.now) {
            return None; // a connectivity probe, the gateway's own
        }
        match self.snapshot.remap.ingress(self.id, packet) {
            Verdict::Deliver => {
                // After the remap: the source is a view, as admissions name them.
                let admitted = self
                    .snapshot
                    .admissions
                    .ingress(self.flows, packet, self.now);
                admitted.then_some(len)
            }
            Verdict::Drop(reason) => {
                tracing::trace!(%reason, peer = self.id, "ingress drop");
                self.drops.remap(reason);
                None
            }
            Verdict::Forward(_) => {
                self.drops.remap(DropReason::BadPacket);
                None
            }
        }
    }
}

/// The length an IP packet's header gives, when it is whole in `plaintext` (what boringtun
/// truncates a decrypted packet to; WireGuard pads to 16 bytes).
fn ip_length(plaintext: &[u8]) -> Option<usize> {
    let len = match plaintext.first()? >> 4 {
        4 if plaintext.len() >= 20 => usize::from(u16::from_be_bytes([plaintext[2], plaintext[3]])),
        6 if plaintext.len() >= 40 => {
            40 + usize::from(u16::from_be_bytes([plaintext[4], plaintext[5]]))
        }
        _ => return None,
    };
    (len <= plaintext.len()).then_some(len)
}

/// A data message for a session we do not have, from where a peer was configured to be: the
/// peer still holds a session with a previous run of this gateway (we restarted). Its header
/// goes to the handshake worker, which initiates at once ([`crate::handshake::Handshake::process`])
/// instead of leaving the peer to notice after 15 s of unanswered data; at most one per
/// peer waits in the queue, and none while a handshake of ours is under way.
fn report_unknown_session(snapshot: &Snapshot, datagram: &Datagram<'_>) -> Option<Handoff> {
    let (slot, peer) = snapshot.peer_at(datagram.source)?;
    if !peer.report_unknown_session() {
        return None;
    }
    Some(Handoff {
        position: datagram.position,
        len: MIN_DATA_LEN,
        source: datagram.reply_to(),
        unknown_session: slot.runtime.clone(),
    })
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

    /// Puts the PONG for the PING taken, if any, into `out`, sealed with the same peer's
    /// session.
    fn answer(&mut self, peer: &Arc<Peer>, out: &mut Transmits, now: Now) {
        let Some(ping) = self.ping.take() else { return };
        let Some(endpoint) = peer.endpoint() else {
            return;
        };
        send_probe(peer, endpoint, ping.answer(), now, out);
    }
}
