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
//! [`PrefixIndex`] opens the same longest-prefix match to other prefix sets (the gateway's
//! admission views).
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
mod error;
#[cfg(any(fuzzing, test, feature = "fuzz-oracle"))]
mod fuzz;
mod lpm;
mod packet;
mod prefix_index;
mod route;
mod table;
mod verdict;

#[cfg(test)]
mod tests;

pub use error::RemapError;
#[cfg(any(fuzzing, test, feature = "fuzz-oracle"))]
pub use fuzz::fuzz_check;
pub use prefix_index::PrefixIndex;
pub use route::{MAX_PEER_ID, PeerId, Route};
pub use table::{RemapTable, TableBuilder, Views};
pub use verdict::{DropReason, Verdict};
