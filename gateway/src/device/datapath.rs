//! The data-path tasks, the IO shell around [`kubetun_gateway_core`]: TUN → peer (egress), UDP → TUN
//! (ingress), the timer task and the initiations after an apply.
//!
//! Each task owns its buffers and an `arc_swap::Cache` of the snapshot, reads a batch, hands
//! it to the core, and writes what the core produced; the per-packet work takes no global
//! lock and allocates nothing, and a peer's `Tunn` mutex is released before any IO. The IO
//! is batched ([`kubetun_gateway_io`]): TUN reads and writes with virtio-net offloads, UDP with
//! `recvmmsg`/`sendmmsg`, GRO and GSO, each switchable through [`IoOptions`](crate::io_options::IoOptions).
//!
//! # Queues
//!
//! With [`IoOptions::queues`](crate::io_options::IoOptions::queues) = N there are N [`tun_loop`]s, one per queue of the
//! multi-queue TUN device, and N [`udp_loop`]s per address family, one per socket of the
//! family's `SO_REUSEPORT` group ([`super::net`]). The `tun_loop` of queue `i` sends on
//! socket `i` of a family, the `udp_loop`s of socket `i` write to TUN queue `i`. The tasks
//! share nothing but the snapshot, the sockets, the peers and the crypto workers. With more
//! than one crypto worker, two tasks working for the same peer hold its `Tunn` mutex only
//! to take its session and tick its timers, and seal or open their runs in parallel, and
//! within one task a long run of one peer is cut into parts for
//! [`Shared::workers`](super::shared::Shared::workers); with one, they serialize on the
//! mutex, which `encapsulate`/`decapsulate` hold for a whole run.
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

use std::sync::Arc;
use std::time::Duration;

use arc_swap::Cache;
use tun_rs::AsyncDevice;

use super::net::{Sender, WgSocket, queue_socket};
use super::shared::{Shared, SnapshotCache};
use crate::clock;
use kubetun_gateway_core::batch::{MAX_GSO_SEGMENTS, RecvBatch};
use kubetun_gateway_core::context::Context;
use kubetun_gateway_core::drops::DeviceDrop;
use kubetun_gateway_core::egress::Egress;
use kubetun_gateway_core::ingress::Ingress;
use kubetun_gateway_core::snapshot::Snapshot;
use kubetun_gateway_core::transmits::Transmits;
use kubetun_gateway_core::{HANDSHAKE_ROOM, Outbox, PROBE_ROOM, Step, timers};
use kubetun_gateway_io::tun_offload::{SEGMENTS_PER_READ, TunReader, TunWriter};
use kubetun_gateway_io::udp_batch::{BatchReceiver, BatchSender};

/// With UDP GRO a receive reads `batch / GRO_MESSAGES_DIVISOR` messages, each holding up to
/// 64 datagrams.
const GRO_MESSAGES_DIVISOR: usize = 8;
/// How often `update_timers` runs for every peer.
pub const TIMER_TICK: Duration = Duration::from_millis(250);
/// How often the shared handshake rate limiter is reset, in timer ticks.
const RATE_LIMIT_RESET_TICKS: u64 = 4;
/// Timer messages queued before they are sent (two per peer at most).
const TIMER_TRANSMITS: usize = 64;
/// PONGs queued during one decryption step before they are sent.
const PONGS: usize = 64;

/// Reads batches of packets from TUN queue `queue` and sends them, encrypted, to the peers
/// the remap table routes them to, on the sockets of the same queue. Runs until the device
/// fails or the task is aborted.
///
/// Per batch the core ([`Egress`]) remaps every packet, groups the packets by peer and
/// encrypts them into the outbox, where equal-size datagrams to one endpoint coalesce into
/// GSO messages; then one `sendmmsg` per socket (more when the outbox fills up).
pub async fn tun_loop(shared: Arc<Shared>, queue: usize) {
    let mut cache: SnapshotCache = Cache::new(Arc::clone(&shared.snapshot));
    let tun = Arc::clone(shared.tun_queue(queue));
    let batch = shared.io.batch();
    let mut reader = TunReader::new(batch);
    let mut outbox = Outbox::new(batch);
    let mut batch_sender = BatchSender::default();
    let mut egress = Egress::new(batch - 1 + SEGMENTS_PER_READ);
    loop {
        if let Err(error) = reader.recv(&tun).await {
            tracing::error!(%error, queue, "reading from the TUN device failed; stopping");
            shared.stopped.send_replace(true);
            return;
        }
        shared.activity.mark();
        shared
            .drops
            .device_many(DeviceDrop::TunRead, reader.take_skipped());
        let now = clock::now();
        if shared.drops_on_standby(now.mono_us, || reader.packets().len()) {
            continue;
        }
        let snapshot = cache.load();
        let cx = Context::new(snapshot, &shared.drops, now)
            .with_flows(&shared.flows)
            .with_workers(&shared.workers);
        egress.route(&cx, reader.packets_mut());
        while egress.encrypt(&cx, reader.packets(), &mut outbox) == Step::Flush {
            flush_outbox(&shared, &mut outbox, &mut batch_sender, queue).await;
        }
        flush_outbox(&shared, &mut outbox, &mut batch_sender, queue).await;
    }
}

/// Sends everything queued in `outbox` on the sockets of `queue`; failures are counted as
/// `udp_send` drops.
async fn flush_outbox(
    shared: &Shared,
    outbox: &mut Outbox,
    batch_sender: &mut BatchSender,
    queue: usize,
) {
    let sockets = shared.sockets.load();
    for (out, family) in [(&mut outbox.v4, &sockets.v4), (&mut outbox.v6, &sockets.v6)] {
        if out.is_empty() {
            continue;
        }
        let Some(socket) = queue_socket(family, queue) else {
            shared
                .drops
                .device_many(DeviceDrop::UdpSend, out.len() as u64);
            out.clear();
            continue;
        };
        match batch_sender
            .send_to(out, &socket.udp, &socket.offload)
            .await
        {
            Ok(report) => {
                shared
                    .drops
                    .device_many(DeviceDrop::UdpSend, report.failed as u64);
                if let Some(error) = batch_sender.take_last_error() {
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

/// Receives batches of datagrams from one UDP socket (`recvmmsg`, split GRO messages) and
/// has the core ([`Ingress`]) decrypt them into the TUN write batch, which GRO-coalesces
/// them on flush to TUN queue `queue`. Handshake messages go to the handshake queue
/// ([`super::handshake_queue`]).
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
    let mut receiver = BatchReceiver::default();
    let mut writer = TunWriter::new(batch);
    let mut ingress = Ingress::new(messages * MAX_GSO_SEGMENTS);
    // The PONGs of a batch: one per peer, sent after each step.
    let mut pongs = Transmits::new(PONGS, PONGS * PROBE_ROOM);
    loop {
        if let Err(error) = receiver.recv_from(&mut inbound, &socket.udp).await {
            tracing::debug!(%error, "UDP receive failed");
            continue;
        }
        shared.activity.mark();
        let now = clock::now();
        if shared.drops_on_standby(now.mono_us, || inbound.datagrams().count()) {
            continue;
        }
        let snapshot = cache.load();
        let cx = Context::new(snapshot, &shared.drops, now)
            .with_flows(&shared.flows)
            .with_workers(&shared.workers);
        ingress.classify(&cx, &inbound);
        for message in ingress.handshakes(&inbound) {
            if shared
                .handshakes
                .offer(message.source, message.datagram)
                .is_err()
            {
                message.refused(&shared.drops);
            }
        }
        loop {
            let step = ingress.decrypt(&cx, &inbound, &mut writer, &mut pongs);
            if !pongs.is_empty() {
                let sockets = shared.sockets.load();
                Sender::new(&sockets, &shared.drops).send(&mut pongs);
            }
            flush_tun(&shared, &tun, &mut writer).await;
            if step == Step::Done {
                break;
            }
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

/// Which peers [`initiate_sessions`] initiates with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Initiate {
    /// Kubetun gateways (the connectivity check is on) with an endpoint, no session and no
    /// handshake in flight: after an apply. Such a peer initiates after its own apply too,
    /// so whichever side is configured second gets through. A plain WireGuard peer never
    /// initiates when configured: an initiation it cannot answer yet would only hold our
    /// first packets for REKEY_TIMEOUT (5 s), so it gets one when there is traffic, as
    /// WireGuard does, or when it sends on a session of our previous run (a restart).
    ProbedWithoutSession,
    /// Every peer with an endpoint: after a promotion, when the remotes' sessions and
    /// endpoints belong to the replica that was active before.
    All,
}

/// Sends a handshake initiation to the peers of `snapshot` that `which` names, unless this
/// replica is on standby. Run after every applied change, so a restarted gateway (or a
/// re-applied state) reaches its kubetun peers in one round trip instead of waiting for the
/// remote's rekey timer, which only fires when it has something to send and no answer for
/// 5 s + jitter (15 s and more in practice); and after a promotion.
pub(super) async fn initiate_sessions(
    shared: Arc<Shared>,
    snapshot: Arc<Snapshot>,
    which: Initiate,
) {
    let mut out = Transmits::new(1, HANDSHAKE_ROOM);
    let mut sent = 0usize;
    for (_, slot) in snapshot.slots() {
        let now = clock::now();
        if !shared.role.is_active(now.mono_us) {
            return;
        }
        if which == Initiate::ProbedWithoutSession && !snapshot.state.probes(&slot.config) {
            continue;
        }
        let initiated = timers::initiate_session(slot, now, &mut out, which == Initiate::All);
        if initiated {
            let sockets = shared.sockets.load();
            Sender::new(&sockets, &shared.drops).send(&mut out);
        }
        if !initiated {
            continue;
        }
        sent += 1;
        // Each initiation costs a Diffie-Hellman; with thousands of peers, let others run.
        if sent.is_multiple_of(64) {
            tokio::task::yield_now().await;
        }
    }
    if sent > 0 {
        tracing::debug!(peers = sent, ?which, "handshakes initiated");
    }
}

/// Every [`TIMER_TICK`]: the core's [`timers::Tick`] for every peer (handshake retries,
/// rekey, expiry, passive and persistent keepalive), and the rate limiter reset every second.
pub async fn timer_loop(shared: Arc<Shared>) {
    let mut interval = tokio::time::interval(TIMER_TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut out = Transmits::new(TIMER_TRANSMITS, TIMER_TRANSMITS * HANDSHAKE_ROOM);
    let mut tick = timers::Tick::default();
    let mut ticks: u64 = 0;
    let mut was_active = true;
    loop {
        interval.tick().await;
        ticks = ticks.wrapping_add(1);
        let now = clock::now();
        // A standby keeps quiet: no keepalive, retry or rekey may move a remote to it.
        let active = shared.role.is_active(now.mono_us);
        if was_active && !active && shared.role.is_leased() {
            tracing::info!("standby: the lease was not renewed in time");
        }
        was_active = active;
        if !active {
            continue;
        }
        let snapshot = shared.snapshot.load_full();
        if ticks.is_multiple_of(RATE_LIMIT_RESET_TICKS) {
            timers::reset_rate_limiters(&snapshot, now);
        }
        let sockets = shared.sockets.load();
        let mut sender = Sender::new(&sockets, &shared.drops);
        let cx = Context::new(&snapshot, &shared.drops, now);
        while tick.run(&cx, &mut out) == Step::Flush {
            sender.send(&mut out);
        }
        sender.send(&mut out);
    }
}
