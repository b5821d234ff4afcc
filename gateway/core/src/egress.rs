//! Egress: IP packets read from the TUN device → admission (the flows they open) → remap → sealed with the peer's session (or
//! `Tunn::encapsulate` without one) → datagrams in the outbox.

use boringtun::noise::{Nonces, Session, Tunn, TunnResult};

use super::{HANDSHAKE_ROOM, Now, OVERHEAD, Outbox, Step};
use crate::batch::SendBatch;
use crate::conncheck::is_probe_destination;
use crate::context::Context;
use crate::dispatch::is_initiation;
use crate::drops::DeviceDrop;
use crate::endpoint::Endpoint;
use crate::peer::Peer;
use crate::remap::{DropReason, PeerId, Verdict};
use crate::workers::{Workers, outside_the_lock, part_end, parts_for, run_parts};

/// One egress task's batch state: the routed packets grouped by peer and how far their
/// encryption got.
#[derive(Debug)]
pub struct Egress {
    /// `(peer, index of the packet in the batch)`, sorted: each peer's packets in read order.
    routed: Vec<(PeerId, u16)>,
    /// The next entry of `routed` to encrypt.
    next: usize,
}

impl Egress {
    /// Room for `packets` packets per batch.
    pub fn new(packets: usize) -> Self {
        Self {
            routed: Vec::with_capacity(packets),
            next: 0,
        }
    }

    /// Remaps every packet of a new batch in place (view → real destination) and groups the
    /// forwarded ones by peer. Packets to the probe prefix and unroutable ones are dropped
    /// and counted.
    pub fn route<P: AsRef<[u8]> + AsMut<[u8]>, W: Workers>(
        &mut self,
        cx: &Context<'_, W>,
        packets: &mut [P],
    ) {
        let (snapshot, drops) = (cx.snapshot, cx.drops);
        self.routed.clear();
        self.next = 0;
        // Overlaps the batch's table cache misses (the cost of a freshly swapped-in table).
        for packet in packets.iter() {
            snapshot.remap.prefetch_egress(packet.as_ref());
        }
        for (index, packet) in packets.iter_mut().enumerate() {
            if is_probe_destination(packet.as_ref()) {
                // Only the gateway itself speaks to the probe addresses: no spoofed probes.
                drops.device(DeviceDrop::ProbeAddress);
                continue;
            }
            // Before the remap: the destination is still the view admissions name.
            if !snapshot
                .admissions
                .egress(cx.flows, packet.as_ref(), cx.now)
            {
                continue; // towards an exported cluster with the flow table full (counted)
            }
            match snapshot.remap.egress(packet.as_mut()) {
                Verdict::Forward(id) => self.routed.push((id, index as u16)),
                Verdict::Drop(reason) => {
                    tracing::trace!(%reason, "egress drop");
                    drops.remap(reason);
                }
                Verdict::Deliver => drops.remap(DropReason::NoRoute),
            }
        }
        // Unique keys: the order inside a peer's group is the read order.
        self.routed.sort_unstable();
    }

    /// Encrypts the routed packets into `outbox`, one peer after the other, in read order.
    /// With several workers and a session, the peer's `Tunn` lock is held only to lay the
    /// datagrams out and tick its timers; the packets are sealed after it is released, a
    /// long run in parts (see [`crate::workers`]). With one worker, `Tunn::encapsulate`
    /// seals them under the lock; without a session, it queues them and initiates a
    /// handshake. [`Step::Flush`] when an arena filled up: send the outbox
    /// and call again with the same batch.
    pub fn encrypt<P: AsRef<[u8]> + Sync, W: Workers>(
        &mut self,
        cx: &Context<'_, W>,
        packets: &[P],
        outbox: &mut Outbox,
    ) -> Step {
        let (drops, now) = (cx.drops, cx.now);
        while self.next < self.routed.len() {
            let run = cx.peer_run(&self.routed, self.next, |(peer, _)| *peer);
            let end = run.end;
            let Some(peer) = run.peer else {
                self.next = end;
                continue;
            };
            let Some(endpoint) = peer.endpoint() else {
                drops.device_many(DeviceDrop::NoEndpoint, (end - self.next) as u64);
                self.next = end;
                continue;
            };
            let out = outbox.batch_for(&endpoint);
            let mut cell = peer.tunn.lock();
            let tunn = cell.0.get(now);
            let session = outside_the_lock(cx.workers).then(|| tunn.current_session());
            let sent = match session.flatten() {
                Some(session) => {
                    let from = out.used();
                    let run = self.lay_out(packets, end, out, endpoint);
                    tunn.mark_sent(run.datagrams, run.datagrams, run.plaintext);
                    drop(cell);
                    let routed = &self.routed[self.next - run.datagrams..self.next];
                    seal(
                        &session,
                        routed,
                        packets,
                        out.committed_mut(from),
                        cx.workers,
                    );
                    run
                }
                None => {
                    let run = Run {
                        peer,
                        endpoint,
                        end,
                        now,
                    };
                    self.encapsulate(tunn, &run, packets, out)
                }
            };
            // Counted when queued; a failed send is counted as a `udp_send` drop.
            peer.record_sent_batch(sent.bytes, sent.datagrams as u64, now.unix_ms);
            drops.device_many(DeviceDrop::Rejected, sent.rejected);
            if self.next < end {
                return Step::Flush;
            }
        }
        Step::Done
    }

    /// Commits a datagram of the right length for each packet of the peer's group (up to
    /// `end`) that fits into `out`, in order, to be sealed into afterwards.
    fn lay_out<P: AsRef<[u8]>>(
        &mut self,
        packets: &[P],
        end: usize,
        out: &mut SendBatch,
        endpoint: Endpoint,
    ) -> Sent {
        let mut sent = Sent::default();
        while self.next < end {
            let packet = packets[usize::from(self.routed[self.next].1)].as_ref();
            let len = packet.len() + OVERHEAD;
            if out.space(len).is_none() {
                if out.is_empty() {
                    // Larger than an empty arena (and first of the run): cannot be sent at all.
                    sent.rejected += 1;
                    self.next += 1;
                    continue;
                }
                break;
            }
            out.commit(endpoint, len);
            self.next += 1;
            sent.datagrams += 1;
            sent.bytes += len;
            sent.plaintext += packet.len();
        }
        sent
    }

    /// Hands the peer's packets (up to `end`) to `Tunn::encapsulate` under its lock: the path
    /// of a single worker, and without a session, where boringtun queues them and initiates
    /// a handshake.
    fn encapsulate<P: AsRef<[u8]>>(
        &mut self,
        tunn: &mut Tunn,
        run: &Run<'_>,
        packets: &[P],
        out: &mut SendBatch,
    ) -> Sent {
        let Run {
            peer,
            endpoint,
            end,
            now,
        } = *run;
        let mut sent = Sent::default();
        while self.next < end {
            let packet = packets[usize::from(self.routed[self.next].1)].as_ref();
            let needed = (packet.len() + OVERHEAD).max(HANDSHAKE_ROOM);
            let Some(space) = out.space(needed) else {
                if out.is_empty() {
                    sent.rejected += 1;
                    self.next += 1;
                    continue;
                }
                break;
            };
            self.next += 1;
            match tunn.encapsulate_at(packet, space, now.instant()) {
                TunnResult::WriteToNetwork(datagram) => {
                    let len = datagram.len();
                    if is_initiation(datagram) {
                        peer.record_initiation(now.unix_ms);
                    }
                    out.commit(endpoint, len);
                    sent.bytes += len;
                    sent.datagrams += 1;
                }
                TunnResult::Done => {} // queued until the handshake completes
                TunnResult::Err(error) => {
                    tracing::trace!(?error, "encapsulate failed");
                    sent.rejected += 1;
                }
                TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {}
            }
        }
        sent
    }
}

/// One peer's run, sent by `Tunn::encapsulate`.
#[derive(Clone, Copy)]
struct Run<'a> {
    peer: &'a Peer,
    endpoint: Endpoint,
    /// Where the run ends in `routed`.
    end: usize,
    now: Now,
}

/// What one peer's run put into the arena.
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    /// Datagrams committed.
    datagrams: usize,
    /// Their bytes.
    bytes: usize,
    /// The packets' bytes (what boringtun counts as sent).
    plaintext: usize,
    /// Packets that could not be sent.
    rejected: u64,
}

/// One part of a run, sealed by one worker.
struct Part<'a, P> {
    nonces: Nonces<'a>,
    routed: &'a [(PeerId, u16)],
    region: &'a mut [u8],
    packets: &'a [P],
}

impl<P: AsRef<[u8]>> Part<'_, P> {
    fn seal(mut self) {
        let mut region = self.region;
        for (_, index) in self.routed {
            let packet = self.packets[usize::from(*index)].as_ref();
            let (datagram, rest) = region.split_at_mut(packet.len() + OVERHEAD);
            self.nonces
                .seal(packet, datagram)
                .expect("a nonce was reserved for every packet");
            region = rest;
        }
    }
}

/// Seals the packets `routed` names into `region`, where their datagrams are laid out in
/// order, with nonces reserved in that order: in parts on `workers` when the run is long.
fn seal<P: AsRef<[u8]> + Sync>(
    session: &Session,
    routed: &[(PeerId, u16)],
    packets: &[P],
    region: &mut [u8],
    workers: &impl Workers,
) {
    let mut nonces = session.reserve(routed.len() as u64);
    let parts = parts_for(routed.len(), workers);
    if parts == 1 {
        Part {
            nonces,
            routed,
            region,
            packets,
        }
        .seal();
        return;
    }
    let (mut routed_left, mut region_left, mut start) = (routed, region, 0);
    let cut = (0..parts).map(|part| {
        let end = part_end(routed.len(), parts, part);
        let (this, rest) = routed_left.split_at(end - start);
        let bytes = this
            .iter()
            .map(|(_, index)| packets[usize::from(*index)].as_ref().len() + OVERHEAD)
            .sum();
        let (region, region_rest) = std::mem::take(&mut region_left).split_at_mut(bytes);
        let rest_nonces = nonces.split_off(this.len() as u64);
        let nonces = std::mem::replace(&mut nonces, rest_nonces);
        (routed_left, region_left, start) = (rest, region_rest, end);
        Part {
            nonces,
            routed: this,
            region,
            packets,
        }
    });
    run_parts(workers, cut, Part::seal);
}
