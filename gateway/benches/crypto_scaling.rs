//! How WireGuard encryption scales over worker threads: the question behind `--queues`
//! (`IoOptions::queues`), measured without any I/O so that the tunnel's other costs and the
//! machine's other processes do not hide it.
//!
//! Each case encrypts the same work per iteration, two batches of [`BATCH`] packets of
//! [`PACKET`] bytes, each batch under one lock of the peer's `Tunn` mutex as `tun_loop`
//! takes it:
//!
//! - `1 worker, 2 peers`: one thread encrypts a batch for each of two peers in turn (one
//!   data-path queue).
//! - `2 workers, 2 peers`: two threads, each encrypting for its own peer (two queues whose
//!   flows belong to different peers).
//! - `2 workers, 1 peer`: two threads encrypting for the same peer (two queues whose flows
//!   belong to one peer): they serialize on the peer's mutex, since `Tunn::encapsulate`
//!   takes `&mut self`.
//!
//! Throughput is in packets; on an idle machine with two or more cores, `2 workers, 2
//! peers` approaches twice `1 worker, 2 peers`, and `2 workers, 1 peer` stays near it.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use parking_lot::Mutex;

/// Plaintext bytes per packet: a full packet at the tunnel's usual MTU.
const PACKET: usize = 1420;
/// Packets per batch (one lock of the peer's mutex).
const BATCH: usize = 64;
/// Room boringtun needs beyond the plaintext (header and tag).
const OVERHEAD: usize = 32;

/// An initiator's `Tunn` with an established session to a responder created for it.
fn established_peer(seed: u8) -> Mutex<Tunn> {
    let own = StaticSecret::from([seed; 32]);
    let remote = StaticSecret::from([seed.wrapping_add(100); 32]);
    let (own_public, remote_public) = (PublicKey::from(&own), PublicKey::from(&remote));
    let mut initiator = Tunn::new(own, remote_public, None, None, u32::from(seed), None);
    let mut responder = Tunn::new(remote, own_public, None, None, 1000, None);
    let (mut buf, mut out) = (vec![0u8; 2048], vec![0u8; 2048]);
    let TunnResult::WriteToNetwork(init) = initiator.format_handshake_initiation(&mut buf, false)
    else {
        panic!("handshake initiation expected");
    };
    let init = init.to_vec();
    let TunnResult::WriteToNetwork(response) = responder.decapsulate(None, &init, &mut out) else {
        panic!("handshake response expected");
    };
    let response = response.to_vec();
    // The response completes the initiator's session, which confirms it with a keepalive.
    match initiator.decapsulate(None, &response, &mut buf) {
        TunnResult::WriteToNetwork(_) => {}
        other => panic!("keepalive expected, got {other:?}"),
    }
    Mutex::new(initiator)
}

/// Encrypts one batch for `peer` under one lock.
fn encrypt_batch(peer: &Mutex<Tunn>, packet: &[u8], out: &mut [u8]) {
    let mut tunn = peer.lock();
    for _ in 0..BATCH {
        match tunn.encapsulate(packet, out) {
            TunnResult::WriteToNetwork(datagram) => {
                black_box(datagram.len());
            }
            other => panic!("encryption failed: {other:?}"),
        }
    }
}

/// Runs one thread per entry of `workers`, each encrypting `iterations` times a batch for
/// every peer of its entry; all start together. Returns the time until the last finished.
fn run(workers: &[Vec<&Mutex<Tunn>>], iterations: u64) -> Duration {
    let barrier = Barrier::new(workers.len() + 1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = workers
            .iter()
            .map(|peers| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let packet = vec![0x5au8; PACKET];
                    let mut out = vec![0u8; PACKET + OVERHEAD];
                    barrier.wait();
                    for _ in 0..iterations {
                        for peer in peers {
                            encrypt_batch(peer, &packet, &mut out);
                        }
                    }
                    Instant::now()
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("worker thread"))
            .max()
            .map_or(Duration::ZERO, |end| end.saturating_duration_since(start))
    })
}

fn scaling(c: &mut Criterion) {
    let (a, b) = (established_peer(1), established_peer(2));
    let cases = [
        ("1 worker, 2 peers", vec![vec![&a, &b]]),
        ("2 workers, 2 peers", vec![vec![&a], vec![&b]]),
        ("2 workers, 1 peer", vec![vec![&a], vec![&a]]),
    ];
    let mut group = c.benchmark_group("encrypt");
    group.throughput(Throughput::Elements(2 * BATCH as u64));
    for (name, workers) in &cases {
        group.bench_function(*name, |bench| {
            bench.iter_custom(|iterations| run(workers, iterations));
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = scaling
}
criterion_main!(benches);
