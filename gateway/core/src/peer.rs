//! A peer's runtime state: its boringtun session behind a per-peer mutex, plus the endpoint
//! and counters as lock-free atomics so that status readers never contend with the data path.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use boringtun::noise::Tunn;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::x25519::{PublicKey, StaticSecret};
use parking_lot::Mutex;
use rand_core::RngCore as _;

use super::conncheck::Prober;
use super::path::PathState;
use crate::clock::Now;
use crate::endpoint::Endpoint;
use crate::key::Key;

/// Runtime state of one peer. Created when the peer (or its key material) first appears in
/// the desired state and kept across applies that leave its keys unchanged.
#[derive(Debug)]
pub struct Peer {
    /// The 24-bit index boringtun puts in the upper bits of our receiver indices.
    pub index: u32,
    /// The Noise state machine and sessions. Every packet method takes `&mut self`.
    pub tunn: Mutex<TunnCell>,
    /// Where datagrams for this peer go, and from which of our addresses; updated by
    /// roaming.
    endpoint: ArcSwapOption<Endpoint>,
    pub stats: PeerStats,
    /// Connectivity check state. Taken after `tunn` when both are held (a PONG is recorded
    /// while decrypting), never the other way round.
    pub conncheck: Mutex<Prober>,
    /// Whether the views other peers back up for this one go through them (see
    /// [`super::path`]); kept across applies like the sessions.
    pub path: Mutex<PathState>,
    /// Whether a data message of the peer's for a session we do not have waits in the
    /// handshake queue (see [`Peer::report_unknown_session`]).
    unknown_session_queued: AtomicBool,
}

/// The peer's `Tunn` and our public key it was made with (or last switched to): during a key
/// rotation that is the previous key until the peer completes a handshake with the new one.
/// `Tunn` does not implement `Debug`; this wrapper gives the peer a useful one.
pub struct TunnCell(pub LazyTunn, pub Key);

impl std::fmt::Debug for TunnCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} with {}", self.0, self.1.to_base64())
    }
}

/// A `Tunn` made on first use. `Tunn::new` does two X25519 multiplications (our public key,
/// then the static-static secret): made in the Apply, 1000 new peers cost the Apply about
/// 100 ms; made on first use, that work moves to the initiations sent after the Apply.
pub struct LazyTunn(LazyState);

// `Made` stays inline: the data path reaches the `Tunn` on every batch, as before it was lazy.
#[allow(clippy::large_enum_variant)]
enum LazyState {
    Pending(Box<TunnParams>),
    Made(Tunn),
}

/// What `Tunn::new` takes. No `Debug`: it holds the private key.
pub(super) struct TunnParams {
    pub(super) private: StaticSecret,
    pub(super) peer: PublicKey,
    pub(super) preshared_key: Option<[u8; 32]>,
    pub(super) index: u32,
    pub(super) limiter: Arc<RateLimiter>,
}

impl std::fmt::Debug for LazyTunn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            LazyState::Pending(_) => "LazyTunn(not made yet)",
            LazyState::Made(_) => "LazyTunn(made)",
        })
    }
}

impl LazyTunn {
    /// A `Tunn` made from `params` when it is first used.
    pub(super) fn new(params: TunnParams) -> Self {
        Self(LazyState::Pending(Box::new(params)))
    }

    /// The `Tunn`, made at `now` if it was not yet.
    pub fn get(&mut self, now: Now) -> &mut Tunn {
        if let LazyState::Pending(params) = &self.0 {
            let tunn = Tunn::new_at(
                params.private.clone(),
                params.peer,
                params.preshared_key,
                None,
                params.index,
                Some(Arc::clone(&params.limiter)),
                now.instant(),
                now.unix_time(),
            );
            self.0 = LazyState::Made(tunn);
        }
        match &mut self.0 {
            LazyState::Made(tunn) => tunn,
            LazyState::Pending(_) => unreachable!("made above"),
        }
    }

    /// The `Tunn` if it was made (one not made yet has no session, handshake or timer due).
    pub fn made(&self) -> Option<&Tunn> {
        match &self.0 {
            LazyState::Made(tunn) => Some(tunn),
            LazyState::Pending(_) => None,
        }
    }

    /// [`Self::made`], mutable.
    pub fn made_mut(&mut self) -> Option<&mut Tunn> {
        match &mut self.0 {
            LazyState::Made(tunn) => Some(tunn),
            LazyState::Pending(_) => None,
        }
    }
}

/// Monotonic counters and timestamps of one peer (Unix milliseconds; 0 = never).
#[derive(Debug, Default)]
pub struct PeerStats {
    /// Bytes of WireGuard datagrams received from the peer and accepted.
    pub rx_bytes: AtomicU64,
    /// Bytes of datagrams sent to the peer.
    pub tx_bytes: AtomicU64,
    /// Datagrams received and accepted.
    pub rx_packets: AtomicU64,
    /// Datagrams sent.
    pub tx_packets: AtomicU64,
    /// Completed handshakes.
    pub handshakes: AtomicU64,
    /// When the last handshake completed.
    pub last_handshake_ms: AtomicU64,
    /// When anything was last sent (drives the persistent keepalive).
    pub last_sent_ms: AtomicU64,
    /// When the current run of unanswered handshake initiations began; 0 when none is pending.
    pub handshake_pending_since_ms: AtomicU64,
    /// When the `Tunn` moved to the key it uses during a key rotation; 0 for the key it was
    /// created with (every handshake it completed was made with that key).
    pub key_since_ms: AtomicU64,
}

impl Peer {
    /// Wraps a fresh `Tunn` created with local index `index`.
    pub fn new(index: u32, tunn: TunnCell, endpoint: Option<SocketAddr>) -> Self {
        Self {
            index,
            tunn: Mutex::new(tunn),
            endpoint: ArcSwapOption::from_pointee(endpoint.map(Endpoint::unpinned)),
            stats: PeerStats::default(),
            // A random first sequence number: PONGs meant for a previous session's prober
            // of this peer do not match.
            conncheck: Mutex::new(Prober::new(rand_core::OsRng.next_u32())),
            path: Mutex::new(PathState::default()),
            unknown_session_queued: AtomicBool::new(false),
        }
    }

    /// Claims the peer's one place in the handshake queue for a data message on a session we
    /// do not have (the peer still uses one with a previous run of this gateway); false when
    /// one is queued already or a handshake of ours is under way.
    pub fn report_unknown_session(&self) -> bool {
        self.stats
            .handshake_pending_since_ms
            .load(Ordering::Relaxed)
            == 0
            && !self.unknown_session_queued.swap(true, Ordering::Relaxed)
    }

    /// Gives the place of [`Self::report_unknown_session`] back (taken out of the queue, or
    /// never queued).
    pub fn unknown_session_handled(&self) {
        self.unknown_session_queued.store(false, Ordering::Relaxed);
    }

    /// The endpoint in use, with the local address replies leave from.
    pub fn endpoint(&self) -> Option<Endpoint> {
        self.endpoint.load().as_deref().copied()
    }

    /// The peer's address in use (what `wg show` and the status report).
    pub fn remote(&self) -> Option<SocketAddr> {
        self.endpoint().map(|endpoint| endpoint.remote)
    }

    /// Replaces the endpoint (configuration change); the kernel picks the source until the
    /// peer's first datagram arrives.
    pub fn set_endpoint(&self, endpoint: Option<SocketAddr>) {
        self.endpoint
            .store(endpoint.map(|remote| Arc::new(Endpoint::unpinned(remote))));
    }

    /// Roams to `source` (the peer's address, and ours its datagram arrived at) if it differs
    /// from the current endpoint. Called after a datagram from `source` was authenticated.
    pub fn roam(&self, source: Endpoint) {
        if self.endpoint.load().as_deref() != Some(&source) {
            tracing::debug!(index = self.index, endpoint = %source, "peer endpoint changed");
            self.endpoint.store(Some(Arc::new(source)));
        }
    }

    /// Records a datagram sent at `now_ms`.
    pub fn record_sent(&self, bytes: usize, now_ms: u64) {
        self.record_sent_batch(bytes, 1, now_ms);
    }

    /// Records `datagrams` datagrams of `bytes` bytes in total sent at `now_ms`: one update
    /// of the shared counters per batch instead of one per datagram.
    pub fn record_sent_batch(&self, bytes: usize, datagrams: u64, now_ms: u64) {
        if datagrams == 0 {
            return;
        }
        self.stats
            .tx_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.stats
            .tx_packets
            .fetch_add(datagrams, Ordering::Relaxed);
        self.stats.last_sent_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Records an accepted datagram.
    pub fn record_received(&self, bytes: usize) {
        self.record_received_batch(bytes, 1);
    }

    /// Records `datagrams` accepted datagrams of `bytes` bytes in total.
    pub fn record_received_batch(&self, bytes: usize, datagrams: u64) {
        if datagrams == 0 {
            return;
        }
        self.stats
            .rx_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.stats
            .rx_packets
            .fetch_add(datagrams, Ordering::Relaxed);
    }

    /// Whether a handshake completed since the `Tunn` took the key it uses.
    pub fn proven_on_its_key(&self) -> bool {
        let last = self.stats.last_handshake_ms.load(Ordering::Relaxed);
        last != 0 && last >= self.stats.key_since_ms.load(Ordering::Relaxed)
    }

    /// Records that a handshake initiation was sent at `now_ms`.
    pub fn record_initiation(&self, now_ms: u64) {
        let _ = self.stats.handshake_pending_since_ms.compare_exchange(
            0,
            now_ms,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Records a completed handshake at `now_ms`.
    pub fn record_handshake(&self, now_ms: u64) {
        self.stats.handshakes.fetch_add(1, Ordering::Relaxed);
        self.stats
            .last_handshake_ms
            .store(now_ms, Ordering::Relaxed);
        self.stats
            .handshake_pending_since_ms
            .store(0, Ordering::Relaxed);
    }
}
