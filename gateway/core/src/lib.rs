//! The gateway's data-path core (crate `kubetun-gateway-core`): everything the gateway does
//! to packets and datagrams, synchronous and without IO. It has no tokio, socket or TUN
//! dependency, so no syscall can reach it; the shells of `kubetun-gateway` read the TUN
//! device and the sockets, hand the core batches, and write what it produced (as
//! quinn-proto is to quinn).
//!
//! - [`egress::Egress`]: a batch of IP packets from the TUN device → probe-address check →
//!   remap (view → real, peer by longest prefix) → per peer, sealed into the [`Outbox`]
//!   arena (GSO runs form as datagrams are committed): with several [`workers::Workers`]
//!   laid out under the peer's `Tunn` lock and sealed with the session's nonces outside
//!   it, a long run in parts; with one, by `Tunn::encapsulate` under the lock.
//! - [`ingress::Ingress`]: a batch of received datagrams ([`batch::RecvBatch`]) →
//!   classification by message type and receiver index → handshake messages kept for the
//!   shell's queue ([`ingress::Ingress::handshakes`]) → per peer, opened into the shell's
//!   TUN write batch ([`PacketSink`]): with several workers per session outside the `Tunn`
//!   lock, a long run in parts, each packet into its own slot; with one, by
//!   `Tunn::decapsulate` under the lock → connectivity probes consumed (PONGs recorded,
//!   PINGs answered into the [`transmits::Transmits`]) → remap (source check, ACL, real →
//!   view) → admission (an exported cluster's packets: endpoints, replies of our flows).
//! - [`handshake::Handshake`]: one handshake message → rate limiter, cookie, peer lookup,
//!   `Tunn` → replies and the packets queued during the handshake.
//! - [`timers`]: per peer, boringtun's timers and the persistent keepalive; the initiations
//!   sent after an apply; the connectivity probes.
//! - [`admission`]: per remote cluster, open or exported; the flow table that admits the
//!   replies of the connections this cluster opened.
//! - The models they work on: [`state`] (the desired state and its validation), [`plan`]
//!   (state → next [`snapshot::Snapshot`], keeping sessions), [`peer`], [`path`] and
//!   [`conncheck`] (per-peer runtime, path and probe state), [`role`] (active/standby),
//!   [`dispatch`] (message classification), [`drops`] (counters by reason), [`key`],
//!   [`endpoint`], [`clock::Now`], [`context::Context`] (what one call works with), and the
//!   remap fast path, `kubetun-remap`.
//!
//! What leaves the core is returned, never sent: datagrams in the [`Outbox`] (egress) or
//! the [`PacketSink`] (ingress's TUN batch), which stop with [`Step::Flush`] when their arena
//! is full and resume after the shell wrote it; single datagrams (handshake replies,
//! cookies, timer messages, probes) in [`transmits::Transmits`], which the shell sends after
//! the call; handshake messages in [`ingress::Ingress::handshakes`]; and drops counted in
//! [`drops::Drops`] by reason. No call performs IO: the one trait the shell implements for a
//! step, [`PacketSink`], is its TUN batch's buffers, and [`workers::Workers`] shares
//! computation between threads. Time comes in as [`Now`], boringtun's included (its `*_at`
//! functions); nothing here reads a clock.
//!
//! Nothing here allocates after construction.

pub mod admission;
pub mod batch;
pub mod clock;
pub mod conncheck;
pub mod context;
pub mod dispatch;
pub mod drops;
pub mod egress;
pub mod endpoint;
pub mod handshake;
pub mod ingress;
pub mod key;
pub mod path;
pub mod peer;
pub mod plan;
pub mod role;
pub mod snapshot;
pub mod state;
pub mod timers;
pub mod transmits;
pub mod workers;

pub use kubetun_remap as remap;

#[cfg(test)]
mod clock_tests;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;

use crate::batch::SendBatch;
pub use crate::clock::Now;
pub use crate::endpoint::Endpoint;

/// Largest IP packet or UDP datagram handled.
pub const MAX_PACKET: usize = 65536;
/// Room boringtun needs beyond the plaintext when encapsulating (header + tag). Every
/// buffer is also far above the 148 bytes of the largest handshake message.
pub const OVERHEAD: usize = 32;
/// The smallest buffer boringtun writes a handshake initiation into.
pub const HANDSHAKE_ROOM: usize = 148;
/// Send-arena room per datagram of a batch: a full 1420-byte MTU packet once encrypted.
const TYPICAL_DATAGRAM: usize = 1420 + OVERHEAD;
/// Room for an encrypted probe, or the handshake initiation boringtun sends instead when the
/// peer has no session yet (148 bytes).
pub const PROBE_ROOM: usize = 256;

/// Whether a batch step finished or stopped at a full arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Step {
    /// Everything of the batch is processed.
    Done,
    /// The output arena is full: write it out, then call again to continue.
    Flush,
}

/// Takes the packets decrypted from a receive batch: the shell's TUN write batch.
///
/// The batch is a row of slots, one packet each. A packet is written either into
/// [`PacketSink::space`] (the next slot) and committed, or, when several workers open a run
/// at once, into [`PacketSink::free_slots`] side by side and committed slot by slot in
/// order, the slots of refused packets skipped.
pub trait PacketSink {
    /// One packet's buffer, apart from the others so that workers can fill several at once.
    type Slot: Send;
    /// Space for the next packet (up to [`MAX_PACKET`] bytes), or `None` when the batch is
    /// full and must be written first. Write the packet at the start, then
    /// [`PacketSink::commit`] its length.
    fn space(&mut self) -> Option<&mut [u8]> {
        self.free_slots().first_mut().map(Self::slot_space)
    }
    /// Adds the `len`-byte packet just written into [`PacketSink::space`].
    fn commit(&mut self, len: usize) {
        self.commit_slot(0, len);
    }
    /// How many more packets fit before the batch must be written.
    fn room(&self) -> usize;
    /// The free slots ([`PacketSink::room`] of them), in the order they would be committed.
    fn free_slots(&mut self) -> &mut [Self::Slot];
    /// Where a slot's packet goes (up to [`MAX_PACKET`] bytes, from the start).
    fn slot_space(slot: &mut Self::Slot) -> &mut [u8];
    /// Adds the `len`-byte packet in the free slot `skip` places after the first free one:
    /// that slot changes places with the first free one, the free slots after it keep
    /// theirs. So committing the accepted slots of one [`PacketSink::free_slots`] in order,
    /// each at its index less the number committed before it, adds them in that order.
    fn commit_slot(&mut self, skip: usize, len: usize);
}

/// Outgoing datagrams of one egress task, per address family: the arena the core encrypts
/// into and the shell hands to `sendmmsg` (with GSO).
#[derive(Debug)]
pub struct Outbox {
    /// IPv4 destinations.
    pub v4: SendBatch,
    /// IPv6 destinations.
    pub v6: SendBatch,
}

impl Outbox {
    /// Room for `batch` full-size datagrams and one maximal one per family.
    pub fn new(batch: usize) -> Self {
        let bytes = batch * TYPICAL_DATAGRAM + MAX_PACKET + OVERHEAD;
        Self {
            v4: SendBatch::new(batch, bytes),
            v6: SendBatch::new(batch, bytes),
        }
    }

    /// The family's arena for `endpoint`.
    pub fn batch_for(&mut self, endpoint: &Endpoint) -> &mut SendBatch {
        match endpoint.remote {
            std::net::SocketAddr::V4(_) => &mut self.v4,
            std::net::SocketAddr::V6(_) => &mut self.v6,
        }
    }

    /// Every datagram waiting, IPv4 first, with its destination.
    pub fn datagrams(&self) -> impl Iterator<Item = (Endpoint, &[u8])> {
        self.v4.datagrams().chain(self.v6.datagrams())
    }

    /// Drops everything waiting.
    pub fn clear(&mut self) {
        self.v4.clear();
        self.v6.clear();
    }
}
