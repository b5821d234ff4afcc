//! One peer's run sealed and opened on several threads: [`Threads`], the scoped-thread
//! [`Workers`] of the in-memory gateways, and what it must not change.

use super::{BATCH, Gateway, Side, at, connected, parse_udp, payloads, udp};
use crate::clock::Now;
use crate::workers::Workers;

/// [`Workers`] on scoped threads, one per part, that remember which threads ran parts.
#[derive(Debug, Default)]
pub(crate) struct Threads {
    /// Threads per run, the caller's included (0 or 1: the caller alone).
    pub width: usize,
    /// The threads that ran a part, in the order the parts finished.
    pub ran_on: std::sync::Mutex<Vec<std::thread::ThreadId>>,
}

impl Threads {
    pub fn new(width: usize) -> Self {
        Self {
            width,
            ran_on: Default::default(),
        }
    }

    /// How many different threads ran parts, and forgets them.
    pub fn take_distinct(&self) -> usize {
        let mut ran_on = std::mem::take(&mut *self.ran_on.lock().unwrap());
        ran_on.sort_unstable_by_key(|id| format!("{id:?}"));
        ran_on.dedup();
        ran_on.len()
    }
}

impl Workers for Threads {
    fn width(&self) -> usize {
        self.width.max(1)
    }

    fn run(&self, parts: usize, job: &(dyn Fn(usize) + Sync)) {
        let run = |part| {
            job(part);
            self.ran_on
                .lock()
                .unwrap()
                .push(std::thread::current().id());
        };
        std::thread::scope(|scope| {
            for part in 1..parts {
                scope.spawn(move || run(part));
            }
            run(0);
        });
    }
}

/// [`connected`] gateways that seal and open on two threads.
fn connected_on_two_threads(now: Now) -> (Gateway, Gateway, Side) {
    let (mut a, mut b, sb) = connected(0, now);
    a.workers = Threads::new(2);
    b.workers = Threads::new(2);
    (a, b, sb)
}

#[test]
fn one_peers_run_is_sealed_and_opened_on_two_threads_and_stays_in_order() {
    let now = at(1_000_000);
    let (mut a, mut b, sb) = connected_on_two_threads(now);
    let packets: Vec<Vec<u8>> = (0..BATCH as u16)
        .map(|n| {
            udp(
                "10.10.0.5",
                "10.120.0.7",
                &n.to_be_bytes().repeat(100 + usize::from(n)),
            )
        })
        .collect();
    let sent = a.send(packets.clone(), now);
    assert_eq!(sent.len(), BATCH);
    assert_eq!(a.workers.take_distinct(), 2, "sealed by two threads");
    // In read order: each datagram one counter after the one before it, and as long as its
    // packet (datagram = header + packet + tag).
    let counters: Vec<u64> = sent
        .iter()
        .map(|(_, d)| u64::from_le_bytes(d[8..16].try_into().expect("counter")))
        .collect();
    assert!(
        counters.windows(2).all(|w| w[1] == w[0] + 1),
        "{counters:?}"
    );
    for ((_, datagram), packet) in sent.iter().zip(&packets) {
        assert_eq!(datagram.len(), packet.len() + crate::OVERHEAD);
    }
    let received = b.receive(a.address, &payloads(&sent), now);
    assert_eq!(b.workers.take_distinct(), 2, "opened by two threads");
    assert_eq!(received.packets.len(), BATCH);
    for (n, packet) in received.packets.iter().enumerate() {
        let (_, _, payload) = parse_udp(packet);
        assert_eq!(
            payload,
            (n as u16).to_be_bytes().repeat(100 + n),
            "arrival order kept"
        );
    }
    // The same datagrams again are replays, refused on every thread.
    let replayed = b.receive(a.address, &payloads(&sent), now);
    assert!(replayed.packets.is_empty());
    assert_eq!(b.drop_count("rejected"), BATCH as u64);
    // And the other way, through the session B now sends on.
    let back = b.send(vec![udp("10.20.0.7", "10.110.0.5", b"back")], now);
    let received = a.receive(sb.address, &payloads(&back), now);
    assert_eq!(received.packets.len(), 1);
}

/// A long run opened in parts, straight into the TUN batch's slots, with forged datagrams
/// among it: those are refused and counted, and the others reach the batch whole and in
/// arrival order, leaving no hole where a refused one was opened.
#[test]
fn refused_datagrams_in_a_run_opened_in_parts_leave_no_hole() {
    let now = at(1_000_000);
    let (mut a, mut b, _) = connected_on_two_threads(now);
    let payload = |n: usize| (n as u16).to_be_bytes().repeat(50 + n);
    let packets = (0..BATCH)
        .map(|n| udp("10.10.0.5", "10.120.0.7", &payload(n)))
        .collect();
    let mut sent = a.send(packets, now);
    let forged = |n: usize| n % 5 == 2;
    for (n, (_, datagram)) in sent.iter_mut().enumerate() {
        if forged(n) {
            let last = datagram.len() - 1;
            datagram[last] ^= 1;
        }
    }
    let received = b.receive(a.address, &payloads(&sent), now);
    assert_eq!(b.workers.take_distinct(), 2, "opened by two threads");
    let kept: Vec<usize> = (0..BATCH).filter(|&n| !forged(n)).collect();
    assert_eq!(
        b.drop_count("rejected"),
        (BATCH - kept.len()) as u64,
        "the forged ones"
    );
    assert_eq!(received.packets.len(), kept.len());
    for (packet, n) in received.packets.iter().zip(kept) {
        let (_, _, got) = parse_udp(packet);
        assert_eq!(got, payload(n), "packet {n} whole and in arrival order");
    }
}
