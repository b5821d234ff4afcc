//! What the fast path decides for a packet, and why it drops one.

use crate::route::PeerId;

/// What to do with a packet after [`RemapTable::egress`](crate::RemapTable::egress) or [`RemapTable::ingress`](crate::RemapTable::ingress).
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
