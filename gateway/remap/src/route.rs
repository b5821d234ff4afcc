//! A remote prefix and the peer it belongs to: what a table is built from.

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
