//! [`Transmits`]: the single datagrams a call into the core wants sent — handshake replies
//! and cookies, timer messages, probes and their answers, the packets queued during a
//! handshake — in an arena the caller owns and empties after the call. The core never sends:
//! the shell takes each [`Transmit`], sends it, and reports it [`Transmit::sent`] when it
//! left, which counts it for its peer.
//!
//! Nothing here allocates after construction.

use std::sync::Arc;

use crate::clock::Now;
use crate::dispatch::is_initiation;
use crate::endpoint::Endpoint;
use crate::peer::Peer;

/// Single datagrams to send, in the order the core produced them.
#[derive(Debug)]
pub struct Transmits {
    bytes: Box<[u8]>,
    used: usize,
    entries: Vec<Entry>,
    /// Most entries held.
    datagrams: usize,
}

#[derive(Debug)]
struct Entry {
    endpoint: Endpoint,
    start: usize,
    len: usize,
    /// The peer it is counted for when it left, and when.
    peer: Option<(Arc<Peer>, u64)>,
}

impl Transmits {
    /// Room for `datagrams` datagrams of `bytes` bytes in all.
    pub fn new(datagrams: usize, bytes: usize) -> Self {
        Self {
            bytes: vec![0; bytes].into_boxed_slice(),
            used: 0,
            entries: Vec::with_capacity(datagrams),
            datagrams,
        }
    }

    /// Space for one more datagram of up to `len` bytes (write it at the start, then
    /// [`Self::commit`] it), or `None` when it does not fit: send what waits first.
    pub fn space(&mut self, len: usize) -> Option<&mut [u8]> {
        if !self.has_room(len) {
            return None;
        }
        Some(&mut self.bytes[self.used..self.used + len])
    }

    /// Whether one more datagram of `len` bytes fits.
    pub fn has_room(&self, len: usize) -> bool {
        self.has_room_for(1, len)
    }

    /// Whether `datagrams` more datagrams of `bytes` bytes in all fit.
    pub fn has_room_for(&self, datagrams: usize, bytes: usize) -> bool {
        self.entries.len() + datagrams <= self.datagrams && self.bytes.len() - self.used >= bytes
    }

    /// Adds the `len`-byte datagram just written into [`Self::space`], to `endpoint`; with
    /// `peer`, a handshake initiation is recorded as pending now, and the datagram is counted
    /// for the peer once it is [`Transmit::sent`].
    pub fn commit(&mut self, endpoint: Endpoint, len: usize, peer: Option<&Arc<Peer>>, now: Now) {
        let start = self.used;
        debug_assert!(start + len <= self.bytes.len() && self.has_room(0));
        if let Some(peer) = peer
            && is_initiation(&self.bytes[start..start + len])
        {
            peer.record_initiation(now.unix_ms);
        }
        self.used += len;
        self.entries.push(Entry {
            endpoint,
            start,
            len,
            peer: peer.map(|peer| (Arc::clone(peer), now.unix_ms)),
        });
    }

    /// Copies `datagram` in (see [`Self::commit`]); false when it does not fit.
    pub fn push(
        &mut self,
        datagram: &[u8],
        endpoint: Endpoint,
        peer: Option<&Arc<Peer>>,
        now: Now,
    ) -> bool {
        let Some(space) = self.space(datagram.len()) else {
            return false;
        };
        space[..datagram.len()].copy_from_slice(datagram);
        self.commit(endpoint, datagram.len(), peer, now);
        true
    }

    /// The datagrams waiting, in order.
    pub fn iter(&self) -> impl Iterator<Item = Transmit<'_>> {
        self.entries.iter().map(|entry| Transmit {
            datagram: &self.bytes[entry.start..entry.start + entry.len],
            entry,
        })
    }

    /// How many datagrams wait.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets every datagram (after they were sent).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.used = 0;
    }
}

/// One datagram of [`Transmits`].
#[derive(Debug, Clone, Copy)]
pub struct Transmit<'a> {
    /// Its bytes.
    pub datagram: &'a [u8],
    entry: &'a Entry,
}

impl Transmit<'_> {
    /// Where it goes (and the local address it leaves from, when pinned).
    pub fn endpoint(&self) -> Endpoint {
        self.entry.endpoint
    }

    /// Records that it left: counted in its peer's sent datagrams and bytes, if it has one.
    pub fn sent(&self) {
        if let Some((peer, at_ms)) = &self.entry.peer {
            peer.record_sent(self.datagram.len(), *at_ms);
        }
    }
}
