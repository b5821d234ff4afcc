//! The remap fuzz oracle, shared by the cargo-fuzz target and the stable test suite.
//!
//! [`fuzz_check`] feeds arbitrary bytes through a fixed table built from the seed topology and
//! asserts the properties that must hold for any input: no panic, the length never changes, a
//! dropped packet is reported rather than half-forwarded, and every checksum that was valid
//! before the rewrite is valid after it (checked by a full recompute written independently of
//! the incremental update).

use std::sync::OnceLock;

use ipnet::IpNet;

use super::checksum::fold;
use super::route::{PeerId, Route};
use super::table::{RemapTable, TableBuilder};
use super::verdict::{DropReason, Verdict};

/// Peer ids of the fuzz table.
pub(crate) const FUZZ_ROME: PeerId = 1;
/// See [`FUZZ_ROME`].
pub(crate) const FUZZ_MILAN: PeerId = 2;

/// The fixed table of the fuzz target: Rome and Milan both own 10.70.0.0/16 on the wire, seen
/// locally as 10.68.0.0/16 and 10.69.0.0/16; their pod CIDRs are not remapped; Milan has an ACL
/// and an IPv6 route; local pods are 10.200.0.0/16 and fd00:200::/64; the MTU is 1420.
pub(crate) fn fuzz_table() -> &'static RemapTable {
    static TABLE: OnceLock<RemapTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let net = |s: &str| s.parse::<IpNet>().unwrap_or_else(|e| panic!("{s}: {e}"));
        let route = |real: &str, view: &str| Route {
            real: net(real),
            view: net(view),
        };
        let mut builder = TableBuilder::new();
        builder
            .local_prefixes(&[
                net("10.200.0.0/16"),
                net("10.70.0.0/16"),
                net("fd00:200::/64"),
            ])
            .mss_clamp_mtu(Some(1420));
        let rome = [
            route("10.202.0.0/16", "10.202.0.0/16"),
            route("10.70.0.0/16", "10.68.0.0/16"),
            route("fd00:70::/64", "fd00:68::/64"),
        ];
        let milan = [
            route("10.203.0.0/16", "10.203.0.0/16"),
            route("10.70.0.0/16", "10.69.0.0/16"),
            route("fd00:70::/64", "fd00:69::/64"),
        ];
        let milan_acl = [
            net("10.203.0.0/17"),
            net("10.70.0.0/16"),
            net("fd00:70::/64"),
        ];
        let result = builder
            .add_peer(FUZZ_ROME, &rome, None)
            .and_then(|()| builder.add_peer(FUZZ_MILAN, &milan, Some(&milan_acl)))
            .and_then(|()| builder.build());
        result.unwrap_or_else(|e| panic!("fuzz table: {e}"))
    })
}

/// Runs `data` through the fuzz table and checks the invariants; panics when one is broken.
///
/// The first byte picks the direction (bit 0: egress or ingress) and the ingress peer; the rest
/// is the packet. Returns the verdict and the packet after translation.
#[doc(hidden)]
pub fn fuzz_check(data: &[u8]) -> (Verdict, Vec<u8>) {
    let Some((&selector, input)) = data.split_first() else {
        return (Verdict::Drop(DropReason::BadPacket), Vec::new());
    };
    let table = fuzz_table();
    let mut pkt = input.to_vec();
    let verdict = if selector & 1 == 0 {
        // A hint only, but it reads the packet too: it must not panic on any bytes.
        table.prefetch_egress(&pkt);
        table.egress(&mut pkt)
    } else {
        let peer = if selector & 2 == 0 {
            FUZZ_ROME
        } else {
            FUZZ_MILAN
        };
        table.ingress(peer, &mut pkt)
    };
    assert_eq!(pkt.len(), input.len(), "the packet length never changes");
    match verdict {
        Verdict::Forward(peer) => {
            assert!(selector & 1 == 0 && (peer == FUZZ_ROME || peer == FUZZ_MILAN));
            check_checksums(input, &pkt);
        }
        Verdict::Deliver => {
            assert!(selector & 1 == 1);
            check_checksums(input, &pkt);
        }
        Verdict::Drop(_) => {}
    }
    (verdict, pkt)
}

/// Every checksum valid in `before` is valid in `after`.
fn check_checksums(before: &[u8], after: &[u8]) {
    let valid_before = checksum_validity(before);
    let valid_after = checksum_validity(after);
    for (i, (b, a)) in valid_before.iter().zip(&valid_after).enumerate() {
        assert!(
            !(*b == Some(true) && *a != Some(true)),
            "checksum {i} was valid and is not: {valid_before:?} -> {valid_after:?}"
        );
    }
}

/// Validity of `[IP header, L4, quoted IP header, quoted L4]`; `None` where not applicable.
fn checksum_validity(pkt: &[u8]) -> [Option<bool>; 4] {
    let mut result = [None; 4];
    match pkt.first().map(|b| b >> 4) {
        Some(4) => {
            let Some(ip) = v4_header(pkt) else {
                return result;
            };
            result[0] = Some(sum(&pkt[..ip.header_len]) == 0xffff);
            if ip.whole_datagram {
                let l4 = &pkt[ip.header_len..ip.total_len];
                result[1] = l4_valid(4, ip.protocol, l4, pseudo_v4(pkt, ip.protocol, l4.len()));
                if ip.protocol == 1 && l4.len() >= 8 && matches!(l4[0], 3 | 4 | 5 | 11 | 12) {
                    let quoted = &l4[8..];
                    if let Some(q) = v4_quoted_header(quoted) {
                        result[2] = Some(sum(&quoted[..q]) == 0xffff);
                    }
                }
            }
        }
        Some(6) => {
            let Some((protocol, offset, end)) = v6_transport(pkt) else {
                return result;
            };
            let l4 = &pkt[offset..end];
            result[1] = l4_valid(6, protocol, l4, pseudo_v6(pkt, protocol, l4.len()));
        }
        _ => {}
    }
    result
}

struct V4Header {
    header_len: usize,
    total_len: usize,
    protocol: u8,
    /// Not a fragment: the L4 checksum covers exactly these bytes.
    whole_datagram: bool,
}

fn v4_header(pkt: &[u8]) -> Option<V4Header> {
    let header_len = usize::from(pkt.first()? & 0x0f) * 4;
    let total_len = usize::from(u16::from_be_bytes([*pkt.get(2)?, *pkt.get(3)?]));
    if pkt.len() < 20 || header_len < 20 || total_len < header_len || total_len > pkt.len() {
        return None;
    }
    let flags_fragment = u16::from_be_bytes([pkt[6], pkt[7]]);
    Some(V4Header {
        header_len,
        total_len,
        protocol: pkt[9],
        whole_datagram: flags_fragment & 0x3fff == 0,
    })
}

fn v4_quoted_header(quoted: &[u8]) -> Option<usize> {
    let header_len = usize::from(quoted.first()? & 0x0f) * 4;
    (quoted[0] >> 4 == 4 && header_len >= 20 && header_len <= quoted.len()).then_some(header_len)
}

/// The upper-layer protocol, its offset and the packet end of an unfragmented IPv6 packet.
fn v6_transport(pkt: &[u8]) -> Option<(u8, usize, usize)> {
    let end = 40 + usize::from(u16::from_be_bytes([*pkt.get(4)?, *pkt.get(5)?]));
    if pkt.len() < end {
        return None;
    }
    let (mut next, mut offset) = (pkt[6], 40);
    loop {
        match next {
            0 | 43 | 60 => {
                next = *pkt.get(offset)?;
                offset += (usize::from(*pkt.get(offset + 1)?) + 1) * 8;
            }
            44 => return None,
            protocol => return (offset <= end).then_some((protocol, offset, end)),
        }
    }
}

fn pseudo_v4(pkt: &[u8], protocol: u8, l4_len: usize) -> u64 {
    sum_raw(&pkt[12..20]) + u64::from(protocol) + l4_len as u64
}

fn pseudo_v6(pkt: &[u8], protocol: u8, l4_len: usize) -> u64 {
    sum_raw(&pkt[8..40]) + u64::from(protocol) + l4_len as u64
}

/// ICMPv6's checksum covers a pseudo-header only under IPv6; protocol 58 inside IPv4 is opaque
/// payload, which the rewrite rightly leaves alone.
fn l4_valid(ip_version: u8, protocol: u8, l4: &[u8], pseudo: u64) -> Option<bool> {
    match protocol {
        6 if l4.len() >= 20 => Some(fold(pseudo + sum_raw(l4)) == 0xffff),
        17 if l4.len() >= 8 && u16::from_be_bytes([l4[6], l4[7]]) != 0 => {
            Some(fold(pseudo + sum_raw(l4)) == 0xffff)
        }
        58 if ip_version == 6 && l4.len() >= 4 => Some(fold(pseudo + sum_raw(l4)) == 0xffff),
        1 if l4.len() >= 4 => Some(sum(l4) == 0xffff),
        _ => None,
    }
}

fn sum(bytes: &[u8]) -> u16 {
    fold(sum_raw(bytes))
}

fn sum_raw(bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(2);
    let mut total: u64 = chunks
        .by_ref()
        .map(|w| u64::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    if let [last] = chunks.remainder() {
        total += u64::from(*last) << 8;
    }
    total
}
