//! IP address management for remote CIDRs: pure, no IO.
//!
//! Every cluster decides on its own how it addresses each peer's CIDRs. A remote CIDR that
//! overlaps nothing in use keeps its real prefix as its *view*; one that overlaps a local range
//! (pod, service, external, reserved) or another peer's view gets a free prefix of the same
//! length from the pools. The choice is best-fit like Liqo's legacy IPAM: the smallest free
//! block that fits, first in pool and address order, so remaps pack next to existing
//! allocations ("buddies") and the result depends only on the sequence of calls.
//!
//! Invariants (checked by the property tests):
//! - no two views overlap, and no view overlaps a local range;
//! - [`Ipam::map`] is idempotent per `(owner, real)`;
//! - [`Ipam::restore`] of what [`Ipam::allocations`] reports rebuilds the same state, so a
//!   restarted controller gives every peer the same view;
//! - [`Ipam::release`] frees every prefix of an owner for reuse.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Why a prefix could not be mapped or restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// The CIDR overlaps something in use and no pool has a free prefix of its length.
    #[error(
        "{real} overlaps {conflict}, which is in use, and the pools ({pools}) have no free /{len} \
         left to remap it to; add a pool or release peers"
    )]
    PoolExhausted {
        /// The remote CIDR that needed a remap.
        real: IpNet,
        /// What it overlaps.
        conflict: IpNet,
        /// Requested prefix length.
        len: u8,
        /// The configured pools, comma separated.
        pools: String,
    },
    /// A persisted view cannot be restored: it does not fit the real prefix or overlaps
    /// something already in use.
    #[error("cannot restore view {view} for {real} of {owner}: {reason}")]
    RestoreConflict {
        /// Owner of the allocation.
        owner: String,
        /// The remote CIDR.
        real: IpNet,
        /// The persisted view.
        view: IpNet,
        /// Why it was refused.
        reason: String,
    },
}

/// The RFC 1918 private ranges, the default pools.
pub fn rfc1918_pools() -> Vec<IpNet> {
    [
        Ipv4Net::new_assert(Ipv4Addr::new(10, 0, 0, 0), 8),
        Ipv4Net::new_assert(Ipv4Addr::new(172, 16, 0, 0), 12),
        Ipv4Net::new_assert(Ipv4Addr::new(192, 168, 0, 0), 16),
    ]
    .into_iter()
    .map(IpNet::V4)
    .collect()
}

/// Pools to allocate remaps from and local ranges that are never handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamConfig {
    /// Candidate ranges for remapped views, tried in order.
    pub pools: Vec<IpNet>,
    /// Local pod, service, external and other reserved ranges: immutable, never a view.
    pub reserved: Vec<IpNet>,
}

impl Default for IpamConfig {
    fn default() -> Self {
        Self {
            pools: rfc1918_pools(),
            reserved: Vec::new(),
        }
    }
}

/// One allocation: an owner's real prefix and the view this cluster uses for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Allocation<'a> {
    /// Who holds it (the remote cluster id).
    pub owner: &'a str,
    /// The prefix as the owner announces it.
    pub real: IpNet,
    /// The prefix this cluster uses for it (same length).
    pub view: IpNet,
}

/// The allocator. See the module documentation for its invariants.
#[derive(Debug, Clone)]
pub struct Ipam {
    pools: Vec<IpNet>,
    reserved: Vec<IpNet>,
    /// owner -> real -> view.
    owners: BTreeMap<String, BTreeMap<IpNet, IpNet>>,
    /// Everything in use, disjoint and sorted by address: the outermost reserved ranges and
    /// every view (views never overlap anything in use, so the set stays disjoint).
    in_use: BTreeSet<IpNet>,
}

impl Ipam {
    /// An allocator with no allocations.
    pub fn new(config: IpamConfig) -> Self {
        let reserved: Vec<IpNet> = config.reserved.iter().map(IpNet::trunc).collect();
        let in_use = reserved
            .iter()
            .filter(|r| {
                !reserved
                    .iter()
                    .any(|other| other != *r && other.contains(*r))
            })
            .copied()
            .collect();
        Self {
            pools: config.pools.iter().map(IpNet::trunc).collect(),
            reserved,
            owners: BTreeMap::new(),
            in_use,
        }
    }

    /// The configured pools.
    pub fn pools(&self) -> &[IpNet] {
        &self.pools
    }

    /// The local ranges that are never handed out.
    pub fn reserved(&self) -> &[IpNet] {
        &self.reserved
    }

    /// The view of `real` for `owner`: the existing one if already mapped, `real` itself if it
    /// overlaps nothing in use, otherwise a free prefix of the same length from the pools.
    pub fn map(&mut self, owner: &str, real: IpNet) -> Result<IpNet, IpamError> {
        let real = real.trunc();
        if let Some(view) = self.view_of(owner, real) {
            return Ok(view);
        }
        let view = match self.first_conflict(real) {
            None => real,
            Some(conflict) => self
                .best_fit(real.prefix_len(), real.network().is_ipv4())
                .ok_or_else(|| IpamError::PoolExhausted {
                    real,
                    conflict,
                    len: real.prefix_len(),
                    pools: self
                        .pools
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                })?,
        };
        self.insert(owner, real, view);
        Ok(view)
    }

    /// Re-registers a persisted allocation (e.g. read back from a status on start). Restoring
    /// an allocation that already exists unchanged is a no-op.
    pub fn restore(&mut self, owner: &str, real: IpNet, view: IpNet) -> Result<(), IpamError> {
        let (real, view) = (real.trunc(), view.trunc());
        let refuse = |reason: String| IpamError::RestoreConflict {
            owner: owner.to_owned(),
            real,
            view,
            reason,
        };
        match self.view_of(owner, real) {
            Some(existing) if existing == view => return Ok(()),
            Some(existing) => return Err(refuse(format!("it is already mapped to {existing}"))),
            None => {}
        }
        if real.prefix_len() != view.prefix_len()
            || real.network().is_ipv4() != view.network().is_ipv4()
        {
            return Err(refuse(
                "the view has a different family or length".to_owned(),
            ));
        }
        if let Some(conflict) = self.first_conflict(view) {
            return Err(refuse(format!("it overlaps {conflict}, which is in use")));
        }
        self.insert(owner, real, view);
        Ok(())
    }

    fn insert(&mut self, owner: &str, real: IpNet, view: IpNet) {
        self.owners
            .entry(owner.to_owned())
            .or_default()
            .insert(real, view);
        self.in_use.insert(view);
    }

    /// Frees every allocation of `owner`.
    pub fn release(&mut self, owner: &str) {
        for view in self
            .owners
            .remove(owner)
            .into_iter()
            .flat_map(|m| m.into_values())
        {
            self.in_use.remove(&view);
        }
    }

    /// Frees the allocations of `owner` whose real prefix is not in `keep` (the owner stopped
    /// announcing them).
    pub fn release_except(&mut self, owner: &str, keep: &[IpNet]) {
        if let Some(allocations) = self.owners.get_mut(owner) {
            let in_use = &mut self.in_use;
            allocations.retain(|real, view| {
                let kept = keep.iter().any(|k| k.trunc() == *real);
                if !kept {
                    in_use.remove(view);
                }
                kept
            });
            if allocations.is_empty() {
                self.owners.remove(owner);
            }
        }
    }

    /// The view of `real` for `owner`, if mapped.
    pub fn view_of(&self, owner: &str, real: IpNet) -> Option<IpNet> {
        self.owners.get(owner)?.get(&real.trunc()).copied()
    }

    /// Owners holding at least one allocation, sorted.
    pub fn owners(&self) -> impl Iterator<Item = &str> {
        self.owners.keys().map(String::as_str)
    }

    /// Every allocation, sorted by owner and real prefix.
    pub fn allocations(&self) -> impl Iterator<Item = Allocation<'_>> {
        self.owners.iter().flat_map(|(owner, map)| {
            map.iter().map(move |(real, view)| Allocation {
                owner,
                real: *real,
                view: *view,
            })
        })
    }

    /// A prefix in use that overlaps `net`: one inside it, or the one containing it.
    fn first_conflict(&self, net: IpNet) -> Option<IpNet> {
        let (low, high) = address_bounds(net);
        if let Some(inside) = self.in_use.range(low..=high).next() {
            return Some(*inside);
        }
        self.in_use
            .range(..low)
            .next_back()
            .filter(|before| before.contains(&net.network()))
            .copied()
    }

    /// Best-fit: the smallest free block of length `<= len`, first in pool and address order;
    /// the view is its first `/len` subnet. An exact fit ends the search.
    fn best_fit(&self, len: u8, ipv4: bool) -> Option<IpNet> {
        let mut best: Option<IpNet> = None;
        for pool in self.pools.iter().filter(|p| p.network().is_ipv4() == ipv4) {
            if pool.prefix_len() > len || self.covered(*pool) {
                continue;
            }
            let (low, high) = address_bounds(*pool);
            let inside: Vec<IpNet> = self.in_use.range(low..=high).copied().collect();
            if visit_free_blocks(*pool, &inside, len, &mut best) {
                break;
            }
        }
        best.and_then(|block| first_subnet(block, len))
    }

    /// True when a single prefix in use contains all of `net`.
    fn covered(&self, net: IpNet) -> bool {
        let (_, high) = address_bounds(net);
        self.in_use
            .range(..=high)
            .next_back()
            .is_some_and(|before| before.contains(&net))
    }
}

/// The smallest and largest keys (in `IpNet` order) of prefixes starting inside `net`.
fn address_bounds(net: IpNet) -> (IpNet, IpNet) {
    let at = |addr: IpAddr, len: u8| match addr {
        IpAddr::V4(a) => IpNet::V4(Ipv4Net::new_assert(a, len.min(32))),
        IpAddr::V6(a) => IpNet::V6(Ipv6Net::new_assert(a, len)),
    };
    (at(net.network(), 0), at(net.broadcast(), 128))
}

/// True when the two prefixes share at least one address.
pub fn overlaps(a: IpNet, b: IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Walks the free aligned blocks inside `block` in address order, not below length `len`,
/// keeping in `best` the smallest one (the earliest among equals). `used` holds the prefixes
/// in use that start inside `block`, sorted and disjoint. Returns true on an exact fit, which
/// nothing can beat.
fn visit_free_blocks(block: IpNet, used: &[IpNet], len: u8, best: &mut Option<IpNet>) -> bool {
    let Some(first) = used.first() else {
        if best.is_none_or(|b| block.prefix_len() > b.prefix_len()) {
            *best = Some(block);
        }
        return block.prefix_len() == len;
    };
    if block.prefix_len() >= len || first.contains(&block) {
        return false;
    }
    let Some((low, high)) = halves(block) else {
        return false;
    };
    let split = used.partition_point(|u| u.network() < high.network());
    visit_free_blocks(low, &used[..split], len, best)
        || visit_free_blocks(high, &used[split..], len, best)
}

/// The two halves of a prefix, or `None` for a host prefix.
fn halves(net: IpNet) -> Option<(IpNet, IpNet)> {
    match net {
        IpNet::V4(n) => {
            let len = n.prefix_len().checked_add(1).filter(|l| *l <= 32)?;
            let low = Ipv4Net::new(n.network(), len).ok()?;
            let high_addr = u32::from(n.network()) | (1u32 << (32 - len));
            let high = Ipv4Net::new(Ipv4Addr::from(high_addr), len).ok()?;
            Some((IpNet::V4(low), IpNet::V4(high)))
        }
        IpNet::V6(n) => {
            let len = n.prefix_len().checked_add(1).filter(|l| *l <= 128)?;
            let low = Ipv6Net::new(n.network(), len).ok()?;
            let high_addr = u128::from(n.network()) | (1u128 << (128 - u32::from(len)));
            let high = Ipv6Net::new(Ipv6Addr::from(high_addr), len).ok()?;
            Some((IpNet::V6(low), IpNet::V6(high)))
        }
    }
}

/// The first subnet of length `len` inside `block`.
fn first_subnet(block: IpNet, len: u8) -> Option<IpNet> {
    IpNet::new(block.network(), len).ok()
}

#[cfg(test)]
mod tests;
