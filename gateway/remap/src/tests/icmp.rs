//! ICMP(v6) errors, whose quoted packet is translated in the reverse direction.

use super::*;

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
