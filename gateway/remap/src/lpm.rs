//! Longest-prefix match over immutable prefix sets, for IPv4 (`u32`) and IPv6 (`u128`) keys.
//!
//! Small sets are scanned linearly, longest prefix first. Larger sets use binary search on prefix
//! lengths (Waldvogel et al., "Scalable high speed IP routing lookups", SIGCOMM 1997): one hash
//! table per distinct length, with *markers* that steer the search towards longer lengths and
//! carry the best match known at their length. Two additions cut the probes a lookup makes:
//!
//! * The shortest length is always probed first (the *root*), and every prefix leaves an entry
//!   there; a miss at the root is a miss overall.
//! * Every entry knows how many longer prefixes lie below it. With none, the search stops; with
//!   exactly one, the entry stores that prefix (network, length, value) and the lookup finishes
//!   with one comparison instead of more probes. Only entries with two or more descendants
//!   continue the binary search, and prefixes reachable through a shortcut are not stored in the
//!   deeper levels at all.
//!
//! Prefixes that share no short ancestor with another one (the common case for allocated CIDRs)
//! therefore cost a single probe, and the worst case stays 1 + ⌈log2(distinct lengths)⌉ probes.
//!
//! The tables are open-addressed with linear probing under a keyed hash whose key is drawn at
//! random for every build, so packet addresses cannot be chosen to collide. A build also checks
//! the longest run of occupied slots (which bounds the slots any lookup scans, hit or miss) and
//! draws a new key or grows the table when a run exceeds [`MAX_RUN`].
//!
//! # Replacing a map cheaply
//!
//! [`PrefixMap::new_like`] builds the successor of a map: it keeps each level's hash key and size
//! while they still fit, numbers the values as before, and places entries in a canonical order,
//! so the successor's memory image differs from its predecessor's only around the prefixes that
//! changed. [`Refill::refill`](refill::Refill::refill) then copies it into the memory of an older map (one the readers
//! used until recently) by writing only the differing elements: the cache lines a reader holds
//! stay valid across the swap, except those that really changed.

pub(crate) mod refill;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

/// Sets up to this size are scanned linearly; larger ones are hashed.
const LINEAR_MAX: usize = 8;

/// The longest run of occupied slots a hash table may have: a lookup scans at most this many
/// slots (plus the empty one that ends the run) per probed length.
const MAX_RUN: usize = 64;

/// Builds with fresh hash keys before a table is grown instead.
const RESEEDS: usize = 4;

/// An address used as a lookup key.
pub(crate) trait Key: Copy + Default + Eq + Ord + Hash + std::fmt::Debug {
    /// The address width in bits.
    const BITS: u8;
    /// The all-zero address.
    const ZERO: Self;
    /// A zero-sized type that aligns a hash slot to its size, so a slot never straddles two
    /// cache lines.
    type SlotAlign: Copy + Default + PartialEq + std::fmt::Debug;
    /// The alignment of a slot that also holds a route's payload (an address and a few
    /// words): 32 bytes for IPv4, a cache line for IPv6.
    type WideAlign: Copy + Default + PartialEq + std::fmt::Debug;
    /// The network mask of a prefix of `len` bits.
    fn mask(len: u8) -> Self;
    /// Bitwise and.
    fn and(self, other: Self) -> Self;
    /// A keyed 64-bit hash whose high bits are well mixed (a multiply-shift family, universal
    /// over the random `seed`).
    fn hash64(self, seed: &Seed) -> u64;
}

/// The random key of a table's hash function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Seed([u64; 6]);

impl Seed {
    /// A fresh key from the standard library's randomly keyed SipHash.
    fn random() -> Self {
        let state = std::collections::hash_map::RandomState::new();
        Seed([0u64, 1, 2, 3, 4, 5].map(|i| state.hash_one(i)))
    }
}

/// Aligns IPv4 slots (up to 16 bytes of fields) to 16 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(align(16))]
pub(crate) struct Align16;

/// Aligns IPv6 slots (up to 32 bytes of fields) to 32 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(align(32))]
pub(crate) struct Align32;

/// Aligns slots with an IPv6 payload (57 bytes of fields) to a cache line.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(align(64))]
pub(crate) struct Align64;

/// A value stored with each prefix and returned by reference from a lookup. Values live in
/// the hash slots themselves, so a lookup that ends at its first probe reads one slot only.
pub(crate) trait Payload: Copy + Default + PartialEq + std::fmt::Debug {
    /// A zero-sized type that rounds the slot up to a power-of-two size.
    type Align: Copy + Default + PartialEq + std::fmt::Debug;
}

impl Payload for u32 {
    type Align = ();
}

impl Payload for () {
    type Align = ();
}

impl Key for u32 {
    const BITS: u8 = 32;
    const ZERO: Self = 0;
    type SlotAlign = Align16;
    type WideAlign = Align32;
    #[inline]
    fn mask(len: u8) -> Self {
        u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
    }
    #[inline]
    fn and(self, other: Self) -> Self {
        self & other
    }
    #[inline]
    fn hash64(self, seed: &Seed) -> u64 {
        // Multiply-shift (Dietzfelbinger): the top bits of `a * x` for a random odd `a`.
        u64::from(self)
            .wrapping_add(seed.0[0])
            .wrapping_mul(seed.0[1] | 1)
    }
}

impl Key for u128 {
    const BITS: u8 = 128;
    const ZERO: Self = 0;
    type SlotAlign = Align32;
    type WideAlign = Align64;
    #[inline]
    fn mask(len: u8) -> Self {
        u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
    }
    #[inline]
    fn and(self, other: Self) -> Self {
        self & other
    }
    #[inline]
    fn hash64(self, seed: &Seed) -> u64 {
        // Pair-multiply-shift (Dietzfelbinger): the top bits of `(a + hi)(b + lo) + c` modulo
        // 2^128, for random 128-bit `a`, `b` and `c`.
        let word = |i: usize| (u128::from(seed.0[i]) << 64) | u128::from(seed.0[i + 1]);
        let (hi, lo) = (self >> 64, self & u128::from(u64::MAX));
        let product = word(0)
            .wrapping_add(hi)
            .wrapping_mul(word(2).wrapping_add(lo));
        (product.wrapping_add(word(4)) >> 64) as u64
    }
}

/// An immutable map from prefixes to values with longest-prefix-match lookup.
#[derive(Clone, Debug)]
pub(crate) struct PrefixMap<A: Key, V: Payload = u32> {
    repr: Repr<A, V>,
}

/// The empty map.
impl<A: Key, V: Payload> Default for PrefixMap<A, V> {
    fn default() -> Self {
        Self {
            repr: Repr::Linear(Box::default()),
        }
    }
}

#[derive(Clone, Debug)]
enum Repr<A: Key, V: Payload> {
    /// `(network, mask, value)`, longest prefix first.
    Linear(Box<[(A, A, V)]>),
    Hashed(Hashed<A, V>),
}

/// The hashed form: `levels[0]` is the root, the other levels are searched in binary order.
#[derive(Clone, Debug)]
struct Hashed<A: Key, V: Payload> {
    levels: Box<[Level<A, V>]>,
    /// Every value by index, for the answers a slot does not hold itself. Indexes that no
    /// prefix uses any more hold a default value no tag points to.
    values: Box<[V]>,
    /// The index of every prefix's value, so the next build can number them alike. Read by
    /// builds only, and shared by a refilled map with its source instead of copied.
    numbering: Arc<HashMap<(A, u8), u32>>,
}

/// The entries of one prefix length.
#[derive(Clone, Debug)]
struct Level<A: Key, V: Payload> {
    /// This level's hash key, drawn at random when it is first built.
    seed: Seed,
    /// The prefix length of this level's entries.
    len: u8,
    mask: A,
    /// `64 - log2(slots.len())`: the hash's top bits pick the first slot.
    shift: u32,
    slots: Box<[Slot<A, V>]>,
}

/// A hash slot.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
struct Slot<A: Key, V: Payload> {
    /// The entry's key (the network at this level's length); for a shortcut, the network of
    /// the single longer prefix below it, whose first bits are the key.
    net: A,
    /// [`EMPTY`], [`MARKER`] (no prefix of this length or shorter matches) or
    /// `index + VALUE_BASE` (the best match at this length or shorter).
    tag: u32,
    /// [`CONTINUE`], [`TERMINAL`] or the length of the shortcut prefix.
    next: u8,
    /// The value a lookup ending here returns: the shortcut prefix's, or for [`TERMINAL`] the
    /// tag's.
    answer: V,
    _align: [A::SlotAlign; 0],
    _payload_align: [V::Align; 0],
}

const EMPTY: u32 = 0;
const MARKER: u32 = 1;
const VALUE_BASE: u32 = 2;

/// Two or more longer prefixes lie below the entry: continue the binary search.
const CONTINUE: u8 = 0xff;
/// No longer prefix lies below the entry: its tag is the answer.
const TERMINAL: u8 = 0xfe;

impl<A: Key, V: Payload> PrefixMap<A, V> {
    /// Builds a map from `(network, length, value)`; networks must have no host bits set and
    /// lengths must be at most `A::BITS`. For a prefix given twice, the last value wins.
    #[cfg(test)]
    pub(crate) fn new(prefixes: impl IntoIterator<Item = (A, u8, V)>) -> Self {
        Self::new_like(prefixes, None)
    }

    /// Like [`PrefixMap::new`], for a map that replaces `like`: where `like`'s hash keys, table
    /// sizes and value numbering still fit the new prefixes, they are kept, so the result
    /// differs from `like` in memory only where the prefixes do (see [`Refill`](refill::Refill)).
    pub(crate) fn new_like(
        prefixes: impl IntoIterator<Item = (A, u8, V)>,
        like: Option<&Self>,
    ) -> Self {
        let mut unique: HashMap<(A, u8), V> = HashMap::new();
        for (net, len, value) in prefixes {
            debug_assert!(len <= A::BITS);
            debug_assert!(net.and(A::mask(len)) == net);
            unique.insert((net, len), value);
        }
        if unique.len() <= LINEAR_MAX {
            let mut entries: Vec<_> = unique.into_iter().collect();
            entries.sort_by_key(|&((net, len), _)| (std::cmp::Reverse(len), net));
            let linear = entries
                .into_iter()
                .map(|((net, len), value)| (net, A::mask(len), value));
            return Self {
                repr: Repr::Linear(linear.collect()),
            };
        }
        let like = match like.map(|map| &map.repr) {
            Some(Repr::Hashed(hashed)) => Some(hashed),
            _ => None,
        };
        Self {
            repr: Repr::Hashed(Hashed::build(unique, like)),
        }
    }

    /// The value of the longest prefix containing `addr`.
    #[inline(always)]
    pub(crate) fn lookup(&self, addr: A) -> Option<&V> {
        match &self.repr {
            Repr::Linear(entries) => entries
                .iter()
                .find(|(net, mask, _)| addr.and(*mask) == *net)
                .map(|(_, _, value)| value),
            Repr::Hashed(hashed) => hashed.lookup(addr),
        }
    }

    /// Starts loading the slot where a lookup of `addr` begins, without waiting for it: a
    /// batch that calls this for all its packets first overlaps their cache misses.
    #[inline]
    pub(crate) fn prefetch(&self, addr: A) {
        if let Repr::Hashed(hashed) = &self.repr
            && let Some(root) = hashed.levels.first()
        {
            let index = (addr.and(root.mask).hash64(&root.seed) >> root.shift) as usize;
            // A load whose value is kept but never waited on: the core moves on while the
            // line arrives.
            std::hint::black_box(root.slots[index & (root.slots.len() - 1)].tag);
        }
    }

    /// Whether any prefix contains `addr`.
    #[inline]
    pub(crate) fn contains(&self, addr: A) -> bool {
        self.lookup(addr).is_some()
    }

    /// How many slots and values differ between `self` and `other` (what [`Refill::refill`](refill::Refill::refill)
    /// writes), or `None` if their shapes differ; for tests.
    #[cfg(test)]
    fn image_difference(&self, other: &Self) -> Option<usize> {
        fn differing<T: PartialEq>(a: &[T], b: &[T]) -> Option<usize> {
            (a.len() == b.len()).then(|| a.iter().zip(b).filter(|(x, y)| x != y).count())
        }
        match (&self.repr, &other.repr) {
            (Repr::Linear(a), Repr::Linear(b)) => differing(a, b),
            (Repr::Hashed(a), Repr::Hashed(b)) if a.levels.len() == b.levels.len() => {
                let mut total = differing(&a.values, &b.values)?;
                for (x, y) in a.levels.iter().zip(b.levels.iter()) {
                    if x.seed != y.seed {
                        return None;
                    }
                    total += differing(&x.slots, &y.slots)?;
                }
                Some(total)
            }
            _ => None,
        }
    }

    /// The number of hash probes `lookup(addr)` makes (0 for a linear set); for tests.
    #[cfg(test)]
    fn probes(&self, addr: A) -> usize {
        match &self.repr {
            Repr::Linear(_) => 0,
            Repr::Hashed(hashed) => hashed.search(addr).1,
        }
    }
}

impl<A: Key, V: Payload> Hashed<A, V> {
    #[inline(always)]
    fn lookup(&self, addr: A) -> Option<&V> {
        self.search(addr).0
    }

    /// The value at `tag`, if the tag holds one.
    #[inline]
    fn value(&self, tag: u32) -> Option<&V> {
        tag.checked_sub(VALUE_BASE)
            .and_then(|index| self.values.get(index as usize))
    }

    /// The longest match and the number of levels probed.
    #[inline(always)]
    fn search(&self, addr: A) -> (Option<&V>, usize) {
        let levels = &*self.levels;
        let Some(root) = levels.first() else {
            return (None, 0);
        };
        let mut probes = 1;
        let Some(mut slot) = root.probe(addr) else {
            return (None, probes);
        };
        let (mut lo, mut hi) = (1, levels.len());
        loop {
            match slot.next {
                CONTINUE => {}
                TERMINAL => {
                    let found = slot.tag >= VALUE_BASE;
                    return (found.then_some(&slot.answer), probes);
                }
                leaf_len => {
                    if addr.and(A::mask(leaf_len)) == slot.net {
                        return (Some(&slot.answer), probes);
                    }
                    return (self.value(slot.tag), probes);
                }
            }
            // Binary search in the longer levels for the next entry on the address's path;
            // when there is none, the last entry's tag is the answer.
            let last = slot;
            slot = loop {
                if lo >= hi {
                    return (self.value(last.tag), probes);
                }
                let mid = (lo + hi) / 2;
                probes += 1;
                match levels[mid].probe(addr) {
                    Some(found) => {
                        lo = mid + 1;
                        break found;
                    }
                    None => hi = mid,
                }
            };
        }
    }

    fn build(prefixes: HashMap<(A, u8), V>, like: Option<&Self>) -> Self {
        // The levels hold indexes into `values`; slots copy the values they answer with.
        let numbering = number_values(&prefixes, like.map(|like| &*like.numbering));
        let size = numbering.values().max().map_or(0, |&i| i as usize + 1);
        let mut values = vec![V::default(); size];
        for (prefix, value) in prefixes {
            values[numbering[&prefix] as usize] = value;
        }
        let levels = plan_levels(&numbering, &values)
            .into_iter()
            .map(|(len, mut entries)| {
                let like = like.and_then(|like| like.levels.iter().find(|l| l.len == len));
                Level::build(len, &mut entries, like)
            })
            .collect();
        Self {
            levels,
            values: values.into_boxed_slice(),
            numbering: Arc::new(numbering),
        }
    }
}

/// Value indexes for `prefixes`: the ones `previous` gave them where it knew them, free or new
/// indexes for the others (in prefix order, so equal inputs number alike). Renumbers from
/// scratch once more than half the indexes would be unused.
fn number_values<A: Key, V>(
    prefixes: &HashMap<(A, u8), V>,
    previous: Option<&HashMap<(A, u8), u32>>,
) -> HashMap<(A, u8), u32> {
    let mut numbering = HashMap::with_capacity(prefixes.len());
    let mut fresh: Vec<(A, u8)> = Vec::new();
    for &prefix in prefixes.keys() {
        match previous.and_then(|previous| previous.get(&prefix)) {
            Some(&index) => {
                numbering.insert(prefix, index);
            }
            None => fresh.push(prefix),
        }
    }
    fresh.sort_unstable_by_key(|&(net, len)| (len, net));
    let kept: HashSet<u32> = numbering.values().copied().collect();
    let free = (0u32..).filter(|index| !kept.contains(index));
    numbering.extend(fresh.into_iter().zip(free));
    let size = numbering.values().max().map_or(0, |&i| i as usize + 1);
    if size > 2 * prefixes.len() + 8 {
        let mut all: Vec<(A, u8)> = prefixes.keys().copied().collect();
        all.sort_unstable_by_key(|&(net, len)| (len, net));
        return all.into_iter().zip(0..).collect();
    }
    numbering
}

impl<A: Key, V: Payload> Level<A, V> {
    /// The entry whose key is `addr`'s network at this level's length.
    #[inline(always)]
    fn probe(&self, addr: A) -> Option<&Slot<A, V>> {
        let key = addr.and(self.mask);
        let index_mask = self.slots.len() - 1;
        let mut index = (key.hash64(&self.seed) >> self.shift) as usize;
        loop {
            let slot = &self.slots[index & index_mask];
            if slot.tag == EMPTY {
                return None;
            }
            if slot.net.and(self.mask) == key {
                return Some(slot);
            }
            index = index.wrapping_add(1);
        }
    }

    /// Places `entries` in a table: with `like`'s hash key and size if the entries fit them
    /// (load below 2/3, not emptier than half the natural size), else with a fresh key; draws
    /// another key when a run of occupied slots comes out longer than [`MAX_RUN`], and grows
    /// the table when that keeps happening. Entries go in in key order, so the same entries
    /// under the same key and size always land in the same slots.
    fn build(len: u8, entries: &mut [Slot<A, V>], like: Option<&Self>) -> Self {
        entries.sort_unstable_by_key(|slot| slot.net);
        let mut capacity = (entries.len() * 2).next_power_of_two().max(4);
        if let Some(like) = like {
            let size = like.slots.len();
            if size * 2 > entries.len() * 3
                && size <= capacity * 2
                && let Some(level) = Self::fill(len, entries, like.seed, size)
            {
                return level;
            }
        }
        for attempt in 1.. {
            if let Some(level) = Self::fill(len, entries, Seed::random(), capacity) {
                return level;
            }
            if attempt % RESEEDS == 0 {
                capacity *= 2;
            }
        }
        unreachable!("the attempts never end")
    }

    fn fill(len: u8, entries: &[Slot<A, V>], seed: Seed, capacity: usize) -> Option<Self> {
        let mut slots = vec![Slot::empty(); capacity].into_boxed_slice();
        let shift = 64 - capacity.trailing_zeros();
        let mask = A::mask(len);
        for entry in entries {
            let mut index = (entry.net.and(mask).hash64(&seed) >> shift) as usize;
            while slots[index & (capacity - 1)].tag != EMPTY {
                index = index.wrapping_add(1);
            }
            slots[index & (capacity - 1)] = *entry;
        }
        (longest_run(&slots) <= MAX_RUN).then_some(Self {
            seed,
            len,
            mask,
            shift,
            slots,
        })
    }
}

impl<A: Key, V: Payload> Slot<A, V> {
    fn empty() -> Self {
        Slot {
            net: A::ZERO,
            tag: EMPTY,
            next: TERMINAL,
            answer: V::default(),
            _align: [],
            _payload_align: [],
        }
    }
}

/// The longest run of occupied slots, wrapping around the end (at least one slot is empty).
fn longest_run<A: Key, V: Payload>(slots: &[Slot<A, V>]) -> usize {
    let Some(first_empty) = slots.iter().position(|s| s.tag == EMPTY) else {
        return slots.len();
    };
    let (mut longest, mut run) = (0, 0);
    for i in 1..=slots.len() {
        if slots[(first_empty + i) % slots.len()].tag == EMPTY {
            run = 0;
        } else {
            run += 1;
            longest = longest.max(run);
        }
    }
    longest
}

/// What lies below an entry: the longer prefixes whose first bits are its key.
#[derive(Clone, Copy)]
enum Below<A> {
    Nothing,
    One { net: A, len: u8, value: u32 },
    Several,
}

/// The levels a search passes through on its way to `target` and continues past towards
/// longer lengths: the root, then the binary search over `1..levels`. Markers go there.
fn ancestors(target: usize, levels: usize) -> Vec<usize> {
    if target == 0 {
        return Vec::new();
    }
    let mut path = vec![0];
    let (mut lo, mut hi) = (1, levels);
    loop {
        let mid = (lo + hi) / 2;
        if mid == target {
            return path;
        }
        if target > mid {
            path.push(mid);
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
}

/// The distinct lengths, shortest first, each with the slots of its level.
fn plan_levels<A: Key, V: Payload>(
    prefixes: &HashMap<(A, u8), u32>,
    values: &[V],
) -> Vec<(u8, Vec<Slot<A, V>>)> {
    let mut lengths: Vec<u8> = prefixes.keys().map(|&(_, len)| len).collect();
    lengths.sort_unstable();
    lengths.dedup();
    let count = lengths.len();
    let level_of = |len: u8| lengths.binary_search(&len).unwrap_or_default();

    let mut real: Vec<HashMap<A, u32>> = vec![HashMap::new(); count];
    for (&(net, len), &value) in prefixes {
        real[level_of(len)].insert(net, value);
    }
    // An entry's tag is the best real match of its own length or shorter, so a search that
    // follows a marker and then fails still returns the right answer.
    let best_at = |level: usize, key: A| -> u32 {
        (0..=level)
            .rev()
            .find_map(|l| real[l].get(&key.and(A::mask(lengths[l]))))
            .map_or(MARKER, |v| v + VALUE_BASE)
    };

    // Every prefix at its own level, and a marker on each level its search passes through.
    let mut entries: Vec<HashMap<A, (u32, Below<A>)>> = vec![HashMap::new(); count];
    for &(net, len) in prefixes.keys() {
        let target = level_of(len);
        for level in ancestors(target, count).into_iter().chain([target]) {
            let key = net.and(A::mask(lengths[level]));
            entries[level]
                .entry(key)
                .or_insert_with(|| (best_at(level, key), Below::Nothing));
        }
    }
    // Count the longer prefixes below every entry (any entry, not only the ones on a
    // prefix's own search path: a real prefix may cover longer ones whose path misses it).
    for (&(net, len), &value) in prefixes {
        for level in 0..level_of(len) {
            if let Some((_, below)) = entries[level].get_mut(&net.and(A::mask(lengths[level]))) {
                *below = match below {
                    Below::Nothing => Below::One { net, len, value },
                    _ => Below::Several,
                };
            }
        }
    }
    // A search that reaches a shortcut ends there, so the entries below a shortcut are never
    // probed: leave them out.
    let unreachable = |level: usize, key: A| {
        ancestors(level, count).into_iter().any(|a| {
            let below = entries[a].get(&key.and(A::mask(lengths[a])));
            matches!(below, Some((_, Below::One { .. })))
        })
    };
    (0..count)
        .map(|level| {
            let slots = entries[level]
                .iter()
                .filter(|&(&key, _)| !unreachable(level, key))
                .map(|(&key, &(tag, below))| {
                    let tag_value = tag.checked_sub(VALUE_BASE);
                    let (net, answer, next) = match below {
                        Below::Nothing => (key, tag_value, TERMINAL),
                        Below::One { net, len, value } => (net, Some(value), len),
                        Below::Several => (key, None, CONTINUE),
                    };
                    Slot {
                        net,
                        tag,
                        next,
                        answer: answer.map_or_else(V::default, |i| values[i as usize]),
                        _align: [],
                        _payload_align: [],
                    }
                })
                .collect();
            (lengths[level], slots)
        })
        .collect()
}
