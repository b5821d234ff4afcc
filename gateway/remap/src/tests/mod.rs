//! Behaviour tests of the remap table, with etherparse as the independent oracle for packet
//! building and full checksum recomputation.
//!
//! The topology follows the seed: this cluster (Europe) owns pods 10.200.0.0/16 and external
//! 10.70.0.0/16; Rome (pods 10.202.0.0/16) and Milan (pods 10.203.0.0/16) both use external
//! 10.70.0.0/16, seen here as 10.68.0.0/16 and 10.69.0.0/16.
//!
//! This module holds what the topic modules share: the packet builders, the checksum oracle
//! and the transport strategy that several property tests draw from.

mod icmp;
mod properties;
mod rewrite;
mod robustness;
mod routing;
mod validation;

use std::net::IpAddr;

use etherparse::{
    Icmpv4Header, Icmpv6Header, IpNumber, Ipv4Header, Ipv4Slice, Ipv6Slice, PacketBuilder,
    TcpHeader, TcpOptionElement, UdpHeader,
};
use proptest::prelude::*;

use super::fuzz::{FUZZ_MILAN as MILAN, FUZZ_ROME as ROME, fuzz_table};
use super::*;
use ipnet::IpNet;

fn net(s: &str) -> IpNet {
    s.parse().expect("valid prefix")
}

fn route(real: &str, view: &str) -> Route {
    Route {
        real: net(real),
        view: net(view),
    }
}

fn v4(a: [u8; 4]) -> IpAddr {
    IpAddr::from(a)
}

fn v6(s: &str) -> IpAddr {
    s.parse().expect("valid address")
}

// ---------------------------------------------------------------------------------------------
// Packet building and the etherparse oracle

#[derive(Clone, Copy, Debug)]
enum L4 {
    Tcp,
    TcpSyn {
        mss: u16,
    },
    Udp,
    /// IPv4 UDP with checksum 0 ("no checksum").
    UdpNoChecksum,
    Echo,
}

fn build(src: IpAddr, dst: IpAddr, l4: L4, payload: &[u8]) -> Vec<u8> {
    let ip = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64),
        (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64),
        _ => panic!("mixed families"),
    };
    let mut out = Vec::new();
    match l4 {
        L4::Tcp => ip.tcp(40000, 443, 7, 64000).ack(9).write(&mut out, payload),
        L4::TcpSyn { mss } => ip
            .tcp(40000, 443, 7, 64000)
            .syn()
            .options(&[
                TcpOptionElement::MaximumSegmentSize(mss),
                TcpOptionElement::Noop,
                TcpOptionElement::WindowScale(7),
            ])
            .expect("options fit")
            .write(&mut out, payload),
        L4::Udp | L4::UdpNoChecksum => ip.udp(5353, 53).write(&mut out, payload),
        L4::Echo if src.is_ipv4() => ip.icmpv4_echo_request(1, 2).write(&mut out, payload),
        L4::Echo => ip.icmpv6_echo_request(1, 2).write(&mut out, payload),
    }
    .expect("serialize");
    if matches!(l4, L4::UdpNoChecksum) {
        let l4_start = usize::from(out[0] & 0x0f) * 4;
        out[l4_start + 6..l4_start + 8].copy_from_slice(&[0, 0]);
    }
    out
}

/// Recomputes every checksum of `pkt` with etherparse and asserts that the packet carries it.
fn assert_checksums(pkt: &[u8]) {
    if pkt[0] >> 4 == 4 {
        let slice = Ipv4Slice::from_slice(pkt).expect("etherparse re-parses the IPv4 packet");
        let (header, _) = Ipv4Header::from_slice(pkt).expect("IPv4 header");
        assert_eq!(
            header.header_checksum,
            header.calc_header_checksum(),
            "IPv4 header checksum"
        );
        let ip = slice.payload();
        if ip.fragmented {
            return;
        }
        let (src, dst) = (slice.header().source(), slice.header().destination());
        match ip.ip_number {
            IpNumber::TCP => {
                let (tcp, data) = TcpHeader::from_slice(ip.payload).expect("TCP");
                let expected = tcp.calc_checksum_ipv4_raw(src, dst, data).expect("size");
                assert_eq!(tcp.checksum, expected, "TCP checksum");
            }
            IpNumber::UDP => {
                let (udp, data) = UdpHeader::from_slice(ip.payload).expect("UDP");
                if udp.checksum != 0 {
                    let expected = udp.calc_checksum_ipv4_raw(src, dst, data).expect("size");
                    assert_eq!(udp.checksum, expected, "UDP checksum");
                }
            }
            IpNumber::ICMP => {
                let (icmp, data) = Icmpv4Header::from_slice(ip.payload).expect("ICMP");
                assert_eq!(
                    icmp.checksum,
                    icmp.icmp_type.calc_checksum(data),
                    "ICMP checksum"
                );
            }
            other => panic!("unexpected protocol {other:?}"),
        }
    } else {
        let slice = Ipv6Slice::from_slice(pkt).expect("etherparse re-parses the IPv6 packet");
        let ip = slice.payload();
        if ip.fragmented {
            return;
        }
        let (src, dst) = (slice.header().source(), slice.header().destination());
        match ip.ip_number {
            IpNumber::TCP => {
                let (tcp, data) = TcpHeader::from_slice(ip.payload).expect("TCP");
                let expected = tcp.calc_checksum_ipv6_raw(src, dst, data).expect("size");
                assert_eq!(tcp.checksum, expected, "TCP checksum");
            }
            IpNumber::UDP => {
                let (udp, data) = UdpHeader::from_slice(ip.payload).expect("UDP");
                let expected = udp.calc_checksum_ipv6_raw(src, dst, data).expect("size");
                assert_eq!(udp.checksum, expected, "UDP checksum");
            }
            IpNumber::IPV6_ICMP => {
                let (icmp, data) = Icmpv6Header::from_slice(ip.payload).expect("ICMPv6");
                let expected = icmp.icmp_type.calc_checksum(src, dst, data).expect("size");
                assert_eq!(icmp.checksum, expected, "ICMPv6 checksum");
            }
            other => panic!("unexpected protocol {other:?}"),
        }
    }
}

/// Swaps source and destination address (a checksum-neutral change), as a reply would carry.
fn swap_addresses(pkt: &mut [u8]) {
    let (src, dst, len) = if pkt[0] >> 4 == 4 {
        (12, 16, 4)
    } else {
        (8, 24, 16)
    };
    let mut tmp = [0u8; 16];
    tmp[..len].copy_from_slice(&pkt[src..src + len]);
    pkt.copy_within(dst..dst + len, src);
    pkt[dst..dst + len].copy_from_slice(&tmp[..len]);
}

fn dst_of(pkt: &[u8]) -> IpAddr {
    if pkt[0] >> 4 == 4 {
        v4(pkt[16..20].try_into().expect("4 bytes"))
    } else {
        IpAddr::from(<[u8; 16]>::try_from(&pkt[24..40]).expect("16 bytes"))
    }
}

fn src_of(pkt: &[u8]) -> IpAddr {
    if pkt[0] >> 4 == 4 {
        v4(pkt[12..16].try_into().expect("4 bytes"))
    } else {
        IpAddr::from(<[u8; 16]>::try_from(&pkt[8..24]).expect("16 bytes"))
    }
}

/// The transports the property tests draw from: each takes its own checksum or clamping path.
fn l4_strategy() -> impl Strategy<Value = L4> {
    prop_oneof![
        Just(L4::Tcp),
        (500u16..=1360).prop_map(|mss| L4::TcpSyn { mss }),
        Just(L4::Udp),
        Just(L4::UdpNoChecksum),
        Just(L4::Echo),
    ]
}
