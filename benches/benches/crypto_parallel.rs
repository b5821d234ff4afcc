//! One peer on several cores: the IO-free data-path core (`kubetun-gateway-core`) encrypting
//! a batch of full-size packets on one gateway and decrypting it on the other, with the
//! crypto on 1 worker (the calling thread) and on 2 (the caller and one helper thread), for
//! one peer and for two. No sockets, no TUN: the batches go from one core's arena to the
//! other's in memory, so what is measured is the remap, the crypto and the batch handling.
//!
//! `cargo bench -p kubetun-benches --bench crypto_parallel`.

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kubetun_gateway::device::workers::CryptoWorkers;
use kubetun_gateway_core::batch::RecvBatch;
use kubetun_gateway_core::context::Context;
use kubetun_gateway_core::drops::Drops;
use kubetun_gateway_core::egress::Egress;
use kubetun_gateway_core::handshake::Handshake;
use kubetun_gateway_core::ingress::Ingress;
use kubetun_gateway_core::key::Key;
use kubetun_gateway_core::plan::next_snapshot;
use kubetun_gateway_core::snapshot::Snapshot;
use kubetun_gateway_core::state::{
    DesiredState, Endpoint as EndpointConfig, InterfaceConfig, PeerConfig, RouteConfig,
};
use kubetun_gateway_core::transmits::Transmits;
use kubetun_gateway_core::workers::{Alone, Workers};
use kubetun_gateway_core::{Endpoint, MAX_PACKET, Now, OVERHEAD, Outbox, PacketSink, Step};

/// One round through A and its remotes with some workers: the packets delivered.
type Round<'a> = dyn Fn(&mut Gateway, &mut [Gateway], &mut [Vec<u8>]) -> usize + 'a;

/// Packets per batch: the data path's default batch.
const BATCH: usize = 128;
/// A full-size packet inside a 1420-byte tunnel MTU.
const PACKET: usize = 1420;

/// One gateway's data-path state, as a data-path task holds it.
struct Gateway {
    address: SocketAddr,
    snapshot: Snapshot,
    drops: Drops,
    egress: Egress,
    ingress: Ingress,
    outbox: Outbox,
    inbound: RecvBatch,
    writer: Sink,
    transmits: Transmits,
    handshake: Handshake,
}

/// The TUN write batch: `BATCH` buffers, one per packet, emptied after every batch.
struct Sink {
    slots: Vec<Box<[u8]>>,
    lengths: Vec<usize>,
}

impl PacketSink for Sink {
    type Slot = Box<[u8]>;

    fn room(&self) -> usize {
        BATCH - self.lengths.len()
    }

    fn free_slots(&mut self) -> &mut [Box<[u8]>] {
        let used = self.lengths.len();
        &mut self.slots[used..]
    }

    fn slot_space(slot: &mut Box<[u8]>) -> &mut [u8] {
        slot
    }

    fn commit_slot(&mut self, skip: usize, len: usize) {
        let used = self.lengths.len();
        self.slots.swap(used, used + skip);
        self.lengths.push(len);
    }
}

/// Datagrams that leave a core outside its batches (handshake messages).
#[derive(Default)]
struct Wire(Vec<(Endpoint, Vec<u8>)>);

impl Wire {
    /// Takes everything `out` holds, as the shell sends it.
    fn send(&mut self, out: &mut Transmits) {
        for transmit in out.iter() {
            self.0
                .push((transmit.endpoint(), transmit.datagram.to_vec()));
            transmit.sent();
        }
        out.clear();
    }
}

struct Site {
    address: SocketAddr,
    key: Key,
    real: &'static str,
    view: &'static str,
}

fn site(n: u8) -> Site {
    let (real, view) = match n {
        1 => ("10.10.0.0/24", "10.110.0.0/24"),
        2 => ("10.20.0.0/24", "10.120.0.0/24"),
        _ => ("10.30.0.0/24", "10.130.0.0/24"),
    };
    Site {
        address: SocketAddr::from(([192, 0, 2, n], 51820)),
        key: Key::generate_private(),
        real,
        view,
    }
}

impl Gateway {
    fn new(this: &Site, peers: &[&Site]) -> Self {
        let state = DesiredState {
            version: "bench".to_owned(),
            interface: InterfaceConfig {
                private_key: Some(this.key),
                listen_port: this.address.port(),
                ..InterfaceConfig::default()
            },
            peers: peers
                .iter()
                .map(|peer| {
                    let mut config = PeerConfig::new(peer.key.public_key());
                    config.endpoint = Some(EndpointConfig::Addr(peer.address));
                    config.routes = vec![RouteConfig::remapped(
                        peer.real.parse().expect("real"),
                        peer.view.parse().expect("view"),
                    )];
                    config
                })
                .collect(),
            admissions: Vec::new(),
        };
        let resolved: Vec<_> = peers.iter().map(|peer| Some(peer.address)).collect();
        let snapshot = next_snapshot(
            &Snapshot::initial(DesiredState::default()),
            &state,
            &resolved,
            now(),
        )
        .expect("snapshot");
        Self {
            address: this.address,
            snapshot,
            drops: Drops::default(),
            egress: Egress::new(BATCH),
            ingress: Ingress::new(BATCH),
            outbox: Outbox::new(BATCH),
            inbound: RecvBatch::new(BATCH),
            writer: Sink {
                slots: (0..BATCH)
                    .map(|_| vec![0; MAX_PACKET].into_boxed_slice())
                    .collect(),
                lengths: Vec::with_capacity(BATCH),
            },
            transmits: Transmits::new(BATCH, 2 * (MAX_PACKET + OVERHEAD)),
            handshake: Handshake::new(),
        }
    }

    /// Encrypts `packets` (remapped in place): the datagrams, by destination.
    fn send(
        &mut self,
        packets: &mut [Vec<u8>],
        workers: &impl Workers,
    ) -> Vec<(Endpoint, Vec<u8>)> {
        let mut sent = Vec::new();
        let cx = Context::new(&self.snapshot, &self.drops, now()).with_workers(workers);
        self.egress.route(&cx, packets);
        loop {
            let step = self.egress.encrypt(&cx, packets, &mut self.outbox);
            sent.extend(self.outbox.datagrams().map(|(to, d)| (to, d.to_vec())));
            self.outbox.clear();
            if step == Step::Done {
                return sent;
            }
        }
    }

    /// Takes one batch of datagrams from `from` that `fill` puts into the receive batch;
    /// handshake messages are processed and their replies returned. The packets written.
    fn receive(
        &mut self,
        from: SocketAddr,
        workers: &impl Workers,
    ) -> (usize, Vec<(Endpoint, Vec<u8>)>) {
        let mut handshakes = Vec::new();
        let mut replies = Wire::default();
        let cx = Context::new(&self.snapshot, &self.drops, now()).with_workers(workers);
        self.ingress.classify(&cx, &self.inbound);
        for message in self.ingress.handshakes(&self.inbound) {
            handshakes.push((message.source, message.datagram.to_vec()));
        }
        let mut written = 0;
        loop {
            let step =
                self.ingress
                    .decrypt(&cx, &self.inbound, &mut self.writer, &mut self.transmits);
            replies.send(&mut self.transmits);
            written += self.writer.lengths.len();
            self.writer.lengths.clear();
            if step == Step::Done {
                break;
            }
        }
        for (source, message) in handshakes {
            let source = Endpoint::reply(from, source.local);
            let cx = Context::new(&self.snapshot, &self.drops, now());
            let mut step = self
                .handshake
                .process(&cx, source, &message, &mut self.transmits);
            replies.send(&mut self.transmits);
            while step == Step::Flush {
                step = self.handshake.resume(&cx, &mut self.transmits);
                replies.send(&mut self.transmits);
            }
        }
        (written, replies.0)
    }

    fn deliver(
        &mut self,
        from: SocketAddr,
        datagrams: &[(Endpoint, Vec<u8>)],
        workers: &impl Workers,
    ) -> (usize, Vec<(Endpoint, Vec<u8>)>) {
        let (mut written, mut replies) = (0, Vec::new());
        for chunk in datagrams.chunks(BATCH) {
            self.inbound.clear();
            for (_, datagram) in chunk {
                assert!(self.inbound.push(from, datagram), "room in the batch");
            }
            let (n, r) = self.receive(from, workers);
            written += n;
            replies.extend(r);
        }
        (written, replies)
    }
}

fn now() -> Now {
    Now {
        unix_ms: 1_000_000,
        mono_us: 1_000_000_000,
    }
}

fn packet(src: &str, dst: &str, n: usize) -> Vec<u8> {
    let src: std::net::Ipv4Addr = src.parse().expect("src");
    let dst: std::net::Ipv4Addr = dst.parse().expect("dst");
    let mut out = Vec::with_capacity(PACKET);
    etherparse::PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
        .udp(40000, 9000)
        .write(&mut out, &vec![n as u8; PACKET - 28])
        .expect("packet");
    out
}

/// Gateway A with a peer per remote site, each remote with A as its peer, handshakes done.
fn link(remotes: usize) -> (Gateway, Vec<Gateway>, Vec<Site>) {
    let a_site = site(1);
    let sites: Vec<Site> = (0..remotes).map(|n| site(2 + n as u8)).collect();
    let mut a = Gateway::new(&a_site, &sites.iter().collect::<Vec<_>>());
    let mut bs: Vec<Gateway> = sites.iter().map(|s| Gateway::new(s, &[&a_site])).collect();
    for (b, s) in bs.iter_mut().zip(&sites) {
        let mut first = vec![packet("10.10.0.5", &s.view.replace("0/24", "7"), 0)];
        let mut to_b = a.send(&mut first, &Alone);
        for _ in 0..4 {
            let (_, replies) = b.deliver(a.address, &to_b, &Alone);
            if replies.is_empty() {
                break;
            }
            let (_, back) = a.deliver(b.address, &replies, &Alone);
            to_b = back;
        }
    }
    (a, bs, sites)
}

fn bench(c: &mut Criterion) {
    let two = CryptoWorkers::new(2).expect("a helper thread");
    let mut group = c.benchmark_group("crypto_parallel");
    group.throughput(Throughput::Bytes((BATCH * PACKET) as u64));
    for remotes in [1usize, 2] {
        let (mut a, mut bs, sites) = link(remotes);
        let template: Vec<Vec<u8>> = (0..BATCH)
            .map(|n| {
                packet(
                    "10.10.0.5",
                    &sites[n % remotes].view.replace("0/24", "7"),
                    n,
                )
            })
            .collect();
        // What the TUN reader would hand over: the packets copied into buffers of their own.
        let mut packets = template.clone();
        let mut measure = |name: &str, workers: &Round<'_>| {
            let mut round = || {
                for (packet, original) in packets.iter_mut().zip(&template) {
                    packet.clear();
                    packet.extend_from_slice(original);
                }
                workers(&mut a, &mut bs, &mut packets)
            };
            // A round must deliver every packet, or the figure would flatter a broken path.
            assert_eq!(round(), BATCH, "{name}");
            group.bench_function(format!("{remotes} peer(s), {name}"), |bencher| {
                bencher.iter(|| black_box(round()));
            });
        };
        measure("1 worker", &|a, bs, packets| {
            one_round(a, bs, packets, &Alone)
        });
        measure("2 workers", &|a, bs, packets| {
            one_round(a, bs, packets, &two)
        });
    }
    group.finish();
}

/// A's batch encrypted, then each remote decrypting its share, straight from A's outbox
/// into its receive batch: the packets delivered.
fn one_round(
    a: &mut Gateway,
    bs: &mut [Gateway],
    packets: &mut [Vec<u8>],
    workers: &impl Workers,
) -> usize {
    let cx = Context::new(&a.snapshot, &a.drops, now()).with_workers(workers);
    a.egress.route(&cx, packets);
    let step = a.egress.encrypt(&cx, packets, &mut a.outbox);
    assert_eq!(step, Step::Done, "the outbox holds a whole batch");
    let delivered = bs
        .iter_mut()
        .map(|b| {
            b.inbound.clear();
            for (to, datagram) in a.outbox.datagrams() {
                if to.remote == b.address {
                    assert!(b.inbound.push(a.address, datagram), "room in the batch");
                }
            }
            b.receive(a.address, workers).0
        })
        .sum();
    a.outbox.clear();
    delivered
}

criterion_group!(benches, bench);
criterion_main!(benches);
