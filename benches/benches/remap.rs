//! The remap fast path: ns per packet for lookup + rewrite of 1400-byte TCP packets with 10,
//! 1 000 and 10 000 rules, IPv4 and IPv6, egress and ingress; a baseline that recomputes the
//! checksums with etherparse; and the cost of swapping the table snapshot every millisecond
//! while a reader goes through `arc_swap::Cache` (interleaved A/B rounds, see
//! [`snapshot_swaps`]).
//!
//! Every measured packet really is translated: routes come in pairs whose views are each
//! other's real prefixes (`P → Q` for one peer, `Q → P` for another), so translating a packet
//! twice restores it and the same buffers can be reused without any per-iteration copy.
//!
//! Run: `cargo bench -p kubetun-benches --bench remap`.

use std::collections::HashSet;
use std::hint::black_box;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::{ArcSwap, Cache};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use etherparse::{Ipv4Header, Ipv6Header, PacketBuilder, TcpHeader};
use ipnet::IpNet;
use kubetun_remap::{PeerId, RemapTable, Route, TableBuilder, Verdict};

const PACKET_LEN: usize = 1400;
const BATCH: usize = 1024;
const RULE_COUNTS: [usize; 3] = [10, 1_000, 10_000];
/// Peers the rules are spread over (each pair uses one peer of each half).
const PEERS: u32 = 1_000;

/// A small deterministic generator, so every run measures the same tables.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// How many distinct prefix lengths the rules use; the LPM probes about log2 of that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lengths {
    /// Four lengths, like IPAM-allocated pod and external CIDRs (/16../28, /40../64).
    Typical,
    /// Every length in /12../30 or /32../120: the worst case for the LPM.
    Spread,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// A prefix length drawn from `lengths`.
    fn random_len(self, lengths: Lengths, rng: &mut XorShift) -> u8 {
        match (lengths, self) {
            (Lengths::Typical, Family::V4) => [16, 20, 24, 28][rng.below(4) as usize],
            (Lengths::Typical, Family::V6) => [40, 48, 56, 64][rng.below(4) as usize],
            (Lengths::Spread, Family::V4) => 12 + rng.below(19) as u8, // /12../30
            (Lengths::Spread, Family::V6) => 32 + rng.below(89) as u8, // /32../120
        }
    }

    /// The network mask of a `len`-bit prefix, in the low bits of a `u128`.
    fn mask(self, len: u8) -> u128 {
        let all = u128::MAX >> (128 - u32::from(self.bits()));
        all & !all.checked_shr(u32::from(len)).unwrap_or(0)
    }

    fn addr(self, bits: u128) -> IpAddr {
        match self {
            Family::V4 => IpAddr::from((bits as u32).to_be_bytes()),
            Family::V6 => IpAddr::from(bits.to_be_bytes()),
        }
    }

    fn local(self) -> (IpAddr, IpNet) {
        match self {
            Family::V4 => (
                "192.168.7.9".parse().expect("addr"),
                "192.168.0.0/16".parse().expect("net"),
            ),
            Family::V6 => (
                "fd00:200::9".parse().expect("addr"),
                "fd00:200::/64".parse().expect("net"),
            ),
        }
    }
}

fn random_prefix(family: Family, len: u8, rng: &mut XorShift) -> (u128, u8) {
    let raw = (u128::from(rng.next()) << 64) | u128::from(rng.next());
    let value = match family {
        Family::V4 => raw & 0xffff_ffff,
        Family::V6 => (raw & !(0xffff << 112)) | (0xfd00 << 112),
    };
    (value & family.mask(len), len)
}

fn to_net(family: Family, (bits, len): (u128, u8)) -> IpNet {
    IpNet::new(family.addr(bits), len).expect("valid length")
}

/// One pair of routes: view `p` → real `q` for peer `a`, view `q` → real `p` for peer `b`.
#[derive(Clone, Copy)]
struct Pair {
    p: (u128, u8),
    q: (u128, u8),
    a: PeerId,
    b: PeerId,
}

struct Setup {
    table: RemapTable,
    pairs: Vec<Pair>,
    /// Pairs no measured packet uses, for tables that differ from `table` in a few routes.
    spare_pairs: Vec<Pair>,
    family: Family,
}

/// Route pairs no measured packet uses, kept by [`setup`] for [`edited_tables`].
const SPARE_PAIRS: usize = 8;

fn setup(family: Family, lengths: Lengths, rules: usize) -> Setup {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ rules as u64 ^ family.bits() as u64);
    let mut used = HashSet::new();
    let mut pairs = Vec::new();
    while pairs.len() * 2 < rules + 2 * SPARE_PAIRS {
        let len = family.random_len(lengths, &mut rng);
        let p = random_prefix(family, len, &mut rng);
        let q = random_prefix(family, len, &mut rng);
        if p == q || !used.insert(p) || !used.insert(q) {
            continue;
        }
        let i = pairs.len() as u32;
        pairs.push(Pair {
            p,
            q,
            a: i % PEERS,
            b: PEERS + i % PEERS,
        });
    }
    let spare_pairs = pairs.split_off(pairs.len() - SPARE_PAIRS);
    Setup {
        table: table_of(family, &pairs, None),
        pairs,
        spare_pairs,
        family,
    }
}

/// The table of `pairs`, built after `previous` if given (as the gateway builds a successor).
fn table_of(family: Family, pairs: &[Pair], previous: Option<&RemapTable>) -> RemapTable {
    let mut routes: Vec<Vec<Route>> = vec![Vec::new(); 2 * PEERS as usize];
    for pair in pairs {
        let (p, q) = (to_net(family, pair.p), to_net(family, pair.q));
        routes[pair.a as usize].push(Route { real: q, view: p });
        routes[pair.b as usize].push(Route { real: p, view: q });
    }
    let mut builder = TableBuilder::new();
    let (_, local_net) = family.local();
    builder
        .local_prefixes(&[local_net])
        .mss_clamp_mtu(Some(1420));
    for (peer, routes) in routes.iter().enumerate() {
        if !routes.is_empty() {
            builder
                .add_peer(peer as PeerId, routes, None)
                .expect("valid pair routes");
        }
    }
    match previous {
        Some(previous) => builder.build_after(previous),
        None => builder.build(),
    }
    .expect("valid table")
}

/// A cycle of tables, each built after the one before it, that differ from the setup's table
/// (the first and last) in one route pair at a time: the spare pairs are added one by one,
/// then removed one by one.
fn edited_tables(setup: &Setup) -> Vec<RemapTable> {
    let steps = 2 * setup.spare_pairs.len();
    let mut tables: Vec<RemapTable> = Vec::with_capacity(steps);
    for step in 1..=steps {
        let present = if step <= SPARE_PAIRS {
            &setup.spare_pairs[..step]
        } else {
            &setup.spare_pairs[step - SPARE_PAIRS..]
        };
        let pairs: Vec<Pair> = setup.pairs.iter().chain(present).copied().collect();
        let previous = tables.last().unwrap_or(&setup.table);
        tables.push(table_of(setup.family, &pairs, Some(previous)));
    }
    tables
}

fn tcp_packet(src: IpAddr, dst: IpAddr) -> Vec<u8> {
    let header = if src.is_ipv4() { 20 + 20 } else { 40 + 20 };
    let payload = vec![0xa5; PACKET_LEN - header];
    let builder = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64),
        (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64),
        _ => unreachable!("one family per packet"),
    };
    let mut out = Vec::with_capacity(PACKET_LEN);
    builder
        .tcp(40000, 5201, 1, 64000)
        .ack(1)
        .write(&mut out, &payload)
        .expect("serialize");
    out
}

fn host_in(family: Family, (bits, len): (u128, u8), rng: &mut XorShift) -> IpAddr {
    let raw = (u128::from(rng.next()) << 64) | u128::from(rng.next());
    let host = raw & !family.mask(len) & family.mask(family.bits());
    family.addr(bits | host)
}

/// Egress packets to random pairs; each goes `p → q` and back on every second translation.
fn egress_batch(setup: &Setup) -> Vec<Vec<u8>> {
    let mut rng = XorShift(7);
    let (local, _) = setup.family.local();
    let mut batch = Vec::with_capacity(BATCH);
    while batch.len() < BATCH {
        let pair = &setup.pairs[rng.below(setup.pairs.len() as u64) as usize];
        let pkt = tcp_packet(local, host_in(setup.family, pair.p, &mut rng));
        // A host that a longer, nested prefix claims is not a ping-pong; skip it.
        let mut probe = pkt.clone();
        let there = setup.table.egress(&mut probe);
        let back = setup.table.egress(&mut probe);
        if there == Verdict::Forward(pair.a) && back == Verdict::Forward(pair.b) && probe == pkt {
            batch.push(pkt);
        }
    }
    batch
}

/// Ingress packets from random pairs with the peer that sends each next.
fn ingress_batch(setup: &Setup) -> Vec<(Vec<u8>, [PeerId; 2], usize)> {
    let mut rng = XorShift(11);
    let (local, _) = setup.family.local();
    let mut batch = Vec::with_capacity(BATCH);
    while batch.len() < BATCH {
        let pair = &setup.pairs[rng.below(setup.pairs.len() as u64) as usize];
        let pkt = tcp_packet(host_in(setup.family, pair.q, &mut rng), local);
        let mut probe = pkt.clone();
        let there = setup.table.ingress(pair.a, &mut probe);
        let back = setup.table.ingress(pair.b, &mut probe);
        if there == Verdict::Deliver && back == Verdict::Deliver && probe == pkt {
            batch.push((pkt, [pair.a, pair.b], 0));
        }
    }
    batch
}

/// The same rewrite done the straightforward way: decode, set the address, recompute the IP
/// and TCP checksums over the whole packet, encode.
fn etherparse_rewrite(pkt: &mut [u8], new_dst: &[u8]) {
    if pkt[0] >> 4 == 4 {
        let (mut ip, rest) = Ipv4Header::from_slice(pkt).expect("IPv4");
        let (mut tcp, payload) = TcpHeader::from_slice(rest).expect("TCP");
        ip.destination = new_dst.try_into().expect("4 bytes");
        ip.header_checksum = ip.calc_header_checksum();
        tcp.checksum = tcp.calc_checksum_ipv4(&ip, payload).expect("size");
        let ip_len = ip.header_len();
        pkt[..ip_len].copy_from_slice(&ip.to_bytes());
        pkt[ip_len..ip_len + tcp.header_len()].copy_from_slice(&tcp.to_bytes());
    } else {
        let (mut ip, rest) = Ipv6Header::from_slice(pkt).expect("IPv6");
        let (mut tcp, payload) = TcpHeader::from_slice(rest).expect("TCP");
        ip.destination = new_dst.try_into().expect("16 bytes");
        tcp.checksum = tcp.calc_checksum_ipv6(&ip, payload).expect("size");
        pkt[..40].copy_from_slice(&ip.to_bytes());
        pkt[40..40 + tcp.header_len()].copy_from_slice(&tcp.to_bytes());
    }
}

/// `Bencher::iter` with a 2 ms pause before every sample, outside the timed part. Under
/// `chrt -f` the kernel throttles a thread that uses more than 95 % of a second (by default)
/// for the rest of it; a sample that catches those 50 ms is off by a multiple. The pauses keep
/// the bench under that budget.
fn iter_paced(b: &mut criterion::Bencher<'_>, mut routine: impl FnMut()) {
    b.iter_custom(|iters| {
        std::thread::sleep(Duration::from_millis(2));
        let start = std::time::Instant::now();
        for _ in 0..iters {
            routine();
        }
        start.elapsed()
    });
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30)
}

fn lookup_and_rewrite(c: &mut Criterion) {
    for family in [Family::V4, Family::V6] {
        let mut group = c.benchmark_group(format!("remap_{}", family.name()));
        group.throughput(Throughput::Elements(1));
        let cases = RULE_COUNTS
            .map(|rules| (Lengths::Typical, rules))
            .into_iter()
            .chain([(Lengths::Spread, 10_000)]);
        for (lengths, rules) in cases {
            let setup = setup(family, lengths, rules);
            let (egress, ingress) = match lengths {
                Lengths::Typical => ("egress", "ingress"),
                Lengths::Spread => ("egress_spread", "ingress_spread"),
            };
            let mut batch = egress_batch(&setup);
            let mut i = 0;
            group.bench_function(BenchmarkId::new(egress, rules), |b| {
                iter_paced(b, || {
                    i = (i + 1) % BATCH;
                    black_box(setup.table.egress(black_box(&mut batch[i])));
                })
            });
            if lengths == Lengths::Typical && rules == 10_000 {
                // The same with `prefetch_egress` issued 16 packets ahead.
                group.bench_function(BenchmarkId::new("egress_prefetch16", rules), |b| {
                    iter_paced(b, || {
                        i = (i + 1) % BATCH;
                        setup.table.prefetch_egress(&batch[(i + 16) % BATCH]);
                        black_box(setup.table.egress(black_box(&mut batch[i])));
                    })
                });
            }
            let mut batch = ingress_batch(&setup);
            group.bench_function(BenchmarkId::new(ingress, rules), |b| {
                iter_paced(b, || {
                    i = (i + 1) % BATCH;
                    let (pkt, peers, turn) = &mut batch[i];
                    let verdict = setup.table.ingress(peers[*turn], black_box(pkt));
                    *turn ^= 1;
                    black_box(verdict);
                })
            });
            if lengths == Lengths::Typical && rules == 10_000 {
                baseline(&mut group, &setup);
            }
        }
        group.finish();
    }
}

/// Full recompute with etherparse, no lookup, on the same packets.
fn baseline(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    setup: &Setup,
) {
    let mut batch: Vec<(Vec<u8>, [Vec<u8>; 2], usize)> = egress_batch(setup)
        .into_iter()
        .map(|pkt| {
            let (at, len) = if setup.family == Family::V4 {
                (16, 4)
            } else {
                (24, 16)
            };
            let mut there = pkt.clone();
            setup.table.egress(&mut there);
            let addresses = [there[at..at + len].to_vec(), pkt[at..at + len].to_vec()];
            (pkt, addresses, 0)
        })
        .collect();
    let mut i = 0;
    group.bench_function("etherparse_full_recompute", |b| {
        iter_paced(b, || {
            i = (i + 1) % BATCH;
            let (pkt, addresses, turn) = &mut batch[i];
            etherparse_rewrite(black_box(pkt), &addresses[*turn]);
            *turn ^= 1;
        })
    });
}

/// Rounds of the A/B comparison; each round measures both arms once, in alternating order.
const SWAP_ROUNDS: usize = 20;
/// Packets per arm and round (about 0.1 s, so each swapping arm sees ~100 swaps).
const SWAP_RUN_PACKETS: usize = 4_000_000;
/// Prebuilt tables the swapper rotates through, so each swap lands on memory the reader has
/// not touched for several milliseconds.
const SWAP_POOL: usize = 8;
/// Packets timed together when measuring the cost right after a swap.
const CHUNK: usize = 32;

/// Pins the calling thread to one CPU; a no-op where that is refused.
fn pin_to(cpu: usize) {
    // SAFETY: `cpu_set_t` is plain data, zeroed is its empty set, and the pointer passed to
    // `sched_setaffinity` is valid for the size given.
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Moves the calling thread back to the normal scheduler: a control-plane thread under
/// `chrt -f` would eat into the real-time budget the reader is throttled by.
fn normal_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid `sched_param` for the duration of the call.
    #[allow(unsafe_code)]
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_OTHER, &param);
    }
}

/// Pauses the reader long enough that it stays under the kernel's real-time budget (by
/// default 95 % of every second): a throttled reader would stall for 50 ms in whichever arm
/// happens to be running.
fn breathe() {
    std::thread::sleep(Duration::from_millis(15));
}

/// The CPU the calling thread runs on.
fn current_cpu() -> usize {
    // SAFETY: `sched_getcpu` has no preconditions.
    #[allow(unsafe_code)]
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or(0)
}

/// How the background thread swaps while active; while inactive (the A arm) it wakes every
/// millisecond just the same and goes back to sleep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Swapper {
    /// Wakes every millisecond and stores the next of a few prebuilt, unrelated tables: every
    /// swap replaces all 10 000 routes with other memory.
    Pool,
    /// What the gateway does: wakes every millisecond, takes the next of [`edited_tables`]
    /// (which differs from the current table in one route pair no measured packet uses),
    /// refills it into the table the swap before last replaced (`RemapTable::refill`) and
    /// stores that.
    Edits,
    /// Builds a fresh table, stores it, and repeats (at most every millisecond); the reader
    /// drops the last reference to the old table, so it also frees it.
    Fresh,
    /// As `Fresh`, but the swapper keeps the old tables and frees each once the reader has
    /// let go of it: freeing moves off the data path.
    FreshRetired,
}

/// The reader's loop: `Cache::load` + egress for `packets` packets; returns ns per packet.
///
/// With `prefetch`, the packets go in batches of [`CHUNK`], and `prefetch_egress` is called
/// for all of a batch before it is translated, as a data path reading batches would.
fn run_reader(
    cache: &mut Cache<Arc<ArcSwap<RemapTable>>, Arc<RemapTable>>,
    batch: &mut [Vec<u8>],
    packets: usize,
    prefetch: bool,
) -> f64 {
    let start = std::time::Instant::now();
    for i in 0..packets {
        let table = cache.load();
        if prefetch && i % CHUNK == 0 {
            for j in i..i + CHUNK {
                table.prefetch_egress(&batch[j % BATCH]);
            }
        }
        black_box(table.egress(black_box(&mut batch[i % BATCH])));
    }
    start.elapsed().as_nanos() as f64 / packets as f64
}

/// The swap cost, measured outside criterion (whose samples are too short to contain swaps):
///
/// 1. A/B throughput: [`SWAP_ROUNDS`] rounds, each timing the same number of packets with the
///    swapper idle and with it swapping, in alternating order; reports the median and
///    interquartile range of the per-round ratio `swapping / idle`.
/// 2. Where a swap's cost comes from: ns per packet in the chunks of [`CHUNK`] packets right
///    after the reader sees a new snapshot, against chunks long after one.
///
/// Each of the [`Swapper`] modes is measured for IPv4 and IPv6 egress with 10 000 typical rules.
/// The reader stays on the CPU it started on (pin the process with `taskset`); the swapper is
/// pinned to another one at normal priority, as a control-plane thread would run next to the
/// data plane. Prints its results instead of going through criterion; the filter `snapshot`
/// selects it alone: `<bench binary> --bench snapshot`.
fn snapshot_swaps(_: &mut Criterion) {
    // `cargo test` runs benches once each, without `--bench`: minutes of A/B rounds in a debug
    // build would measure nothing.
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("remap_snapshot: measured only when benchmarking (`--bench`)");
        return;
    }
    // Criterion's filter is its positional argument (numbers are option values).
    let filter = std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-') && arg.parse::<f64>().is_err())
        .unwrap_or_default();
    if !"remap_snapshot".contains(filter.as_str()) && !filter.contains("snapshot") {
        return;
    }
    for family in [Family::V4, Family::V6] {
        let build_start = std::time::Instant::now();
        let pool: Vec<Arc<RemapTable>> = (0..SWAP_POOL)
            .map(|_| Arc::new(setup(family, Lengths::Typical, 10_000).table))
            .collect();
        let build_ms = build_start.elapsed().as_secs_f64() * 1e3 / SWAP_POOL as f64;
        let setup0 = setup(family, Lengths::Typical, 10_000);
        let mut batch = egress_batch(&setup0);
        println!(
            "remap_snapshot/{}: 10 000 typical rules, one table built in {build_ms:.1} ms",
            family.name()
        );
        let edits: Vec<Arc<RemapTable>> =
            edited_tables(&setup0).into_iter().map(Arc::new).collect();
        for (mode, prefetch) in [
            (Swapper::Edits, false),
            (Swapper::Edits, true),
            (Swapper::Pool, false),
            (Swapper::Pool, true),
            (Swapper::Fresh, false),
            (Swapper::FreshRetired, false),
        ] {
            let tables = if mode == Swapper::Edits {
                &edits
            } else {
                &pool
            };
            swap_ab(family, mode, prefetch, tables, &mut batch);
        }
    }
}

fn swap_ab(
    family: Family,
    mode: Swapper,
    prefetch: bool,
    pool: &[Arc<RemapTable>],
    batch: &mut [Vec<u8>],
) {
    let reader_cpu = current_cpu();
    pin_to(reader_cpu);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let swapper_cpu = (reader_cpu + 1) % cpus;

    let initial = match mode {
        Swapper::Pool => Arc::clone(&pool[0]),
        // The pool's references would keep old tables alive.
        Swapper::Edits => Arc::new(RemapTable::clone(&pool[pool.len() - 1])),
        _ => Arc::new(setup(family, Lengths::Typical, 10_000).table),
    };
    let shared = Arc::new(ArcSwap::new(initial));
    let refill_ns = Arc::new(AtomicU64::new(0));
    let active = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let swap_count = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (shared, active, stop, swap_count, refill_ns) = (
            Arc::clone(&shared),
            Arc::clone(&active),
            Arc::clone(&stop),
            Arc::clone(&swap_count),
            Arc::clone(&refill_ns),
        );
        let edits: Vec<RemapTable> = match mode {
            Swapper::Edits => pool.iter().map(|table| RemapTable::clone(table)).collect(),
            _ => Vec::new(),
        };
        let pool = match mode {
            Swapper::Pool => pool.to_vec(),
            _ => Vec::new(),
        };
        std::thread::spawn(move || {
            pin_to(swapper_cpu);
            normal_priority();
            let mut swaps = 0u64;
            let mut retired: Vec<Arc<RemapTable>> = Vec::new();
            let mut spare: Option<Arc<RemapTable>> =
                (mode == Swapper::Edits).then(|| Arc::new(edits[edits.len() - 1].clone()));
            while !stop.load(Ordering::Relaxed) {
                let due = std::time::Instant::now() + Duration::from_millis(1);
                if active.load(Ordering::Relaxed) {
                    let next = match mode {
                        Swapper::Pool => Arc::clone(&pool[(swaps as usize + 1) % pool.len()]),
                        Swapper::Edits => {
                            let fresh = &edits[swaps as usize % edits.len()];
                            let start = std::time::Instant::now();
                            let next = match spare.as_mut().and_then(Arc::get_mut) {
                                Some(table) => {
                                    table.refill(fresh);
                                    spare.take().expect("refilled above")
                                }
                                None => Arc::new(fresh.clone()),
                            };
                            refill_ns
                                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                            next
                        }
                        _ => Arc::new(setup(family, Lengths::Typical, 10_000).table),
                    };
                    let old = shared.swap(next);
                    match mode {
                        Swapper::FreshRetired => retired.push(old),
                        Swapper::Edits => spare = Some(old),
                        _ => {}
                    }
                    swaps += 1;
                    swap_count.store(swaps, Ordering::Relaxed);
                }
                // Free the retired tables no reader holds any more.
                retired.retain(|table| Arc::strong_count(table) > 1);
                if let Some(rest) = due.checked_duration_since(std::time::Instant::now()) {
                    std::thread::sleep(rest);
                }
            }
            swaps
        })
    };
    let mut cache = Cache::new(Arc::clone(&shared));
    run_reader(&mut cache, batch, SWAP_RUN_PACKETS / 4, prefetch); // warm up

    // 1. A/B rounds.
    let mut ratios = Vec::with_capacity(SWAP_ROUNDS);
    let (mut idle_ns, mut swapping_ns) = (Vec::new(), Vec::new());
    let (mut swaps_timed, mut swapping_time) = (0u64, 0.0f64);
    for round in 0..SWAP_ROUNDS {
        let mut times = [0.0; 2];
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for swapping in order {
            active.store(swapping, Ordering::Relaxed);
            // Let the swapper notice, and a first swap happen, before timing.
            breathe();
            let before = swap_count.load(Ordering::Relaxed);
            times[usize::from(swapping)] =
                run_reader(&mut cache, batch, SWAP_RUN_PACKETS, prefetch);
            if swapping {
                swaps_timed += swap_count.load(Ordering::Relaxed) - before;
                swapping_time += times[1] * SWAP_RUN_PACKETS as f64;
            }
        }
        idle_ns.push(times[0]);
        swapping_ns.push(times[1]);
        ratios.push(times[1] / times[0]);
    }

    // 2. The cost right after a swap: ns per packet by chunk age (chunks since the reader saw
    // a new snapshot).
    active.store(true, Ordering::Relaxed);
    const AGES: [(usize, usize); 7] = [
        (0, 1),
        (1, 2),
        (2, 4),
        (4, 8),
        (8, 32),
        (32, 128),
        (128, usize::MAX),
    ];
    let mut sums = [(0.0f64, 0u64); AGES.len()];
    let mut last = Arc::as_ptr(cache.load());
    let mut age = usize::MAX / 2;
    // At least as many packets as an A/B arm, and at least 100 swaps (fresh tables take
    // 10-20 ms to build) unless that takes longer than 10 s.
    let (phase, mut chunk, mut swaps_seen) = (std::time::Instant::now(), 0, 0);
    while chunk < SWAP_RUN_PACKETS / CHUNK
        || (swaps_seen < 100 && phase.elapsed() < Duration::from_secs(10))
    {
        chunk += 1;
        if chunk % 32_768 == 0 {
            breathe();
        }
        let start = std::time::Instant::now();
        let mut swapped = false;
        for j in 0..CHUNK {
            let table = cache.load();
            if prefetch && j == 0 {
                for k in 0..CHUNK {
                    table.prefetch_egress(&batch[(chunk * CHUNK + k) % BATCH]);
                }
            }
            let now = Arc::as_ptr(table);
            if now != last {
                last = now;
                swapped = true;
            }
            black_box(table.egress(black_box(&mut batch[(chunk * CHUNK + j) % BATCH])));
        }
        let ns = start.elapsed().as_nanos() as f64 / CHUNK as f64;
        age = if swapped { 0 } else { age.saturating_add(1) };
        swaps_seen += usize::from(swapped);
        if let Some(bucket) = AGES.iter().position(|&(lo, hi)| (lo..hi).contains(&age)) {
            sums[bucket].0 += ns;
            sums[bucket].1 += 1;
        }
    }
    active.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().expect("swapper thread");

    let summary = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        let q = |p: f64| values[((values.len() - 1) as f64 * p).round() as usize];
        (q(0.5), q(0.25), q(0.75))
    };
    let (ratio, ratio_q1, ratio_q3) = summary(&mut ratios);
    let (idle, _, _) = summary(&mut idle_ns);
    let (swapping, _, _) = summary(&mut swapping_ns);
    let name = format!(
        "remap_snapshot/{}/{mode:?}{}",
        family.name(),
        if prefetch { "+prefetch" } else { "" }
    );
    println!(
        "{name}: reader on cpu {reader_cpu}, swapper on cpu {swapper_cpu}; {swaps} swaps in total"
    );
    if mode == Swapper::Edits {
        println!(
            "{name}: refilling took {:.0} us per swap on the swapper's CPU",
            refill_ns.load(Ordering::Relaxed) as f64 / swaps.max(1) as f64 / 1e3
        );
    }
    println!(
        "{name}: A/B over {SWAP_ROUNDS} rounds of {SWAP_RUN_PACKETS} packets: idle {idle:.2} ns, swapping {swapping:.2} ns per packet (medians); ratio median {:+.2} %, IQR {:+.2} % .. {:+.2} %",
        (ratio - 1.0) * 100.0,
        (ratio_q1 - 1.0) * 100.0,
        (ratio_q3 - 1.0) * 100.0,
    );
    let per_ms = swaps_timed as f64 / (swapping_time / 1e6);
    println!(
        "{name}: {per_ms:.2} swaps per ms while timed; loss scaled to one swap per ms {:+.2} %",
        (ratio - 1.0) * 100.0 / per_ms.max(1e-9)
    );
    let steady = sums[AGES.len() - 1].0 / sums[AGES.len() - 1].1.max(1) as f64;
    let mut extra = 0.0;
    let mut line = String::new();
    for (&(lo, hi), &(sum, count)) in AGES.iter().zip(&sums) {
        let mean = sum / count.max(1) as f64;
        if hi != usize::MAX {
            // Every swap has one chunk of each age below 128 (ages run 0, 1, 2, ...).
            extra += (mean - steady) * (hi - lo) as f64 * CHUNK as f64;
        }
        let label = if hi == usize::MAX {
            format!("{lo}+")
        } else {
            format!("{lo}..{hi}")
        };
        line += &format!(" [{label}] {mean:.1}");
    }
    println!(
        "{name}: ns per packet by chunks of {CHUNK} since the swap ({swaps_seen} swaps):{line}"
    );
    println!(
        "{name}: extra time per swap {:.1} us = {:.2} % of 1 ms",
        extra / 1e3,
        extra / 1e6 * 100.0
    );
}

criterion_group! {
    name = benches;
    config = config();
    targets = lookup_and_rewrite, snapshot_swaps
}
criterion_main!(benches);
