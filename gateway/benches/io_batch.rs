//! Per-packet cost of the batched I/O paths against the unbatched ones, measured in the same
//! run inside a private network namespace (loopback and a TUN device; needs root).
//!
//! - `udp`: moving 64 WireGuard-sized datagrams (1452 B) from one socket to another:
//!   `send_to`/`recv_from` per datagram, `sendmmsg`/`recvmmsg`, GSO sends to a plain
//!   receiver, and GSO sends to a GRO receiver.
//! - `tun_read`: a 40 × 1372 B UDP GSO send routed into the TUN device and read back, one
//!   packet per `read` (no offload) against tun-rs super-packet reads (offload).
//! - `tun_write`: 64 packets of 1200 B of one UDP flow written to the TUN device and
//!   delivered to a local socket, one `write` each against GRO-coalesced writes.
//!
//! Each iteration includes the kernel's work on both sides (loopback delivery, routing into
//! the TUN, local delivery), which is what the data path pays.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command;

use criterion::{Criterion, Throughput, criterion_group};
use kubetun_gateway_core::batch::{RecvBatch, SendBatch};
use kubetun_gateway_io::tun_offload::{TunReader, TunWriter};
use kubetun_gateway_io::udp_batch::{BatchReceiver, BatchSender, UdpOffload};

const DATAGRAM: usize = 1452;
const BURST: usize = 64;

fn private_netns() {
    // SAFETY: called first thing on the main thread, before criterion starts any thread;
    // moves this process's main thread into a new, empty network namespace.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "unshare(CLONE_NEWNET) needs root");
    ip(&["link", "set", "lo", "up"]);
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip");
    assert!(status.success(), "ip {}", args.join(" "));
}

fn socket_pair(gso: bool, gro: bool) -> (UdpSocket, UdpSocket, UdpOffload, UdpOffload) {
    let sender = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let receiver = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    receiver.set_nonblocking(true).expect("nonblocking");
    let send = UdpOffload::configure(&sender, gso, false);
    let recv = UdpOffload::configure(&receiver, false, gro);
    (sender, receiver, send, recv)
}

fn drain(
    receiver: &UdpSocket,
    kernel: &mut BatchReceiver,
    batch: &mut RecvBatch,
    mut remaining: usize,
) {
    while remaining > 0 {
        match kernel.recv(batch, receiver.as_fd()) {
            Ok(_) => remaining = remaining.saturating_sub(batch.datagrams().count()),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(error) => panic!("recv: {error}"),
        }
    }
}

fn udp(c: &mut Criterion) {
    let payload = vec![0x5au8; DATAGRAM];
    let mut group = c.benchmark_group("udp");
    group.throughput(Throughput::Elements(BURST as u64));

    let (sender, receiver, _, _) = socket_pair(false, false);
    let dest = receiver.local_addr().expect("addr");
    let mut buffer = vec![0u8; 65536];
    group.bench_function("send_to+recv_from", |b| {
        b.iter(|| {
            for _ in 0..BURST {
                sender.send_to(&payload, dest).expect("send");
            }
            let mut received = 0;
            while received < BURST {
                if receiver.recv_from(&mut buffer).is_ok() {
                    received += 1;
                }
            }
        })
    });

    for (name, gso, gro) in [
        ("sendmmsg+recvmmsg", false, false),
        ("gso+recvmmsg", true, false),
        ("gso+gro", true, true),
    ] {
        let (sender, receiver, send, recv) = socket_pair(gso, gro);
        assert_eq!(
            (send.gso(), recv.gro()),
            (gso, gro),
            "{name}: offload unavailable"
        );
        let dest = receiver.local_addr().expect("addr");
        let mut out = SendBatch::new(BURST, BURST * DATAGRAM);
        let mut inbound = RecvBatch::new(BURST);
        let (mut kernel_out, mut kernel_in) = (BatchSender::default(), BatchReceiver::default());
        group.bench_function(name, |b| {
            b.iter(|| {
                for _ in 0..BURST {
                    out.push(dest, &payload);
                }
                kernel_out
                    .send(&mut out, sender.as_fd(), &send)
                    .expect("send");
                drain(&receiver, &mut kernel_in, &mut inbound, BURST);
            })
        });
    }
    group.finish();
}

fn tun_device(name: &str, address: &str, offload: bool) -> tun_rs::AsyncDevice {
    let device = tun_rs::DeviceBuilder::new()
        .name(name)
        .mtu(1420)
        .offload(offload)
        .build_async()
        .expect("create TUN");
    ip(&["address", "add", address, "dev", name]);
    ip(&["link", "set", name, "up"]);
    device
}

fn tun_read(c: &mut Criterion) {
    const SEGMENT: usize = 1372;
    const SEGMENTS: usize = 40;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("tun_read");
    group.throughput(Throughput::Elements(SEGMENTS as u64));
    let payload = vec![0x33u8; SEGMENT];
    for (index, (name, offload)) in [("read per packet", false), ("offload", true)]
        .into_iter()
        .enumerate()
    {
        let _guard = runtime.enter();
        let ifname = format!("ktr{index}");
        let device = tun_device(&ifname, &format!("10.77.{index}.1/24"), offload);
        let sender = UdpSocket::bind((Ipv4Addr::new(10, 77, index as u8, 1), 0)).expect("bind");
        let gso = UdpOffload::configure(&sender, true, false);
        let dest = SocketAddr::from(([10, 77, index as u8, 2], 9));
        let mut out = SendBatch::new(SEGMENTS, SEGMENTS * SEGMENT);
        let mut reader = TunReader::new(if offload { 64 } else { 1 });
        let mut kernel_out = BatchSender::default();
        group.bench_function(name, |b| {
            b.iter(|| {
                for _ in 0..SEGMENTS {
                    out.push(dest, &payload);
                }
                kernel_out
                    .send(&mut out, sender.as_fd(), &gso)
                    .expect("send");
                let mut read = 0;
                while read < SEGMENTS {
                    read += runtime.block_on(reader.recv(&device)).expect("read");
                }
            })
        });
    }
    group.finish();
}

fn tun_write(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("tun_write");
    group.throughput(Throughput::Elements(BURST as u64));
    for (index, (name, offload)) in [("write per packet", false), ("gro", true)]
        .into_iter()
        .enumerate()
    {
        let _guard = runtime.enter();
        let ifname = format!("ktw{index}");
        let device = tun_device(&ifname, &format!("10.78.{index}.1/24"), offload);
        let receiver = UdpSocket::bind((Ipv4Addr::new(10, 78, index as u8, 1), 0)).expect("bind");
        receiver.set_nonblocking(true).expect("nonblocking");
        let port = receiver.local_addr().expect("addr").port();
        let builder =
            etherparse::PacketBuilder::ipv4([10, 78, index as u8, 2], [10, 78, index as u8, 1], 64)
                .udp(5000, port);
        let mut packet = Vec::new();
        builder
            .write(&mut packet, &[0x44u8; 1200])
            .expect("build packet");
        let mut writer = TunWriter::new(BURST);
        let mut inbound = RecvBatch::new(BURST);
        let mut kernel_in = BatchReceiver::default();
        group.bench_function(name, |b| {
            b.iter(|| {
                for _ in 0..BURST {
                    writer.push(&packet);
                }
                runtime.block_on(writer.flush(&device)).expect("write");
                drain(&receiver, &mut kernel_in, &mut inbound, BURST);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, udp, tun_read, tun_write);

fn main() {
    private_netns();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
