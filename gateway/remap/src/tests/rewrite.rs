//! Header rewriting of plain packets: checksums, MSS clamping, IPv4 options and fragments,
//! IPv6 extension headers, and what counts as a bad packet.

use super::*;

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
