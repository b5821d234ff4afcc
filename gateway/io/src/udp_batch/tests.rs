use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket as StdUdpSocket};
use std::time::Duration;

use super::*;
use crate::testns::{in_private_netns, ip, runtime};
use kubetun_gateway_core::endpoint::LocalAddr;

const WG_DATAGRAM: usize = 1452;

/// A datagram whose bytes encode its sequence number.
fn datagram(sequence: u32, len: usize) -> Vec<u8> {
    let mut bytes = vec![(sequence % 251) as u8; len];
    bytes[..4].copy_from_slice(&sequence.to_le_bytes());
    bytes
}

#[test]
fn socket_addresses_round_trip_through_the_kernel_layout() {
    for addr in [
        "192.0.2.7:51820".parse::<SocketAddr>().expect("v4"),
        "[2001:db8::1]:443".parse().expect("v6"),
        SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 9, 7, 3)),
    ] {
        let (raw, len) = RawAddr::encode(addr);
        assert_eq!(raw.decode(len), Some(addr));
    }
    assert_eq!(RawAddr::EMPTY.decode(0), None);
}

/// Sends `datagrams` from `sender` to `receiver` through a [`SendBatch`] and receives them
/// through a [`RecvBatch`]; returns what arrived and how many messages carried it.
fn round_trip(
    want_gso: bool,
    want_gro: bool,
    datagrams: &[Vec<u8>],
) -> (Vec<Vec<u8>>, usize, UdpOffload, UdpOffload) {
    let receiver = StdUdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let sender = StdUdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    receiver
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let send_offload = UdpOffload::configure(&sender, want_gso, false);
    let recv_offload = UdpOffload::configure(&receiver, false, want_gro);
    let dest = receiver.local_addr().expect("addr");
    let mut batch = SendBatch::new(MAX_BATCH, 1 << 20);
    for bytes in datagrams {
        assert!(batch.push(dest, bytes));
    }
    let report = BatchSender::default()
        .send(&mut batch, sender.as_fd(), &send_offload)
        .expect("send");
    assert_eq!(report.sent, datagrams.len());
    assert_eq!(report.failed, 0);
    assert!(batch.is_empty());

    let mut received = Vec::new();
    let mut messages = 0;
    let mut recv = RecvBatch::new(8);
    receiver.set_nonblocking(true).expect("nonblocking");
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while received.len() < datagrams.len() && std::time::Instant::now() < deadline {
        match BatchReceiver::default().recv(&mut recv, receiver.as_fd()) {
            Ok(count) => {
                messages += count;
                assert_eq!(recv.rejected(), 0);
                for datagram in recv.datagrams() {
                    assert_eq!(datagram.source, sender.local_addr().expect("addr"));
                    assert_eq!(recv.get(datagram.position).bytes, datagram.bytes);
                    received.push(datagram.bytes.to_vec());
                }
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(error) => panic!("recv: {error}"),
        }
    }
    (received, messages, send_offload, recv_offload)
}

fn burst() -> Vec<Vec<u8>> {
    // Small enough for a default receive buffer to hold it whole.
    let mut datagrams: Vec<Vec<u8>> = (0..40).map(|s| datagram(s, WG_DATAGRAM)).collect();
    datagrams.push(datagram(40, 300));
    datagrams.push(datagram(41, WG_DATAGRAM));
    datagrams
}

#[test]
fn gso_and_gro_deliver_every_datagram_intact_in_fewer_messages() {
    let Some((received, messages, send, recv)) =
        in_private_netns(|| round_trip(true, true, &burst()))
    else {
        return;
    };
    assert!(send.gso() && recv.gro(), "kernel without UDP GSO/GRO");
    assert_eq!(received, burst());
    assert!(
        messages < burst().len() / 10,
        "{messages} messages: not coalesced"
    );
}

#[test]
fn without_offloads_every_datagram_is_its_own_message() {
    let Some((received, messages, send, recv)) =
        in_private_netns(|| round_trip(false, false, &burst()))
    else {
        return;
    };
    assert!(!send.gso() && !recv.gro());
    assert_eq!(received, burst());
    assert_eq!(messages, burst().len());
}

#[test]
fn gso_sends_are_split_by_the_kernel_for_a_receiver_without_gro() {
    let Some((received, messages, _, _)) = in_private_netns(|| round_trip(true, false, &burst()))
    else {
        return;
    };
    assert_eq!(received, burst());
    assert_eq!(messages, burst().len());
}

#[test]
fn batches_to_several_endpoints_and_families_go_out_in_one_call() {
    let result = in_private_netns(|| {
        let sender4 = StdUdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let a = StdUdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let b = StdUdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let offload = UdpOffload::configure(&sender4, true, false);
        let mut batch = SendBatch::new(MAX_BATCH, 1 << 20);
        for sequence in 0..6 {
            let dest = if sequence % 2 == 0 { &a } else { &b };
            assert!(batch.push(dest.local_addr().expect("addr"), &datagram(sequence, 64)));
        }
        let report = BatchSender::default()
            .send(&mut batch, sender4.as_fd(), &offload)
            .expect("send");
        let mut seen = Vec::new();
        for socket in [&a, &b] {
            socket.set_nonblocking(true).expect("nonblocking");
            let mut recv = RecvBatch::new(16);
            let count = BatchReceiver::default()
                .recv(&mut recv, socket.as_fd())
                .expect("recv");
            seen.push((count, recv.datagrams().count()));
        }
        (report, seen)
    });
    let Some((report, seen)) = result else { return };
    assert_eq!(report.sent, 6);
    assert_eq!(report.calls, 1);
    assert_eq!(seen, [(3, 3), (3, 3)]);
}

#[test]
fn a_refused_message_is_counted_and_the_rest_still_go_out() {
    let result = in_private_netns(|| {
        let sender = StdUdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let receiver = StdUdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let offload = UdpOffload::configure(&sender, true, false);
        let mut batch = SendBatch::new(MAX_BATCH, 1 << 20);
        let unreachable: SocketAddr = "[2001:db8::1]:9".parse().expect("v6");
        assert!(batch.push(receiver.local_addr().expect("addr"), &datagram(0, 64)));
        // An IPv6 destination on an IPv4 socket is refused by the kernel.
        assert!(batch.push(unreachable, &datagram(1, 64)));
        assert!(batch.push(receiver.local_addr().expect("addr"), &datagram(2, 64)));
        let mut kernel = BatchSender::default();
        let report = kernel
            .send(&mut batch, sender.as_fd(), &offload)
            .expect("send");
        let error = kernel.take_last_error();
        receiver.set_nonblocking(true).expect("nonblocking");
        let mut recv = RecvBatch::new(16);
        let received: Vec<Vec<u8>> =
            match BatchReceiver::default().recv(&mut recv, receiver.as_fd()) {
                Ok(_) => recv.datagrams().map(|d| d.bytes.to_vec()).collect(),
                Err(_) => Vec::new(),
            };
        (report, error.is_some(), received)
    });
    let Some((report, had_error, received)) = result else {
        return;
    };
    assert_eq!((report.sent, report.failed), (2, 1));
    assert!(had_error);
    assert_eq!(received, [datagram(0, 64), datagram(2, 64)]);
}

#[test]
fn async_send_and_receive_wait_for_readiness() {
    const ROUNDS: u32 = 5;
    const PER_ROUND: u32 = 40;
    let result = in_private_netns(|| {
        runtime().block_on(async {
            let receiver = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .expect("bind");
            let sender = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .expect("bind");
            let send_offload = UdpOffload::configure(&sender, true, false);
            let _gro = UdpOffload::configure(&receiver, false, true);
            let dest = receiver.local_addr().expect("addr");
            let mut recv = RecvBatch::new(8);
            let mut batch = SendBatch::new(MAX_BATCH, 1 << 20);
            let mut receiver_batch = BatchReceiver::default();
            let mut sender_batch = BatchSender::default();
            let mut received = Vec::new();
            for round in 0..ROUNDS {
                for sequence in 0..PER_ROUND {
                    let bytes = datagram(round * PER_ROUND + sequence, WG_DATAGRAM);
                    assert!(batch.push(dest, &bytes));
                }
                sender_batch
                    .send_to(&mut batch, &sender, &send_offload)
                    .await
                    .expect("send");
                while received.len() < ((round + 1) * PER_ROUND) as usize {
                    tokio::time::timeout(
                        Duration::from_secs(2),
                        receiver_batch.recv_from(&mut recv, &receiver),
                    )
                    .await
                    .expect("datagrams within 2 s")
                    .expect("recv");
                    received.extend(recv.datagrams().map(|d| d.bytes.to_vec()));
                }
            }
            received
        })
    });
    let Some(received) = result else { return };
    let expected: Vec<Vec<u8>> = (0..ROUNDS * PER_ROUND)
        .map(|s| datagram(s, WG_DATAGRAM))
        .collect();
    assert_eq!(received, expected);
}

/// What [`sticky_sources`] saw.
#[derive(Debug)]
struct Sticky {
    /// The local address the first datagram arrived at.
    arrived_at: Option<LocalAddr>,
    /// Sources the peer saw: a batch send and a single send pinned to that address, a send
    /// left to the kernel, then a batch and a single send after the address was removed.
    pinned: (IpAddr, IpAddr),
    kernel_choice: IpAddr,
    after_removal: (IpAddr, IpAddr),
    unpinned: usize,
}

/// In the current namespace: our socket on the unspecified address of `pinned`'s family,
/// a peer on `peer`; the peer sends to `pinned`, we answer through each send path.
fn sticky_sources(peer: IpAddr, pinned: IpAddr) -> Sticky {
    let domain = socket2::Domain::for_address(SocketAddr::new(peer, 0));
    let ours = socket2::Socket::new(domain, socket2::Type::DGRAM, None).expect("socket");
    let unspecified: IpAddr = if peer.is_ipv6() {
        ours.set_only_v6(true).expect("v6 only");
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    ours.bind(&SocketAddr::new(unspecified, 0).into())
        .expect("bind");
    let ours = StdUdpSocket::from(ours);
    ours.set_nonblocking(true).expect("nonblocking");
    receive_local_addresses(ours.as_fd(), peer.is_ipv6()).expect("pktinfo");
    let port = ours.local_addr().expect("addr").port();
    let remote = StdUdpSocket::bind((peer, 0)).expect("bind peer");
    remote
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    remote.send_to(b"hello", (pinned, port)).expect("send");

    let mut recv = RecvBatch::new(4);
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let reply = loop {
        match BatchReceiver::default().recv(&mut recv, ours.as_fd()) {
            Ok(_) => break recv.datagrams().next().expect("a datagram").reply_to(),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                assert!(std::time::Instant::now() < deadline, "nothing arrived");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(error) => panic!("recv: {error}"),
        }
    };
    let seen = || {
        let mut buf = [0u8; 64];
        remote.recv_from(&mut buf).expect("a reply").1.ip()
    };
    let batch_send = |to: Endpoint| {
        let mut batch = SendBatch::new(4, 4096);
        assert!(batch.push(to, b"batch"));
        let mut kernel = BatchSender::default();
        let report = kernel
            .send(&mut batch, ours.as_fd(), &UdpOffload::none())
            .expect("send");
        assert_eq!(
            report.sent,
            1,
            "{report:?} {:?} to {to}",
            kernel.take_last_error()
        );
        report.unpinned
    };
    let mut unpinned = batch_send(reply);
    let pinned_batch = seen();
    assert!(!send_datagram(ours.as_fd(), b"single", reply).expect("send"));
    let pinned_single = seen();
    unpinned += batch_send(Endpoint::unpinned(reply.remote));
    let kernel_choice = seen();
    ip(&["addr", "del", &host_prefix(pinned), "dev", "lo"]);
    unpinned += batch_send(reply);
    let removed_batch = seen();
    assert!(
        send_datagram(ours.as_fd(), b"single", reply).expect("send"),
        "unpinned"
    );
    let removed_single = seen();
    Sticky {
        arrived_at: reply.local,
        pinned: (pinned_batch, pinned_single),
        kernel_choice,
        after_removal: (removed_batch, removed_single),
        unpinned,
    }
}

fn host_prefix(ip: IpAddr) -> String {
    format!("{ip}/{}", if ip.is_ipv6() { 128 } else { 32 })
}

#[test]
fn replies_leave_from_the_address_the_peer_sent_to_until_it_is_gone() {
    for (peer, pinned, other) in [
        ("10.9.9.9", "10.9.9.2", "10.9.9.1"),
        ("fd00:9::9", "fd00:9::2", "fd00:9::1"),
    ] {
        let (peer, pinned, other): (IpAddr, IpAddr, IpAddr) = (
            peer.parse().expect("ip"),
            pinned.parse().expect("ip"),
            other.parse().expect("ip"),
        );
        let Some(sticky) = in_private_netns(move || {
            for address in [other, pinned, peer] {
                ip(&["addr", "add", &host_prefix(address), "dev", "lo", "nodad"]);
            }
            sticky_sources(peer, pinned)
        }) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "needs a network namespace"
            );
            return;
        };
        assert_eq!(
            sticky.arrived_at.map(|local| local.ip),
            Some(pinned),
            "{sticky:?}"
        );
        assert_eq!(sticky.pinned, (pinned, pinned), "{sticky:?}");
        assert_ne!(
            sticky.kernel_choice, pinned,
            "the kernel would have picked another"
        );
        assert_ne!(sticky.after_removal.0, pinned, "{sticky:?}");
        assert_ne!(sticky.after_removal.1, pinned, "{sticky:?}");
        assert_eq!(sticky.unpinned, 1, "{sticky:?}");
    }
}
