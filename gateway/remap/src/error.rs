//! Why a table cannot be built.

use ipnet::IpNet;

use crate::route::{MAX_PEER_ID, PeerId};

/// A table that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemapError {
    /// Real and view prefixes differ in family or length.
    #[error(
        "peer {peer}: view {view} does not match real prefix {real} (family and length must be equal)"
    )]
    RouteMismatch {
        peer: PeerId,
        /// The real prefix.
        real: IpNet,
        view: IpNet,
    },
    /// A prefix has bits set beyond its length.
    #[error("peer {peer}: prefix {prefix} has host bits set (expected {expected})")]
    HostBitsSet {
        /// The peer, or the local side for local prefixes.
        peer: PeerId,
        /// The prefix as given.
        prefix: IpNet,
        /// The canonical form.
        expected: IpNet,
    },
    /// The local prefixes contain a prefix with host bits set.
    #[error("local prefix {prefix} has host bits set (expected {expected})")]
    LocalHostBitsSet {
        /// The prefix as given.
        prefix: IpNet,
        /// The canonical form.
        expected: IpNet,
    },
    /// Two routes use the same view.
    #[error(
        "view {view} is used twice: by peer {first} (real {first_real}) and by peer {second} (real {second_real})"
    )]
    DuplicateView {
        view: IpNet,
        /// The peer that added it first.
        first: PeerId,
        /// Its real prefix.
        first_real: IpNet,
        /// The peer that added it again.
        second: PeerId,
        /// Its real prefix.
        second_real: IpNet,
    },
    /// One peer maps the same real prefix to two views.
    #[error(
        "peer {peer}: real prefix {real} is mapped to two views, {first_view} and {second_view}"
    )]
    ConflictingViews {
        peer: PeerId,
        /// The real prefix.
        real: IpNet,
        first_view: IpNet,
        second_view: IpNet,
    },
    /// The peer was added twice.
    #[error("peer {0} is added twice")]
    DuplicatePeer(PeerId),
    /// The peer id is larger than [`MAX_PEER_ID`].
    #[error("peer id {0} exceeds the maximum {MAX_PEER_ID}")]
    PeerIdOutOfRange(PeerId),
}
