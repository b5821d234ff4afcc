//! Property-based simulations of gateways on a hostile wire, every clock (boringtun's too)
//! set by the simulation.
//!
//! The first property: two gateways, random sequences of sends, deliveries out of order,
//! losses, duplicates, clock jumps, restarts of either side and roaming of one, then a healing
//! phase on a clean wire. Checked at every step: a packet reaches a TUN device at most once,
//! only if the other side sent it, and translated (source into the receiver's view of the
//! sender, destination back to the real address). Checked after healing: both directions
//! carry fresh packets again within a bounded number of rounds.
//!
//! The second property widens those scenarios with what otherwise only root tests cover, the
//! same checks holding at every step:
//! - Session ageing: the clock moves past REKEY_AFTER_TIME (120 s), often past
//!   REJECT_AFTER_TIME (180 s), in chunks, the timers ticking and both sides' pods sending
//!   after each, over a clean wire or leaving everything in flight. Past REJECT_AFTER_TIME
//!   over a clean wire with both sides active throughout, a handshake must complete during
//!   the step: a new session was negotiated, so the step did age the sessions.
//! - The active/standby role ([`crate::role`]), handled as the shells do: a side goes on
//!   standby at once or when its lease lapses, and a renewal promotes it, which initiates
//!   with every peer, session or not. On standby nothing it reads reaches the core (it is
//!   counted as a `standby` drop), so it writes nothing to its TUN device, and its timers do
//!   not run; checked on every datagram put on the wire: a side on standby sent none. Healing
//!   starts with both leases renewed.
//!
//! [`admission`]: two gateways, one cluster exported to the other, its mode changed under a
//! flow.
//!
//! [`fallback`]: three gateways, a view with a primary route on one peer and a fallback route
//! on another, the connectivity probes driving the switch both ways.
//!
//! Healing gets rounds on top of its own, as many seconds as the scenario moved the clock.
//! They were for an artefact of boringtun's own clock, which stamped a restarted side's
//! initiations older than its previous run's; boringtun now stamps from the `Now` it is
//! handed, so the allowance is a margin the properties no longer need (kept so the
//! assertions stay what they were).

mod admission;
mod fallback;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use proptest::prelude::*;

use super::tests::{Gateway, Side, Wire, at, parse_udp, side_a, side_b, transmits, udp};
use crate::drops::DeviceDrop;
use crate::role::Role;
use crate::timers;

/// Which gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    A,
    B,
}

/// One step of a scenario.
#[derive(Debug, Clone)]
enum Step {
    /// `count` packets from a pod behind `End` to a pod behind the other.
    Send(End, u8),
    /// Delivers the datagram at this index (modulo) of those in flight.
    Deliver(usize),
    /// Delivers everything in flight, newest first.
    DeliverAllReversed,
    /// Loses the datagram at this index (modulo).
    Lose(usize),
    /// Delivers a copy of the datagram at this index (modulo), keeping it in flight.
    Duplicate(usize),
    /// Moves both clocks by this many seconds and runs both gateways' timers.
    Tick(u8),
    /// `kill -9` and start again: same key and configuration, no sessions.
    Restart(End),
    /// A's address changes (a NAT rebinding); datagrams to its old address are lost.
    RoamA,
    /// Moves the clock by `seconds` in `chunk`-second steps, each running both sides' timers
    /// and then sending a packet from each; with `flowing` the wire is drained after each.
    Age {
        seconds: u8,
        chunk: u8,
        flowing: bool,
    },
    /// The controller puts `End` on standby at once (`Hold` with zero).
    Standby(End),
    /// The controller renews `End`'s lease for this many seconds: a promotion if it was on
    /// standby or its lease had lapsed.
    Lease(End, u8),
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![Just(End::A), Just(End::B)]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (end(), 1u8..4).prop_map(|(end, count)| Step::Send(end, count)),
        6 => any::<usize>().prop_map(Step::Deliver),
        2 => Just(Step::DeliverAllReversed),
        2 => any::<usize>().prop_map(Step::Lose),
        2 => any::<usize>().prop_map(Step::Duplicate),
        2 => (0u8..30).prop_map(Step::Tick),
        1 => end().prop_map(Step::Restart),
        1 => Just(Step::RoamA),
    ]
}

/// The steps of the first property, sessions aged past REKEY_AFTER_TIME (121 s to 240 s:
/// half of them past REJECT_AFTER_TIME too), and the role changing.
fn widened_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        22 => step(),
        2 => (121u8..=240, 2u8..=20, any::<bool>())
            .prop_map(|(seconds, chunk, flowing)| Step::Age { seconds, chunk, flowing }),
        2 => end().prop_map(Step::Standby),
        2 => (end(), 1u8..=60).prop_map(|(end, seconds)| Step::Lease(end, seconds)),
    ]
}

/// A datagram on the wire.
#[derive(Debug, Clone)]
struct Flight {
    from: SocketAddr,
    to: SocketAddr,
    bytes: Vec<u8>,
}

/// Two gateways, the wire between them and what each side's pods sent and received.
struct Net {
    sides: [Side; 2],
    gateways: [Gateway; 2],
    /// Where each side is now (A's address changes when it roams).
    addresses: [SocketAddr; 2],
    wire: Vec<Flight>,
    now_ms: u64,
    next_id: u32,
    /// Packet ids each side's pods sent, and those delivered to each side's TUN device.
    sent: [HashSet<u32>; 2],
    delivered: [HashSet<u32>; 2],
    roams: u16,
    /// Seconds the test clock moved so far.
    advanced_s: u64,
    /// Each side's role (a restart keeps it: the controller holds the new process alike).
    roles: [Role; 2],
    /// When each side's current run started.
    started_ms: [u64; 2],
    /// Until when a restarted side's initiations may be refused (see the module's note).
    stamps_lag_until_ms: u64,
    /// Whether the timers reset the handshake rate limiters, as the shell's do every second
    /// (the first property runs without, as it was written).
    reset_limiters: bool,
}

/// boringtun's REJECT_AFTER_TIME, seconds: no session is used longer.
const REJECT_AFTER_S: u8 = 180;

/// The clock of the simulation at its start, Unix milliseconds.
const START_MS: u64 = 1_000_000;

/// The pod addresses: each side's real one, and how the other side sees the other's pod.
const POD: [&str; 2] = ["10.10.0.5", "10.20.0.7"];
const VIEW_OF_OTHER: [&str; 2] = ["10.120.0.7", "10.110.0.5"];

impl Net {
    fn new() -> Net {
        let sides = [side_a(), side_b()];
        let gateways = [
            Gateway::new(&sides[0], &sides[1], 0),
            Gateway::new(&sides[1], &sides[0], 0),
        ];
        let addresses = [sides[0].address, sides[1].address];
        Net {
            sides,
            gateways,
            addresses,
            wire: Vec::new(),
            now_ms: START_MS,
            next_id: 0,
            sent: [HashSet::new(), HashSet::new()],
            delivered: [HashSet::new(), HashSet::new()],
            roams: 0,
            advanced_s: 0,
            roles: [Role::default(), Role::default()],
            started_ms: [START_MS; 2],
            stamps_lag_until_ms: 0,
            reset_limiters: false,
        }
    }

    /// Whether side `i` carries traffic now.
    fn active(&self, i: usize) -> bool {
        self.roles[i].is_active(at(self.now_ms).mono_us)
    }

    /// Puts what side `i` sent on the wire; a side on standby must send nothing.
    fn emit(&mut self, i: usize, out: Vec<(SocketAddr, Vec<u8>)>) {
        assert!(
            out.is_empty() || self.active(i),
            "side {i} sent {} datagrams on standby",
            out.len()
        );
        let from = self.addresses[i];
        self.wire.extend(
            out.into_iter()
                .map(|(to, bytes)| Flight { from, to, bytes }),
        );
    }

    fn index(end: End) -> usize {
        match end {
            End::A => 0,
            End::B => 1,
        }
    }

    fn send(&mut self, end: End, count: u8) -> Vec<u32> {
        let i = Self::index(end);
        let ids: Vec<u32> = (0..count)
            .map(|_| {
                self.next_id += 1;
                self.next_id
            })
            .collect();
        let packets = ids
            .iter()
            .map(|id| udp(POD[i], VIEW_OF_OTHER[i], &id.to_le_bytes()))
            .collect();
        self.sent[i].extend(&ids);
        // The TUN reader of a standby drops what it read before the core sees it.
        if !self.active(i) {
            let drops = &self.gateways[i].drops;
            drops.device_many(DeviceDrop::Standby, u64::from(count));
            return ids;
        }
        let out = self.gateways[i].send(packets, at(self.now_ms));
        self.emit(i, out);
        ids
    }

    /// Hands `flight` to the side at its destination, if any, and checks what it wrote to
    /// its TUN device.
    fn deliver(&mut self, flight: Flight) -> Result<(), TestCaseError> {
        let Some(i) = self.addresses.iter().position(|a| *a == flight.to) else {
            return Ok(()); // an address nobody has any more
        };
        // So does the UDP reader of a standby (and its handshake worker).
        if !self.active(i) {
            self.gateways[i].drops.device(DeviceDrop::Standby);
            return Ok(());
        }
        let received = self.gateways[i].receive(flight.from, &[flight.bytes], at(self.now_ms));
        for packet in &received.packets {
            let (src, dst, payload) = parse_udp(packet);
            let other = 1 - i;
            // The receiver sees the sender's pod in its own view, at its own real pod.
            prop_assert_eq!(src.to_string(), VIEW_OF_OTHER[i].to_string());
            prop_assert_eq!(dst.to_string(), POD[i].to_string());
            let id = u32::from_le_bytes(payload[..4].try_into().expect("an id"));
            prop_assert!(
                self.sent[other].contains(&id),
                "packet {} was never sent",
                id
            );
            prop_assert!(
                self.delivered[i].insert(id),
                "packet {} delivered twice",
                id
            );
        }
        self.emit(i, received.replies);
        Ok(())
    }

    fn tick(&mut self, seconds: u64) {
        self.now_ms += seconds * 1000;
        self.advanced_s += seconds;
        for i in 0..2 {
            // The timer task of a standby skips the core: no keepalive, retry or rekey.
            if !self.active(i) {
                continue;
            }
            if self.reset_limiters && seconds > 0 {
                timers::reset_rate_limiters(&self.gateways[i].snapshot, at(self.now_ms));
            }
            let out = self.gateways[i].tick(at(self.now_ms));
            self.emit(i, out);
        }
    }

    /// Ages the sessions (see [`Step::Age`]): the timers see data sent on sessions older
    /// than REKEY_AFTER_TIME, the initiator rekeys, and past REJECT_AFTER_TIME they expire.
    /// Past REJECT_AFTER_TIME over a clean wire, with both sides active throughout and no
    /// restart's stamps lagging, a handshake must complete: no session can last that long
    /// and the data needs one. (Before it, the rekey is the initiator's; after crossed
    /// handshakes boringtun may take neither side for it, and the session lasts until
    /// REJECT_AFTER_TIME: `an_aging_session_is_renegotiated_by_its_initiator` checks it.)
    fn age(&mut self, seconds: u8, chunk: u8, flowing: bool) -> Result<(), TestCaseError> {
        let start_ms = self.now_ms;
        let end_us = at(start_ms + u64::from(seconds) * 1000).mono_us;
        let must_rekey = flowing
            && seconds > REJECT_AFTER_S
            && self.roles.iter().all(|role| role.is_active(end_us))
            && start_ms >= self.stamps_lag_until_ms;
        let mut left = u64::from(seconds);
        while left > 0 {
            let step = left.min(u64::from(chunk));
            left -= step;
            self.tick(step);
            self.send(End::A, 1);
            self.send(End::B, 1);
            if flowing {
                self.drain()?;
            }
        }
        if must_rekey {
            prop_assert!(
                self.last_handshake_ms() > start_ms,
                "no new session while the sessions aged {} s",
                seconds
            );
        }
        Ok(())
    }

    /// The controller holds `end`'s lease for `duration` (zero: standby now), as
    /// `Device::hold` does: on a promotion the shell initiates with every peer, session or not
    /// (`initiate_sessions` with `Initiate::All`), so that the remotes' endpoints move to it.
    fn hold(&mut self, end: End, duration: Duration) {
        let i = Self::index(end);
        let now = at(self.now_ms);
        if !self.roles[i].hold(duration, now.mono_us).promoted() {
            return;
        }
        let mut wire = Wire::default();
        let mut out = transmits();
        for (_, slot) in self.gateways[i].snapshot.slots() {
            if !self.roles[i].is_active(now.mono_us) {
                break;
            }
            timers::initiate_session(slot, now, &mut out, true);
            wire.send(&mut out);
        }
        self.emit(i, wire.0);
    }

    /// The latest handshake either side completed (Unix ms; 0: none).
    fn last_handshake_ms(&self) -> u64 {
        self.gateways
            .iter()
            .map(|gateway| gateway.peer().stats.last_handshake_ms.load(Relaxed))
            .max()
            .unwrap_or(0)
    }

    fn restart(&mut self, end: End) {
        let i = Self::index(end);
        let mut this = self.sides[i].clone();
        this.address = self.addresses[i];
        // Configured as before: the other side's configured address, not where it roamed.
        self.gateways[i] = Gateway::new(&this, &self.sides[1 - i], 0);
        // Its initiations may look older than its previous run's for as long as that ran.
        let lag = self.now_ms + (self.now_ms - self.started_ms[i]);
        self.stamps_lag_until_ms = self.stamps_lag_until_ms.max(lag);
        self.started_ms[i] = self.now_ms;
    }

    fn roam_a(&mut self) {
        self.roams += 1;
        self.addresses[0] = SocketAddr::from(([192, 0, 2, 101], 40_000 + self.roams));
    }

    fn apply(&mut self, step: Step) -> Result<(), TestCaseError> {
        match step {
            Step::Send(end, count) => {
                self.send(end, count);
            }
            Step::Deliver(n) if !self.wire.is_empty() => {
                let flight = self.wire.remove(n % self.wire.len());
                self.deliver(flight)?;
            }
            Step::DeliverAllReversed => {
                let mut flights = std::mem::take(&mut self.wire);
                while let Some(flight) = flights.pop() {
                    self.deliver(flight)?;
                }
            }
            Step::Lose(n) if !self.wire.is_empty() => {
                self.wire.remove(n % self.wire.len());
            }
            Step::Duplicate(n) if !self.wire.is_empty() => {
                let flight = self.wire[n % self.wire.len()].clone();
                self.deliver(flight)?;
            }
            Step::Tick(seconds) => self.tick(u64::from(seconds)),
            Step::Restart(end) => self.restart(end),
            Step::RoamA => self.roam_a(),
            Step::Age {
                seconds,
                chunk,
                flowing,
            } => self.age(seconds, chunk, flowing)?,
            Step::Standby(end) => self.hold(end, Duration::ZERO),
            Step::Lease(end, seconds) => self.hold(end, Duration::from_secs(u64::from(seconds))),
            Step::Deliver(_) | Step::Lose(_) | Step::Duplicate(_) => {}
        }
        Ok(())
    }

    /// Delivers everything in flight, and what that answers, in order, on a clean wire.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..64 {
            if self.wire.is_empty() {
                return Ok(());
            }
            for flight in std::mem::take(&mut self.wire) {
                self.deliver(flight)?;
            }
        }
        prop_assert!(false, "the gateways kept answering each other");
        Ok(())
    }

    /// Rounds of: both sides send, the wire is drained, six seconds pass (a handshake
    /// retry), until a packet each side sent in the same round arrived; the rounds it took.
    fn heal(&mut self, rounds: u32) -> Result<u32, TestCaseError> {
        self.drain()?;
        for round in 1..=rounds {
            let from_a = self.send(End::A, 1)[0];
            let from_b = self.send(End::B, 1)[0];
            self.drain()?;
            if self.delivered[1].contains(&from_a) && self.delivered[0].contains(&from_b) {
                return Ok(round);
            }
            self.tick(6);
            self.drain()?;
        }
        prop_assert!(false, "still cut off after {} rounds", rounds);
        Ok(rounds)
    }

    /// The healing of the second property: both leases renewed for good (promoting a side
    /// on standby), then [`Self::heal`] with as many rounds as the first property's.
    fn heal_widened(&mut self) -> Result<u32, TestCaseError> {
        self.hold(End::A, Duration::MAX);
        self.hold(End::B, Duration::MAX);
        self.heal(8 + u32::try_from(self.advanced_s / 6 + 1).expect("small"))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_hostile_wire_never_delivers_twice_or_unsent_and_the_link_heals(
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let mut net = Net::new();
        for step in steps {
            net.apply(step)?;
        }
        // 15 s of unanswered data before boringtun initiates, retries every 5 s: 8 rounds of
        // 6 s; plus the time a restarted side's stamps may lag (see the module's note).
        let lag_rounds = u32::try_from(net.advanced_s / 6 + 1).expect("small");
        net.heal(8 + lag_rounds)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn sessions_age_and_roles_change_without_duplicates_or_unsent_and_the_link_heals(
        steps in prop::collection::vec(widened_step(), 1..40),
    ) {
        let mut net = Net::new();
        net.reset_limiters = true;
        for step in steps {
            net.apply(step)?;
        }
        net.heal_widened()?;
    }
}

#[test]
fn a_restarted_side_is_reached_again_at_its_peers_next_packet() {
    let mut net = Net::new();
    net.send(End::A, 1);
    net.drain().expect("clean wire");
    assert_eq!(net.delivered[1].len(), 1, "connected");
    net.restart(End::B);
    // A still has its session and only A sends: its first packet is lost on B, which
    // initiates at once because the peer sent on a session it no longer has; A's next
    // packet arrives, no timer involved (boringtun alone would wait 15 s for it).
    let lost = net.send(End::A, 1)[0];
    net.drain().expect("clean wire");
    assert!(!net.delivered[1].contains(&lost));
    assert_eq!(net.gateways[1].drop_count("unknown_receiver"), 1);
    let next = net.send(End::A, 1)[0];
    net.drain().expect("clean wire");
    assert!(net.delivered[1].contains(&next), "the next packet arrives");
}

#[test]
fn an_aging_session_is_renegotiated_by_its_initiator() {
    let mut net = Net::new();
    net.send(End::A, 1);
    net.drain().expect("clean wire");
    let start = net.last_handshake_ms();
    assert_eq!(start, START_MS, "A initiated the session");
    // Both send every 5 s: A rekeys at its first tick past REKEY_AFTER_TIME, without waiting
    // for the session to expire, and nothing sent meanwhile is lost.
    net.age(150, 5, true).expect("delivered once");
    let renewed_after = net.last_handshake_ms() - start;
    assert!(
        (120_000..=125_000).contains(&renewed_after),
        "renegotiated {renewed_after} ms in"
    );
    for gateway in &net.gateways {
        assert_eq!(gateway.peer().stats.handshakes.load(Relaxed), 2);
    }
    assert_eq!(net.delivered[1], net.sent[0]);
    assert_eq!(net.delivered[0], net.sent[1]);
}

#[test]
fn a_standby_side_is_silent_until_promoted_and_lapses_at_its_deadline() {
    let mut net = Net::new();
    net.reset_limiters = true;
    net.send(End::A, 1);
    net.drain().expect("clean wire");
    // On standby A drops what B sends and what its own pods send, unread.
    net.hold(End::A, Duration::ZERO);
    net.tick(1); // (boringtun dates B's data by its last timer run)
    let lost = net.send(End::B, 3);
    net.send(End::A, 2);
    assert!(
        net.wire
            .iter()
            .all(|flight| flight.from == net.addresses[1])
    );
    net.drain().expect("clean wire");
    assert!(lost.iter().all(|id| !net.delivered[0].contains(id)));
    assert_eq!(net.gateways[0].drop_count("standby"), 5);
    // B, unanswered, initiates 15 s after its data; A's timers keep quiet.
    net.tick(30);
    assert!(
        net.wire
            .iter()
            .all(|flight| flight.from == net.addresses[1])
    );
    assert!(net.wire.iter().any(|flight| flight.bytes[0] == 1));
    net.drain().expect("clean wire");
    assert_eq!(net.gateways[1].peer().stats.handshakes.load(Relaxed), 1);

    // Promoted for 20 s: A initiates at once, though it has a session, and traffic flows.
    net.hold(End::A, Duration::from_secs(20));
    assert_eq!(net.wire.len(), 1);
    assert_eq!(net.wire[0].bytes[0], 1, "a handshake initiation");
    net.drain().expect("clean wire");
    assert_eq!(net.gateways[1].peer().stats.handshakes.load(Relaxed), 2);
    let (a, b) = (net.send(End::A, 1)[0], net.send(End::B, 1)[0]);
    net.drain().expect("clean wire");
    assert!(net.delivered[1].contains(&a) && net.delivered[0].contains(&b));

    // Not renewed, the lease lapses: standby again, by itself.
    net.tick(21);
    let lost = net.send(End::B, 1)[0];
    net.send(End::A, 1);
    net.drain().expect("clean wire");
    assert!(!net.delivered[0].contains(&lost));
    assert_eq!(net.gateways[0].drop_count("standby"), 8);
}

/// A replica on standby for longer than a session lives (180 s) and then promoted: its
/// boringtun timers did not run meanwhile, so the session its promotion makes must not be
/// dated back to when standby began (it would expire at the next tick and the peer's next
/// packet would be lost to a second handshake).
#[test]
fn a_side_promoted_after_a_long_standby_keeps_the_session_its_promotion_made() {
    let mut net = Net::new();
    net.reset_limiters = true;
    net.send(End::A, 1);
    net.drain().expect("clean wire");
    net.hold(End::A, Duration::ZERO);
    net.tick(200);
    net.drain().expect("clean wire");

    net.hold(End::A, Duration::from_secs(60));
    net.drain().expect("clean wire");
    let handshakes = net.gateways[1].peer().stats.handshakes.load(Relaxed);
    net.tick(1);
    let (a, b) = (net.send(End::A, 1)[0], net.send(End::B, 1)[0]);
    net.drain().expect("clean wire");
    assert!(
        net.delivered[1].contains(&a),
        "A's first packet after promotion"
    );
    assert!(
        net.delivered[0].contains(&b),
        "B's first packet after promotion"
    );
    assert_eq!(
        net.gateways[1].peer().stats.handshakes.load(Relaxed),
        handshakes,
        "the promotion's session lasted; no second handshake"
    );
}
