//! The remap fast path never allocates: a counting global allocator watches egress and ingress
//! of every packet kind (TCP with MSS clamping, UDP, ICMP echo, ICMP errors, fragments, IPv6
//! extension headers, drops) through an `arc_swap::Cache` reader, as the data plane uses it.

mod support;
use std::cell::Cell;
use std::net::IpAddr;
use std::sync::Arc;
use support::CountingAllocator;

use arc_swap::{ArcSwap, Cache};
use ipnet::IpNet;
use kubetun_remap::{DropReason, RemapTable, Route, TableBuilder, Verdict};

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_allocation() {
    // `try_with`: the slot may be gone while the thread shuts down.
    let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Counts the allocations of the current thread, so parallel tests do not interfere.
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator::new(count_allocation, || {});

fn net(s: &str) -> IpNet {
    s.parse().expect("valid prefix")
}

/// The seed topology plus 10 000 more routes, so the hashed LPM is in use.
fn table() -> RemapTable {
    let mut builder = TableBuilder::new();
    builder
        .local_prefixes(&[net("10.200.0.0/16"), net("fd00:200::/64")])
        .mss_clamp_mtu(Some(1420));
    let rome = [
        Route {
            real: net("10.70.0.0/16"),
            view: net("10.68.0.0/16"),
        },
        Route {
            real: net("fd00:70::/64"),
            view: net("fd00:68::/64"),
        },
    ];
    builder.add_peer(1, &rome, None).expect("valid");
    let milan = [Route {
        real: net("10.70.0.0/16"),
        view: net("10.69.0.0/16"),
    }];
    builder
        .add_peer(2, &milan, Some(&[net("10.70.0.0/16")]))
        .expect("valid");
    // 1 000 more peers with ten /28 routes each: reals in 172.16.0.0/12, views in 100.64.0.0/10.
    let prefix = |base: u32, n: u32| IpNet::new(IpAddr::from((base + (n << 4)).to_be_bytes()), 28);
    for peer in 0..1_000u32 {
        let routes: Vec<Route> = (peer * 10..peer * 10 + 10)
            .map(|n| Route {
                real: prefix(0xac10_0000, n).expect("valid"),
                view: prefix(0x6440_0000, n).expect("valid"),
            })
            .collect();
        builder.add_peer(3 + peer, &routes, None).expect("valid");
    }
    builder.build().expect("valid")
}

fn packets() -> Vec<(Option<u32>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut push = |ingress: Option<u32>, build: &dyn Fn(&mut Vec<u8>)| {
        let mut pkt = Vec::new();
        build(&mut pkt);
        out.push((ingress, pkt));
    };
    let payload = [0x5a; 1200];
    let (local, view, real) = ([10, 200, 0, 5], [10, 68, 1, 2], [10, 70, 1, 2]);
    push(None, &|p| {
        etherparse::PacketBuilder::ipv4(local, view, 64)
            .tcp(1, 2, 3, 4)
            .write(p, &payload)
            .expect("tcp")
    });
    push(None, &|p| {
        etherparse::PacketBuilder::ipv4(local, view, 64)
            .tcp(1, 2, 3, 4)
            .syn()
            .options(&[etherparse::TcpOptionElement::MaximumSegmentSize(1460)])
            .expect("options")
            .write(p, &[])
            .expect("syn")
    });
    push(Some(1), &|p| {
        etherparse::PacketBuilder::ipv4(real, local, 64)
            .udp(1, 2)
            .write(p, &payload)
            .expect("udp")
    });
    push(Some(2), &|p| {
        etherparse::PacketBuilder::ipv4(real, local, 64)
            .icmpv4_echo_reply(1, 2)
            .write(p, &payload)
            .expect("echo")
    });
    let mut quoted = Vec::new();
    etherparse::PacketBuilder::ipv4(view, local, 64)
        .udp(1, 2)
        .write(&mut quoted, b"quoted")
        .expect("quoted");
    push(None, &|p| {
        etherparse::PacketBuilder::ipv4(local, view, 64)
            .icmpv4_raw(3, 3, [0; 4])
            .write(p, &quoted)
            .expect("error")
    });
    let (local6, view6, real6) = (
        "fd00:200::5".parse::<std::net::Ipv6Addr>(),
        "fd00:68::1".parse::<std::net::Ipv6Addr>(),
        "fd00:70::1".parse::<std::net::Ipv6Addr>(),
    );
    let (local6, view6, real6) = (
        local6.expect("addr").octets(),
        view6.expect("addr").octets(),
        real6.expect("addr").octets(),
    );
    push(None, &|p| {
        etherparse::PacketBuilder::ipv6(local6, view6, 64)
            .tcp(1, 2, 3, 4)
            .write(p, &payload)
            .expect("tcp6")
    });
    push(Some(1), &|p| {
        etherparse::PacketBuilder::ipv6(real6, local6, 64)
            .icmpv6_echo_reply(1, 2)
            .write(p, &payload)
            .expect("echo6")
    });
    // A later IPv4 fragment and a packet to a route of one of the many peers.
    push(None, &|p| {
        etherparse::PacketBuilder::ipv4(local, view, 64)
            .udp(1, 2)
            .write(p, &payload)
            .expect("udp");
        p[6] = 0x00;
        p[7] = 0x10;
    });
    push(None, &|p| {
        etherparse::PacketBuilder::ipv4(local, [100, 64, 0, 0x21], 64)
            .udp(1, 2)
            .write(p, &payload)
            .expect("udp")
    });
    // Drops: no route, bad packet, source not allowed.
    push(None, &|p| {
        etherparse::PacketBuilder::ipv4(local, [192, 0, 2, 1], 64)
            .udp(1, 2)
            .write(p, &payload)
            .expect("udp")
    });
    push(None, &|p| p.extend_from_slice(&[0x45, 0, 0, 20]));
    push(Some(1), &|p| {
        etherparse::PacketBuilder::ipv4([192, 0, 2, 1], local, 64)
            .udp(1, 2)
            .write(p, &payload)
            .expect("udp")
    });
    out
}

#[test]
fn the_fast_path_does_not_allocate() {
    let shared = Arc::new(ArcSwap::from_pointee(table()));
    let mut cache = Cache::new(Arc::clone(&shared));
    let originals = packets();
    let mut buffers = originals.clone();
    let mut verdicts = Vec::with_capacity(buffers.len() * 2);

    let before = allocations();
    for round in 0..1_000 {
        for ((ingress, pkt), (_, original)) in buffers.iter_mut().zip(&originals) {
            pkt.copy_from_slice(original);
            let table = cache.load();
            let verdict = match ingress {
                Some(peer) => table.ingress(*peer, pkt),
                None => {
                    table.prefetch_egress(pkt);
                    table.egress(pkt)
                }
            };
            if round == 0 {
                verdicts.push(verdict);
            }
        }
    }
    let allocated = allocations() - before;

    assert_eq!(allocated, 0, "the fast path allocated {allocated} times");
    let forwarded = verdicts
        .iter()
        .filter(|v| matches!(v, Verdict::Forward(_) | Verdict::Deliver))
        .count();
    assert_eq!(
        forwarded,
        buffers.len() - 3,
        "every packet but the three drops is translated: {verdicts:?}"
    );
    assert!(verdicts.contains(&Verdict::Drop(DropReason::NoRoute)));
    assert!(verdicts.contains(&Verdict::Drop(DropReason::BadPacket)));
    assert!(verdicts.contains(&Verdict::Drop(DropReason::SourceNotAllowed)));
}

#[test]
fn the_counter_sees_allocations() {
    let before = allocations();
    let boxed = std::hint::black_box(Box::new(7u64));
    assert!(allocations() > before);
    drop(boxed);
}
