//! The immutable remap table, its builder and validation, and the per-packet decisions.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use ipnet::IpNet;

use super::error::RemapError;
use super::lpm::refill::{Refill, set_if_changed};
use super::lpm::{Key, Payload, PrefixMap};
use super::packet::{self, Ipv4Meta, Ipv6Meta, Malformed, Side};
use super::route::{MAX_PEER_ID, PeerId, Route};
use super::verdict::{DropReason, Verdict};

/// One route of one family, while the table is built.
#[derive(Clone, Copy, Debug)]
struct Rule<A> {
    peer: PeerId,
    /// Index into [`RemapTable::peers`].
    peer_index: u32,
    view: A,
    real: A,
    len: u8,
    /// The peer has an ACL: only then does egress need its entry.
    peer_has_acl: bool,
    /// A longer view of another route lies inside this one's view, so an ingress translation
    /// must confirm that the resulting view selects this route.
    view_shadowed: bool,
    /// A longer real prefix of the same peer lies inside this one's, so an egress translation
    /// must confirm that the resulting real address selects this route.
    real_shadowed: bool,
}

/// What egress needs of the route a view selects; stored in the view LPM's slots, so a lookup
/// that ends at its first probe reads one slot and nothing else.
///
/// Nothing in it depends on where other routes sit in the table (no route or peer indexes),
/// so the next table stores the same bytes for an unchanged route (see [`RemapTable::refill`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct EgressTarget<A> {
    /// `view ^ real`: the real address of a view address `v` is `v ^ delta` (their network bits
    /// are the view's, so the xor swaps exactly the network bits).
    delta: A,
    peer: PeerId,
    /// The prefix length. The real-side match of an address of this route is this route
    /// exactly when it has the same length: within one peer, one real prefix of a given
    /// length contains the address.
    len: u8,
    /// See [`Rule::peer_has_acl`].
    peer_has_acl: bool,
    /// See [`Rule::real_shadowed`].
    real_shadowed: bool,
}

impl<A: Key> Payload for EgressTarget<A> {
    type Align = A::WideAlign;
}

/// What ingress needs of the route a peer's real address selects; stored in the peer's LPM.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct IngressSource<A> {
    /// `view ^ real`, as in [`EgressTarget::delta`].
    delta: A,
    /// The prefix length. The view-side match of an address of this route is this route
    /// exactly when it has the same length: views are unique, so one view of a given length
    /// contains the address.
    len: u8,
    /// See [`Rule::view_shadowed`].
    view_shadowed: bool,
}

impl<A: Key> Payload for IngressSource<A> {
    type Align = A::WideAlign;
}

/// The routes of one address family: the LPM over their views.
#[derive(Clone, Debug, Default)]
struct FamilyTable<A: Key> {
    views: PrefixMap<A, EgressTarget<A>>,
}

/// A set of prefixes of both families.
#[derive(Clone, Debug)]
struct PrefixSet {
    v4: PrefixMap<u32, ()>,
    v6: PrefixMap<u128, ()>,
}

impl PrefixSet {
    fn new_like(prefixes: &[IpNet], like: Option<&PrefixSet>) -> Self {
        Self {
            v4: PrefixMap::new_like(
                prefixes
                    .iter()
                    .filter_map(|p| v4_parts(p).map(|(a, l)| (a, l, ()))),
                like.map(|set| &set.v4),
            ),
            v6: PrefixMap::new_like(
                prefixes
                    .iter()
                    .filter_map(|p| v6_parts(p).map(|(a, l)| (a, l, ()))),
                like.map(|set| &set.v6),
            ),
        }
    }
}

impl Refill for PrefixSet {
    fn refill(&mut self, fresh: &Self) {
        self.v4.refill(&fresh.v4);
        self.v6.refill(&fresh.v6);
    }
}

#[derive(Clone, Debug)]
struct PeerEntry {
    id: PeerId,
    /// Real prefix → route, per family.
    reals_v4: PrefixMap<u32, IngressSource<u32>>,
    reals_v6: PrefixMap<u128, IngressSource<u128>>,
    acl: Option<PrefixSet>,
}

impl Refill for PeerEntry {
    fn refill(&mut self, fresh: &Self) {
        set_if_changed(&mut self.id, &fresh.id);
        self.reals_v4.refill(&fresh.reals_v4);
        self.reals_v6.refill(&fresh.reals_v6);
        self.acl.refill(&fresh.acl);
    }
}

fn v4_parts(net: &IpNet) -> Option<(u32, u8)> {
    match net {
        IpNet::V4(n) => Some((u32::from(n.network()), n.prefix_len())),
        IpNet::V6(_) => None,
    }
}

fn v6_parts(net: &IpNet) -> Option<(u128, u8)> {
    match net {
        IpNet::V6(n) => Some((u128::from(n.network()), n.prefix_len())),
        IpNet::V4(_) => None,
    }
}

/// Collects and validates peers and their routes, then builds a [`RemapTable`].
#[derive(Clone, Debug, Default)]
pub struct TableBuilder {
    local_prefixes: Vec<IpNet>,
    mss_clamp_mtu: Option<u16>,
    peers: Vec<PeerSpec>,
    peer_ids: HashMap<PeerId, usize>,
    /// View → (peer, real): rejects a view used twice as soon as it is added.
    views: HashMap<IpNet, (PeerId, IpNet)>,
}

#[derive(Clone, Debug)]
struct PeerSpec {
    id: PeerId,
    routes: Vec<Route>,
    acl: Option<Vec<IpNet>>,
}

impl TableBuilder {
    /// An empty builder: no peers, any local source allowed, no MSS clamping.
    pub fn new() -> Self {
        Self::default()
    }

    /// The local prefixes that may send to peers; empty allows any local source.
    pub fn local_prefixes(&mut self, prefixes: &[IpNet]) -> &mut Self {
        self.local_prefixes = prefixes.to_vec();
        self
    }

    /// Clamps the MSS of TCP SYNs to fit this tunnel MTU (`mtu - 40` on IPv4, `mtu - 60` on
    /// IPv6); `None` leaves MSS options alone.
    pub fn mss_clamp_mtu(&mut self, mtu: Option<u16>) -> &mut Self {
        self.mss_clamp_mtu = mtu;
        self
    }

    /// Adds a peer with its routes and ACL (`None`: no ACL; `Some(list)`: only remote real
    /// addresses inside `list` pass, in both directions; an empty list drops everything).
    ///
    /// Repeating an identical route is harmless. Errors: a view whose family or length differs
    /// from its real prefix, a prefix with host bits set, a view already used by any route, a
    /// real prefix mapped to two views, a peer added twice or an id above [`MAX_PEER_ID`].
    pub fn add_peer(
        &mut self,
        id: PeerId,
        routes: &[Route],
        acl: Option<&[IpNet]>,
    ) -> Result<(), RemapError> {
        if id > MAX_PEER_ID {
            return Err(RemapError::PeerIdOutOfRange(id));
        }
        if self.peer_ids.contains_key(&id) {
            return Err(RemapError::DuplicatePeer(id));
        }
        let canonical = |prefix: &IpNet| {
            if prefix.trunc() == *prefix {
                Ok(())
            } else {
                Err(RemapError::HostBitsSet {
                    peer: id,
                    prefix: *prefix,
                    expected: prefix.trunc(),
                })
            }
        };
        let mut unique: Vec<Route> = Vec::with_capacity(routes.len());
        let mut by_real: HashMap<IpNet, IpNet> = HashMap::with_capacity(routes.len());
        let mut own_views: HashMap<IpNet, IpNet> = HashMap::with_capacity(routes.len());
        for route in routes {
            let same_family = matches!(
                (route.real, route.view),
                (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_))
            );
            if !same_family || route.real.prefix_len() != route.view.prefix_len() {
                return Err(RemapError::RouteMismatch {
                    peer: id,
                    real: route.real,
                    view: route.view,
                });
            }
            canonical(&route.real)?;
            canonical(&route.view)?;
            match by_real.entry(route.real) {
                Entry::Occupied(first) if *first.get() == route.view => continue,
                Entry::Occupied(first) => {
                    return Err(RemapError::ConflictingViews {
                        peer: id,
                        real: route.real,
                        first_view: *first.get(),
                        second_view: route.view,
                    });
                }
                Entry::Vacant(slot) => {
                    slot.insert(route.view);
                }
            }
            // A hash lookup, not a scan of `unique`: a peer may carry 100 000 routes.
            let duplicate = self
                .views
                .get(&route.view)
                .copied()
                .or_else(|| own_views.get(&route.view).map(|real| (id, *real)));
            if let Some((first, first_real)) = duplicate {
                return Err(RemapError::DuplicateView {
                    view: route.view,
                    first,
                    first_real,
                    second: id,
                    second_real: route.real,
                });
            }
            own_views.insert(route.view, route.real);
            unique.push(*route);
        }
        if let Some(acl) = acl {
            acl.iter().try_for_each(canonical)?;
        }
        for route in &unique {
            self.views.insert(route.view, (id, route.real));
        }
        self.peer_ids.insert(id, self.peers.len());
        self.peers.push(PeerSpec {
            id,
            routes: unique,
            acl: acl.map(<[IpNet]>::to_vec),
        });
        Ok(())
    }

    /// Builds the immutable table. Errors: a local prefix with host bits set.
    pub fn build(self) -> Result<RemapTable, RemapError> {
        self.build_like(None)
    }

    /// Builds the table that replaces `previous`. It keeps `previous`'s hash keys, table sizes
    /// and value numbering wherever they still fit, so its memory image differs from
    /// `previous`'s only around the routes that changed, which is what lets
    /// [`RemapTable::refill`] reuse a retired table's memory without cooling the readers'
    /// caches. Lookups behave exactly as with [`TableBuilder::build`].
    pub fn build_after(self, previous: &RemapTable) -> Result<RemapTable, RemapError> {
        self.build_like(Some(previous))
    }

    fn build_like(self, like: Option<&RemapTable>) -> Result<RemapTable, RemapError> {
        if let Some(prefix) = self.local_prefixes.iter().find(|p| p.trunc() != **p) {
            return Err(RemapError::LocalHostBitsSet {
                prefix: *prefix,
                expected: prefix.trunc(),
            });
        }
        let max_id = self.peers.iter().map(|p| p.id).max();
        let mut peer_slots = vec![NO_PEER; max_id.map_or(0, |id| id as usize + 1)];
        for (index, peer) in self.peers.iter().enumerate() {
            peer_slots[peer.id as usize] = index as u32;
        }

        let (v4, rules_v4) = build_family(&self.peers, v4_parts, like.map(|t| &t.v4));
        let (v6, rules_v6) = build_family(&self.peers, v6_parts, like.map(|t| &t.v6));
        let mut reals_v4 = reals_by_peer(&rules_v4, self.peers.len());
        let mut reals_v6 = reals_by_peer(&rules_v6, self.peers.len());
        let peers = self
            .peers
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                let previous = like.and_then(|t| t.peer(spec.id));
                let acl_like = previous.and_then(|p| p.acl.as_ref());
                PeerEntry {
                    id: spec.id,
                    reals_v4: PrefixMap::new_like(
                        std::mem::take(&mut reals_v4[index]),
                        previous.map(|p| &p.reals_v4),
                    ),
                    reals_v6: PrefixMap::new_like(
                        std::mem::take(&mut reals_v6[index]),
                        previous.map(|p| &p.reals_v6),
                    ),
                    acl: spec
                        .acl
                        .as_deref()
                        .map(|acl| PrefixSet::new_like(acl, acl_like)),
                }
            })
            .collect();
        let routes = self
            .peers
            .iter()
            .flat_map(|p| p.routes.iter().map(move |r| (p.id, *r)))
            .collect();
        let local = (!self.local_prefixes.is_empty()).then(|| {
            let local_like = like.and_then(|t| t.local.as_ref());
            PrefixSet::new_like(&self.local_prefixes, local_like)
        });
        Ok(RemapTable {
            v4,
            v6,
            peers,
            peer_slots: peer_slots.into_boxed_slice(),
            local,
            mss_limit_v4: self.mss_clamp_mtu.map(|mtu| mtu.saturating_sub(40)),
            mss_limit_v6: self.mss_clamp_mtu.map(|mtu| mtu.saturating_sub(60)),
            routes,
        })
    }
}

const NO_PEER: u32 = u32::MAX;

fn build_family<A>(
    peers: &[PeerSpec],
    parts: fn(&IpNet) -> Option<(A, u8)>,
    like: Option<&FamilyTable<A>>,
) -> (FamilyTable<A>, Vec<Rule<A>>)
where
    A: Key + std::ops::BitXor<Output = A>,
{
    let mut rules: Vec<Rule<A>> = Vec::new();
    for (peer_index, spec) in peers.iter().enumerate() {
        for route in &spec.routes {
            let (Some((real, len)), Some((view, _))) = (parts(&route.real), parts(&route.view))
            else {
                continue;
            };
            rules.push(Rule {
                peer: spec.id,
                peer_index: peer_index as u32,
                view,
                real,
                len,
                peer_has_acl: spec.acl.is_some(),
                view_shadowed: false,
                real_shadowed: false,
            });
        }
    }
    // A route is shadowed when a longer prefix lies inside its own: walk every prefix's
    // ancestors and mark the routes found there.
    let view_index: HashMap<(A, u8), usize> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.view, r.len), i))
        .collect();
    let real_index: HashMap<(u32, A, u8), usize> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.peer_index, r.real, r.len), i))
        .collect();
    for i in 0..rules.len() {
        let rule = rules[i];
        for shorter in 0..rule.len {
            let mask = A::mask(shorter);
            if let Some(&outer) = view_index.get(&(rule.view.and(mask), shorter)) {
                rules[outer].view_shadowed = true;
            }
            if let Some(&outer) = real_index.get(&(rule.peer_index, rule.real.and(mask), shorter)) {
                rules[outer].real_shadowed = true;
            }
        }
    }
    let targets = rules.iter().map(|r| {
        let target = EgressTarget {
            delta: r.view ^ r.real,
            peer: r.peer,
            len: r.len,
            peer_has_acl: r.peer_has_acl,
            real_shadowed: r.real_shadowed,
        };
        (r.view, r.len, target)
    });
    let views = PrefixMap::new_like(targets, like.map(|family| &family.views));
    (FamilyTable { views }, rules)
}

/// Each peer's real prefixes with their ingress sources, indexed like the peers.
type RealPrefixes<A> = Vec<(A, u8, IngressSource<A>)>;

fn reals_by_peer<A>(rules: &[Rule<A>], peers: usize) -> Vec<RealPrefixes<A>>
where
    A: Key + std::ops::BitXor<Output = A>,
{
    let mut prefixes: Vec<RealPrefixes<A>> = vec![Vec::new(); peers];
    for rule in rules {
        let source = IngressSource {
            delta: rule.view ^ rule.real,
            len: rule.len,
            view_shadowed: rule.view_shadowed,
        };
        prefixes[rule.peer_index as usize].push((rule.real, rule.len, source));
    }
    prefixes
}

/// An immutable snapshot of all routes, ACLs and local prefixes; cheap to read from many threads.
/// The default is the empty table: every egress packet has no route.
#[derive(Clone, Debug, Default)]
pub struct RemapTable {
    v4: FamilyTable<u32>,
    v6: FamilyTable<u128>,
    peers: Box<[PeerEntry]>,
    /// `PeerId` → index into `peers`, or [`NO_PEER`].
    peer_slots: Box<[u32]>,
    local: Option<PrefixSet>,
    mss_limit_v4: Option<u16>,
    mss_limit_v6: Option<u16>,
    /// For listing only: shared by a refilled table with its source instead of copied.
    routes: Arc<[(PeerId, Route)]>,
}

/// An iterator over `(peer, view, real)` of every route of a [`RemapTable`].
#[derive(Clone, Debug)]
pub struct Views<'a>(std::slice::Iter<'a, (PeerId, Route)>);

impl Iterator for Views<'_> {
    type Item = (PeerId, IpNet, IpNet);

    fn next(&mut self) -> Option<Self::Item> {
        self.0
            .next()
            .map(|&(peer, route)| (peer, route.view, route.real))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl ExactSizeIterator for Views<'_> {}

/// The per-family parts of the fast path, so egress and ingress are written once.
trait Family {
    type Addr: Key + std::ops::BitXor<Output = Self::Addr>;
    type Meta;
    fn parse(pkt: &[u8]) -> Result<Self::Meta, Malformed>;
    fn addr(pkt: &[u8], side: Side) -> Self::Addr;
    fn rewrite(
        pkt: &mut [u8],
        meta: &Self::Meta,
        side: Side,
        new: Self::Addr,
        quoted: impl Fn(Self::Addr) -> Option<Self::Addr>,
        mss_limit: Option<u16>,
    ) -> Result<(), Malformed>;
    fn table(table: &RemapTable) -> &FamilyTable<Self::Addr>;
    fn reals(peer: &PeerEntry) -> &PrefixMap<Self::Addr, IngressSource<Self::Addr>>;
    fn set(set: &PrefixSet) -> &PrefixMap<Self::Addr, ()>;
    fn mss_limit(table: &RemapTable) -> Option<u16>;
}

struct V4;
struct V6;

impl Family for V4 {
    type Addr = u32;
    type Meta = Ipv4Meta;
    #[inline]
    fn parse(pkt: &[u8]) -> Result<Ipv4Meta, Malformed> {
        Ipv4Meta::parse(pkt)
    }
    #[inline]
    fn addr(pkt: &[u8], side: Side) -> u32 {
        packet::addr_v4(pkt, side)
    }
    #[inline]
    fn rewrite(
        pkt: &mut [u8],
        meta: &Ipv4Meta,
        side: Side,
        new: u32,
        quoted: impl Fn(u32) -> Option<u32>,
        mss_limit: Option<u16>,
    ) -> Result<(), Malformed> {
        packet::rewrite_v4(pkt, meta, side, new, quoted, mss_limit)
    }
    #[inline]
    fn table(table: &RemapTable) -> &FamilyTable<u32> {
        &table.v4
    }
    #[inline]
    fn reals(peer: &PeerEntry) -> &PrefixMap<u32, IngressSource<u32>> {
        &peer.reals_v4
    }
    #[inline]
    fn set(set: &PrefixSet) -> &PrefixMap<u32, ()> {
        &set.v4
    }
    #[inline]
    fn mss_limit(table: &RemapTable) -> Option<u16> {
        table.mss_limit_v4
    }
}

impl Family for V6 {
    type Addr = u128;
    type Meta = Ipv6Meta;
    #[inline]
    fn parse(pkt: &[u8]) -> Result<Ipv6Meta, Malformed> {
        Ipv6Meta::parse(pkt)
    }
    #[inline]
    fn addr(pkt: &[u8], side: Side) -> u128 {
        packet::addr_v6(pkt, side)
    }
    #[inline]
    fn rewrite(
        pkt: &mut [u8],
        meta: &Ipv6Meta,
        side: Side,
        new: u128,
        quoted: impl Fn(u128) -> Option<u128>,
        mss_limit: Option<u16>,
    ) -> Result<(), Malformed> {
        packet::rewrite_v6(pkt, meta, side, new, quoted, mss_limit)
    }
    #[inline]
    fn table(table: &RemapTable) -> &FamilyTable<u128> {
        &table.v6
    }
    #[inline]
    fn reals(peer: &PeerEntry) -> &PrefixMap<u128, IngressSource<u128>> {
        &peer.reals_v6
    }
    #[inline]
    fn set(set: &PrefixSet) -> &PrefixMap<u128, ()> {
        &set.v6
    }
    #[inline]
    fn mss_limit(table: &RemapTable) -> Option<u16> {
        table.mss_limit_v6
    }
}

impl RemapTable {
    /// A table with no peers: every egress packet has no route.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Translates a packet read from the TUN device: on [`Verdict::Forward`] its destination has
    /// been rewritten view → real and it goes to that peer.
    #[inline]
    pub fn egress(&self, pkt: &mut [u8]) -> Verdict {
        match pkt.first().map(|b| b >> 4) {
            Some(4) => self.egress_in::<V4>(pkt),
            Some(6) => self.egress_in::<V6>(pkt),
            _ => Verdict::Drop(DropReason::BadPacket),
        }
    }

    /// Translates a packet decapsulated from `peer`: on [`Verdict::Deliver`] its source has been
    /// rewritten real → view and it goes to the TUN device.
    #[inline]
    pub fn ingress(&self, peer: PeerId, pkt: &mut [u8]) -> Verdict {
        match pkt.first().map(|b| b >> 4) {
            Some(4) => self.ingress_in::<V4>(peer, pkt),
            Some(6) => self.ingress_in::<V6>(peer, pkt),
            _ => Verdict::Drop(DropReason::BadPacket),
        }
    }

    /// Starts loading the table memory that [`RemapTable::egress`] of `pkt` reads first, and
    /// returns without waiting for it. Calling it for every packet of a batch before
    /// translating them lets their cache misses overlap (right after a table swap, or with a
    /// table larger than the caches); it never changes a verdict.
    #[inline]
    pub fn prefetch_egress(&self, pkt: &[u8]) {
        match pkt.first().map(|b| b >> 4) {
            Some(4) => self.v4.views.prefetch(packet::addr_v4(pkt, Side::Dst)),
            Some(6) => self.v6.views.prefetch(packet::addr_v6(pkt, Side::Dst)),
            _ => {}
        }
    }

    /// Makes `self` (a retired table no reader holds) equal to `fresh`, keeping `self`'s
    /// memory wherever the shapes match and writing only what differs.
    ///
    /// Swapping in a new table costs the readers a cache miss on every line of it they touch,
    /// for a 10 000-route table tens of microseconds per swap. Refilling the table retired by
    /// the swap before last instead (whose lines the readers used a swap ago) keeps every line
    /// that did not change valid in their caches; with `fresh` built by
    /// [`TableBuilder::build_after`] from the table it replaces, only the lines of changed
    /// routes differ. Readers see `self` only once it is published again, so never half-written.
    pub fn refill(&mut self, fresh: &RemapTable) {
        self.v4.views.refill(&fresh.v4.views);
        self.v6.views.refill(&fresh.v6.views);
        let same_order = self.peers.len() == fresh.peers.len()
            && self
                .peers
                .iter()
                .zip(&fresh.peers)
                .all(|(a, b)| a.id == b.id);
        if same_order {
            for (old, fresh) in self.peers.iter_mut().zip(&fresh.peers) {
                old.refill(fresh);
            }
        } else {
            self.refill_moved_peers(&fresh.peers);
        }
        self.peer_slots.refill(&fresh.peer_slots);
        self.local.refill(&fresh.local);
        set_if_changed(&mut self.mss_limit_v4, &fresh.mss_limit_v4);
        set_if_changed(&mut self.mss_limit_v6, &fresh.mss_limit_v6);
        if !Arc::ptr_eq(&self.routes, &fresh.routes) {
            self.routes = Arc::clone(&fresh.routes);
        }
    }

    /// Refills the peers when some moved: each from the retired entry of the same id, in a
    /// new list (whose own lines are cold, unlike the maps they point to).
    fn refill_moved_peers(&mut self, fresh: &[PeerEntry]) {
        let mut retired: Vec<Option<PeerEntry>> = std::mem::take(&mut self.peers)
            .into_vec()
            .into_iter()
            .map(Some)
            .collect();
        self.peers = fresh
            .iter()
            .map(|entry| {
                let old = self
                    .peer_slots
                    .get(entry.id as usize)
                    .and_then(|&index| retired.get_mut(index as usize)?.take());
                match old {
                    Some(mut old) => {
                        old.refill(entry);
                        old
                    }
                    None => entry.clone(),
                }
            })
            .collect();
    }

    /// The number of routes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether the table has no routes.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Every route as `(peer, view, real)`, in the order they were added.
    pub fn views(&self) -> Views<'_> {
        Views(self.routes.iter())
    }

    #[inline]
    fn peer(&self, id: PeerId) -> Option<&PeerEntry> {
        let index = *self.peer_slots.get(id as usize)?;
        self.peers.get(index as usize)
    }

    #[inline]
    fn egress_in<F: Family>(&self, pkt: &mut [u8]) -> Verdict {
        let Ok(meta) = F::parse(pkt) else {
            return Verdict::Drop(DropReason::BadPacket);
        };
        let family = F::table(self);
        let Some((rule, real)) = egress_match::<F>(self, family, F::addr(pkt, Side::Dst)) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        if let Some(local) = &self.local
            && !F::set(local).contains(F::addr(pkt, Side::Src))
        {
            return Verdict::Drop(DropReason::LocalSourceNotAllowed);
        }
        if rule.peer_has_acl
            && let Some(acl) = self.peer(rule.peer).and_then(|peer| peer.acl.as_ref())
            && !F::set(acl).contains(real)
        {
            return Verdict::Drop(DropReason::Acl);
        }
        // The quoted packet of an ICMP error came from the same remote host: its source is a
        // view of a route to the same peer.
        let quoted = |addr| {
            egress_match::<F>(self, family, addr)
                .filter(|(r, _)| r.peer == rule.peer)
                .map(|(_, real)| real)
        };
        match F::rewrite(pkt, &meta, Side::Dst, real, quoted, F::mss_limit(self)) {
            Ok(()) => Verdict::Forward(rule.peer),
            Err(Malformed) => Verdict::Drop(DropReason::BadPacket),
        }
    }

    #[inline]
    fn ingress_in<F: Family>(&self, peer_id: PeerId, pkt: &mut [u8]) -> Verdict {
        let Ok(meta) = F::parse(pkt) else {
            return Verdict::Drop(DropReason::BadPacket);
        };
        let Some(peer) = self.peer(peer_id) else {
            return Verdict::Drop(DropReason::UnknownPeer);
        };
        let family = F::table(self);
        let Some(view) = ingress_match::<F>(family, F::reals(peer), F::addr(pkt, Side::Src)) else {
            return Verdict::Drop(DropReason::SourceNotAllowed);
        };
        if let Some(acl) = &peer.acl
            && !F::set(acl).contains(F::addr(pkt, Side::Src))
        {
            return Verdict::Drop(DropReason::Acl);
        }
        let quoted = |addr| ingress_match::<F>(family, F::reals(peer), addr);
        match F::rewrite(pkt, &meta, Side::Src, view, quoted, F::mss_limit(self)) {
            Ok(()) => Verdict::Deliver,
            Err(Malformed) => Verdict::Drop(DropReason::BadPacket),
        }
    }
}

/// The route and real address for a view address, if that route is the longest match on both
/// sides.
#[inline]
fn egress_match<'t, F: Family>(
    table: &'t RemapTable,
    family: &'t FamilyTable<F::Addr>,
    view_addr: F::Addr,
) -> Option<(&'t EgressTarget<F::Addr>, F::Addr)> {
    let target = family.views.lookup(view_addr)?;
    let real = target.delta ^ view_addr;
    if target.real_shadowed
        && table
            .peer(target.peer)
            .and_then(|peer| F::reals(peer).lookup(real))
            .map(|source| source.len)
            != Some(target.len)
    {
        return None;
    }
    Some((target, real))
}

/// The view address for a peer's real address, if its route is the longest match on both sides.
#[inline]
fn ingress_match<F: Family>(
    family: &FamilyTable<F::Addr>,
    reals: &PrefixMap<F::Addr, IngressSource<F::Addr>>,
    real_addr: F::Addr,
) -> Option<F::Addr> {
    let source = reals.lookup(real_addr)?;
    let view = source.delta ^ real_addr;
    if source.view_shadowed
        && family.views.lookup(view).map(|target| target.len) != Some(source.len)
    {
        return None;
    }
    Some(view)
}
