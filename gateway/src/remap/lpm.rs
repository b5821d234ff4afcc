//! Longest-prefix match over immutable prefix sets, for IPv4 (`u32`) and IPv6 (`u128`) keys.
//!
//! Small sets are scanned linearly, longest prefix first. Larger sets use binary search on prefix
//! lengths (Waldvogel et al., "Scalable high speed IP routing lookups", SIGCOMM 1997): one hash
//! table per distinct length, probed in binary-search order, with *markers* that steer the
//! search towards longer lengths and carry the best match known at their length. A lookup costs
//! at most ⌈log2(distinct lengths + 1)⌉ probes: 6 for IPv4, 8 for IPv6, whatever the rule count.

use std::collections::HashMap;
use std::hash::Hash;

/// Sets up to this size are scanned linearly; larger ones are hashed.
const LINEAR_MAX: usize = 8;

/// An address used as a lookup key.
pub(crate) trait Key: Copy + Eq + Hash + std::fmt::Debug {
    /// The address width in bits.
    const BITS: u8;
    /// The network mask of a prefix of `len` bits.
    fn mask(len: u8) -> Self;
    /// Bitwise and.
    fn and(self, other: Self) -> Self;
    /// A 64-bit hash whose high bits are well mixed.
    fn hash64(self) -> u64;
    /// The key as stored in a hash slot, aligned to 4 bytes so that IPv6 slots take 20 bytes
    /// instead of the 32 a 16-byte-aligned `u128` would need.
    type Packed: Copy + Eq + std::fmt::Debug;
    /// Converts to the stored form.
    fn pack(self) -> Self::Packed;
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Key for u32 {
    const BITS: u8 = 32;
    #[inline]
    fn mask(len: u8) -> Self {
        u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
    }
    #[inline]
    fn and(self, other: Self) -> Self {
        self & other
    }
    #[inline]
    fn hash64(self) -> u64 {
        u64::from(self).wrapping_mul(GOLDEN)
    }
    type Packed = u32;
    #[inline]
    fn pack(self) -> u32 {
        self
    }
}

impl Key for u128 {
    const BITS: u8 = 128;
    #[inline]
    fn mask(len: u8) -> Self {
        u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
    }
    #[inline]
    fn and(self, other: Self) -> Self {
        self & other
    }
    #[inline]
    fn hash64(self) -> u64 {
        let hi = (self >> 64) as u64;
        let lo = self as u64;
        (hi.wrapping_mul(GOLDEN).rotate_left(31) ^ lo).wrapping_mul(GOLDEN)
    }
    type Packed = [u32; 4];
    #[inline]
    fn pack(self) -> [u32; 4] {
        [
            (self >> 96) as u32,
            (self >> 64) as u32,
            (self >> 32) as u32,
            self as u32,
        ]
    }
}

/// An immutable map from prefixes to `u32` values with longest-prefix-match lookup.
#[derive(Clone, Debug)]
pub(crate) struct PrefixMap<A: Key> {
    repr: Repr<A>,
}

#[derive(Clone, Debug)]
enum Repr<A: Key> {
    /// `(network, mask, value)`, longest prefix first.
    Linear(Box<[(A, A, u32)]>),
    /// One level per distinct prefix length, shortest first.
    Levels(Box<[Level<A>]>),
}

#[derive(Clone, Debug)]
struct Level<A: Key> {
    mask: A,
    /// `64 - log2(slots.len())`: the hash's top bits pick the first slot.
    shift: u32,
    slots: Box<[Slot<A>]>,
}

/// A hash slot; `tag` is [`EMPTY`], [`MARKER`] (no prefix of this length or shorter matches the
/// key) or `value + VALUE_BASE` (the best match at this length or shorter).
#[derive(Clone, Copy, Debug)]
struct Slot<A: Key> {
    key: A::Packed,
    tag: u32,
}

const EMPTY: u32 = 0;
const MARKER: u32 = 1;
const VALUE_BASE: u32 = 2;

/// The largest value a [`PrefixMap`] can store.
pub(crate) const MAX_VALUE: u32 = u32::MAX - VALUE_BASE;

impl<A: Key> PrefixMap<A> {
    /// Builds a map from `(network, length, value)`; networks must have no host bits set,
    /// lengths must be at most `A::BITS` and values at most [`MAX_VALUE`]. For a prefix given
    /// twice, the last value wins.
    pub(crate) fn new(prefixes: impl IntoIterator<Item = (A, u8, u32)>) -> Self {
        let mut unique: HashMap<(A, u8), u32> = HashMap::new();
        for (net, len, value) in prefixes {
            debug_assert!(len <= A::BITS && value <= MAX_VALUE);
            debug_assert!(net.and(A::mask(len)) == net);
            unique.insert((net, len), value);
        }
        if unique.len() <= LINEAR_MAX {
            let mut entries: Vec<_> = unique.into_iter().collect();
            entries.sort_by_key(|&((_, len), _)| std::cmp::Reverse(len));
            let linear = entries
                .into_iter()
                .map(|((net, len), value)| (net, A::mask(len), value));
            return Self {
                repr: Repr::Linear(linear.collect()),
            };
        }
        Self {
            repr: Repr::Levels(build_levels(&unique)),
        }
    }

    /// The value of the longest prefix containing `addr`.
    #[inline(always)]
    pub(crate) fn lookup(&self, addr: A) -> Option<u32> {
        match &self.repr {
            Repr::Linear(entries) => entries
                .iter()
                .find(|(net, mask, _)| addr.and(*mask) == *net)
                .map(|&(_, _, value)| value),
            Repr::Levels(levels) => lookup_levels(levels, addr),
        }
    }

    /// Whether any prefix contains `addr`.
    #[inline]
    pub(crate) fn contains(&self, addr: A) -> bool {
        self.lookup(addr).is_some()
    }
}

#[inline(always)]
fn lookup_levels<A: Key>(levels: &[Level<A>], addr: A) -> Option<u32> {
    let (mut lo, mut hi) = (0, levels.len());
    let mut best = None;
    while lo < hi {
        let mid = (lo + hi) / 2;
        let level = &levels[mid];
        match level.probe(addr.and(level.mask)) {
            Some(tag) => {
                if tag >= VALUE_BASE {
                    best = Some(tag - VALUE_BASE);
                }
                lo = mid + 1;
            }
            None => hi = mid,
        }
    }
    best
}

impl<A: Key> Level<A> {
    #[inline(always)]
    fn probe(&self, key: A) -> Option<u32> {
        let index_mask = self.slots.len() - 1;
        let mut index = (key.hash64() >> self.shift) as usize;
        let packed = key.pack();
        loop {
            let slot = &self.slots[index & index_mask];
            if slot.tag == EMPTY {
                return None;
            }
            if slot.key == packed {
                return Some(slot.tag);
            }
            index = index.wrapping_add(1);
        }
    }

    fn build(len: u8, entries: &HashMap<A, u32>) -> Self {
        // Load factor at most 1/2 keeps probe sequences short.
        let capacity = (entries.len() * 2).next_power_of_two().max(4);
        let bits = capacity.trailing_zeros();
        let mut slots = vec![
            Slot {
                key: A::mask(0).pack(),
                tag: EMPTY
            };
            capacity
        ]
        .into_boxed_slice();
        let shift = 64 - bits;
        for (&key, &tag) in entries {
            let mut index = (key.hash64() >> shift) as usize;
            while slots[index & (capacity - 1)].tag != EMPTY {
                index = index.wrapping_add(1);
            }
            slots[index & (capacity - 1)] = Slot {
                key: key.pack(),
                tag,
            };
        }
        Self {
            mask: A::mask(len),
            shift,
            slots,
        }
    }
}

fn build_levels<A: Key>(prefixes: &HashMap<(A, u8), u32>) -> Box<[Level<A>]> {
    let mut lengths: Vec<u8> = prefixes.keys().map(|&(_, len)| len).collect();
    lengths.sort_unstable();
    lengths.dedup();

    // Real prefixes per level, then markers on the binary-search path to each prefix's level.
    let mut real: Vec<HashMap<A, u32>> = vec![HashMap::new(); lengths.len()];
    for (&(net, len), &value) in prefixes {
        let level = lengths.binary_search(&len).unwrap_or_default();
        real[level].insert(net, value);
    }
    let mut markers: Vec<Vec<A>> = vec![Vec::new(); lengths.len()];
    for &(net, len) in prefixes.keys() {
        let target = lengths.binary_search(&len).unwrap_or_default();
        let (mut lo, mut hi) = (0, lengths.len());
        loop {
            let mid = (lo + hi) / 2;
            if mid == target {
                break;
            }
            if target > mid {
                markers[mid].push(net.and(A::mask(lengths[mid])));
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
    }

    // A marker carries the best real match of its own length or shorter, so a search that
    // follows it and then fails still returns the right answer.
    let best_at = |level: usize, key: A| -> Option<u32> {
        (0..=level)
            .rev()
            .find_map(|l| real[l].get(&key.and(A::mask(lengths[l]))).copied())
    };
    let mut tables: Vec<HashMap<A, u32>> = real
        .iter()
        .map(|entries| entries.iter().map(|(&k, &v)| (k, v + VALUE_BASE)).collect())
        .collect();
    for (level, keys) in markers.iter().enumerate() {
        for &key in keys {
            if !tables[level].contains_key(&key) {
                let tag = best_at(level, key).map_or(MARKER, |v| v + VALUE_BASE);
                tables[level].insert(key, tag);
            }
        }
    }
    lengths
        .iter()
        .zip(&tables)
        .map(|(&len, entries)| Level::build(len, entries))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive<A: Key>(prefixes: &[(A, u8, u32)], addr: A) -> Option<u32> {
        prefixes
            .iter()
            .filter(|&&(net, len, _)| addr.and(A::mask(len)) == net)
            .max_by_key(|&&(_, len, _)| len)
            .map(|&(_, _, v)| v)
    }

    /// Prefixes drawn near `base` so that random addresses hit, nest and miss them.
    fn prefixes_v4() -> impl Strategy<Value = Vec<(u32, u8, u32)>> {
        prop::collection::vec((0u32..1 << 12, 0u8..=32), 0..200).prop_map(|raw| {
            let mut seen = std::collections::HashSet::new();
            raw.into_iter()
                .enumerate()
                .filter_map(|(i, (bits, len))| {
                    let net = (0x0a00_0000 | (bits << 12)) & u32::mask(len);
                    seen.insert((net, len)).then_some((net, len, i as u32))
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn v4_lookup_matches_naive(prefixes in prefixes_v4(), addrs in prop::collection::vec(0u32..1 << 24, 64)) {
            let map = PrefixMap::new(prefixes.iter().copied());
            for low in addrs {
                let addr = 0x0a00_0000 | low;
                prop_assert_eq!(map.lookup(addr), naive(&prefixes, addr), "addr {:#x}", addr);
            }
        }

        #[test]
        fn v6_lookup_matches_naive(
            raw in prop::collection::vec((0u128..1 << 20, 0u8..=128), 0..150),
            addrs in prop::collection::vec(any::<u128>(), 64),
        ) {
            let base = 0xfd00_u128 << 112;
            let mut seen = std::collections::HashSet::new();
            let prefixes: Vec<(u128, u8, u32)> = raw
                .into_iter()
                .enumerate()
                .filter_map(|(i, (bits, len))| {
                    // Spread the random bits over the whole address so every length is exercised.
                    let spread = (bits << 100) | (bits << 40) | bits;
                    let net = (base | (spread & !(0xffff_u128 << 112))) & u128::mask(len);
                    seen.insert((net, len)).then_some((net, len, i as u32))
                })
                .collect();
            let map = PrefixMap::new(prefixes.iter().copied());
            for (i, noise) in addrs.into_iter().enumerate() {
                // Half the probes start from a stored prefix, so they hit deep levels.
                let addr = match prefixes.get(i % prefixes.len().max(1)) {
                    Some(&(net, len, _)) if i % 2 == 0 => net | (noise & !u128::mask(len)),
                    _ => base | (noise >> 16),
                };
                prop_assert_eq!(map.lookup(addr), naive(&prefixes, addr));
            }
        }
    }

    #[test]
    fn default_route_and_host_routes() {
        let prefixes = (0..20u32)
            .map(|i| (0x0a00_0000 + i, 32, i))
            .chain([(0, 0, 99)]);
        let map = PrefixMap::new(prefixes);
        assert_eq!(map.lookup(0x0a00_0005), Some(5));
        assert_eq!(map.lookup(0x0b00_0005), Some(99));
        assert!(PrefixMap::<u32>::new([]).lookup(0).is_none());
    }
}
