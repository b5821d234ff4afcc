//! A digest stable across processes and releases (versions of states, keys of selectors).

/// FNV-1a, 64 bit: stable across processes and releases, unlike `std`'s hasher.
pub(super) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
