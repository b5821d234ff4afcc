//! The data-path tasks: TUN → peer (egress), UDP → TUN (ingress) and the timer task.
//!
//! Each task owns its buffers and an `arc_swap::Cache` of the snapshot, so the per-packet work
//! takes no global lock and allocates nothing; only a peer's `Tunn` mutex is taken, once per
//! batch for all of that peer's packets, and released before any IO. The IO is batched
//! ([`crate::io`]): TUN reads and writes with virtio-net offloads, UDP with
//! `recvmmsg`/`sendmmsg`, GRO and GSO, each switchable through [`IoOptions`].
//!
//! # Queues
//!
//! With [`IoOptions::queues`] = N there are N [`tun_loop`]s, one per queue of the
//! multi-queue TUN device, and N [`udp_loop`]s per address family, one per socket of the
//! family's `SO_REUSEPORT` group ([`super::net`]). The `tun_loop` of queue `i` sends on
//! socket `i` of a family, the `udp_loop`s of socket `i` write to TUN queue `i`. The tasks
//! share nothing but the snapshot, the sockets and the peers; two of them working for the
//! same peer serialize on its `Tunn` mutex, so one peer's crypto stays on one core at a
//! time and the gain comes with several peers (or from the I/O outside the lock).
//!
//! Why the packets of one flow stay in order, N > 1 included:
//!
//! - Egress. The kernel puts a packet on the TUN queue its flow maps to: the queue through
//!   which the gateway last wrote packets of that flow's reverse direction (a symmetric flow
//!   hash keys the kernel's steering table), else a hash of the flow. So one flow's packets
//!   are read by one [`tun_loop`], which encrypts them in read order (each gets the next
//!   nonce under the peer's lock) and sends them in that order on one socket.
//!   Another task may interleave datagrams of other flows to the same peer: their nonces
//!   then reach the peer out of order, which its replay window (1024 messages in boringtun)
//!   accepts. A datagram further behind the newest one the peer received is dropped there
//!   (as a replay), which takes one task stalled between encrypting and sending while the
//!   other sends several batches to the same peer.
//!   The one exception is a flow whose queue changes (its steering entry appears, e.g. with
//!   the first packet of the reverse direction, or expires after seconds of silence): the
//!   packets already queued on the old queue may leave after the first ones of the new —
//!   the reordering RPS flow migration causes in the kernel, which TCP absorbs.
//! - Ingress. The kernel hashes a datagram's 4-tuple to one socket of the group, so one
//!   peer endpoint's datagrams are all read by one [`udp_loop`] in arrival order, decrypted
//!   in that order and written to one TUN queue in that order. Only a peer that roams to a
//!   new endpoint may change readers, as a new path may reorder anyway.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::{ArcSwap, Cache};
use boringtun::noise::TunnResult;
use tokio::net::UdpSocket;
use tun_rs::AsyncDevice;

use super::conncheck::is_probe_destination;
use super::dispatch::{Incoming, classify, is_initiation};
use super::drops::{DeviceDrop, Drops};
use super::handshake::HandshakeQueue;
use super::net::{Sockets, WgSocket, queue_socket};
use super::peer::Peer;
use super::probe::ProbeInbox;
use super::snapshot::Snapshot;
use crate::clock::unix_ms;
use crate::io::IoOptions;
use crate::io::buffer::PacketBuf;
use crate::io::tun_offload::{SEGMENTS_PER_READ, TunReader, TunWriter};
use crate::io::udp_batch::{MAX_GSO_SEGMENTS, Position, RecvBatch, SendBatch};
use crate::remap::{DropReason, PeerId, Verdict};

/// Largest IP packet or UDP datagram handled.
pub(super) const MAX_PACKET: usize = 65536;
/// Room boringtun needs beyond the plaintext when encapsulating (header + tag). Every
/// buffer is also far above the 148 bytes of the largest handshake message.
pub(super) const OVERHEAD: usize = 32;
/// The smallest buffer boringtun writes a handshake initiation into.
const HANDSHAKE_ROOM: usize = 148;
/// Send-arena room per datagram of a batch: a full 1420-byte MTU packet once encrypted.
const TYPICAL_DATAGRAM: usize = 1420 + OVERHEAD;
/// With UDP GRO a receive reads `batch / GRO_MESSAGES_DIVISOR` messages, each holding up to
/// 64 datagrams.
const GRO_MESSAGES_DIVISOR: usize = 8;
/// How often `update_timers` runs for every peer.
pub const TIMER_TICK: Duration = Duration::from_millis(250);
/// How often the shared handshake rate limiter is reset, in timer ticks.
const RATE_LIMIT_RESET_TICKS: u64 = 4;

/// What the data-path tasks share.
pub struct Shared {
    /// The current snapshot.
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    /// The UDP sockets. Kept out of the snapshot so that a task's cached snapshot never
    /// keeps an old port bound after a listen-port change.
    pub sockets: ArcSwap<Sockets>,
    /// The I/O techniques in use.
    pub io: IoOptions,
    /// Drop counters.
    pub drops: Drops,
    /// Handshake messages for the handshake worker.
    pub handshakes: HandshakeQueue,
    /// Set once a TUN reader has stopped (the interface was deleted or failed).
    pub stopped: tokio::sync::watch::Sender<bool>,
    /// Every queue of the TUN device, at least one: one per [`IoOptions::queues`], each
    /// read by its own [`tun_loop`].
    pub tun_queues: Vec<Arc<tun_rs::AsyncDevice>>,
}

impl Shared {
    /// The TUN device's first queue, which also serves device-wide calls (MTU).
    pub fn tun(&self) -> &Arc<tun_rs::AsyncDevice> {
        &self.tun_queues[0]
    }

    /// TUN queue `queue`; queues beyond the device's wrap around.
    fn tun_queue(&self, queue: usize) -> &Arc<tun_rs::AsyncDevice> {
        &self.tun_queues[queue % self.tun_queues.len()]
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("drops", &self.drops)
            .finish_non_exhaustive()
    }
}

type SnapshotCache = Cache<Arc<ArcSwap<Snapshot>>, Arc<Snapshot>>;

/// Reads batches of packets from TUN queue `queue` and sends them, encrypted, to the peers
/// the remap table routes them to, on the sockets of the same queue. Runs until the device
/// fails or the task is aborted.
///
/// Per batch: remap every packet, group the packets by peer (keeping each peer's packets in
/// read order), take each peer's `Tunn` lock once for its whole group and encrypt straight
/// into the send arena, where equal-size datagrams to one endpoint coalesce into GSO
/// messages; then one `sendmmsg` per socket.
pub async fn tun_loop(shared: Arc<Shared>, queue: usize) {
    let mut cache: SnapshotCache = Cache::new(Arc::clone(&shared.snapshot));
    let tun = Arc::clone(shared.tun_queue(queue));
    let batch = shared.io.batch();
    let mut reader = TunReader::new(batch);
    let mut outbox = Outbox::new(batch, queue);
    let mut routed: Vec<(PeerId, u16)> = Vec::with_capacity(batch - 1 + SEGMENTS_PER_READ);
    loop {
        if let Err(error) = reader.recv(&tun).await {
            tracing::error!(%error, queue, "reading from the TUN device failed; stopping");
            shared.stopped.send_replace(true);
            return;
        }
        shared
            .drops
            .device_many(DeviceDrop::TunRead, reader.take_skipped());
        let snapshot = cache.load();
        routed.clear();
        // Overlaps the batch's table cache misses (the cost of a freshly swapped-in table).
        for packet in reader.packets() {
            snapshot.remap.prefetch_egress(packet.as_ref());
        }
        for (index, packet) in reader.packets_mut().iter_mut().enumerate() {
            if is_probe_destination(packet.as_ref()) {
                // Only the gateway itself speaks to the probe addresses: no spoofed probes.
                shared.drops.device(DeviceDrop::ProbeAddress);
                continue;
            }
            match snapshot.remap.egress(packet.as_mut()) {
                Verdict::Forward(id) => routed.push((id, index as u16)),
                Verdict::Drop(reason) => {
                    tracing::trace!(%reason, "egress drop");
                    shared.drops.remap(reason);
                }
                Verdict::Deliver => shared.drops.remap(DropReason::NoRoute),
            }
        }
        // Unique keys: the order inside a peer's group is the read order.
        routed.sort_unstable();
        for group in routed.chunk_by(|a, b| a.0 == b.0) {
            encapsulate_group(&shared, snapshot, group, reader.packets(), &mut outbox).await;
        }
        outbox.flush(&shared).await;
    }
}

/// Encrypts one peer's packets of a batch into the outbox, under one `Tunn` lock per
/// outbox fill.
async fn encapsulate_group(
    shared: &Shared,
    snapshot: &Snapshot,
    group: &[(PeerId, u16)],
    packets: &[PacketBuf],
    outbox: &mut Outbox,
) {
    let id = group[0].0;
    let lost = group.len() as u64;
    let Some(slot) = snapshot.peer(id) else {
        shared.drops.remap_many(DropReason::UnknownPeer, lost);
        return;
    };
    let Some(peer) = &slot.runtime else {
        shared.drops.device_many(DeviceDrop::NoPrivateKey, lost);
        return;
    };
    let Some(endpoint) = peer.endpoint() else {
        shared.drops.device_many(DeviceDrop::NoEndpoint, lost);
        return;
    };
    let mut next = 0;
    while next < group.len() {
        let now = unix_ms();
        let (mut bytes, mut datagrams, mut rejected) = (0usize, 0u64, 0u64);
        {
            let out = outbox.batch_for(&endpoint);
            let mut tunn = peer.tunn.lock();
            while let Some(&(_, index)) = group.get(next) {
                let packet = packets[usize::from(index)].as_ref();
                let needed = (packet.len() + OVERHEAD).max(HANDSHAKE_ROOM);
                let Some(space) = out.space(needed) else {
                    if out.is_empty() {
                        // Larger than an empty arena: cannot be sent at all.
                        rejected += 1;
                        next += 1;
                        continue;
                    }
                    break;
                };
                next += 1;
                match tunn.0.encapsulate(packet, space) {
                    TunnResult::WriteToNetwork(datagram) => {
                        let len = datagram.len();
                        if is_initiation(datagram) {
                            peer.record_initiation(now);
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
        peer.record_sent_batch(bytes, datagrams, now);
        shared.drops.device_many(DeviceDrop::Rejected, rejected);
        if next < group.len() {
            outbox.flush(shared).await;
        }
    }
}

/// Outgoing datagrams of one task, per address family, sent with `sendmmsg` (and GSO) on
/// the family's socket of the task's queue.
struct Outbox {
    v4: SendBatch,
    v6: SendBatch,
    queue: usize,
}

impl Outbox {
    fn new(batch: usize, queue: usize) -> Self {
        // Room for a batch of full-size datagrams and one maximal one.
        let bytes = batch * (TYPICAL_DATAGRAM) + MAX_PACKET + OVERHEAD;
        Self {
            v4: SendBatch::new(batch, bytes),
            v6: SendBatch::new(batch, bytes),
            queue,
        }
    }

    fn batch_for(&mut self, endpoint: &SocketAddr) -> &mut SendBatch {
        match endpoint {
            SocketAddr::V4(_) => &mut self.v4,
            SocketAddr::V6(_) => &mut self.v6,
        }
    }

    /// Sends everything queued; failures are counted as `udp_send` drops.
    async fn flush(&mut self, shared: &Shared) {
        let sockets = shared.sockets.load();
        for (out, family) in [(&mut self.v4, &sockets.v4), (&mut self.v6, &sockets.v6)] {
            if out.is_empty() {
                continue;
            }
            let Some(socket) = queue_socket(family, self.queue) else {
                shared
                    .drops
                    .device_many(DeviceDrop::UdpSend, out.len() as u64);
                out.clear();
                continue;
            };
            match out.send_to(&socket.udp, &socket.offload).await {
                Ok(report) => {
                    shared
                        .drops
                        .device_many(DeviceDrop::UdpSend, report.failed as u64);
                    if let Some(error) = out.take_last_error() {
                        tracing::trace!(%error, "UDP send failed");
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, "UDP send failed");
                    shared
                        .drops
                        .device_many(DeviceDrop::UdpSend, out.len() as u64);
                    out.clear();
                }
            }
        }
    }
}

/// Receives batches of datagrams from one UDP socket (`recvmmsg`, split GRO messages) and
/// decrypts them. Data messages are grouped by peer, each peer's `Tunn` lock taken once per
/// group, and decrypted straight into the TUN write batch, which GRO-coalesces them on
/// flush to TUN queue `queue`. Handshake messages go to the handshake queue
/// ([`super::handshake`]).
pub async fn udp_loop(shared: Arc<Shared>, socket: Arc<WgSocket>, queue: usize) {
    let mut cache: SnapshotCache = Cache::new(Arc::clone(&shared.snapshot));
    let tun = Arc::clone(shared.tun_queue(queue));
    let batch = shared.io.batch();
    // A GRO message carries up to 64 datagrams: fewer messages make a batch of similar size.
    let messages = if socket.offload.gro() {
        batch.div_ceil(GRO_MESSAGES_DIVISOR)
    } else {
        batch
    };
    let mut inbound = RecvBatch::new(messages);
    let mut writer = TunWriter::new(batch);
    let mut pending: Vec<(PeerId, u32, Position)> = Vec::with_capacity(messages * MAX_GSO_SEGMENTS);
    loop {
        if let Err(error) = inbound.recv_from(&socket.udp).await {
            tracing::debug!(%error, "UDP receive failed");
            continue;
        }
        let snapshot = cache.load();
        shared
            .drops
            .device_many(DeviceDrop::InvalidDatagram, inbound.rejected() as u64);
        for (sequence, datagram) in inbound.datagrams().enumerate() {
            match classify(datagram.bytes) {
                Incoming::Data { receiver } => match snapshot.by_index.get(&receiver) {
                    Some(id) => pending.push((*id, sequence as u32, datagram.position)),
                    None => shared.drops.device(DeviceDrop::UnknownReceiver),
                },
                Incoming::Invalid => shared.drops.device(DeviceDrop::InvalidDatagram),
                // A handshake completing behind data of the same batch is harmless: a session's
                // first data message can only follow the handshake that created it.
                Incoming::Initiation | Incoming::Response { .. } | Incoming::CookieReply { .. } => {
                    if shared
                        .handshakes
                        .offer(datagram.source, datagram.bytes)
                        .is_err()
                    {
                        shared.drops.device(DeviceDrop::HandshakeQueueFull);
                    }
                }
            }
        }
        decrypt_pending(&shared, &tun, snapshot, &inbound, &mut pending, &mut writer).await;
        flush_tun(&shared, &tun, &mut writer).await;
    }
}

/// Decrypts the data messages collected so far, peer by peer, in arrival order per peer.
async fn decrypt_pending(
    shared: &Shared,
    tun: &AsyncDevice,
    snapshot: &Snapshot,
    inbound: &RecvBatch,
    pending: &mut Vec<(PeerId, u32, Position)>,
    writer: &mut TunWriter,
) {
    pending.sort_unstable();
    for group in pending.chunk_by(|a, b| a.0 == b.0) {
        decrypt_group(shared, tun, snapshot, inbound, group, writer).await;
    }
    pending.clear();
}

/// Decrypts one peer's data messages into the TUN write batch under one `Tunn` lock per
/// batch fill, translating each packet (source check, ACL, real → view) in place.
async fn decrypt_group(
    shared: &Shared,
    tun: &AsyncDevice,
    snapshot: &Snapshot,
    inbound: &RecvBatch,
    group: &[(PeerId, u32, Position)],
    writer: &mut TunWriter,
) {
    let id = group[0].0;
    let Some(slot) = snapshot.peer(id) else {
        shared
            .drops
            .remap_many(DropReason::UnknownPeer, group.len() as u64);
        return;
    };
    let Some(peer) = slot.runtime.as_deref() else {
        shared
            .drops
            .device_many(DeviceDrop::NoPrivateKey, group.len() as u64);
        return;
    };
    let mut probes = ProbeInbox::default();
    let mut next = 0;
    while next < group.len() {
        let (mut bytes, mut accepted, mut rejected) = (0usize, 0u64, 0u64);
        let mut last_source = None;
        {
            let mut tunn = peer.tunn.lock();
            while let Some(&(_, _, position)) = group.get(next) {
                let Some(space) = writer.space() else { break };
                next += 1;
                let datagram = inbound.get(position);
                match tunn
                    .0
                    .decapsulate(Some(datagram.source.ip()), datagram.bytes, space)
                {
                    TunnResult::WriteToTunnelV4(packet, _)
                    | TunnResult::WriteToTunnelV6(packet, _) => {
                        bytes += datagram.bytes.len();
                        accepted += 1;
                        last_source = Some(datagram.source);
                        if probes.take(shared, peer, packet) {
                            continue; // a connectivity probe, the gateway's own
                        }
                        let len = packet.len();
                        match snapshot.remap.ingress(id, packet) {
                            Verdict::Deliver => writer.commit(len),
                            Verdict::Drop(reason) => {
                                tracing::trace!(%reason, peer = id, "ingress drop");
                                shared.drops.remap(reason);
                            }
                            Verdict::Forward(_) => shared.drops.remap(DropReason::BadPacket),
                        }
                    }
                    TunnResult::Done => {
                        // A keepalive.
                        bytes += datagram.bytes.len();
                        accepted += 1;
                        last_source = Some(datagram.source);
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
        probes.answer(shared, peer).await;
        shared.drops.device_many(DeviceDrop::Rejected, rejected);
        if next < group.len() {
            flush_tun(shared, tun, writer).await;
        }
    }
}

/// Writes the TUN batch to `tun`; a failed write is counted as a `tun_write` drop.
async fn flush_tun(shared: &Shared, tun: &AsyncDevice, writer: &mut TunWriter) {
    if let Err(error) = writer.flush(tun).await {
        tracing::trace!(%error, "TUN write failed");
        shared.drops.device(DeviceDrop::TunWrite);
    }
}

pub(super) async fn send_to_peer(
    shared: &Shared,
    peer: &Peer,
    datagram: &[u8],
    endpoint: SocketAddr,
) {
    let sockets = shared.sockets.load();
    let Some(socket) = sockets.for_addr(&endpoint) else {
        shared.drops.device(DeviceDrop::UdpSend);
        return;
    };
    let now = unix_ms();
    if is_initiation(datagram) {
        peer.record_initiation(now);
    }
    match send_datagram(&socket.udp, datagram, endpoint).await {
        Ok(_) => peer.record_sent(datagram.len(), now),
        Err(error) => {
            tracing::trace!(%error, %endpoint, "UDP send failed");
            shared.drops.device(DeviceDrop::UdpSend);
        }
    }
}

async fn send_datagram(
    socket: &UdpSocket,
    datagram: &[u8],
    endpoint: SocketAddr,
) -> std::io::Result<usize> {
    socket.send_to(datagram, endpoint).await
}

/// Sends a handshake initiation to every peer of `snapshot` that has an endpoint, no session
/// and no handshake in flight. Run after every applied change, so a restarted gateway (or a
/// re-applied state) reaches its peers in one round trip instead of waiting for the remote's
/// rekey timer, which only fires when it has something to send and no answer for 5 s + jitter
/// (15 s and more in practice). Peers with a session are left alone.
pub(super) async fn initiate_sessions(shared: Arc<Shared>, snapshot: Arc<Snapshot>) {
    // A handshake initiation is 148 bytes.
    let mut out = [0u8; 256];
    let mut sent = 0usize;
    for (_, slot) in snapshot.slots() {
        let Some(peer) = &slot.runtime else { continue };
        let Some(endpoint) = peer.endpoint() else {
            continue;
        };
        let length = {
            let mut tunn = peer.tunn.lock();
            if tunn.0.stats().0.is_some() {
                continue;
            }
            match tunn.0.format_handshake_initiation(&mut out, false) {
                TunnResult::WriteToNetwork(datagram) => datagram.len(),
                _ => continue,
            }
        };
        send_to_peer(&shared, peer, &out[..length], endpoint).await;
        sent += 1;
        // Each initiation costs a Diffie-Hellman; with thousands of peers, let others run.
        if sent.is_multiple_of(64) {
            tokio::task::yield_now().await;
        }
    }
    if sent > 0 {
        tracing::debug!(
            peers = sent,
            "handshake initiated with peers without a session"
        );
    }
}

/// Every [`TIMER_TICK`]: `update_timers` for every peer (handshake retries, rekey, expiry,
/// passive keepalive), the persistent keepalive, and the rate limiter reset every second.
pub async fn timer_loop(shared: Arc<Shared>) {
    let mut interval = tokio::time::interval(TIMER_TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut out = vec![0u8; MAX_PACKET + OVERHEAD];
    let mut ticks: u64 = 0;
    loop {
        interval.tick().await;
        ticks = ticks.wrapping_add(1);
        let snapshot = shared.snapshot.load_full();
        if ticks.is_multiple_of(RATE_LIMIT_RESET_TICKS)
            && let Some(identity) = &snapshot.identity
        {
            identity.reset_rate_limiters();
        }
        for (_, slot) in snapshot.slots() {
            let Some(peer) = &slot.runtime else { continue };
            let endpoint = peer.endpoint();
            let result = peer.tunn.lock().0.update_timers(&mut out);
            match result {
                TunnResult::WriteToNetwork(datagram) => {
                    if let Some(endpoint) = endpoint {
                        send_to_peer(&shared, peer, datagram, endpoint).await;
                    }
                }
                TunnResult::Err(error) => tracing::trace!(?error, "peer timer"),
                _ => {}
            }
            let keepalive_ms = u64::from(slot.config.persistent_keepalive) * 1000;
            let Some(endpoint) = endpoint else { continue };
            let last_sent = peer.stats.last_sent_ms.load(Ordering::Relaxed);
            if keepalive_ms > 0 && unix_ms().saturating_sub(last_sent) >= keepalive_ms {
                let result = peer.tunn.lock().0.encapsulate(&[], &mut out);
                if let TunnResult::WriteToNetwork(datagram) = result {
                    send_to_peer(&shared, peer, datagram, endpoint).await;
                }
            }
        }
    }
}
