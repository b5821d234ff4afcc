//! Two in-memory gateways driven through the core, passing datagrams to each other by hand:
//! no TUN device, no socket, no root. Time is what the test says it is (boringtun's own
//! clock aside; see `clock_tests` for the timers it runs).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};

use super::egress::Egress;
use super::ingress::Ingress;
use super::{Endpoint, MAX_PACKET, Now, OVERHEAD, Outbox, PacketSink, Step, timers};
use crate::admission::flows::FlowTable;
use crate::batch::RecvBatch;
use crate::conncheck::ConnCheckConfig;
use crate::context::Context;
use crate::drops::Drops;
use crate::endpoint::LocalAddr;
use crate::handshake::Handshake;
use crate::key::Key;
use crate::plan::next_snapshot;
use crate::snapshot::Snapshot;
use crate::state::{self, DesiredState, InterfaceConfig, PeerConfig, RouteConfig};
use crate::transmits::Transmits;

mod parallel;

use parallel::Threads;

const BATCH: usize = 16;

/// Datagrams sent from a [`Transmits`], or handshake messages queued, in order; the second
/// list holds their endpoints with the local address each was sent from (or arrived at).
#[derive(Debug, Default)]
pub(super) struct Wire(pub Vec<(SocketAddr, Vec<u8>)>, pub Vec<Endpoint>);

impl Wire {
    fn record(&mut self, endpoint: Endpoint, datagram: &[u8]) {
        self.0.push((endpoint.remote, datagram.to_vec()));
        self.1.push(endpoint);
    }

    /// Sends everything `out` holds, as the shell does: each leaves.
    pub fn send(&mut self, out: &mut Transmits) {
        for transmit in out.iter() {
            self.record(transmit.endpoint(), transmit.datagram);
            transmit.sent();
        }
        out.clear();
    }
}

/// A test's single-datagram arena: as large as the shells'.
pub(super) fn transmits() -> Transmits {
    Transmits::new(BATCH, 2 * (MAX_PACKET + OVERHEAD))
}

/// One side: its real prefix, how the other side sees it, its key and underlay address.
#[derive(Clone)]
pub(super) struct Side {
    pub address: SocketAddr,
    pub key: Key,
    pub real: &'static str,
    pub view: &'static str,
}

pub(super) fn side_a() -> Side {
    Side {
        address: "192.0.2.1:51820".parse().expect("address"),
        key: Key::generate_private(),
        real: "10.10.0.0/24",
        view: "10.110.0.0/24",
    }
}

pub(super) fn side_b() -> Side {
    Side {
        address: "192.0.2.2:51820".parse().expect("address"),
        key: Key::generate_private(),
        real: "10.20.0.0/24",
        view: "10.120.0.0/24",
    }
}

/// The TUN write batch of a test: room for [`BATCH`] packets, as the shell's has, so that
/// decryption stops with [`Step::Flush`] as it does there.
#[derive(Debug)]
struct TunBatch {
    /// The packets committed, in order.
    packets: Vec<Vec<u8>>,
    /// One buffer per packet of the batch; the first `packets.len()` are used.
    slots: Vec<Vec<u8>>,
}

impl Default for TunBatch {
    fn default() -> Self {
        Self {
            packets: Vec::with_capacity(BATCH),
            slots: vec![vec![0; MAX_PACKET]; BATCH],
        }
    }
}

impl PacketSink for TunBatch {
    type Slot = Vec<u8>;

    fn room(&self) -> usize {
        BATCH - self.packets.len()
    }

    fn free_slots(&mut self) -> &mut [Vec<u8>] {
        let used = self.packets.len();
        &mut self.slots[used..]
    }

    fn slot_space(slot: &mut Vec<u8>) -> &mut [u8] {
        slot
    }

    fn commit_slot(&mut self, skip: usize, len: usize) {
        let used = self.packets.len();
        self.slots.swap(used, used + skip);
        self.packets.push(self.slots[used][..len].to_vec());
    }
}

/// A gateway as the data-path tasks see it: a snapshot, counters and the batch buffers.
pub(super) struct Gateway {
    pub address: SocketAddr,
    pub snapshot: Snapshot,
    pub drops: Drops,
    egress: Egress,
    ingress: Ingress,
    outbox: Outbox,
    writer: TunBatch,
    inbound: RecvBatch,
    transmits: Transmits,
    handshake: Handshake,
    /// The threads a long run of one peer is sealed and opened on.
    pub workers: Threads,
    /// The flows its pods opened (outside the snapshot, as in the shell).
    pub flows: FlowTable,
}

/// What one delivery of datagrams to a gateway produced.
#[derive(Debug, Default)]
pub(super) struct Received {
    /// Packets written to the TUN device.
    pub packets: Vec<Vec<u8>>,
    /// Datagrams sent back (handshake replies, probe answers, queued packets).
    pub replies: Vec<(SocketAddr, Vec<u8>)>,
    /// Where each of `replies` went, with the local address it left from.
    pub reply_endpoints: Vec<Endpoint>,
}

impl Gateway {
    pub fn new(this: &Side, other: &Side, keepalive: u16) -> Gateway {
        let mut peer = PeerConfig::new(other.key.public_key());
        peer.endpoint = Some(state::Endpoint::Addr(other.address));
        peer.persistent_keepalive = keepalive;
        peer.routes = vec![RouteConfig::remapped(
            other.real.parse().expect("real prefix"),
            other.view.parse().expect("view prefix"),
        )];
        let state = DesiredState {
            version: "core-test".to_owned(),
            interface: InterfaceConfig {
                private_key: Some(this.key),
                listen_port: this.address.port(),
                conncheck: Some(ConnCheckConfig::default()),
                ..InterfaceConfig::default()
            },
            peers: vec![peer],
            admissions: Vec::new(),
        };
        Gateway::from_state(this.address, &state)
    }

    /// A gateway at `address` running `state`, each peer at the address it is configured with.
    pub fn from_state(address: SocketAddr, state: &DesiredState) -> Gateway {
        state.validate().expect("valid state");
        let resolved: Vec<Option<SocketAddr>> = state
            .peers
            .iter()
            .map(|peer| match peer.endpoint {
                Some(state::Endpoint::Addr(address)) => Some(address),
                _ => None,
            })
            .collect();
        let initial = Snapshot::initial(DesiredState::default());
        let snapshot = next_snapshot(&initial, state, &resolved, at(START_MS)).expect("snapshot");
        Gateway {
            address,
            snapshot,
            drops: Drops::default(),
            egress: Egress::new(BATCH),
            ingress: Ingress::new(BATCH),
            outbox: Outbox::new(BATCH),
            writer: TunBatch::default(),
            inbound: RecvBatch::new(BATCH),
            transmits: transmits(),
            handshake: Handshake::new(),
            workers: Threads::default(),
            flows: FlowTable::new(1024),
        }
    }

    /// Packets read from the TUN device: remapped, encrypted; the datagrams that left.
    pub fn send(&mut self, packets: Vec<Vec<u8>>, now: Now) -> Vec<(SocketAddr, Vec<u8>)> {
        self.send_to_endpoints(packets, now)
            .into_iter()
            .map(|(to, datagram)| (to.remote, datagram))
            .collect()
    }

    /// [`Self::send`], with the local address each datagram leaves from.
    pub fn send_to_endpoints(
        &mut self,
        mut packets: Vec<Vec<u8>>,
        now: Now,
    ) -> Vec<(Endpoint, Vec<u8>)> {
        let mut sent = Vec::new();
        let cx = Context::new(&self.snapshot, &self.drops, now)
            .with_flows(&self.flows)
            .with_workers(&self.workers);
        self.egress.route(&cx, &mut packets);
        loop {
            let step = self.egress.encrypt(&cx, &packets, &mut self.outbox);
            sent.extend(
                self.outbox
                    .datagrams()
                    .map(|(to, datagram)| (to, datagram.to_vec())),
            );
            self.outbox.clear();
            if step == Step::Done {
                return sent;
            }
        }
    }

    /// Datagrams arriving from `from`: classified, decrypted (handshakes processed as the
    /// worker would, after the batch).
    pub fn receive(&mut self, from: SocketAddr, datagrams: &[Vec<u8>], now: Now) -> Received {
        self.receive_at(from, None, datagrams, now)
    }

    /// [`Self::receive`] of datagrams sent to our address `local`.
    pub fn receive_at(
        &mut self,
        from: SocketAddr,
        local: Option<LocalAddr>,
        datagrams: &[Vec<u8>],
        now: Now,
    ) -> Received {
        let mut received = Received::default();
        let mut handshakes = Wire::default();
        let mut replies = Wire::default();
        let cx = Context::new(&self.snapshot, &self.drops, now)
            .with_flows(&self.flows)
            .with_workers(&self.workers);
        for chunk in datagrams.chunks(BATCH) {
            self.inbound.clear();
            for datagram in chunk {
                assert!(
                    self.inbound.push_to(from, local, datagram),
                    "batch has room"
                );
            }
            self.ingress.classify(&cx, &self.inbound);
            for message in self.ingress.handshakes(&self.inbound) {
                handshakes.record(message.source, message.datagram);
            }
            loop {
                let step =
                    self.ingress
                        .decrypt(&cx, &self.inbound, &mut self.writer, &mut self.transmits);
                received.packets.append(&mut self.writer.packets);
                replies.send(&mut self.transmits);
                if step == Step::Done {
                    break;
                }
            }
        }
        let cx = Context::new(&self.snapshot, &self.drops, now);
        for (source, (_, message)) in handshakes.1.into_iter().zip(handshakes.0) {
            let mut step = self
                .handshake
                .process(&cx, source, &message, &mut self.transmits);
            replies.send(&mut self.transmits);
            while step == Step::Flush {
                step = self.handshake.resume(&cx, &mut self.transmits);
                replies.send(&mut self.transmits);
            }
        }
        received.replies = replies.0;
        received.reply_endpoints = replies.1;
        received
    }

    /// One timer tick at `now`: what the timers sent.
    pub fn tick(&mut self, now: Now) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut wire = Wire::default();
        let cx = Context::new(&self.snapshot, &self.drops, now);
        let mut tick = timers::Tick::default();
        while tick.run(&cx, &mut self.transmits) == Step::Flush {
            wire.send(&mut self.transmits);
        }
        wire.send(&mut self.transmits);
        wire.0
    }

    pub fn drop_count(&self, reason: &str) -> u64 {
        self.drops
            .snapshot()
            .into_iter()
            .find(|(name, _)| *name == reason)
            .map_or_else(|| panic!("no drop reason {reason}"), |(_, count)| count)
    }

    pub fn peer(&self) -> &std::sync::Arc<crate::peer::Peer> {
        self.snapshot
            .slots()
            .next()
            .and_then(|(_, slot)| slot.runtime.as_ref())
            .expect("one peer with a runtime")
    }
}

/// When the tests' gateways are made (Unix milliseconds).
pub(super) const START_MS: u64 = 1_000_000;

pub(super) fn at(unix_ms: u64) -> Now {
    Now {
        unix_ms,
        mono_us: unix_ms * 1000,
    }
}

pub(super) fn payloads(datagrams: &[(SocketAddr, Vec<u8>)]) -> Vec<Vec<u8>> {
    datagrams.iter().map(|(_, d)| d.clone()).collect()
}

/// Delivers datagrams back and forth between `a` and `b` until neither answers; returns
/// the packets each wrote to its TUN device.
pub(super) fn settle(
    a: &mut Gateway,
    b: &mut Gateway,
    from_a: Vec<(SocketAddr, Vec<u8>)>,
    now: Now,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let (mut at_a, mut at_b) = (Vec::new(), Vec::new());
    let mut to_b = from_a;
    for _ in 0..8 {
        assert!(to_b.iter().all(|(to, _)| *to == b.address), "sent to B");
        let received = b.receive(a.address, &payloads(&to_b), now);
        at_b.extend(received.packets);
        if received.replies.is_empty() {
            return (at_a, at_b);
        }
        let received = a.receive(b.address, &payloads(&received.replies), now);
        at_a.extend(received.packets);
        to_b = received.replies;
        if to_b.is_empty() {
            return (at_a, at_b);
        }
    }
    panic!("the gateways kept answering each other");
}

pub(super) fn udp(src: &str, dst: &str, payload: &[u8]) -> Vec<u8> {
    let src: Ipv4Addr = src.parse().expect("source");
    let dst: Ipv4Addr = dst.parse().expect("destination");
    let mut out = Vec::new();
    PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
        .udp(40000, 9000)
        .write(&mut out, payload)
        .expect("serialize");
    out
}

/// Source, destination and UDP payload of an IPv4/UDP packet; checksums verified.
pub(super) fn parse_udp(packet: &[u8]) -> (IpAddr, IpAddr, Vec<u8>) {
    let sliced = SlicedPacket::from_ip(packet).expect("an IP packet");
    let Some(NetSlice::Ipv4(ip)) = sliced.net else {
        panic!("IPv4 expected");
    };
    let header = ip.header().to_header();
    assert_eq!(header.header_checksum, header.calc_header_checksum());
    let Some(TransportSlice::Udp(udp)) = sliced.transport else {
        panic!("UDP expected");
    };
    let checksum = udp
        .to_header()
        .calc_checksum_ipv4(&header, udp.payload())
        .expect("checksum");
    assert_eq!(udp.checksum(), checksum, "UDP checksum after the rewrite");
    (
        IpAddr::V4(header.source.into()),
        IpAddr::V4(header.destination.into()),
        udp.payload().to_vec(),
    )
}

/// Two gateways with a session: A's first packet starts the handshake and is delivered
/// once it completes.
pub(super) fn connected(keepalive: u16, now: Now) -> (Gateway, Gateway, Side) {
    let (sa, sb) = (side_a(), side_b());
    let mut a = Gateway::new(&sa, &sb, keepalive);
    let mut b = Gateway::new(&sb, &sa, keepalive);
    let first = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"first")], now);
    assert_eq!(
        first.len(),
        1,
        "a handshake initiation instead of the packet"
    );
    let (_, at_b) = settle(&mut a, &mut b, first, now);
    assert_eq!(
        at_b.len(),
        1,
        "the queued packet arrives after the handshake"
    );
    (a, b, sb)
}

#[test]
fn handshake_then_data_both_ways_with_remap() {
    let now = at(1_000_000);
    let (sa, sb) = (side_a(), side_b());
    let mut a = Gateway::new(&sa, &sb, 0);
    let mut b = Gateway::new(&sb, &sa, 0);

    // No session yet: boringtun queues the packet and sends an initiation.
    let first = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"first")], now);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].0, sb.address);
    assert_eq!(first[0].1.len(), 148, "a handshake initiation");
    assert_eq!(
        a.peer().stats.handshake_pending_since_ms.load(Relaxed),
        now.unix_ms
    );

    let (at_a, at_b) = settle(&mut a, &mut b, first, now);
    assert!(at_a.is_empty());
    assert_eq!(at_b.len(), 1);
    // A's pod wrote to B's view; B's pod sees A's view as the source.
    let (src, dst, payload) = parse_udp(&at_b[0]);
    assert_eq!(src, "10.110.0.5".parse::<IpAddr>().expect("ip"));
    assert_eq!(dst, "10.20.0.7".parse::<IpAddr>().expect("ip"));
    assert_eq!(payload, b"first");
    for gateway in [&a, &b] {
        let stats = &gateway.peer().stats;
        assert_eq!(stats.handshakes.load(Relaxed), 1);
        assert_eq!(stats.last_handshake_ms.load(Relaxed), now.unix_ms);
    }

    // With the session up, data goes straight through, both ways, in batches.
    let batch: Vec<Vec<u8>> = (0..40u8)
        .map(|n| udp("10.20.0.7", "10.110.0.5", &[n; 100]))
        .collect();
    let rx_before = a.peer().stats.rx_packets.load(Relaxed);
    let sent = b.send(batch, now);
    assert_eq!(
        sent.len(),
        40,
        "one datagram per packet, across outbox flushes"
    );
    let received = a.receive(sb.address, &payloads(&sent), now);
    assert!(received.replies.is_empty());
    assert_eq!(received.packets.len(), 40);
    for (n, packet) in received.packets.iter().enumerate() {
        let (src, dst, payload) = parse_udp(packet);
        assert_eq!(src, "10.120.0.7".parse::<IpAddr>().expect("ip"));
        assert_eq!(dst, "10.10.0.5".parse::<IpAddr>().expect("ip"));
        assert_eq!(payload, vec![n as u8; 100], "arrival order kept");
    }
    assert_eq!(a.peer().stats.rx_packets.load(Relaxed) - rx_before, 40);
    for gateway in [&a, &b] {
        assert!(
            gateway
                .drops
                .snapshot()
                .iter()
                .all(|(_, count)| *count == 0),
            "nothing dropped: {:?}",
            gateway.drops.snapshot()
        );
    }
}

#[test]
fn remap_drops_what_it_cannot_route_or_did_not_allow() {
    let now = at(1_000_000);
    let (mut a, mut b, _) = connected(0, now);
    // No view covers the destination: dropped before any crypto.
    assert!(
        a.send(vec![udp("10.10.0.5", "10.99.0.1", b"x")], now)
            .is_empty()
    );
    assert_eq!(a.drop_count("no_route"), 1);
    // Local traffic may not pose as a connectivity probe.
    assert!(
        a.send(vec![udp("10.10.0.5", "169.254.90.2", b"x")], now)
            .is_empty()
    );
    assert_eq!(a.drop_count("probe_address"), 1);
    // A source outside A's real prefix is refused by B after decryption.
    let spoofed = a.send(vec![udp("10.99.0.5", "10.120.0.7", b"spoof")], now);
    assert_eq!(spoofed.len(), 1);
    let received = b.receive(a.address, &payloads(&spoofed), now);
    assert!(received.packets.is_empty());
    assert_eq!(b.drop_count("source_not_allowed"), 1);
}

#[test]
fn replayed_and_garbage_datagrams_are_dropped_and_counted() {
    let now = at(1_000_000);
    let (mut a, mut b, sb) = connected(0, now);
    let sent = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"once")], now);
    assert_eq!(b.receive(a.address, &payloads(&sent), now).packets.len(), 1);
    // The same datagram again: boringtun's replay window refuses it.
    let again = b.receive(a.address, &payloads(&sent), now);
    assert!(again.packets.is_empty() && again.replies.is_empty());
    assert_eq!(b.drop_count("rejected"), 1);

    // A flipped bit in the ciphertext fails authentication.
    let mut forged = sent[0].1.clone();
    let last = forged.len() - 1;
    forged[last] ^= 1;
    assert!(b.receive(a.address, &[forged], now).packets.is_empty());
    assert_eq!(b.drop_count("rejected"), 2);

    // Not WireGuard at all, truncated, and data for a receiver index nobody has.
    let mut unknown = sent[0].1.clone();
    unknown[4..8].copy_from_slice(&0xdead_beefu32.to_le_bytes());
    let garbage = vec![
        vec![],
        vec![0xff; 3],
        vec![4, 0, 0, 0, 1],
        vec![9; 200],
        sent[0].1[..20].to_vec(),
        unknown,
    ];
    let received = b.receive(a.address, &garbage, now);
    assert!(received.packets.is_empty() && received.replies.is_empty());
    // The empty datagram yields nothing to classify (as an empty receive); the rest count.
    assert_eq!(b.drop_count("invalid_datagram"), 4);
    assert_eq!(b.drop_count("unknown_receiver"), 1);

    // A handshake initiation that is not from a configured key.
    let stranger = Side {
        address: "192.0.2.9:51820".parse().expect("address"),
        ..side_a()
    };
    let mut c = Gateway::new(&stranger, &sb, 0);
    let initiation = c.send(vec![udp("10.10.0.5", "10.120.0.7", b"x")], now);
    let received = b.receive(stranger.address, &payloads(&initiation), now);
    assert!(received.replies.is_empty());
    assert_eq!(b.drop_count("unknown_initiator"), 1);
    // One addressed to another key fails its MAC.
    let other = side_b();
    let mut d = Gateway::new(&stranger, &other, 0);
    let initiation = d.send(vec![udp("10.10.0.5", "10.120.0.7", b"x")], now);
    assert!(
        b.receive(stranger.address, &payloads(&initiation), now)
            .replies
            .is_empty()
    );
    assert_eq!(b.drop_count("rejected"), 3);

    // The real session is unharmed.
    let sent = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"still")], now);
    assert_eq!(b.receive(a.address, &payloads(&sent), now).packets.len(), 1);
}

#[test]
fn persistent_keepalive_follows_the_injected_clock() {
    let start = 1_000_000;
    let (mut a, _b, _) = connected(25, at(start));
    let last_sent = a.peer().stats.last_sent_ms.load(Relaxed);
    assert_eq!(last_sent, start);
    // Not due yet.
    assert!(a.tick(at(start + 24_999)).is_empty());
    // Due: one keepalive (an empty data message, 32 bytes) to B.
    let sent = a.tick(at(start + 25_000));
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1.len(), 32);
    assert_eq!(a.peer().stats.last_sent_ms.load(Relaxed), start + 25_000);
    assert!(
        a.tick(at(start + 26_000)).is_empty(),
        "not again until the next period"
    );
}

#[test]
fn connectivity_probe_round_trip_measures_the_injected_rtt() {
    let start = 1_000_000;
    let (mut a, mut b, _) = connected(0, at(start));
    let ping = a
        .peer()
        .conncheck
        .lock()
        .next_ping(at(start).mono_us, 2_000_000);
    let mut wire = Wire::default();
    let mut out = transmits();
    let direct = timers::send_probe(a.peer(), b.address.into(), ping, at(start), &mut out);
    wire.send(&mut out);
    assert!(direct, "sent through the session");
    // B consumes the PING (nothing reaches its TUN device) and answers with a PONG.
    let received = b.receive(a.address, &payloads(&wire.0), at(start + 3));
    assert!(received.packets.is_empty());
    assert_eq!(received.replies.len(), 1);
    let answered = a.receive(b.address, &payloads(&received.replies), at(start + 7));
    assert!(answered.packets.is_empty(), "the PONG is the gateway's own");
    let reading = a.peer().conncheck.lock().reading();
    assert_eq!(reading.last_rtt_us, Some(7_000));
    assert_eq!(reading.consecutive_losses, 0);
}

#[test]
fn initiation_after_apply_only_without_a_session() {
    let now = at(1_000_000);
    let (sa, sb) = (side_a(), side_b());
    let a = Gateway::new(&sa, &sb, 0);
    let mut wire = Wire::default();
    let mut out = transmits();
    let (_, slot) = a.snapshot.slots().next().expect("a peer");
    assert!(timers::initiate_session(slot, now, &mut out, false));
    wire.send(&mut out);
    assert_eq!(wire.0.len(), 1);
    assert_eq!(wire.0[0].0, sb.address);
    let (a, _b, _) = connected(0, now);
    let (_, slot) = a.snapshot.slots().next().expect("a peer");
    assert!(!timers::initiate_session(slot, now, &mut out, false));
}

#[test]
fn a_promoted_replica_initiates_despite_a_session_and_the_remote_roams_to_it() {
    let now = at(1_000_000);
    let (a, mut b, _) = connected(0, now);
    let mut wire = Wire::default();
    let mut out = transmits();
    let (_, slot) = a.snapshot.slots().next().expect("a peer");
    // An initiation's timestamp must be newer than the last one the remote accepted.
    let later = at(1_001_000);
    assert!(
        timers::initiate_session(slot, later, &mut out, true),
        "forced although a session exists"
    );
    wire.send(&mut out);
    // The same key and state, another node's address: a standby that took over.
    let replica: SocketAddr = "192.0.2.99:51820".parse().expect("address");
    assert_ne!(b.peer().remote(), Some(replica));
    let received = b.receive(replica, &payloads(&wire.0), at(1_000_050));
    assert_eq!(received.replies.len(), 1, "the initiation is answered");
    assert_eq!(received.replies[0].0, replica, "towards the replica");
    assert_eq!(b.peer().remote(), Some(replica), "the remote roamed");
}

#[test]
fn a_handshake_flood_is_answered_with_cookies() {
    let now = at(1_000_000);
    let (sa, sb) = (side_a(), side_b());
    let mut a = Gateway::new(&sa, &sb, 0);
    let mut b = Gateway::new(&sb, &sa, 0);
    let initiation = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"x")], now);
    let flood: Vec<Vec<u8>> = std::iter::repeat_n(initiation[0].1.clone(), 150).collect();
    let received = b.receive(sa.address, &flood, now);
    let cookies = received
        .replies
        .iter()
        .filter(|(to, reply)| *to == sa.address && reply.len() == 64 && reply[0] == 3)
        .count();
    // Past the gate's allowance (100 a second) only cookie replies: no Diffie-Hellman.
    assert!(cookies >= 50, "{cookies} cookie replies");
    assert_eq!(b.drop_count("under_load"), cookies as u64);
    assert_eq!(
        b.peer().stats.handshakes.load(Relaxed),
        1,
        "the first one completes"
    );
}

#[test]
fn responses_to_our_initiations_pass_a_gate_a_flood_exhausted() {
    let now = at(1_000_000);
    let (sa, sb) = (side_a(), side_b());
    let mut a = Gateway::new(&sa, &sb, 0);
    let mut b = Gateway::new(&sb, &sa, 0);
    let initiation = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"x")], now);
    let response = b.receive(sa.address, &payloads(&initiation), now).replies;
    assert_eq!(response.len(), 1, "B answers the initiation");

    // Meanwhile a stranger exhausts A's gate with initiations for A's key.
    let stranger: SocketAddr = "198.51.100.9:40000".parse().expect("address");
    let mut tunn = boringtun::noise::Tunn::new(
        boringtun::x25519::StaticSecret::from(*Key::generate_private().as_bytes()),
        boringtun::x25519::PublicKey::from(*sa.key.public_key().as_bytes()),
        None,
        None,
        1,
        None,
    );
    let mut out = [0u8; 256];
    let flood_message = match tunn.format_handshake_initiation(&mut out, false) {
        boringtun::noise::TunnResult::WriteToNetwork(datagram) => datagram.to_vec(),
        _ => panic!("an initiation"),
    };
    a.receive(stranger, &vec![flood_message; 150], now);
    let cookies = a.drop_count("under_load");
    assert_eq!(cookies, 50, "the gate let 100 through");

    // B's response to A's own initiation is still accepted: no cookie, the session is up.
    let received = a.receive(sb.address, &payloads(&response), now);
    assert_eq!(
        a.drop_count("under_load"),
        cookies,
        "no cookie for our response"
    );
    assert_eq!(a.peer().stats.handshakes.load(Relaxed), 1);
    assert!(received.replies.iter().all(|(to, _)| *to == sb.address));

    // The same response again is unsolicited now: it meets the gate, which answers a cookie.
    a.receive(sb.address, &payloads(&response), now);
    assert_eq!(a.drop_count("under_load"), cookies + 1);
    assert_eq!(a.peer().stats.handshakes.load(Relaxed), 1);
}

fn local(ip: &str) -> Option<LocalAddr> {
    Some(LocalAddr {
        ip: ip.parse().expect("ip"),
        ifindex: 3,
    })
}

#[test]
fn replies_leave_from_the_address_the_peer_sent_to_and_follow_it() {
    let now = at(1_000_000);
    let (sa, sb) = (side_a(), side_b());
    let mut a = Gateway::new(&sa, &sb, 0);
    let mut b = Gateway::new(&sb, &sa, 0);
    // A reaches B at the second of B's addresses.
    let initiation = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"first")], now);
    let received = b.receive_at(sa.address, local("192.0.2.22"), &payloads(&initiation), now);
    assert_eq!(received.reply_endpoints.len(), 1, "a handshake response");
    assert_eq!(received.reply_endpoints[0].local, local("192.0.2.22"));
    assert_eq!(
        b.peer().endpoint().and_then(|e| e.local),
        local("192.0.2.22")
    );
    let at_a = a.receive(sb.address, &payloads(&received.replies), now);
    assert!(!at_a.replies.is_empty(), "the queued packet");
    let sent = b.send_to_endpoints(vec![udp("10.20.0.7", "10.110.0.5", b"back")], now);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].0,
        Endpoint {
            remote: sa.address,
            local: local("192.0.2.22")
        }
    );
    // A moves to B's third address: B's replies follow.
    let received = b.receive_at(
        sa.address,
        local("192.0.2.33"),
        &payloads(&at_a.replies),
        now,
    );
    assert_eq!(received.packets.len(), 1);
    let sent = b.send_to_endpoints(vec![udp("10.20.0.7", "10.110.0.5", b"again")], now);
    assert_eq!(sent[0].0.local, local("192.0.2.33"));
    // A local address of the other family is never used as a source.
    let sent = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"v6")], now);
    b.receive_at(sa.address, local("2001:db8::2"), &payloads(&sent), now);
    assert_eq!(b.peer().endpoint().and_then(|e| e.local), None);
}

#[test]
fn a_restarted_gateway_initiates_once_when_its_peer_sends_on_a_session_it_lost() {
    let now = at(1_000_000);
    let (sa, sb) = (side_a(), side_b());
    let mut a = Gateway::new(&sa, &sb, 0);
    let mut b = Gateway::new(&sb, &sa, 0);
    let first = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"first")], now);
    settle(&mut a, &mut b, first, now);
    // B restarts: same key and configuration, no session. A still sends on the old one.
    let mut b = Gateway::new(&sb, &sa, 0);
    let old_session: Vec<_> = (0..5u8)
        .map(|n| udp("10.10.0.5", "10.120.0.7", &[n; 40]))
        .collect();
    let sent = a.send(old_session.clone(), now);
    assert_eq!(sent.len(), 5, "data on the old session, no handshake");
    let received = b.receive_at(sa.address, local("192.0.2.22"), &payloads(&sent), now);
    assert!(received.packets.is_empty());
    assert_eq!(b.drop_count("unknown_receiver"), 5);
    assert_eq!(
        received.replies.len(),
        1,
        "one initiation for five messages"
    );
    assert_eq!(received.replies[0].1[0], 1, "a handshake initiation");
    assert_eq!(
        received.reply_endpoints[0],
        Endpoint {
            remote: sa.address,
            local: local("192.0.2.22")
        }
    );
    // More data while the handshake is under way asks for no second initiation.
    let more = b.receive(sa.address, &payloads(&a.send(old_session, now)), now);
    assert!(
        more.replies.is_empty(),
        "{} more initiations",
        more.replies.len()
    );
    // The initiation is answered and traffic flows again.
    settle(&mut b, &mut a, received.replies, now);
    let sent = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"resumed")], now);
    assert_eq!(
        b.receive(sa.address, &payloads(&sent), now).packets.len(),
        1
    );
}

#[test]
fn data_for_an_unknown_session_from_elsewhere_starts_no_handshake() {
    let now = at(1_000_000);
    let (mut a, _b, sb) = connected(0, now);
    let sent = a.send(vec![udp("10.10.0.5", "10.120.0.7", b"x")], now);
    let restarted = side_a();
    let mut c = Gateway::new(&sb, &restarted, 0);
    // The right key, the wrong address: not where the peer was configured to be.
    let stranger: SocketAddr = "198.51.100.9:40000".parse().expect("address");
    let received = c.receive(stranger, &payloads(&sent), now);
    assert!(received.replies.is_empty() && received.packets.is_empty());
    assert_eq!(c.drop_count("unknown_receiver"), 1);
}
