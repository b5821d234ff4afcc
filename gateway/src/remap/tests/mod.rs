//! Behaviour tests of the remap table, with etherparse as the independent oracle for packet
//! building and full checksum recomputation.
//!
//! The topology follows the seed: this cluster (Europe) owns pods 10.200.0.0/16 and external
//! 10.70.0.0/16; Rome (pods 10.202.0.0/16) and Milan (pods 10.203.0.0/16) both use external
//! 10.70.0.0/16, seen here as 10.68.0.0/16 and 10.69.0.0/16.

use std::net::IpAddr;

use etherparse::{
    Icmpv4Header, Icmpv6Header, IpNumber, Ipv4Header, Ipv4Slice, Ipv6Slice, PacketBuilder,
    TcpHeader, TcpOptionElement, UdpHeader,
};
use proptest::prelude::*;

use super::fuzz::{FUZZ_MILAN as MILAN, FUZZ_ROME as ROME, fuzz_table};
use super::*;

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

// ---------------------------------------------------------------------------------------------
// Routing, source checks, ACL

#[test]
fn identical_real_cidrs_route_by_view() {
    let table = fuzz_table();
    let local = v4([10, 200, 0, 5]);
    for (view, peer) in [([10, 68, 1, 2], ROME), ([10, 69, 1, 2], MILAN)] {
        let mut pkt = build(local, v4(view), L4::Tcp, b"hello");
        assert_eq!(table.egress(&mut pkt), Verdict::Forward(peer));
        assert_eq!(
            dst_of(&pkt),
            v4([10, 70, 1, 2]),
            "dst rewritten view -> real"
        );
        assert_checksums(&pkt);
    }
    for (peer, view) in [(ROME, [10, 68, 1, 2]), (MILAN, [10, 69, 1, 2])] {
        let mut pkt = build(v4([10, 70, 1, 2]), local, L4::Udp, b"reply");
        assert_eq!(table.ingress(peer, &mut pkt), Verdict::Deliver);
        assert_eq!(src_of(&pkt), v4(view), "src rewritten real -> view");
        assert_checksums(&pkt);
    }
}

#[test]
fn unmapped_routes_pass_unchanged() {
    let table = fuzz_table();
    let original = build(v4([10, 200, 0, 5]), v4([10, 202, 3, 4]), L4::Tcp, b"x");
    let mut pkt = original.clone();
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
    assert_eq!(pkt, original);
}

#[test]
fn egress_without_route_is_dropped() {
    let table = fuzz_table();
    let mut pkt = build(v4([10, 200, 0, 5]), v4([10, 71, 0, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Drop(DropReason::NoRoute));
    let mut pkt = build(v6("fd00:200::5"), v6("fd00:70::1"), L4::Udp, b"x");
    assert_eq!(
        table.egress(&mut pkt),
        Verdict::Drop(DropReason::NoRoute),
        "a real prefix is not a view"
    );
}

#[test]
fn ingress_checks_the_peer_and_its_sources() {
    let table = fuzz_table();
    let local = v4([10, 200, 0, 5]);
    let mut pkt = build(v4([10, 203, 0, 1]), local, L4::Udp, b"x");
    assert_eq!(
        table.ingress(ROME, &mut pkt),
        Verdict::Drop(DropReason::SourceNotAllowed)
    );
    let mut pkt = build(v4([10, 202, 0, 1]), local, L4::Udp, b"x");
    assert_eq!(
        table.ingress(77, &mut pkt),
        Verdict::Drop(DropReason::UnknownPeer)
    );
    assert_eq!(
        table.ingress(MAX_PEER_ID, &mut pkt),
        Verdict::Drop(DropReason::UnknownPeer)
    );
    assert_eq!(table.ingress(ROME, &mut pkt), Verdict::Deliver);
}

#[test]
fn local_sources_are_restricted() {
    let table = fuzz_table();
    let mut pkt = build(v4([10, 201, 0, 5]), v4([10, 68, 0, 1]), L4::Udp, b"x");
    assert_eq!(
        table.egress(&mut pkt),
        Verdict::Drop(DropReason::LocalSourceNotAllowed)
    );
    let mut pkt = build(v6("fd00:201::5"), v6("fd00:68::1"), L4::Udp, b"x");
    assert_eq!(
        table.egress(&mut pkt),
        Verdict::Drop(DropReason::LocalSourceNotAllowed)
    );
    let mut pkt = build(v6("fd00:200::5"), v6("fd00:68::1"), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
}

#[test]
fn acl_applies_to_real_remote_addresses_in_both_directions() {
    let table = fuzz_table();
    let local = v4([10, 200, 0, 5]);
    // Milan's ACL allows 10.203.0.0/17 and its external 10.70.0.0/16 (seen as 10.69.0.0/16).
    let mut pkt = build(local, v4([10, 69, 9, 9]), L4::Tcp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(MILAN));
    let mut pkt = build(local, v4([10, 203, 200, 1]), L4::Tcp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Drop(DropReason::Acl));
    let mut pkt = build(v4([10, 203, 200, 1]), local, L4::Tcp, b"x");
    assert_eq!(
        table.ingress(MILAN, &mut pkt),
        Verdict::Drop(DropReason::Acl)
    );
    let mut pkt = build(v4([10, 203, 1, 1]), local, L4::Tcp, b"x");
    assert_eq!(table.ingress(MILAN, &mut pkt), Verdict::Deliver);
}

#[test]
fn empty_acl_fails_closed() {
    let mut builder = TableBuilder::new();
    builder
        .add_peer(1, &[route("10.202.0.0/16", "10.202.0.0/16")], Some(&[]))
        .expect("valid");
    let table = builder.build().expect("valid");
    let mut pkt = build(v4([10, 200, 0, 1]), v4([10, 202, 0, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Drop(DropReason::Acl));
    let mut pkt = build(v4([10, 202, 0, 1]), v4([10, 200, 0, 1]), L4::Udp, b"x");
    assert_eq!(table.ingress(1, &mut pkt), Verdict::Drop(DropReason::Acl));
}

#[test]
fn nested_views_of_different_peers_follow_the_longest_match() {
    // A hub announces 10.0.0.0/8; a direct shortcut to Rome announces 10.202.0.0/16.
    let mut builder = TableBuilder::new();
    builder
        .add_peer(1, &[route("10.0.0.0/8", "10.0.0.0/8")], None)
        .expect("valid");
    builder
        .add_peer(2, &[route("10.202.0.0/16", "10.202.0.0/16")], None)
        .expect("valid");
    let table = builder.build().expect("valid");
    let local = v4([192, 168, 0, 1]);
    let mut pkt = build(local, v4([10, 202, 1, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(2));
    let mut pkt = build(local, v4([10, 5, 1, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(1));
    // The hub may not speak for Rome's addresses: replies would go to the shortcut.
    let mut pkt = build(v4([10, 202, 1, 1]), local, L4::Udp, b"x");
    assert_eq!(
        table.ingress(1, &mut pkt),
        Verdict::Drop(DropReason::SourceNotAllowed)
    );
    let mut pkt = build(v4([10, 5, 1, 1]), local, L4::Udp, b"x");
    assert_eq!(table.ingress(1, &mut pkt), Verdict::Deliver);
}

#[test]
fn nested_real_prefixes_of_one_peer_stay_a_bijection() {
    let mut builder = TableBuilder::new();
    let routes = [
        route("10.70.0.0/16", "10.68.0.0/16"),
        route("10.70.5.0/24", "10.99.5.0/24"),
    ];
    builder.add_peer(1, &routes, None).expect("valid");
    let table = builder.build().expect("valid");
    let local = v4([10, 200, 0, 1]);
    // 10.70.5.x answers as 10.99.5.x, so 10.68.5.x is no name for it.
    let mut pkt = build(local, v4([10, 68, 5, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Drop(DropReason::NoRoute));
    let mut pkt = build(local, v4([10, 99, 5, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(1));
    assert_eq!(dst_of(&pkt), v4([10, 70, 5, 1]));
    let mut pkt = build(v4([10, 70, 5, 1]), local, L4::Udp, b"x");
    assert_eq!(table.ingress(1, &mut pkt), Verdict::Deliver);
    assert_eq!(src_of(&pkt), v4([10, 99, 5, 1]));
    let mut pkt = build(v4([10, 70, 6, 1]), local, L4::Udp, b"x");
    assert_eq!(table.ingress(1, &mut pkt), Verdict::Deliver);
    assert_eq!(src_of(&pkt), v4([10, 68, 6, 1]));
}

// ---------------------------------------------------------------------------------------------
// Validation

#[test]
fn invalid_routes_are_rejected_with_readable_errors() {
    let cases: [(&[Route], &str); 5] = [
        (
            &[route("10.70.0.0/16", "10.68.0.0/24")],
            "does not match real prefix 10.70.0.0/16",
        ),
        (
            &[route("10.70.0.0/16", "fd00::/16")],
            "view fd00::/16 does not match",
        ),
        (
            &[route("10.70.1.0/16", "10.68.0.0/16")],
            "10.70.1.0/16 has host bits set",
        ),
        (
            &[
                route("10.70.0.0/16", "10.68.0.0/16"),
                route("10.70.0.0/16", "10.67.0.0/16"),
            ],
            "real prefix 10.70.0.0/16 is mapped to two views",
        ),
        (
            &[
                route("10.70.0.0/16", "10.68.0.0/16"),
                route("10.71.0.0/16", "10.68.0.0/16"),
            ],
            "view 10.68.0.0/16 is used twice",
        ),
    ];
    for (routes, message) in cases {
        let error = TableBuilder::new()
            .add_peer(3, routes, None)
            .expect_err("invalid");
        assert!(
            error.to_string().contains(message),
            "{error} should contain {message:?}"
        );
        assert!(
            error.to_string().contains("peer 3"),
            "{error} names the peer"
        );
    }
}

#[test]
fn a_view_belongs_to_one_peer_only() {
    let mut builder = TableBuilder::new();
    builder
        .add_peer(1, &[route("10.70.0.0/16", "10.68.0.0/16")], None)
        .expect("valid");
    let error = builder
        .add_peer(2, &[route("10.70.0.0/16", "10.68.0.0/16")], None)
        .expect_err("dup");
    assert_eq!(
        error,
        RemapError::DuplicateView {
            view: net("10.68.0.0/16"),
            first: 1,
            first_real: net("10.70.0.0/16"),
            second: 2,
            second_real: net("10.70.0.0/16"),
        }
    );
    // The rejected peer left no trace: it can be added again with a free view.
    builder
        .add_peer(2, &[route("10.70.0.0/16", "10.69.0.0/16")], None)
        .expect("valid");
    assert_eq!(builder.build().expect("valid").len(), 2);
}

#[test]
fn peers_acls_and_local_prefixes_are_validated() {
    let mut builder = TableBuilder::new();
    builder.add_peer(1, &[], None).expect("valid");
    assert_eq!(
        builder.add_peer(1, &[], None),
        Err(RemapError::DuplicatePeer(1))
    );
    assert_eq!(
        builder.add_peer(MAX_PEER_ID + 1, &[], None),
        Err(RemapError::PeerIdOutOfRange(MAX_PEER_ID + 1))
    );
    let error = builder
        .add_peer(2, &[], Some(&[net("10.203.0.1/16")]))
        .expect_err("host bits");
    assert!(error.to_string().contains("10.203.0.1/16"), "{error}");
    builder.local_prefixes(&[net("10.200.0.1/16")]);
    let error = builder.build().expect_err("host bits");
    assert!(
        error.to_string().contains("local prefix 10.200.0.1/16"),
        "{error}"
    );
}

#[test]
fn repeated_identical_routes_are_idempotent_and_views_are_listed() {
    let mut builder = TableBuilder::new();
    let routes = [
        route("10.70.0.0/16", "10.68.0.0/16"),
        route("10.70.0.0/16", "10.68.0.0/16"),
    ];
    builder.add_peer(4, &routes, None).expect("valid");
    let table = builder.build().expect("valid");
    assert_eq!(table.len(), 1);
    let views: Vec<_> = table.views().collect();
    assert_eq!(views, [(4, net("10.68.0.0/16"), net("10.70.0.0/16"))]);
    assert!(RemapTable::empty().is_empty());
}

#[test]
fn drop_reason_names_are_unique_snake_case() {
    let names: std::collections::HashSet<_> =
        DropReason::ALL.iter().map(DropReason::as_str).collect();
    assert_eq!(names.len(), DropReason::ALL.len());
    assert!(
        names
            .iter()
            .all(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
    );
}

// ---------------------------------------------------------------------------------------------
// Rewriting

#[test]
fn udp_zero_checksum_stays_zero_on_ipv4() {
    let table = fuzz_table();
    let mut pkt = build(
        v4([10, 200, 0, 5]),
        v4([10, 68, 1, 2]),
        L4::UdpNoChecksum,
        b"abc",
    );
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
    assert_eq!(&pkt[26..28], &[0, 0]);
}

#[test]
fn udp_checksum_computing_to_zero_is_sent_as_ffff() {
    let table = fuzz_table();
    // Choose the last payload word so that the translated datagram sums to 0xffff, i.e. its
    // computed checksum is 0, which UDP must send as 0xffff.
    let (src, view, real) = ([10, 200, 0, 5], [10, 68, 1, 2], [10, 70, 1, 2]);
    let mut payload = [0x11u8, 0x22, 0, 0];
    let probe = build(v4(src), v4(real), L4::Udp, &payload);
    let (udp, _) = UdpHeader::from_slice(&probe[20..]).expect("UDP");
    // checksum = ~sum; adding `udp.checksum` to the last word makes the sum 0xffff.
    payload[2..4].copy_from_slice(&udp.checksum.to_be_bytes());
    let expected = build(v4(src), v4(real), L4::Udp, &payload);
    let (udp, _) = UdpHeader::from_slice(&expected[20..]).expect("UDP");
    assert_eq!(
        udp.checksum, 0xffff,
        "etherparse also sends a computed zero as 0xffff"
    );
    let mut pkt = build(v4(src), v4(view), L4::Udp, &payload);
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
    assert_eq!(pkt, expected);
}

#[test]
fn ipv4_options_are_skipped() {
    let table = fuzz_table();
    let mut header =
        Ipv4Header::new(0, 64, IpNumber::TCP, [10, 200, 0, 5], [10, 68, 1, 2]).expect("header");
    header.options = [1u8, 1, 1, 0, 7, 7, 7, 7][..].try_into().expect("options");
    let make = |dst: [u8; 4]| {
        let mut header = header.clone();
        header.destination = dst;
        let mut out = Vec::new();
        PacketBuilder::ip(etherparse::IpHeaders::Ipv4(header, Default::default()))
            .tcp(1, 2, 3, 4)
            .write(&mut out, b"with options")
            .expect("serialize");
        out
    };
    let mut pkt = make([10, 68, 1, 2]);
    assert_eq!(pkt[0] & 0x0f, 7);
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
    assert_eq!(pkt, make([10, 70, 1, 2]));
}

#[test]
fn bytes_after_the_ip_total_length_are_left_alone() {
    let table = fuzz_table();
    let mut pkt = build(v4([10, 200, 0, 5]), v4([10, 68, 1, 2]), L4::Udp, b"padded");
    pkt.extend_from_slice(&[0xee; 6]);
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
    let (translated, padding) = pkt.split_at(pkt.len() - 6);
    assert_eq!(
        translated,
        build(v4([10, 200, 0, 5]), v4([10, 70, 1, 2]), L4::Udp, b"padded")
    );
    assert_eq!(padding, [0xee; 6]);
}

#[test]
fn mss_is_clamped_on_syn_only() {
    let table = fuzz_table(); // MTU 1420: IPv4 MSS 1380, IPv6 MSS 1360
    for (src, view, real, limit) in [
        (
            v4([10, 200, 0, 5]),
            v4([10, 68, 1, 2]),
            v4([10, 70, 1, 2]),
            1380,
        ),
        (v6("fd00:200::5"), v6("fd00:68::7"), v6("fd00:70::7"), 1360),
    ] {
        let mut pkt = build(src, view, L4::TcpSyn { mss: 1460 }, b"");
        assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
        assert_eq!(
            pkt,
            build(src, real, L4::TcpSyn { mss: limit }, b""),
            "clamped to {limit}"
        );
        let mut pkt = build(src, view, L4::TcpSyn { mss: 1200 }, b"");
        table.egress(&mut pkt);
        assert_eq!(
            pkt,
            build(src, real, L4::TcpSyn { mss: 1200 }, b""),
            "a smaller MSS stays"
        );
        // Ingress clamps the SYN-ACK direction too.
        let mut pkt = build(real, src, L4::TcpSyn { mss: 9000 }, b"");
        assert_eq!(table.ingress(ROME, &mut pkt), Verdict::Deliver);
        assert_eq!(pkt, build(view, src, L4::TcpSyn { mss: limit }, b""));
    }
}

#[test]
fn mss_at_an_odd_offset_is_clamped_with_a_valid_checksum() {
    let table = fuzz_table();
    let make = |dst: [u8; 4], mss: u16| {
        let [hi, lo] = mss.to_be_bytes();
        let mut out = Vec::new();
        PacketBuilder::ipv4([10, 200, 0, 5], dst, 64)
            .tcp(1, 2, 3, 4)
            .syn()
            .options_raw(&[1, 2, 4, hi, lo, 1, 1, 0])
            .expect("options fit")
            .write(&mut out, b"")
            .expect("serialize");
        out
    };
    let mut pkt = make([10, 68, 0, 1], 1460);
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
    assert_eq!(pkt, make([10, 70, 0, 1], 1380));
}

#[test]
fn ipv4_fragments_rewrite_every_header_and_l4_only_in_the_first() {
    let table = fuzz_table();
    let payload: Vec<u8> = (0..200u8).collect();
    let fragments = |dst: [u8; 4]| {
        let whole = build(v4([10, 200, 0, 5]), v4(dst), L4::Udp, &payload);
        split_v4(&whole, 64)
    };
    let expected = fragments([10, 70, 3, 4]);
    for (mut fragment, expected) in fragments([10, 68, 3, 4]).into_iter().zip(expected) {
        assert_eq!(table.egress(&mut fragment), Verdict::Forward(ROME));
        assert_eq!(fragment, expected);
    }
}

/// Splits an IPv4 packet into fragments of at most `chunk` L4 bytes (a multiple of 8).
fn split_v4(whole: &[u8], chunk: usize) -> Vec<Vec<u8>> {
    let (header, l4) = Ipv4Header::from_slice(whole).expect("IPv4");
    let l4 = &l4[..usize::from(header.total_len) - header.header_len()];
    let count = l4.len().div_ceil(chunk);
    (0..count)
        .map(|i| {
            let part = &l4[i * chunk..l4.len().min((i + 1) * chunk)];
            let mut h = header.clone();
            h.more_fragments = i + 1 < count;
            h.fragment_offset =
                etherparse::IpFragOffset::try_new((i * chunk / 8) as u16).expect("offset");
            h.set_payload_len(part.len()).expect("len");
            h.header_checksum = h.calc_header_checksum();
            let mut out = h.to_bytes().to_vec();
            out.extend_from_slice(part);
            out
        })
        .collect()
}

/// An IPv6 UDP packet with a hop-by-hop header and, if `fragment` is `Some((offset, more))`, a
/// fragment header carrying that part of the UDP datagram.
fn v6_with_extensions(src: IpAddr, dst: IpAddr, fragment: Option<(usize, usize)>) -> Vec<u8> {
    let payload: Vec<u8> = (0..120u8).collect();
    let whole = build(src, dst, L4::Udp, &payload);
    let udp = &whole[40..];
    let mut out = whole[..40].to_vec();
    out[6] = 0; // hop-by-hop
    // Hop-by-hop: next header, length 0 (8 bytes), PadN of 4 bytes.
    let mut extensions = vec![
        if fragment.is_some() { 44 } else { 17 },
        0,
        1,
        4,
        0,
        0,
        0,
        0,
    ];
    let body = match fragment {
        Some((offset, len)) => {
            let more = offset + len < udp.len();
            let field = ((offset / 8) as u16) << 3 | u16::from(more);
            extensions.extend_from_slice(&[17, 0]);
            extensions.extend_from_slice(&field.to_be_bytes());
            extensions.extend_from_slice(&0xdead_beef_u32.to_be_bytes());
            &udp[offset..udp.len().min(offset + len)]
        }
        None => udp,
    };
    out.extend_from_slice(&extensions);
    out.extend_from_slice(body);
    let payload_len = (out.len() - 40) as u16;
    out[4..6].copy_from_slice(&payload_len.to_be_bytes());
    out
}

#[test]
fn ipv6_extension_headers_and_fragments() {
    let table = fuzz_table();
    let (src, view, real) = (v6("fd00:200::5"), v6("fd00:68::1:2"), v6("fd00:70::1:2"));
    for fragment in [None, Some((0, 64)), Some((64, 64))] {
        let mut pkt = v6_with_extensions(src, view, fragment);
        assert_eq!(
            table.egress(&mut pkt),
            Verdict::Forward(ROME),
            "{fragment:?}"
        );
        assert_eq!(pkt, v6_with_extensions(src, real, fragment), "{fragment:?}");
        if fragment.is_none() {
            assert_checksums(&pkt);
        }
    }
}

#[test]
fn unsupported_ipv6_headers_are_bad_packets() {
    let table = fuzz_table();
    let (src, view) = (v6("fd00:200::5"), v6("fd00:68::1:2"));
    // A routing header with segments left: the pseudo-header would use its final address.
    let mut pkt = v6_with_extensions(src, view, None);
    pkt[40..48].copy_from_slice(&[17, 0, 0, 1, 0, 0, 0, 0]);
    pkt[6] = 43;
    assert_eq!(table.egress(&mut pkt), Verdict::Drop(DropReason::BadPacket));
    pkt[43] = 0;
    assert_eq!(
        table.egress(&mut pkt),
        Verdict::Forward(ROME),
        "no segments left is fine"
    );
    // Authentication header: its ICV covers the addresses.
    let mut pkt = v6_with_extensions(src, view, None);
    pkt[6] = 51;
    assert_eq!(table.egress(&mut pkt), Verdict::Drop(DropReason::BadPacket));
}

#[test]
fn truncated_and_garbage_packets_are_bad_packets() {
    let table = fuzz_table();
    let pkt = build(v4([10, 200, 0, 5]), v4([10, 68, 1, 2]), L4::Tcp, b"payload");
    for len in 0..pkt.len() {
        let mut short = pkt[..len].to_vec();
        assert_eq!(
            table.egress(&mut short),
            Verdict::Drop(DropReason::BadPacket),
            "len {len}"
        );
    }
    let mut bad_ihl = pkt.clone();
    bad_ihl[0] = 0x44;
    assert_eq!(
        table.egress(&mut bad_ihl),
        Verdict::Drop(DropReason::BadPacket)
    );
    let mut bad_version = pkt.clone();
    bad_version[0] = 0x55;
    assert_eq!(
        table.egress(&mut bad_version),
        Verdict::Drop(DropReason::BadPacket)
    );
    let mut tcp_offset_too_large = pkt;
    tcp_offset_too_large[32] = 0xf0;
    assert_eq!(
        table.egress(&mut tcp_offset_too_large),
        Verdict::Drop(DropReason::BadPacket)
    );
}

// ---------------------------------------------------------------------------------------------
// ICMP errors

/// An ICMP(v6) error from `src` to `dst` quoting the first `quote` bytes of `offending`.
fn icmp_error(src: IpAddr, dst: IpAddr, offending: &[u8], quote: usize) -> Vec<u8> {
    let quoted = &offending[..quote.min(offending.len())];
    let mut out = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64)
            .icmpv4_raw(3, 3, [0; 4])
            .write(&mut out, quoted),
        (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64)
            .icmpv6_raw(1, 4, [0; 4])
            .write(&mut out, quoted),
        _ => panic!("mixed families"),
    }
    .expect("serialize");
    out
}

#[test]
fn icmp_errors_translate_the_quoted_packet() {
    let table = fuzz_table();
    let cases = [
        (v4([10, 200, 0, 5]), v4([10, 68, 1, 2]), v4([10, 70, 1, 2])),
        (v6("fd00:200::5"), v6("fd00:68::1:2"), v6("fd00:70::1:2")),
    ];
    for (local, view, real) in cases {
        let header = if local.is_ipv4() { 20 } else { 40 };
        for l4 in [L4::Udp, L4::Tcp, L4::Echo, L4::UdpNoChecksum] {
            if matches!(l4, L4::UdpNoChecksum) && local.is_ipv6() {
                continue;
            }
            // Only 8 L4 bytes quoted, a full TCP header, and the whole packet.
            for quote in [header + 8, header + 20, 1000] {
                // Rome sent `wire`; we delivered it as `delivered`; a local host rejects it.
                let wire = build(real, local, l4, b"offending payload");
                let delivered = build(view, local, l4, b"offending payload");
                let mut pkt = icmp_error(local, view, &delivered, quote);
                assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
                assert_eq!(
                    pkt,
                    icmp_error(local, real, &wire, quote),
                    "egress {l4:?} quote {quote}"
                );
                assert_checksums(&pkt);

                // We sent `sent` to Rome as `wire_out`; a Rome router rejects it.
                let sent = build(local, view, l4, b"outgoing");
                let wire_out = build(local, real, l4, b"outgoing");
                let mut pkt = icmp_error(real, local, &wire_out, quote);
                assert_eq!(table.ingress(ROME, &mut pkt), Verdict::Deliver);
                assert_eq!(
                    pkt,
                    icmp_error(view, local, &sent, quote),
                    "ingress {l4:?} quote {quote}"
                );
                assert_checksums(&pkt);
            }
        }
    }
}

#[test]
fn icmp_error_quoting_an_address_of_another_peer_keeps_it() {
    let table = fuzz_table();
    let (local, rome_view, milan_view) =
        (v4([10, 200, 0, 5]), v4([10, 68, 1, 2]), v4([10, 69, 1, 2]));
    let quoted = build(milan_view, local, L4::Udp, b"x");
    let mut pkt = icmp_error(local, rome_view, &quoted, 28);
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
    assert_eq!(&pkt[28 + 12..28 + 16], &[10, 69, 1, 2]);
    assert_checksums(&pkt);
}

#[test]
fn icmp_error_with_a_broken_quote_is_a_bad_packet() {
    let table = fuzz_table();
    let mut pkt = icmp_error(v4([10, 200, 0, 5]), v4([10, 68, 1, 2]), &[0x45, 0, 0], 3);
    assert_eq!(table.egress(&mut pkt), Verdict::Drop(DropReason::BadPacket));
}

// ---------------------------------------------------------------------------------------------
// Properties

fn l4_strategy() -> impl Strategy<Value = L4> {
    prop_oneof![
        Just(L4::Tcp),
        (500u16..=1360).prop_map(|mss| L4::TcpSyn { mss }),
        Just(L4::Udp),
        Just(L4::UdpNoChecksum),
        Just(L4::Echo),
    ]
}

/// (peer, view prefix, real prefix) reachable from the fuzz table, per family.
const V4_ROUTES: [(PeerId, [u8; 2], [u8; 2]); 4] = [
    (ROME, [10, 68], [10, 70]),
    (MILAN, [10, 69], [10, 70]),
    (ROME, [10, 202], [10, 202]),
    (MILAN, [10, 203], [10, 203]),
];

proptest! {
    #[test]
    fn egress_then_reverse_ingress_is_identity_v4(
        l4 in l4_strategy(),
        route in 0..V4_ROUTES.len(),
        local_host in any::<[u8; 2]>(),
        mut remote_host in any::<[u8; 2]>(),
        payload in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let (peer, view, real) = V4_ROUTES[route];
        if peer == MILAN && real == [10, 203] {
            remote_host[0] &= 0x7f; // inside Milan's ACL
        }
        let local = v4([10, 200, local_host[0], local_host[1]]);
        let view_addr = v4([view[0], view[1], remote_host[0], remote_host[1]]);
        let real_addr = v4([real[0], real[1], remote_host[0], remote_host[1]]);
        round_trip(l4, local, view_addr, real_addr, peer, &payload)?;
    }

    #[test]
    fn egress_then_reverse_ingress_is_identity_v6(
        l4 in l4_strategy().prop_filter("no UDP zero checksum on IPv6", |l| !matches!(l, L4::UdpNoChecksum)),
        milan in any::<bool>(),
        local_host in any::<u64>(),
        remote_host in any::<u64>(),
        payload in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let (peer, view) = if milan { (MILAN, 0xfd00_0069_u128) } else { (ROME, 0xfd00_0068) };
        let local = IpAddr::from(((0xfd00_0200_u128 << 96) | u128::from(local_host)).to_be_bytes());
        let view_addr = IpAddr::from(((view << 96) | u128::from(remote_host)).to_be_bytes());
        let real_addr = IpAddr::from(((0xfd00_0070_u128 << 96) | u128::from(remote_host)).to_be_bytes());
        round_trip(l4, local, view_addr, real_addr, peer, &payload)?;
    }

    #[test]
    fn table_lookup_matches_a_naive_model(
        raw in raw_routes(),
        probes in prop::collection::vec(any::<u32>(), 32),
    ) {
        let accepted = valid_routes(raw);
        let table = builder_for(&accepted).build().expect("valid");
        for probe in probes {
            check_egress(&table, &accepted, probe)?;
        }
    }

    /// Tables built after others (keeping their hash keys and numbering) and refilled into
    /// retired tables' memory answer exactly like fresh builds.
    #[test]
    fn successor_and_refilled_tables_match_fresh_builds(
        first in raw_routes(),
        edits in prop::collection::vec((any::<bool>(), 0u32..64, 8u8..=30, 0u32..64, 0u32..4), 1..8),
        probes in prop::collection::vec(any::<u32>(), 32),
    ) {
        let first = valid_routes(first);
        // The second state: the first one with a few routes removed (`add` false: the edit
        // picks a route by its position) and a few added.
        let removed: std::collections::HashSet<usize> = edits
            .iter()
            .enumerate()
            .filter(|(_, edit)| !edit.0)
            .map(|(i, _)| i * 7 % first.len())
            .collect();
        let added = edits
            .iter()
            .filter(|edit| edit.0)
            .map(|&(_, view, len, real, peer)| (view, len, real, peer))
            .collect();
        let kept = first
            .iter()
            .enumerate()
            .filter(|(i, _)| !removed.contains(i))
            .map(|(_, route)| *route)
            .collect();
        let second = valid_routes_after(kept, added);

        let t1 = builder_for(&first).build().expect("valid");
        let t2 = builder_for(&second).build_after(&t1).expect("valid");
        let t3 = builder_for(&first).build_after(&t2).expect("valid");
        let mut retired = t1.clone();
        retired.refill(&builder_for(&second).build_after(&t3).expect("valid"));
        let fresh = builder_for(&second).build().expect("valid");
        for probe in probes {
            check_egress(&t2, &second, probe)?;
            check_egress(&t3, &first, probe)?;
            check_egress(&retired, &second, probe)?;
            // Ingress from every peer, against a fresh build of the same state.
            let src = IpAddr::from((0x0a00_0000 | (probe & 0x00ff_ffff)).to_be_bytes());
            for peer in 0..4 {
                let mut a = build(src, v4([192, 168, 0, 1]), L4::Udp, b"p");
                let mut b = a.clone();
                prop_assert_eq!(retired.ingress(peer, &mut a), fresh.ingress(peer, &mut b));
                prop_assert_eq!(a, b);
            }
        }
        prop_assert_eq!(retired.views().collect::<Vec<_>>(), fresh.views().collect::<Vec<_>>());
    }

    #[test]
    fn garbage_never_panics_and_keeps_valid_checksums(data in prop::collection::vec(any::<u8>(), 0..200)) {
        fuzz_check(&data);
    }

    #[test]
    fn prefetch_never_panics_on_a_hashed_table(
        data in prop::collection::vec(any::<u8>(), 0..64),
        version in 0u8..16,
    ) {
        let mut builder = TableBuilder::new();
        let routes: Vec<Route> = (0..40u32)
            .flat_map(|i| {
                let v4 = IpNet::new(IpAddr::from((0x0a00_0000 | (i << 8)).to_be_bytes()), 24);
                let v6 = IpNet::new(IpAddr::from(((0xfd00_u128 << 112) | (u128::from(i) << 64)).to_be_bytes()), 64);
                [v4, v6]
            })
            .map(|net| Route::unmapped(net.expect("valid length")))
            .collect();
        builder.add_peer(1, &routes, None).expect("valid routes");
        let table = builder.build().expect("valid table");
        let mut pkt = data;
        if let Some(first) = pkt.first_mut() {
            *first = (version << 4) | (*first & 0x0f);
        }
        table.prefetch_egress(&pkt);
    }

    #[test]
    fn mutated_corpus_packets_never_panic(
        base in prop::sample::select(corpus()),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        truncate in any::<prop::sample::Index>(),
    ) {
        let mut data = base;
        // Keep the selector byte; mutate the packet.
        for (index, value) in flips {
            let i = 1 + index.index(data.len() - 1);
            data[i] ^= value;
        }
        data.truncate(1 + truncate.index(data.len()));
        let (verdict, pkt) = fuzz_check(&data);
        if matches!(verdict, Verdict::Forward(_) | Verdict::Deliver)
            && etherparse::SlicedPacket::from_ip(&data[1..]).is_ok()
        {
            prop_assert!(etherparse::SlicedPacket::from_ip(&pkt).is_ok(), "still parses");
        }
    }

    #[test]
    fn mutated_real_packets_never_panic(
        l4 in l4_strategy(),
        egress in any::<bool>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        truncate in any::<prop::sample::Index>(),
    ) {
        let mut pkt = if egress {
            build(v4([10, 200, 0, 5]), v4([10, 68, 1, 2]), l4, b"some payload bytes")
        } else {
            build(v6("fd00:70::1"), v6("fd00:200::5"), l4, b"some payload bytes")
        };
        for (index, value) in flips {
            let i = index.index(pkt.len());
            pkt[i] ^= value;
        }
        pkt.truncate(truncate.index(pkt.len() + 1));
        pkt.insert(0, if egress { 0 } else { 1 });
        fuzz_check(&pkt);
    }
}

/// Routes drawn from a small space so that views and reals nest and collide:
/// `(view bits, length, real bits, peer)`.
fn raw_routes() -> impl Strategy<Value = Vec<(u32, u8, u32, u32)>> {
    prop::collection::vec((0u32..64, 8u8..=30, 0u32..64, 0u32..4), 1..60)
}

fn raw_prefix(bits: u32, len: u8) -> IpNet {
    let addr = (0x0a00_0000 | (bits << 18) | (bits << 8))
        & u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    IpNet::new(std::net::Ipv4Addr::from(addr).into(), len).expect("valid length")
}

/// The routes of `raw` that are valid together.
fn valid_routes(raw: Vec<(u32, u8, u32, u32)>) -> Vec<(PeerId, Route)> {
    valid_routes_after(Vec::new(), raw)
}

/// `accepted` plus the routes of `raw` that are valid together with them.
fn valid_routes_after(
    mut accepted: Vec<(PeerId, Route)>,
    raw: Vec<(u32, u8, u32, u32)>,
) -> Vec<(PeerId, Route)> {
    for (view_bits, len, real_bits, peer) in raw {
        let r = Route {
            view: raw_prefix(view_bits, len),
            real: raw_prefix(real_bits, len),
        };
        let view_taken = accepted.iter().any(|(_, a)| a.view == r.view);
        let real_mapped = accepted.iter().any(|(p, a)| *p == peer && a.real == r.real);
        if !view_taken && !real_mapped {
            accepted.push((peer, r));
        }
    }
    accepted
}

/// A builder with every route of `accepted`; the routes must be valid together.
fn builder_for(accepted: &[(PeerId, Route)]) -> TableBuilder {
    let mut by_peer: std::collections::BTreeMap<PeerId, Vec<Route>> = Default::default();
    for (peer, route) in accepted {
        by_peer.entry(*peer).or_default().push(*route);
    }
    let mut builder = TableBuilder::new();
    for (peer, routes) in by_peer {
        builder
            .add_peer(peer, &routes, None)
            .expect("a valid route set is accepted");
    }
    builder
}

/// Egress of a packet to `probe` (within 10.0.0.0/8) against the naive model of `routes`.
fn check_egress(
    table: &RemapTable,
    routes: &[(PeerId, Route)],
    probe: u32,
) -> Result<(), TestCaseError> {
    let addr = 0x0a00_0000 | (probe & 0x00ff_ffff);
    let mut pkt = build(
        v4([192, 168, 0, 1]),
        IpAddr::from(addr.to_be_bytes()),
        L4::Udp,
        b"p",
    );
    let verdict = table.egress(&mut pkt);
    match naive_egress(routes, addr) {
        Some((peer, real)) => {
            prop_assert_eq!(verdict, Verdict::Forward(peer));
            prop_assert_eq!(dst_of(&pkt), IpAddr::from(real.to_be_bytes()));
        }
        None => prop_assert_eq!(verdict, Verdict::Drop(DropReason::NoRoute)),
    }
    Ok(())
}

/// The longest view containing `addr`, if that route is also the longest real match of its
/// peer for the translated address.
fn naive_egress(routes: &[(PeerId, Route)], addr: u32) -> Option<(PeerId, u32)> {
    let parts = |n: &IpNet| match n {
        IpNet::V4(n) => (u32::from(n.network()), u32::from(n.netmask())),
        IpNet::V6(_) => unreachable!(),
    };
    let (peer, r) = routes
        .iter()
        .filter(|(_, r)| addr & parts(&r.view).1 == parts(&r.view).0)
        .max_by_key(|(_, r)| r.view.prefix_len())?;
    let (real_net, mask) = parts(&r.real);
    let real = real_net | (addr & !mask);
    let owner = routes
        .iter()
        .filter(|(p, o)| p == peer && real & parts(&o.real).1 == parts(&o.real).0)
        .max_by_key(|(_, o)| o.real.prefix_len())?;
    (owner.1 == *r).then_some((*peer, real))
}

fn round_trip(
    l4: L4,
    local: IpAddr,
    view: IpAddr,
    real: IpAddr,
    peer: PeerId,
    payload: &[u8],
) -> Result<(), TestCaseError> {
    let table = fuzz_table();
    let original = build(local, view, l4, payload);
    let mut pkt = original.clone();
    prop_assert_eq!(table.egress(&mut pkt), Verdict::Forward(peer));
    prop_assert_eq!(dst_of(&pkt), real);
    prop_assert_eq!(
        &pkt,
        &build(local, real, l4, payload),
        "egress equals a fresh build"
    );
    assert_checksums(&pkt);
    swap_addresses(&mut pkt);
    prop_assert_eq!(table.ingress(peer, &mut pkt), Verdict::Deliver);
    assert_checksums(&pkt);
    swap_addresses(&mut pkt);
    prop_assert_eq!(pkt, original);
    Ok(())
}

fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/remap")
}

/// The committed corpus entries of at least two bytes (selector and packet).
fn corpus() -> Vec<Vec<u8>> {
    let entries = std::fs::read_dir(corpus_dir()).expect("corpus directory");
    let files = entries.map(|e| std::fs::read(e.expect("entry").path()).expect("corpus file"));
    files.filter(|data| data.len() >= 2).collect()
}

#[test]
fn committed_fuzz_corpus_replays_cleanly() {
    let dir = corpus_dir();
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.expect("entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        let (verdict, pkt) = fuzz_check(&data);
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("garbage") {
            assert_eq!(verdict, Verdict::Drop(DropReason::BadPacket), "{name}");
        } else {
            assert!(
                matches!(verdict, Verdict::Forward(_) | Verdict::Deliver),
                "{name}: {verdict:?}"
            );
            assert_checksums(&pkt);
        }
        replayed += 1;
    }
    assert!(replayed >= 10, "only {replayed} corpus files");
}
