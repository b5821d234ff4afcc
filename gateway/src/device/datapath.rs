//! The data-path tasks: TUN → peer (egress), UDP → TUN (ingress) and the timer task.
//!
//! Each task owns its buffers and an `arc_swap::Cache` of the snapshot, so the per-packet work
//! takes no global lock and allocates nothing; only the destination peer's `Tunn` mutex is
//! taken, and released before any IO. The IO calls sit in small functions (`recv_from`,
//! `send_datagram`, `write_tun`) so they can later be replaced by batched variants.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::{ArcSwap, Cache};
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::{Packet, TunnResult};
use tokio::net::UdpSocket;

use super::dispatch::{Incoming, classify, is_cookie_reply, is_initiation};
use super::drops::{DeviceDrop, Drops};
use super::net::Sockets;
use super::peer::Peer;
use super::snapshot::Snapshot;
use crate::clock::unix_ms;
use crate::key::Key;
use crate::remap::{DropReason, PeerId, Verdict};

/// Largest IP packet or UDP datagram handled.
const MAX_PACKET: usize = 65536;
/// Room boringtun needs beyond the plaintext when encapsulating (header + tag). Every
/// buffer is also far above the 148 bytes of the largest handshake message.
const OVERHEAD: usize = 32;
/// How often `update_timers` runs for every peer.
pub const TIMER_TICK: Duration = Duration::from_millis(250);
/// How often the shared handshake rate limiter is reset, in timer ticks.
const RATE_LIMIT_RESET_TICKS: u64 = 4;

/// What the data-path tasks share.
pub struct Shared {
    /// The TUN device.
    pub tun: Arc<tun_rs::AsyncDevice>,
    /// The current snapshot.
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    /// The UDP sockets. Kept out of the snapshot so that a task's cached snapshot never
    /// keeps an old port bound after a listen-port change.
    pub sockets: ArcSwap<Sockets>,
    /// Drop counters.
    pub drops: Drops,
    /// Set once the TUN reader has stopped (the interface was deleted or failed).
    pub stopped: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("drops", &self.drops)
            .finish_non_exhaustive()
    }
}

type SnapshotCache = Cache<Arc<ArcSwap<Snapshot>>, Arc<Snapshot>>;

/// Reads packets from the TUN device and sends them, encrypted, to the peer the remap table
/// routes them to. Runs until the device fails or the task is aborted.
pub async fn tun_loop(shared: Arc<Shared>) {
    let mut cache: SnapshotCache = Cache::new(Arc::clone(&shared.snapshot));
    let mut packet = vec![0u8; MAX_PACKET];
    let mut out = vec![0u8; MAX_PACKET + OVERHEAD];
    loop {
        let len = match shared.tun.recv(&mut packet).await {
            Ok(len) => len,
            Err(error) => {
                tracing::error!(%error, "reading from the TUN device failed; stopping");
                shared.stopped.send_replace(true);
                return;
            }
        };
        let snapshot = cache.load();
        egress(&shared, snapshot, &mut packet[..len], &mut out).await;
    }
}

async fn egress(shared: &Shared, snapshot: &Snapshot, packet: &mut [u8], out: &mut [u8]) {
    let id = match snapshot.remap.egress(packet) {
        Verdict::Forward(id) => id,
        Verdict::Drop(reason) => {
            tracing::trace!(%reason, "egress drop");
            shared.drops.remap(reason);
            return;
        }
        Verdict::Deliver => {
            shared.drops.remap(DropReason::NoRoute);
            return;
        }
    };
    let Some(slot) = snapshot.peer(id) else {
        shared.drops.remap(DropReason::UnknownPeer);
        return;
    };
    let Some(peer) = &slot.runtime else {
        shared.drops.device(DeviceDrop::NoPrivateKey);
        return;
    };
    let Some(endpoint) = peer.endpoint() else {
        shared.drops.device(DeviceDrop::NoEndpoint);
        return;
    };
    let result = peer.tunn.lock().0.encapsulate(packet, out);
    match result {
        TunnResult::WriteToNetwork(datagram) => {
            send_to_peer(shared, peer, datagram, endpoint).await;
        }
        TunnResult::Done => {} // queued until the handshake completes
        TunnResult::Err(error) => {
            tracing::trace!(?error, "encapsulate failed");
            shared.drops.device(DeviceDrop::Rejected);
        }
        TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {}
    }
}

/// Receives datagrams from one UDP socket and hands each to [`ingress`].
pub async fn udp_loop(shared: Arc<Shared>, socket: Arc<UdpSocket>) {
    let mut cache: SnapshotCache = Cache::new(Arc::clone(&shared.snapshot));
    let mut datagram = vec![0u8; MAX_PACKET];
    let mut out = vec![0u8; MAX_PACKET + OVERHEAD];
    loop {
        let (len, source) = match recv_from(&socket, &mut datagram).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(%error, "UDP receive failed");
                continue;
            }
        };
        let snapshot = cache.load();
        ingress(
            &shared,
            snapshot,
            &socket,
            source,
            &datagram[..len],
            &mut out,
        )
        .await;
    }
}

async fn recv_from(socket: &UdpSocket, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
    socket.recv_from(buf).await
}

/// Finds the peer a datagram belongs to, lets its `Tunn` process it and acts on the result.
async fn ingress(
    shared: &Shared,
    snapshot: &Snapshot,
    socket: &UdpSocket,
    source: SocketAddr,
    datagram: &[u8],
    out: &mut [u8],
) {
    let kind = classify(datagram);
    let Some(id) = find_peer(shared, snapshot, socket, source, datagram, kind, out).await else {
        return;
    };
    let Some(slot) = snapshot.peer(id) else {
        shared.drops.remap(DropReason::UnknownPeer);
        return;
    };
    let Some(peer) = slot.runtime.as_deref() else {
        shared.drops.device(DeviceDrop::NoPrivateKey);
        return;
    };
    let result = peer
        .tunn
        .lock()
        .0
        .decapsulate(Some(source.ip()), datagram, out);
    let now = unix_ms();
    match result {
        TunnResult::Err(error) => {
            tracing::trace!(?error, %source, "datagram rejected");
            shared.drops.device(DeviceDrop::Rejected);
        }
        TunnResult::WriteToNetwork(reply) if is_cookie_reply(reply) => {
            // The limiter tripped between our check and the peer's: the sender is unproven.
            shared.drops.device(DeviceDrop::UnderLoad);
            if let Err(error) = send_datagram(socket, reply, source).await {
                tracing::trace!(%error, "cookie reply not sent");
            }
        }
        TunnResult::WriteToNetwork(reply) => {
            accepted(peer, kind, source, datagram.len());
            if matches!(kind, Incoming::Initiation | Incoming::Response { .. }) {
                peer.record_handshake(now);
                tracing::debug!(
                    peer = %slot.config.display_name(),
                    endpoint = %source,
                    "handshake completed"
                );
            }
            send_to_peer(shared, peer, reply, source).await;
            flush_queue(shared, peer, source, out).await;
        }
        TunnResult::WriteToTunnelV4(packet, _) | TunnResult::WriteToTunnelV6(packet, _) => {
            accepted(peer, kind, source, datagram.len());
            deliver(shared, snapshot, id, packet).await;
        }
        TunnResult::Done => accepted(peer, kind, source, datagram.len()),
    }
}

fn accepted(peer: &Peer, kind: Incoming, source: SocketAddr, len: usize) {
    if kind.authenticates_source() {
        peer.roam(source);
    }
    peer.record_received(len);
}

/// Sends the packets `Tunn` queued while it had no session, now that it has one.
async fn flush_queue(shared: &Shared, peer: &Peer, endpoint: SocketAddr, out: &mut [u8]) {
    loop {
        let result = peer.tunn.lock().0.decapsulate(None, &[], out);
        match result {
            TunnResult::WriteToNetwork(datagram) => {
                send_to_peer(shared, peer, datagram, endpoint).await;
            }
            _ => return,
        }
    }
}

/// The receiver lookup: by index for responses, cookies and data; by decrypting the initiator's
/// static key for initiations. Handshake messages pass the shared rate limiter first, which
/// answers with a cookie reply when under load.
async fn find_peer(
    shared: &Shared,
    snapshot: &Snapshot,
    socket: &UdpSocket,
    source: SocketAddr,
    datagram: &[u8],
    kind: Incoming,
    out: &mut [u8],
) -> Option<PeerId> {
    let Some(identity) = snapshot.identity.as_deref() else {
        shared.drops.device(DeviceDrop::NoPrivateKey);
        return None;
    };
    let receiver = match kind {
        Incoming::Invalid => {
            shared.drops.device(DeviceDrop::InvalidDatagram);
            return None;
        }
        Incoming::Initiation | Incoming::Response { .. } => {
            let packet = match identity
                .rate_limiter
                .verify_packet(Some(source.ip()), datagram, out)
            {
                Ok(packet) => packet,
                Err(TunnResult::WriteToNetwork(cookie)) => {
                    shared.drops.device(DeviceDrop::UnderLoad);
                    if let Err(error) = send_datagram(socket, cookie, source).await {
                        tracing::trace!(%error, "cookie reply not sent");
                    }
                    return None;
                }
                Err(_) => {
                    shared.drops.device(DeviceDrop::Rejected);
                    return None;
                }
            };
            match packet {
                Packet::HandshakeInit(init) => {
                    let half =
                        match parse_handshake_anon(&identity.private, &identity.public, &init) {
                            Ok(half) => half,
                            Err(_) => {
                                shared.drops.device(DeviceDrop::Rejected);
                                return None;
                            }
                        };
                    let key = Key::from_bytes(half.peer_static_public);
                    return match snapshot.by_key.get(&key) {
                        Some(id) => Some(*id),
                        None => {
                            tracing::debug!(%source, "handshake from an unknown public key");
                            shared.drops.device(DeviceDrop::UnknownInitiator);
                            None
                        }
                    };
                }
                Packet::HandshakeResponse(response) => response.receiver_idx >> 8,
                Packet::PacketCookieReply(_) | Packet::PacketData(_) => {
                    shared.drops.device(DeviceDrop::InvalidDatagram);
                    return None;
                }
            }
        }
        Incoming::CookieReply { receiver } | Incoming::Data { receiver } => receiver,
    };
    match snapshot.by_index.get(&receiver) {
        Some(id) => Some(*id),
        None => {
            shared.drops.device(DeviceDrop::UnknownReceiver);
            None
        }
    }
}

/// Translates a decrypted packet (source check, ACL, real → view) and writes it to the TUN.
async fn deliver(shared: &Shared, snapshot: &Snapshot, id: PeerId, packet: &mut [u8]) {
    match snapshot.remap.ingress(id, packet) {
        Verdict::Deliver => {
            if let Err(error) = write_tun(&shared.tun, packet).await {
                tracing::trace!(%error, "TUN write failed");
                shared.drops.device(DeviceDrop::TunWrite);
            }
        }
        Verdict::Drop(reason) => {
            tracing::trace!(%reason, peer = id, "ingress drop");
            shared.drops.remap(reason);
        }
        Verdict::Forward(_) => shared.drops.remap(DropReason::BadPacket),
    }
}

async fn write_tun(tun: &tun_rs::AsyncDevice, packet: &[u8]) -> std::io::Result<usize> {
    tun.send(packet).await
}

async fn send_to_peer(shared: &Shared, peer: &Peer, datagram: &[u8], endpoint: SocketAddr) {
    let sockets = shared.sockets.load();
    let Some(socket) = sockets.for_addr(&endpoint) else {
        shared.drops.device(DeviceDrop::UdpSend);
        return;
    };
    let now = unix_ms();
    if is_initiation(datagram) {
        peer.record_initiation(now);
    }
    match send_datagram(socket, datagram, endpoint).await {
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
            identity.rate_limiter.reset_count();
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
