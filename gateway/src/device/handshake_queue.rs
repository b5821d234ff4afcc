//! The queue that takes handshake messages off the data path.
//!
//! The UDP readers decrypt transport data inline but hand every handshake initiation,
//! response and cookie reply to this bounded [`HandshakeQueue`]. One worker thread
//! ([`super::handshake`]) drains it: the shared rate limiter (cookie replies when over the
//! allowance), the Diffie-Hellman work of initiations, the replies, and the packets a peer
//! queued while it had no session ([`kubetun_gateway_core::handshake`]).
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
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use kubetun_gateway_core::Endpoint;
use kubetun_gateway_core::dispatch::INITIATION_LEN;

/// Handshake messages that may wait for the worker. At the worker's pace (tens of µs per
/// initiation that passes the limiter, a few µs per cookie reply) this is a few ms of work:
/// enough to absorb bursts, small enough that a waiting real handshake is not stale.
pub const HANDSHAKE_QUEUE_LEN: usize = 1024;
/// Buckets source addresses are hashed into for their share of the queue (one per `u8`).
pub const SOURCE_BUCKETS: usize = 256;
/// Messages one bucket of source addresses may have queued at once.
pub const PER_SOURCE_SHARE: u32 = 32;

/// One received handshake message, copied out of the receive batch.
#[derive(Debug, Clone, Copy)]
pub struct HandshakeMessage {
    /// Where it came from: the sender, and our address it was sent to.
    source: Endpoint,
    /// The source's bucket of [`SourceShares`], given back when the message leaves the queue.
    bucket: u8,
    len: u8,
    bytes: [u8; INITIATION_LEN],
}

impl HandshakeMessage {
    /// Copies `datagram` (at most an initiation's 148 bytes; `None` if longer).
    fn new(source: Endpoint, bucket: u8, datagram: &[u8]) -> Option<HandshakeMessage> {
        let mut bytes = [0u8; INITIATION_LEN];
        bytes.get_mut(..datagram.len())?.copy_from_slice(datagram);
        Some(HandshakeMessage {
            source,
            bucket,
            len: u8::try_from(datagram.len()).ok()?,
            bytes,
        })
    }

    /// The message's bytes.
    pub fn datagram(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Where it came from (and where a reply goes).
    pub fn source(&self) -> Endpoint {
        self.source
    }
}

/// The sending side of the queue, held by the UDP readers.
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
    /// A queue and the receiver its worker drains (see [`super::handshake`]).
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
    pub fn offer(&self, source: Endpoint, datagram: &[u8]) -> Result<(), QueueFull> {
        // The share first: a flood is mostly refused here, before any copy.
        let bucket = self.shares.take(source.remote.ip()).ok_or(QueueFull)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn source() -> Endpoint {
        Endpoint::unpinned("192.0.2.1:51820".parse().expect("address"))
    }

    #[test]
    fn messages_keep_their_bytes_and_refuse_oversize() {
        let message = HandshakeMessage::new(source(), 7, &[2u8; 92]).expect("fits");
        assert_eq!(message.datagram(), &[2u8; 92][..]);
        assert_eq!(message.source, source());
        assert!(HandshakeMessage::new(source(), 7, &[1u8; INITIATION_LEN]).is_some());
        assert!(HandshakeMessage::new(source(), 7, &[1u8; INITIATION_LEN + 1]).is_none());
    }

    fn from_host(host: u32) -> Endpoint {
        Endpoint::unpinned(SocketAddr::from((
            std::net::Ipv4Addr::from(0x0a00_0000 + host),
            51820,
        )))
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
            .find(|a| {
                queue.shares.bucket(a.remote.ip()) != queue.shares.bucket(source().remote.ip())
            })
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
