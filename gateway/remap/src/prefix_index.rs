//! [`PrefixIndex`]: the crate's longest-prefix match opened to other crates, for sets that
//! are not remap routes (the gateway's admission views). A prefix maps to a `u32` the
//! caller chooses; both families are held, and a lookup costs what a remap lookup does.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::lpm::PrefixMap;

/// An immutable longest-prefix-match map from IPv4 and IPv6 prefixes to `u32` values.
#[derive(Clone, Debug, Default)]
pub struct PrefixIndex {
    v4: PrefixMap<u32, u32>,
    v6: PrefixMap<u128, u32>,
}

impl PrefixIndex {
    /// Builds the map; host bits below a prefix's length are ignored, and for a prefix
    /// given twice the last value wins.
    pub fn new(prefixes: impl IntoIterator<Item = (IpNet, u32)>) -> Self {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (prefix, value) in prefixes {
            match prefix.trunc() {
                IpNet::V4(net) => v4.push((u32::from(net.addr()), net.prefix_len(), value)),
                IpNet::V6(net) => v6.push((u128::from(net.addr()), net.prefix_len(), value)),
            }
        }
        Self {
            v4: PrefixMap::new_like(v4, None),
            v6: PrefixMap::new_like(v6, None),
        }
    }

    /// The value of the longest IPv4 prefix containing `addr`.
    #[inline]
    pub fn lookup_v4(&self, addr: u32) -> Option<u32> {
        self.v4.lookup(addr).copied()
    }

    /// The value of the longest IPv6 prefix containing `addr`.
    #[inline]
    pub fn lookup_v6(&self, addr: u128) -> Option<u32> {
        self.v6.lookup(addr).copied()
    }

    /// The value of the longest prefix containing `addr`.
    #[inline]
    pub fn lookup(&self, addr: IpAddr) -> Option<u32> {
        match addr {
            IpAddr::V4(addr) => self.lookup_v4(u32::from(addr)),
            IpAddr::V6(addr) => self.lookup_v6(u128::from(addr)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> IpNet {
        text.parse().expect("prefix")
    }

    #[test]
    fn the_longest_prefix_answers_in_both_families_small_and_hashed() {
        let mut prefixes = vec![
            (net("10.0.0.0/8"), 1),
            (net("10.2.0.0/16"), 2),
            (net("fd00::/8"), 3),
            (net("fd00:1::/32"), 4),
        ];
        // Beyond the linear size: the hashed form.
        prefixes.extend((0..20u32).map(|i| (net(&format!("172.{}.0.0/16", 16 + i)), 100 + i)));
        let index = PrefixIndex::new(prefixes);
        let ip = |text: &str| text.parse::<IpAddr>().expect("address");
        assert_eq!(index.lookup(ip("10.1.2.3")), Some(1));
        assert_eq!(index.lookup(ip("10.2.2.3")), Some(2));
        assert_eq!(index.lookup(ip("172.20.9.9")), Some(104));
        assert_eq!(index.lookup(ip("11.0.0.1")), None);
        assert_eq!(index.lookup(ip("fd00:1::5")), Some(4));
        assert_eq!(index.lookup(ip("fd00:2::5")), Some(3));
        assert_eq!(index.lookup(ip("fe80::1")), None);
    }
}
