//! The immutable snapshot the data path reads: identity, peers by id / receiver index / public
//! key, the remap table and the admissions. The control plane builds a new one for every change
//! and swaps it in; readers load it through `arc_swap::Cache` without locks.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;

use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::x25519::{PublicKey, StaticSecret};

use super::peer::{LazyTunn, Peer, TunnCell, TunnParams};
use crate::admission::allowed::Admissions;
use crate::clock::Now;
use crate::key::Key;
use crate::remap::{PeerId, RemapTable};
use crate::state::{DesiredState, PeerConfig};

/// Handshake initiations (and unsolicited responses) per second across all peers before
/// cookies are demanded (boringtun's device default).
pub const HANDSHAKE_RATE_LIMIT: u64 = 100;

/// The interface's key pair and the rate limiter bound to its public key; during a key
/// rotation also the previous pair, which serves the peers that have not completed a handshake
/// with the new key yet.
pub struct Identity {
    pub private: StaticSecret,
    /// Its public key.
    pub public: PublicKey,
    /// The gate of initiations and unsolicited responses: verified before the peer lookup,
    /// reset every second, answers with cookies beyond [`HANDSHAKE_RATE_LIMIT`].
    pub rate_limiter: Arc<RateLimiter>,
    /// Given to every peer's `Tunn` made with this key, and checks the MAC of responses to
    /// our own initiations: it never demands a cookie. After an apply the gateway initiates
    /// with every peer at once; with the gate inside the `Tunn`s too, a thousand peers'
    /// responses got cookie replies and waited for the 5 s retry. Those responses cost
    /// Diffie-Hellman only once per initiation we sent (a `Tunn` rejects a response that
    /// does not match its pending handshake before any), so the gate has nothing to guard.
    pub tunnel_limiter: Arc<RateLimiter>,
    /// The key pair used before this one, while a rotation is in progress.
    pub previous: Option<Arc<Identity>>,
}

impl Identity {
    /// Derives the public key and creates the rate limiters, at `now`.
    pub fn new(private_key: &Key, now: Now) -> Self {
        let private = StaticSecret::from(*private_key.as_bytes());
        let public = PublicKey::from(&private);
        let instant = now.instant();
        let rate_limiter = Arc::new(RateLimiter::new_at(&public, HANDSHAKE_RATE_LIMIT, instant));
        let tunnel_limiter = Arc::new(RateLimiter::new_at(&public, u64::MAX, instant));
        Self {
            private,
            public,
            rate_limiter,
            tunnel_limiter,
            previous: None,
        }
    }

    /// The pair of `private_key`, taking the limiters of the pair in `known` with the same
    /// key (a cookie the gate issued stays valid, its count carries over, and the `Tunn`s
    /// made with that key share one limiter).
    pub fn reusing(private_key: &Key, known: &[&Identity], now: Now) -> Self {
        let mut identity = Self::new(private_key, now);
        if let Some(same) = known.iter().find(|k| k.public == identity.public) {
            identity.rate_limiter = Arc::clone(&same.rate_limiter);
            identity.tunnel_limiter = Arc::clone(&same.tunnel_limiter);
        }
        identity
    }

    /// A fresh `Tunn` with `peer`, made with this pair, local index `index` and this pair's
    /// tunnel limiter on first use, tagged with our public key.
    pub fn tunn(&self, peer: &PeerConfig, index: u32) -> TunnCell {
        let tunn = LazyTunn::new(TunnParams {
            private: self.private.clone(),
            peer: PublicKey::from(*peer.public_key.as_bytes()),
            preshared_key: peer.preshared_key.map(|k| *k.as_bytes()),
            index,
            limiter: Arc::clone(&self.tunnel_limiter),
        });
        TunnCell(tunn, self.public_key())
    }

    /// The public key as a [`Key`].
    pub fn public_key(&self) -> Key {
        Key::from_bytes(self.public.to_bytes())
    }

    /// This pair and the previous one.
    pub fn pairs(&self) -> impl Iterator<Item = &Identity> {
        std::iter::once(self).chain(self.previous.as_deref())
    }

    /// Starts the next second of every gate, at `now`.
    pub fn reset_rate_limiters(&self, now: Now) {
        for pair in self.pairs() {
            pair.rate_limiter.reset_count_at(now.instant());
        }
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("public", &self.public_key().to_base64())
            .field(
                "previous",
                &self.previous.as_ref().map(|p| p.public_key().to_base64()),
            )
            .finish_non_exhaustive()
    }
}

/// One configured peer.
#[derive(Debug)]
pub struct PeerSlot {
    /// Its desired configuration.
    pub config: PeerConfig,
    /// Its runtime state; `None` while the interface has no private key.
    pub runtime: Option<Arc<Peer>>,
    /// Other peers back up some of its views (fallback routes): its connectivity check
    /// decides where those go (see [`super::path`]).
    pub backed_up: bool,
}

/// A hasher for keys that are already uniformly random (boringtun receiver indices).
#[derive(Debug, Default)]
pub struct IndexHasher(u64);

impl Hasher for IndexHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 << 8) | u64::from(*byte);
        }
    }

    fn write_u32(&mut self, value: u32) {
        // Spread the 24 random bits over the whole word so hashbrown's top-7-bit tags differ.
        self.0 = u64::from(value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Peer ids by receiver index.
pub type IndexMap = HashMap<u32, PeerId, BuildHasherDefault<IndexHasher>>;

/// Everything the data path needs, immutable once built.
#[derive(Debug)]
pub struct Snapshot {
    /// Incremented by every applied change.
    pub generation: u64,
    /// The desired state this snapshot implements.
    pub state: DesiredState,
    /// The key pair, if a private key is configured.
    pub identity: Option<Arc<Identity>>,
    /// Peers by [`PeerId`] (dense; `None` for free ids).
    pub peers: Vec<Option<PeerSlot>>,
    /// Peer ids by the 24-bit receiver index of their runtime.
    pub by_index: IndexMap,
    /// Peer ids by public key.
    pub by_key: HashMap<Key, PeerId>,
    /// Peer ids by the endpoint they were configured with: where a peer that still has a
    /// session with a previous run of this gateway sends from.
    pub by_endpoint: HashMap<SocketAddr, PeerId>,
    /// Egress routing, ingress source checks, ACLs and address translation.
    pub remap: RemapTable,
    /// Which remote cluster each view belongs to and what the exported ones may open.
    pub admissions: Admissions,
}

impl Snapshot {
    /// Generation 0: `state` with no key, no peers and no routes, before the first apply.
    pub fn initial(state: DesiredState) -> Snapshot {
        Snapshot {
            generation: 0,
            state,
            identity: None,
            peers: Vec::new(),
            by_index: IndexMap::default(),
            by_key: HashMap::new(),
            by_endpoint: HashMap::new(),
            remap: RemapTable::empty(),
            admissions: Admissions::default(),
        }
    }

    /// The slot of peer `id`.
    pub fn peer(&self, id: PeerId) -> Option<&PeerSlot> {
        self.peers.get(id as usize).and_then(Option::as_ref)
    }

    /// The peer whose endpoint was configured as, and still is, `remote`.
    pub fn peer_at(&self, remote: SocketAddr) -> Option<(&PeerSlot, &Peer)> {
        let slot = self.peer(*self.by_endpoint.get(&remote)?)?;
        let peer = slot.runtime.as_deref()?;
        (peer.remote() == Some(remote)).then_some((slot, peer))
    }

    /// Takes everything but the remap table out of this snapshot and returns it (for a
    /// retired snapshot kept only for its table's memory).
    pub fn keep_only_remap(&mut self) -> Snapshot {
        Snapshot {
            generation: self.generation,
            state: std::mem::take(&mut self.state),
            identity: self.identity.take(),
            peers: std::mem::take(&mut self.peers),
            by_index: std::mem::take(&mut self.by_index),
            by_key: std::mem::take(&mut self.by_key),
            by_endpoint: std::mem::take(&mut self.by_endpoint),
            remap: RemapTable::empty(),
            admissions: std::mem::take(&mut self.admissions),
        }
    }

    /// All configured peers with their ids, in id order.
    pub fn slots(&self) -> impl Iterator<Item = (PeerId, &PeerSlot)> {
        self.peers
            .iter()
            .enumerate()
            .filter_map(|(id, slot)| Some((id as PeerId, slot.as_ref()?)))
    }
}
