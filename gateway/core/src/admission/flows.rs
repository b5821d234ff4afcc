//! The flow table: the connections this cluster's pods opened towards remote clusters, so
//! that their replies pass an exported link. Fixed capacity, allocated once, shared by every
//! data-path task without a lock, and it survives applies (it is not part of the snapshot).
//!
//! # Layout
//!
//! Open addressing in buckets of 8 slots. A slot is a 64-bit tag, a keyed SipHash of the
//! flow's key (std `RandomState`, a random key per table, so a remote peer cannot choose
//! addresses and ports that collide), and an expiry in a parallel array. A bucket's tags are
//! one cache line; a flow lives in one of two buckets its hash picks (the one with more free
//! slots when it was recorded), so a lookup reads at most two lines of tags and the expiry
//! of the slot whose tag matches. The tag stands for the key:
//! two live flows share one only with probability about 2^-64 per pair, and a false match
//! would at worst admit one packet towards a port this cluster's pod already talks to the
//! same peer from, so storing the whole key (40 bytes) would buy nothing but memory.
//!
//! A free slot (never used, or its flow expired: expired slots are reused in place) is
//! claimed by compare-and-swap on its expiry word, then its tag is stored; refreshes are
//! plain stores. A refresh is written only when it
//! moves the expiry forward by at least a second or changes the TCP state, so a flow's
//! packets do not bounce the line between cores. The races left are benign: two tasks that
//! insert the same new flow at once may hold it twice (both expire), and for the instant
//! between a claim and its tag store the slot's expired flow looks live.
//!
//! # Timeouts
//!
//! Idle timeouts per protocol, like conntrack's: a TCP flow whose SYN is unanswered
//! [`Timeouts::tcp_syn_sent`] (30 s), established [`Timeouts::tcp_established`] (2 h), after
//! a FIN or RST in either direction [`Timeouts::tcp_closing`] (10 s); UDP and SCTP 120 s;
//! ICMP echo 30 s. Time is the core's [`Now`], in whole seconds of its monotonic clock.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::clock::Now;

/// Slots per bucket: one cache line of tags.
pub const SLOTS_PER_BUCKET: usize = 8;

/// The default capacity (the gateway's `--flow-table-size`).
pub const DEFAULT_CAPACITY: usize = 262_144;

/// The largest capacity accepted (2^26 slots: 768 MiB).
pub const MAX_CAPACITY: usize = 1 << 26;

/// A flow as the data path sees it on the local side: the local address and port, the
/// remote cluster's view address and port, and the protocol. For ICMP echo the id is the
/// local port and the remote port is 0. Views are unique, so no peer is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowKey {
    /// IPv4 addresses are held in the low 32 bits.
    pub v6: bool,
    pub protocol: u8,
    pub local: u128,
    pub remote: u128,
    pub local_port: u16,
    pub remote_port: u16,
}

/// Three words for the hasher (SipHash costs per `write`, and the derived `Hash` made six).
impl std::hash::Hash for FlowKey {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u128(self.local);
        state.write_u128(self.remote);
        state.write_u64(
            u64::from(self.v6) << 40
                | u64::from(self.protocol) << 32
                | u64::from(self.local_port) << 16
                | u64::from(self.remote_port),
        );
    }
}

/// The TCP state a flow is in (`Other` for the other protocols).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowState {
    /// UDP, SCTP or ICMP echo.
    Other = 0,
    /// Our SYN is unanswered.
    SynSent = 1,
    /// The peer answered.
    Established = 2,
    /// A FIN or RST was seen.
    Closing = 3,
}

impl FlowState {
    fn from_bits(bits: u32) -> Self {
        match bits & 3 {
            1 => FlowState::SynSent,
            2 => FlowState::Established,
            3 => FlowState::Closing,
            _ => FlowState::Other,
        }
    }
}

/// Idle timeouts, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub tcp_syn_sent: u32,
    pub tcp_established: u32,
    pub tcp_closing: u32,
    /// UDP and SCTP.
    pub udp: u32,
    pub icmp: u32,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            tcp_syn_sent: 30,
            tcp_established: 2 * 3600,
            tcp_closing: 10,
            udp: 120,
            icmp: 30,
        }
    }
}

impl Timeouts {
    fn of(&self, key: &FlowKey, state: FlowState) -> u32 {
        match state {
            FlowState::SynSent => self.tcp_syn_sent,
            FlowState::Established => self.tcp_established,
            FlowState::Closing => self.tcp_closing,
            FlowState::Other if matches!(key.protocol, 1 | 58) => self.icmp,
            FlowState::Other => self.udp,
        }
    }
}

/// One cache line of tags.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Bucket([AtomicU64; SLOTS_PER_BUCKET]);

/// The table (see the module documentation).
#[derive(Debug)]
pub struct FlowTable {
    tags: Box<[Bucket]>,
    /// Per slot `expires_at << 2 | state`, `expires_at` in seconds of [`Now::mono_us`]; 0
    /// for a slot never used.
    expiry: Box<[[AtomicU32; SLOTS_PER_BUCKET]]>,
    hasher: RandomState,
    timeouts: Timeouts,
    /// New flows that found no free slot.
    full: AtomicU64,
}

/// Whether a slot's expiry word is still live at `now` (seconds).
fn live(word: u32, now: u32) -> bool {
    word >> 2 > now
}

fn seconds(now: Now) -> u32 {
    // 30 bits of seconds: 34 years of monotonic clock.
    ((now.mono_us / 1_000_000) as u32) & (u32::MAX >> 2)
}

impl FlowTable {
    /// A table of at least `capacity` slots (rounded up to a power of two of buckets, at
    /// least two), with the default timeouts; 0 is a table that holds nothing, where every
    /// new flow finds it full.
    pub fn new(capacity: usize) -> Self {
        Self::with_timeouts(capacity, Timeouts::default())
    }

    /// [`FlowTable::new`] with `timeouts`.
    pub fn with_timeouts(capacity: usize, timeouts: Timeouts) -> Self {
        let buckets = match capacity.min(MAX_CAPACITY) {
            0 => 0,
            slots => slots.div_ceil(SLOTS_PER_BUCKET).next_power_of_two().max(2),
        };
        Self {
            tags: (0..buckets).map(|_| Bucket::default()).collect(),
            expiry: (0..buckets).map(|_| Default::default()).collect(),
            hasher: RandomState::new(),
            timeouts,
            full: AtomicU64::new(0),
        }
    }

    /// Slots.
    pub fn capacity(&self) -> usize {
        self.tags.len() * SLOTS_PER_BUCKET
    }

    /// Slots holding a flow live at `now` (a scan: for the status, not the data path).
    pub fn in_use(&self, now: Now) -> usize {
        let now = seconds(now);
        let tags = self.tags.iter().flat_map(|bucket| bucket.0.iter());
        let expiry = self.expiry.iter().flat_map(|bucket| bucket.iter());
        tags.zip(expiry)
            .filter(|(tag, expiry)| {
                tag.load(Ordering::Relaxed) != 0 && live(expiry.load(Ordering::Relaxed), now)
            })
            .count()
    }

    /// New flows that found their buckets full since the table was made.
    pub fn full(&self) -> u64 {
        self.full.load(Ordering::Relaxed)
    }

    /// The tag of `key` (never 0, the empty tag) and its two buckets: the low bits of its
    /// hash pick the first, the high bits an offset to a different second one.
    #[inline]
    fn locate(&self, key: &FlowKey) -> (u64, [usize; 2]) {
        let hash = self.hasher.hash_one(key);
        let mask = self.tags.len() - 1;
        let first = hash as usize & mask;
        let second = first ^ (((hash >> 32) as usize & mask) | 1);
        (hash.max(1), [first, second])
    }

    /// Slots of `bucket` free at `secs` (never used, or expired).
    fn free_slots(&self, bucket: usize, secs: u32) -> usize {
        self.expiry[bucket]
            .iter()
            .filter(|expiry| !live(expiry.load(Ordering::Relaxed), secs))
            .count()
    }

    /// Records `key` in `state` at `now`, or refreshes it (its state becomes `state`).
    /// A new flow goes to whichever of its two buckets has more free slots (the "power of
    /// two choices": the first refusal comes at about 60 % load, not 30 % as with one
    /// bucket and its neighbour). False when both buckets hold live flows only: counted as
    /// full.
    pub fn record(&self, key: &FlowKey, state: FlowState, now: Now) -> bool {
        if self.tags.is_empty() {
            self.full.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let secs = seconds(now);
        let word = (secs + self.timeouts.of(key, state)) << 2 | state as u32;
        if let Some((expiry, _)) = self.find(key, secs) {
            refresh(expiry, word);
            return true;
        }
        let (tag, [first, second]) = self.locate(key);
        let order = if self.free_slots(second, secs) > self.free_slots(first, secs) {
            [second, first]
        } else {
            [first, second]
        };
        for bucket in order {
            for (slot, expiry) in self.expiry[bucket].iter().enumerate() {
                let old = expiry.load(Ordering::Relaxed);
                if live(old, secs) {
                    continue;
                }
                // The expiry word is the claim: of two tasks taking the same free slot,
                // one loses the exchange and moves on.
                if expiry
                    .compare_exchange(old, word, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    self.tags[bucket].0[slot].store(tag, Ordering::Release);
                    return true;
                }
            }
        }
        self.full.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// The expiry word of `key`'s slot and its value, when it is live at `secs`.
    #[inline]
    fn find(&self, key: &FlowKey, secs: u32) -> Option<(&AtomicU32, u32)> {
        if self.tags.is_empty() {
            return None;
        }
        let (tag, buckets) = self.locate(key);
        for bucket in buckets {
            for (slot, stored) in self.tags[bucket].0.iter().enumerate() {
                if stored.load(Ordering::Acquire) != tag {
                    continue;
                }
                let expiry = &self.expiry[bucket][slot];
                let word = expiry.load(Ordering::Acquire);
                if live(word, secs) {
                    return Some((expiry, word));
                }
            }
        }
        None
    }

    /// Whether `key` is live at `now`; when it is, refreshes it in the state `next` gives
    /// for its current one.
    #[inline]
    pub fn touch(
        &self,
        key: &FlowKey,
        now: Now,
        next: impl FnOnce(FlowState) -> FlowState,
    ) -> bool {
        let secs = seconds(now);
        let Some((expiry, word)) = self.find(key, secs) else {
            return false;
        };
        let state = next(FlowState::from_bits(word));
        refresh(
            expiry,
            (secs + self.timeouts.of(key, state)) << 2 | state as u32,
        );
        true
    }

    /// The state of `key` at `now`, if live, without refreshing it.
    pub fn state(&self, key: &FlowKey, now: Now) -> Option<FlowState> {
        self.find(key, seconds(now))
            .map(|(_, word)| FlowState::from_bits(word))
    }

    /// Whether `key` is live at `now`, without refreshing it.
    #[inline]
    pub fn contains(&self, key: &FlowKey, now: Now) -> bool {
        self.find(key, seconds(now)).is_some()
    }
}

/// Stores `word` unless it keeps the state and moves the expiry forward by less than a second.
#[inline]
fn refresh(expiry: &AtomicU32, word: u32) {
    let old = expiry.load(Ordering::Relaxed);
    if old != word && (old & 3 != word & 3 || word >> 2 > old >> 2) {
        expiry.store(word, Ordering::Release);
    }
}

#[cfg(test)]
#[path = "flows_tests.rs"]
mod tests;
