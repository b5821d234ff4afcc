use std::net::{Ipv4Addr, SocketAddr, UdpSocket as StdUdpSocket};
use std::os::fd::AsFd;
use std::time::Duration;

use etherparse::{IpHeaders, PacketBuilder};

use super::*;
use crate::testns::{in_private_netns, ip, runtime};
use crate::udp_batch::{BatchSender, UdpOffload};
use kubetun_gateway_core::batch::SendBatch;

const SEGMENT: usize = 1372;
const SEGMENTS: usize = 40;

fn tun(offload: bool) -> AsyncDevice {
    let device = tun_rs::DeviceBuilder::new()
        .name("kt0")
        .mtu(1420)
        .offload(offload)
        .build_async()
        .expect("create TUN");
    ip(&["address", "add", "10.9.0.1/24", "dev", "kt0"]);
    ip(&["link", "set", "kt0", "up"]);
    device
}

/// One UDP GSO send of `SEGMENTS` × `SEGMENT` bytes to an address routed into the TUN.
fn send_super_datagram() -> Vec<u8> {
    let sender = StdUdpSocket::bind((Ipv4Addr::new(10, 9, 0, 1), 4000)).expect("bind");
    let offload = UdpOffload::configure(&sender, true, false);
    let payload: Vec<u8> = (0..SEGMENTS * SEGMENT).map(|i| (i / 7) as u8).collect();
    let mut batch = SendBatch::new(64, 1 << 17);
    for chunk in payload.chunks(SEGMENT) {
        assert!(batch.push(SocketAddr::from(([10, 9, 0, 2], 9999)), chunk));
    }
    let report = BatchSender::default()
        .send(&mut batch, sender.as_fd(), &offload)
        .expect("send");
    assert_eq!(report.sent, SEGMENTS);
    payload
}

/// Reads batches until the `SEGMENTS` UDP packets arrived (the interface may also emit
/// IPv6 neighbour discovery) and checks they carry `payload`, in order, as IPv4/UDP packets
/// with valid checksums. Returns how many `recv` calls delivered them and whether the device
/// has UDP offload.
fn read_segments(offload: bool) -> (usize, bool) {
    runtime().block_on(async {
        let device = tun(offload);
        let payload = send_super_datagram();
        let mut reader = TunReader::new(64);
        let mut segments: Vec<Vec<u8>> = Vec::new();
        let mut calls = 0;
        while segments.len() < SEGMENTS {
            tokio::time::timeout(Duration::from_secs(2), reader.recv(&device))
                .await
                .expect("TUN readable")
                .expect("read");
            let before = segments.len();
            for packet in reader.packets() {
                let Ok((IpHeaders::Ipv4(ipv4, _), rest)) = IpHeaders::from_slice(packet.as_ref())
                else {
                    continue;
                };
                let (udp, body) =
                    etherparse::UdpHeader::from_slice(rest.payload).expect("udp header");
                assert_eq!(
                    udp.checksum,
                    udp.calc_checksum_ipv4(&ipv4, body).expect("checksum"),
                    "UDP checksum"
                );
                assert_eq!(
                    ipv4.header_checksum,
                    ipv4.calc_header_checksum(),
                    "IPv4 checksum"
                );
                segments.push(body.to_vec());
            }
            calls += usize::from(segments.len() > before);
        }
        let expected: Vec<Vec<u8>> = payload.chunks(SEGMENT).map(<[u8]>::to_vec).collect();
        assert_eq!(segments, expected);
        (calls, device.udp_gso())
    })
}

#[test]
fn an_offloaded_read_splits_a_udp_super_packet_into_checked_segments() {
    let Some((calls, udp_gso)) = in_private_netns(|| read_segments(true)) else {
        return;
    };
    assert!(udp_gso, "kernel without TUN USO");
    assert_eq!(calls, 1, "one super-packet read");
}

#[test]
fn without_offload_a_batch_gathers_one_packet_per_read() {
    let Some((_, udp_gso)) = in_private_netns(|| read_segments(false)) else {
        return;
    };
    assert!(!udp_gso);
}

fn udp_packet(sequence: u16, dport: u16) -> Vec<u8> {
    let payload = vec![sequence as u8; 1200];
    let builder = PacketBuilder::ipv4([10, 9, 0, 2], [10, 9, 0, 1], 64).udp(5000, dport);
    let mut packet = Vec::with_capacity(builder.size(payload.len()));
    builder.write(&mut packet, &payload).expect("build");
    packet
}

/// Writes `PACKETS` same-flow UDP packets to a local socket through a [`TunWriter`];
/// returns what the socket received and the bytes the writer reported.
fn write_flow(offload: bool) -> (Vec<Vec<u8>>, usize, bool) {
    const PACKETS: u16 = 20;
    runtime().block_on(async {
        let device = tun(offload);
        let receiver = StdUdpSocket::bind((Ipv4Addr::new(10, 9, 0, 1), 0)).expect("bind");
        receiver
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let port = receiver.local_addr().expect("addr").port();
        let mut writer = TunWriter::new(32);
        for sequence in 0..PACKETS {
            assert!(writer.push(&udp_packet(sequence, port)));
        }
        assert_eq!(writer.len(), usize::from(PACKETS));
        let written = writer.flush(&device).await.expect("write");
        assert!(writer.is_empty());
        let mut received = Vec::new();
        let mut buffer = [0u8; 2048];
        for _ in 0..PACKETS {
            let len = receiver.recv(&mut buffer).expect("datagram");
            received.push(buffer[..len].to_vec());
        }
        (received, written, device.udp_gso())
    })
}

#[test]
fn an_offloaded_write_coalesces_a_flow_into_one_super_packet() {
    let Some((received, written, udp_gso)) = in_private_netns(|| write_flow(true)) else {
        return;
    };
    let expected: Vec<Vec<u8>> = (0..20u8).map(|s| vec![s; 1200]).collect();
    assert_eq!(received, expected);
    assert!(udp_gso, "kernel without TUN USO");
    // One write: a virtio header, one IPv4 + UDP header, all payloads.
    assert_eq!(written, VIRTIO_NET_HDR_LEN + 20 + 8 + 20 * 1200);
}

#[test]
fn without_offload_every_packet_is_written_as_is() {
    let Some((received, written, _)) = in_private_netns(|| write_flow(false)) else {
        return;
    };
    let expected: Vec<Vec<u8>> = (0..20u8).map(|s| vec![s; 1200]).collect();
    assert_eq!(received, expected);
    assert_eq!(written, 20 * (20 + 8 + 1200));
}

#[test]
fn a_full_writer_refuses_more_packets_until_flushed() {
    let mut writer = TunWriter::new(2);
    assert!(writer.push(&[0x45; 40]));
    assert!(writer.push(&[0x45; 40]));
    assert!(writer.is_full());
    assert!(!writer.push(&[0x45; 40]));
    assert!(writer.space().is_none());
}
