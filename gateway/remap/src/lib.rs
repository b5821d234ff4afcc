//! The remap fast path: 1:1 prefix translation of remote addresses, with source checks and ACLs.
//!
//! Its own crate, with no IO dependency (no tokio, sockets or TUN; only `ipnet` and
//! `thiserror`): the gateway's packet path calls it per packet, the fuzz target and the benches
//! call it directly, and [`checksum`] is the one Internet-checksum helper every part of the
//! gateway uses.
//!
//! Real addresses travel on the wire; this gateway addresses every remote prefix through a local
//! *view* of the same length (view == real means not remapped). A [`RemapTable`] is an immutable
//! snapshot built by a [`TableBuilder`]; the data plane reads it without locks or allocation:
//!
//! * [`RemapTable::egress`] (TUN → peer): longest-prefix match of the destination over all views
//!   gives the peer and its real prefix; the destination is rewritten view → real, keeping the
//!   host bits.
//! * [`RemapTable::ingress`] (peer → TUN): the source must lie in one of that peer's real
//!   prefixes; it is rewritten real → view.
//!
//! Both directions fix every checksum incrementally (RFC 1624): the IPv4 header, TCP, UDP,
//! UDP-Lite and DCCP (their pseudo-headers), ICMPv6 (pseudo-header) and the packet quoted inside
//! ICMP/ICMPv6 errors, whose address is translated in the reverse direction. TCP SYNs get their
//! MSS clamped to the tunnel MTU.
//!
//! # Overlapping prefixes
//!
//! Two peers may announce identical real prefixes as long as their views differ. Views may nest
//! (a hub's `10.0.0.0/8` next to a leaf's `10.202.0.0/16`), and so may the real prefixes of one
//! peer; the longest match decides. To keep the translation a bijection, a route translates an
//! address only when it is the longest match on *both* sides: the view address must select it
//! among all views and the real address must select it among its peer's real prefixes. Addresses
//! of a shorter route that fall into a longer route's prefix belong to the longer route only, the
//! same rule WireGuard applies to AllowedIPs; anything else is dropped (`no_route` on egress,
//! `source_not_allowed` on ingress). Identical views are rejected, as is one peer mapping the
//! same real prefix to two views. The check costs nothing for routes that nothing nests in.
//!
//! # Cost
//!
//! The views are matched by binary search on prefix lengths (Waldvogel et al.) that starts at
//! the shortest length and stops at the first entry with at most one longer prefix below it:
//! one hash probe when no two routes share that shortest prefix, 1 + ⌈log2(distinct lengths)⌉
//! at worst, whatever the rule count. The slot that answers also holds what the rewrite needs
//! (the view/real xor, peer, flags), so a lookup usually reads one cache line;
//! [`RemapTable::prefetch_egress`] starts that read early, so a batch can overlap its misses
//! (most useful right after a table swap, when the new table is cold). Rewriting
//! touches fixed offsets only; nothing allocates, locks or reads past the headers (except an
//! ICMP error's quoted packet). `benches/benches/remap.rs` measures it.
//!
//! # Swapping tables
//!
//! A table that replaces another is built with [`TableBuilder::build_after`], which keeps the
//! old table's hash keys, sizes and value numbering, and is then copied with
//! [`RemapTable::refill`] into the memory of a table retired earlier that the readers used
//! recently. Only the slots of changed routes are written, so the readers' cached lines of
//! every other route survive the swap (the gateway keeps one spare snapshot for this).

pub mod checksum;
#[cfg(any(fuzzing, test, feature = "fuzz-oracle"))]
mod fuzz;
mod lpm;
mod packet;
mod table;

#[cfg(test)]
mod tests;

#[cfg(any(fuzzing, test, feature = "fuzz-oracle"))]
pub use fuzz::fuzz_check;
pub use table::{RemapTable, TableBuilder, Views};

use ipnet::IpNet;

/// Identifies a peer within one table; chosen by the caller, at most [`MAX_PEER_ID`].
pub type PeerId = u32;

/// The largest accepted [`PeerId`]; peers are indexed densely by id.
pub const MAX_PEER_ID: PeerId = (1 << 20) - 1;

/// One remote prefix: the `real` prefix on the wire and the local `view` of it.
///
/// Both have the same family and prefix length; `view == real` means not remapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The peer's prefix as it appears on the wire, e.g. `10.70.0.0/16`.
    pub real: IpNet,
    /// The prefix this gateway uses for it, e.g. `10.68.0.0/16`.
    pub view: IpNet,
}

impl Route {
    /// A route whose view is its real prefix.
    pub fn unmapped(real: IpNet) -> Self {
        Self { real, view: real }
    }
}

/// What to do with a packet after [`RemapTable::egress`] or [`RemapTable::ingress`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Egress: send the rewritten packet to this peer.
    Forward(PeerId),
    /// Ingress: write the rewritten packet to the TUN device.
    Deliver,
    /// Discard the packet; its buffer contents are unspecified.
    Drop(DropReason),
}

/// Why a packet was dropped; [`DropReason::as_str`] names it in metrics and status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Egress: no view contains the destination.
    NoRoute,
    /// The peer's ACL does not allow the remote address.
    Acl,
    /// Truncated, malformed or unsupported packet.
    BadPacket,
    /// Ingress: the source is not one of the peer's real prefixes.
    SourceNotAllowed,
    /// Egress: the source is not one of the local prefixes.
    LocalSourceNotAllowed,
    /// Ingress: the peer is not in the table.
    UnknownPeer,
}

impl DropReason {
    /// Every reason, for exporting a counter per reason.
    pub const ALL: [DropReason; 6] = [
        DropReason::NoRoute,
        DropReason::Acl,
        DropReason::BadPacket,
        DropReason::SourceNotAllowed,
        DropReason::LocalSourceNotAllowed,
        DropReason::UnknownPeer,
    ];

    /// The snake_case name used as a metric label and in `StatusResponse.drops`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            DropReason::NoRoute => "no_route",
            DropReason::Acl => "acl",
            DropReason::BadPacket => "bad_packet",
            DropReason::SourceNotAllowed => "source_not_allowed",
            DropReason::LocalSourceNotAllowed => "local_source_not_allowed",
            DropReason::UnknownPeer => "unknown_peer",
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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
