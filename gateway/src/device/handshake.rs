//! Handshake messages off the data path.
//!
//! The UDP readers decrypt transport data inline but hand every handshake initiation,
//! response and cookie reply to a bounded [`HandshakeQueue`]. One worker thread drains it: the
//! shared rate limiter (cookie replies when over the allowance), the Diffie-Hellman work of
//! initiations, the replies, and the packets a peer queued while it had no session.
//!
//! Why a queue and a thread of its own: a flood of initiations from unknown keys costs MAC
//! checks, cookie replies and sends for every datagram. Inline, that work sits in front of the
//! real peers' data; queued, a flood only costs the readers a 148-byte copy, and beyond the
//! queue's capacity a counted drop. The worker runs at a lower scheduling priority, so when
//! the data path and a flood compete for the cores, the data path wins.
//!
//! Why per-source shares: a plain FIFO that a flood keeps full sheds a real peer's handshake
//! along with the flood's. Each source address (hashed with a per-process random key into
//! [`SOURCE_BUCKETS`] buckets) may hold at most [`PER_SOURCE_SHARE`] queued messages, so one
//! flooding address cannot crowd out the others; the rate limiter and its cookies then deal
//! with what does get through.

use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Weak};

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::{Packet, TunnResult};

use super::datapath::{MAX_PACKET, OVERHEAD, Shared};
use super::dispatch::{INITIATION_LEN, Incoming, classify, is_cookie_reply, is_initiation};
use super::drops::DeviceDrop;
use super::peer::Peer;
use super::snapshot::{Identity, Snapshot};
use crate::clock::unix_ms;
use crate::key::Key;
use crate::remap::{DropReason, PeerId};

/// Handshake messages that may wait for the worker. At the worker's pace (tens of µs per
/// initiation that passes the limiter, a few µs per cookie reply) this is a few ms of work:
/// enough to absorb bursts, small enough that a waiting real handshake is not stale.
pub const HANDSHAKE_QUEUE_LEN: usize = 1024;
/// Buckets source addresses are hashed into for their share of the queue (one per `u8`).
pub const SOURCE_BUCKETS: usize = 256;
/// Messages one bucket of source addresses may have queued at once.
pub const PER_SOURCE_SHARE: u32 = 32;
/// The worker's nice value: below the data path's, so a flood yields the CPU to it.
const WORKER_NICE: i32 = 10;

/// One received handshake message, copied out of the receive batch.
#[derive(Debug, Clone, Copy)]
pub struct HandshakeMessage {
    source: SocketAddr,
    /// The source's bucket of [`SourceShares`], given back when the message leaves the queue.
    bucket: u8,
    len: u8,
    bytes: [u8; INITIATION_LEN],
}

impl HandshakeMessage {
    /// Copies `datagram` (at most an initiation's 148 bytes; `None` if longer).
    fn new(source: SocketAddr, bucket: u8, datagram: &[u8]) -> Option<HandshakeMessage> {
        let mut bytes = [0u8; INITIATION_LEN];
        bytes.get_mut(..datagram.len())?.copy_from_slice(datagram);
        Some(HandshakeMessage {
            source,
            bucket,
            len: u8::try_from(datagram.len()).ok()?,
            bytes,
        })
    }

    fn datagram(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// The sending side of the queue, held by the UDP readers (through [`Shared`]).
#[derive(Debug)]
pub struct HandshakeQueue {
    sender: SyncSender<HandshakeMessage>,
    shares: Arc<SourceShares>,
}

/// The receiving side, drained by the worker.
#[derive(Debug)]
pub struct HandshakeReceiver {
    receiver: Receiver<HandshakeMessage>,
    shares: Arc<SourceShares>,
}

/// The queue (or the source's share of it) was full: the message was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

impl HandshakeQueue {
    /// A queue and the receiver its worker drains (see [`spawn_worker`]).
    pub fn new() -> (HandshakeQueue, HandshakeReceiver) {
        let (sender, receiver) = sync_channel(HANDSHAKE_QUEUE_LEN);
        let shares = Arc::new(SourceShares::new());
        let queue = HandshakeQueue {
            sender,
            shares: Arc::clone(&shares),
        };
        (queue, HandshakeReceiver { receiver, shares })
    }

    /// Queues a handshake message without waiting; refused when the queue or the source's
    /// share of it is full.
    pub fn offer(&self, source: SocketAddr, datagram: &[u8]) -> Result<(), QueueFull> {
        // The share first: a flood is mostly refused here, before any copy.
        let bucket = self.shares.take(source.ip()).ok_or(QueueFull)?;
        let queued = HandshakeMessage::new(source, bucket, datagram)
            // Disconnected only while the device is being torn down.
            .is_some_and(|message| self.sender.try_send(message).is_ok());
        if queued {
            Ok(())
        } else {
            self.shares.give_back(bucket);
            Err(QueueFull)
        }
    }
}

impl HandshakeReceiver {
    /// Waits for the next message; `None` once every sender is gone.
    pub fn recv(&self) -> Option<HandshakeMessage> {
        let message = self.receiver.recv().ok()?;
        self.shares.give_back(message.bucket);
        Some(message)
    }
}

/// How many queued messages each bucket of source addresses holds.
#[derive(Debug)]
struct SourceShares {
    /// Keyed per process, so a sender cannot aim at a real peer's bucket.
    hasher: std::collections::hash_map::RandomState,
    queued: [AtomicU32; SOURCE_BUCKETS],
}

impl SourceShares {
    fn new() -> Self {
        SourceShares {
            hasher: std::collections::hash_map::RandomState::new(),
            queued: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    fn bucket(&self, source: IpAddr) -> u8 {
        // The low byte: SOURCE_BUCKETS is 256.
        self.hasher.hash_one(source).to_le_bytes()[0]
    }

    /// Takes a place in `source`'s share; `None` when the share is used up.
    fn take(&self, source: IpAddr) -> Option<u8> {
        let bucket = self.bucket(source);
        self.queued[usize::from(bucket)]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued < PER_SOURCE_SHARE).then_some(queued + 1)
            })
            .ok()
            .map(|_| bucket)
    }

    fn give_back(&self, bucket: u8) {
        self.queued[usize::from(bucket)].fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts the worker thread. It holds the device weakly and ends when the queue's sender is
/// dropped with the device.
pub fn spawn_worker(shared: Weak<Shared>, queue: HandshakeReceiver) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("kubetun-handshake".into())
        .spawn(move || run_worker(&shared, &queue))
        .map(drop)
}

fn run_worker(shared: &Weak<Shared>, queue: &HandshakeReceiver) {
    lower_priority();
    let mut out = vec![0u8; MAX_PACKET + OVERHEAD];
    while let Some(message) = queue.recv() {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let snapshot = shared.snapshot.load();
        process(&shared, &snapshot, &message, &mut out);
    }
}

/// Lowers this thread's priority (Linux nice values are per thread). Failing leaves the
/// default priority, which is still correct, only less protective.
fn lower_priority() {
    // SAFETY: setpriority only reads its integer arguments; `who = 0` is the calling thread.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, WORKER_NICE) };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "could not lower the handshake worker's priority"
        );
    }
}

/// Finds the peer of a handshake message, lets its `Tunn` process it and acts on the result.
fn process(shared: &Shared, snapshot: &Snapshot, message: &HandshakeMessage, out: &mut [u8]) {
    let (source, datagram) = (message.source, message.datagram());
    let kind = classify(datagram);
    let Some((id, addressed)) = find_peer(shared, snapshot, source, datagram, kind, out) else {
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
    let result = {
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
                // Key rotation: the peer initiated with the other one of our two keys: the
                // new one once it has learned it (it dropped its old-key sessions then), or
                // the previous one while it has not (after a restart our tunnels start on the
                // new key; once one is proven by a handshake, old-key initiations, which may
                // be replays, no longer move it back). A tunnel made with that key answers,
                // and replaces the peer's tunnel only if the handshake checks out (anyone can
                // address an initiation to our public key in the peer's name; only the peer
                // can complete it).
                let mut moved = identity.tunn(&slot.config, peer.index);
                let result = moved.0.decapsulate(Some(source.ip()), datagram, out);
                if matches!(&result, TunnResult::WriteToNetwork(reply) if !is_cookie_reply(reply)) {
                    *tunn = moved;
                    peer.stats.key_since_ms.store(unix_ms(), Ordering::Relaxed);
                    let key = if to_current(identity) {
                        "new"
                    } else {
                        "previous"
                    };
                    tracing::info!(peer = %slot.config.display_name(), key, "peer's tunnel moved to another of our keys");
                }
                result
            }
            _ => tunn.0.decapsulate(Some(source.ip()), datagram, out),
        }
    };
    match result {
        TunnResult::Err(error) => {
            tracing::trace!(?error, %source, "handshake message rejected");
            shared.drops.device(DeviceDrop::Rejected);
        }
        TunnResult::WriteToNetwork(reply) if is_cookie_reply(reply) => {
            // The limiter tripped between our check and the peer's: the sender is unproven.
            shared.drops.device(DeviceDrop::UnderLoad);
            send(shared, reply, source);
        }
        TunnResult::WriteToNetwork(reply) => {
            accepted(peer, kind, source, datagram.len());
            if matches!(kind, Incoming::Initiation | Incoming::Response { .. }) {
                peer.record_handshake(unix_ms());
                tracing::debug!(
                    peer = %slot.config.display_name(),
                    endpoint = %source,
                    "handshake completed"
                );
            }
            send_to_peer(shared, peer, reply, source);
            flush_queued(shared, peer, source, out);
        }
        TunnResult::Done => accepted(peer, kind, source, datagram.len()),
        TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {
            // Only transport data decrypts to a packet, and data never reaches this queue.
            shared.drops.device(DeviceDrop::InvalidDatagram);
        }
    }
}

fn accepted(peer: &Peer, kind: Incoming, source: SocketAddr, len: usize) {
    if kind.authenticates_source() {
        peer.roam(source);
    }
    peer.record_received(len);
}

/// Sends the packets `Tunn` queued while it had no session, now that it has one.
fn flush_queued(shared: &Shared, peer: &Peer, endpoint: SocketAddr, out: &mut [u8]) {
    loop {
        let result = peer.tunn.lock().0.decapsulate(None, &[], out);
        match result {
            TunnResult::WriteToNetwork(datagram) => send_to_peer(shared, peer, datagram, endpoint),
            _ => return,
        }
    }
}

/// The receiver lookup: by index for responses and cookies; by decrypting the initiator's
/// static key for initiations. Initiations and responses pass the shared rate limiter first,
/// which answers with a cookie reply when over the allowance. During a key rotation a message
/// whose MAC does not match the current key is tried with the previous one; for an initiation
/// the pair it was addressed to is returned too (its peer's tunnel may have to move to it).
fn find_peer<'s>(
    shared: &Shared,
    snapshot: &'s Snapshot,
    source: SocketAddr,
    datagram: &[u8],
    kind: Incoming,
    out: &mut [u8],
) -> Option<(PeerId, Option<&'s Identity>)> {
    let Some(current) = snapshot.identity.as_deref() else {
        shared.drops.device(DeviceDrop::NoPrivateKey);
        return None;
    };
    let mut identity = current;
    let receiver = match kind {
        Incoming::Invalid | Incoming::Data { .. } => {
            shared.drops.device(DeviceDrop::InvalidDatagram);
            return None;
        }
        Incoming::Initiation | Incoming::Response { .. } => {
            let mut verified = current
                .rate_limiter
                .verify_packet(Some(source.ip()), datagram, out);
            if matches!(verified, Err(TunnResult::Err(WireGuardError::InvalidMac)))
                && let Some(previous) = current.previous.as_deref()
            {
                identity = previous;
                verified = previous
                    .rate_limiter
                    .verify_packet(Some(source.ip()), datagram, out);
            }
            let packet = match verified {
                Ok(packet) => packet,
                Err(TunnResult::WriteToNetwork(cookie)) => {
                    shared.drops.device(DeviceDrop::UnderLoad);
                    send(shared, cookie, source);
                    return None;
                }
                Err(_) => {
                    shared.drops.device(DeviceDrop::Rejected);
                    return None;
                }
            };
            match packet {
                Packet::HandshakeInit(init) => {
                    let Ok(half) = parse_handshake_anon(&identity.private, &identity.public, &init)
                    else {
                        shared.drops.device(DeviceDrop::Rejected);
                        return None;
                    };
                    let key = Key::from_bytes(half.peer_static_public);
                    return match snapshot.by_key.get(&key) {
                        Some(id) => Some((*id, Some(identity))),
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
        Incoming::CookieReply { receiver } => receiver,
    };
    match snapshot.by_index.get(&receiver) {
        Some(id) => Some((*id, None)),
        None => {
            shared.drops.device(DeviceDrop::UnknownReceiver);
            None
        }
    }
}

fn send_to_peer(shared: &Shared, peer: &Peer, datagram: &[u8], endpoint: SocketAddr) {
    let now = unix_ms();
    if is_initiation(datagram) {
        peer.record_initiation(now);
    }
    if send(shared, datagram, endpoint) {
        peer.record_sent(datagram.len(), now);
    }
}

/// Sends one datagram from this (non-async) thread without waiting: the sockets are
/// non-blocking, and a full send buffer drops the datagram (counted), as the kernel would.
fn send(shared: &Shared, datagram: &[u8], endpoint: SocketAddr) -> bool {
    let sockets = shared.sockets.load();
    let Some(socket) = sockets.for_addr(&endpoint) else {
        shared.drops.device(DeviceDrop::UdpSend);
        return false;
    };
    match socket2::SockRef::from(&socket.udp).send_to(datagram, &endpoint.into()) {
        Ok(_) => true,
        Err(error) => {
            tracing::trace!(%error, %endpoint, "UDP send failed");
            shared.drops.device(DeviceDrop::UdpSend);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> SocketAddr {
        "192.0.2.1:51820".parse().expect("address")
    }

    #[test]
    fn messages_keep_their_bytes_and_refuse_oversize() {
        let message = HandshakeMessage::new(source(), 7, &[2u8; 92]).expect("fits");
        assert_eq!(message.datagram(), &[2u8; 92][..]);
        assert_eq!(message.source, source());
        assert!(HandshakeMessage::new(source(), 7, &[1u8; INITIATION_LEN]).is_some());
        assert!(HandshakeMessage::new(source(), 7, &[1u8; INITIATION_LEN + 1]).is_none());
    }

    fn from_host(host: u32) -> SocketAddr {
        SocketAddr::from((std::net::Ipv4Addr::from(0x0a00_0000 + host), 51820))
    }

    #[test]
    fn one_source_cannot_take_more_than_its_share() {
        let (queue, receiver) = HandshakeQueue::new();
        // An oversized datagram is refused without using up a place.
        assert_eq!(
            queue.offer(source(), &[1; INITIATION_LEN + 1]),
            Err(QueueFull)
        );
        for n in 0..PER_SOURCE_SHARE {
            assert_eq!(queue.offer(source(), &[1; 64]), Ok(()), "message {n}");
        }
        assert_eq!(queue.offer(source(), &[1; 64]), Err(QueueFull));
        // Another address still gets in (unless it shares the flooder's bucket).
        let other = (1..)
            .map(from_host)
            .find(|a| queue.shares.bucket(a.ip()) != queue.shares.bucket(source().ip()))
            .expect("an address in another bucket");
        assert_eq!(queue.offer(other, &[2; 64]), Ok(()));
        // Taking one message out gives its source a place back.
        assert_eq!(receiver.recv().expect("queued").source, source());
        assert_eq!(queue.offer(source(), &[1; 64]), Ok(()));
        assert_eq!(queue.offer(source(), &[1; 64]), Err(QueueFull));
    }

    #[test]
    fn a_full_queue_refuses_and_keeps_what_it_holds() {
        let (queue, receiver) = HandshakeQueue::new();
        let mut host = 0;
        let mut queued = 0;
        while queued < HANDSHAKE_QUEUE_LEN {
            host += 1;
            if queue.offer(from_host(host), &[3; 64]).is_ok() {
                queued += 1;
            }
        }
        let refused = (host + 1..host + 10_000)
            .map(from_host)
            .filter(|a| queue.offer(*a, &[4; 64]).is_err())
            .count();
        assert_eq!(refused, 9_999, "a full queue takes nothing more");
        let first = receiver.recv().expect("queued");
        assert_eq!(first.source, from_host(1));
        assert_eq!(queue.offer(from_host(1), &[5; 64]), Ok(()), "room again");
        let mut left = 0;
        while receiver.receiver.try_recv().is_ok() {
            left += 1;
        }
        assert_eq!(left, HANDSHAKE_QUEUE_LEN);
    }
}
