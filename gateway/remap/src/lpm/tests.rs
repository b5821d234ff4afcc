//! Lookups checked against a naive longest-match scan, probe counts, slot layout, and the
//! memory image that successors and refills keep.

use super::refill::Refill;
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
            prop_assert_eq!(map.lookup(addr).copied(), naive(&prefixes, addr), "addr {:#x}", addr);
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
            prop_assert_eq!(map.lookup(addr).copied(), naive(&prefixes, addr));
        }
    }
}

/// Nested prefixes of every length around a few random addresses: each prefix is one of
/// `bases` cut at a random length, so they share ancestors at all depths.
fn nested_v6() -> impl Strategy<Value = (Vec<u128>, Vec<(u128, u8, u32)>)> {
    (
        prop::collection::vec(any::<u128>(), 1..6),
        prop::collection::vec((any::<prop::sample::Index>(), 0u8..=128), 0..300),
    )
        .prop_map(|(bases, raw)| {
            let mut seen = std::collections::HashSet::new();
            let prefixes = raw
                .into_iter()
                .enumerate()
                .filter_map(|(i, (base, len))| {
                    let net = *base.get(&bases) & u128::mask(len);
                    seen.insert((net, len)).then_some((net, len, i as u32))
                })
                .collect();
            (bases, prefixes)
        })
}

proptest! {
    #[test]
    fn v6_nested_lengths_match_naive(
        (bases, prefixes) in nested_v6(),
        noise in prop::collection::vec((any::<prop::sample::Index>(), 0u8..=128, any::<u128>()), 64),
    ) {
        let map = PrefixMap::new(prefixes.iter().copied());
        for (base, keep, bits) in noise {
            // Keep the first `keep` bits of a base: the address leaves the nest at any depth.
            let base = *base.get(&bases);
            let addr = (base & u128::mask(keep)) | (bits & !u128::mask(keep));
            prop_assert_eq!(map.lookup(addr).copied(), naive(&prefixes, addr), "addr {:#x}", addr);
            prop_assert_eq!(map.lookup(base).copied(), naive(&prefixes, base));
        }
    }

    #[test]
    fn v4_nested_lengths_match_naive(
        base in any::<u32>(),
        raw in prop::collection::vec((0u32..16, 0u8..=32), 0..200),
        addrs in prop::collection::vec((0u8..=32, any::<u32>()), 64),
    ) {
        let mut seen = std::collections::HashSet::new();
        let prefixes: Vec<(u32, u8, u32)> = raw
            .into_iter()
            .enumerate()
            .filter_map(|(i, (flip, len))| {
                // A few bits flipped near the end of the prefix, so siblings appear too.
                let net = (base ^ (flip << (32 - u32::from(len)).min(28))) & u32::mask(len);
                seen.insert((net, len)).then_some((net, len, i as u32))
            })
            .collect();
        let map = PrefixMap::new(prefixes.iter().copied());
        for (keep, bits) in addrs {
            let addr = (base & u32::mask(keep)) | (bits & !u32::mask(keep));
            prop_assert_eq!(map.lookup(addr).copied(), naive(&prefixes, addr), "addr {:#x}", addr);
        }
    }
}

#[test]
fn disjoint_prefixes_cost_one_probe() {
    // 5 000 random /48s and /64s under fd00::/16: almost none share a /48.
    let mut state = 0x1234_5678_9abc_def0_u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let prefixes: Vec<(u128, u8, u32)> = (0..5_000)
        .map(|i| {
            let len = if i % 2 == 0 { 48 } else { 64 };
            let raw = (0xfd00_u128 << 112) | (u128::from(next()) << 48);
            (raw & u128::mask(len), len, i)
        })
        .collect();
    let map = PrefixMap::new(prefixes.iter().copied());
    let mut one_probe = 0;
    for &(net, len, value) in &prefixes {
        let addr = net | (u128::from(next()) & !u128::mask(len));
        assert_eq!(map.lookup(addr), Some(&value));
        one_probe += usize::from(map.probes(addr) == 1);
    }
    assert!(one_probe > prefixes.len() * 99 / 100, "{one_probe} of 5000");
    // Addresses outside every prefix miss at the root.
    assert_eq!(map.lookup(0xfe00_u128 << 112), None);
    assert_eq!(map.probes(0xfe00_u128 << 112), 1);
}

#[test]
fn probe_runs_stay_bounded() {
    let prefixes = (0..20_000u32).map(|i| (i << 8, 24, i));
    let PrefixMap {
        repr: Repr::Hashed(hashed),
    } = PrefixMap::<u32>::new(prefixes)
    else {
        panic!("20 000 prefixes are hashed");
    };
    for level in &hashed.levels {
        assert!(longest_run(&level.slots) <= MAX_RUN);
    }
}

#[test]
fn slots_fill_whole_cache_line_fractions() {
    assert_eq!(std::mem::size_of::<Slot<u32, u32>>(), 16);
    assert_eq!(std::mem::align_of::<Slot<u32, ()>>(), 16);
    assert_eq!(std::mem::size_of::<Slot<u128, u32>>(), 32);
    assert_eq!(std::mem::align_of::<Slot<u128, ()>>(), 32);

    /// A route-sized payload: an address and a few words.
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    struct Wide<A>(A, [u32; 3], bool);
    let wide = Wide(0u32, [1, 2, 3], true);
    assert_eq!((wide.0, wide.1[2], wide.2), (0, 3, true));
    impl<A: Key> Payload for Wide<A> {
        type Align = A::WideAlign;
    }
    assert_eq!(std::mem::size_of::<Slot<u32, Wide<u32>>>(), 32);
    assert_eq!(std::mem::align_of::<Slot<u32, Wide<u32>>>(), 32);
    assert_eq!(std::mem::size_of::<Slot<u128, Wide<u128>>>(), 64);
    assert_eq!(std::mem::align_of::<Slot<u128, Wide<u128>>>(), 64);
}

#[test]
fn successors_keep_the_memory_image_of_unchanged_prefixes() {
    // 10 000 /24s, with /16s above some of them and /28s below some, so markers and
    // shortcuts are involved.
    let original: Vec<(u32, u8, u32)> = (0..10_000u32)
        .map(|i| (0x0a00_0000 + (i << 8), 24, i))
        .chain((0..20u32).map(|i| (0x0a00_0000 + (i << 16), 16, 20_000 + i)))
        .chain((0..20u32).map(|i| (0x0a00_0000 + (i << 12) + 0x10, 28, 30_000 + i)))
        .collect();
    // One prefix removed, one added, one value changed.
    let mut prefixes = original.clone();
    prefixes.remove(500);
    prefixes.push((0x0b00_0000, 24, 77));
    prefixes[10].2 = 99_999;

    // Each build draws new hash keys: look at several. A changed prefix rewrites the run of
    // occupied slots it lands in on each level it has an entry on, and its value; runs are
    // usually a few slots long (at most MAX_RUN).
    let mut counts = Vec::new();
    let mut last = None;
    for _ in 0..9 {
        let first = PrefixMap::new(original.iter().copied());
        let same = PrefixMap::new_like(original.iter().copied(), Some(&first));
        assert_eq!(
            first.image_difference(&same),
            Some(0),
            "an unchanged set is rebuilt alike"
        );
        let next = PrefixMap::new_like(prefixes.iter().copied(), Some(&first));
        let changed = first.image_difference(&next).expect("the same shape");
        assert!(
            (3..=3 * (2 * MAX_RUN + 1)).contains(&changed),
            "{changed} slots and values differ"
        );
        counts.push(changed);
        last = Some((first, next));
    }
    counts.sort_unstable();
    assert!(
        counts[4] <= 16,
        "median of {counts:?} slots and values differ"
    );
    let (first, next) = last.expect("nine builds");

    let mut retired = first.clone();
    retired.refill(&next);
    assert_eq!(
        retired.image_difference(&PrefixMap::new_like(prefixes.iter().copied(), Some(&first))),
        Some(0)
    );
    for &(net, len, _) in &prefixes {
        for addr in [net, net | !u32::mask(len)] {
            assert_eq!(
                retired.lookup(addr).copied(),
                naive(&prefixes, addr),
                "{addr:#x}"
            );
        }
    }
    // The removed /24 now falls to the /16 above it.
    let removed = 0x0a00_0000 + (500 << 8);
    assert_eq!(retired.lookup(removed), Some(&20_001));
}

#[test]
fn default_route_and_host_routes() {
    let prefixes = (0..20u32)
        .map(|i| (0x0a00_0000 + i, 32, i))
        .chain([(0, 0, 99)]);
    let map = PrefixMap::new(prefixes);
    assert_eq!(map.lookup(0x0a00_0005), Some(&5));
    assert_eq!(map.lookup(0x0b00_0005), Some(&99));
    assert!(PrefixMap::<u32>::new([]).lookup(0).is_none());

    // The same with IPv6 /128s under a default route.
    let prefixes = (0..20u128)
        .map(|i| ((0xfd00_u128 << 112) + i, 128, i as u32))
        .chain([(0, 0, 99)]);
    let map = PrefixMap::new(prefixes);
    assert_eq!(map.lookup((0xfd00_u128 << 112) + 5), Some(&5));
    assert_eq!(map.lookup((0xfd00_u128 << 112) + 25), Some(&99));
    assert_eq!(map.lookup(0), Some(&99));
}
