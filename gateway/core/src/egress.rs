//! Egress: IP packets read from the TUN device → remap → `Tunn` → datagrams in the outbox.

use boringtun::noise::TunnResult;

use super::{HANDSHAKE_ROOM, Now, OVERHEAD, Outbox, Step};
use crate::conncheck::is_probe_destination;
use crate::dispatch::is_initiation;
use crate::drops::{DeviceDrop, Drops};
use crate::remap::{DropReason, PeerId, Verdict};
use crate::snapshot::Snapshot;

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
    pub fn route<P: AsRef<[u8]> + AsMut<[u8]>>(
        &mut self,
        snapshot: &Snapshot,
        drops: &Drops,
        packets: &mut [P],
    ) {
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

    /// Encrypts the routed packets into `outbox`, one peer after the other, under one `Tunn`
    /// lock per outbox fill. [`Step::Flush`] when an arena filled up: send the outbox and
    /// call again with the same batch.
    pub fn encrypt<P: AsRef<[u8]>>(
        &mut self,
        snapshot: &Snapshot,
        drops: &Drops,
        packets: &[P],
        outbox: &mut Outbox,
        now: Now,
    ) -> Step {
        while self.next < self.routed.len() {
            let id = self.routed[self.next].0;
            let end = self.next
                + self.routed[self.next..]
                    .iter()
                    .take_while(|(peer, _)| *peer == id)
                    .count();
            let lost = (end - self.next) as u64;
            let Some(slot) = snapshot.peer(id) else {
                drops.remap_many(DropReason::UnknownPeer, lost);
                self.next = end;
                continue;
            };
            let Some(peer) = &slot.runtime else {
                drops.device_many(DeviceDrop::NoPrivateKey, lost);
                self.next = end;
                continue;
            };
            let Some(endpoint) = peer.endpoint() else {
                drops.device_many(DeviceDrop::NoEndpoint, lost);
                self.next = end;
                continue;
            };
            let (mut bytes, mut datagrams, mut rejected) = (0usize, 0u64, 0u64);
            {
                let out = outbox.batch_for(&endpoint);
                let mut cell = peer.tunn.lock();
                let tunn = cell.0.get();
                while self.next < end {
                    let index = self.routed[self.next].1;
                    let packet = packets[usize::from(index)].as_ref();
                    let needed = (packet.len() + OVERHEAD).max(HANDSHAKE_ROOM);
                    let Some(space) = out.space(needed) else {
                        if out.is_empty() {
                            // Larger than an empty arena: cannot be sent at all.
                            rejected += 1;
                            self.next += 1;
                            continue;
                        }
                        break;
                    };
                    self.next += 1;
                    match tunn.encapsulate(packet, space) {
                        TunnResult::WriteToNetwork(datagram) => {
                            let len = datagram.len();
                            if is_initiation(datagram) {
                                peer.record_initiation(now.unix_ms);
                            }
                            out.commit(endpoint, len);
                            bytes += len;
                            datagrams += 1;
                        }
                        TunnResult::Done => {} // queued until the handshake completes
                        TunnResult::Err(error) => {
                            tracing::trace!(?error, "encapsulate failed");
                            rejected += 1;
                        }
                        TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {}
                    }
                }
            }
            // Counted when queued; a failed send is counted as a `udp_send` drop.
            peer.record_sent_batch(bytes, datagrams, now.unix_ms);
            drops.device_many(DeviceDrop::Rejected, rejected);
            if self.next < end {
                return Step::Flush;
            }
        }
        Step::Done
    }
}
