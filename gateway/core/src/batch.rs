//! The batch arenas the data-path core reads datagrams from and encrypts datagrams into.
//! They hold data only: the IO shell fills a [`RecvBatch`] with `recvmmsg` and hands a
//! [`SendBatch`]'s messages to `sendmmsg`, through the accessors marked as the shell's.
//!
//! - [`RecvBatch`]: received messages, each up to [`RECV_BUFFER_LEN`] bytes; a UDP GRO
//!   message (consecutive datagrams of one flow, coalesced by the kernel) is split again at
//!   its segment size, so the core always sees single WireGuard datagrams.
//! - [`SendBatch`]: consecutive datagrams to one endpoint of one size (only the last may be
//!   shorter) form one message that can leave as one GSO send: at most
//!   [`MAX_GSO_SEGMENTS`] segments and [`MAX_UDP_PAYLOAD`] bytes, the rules of
//!   wireguard-go's `coalesceMessages`.
//!
//! Nothing here allocates after construction.

use std::net::SocketAddr;

use crate::endpoint::{Endpoint, LocalAddr};

/// Most messages handled by one `recvmmsg` or `sendmmsg` call.
pub const MAX_BATCH: usize = 128;
/// Most segments in one GSO send (the kernel's `UDP_MAX_SEGMENTS`).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Largest UDP payload of one message (65535 − 20 − 8), which bounds a GSO send's total.
pub const MAX_UDP_PAYLOAD: usize = 65_507;
/// Receive buffer per message: a GRO message can carry up to 64 KiB, and a shorter buffer
/// would truncate it.
pub const RECV_BUFFER_LEN: usize = 65_536;
/// What the kernel reported of one received message.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// Who sent it; `None` for a truncated message or a source of an unknown family.
    pub source: Option<SocketAddr>,
    /// Our address the message was sent to, when the kernel said.
    pub local: Option<LocalAddr>,
    /// Bytes received.
    pub len: usize,
    /// The GRO segment size; equal to `len` for a single datagram.
    pub segment: usize,
}

/// Received messages (see the module docs).
pub struct RecvBatch {
    data: Box<[u8]>,
    metas: Box<[Received]>,
    filled: usize,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("messages", &self.metas.len())
            .field("filled", &self.filled)
            .finish()
    }
}

/// One received WireGuard datagram.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    pub source: SocketAddr,
    /// Our address it was sent to, when known.
    pub local: Option<LocalAddr>,
    pub bytes: &'a [u8],
    /// Where it sits in its batch, to find it again with [`RecvBatch::get`].
    pub position: Position,
}

impl Datagram<'_> {
    /// Where a reply goes: back to the source, from the address the datagram arrived at.
    pub fn reply_to(&self) -> Endpoint {
        Endpoint::reply(self.source, self.local)
    }
}

/// The place of a datagram in a [`RecvBatch`]: lets a caller keep a compact list of
/// datagrams (e.g. to group them by peer) without borrowing the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    start: u32,
    len: u32,
    message: u32,
}

impl RecvBatch {
    /// Room for `messages` messages (1..=[`MAX_BATCH`]) of [`RECV_BUFFER_LEN`] bytes each.
    pub fn new(messages: usize) -> Self {
        let messages = messages.clamp(1, MAX_BATCH);
        let empty = Received {
            source: None,
            local: None,
            len: 0,
            segment: 0,
        };
        Self {
            data: vec![0u8; messages * RECV_BUFFER_LEN].into_boxed_slice(),
            metas: vec![empty; messages].into_boxed_slice(),
            filled: 0,
        }
    }

    /// The shell's side of a receive: forgets the last one and lends the message buffers
    /// ([`RECV_BUFFER_LEN`] bytes each, [`Self::capacity`] of them) for the kernel to fill;
    /// then [`Self::record`] what it reported, message by message in order.
    pub fn buffers_mut(&mut self) -> std::slice::ChunksExactMut<'_, u8> {
        self.filled = 0;
        self.data.chunks_exact_mut(RECV_BUFFER_LEN)
    }

    /// Records the next message of a receive into [`Self::buffers_mut`].
    ///
    /// # Panics
    /// If every message is recorded already.
    pub fn record(&mut self, received: Received) {
        self.metas[self.filled] = received;
        self.filled += 1;
    }

    /// Most messages one receive can fill.
    pub fn capacity(&self) -> usize {
        self.metas.len()
    }

    /// The datagrams of the last receive, in arrival order, coalesced messages split at their
    /// segment size. Truncated messages and unknown source families are left out.
    pub fn datagrams(&self) -> impl Iterator<Item = Datagram<'_>> {
        self.metas[..self.filled]
            .iter()
            .enumerate()
            .filter_map(|(message, meta)| Some((message, meta.source?, meta)))
            .flat_map(move |(message, source, meta)| {
                let local = meta.local;
                let base = message * RECV_BUFFER_LEN;
                let segment = meta.segment.max(1);
                (0..meta.len).step_by(segment).map(move |offset| {
                    let len = segment.min(meta.len - offset);
                    let start = base + offset;
                    Datagram {
                        source,
                        local,
                        bytes: &self.data[start..start + len],
                        position: Position {
                            start: start as u32,
                            len: len as u32,
                            message: message as u32,
                        },
                    }
                })
            })
    }

    /// The datagram at `position` of the last receive.
    ///
    /// # Panics
    /// If `position` does not come from the last receive of this batch.
    pub fn get(&self, position: Position) -> Datagram<'_> {
        let start = position.start as usize;
        let meta = &self.metas[..self.filled][position.message as usize];
        let source = meta.source.expect("position of a received datagram");
        Datagram {
            source,
            local: meta.local,
            bytes: &self.data[start..start + position.len as usize],
            position,
        }
    }

    /// Forgets the last receive.
    pub fn clear(&mut self) {
        self.filled = 0;
    }

    /// Adds `datagram` from `source` as the next message, as a receive would (without GRO);
    /// `false` (nothing added) when every message is in use or it is longer than a message.
    /// Lets the data-path core be driven without a socket.
    pub fn push(&mut self, source: SocketAddr, datagram: &[u8]) -> bool {
        self.push_to(source, None, datagram)
    }

    /// [`Self::push`] of a datagram that arrived at our address `local`.
    pub fn push_to(
        &mut self,
        source: SocketAddr,
        local: Option<LocalAddr>,
        datagram: &[u8],
    ) -> bool {
        if self.filled == self.metas.len() || datagram.len() > RECV_BUFFER_LEN {
            return false;
        }
        let start = self.filled * RECV_BUFFER_LEN;
        self.data[start..start + datagram.len()].copy_from_slice(datagram);
        self.metas[self.filled] = Received {
            source: Some(source),
            local,
            len: datagram.len(),
            segment: datagram.len(),
        };
        self.filled += 1;
        true
    }

    /// How many messages the last receive left out: truncated, or with a source of an
    /// unknown family.
    pub fn rejected(&self) -> usize {
        self.metas[..self.filled]
            .iter()
            .filter(|meta| meta.source.is_none())
            .count()
    }
}

/// One outgoing message: `count` datagrams to `dest`, contiguous in the arena, each
/// `segment` bytes except possibly the last.
#[derive(Debug, Clone, Copy)]
pub struct Message {
    /// Where it goes.
    pub dest: Endpoint,
    /// Its first byte in the arena.
    pub start: usize,
    /// Its bytes.
    pub len: usize,
    /// The size of every datagram but the last.
    pub segment: usize,
    /// Its datagrams.
    pub count: usize,
    /// Whether more datagrams may join (no shorter tail yet).
    open: bool,
}

/// How a [`SendBatch`]'s last flush went, as the shell counts it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SendReport {
    /// Datagrams the kernel accepted.
    pub sent: usize,
    /// Datagrams dropped because their message failed.
    pub failed: usize,
    /// `sendmmsg` calls made.
    pub calls: usize,
    /// Messages whose local address was no longer ours: they left from the kernel's choice
    /// instead. The peer's next datagram pins its endpoint to where it arrived.
    pub unpinned: usize,
}

/// An arena of outgoing datagrams, coalesced into GSO messages as they are committed.
pub struct SendBatch {
    data: Box<[u8]>,
    used: usize,
    messages: Vec<Message>,
    max_datagrams: usize,
    datagrams: usize,
    /// First message not yet handed to the kernel.
    cursor: usize,
    report: SendReport,
}

impl std::fmt::Debug for SendBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBatch")
            .field("datagrams", &self.datagrams)
            .field("messages", &self.messages.len())
            .field("bytes", &self.used)
            .finish()
    }
}

impl SendBatch {
    /// Room for `max_datagrams` datagrams (1..=[`MAX_BATCH`]) totalling `bytes`.
    pub fn new(max_datagrams: usize, bytes: usize) -> Self {
        let max_datagrams = max_datagrams.clamp(1, MAX_BATCH);
        Self {
            data: vec![0u8; bytes].into_boxed_slice(),
            used: 0,
            messages: Vec::with_capacity(max_datagrams),
            max_datagrams,
            datagrams: 0,
            cursor: 0,
            report: SendReport::default(),
        }
    }

    /// Datagrams waiting to be sent.
    pub fn len(&self) -> usize {
        self.datagrams
    }

    /// Whether nothing waits to be sent.
    pub fn is_empty(&self) -> bool {
        self.datagrams == 0
    }

    /// Messages the waiting datagrams form (what one `sendmmsg` would carry with GSO).
    pub fn messages(&self) -> usize {
        self.messages.len()
    }

    /// Writable space for the next datagram if at least `needed` bytes and a datagram slot
    /// are free; `None` means flush first. Write the datagram at the start of the returned
    /// slice, then [`SendBatch::commit`] it.
    pub fn space(&mut self, needed: usize) -> Option<&mut [u8]> {
        if self.datagrams == self.max_datagrams || self.data.len() - self.used < needed {
            return None;
        }
        Some(&mut self.data[self.used..])
    }

    /// Adds the `len` bytes just written at the start of [`SendBatch::space`] as a datagram
    /// to `dest`, joining the previous message when GSO may carry both.
    pub fn commit(&mut self, dest: Endpoint, len: usize) {
        assert!(
            self.datagrams < self.max_datagrams && len <= self.data.len() - self.used,
            "commit without space"
        );
        let start = self.used;
        self.used += len;
        self.datagrams += 1;
        if let Some(last) = self.messages.last_mut()
            && last.open
            && last.dest == dest
            && len <= last.segment
            && last.count < MAX_GSO_SEGMENTS
            && last.len + len <= MAX_UDP_PAYLOAD
        {
            last.len += len;
            last.count += 1;
            last.open = len == last.segment;
            return;
        }
        self.messages.push(Message {
            dest,
            start,
            len,
            segment: len,
            count: 1,
            open: len > 0,
        });
    }

    /// How many arena bytes are committed: taken before committing datagrams whose bytes are
    /// written afterwards through [`Self::committed_mut`].
    pub fn used(&self) -> usize {
        self.used
    }

    /// The bytes committed since `from` (an earlier [`Self::used`]), to write datagrams whose
    /// lengths were committed first, e.g. by several threads at once.
    ///
    /// # Panics
    /// If `from` is past what is committed.
    pub fn committed_mut(&mut self, from: usize) -> &mut [u8] {
        &mut self.data[from..self.used]
    }

    /// Copies `datagram` in and commits it; `false` (nothing added) when the batch is full.
    pub fn push(&mut self, dest: impl Into<Endpoint>, datagram: &[u8]) -> bool {
        let Some(space) = self.space(datagram.len()) else {
            return false;
        };
        space[..datagram.len()].copy_from_slice(datagram);
        self.commit(dest.into(), datagram.len());
        true
    }

    /// The shell's side of a flush: the messages not yet handed to the kernel, in order.
    pub fn pending(&self) -> &[Message] {
        &self.messages[self.cursor..]
    }

    /// The bytes of `message`, one of [`Self::pending`].
    pub fn bytes(&self, message: &Message) -> &[u8] {
        &self.data[message.start..message.start + message.len]
    }

    /// Counts one `sendmmsg` call.
    pub fn count_call(&mut self) {
        self.report.calls += 1;
    }

    /// The kernel took the first `messages` pending messages.
    pub fn sent(&mut self, messages: usize) {
        let end = self.cursor + messages;
        self.report.sent += self.messages[self.cursor..end]
            .iter()
            .map(|m| m.count)
            .sum::<usize>();
        self.cursor = end;
    }

    /// The kernel refused the first pending message: its datagrams are dropped and counted.
    pub fn fail_first(&mut self) {
        self.report.failed += self.messages[self.cursor].count;
        self.cursor += 1;
    }

    /// Lets the pending messages that leave from `local` leave from the kernel's choice
    /// instead (the address is no longer ours).
    pub fn unpin_pending(&mut self, local: LocalAddr) {
        let mut unpinned = 0;
        for message in &mut self.messages[self.cursor..] {
            if message.dest.local == Some(local) {
                message.dest.local = None;
                unpinned += 1;
            }
        }
        self.report.unpinned += unpinned;
    }

    /// Rewrites the pending messages as one message per datagram, in order (GSO is off, or
    /// the kernel refused a segmented message).
    pub fn split_pending(&mut self) {
        self.split_from(self.cursor);
    }

    /// Ends a flush: everything was handed over; empties the batch and returns the report.
    pub fn finish(&mut self) -> SendReport {
        let report = self.report;
        self.clear();
        report
    }

    /// The datagrams waiting to be sent with their destinations, in commit order (GSO
    /// messages split at their segment size).
    pub fn datagrams(&self) -> impl Iterator<Item = (Endpoint, &[u8])> {
        self.messages[self.cursor..]
            .iter()
            .flat_map(move |message| {
                self.bytes(message)
                    .chunks(message.segment.max(1))
                    .map(move |datagram| (message.dest, datagram))
            })
    }

    /// Drops everything pending.
    pub fn clear(&mut self) {
        self.used = 0;
        self.datagrams = 0;
        self.cursor = 0;
        self.messages.clear();
        self.report = SendReport::default();
    }

    /// Rewrites the messages from `from` on as one message per datagram, in order. There
    /// is always room: messages never outnumber datagrams, which are at most the capacity.
    fn split_from(&mut self, from: usize) {
        let tail: usize = self.messages[from..].iter().map(|m| m.count).sum();
        let old_len = self.messages.len();
        let new_len = from + tail;
        if new_len == old_len {
            return;
        }
        let filler = self.messages[from];
        self.messages.resize(new_len, filler);
        let mut write = new_len;
        for read in (from..old_len).rev() {
            let message = self.messages[read];
            for segment in (0..message.count).rev() {
                let start = message.start + segment * message.segment;
                let end = (start + message.segment).min(message.start + message.len);
                write -= 1;
                self.messages[write] = Message {
                    dest: message.dest,
                    start,
                    len: end - start,
                    segment: end - start,
                    count: 1,
                    open: false,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests;
