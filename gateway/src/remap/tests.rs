//! Behaviour tests of the remap table against etherparse-built packets.

use super::*;

fn net(s: &str) -> IpNet {
    s.parse().expect("valid prefix")
}

#[test]
fn overlapping_reals_route_by_view() {
    let table = fuzz::fuzz_table();
    let mut pkt = etherparse_tcp_v4([10, 200, 0, 5], [10, 69, 1, 2]);
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(fuzz::FUZZ_MILAN));
    assert_eq!(&pkt[16..20], &[10, 70, 1, 2]);
    let _ = net("10.0.0.0/8");
}

fn etherparse_tcp_v4(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let builder = etherparse::PacketBuilder::ipv4(src, dst, 64).tcp(40000, 80, 1, 1000);
    let payload = [7u8; 100];
    let mut out = Vec::new();
    builder.write(&mut out, &payload).expect("serialize");
    out
}
