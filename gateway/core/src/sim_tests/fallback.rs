//! Fallback paths on three in-memory gateways ([`crate::path`], the fallbacks of
//! [`crate::plan`], the probes of [`crate::conncheck`]). X reaches the view 10.73.0.0/16
//! through S, its primary route (S's pods are 10.70.0.0/16), and through the hub H, a
//! fallback route (H sees the same pods as 10.72.0.0/16), while S is unreachable. X's prober
//! runs as the shell's `probe.rs` runs it: a PING per due peer, the primary's losses fed to
//! its `PathState`, the snapshot planned again on a switch as `Device::replan` does. A round
//! is 200 ms of the test clock (the fallback interval): every gateway's timers, X's probe
//! round, then one packet from each side's pods: X's to the view, S's and H's (as if relayed
//! from S's pods) to X's pod. The link X–S goes up and down by a random schedule; H's stays
//! up. The hub's forwarding is not simulated: H's TUN device is where a packet through the
//! fallback ends.
//!
//! Checked every round: X's packet reaches the TUN device of exactly the peer the path
//! state names (S's only while the link is up), once, translated for it; X's pod receives,
//! seen from the view, the packet of that peer only. The view moves to H as soon as
//! `loss_threshold` PINGs in a row were lost, never before; it moves back once the PINGs of
//! 3 s (the hold) were answered, never before.

use std::collections::HashSet;
use std::net::SocketAddr;

use proptest::prelude::*;

use super::super::tests::{Gateway, Wire, at, parse_udp, transmits, udp};
use crate::conncheck::ConnCheckConfig;
use crate::key::Key;
use crate::path::RETURN_HOLD_US;
use crate::plan::next_snapshot;
use crate::state::{DesiredState, Endpoint, InterfaceConfig, PeerConfig, RouteConfig};
use crate::timers::send_probe;

const X: usize = 0;
const S: usize = 1;
const H: usize = 2;
const ROUND_MS: u64 = 200;
const THRESHOLD: u32 = 5;
/// Rounds with the link up before the view returns: the first PING answered ends the loss
/// run, the next round starts the hold, which lasts 3 s.
const RETURN_ROUNDS: usize = (RETURN_HOLD_US / (ROUND_MS * 1000)) as usize + 1;

/// Each node's pod address, the address its packet is for, and how the packet must arrive:
/// X's at S and at H, S's and H's at X (the same view either way).
const POD: [&str; 3] = ["10.10.0.5", "10.70.0.7", "10.72.0.7"];
const TO: [&str; 3] = ["10.73.0.7", "10.110.0.5", "10.130.0.5"];
const ARRIVES: [(&str, &str); 3] = [
    ("10.73.0.7", "10.10.0.5"),
    ("10.110.0.5", "10.70.0.7"),
    ("10.130.0.5", "10.72.0.7"),
];

fn net(text: &str) -> ipnet::IpNet {
    text.parse().expect("prefix")
}

fn peer(key: &Key, address: SocketAddr, routes: Vec<RouteConfig>) -> PeerConfig {
    let mut peer = PeerConfig::new(key.public_key());
    peer.endpoint = Some(Endpoint::Addr(address));
    peer.routes = routes;
    peer
}

fn state(key: Key, peers: Vec<PeerConfig>) -> DesiredState {
    DesiredState {
        version: "fallback".to_owned(),
        interface: InterfaceConfig {
            private_key: Some(key),
            listen_port: 51820,
            conncheck: Some(ConnCheckConfig {
                interval_ms: 2000,
                loss_threshold: THRESHOLD,
                fallback_interval_ms: ROUND_MS as u32,
            }),
            ..InterfaceConfig::default()
        },
        peers,
        admissions: Vec::new(),
    }
}

/// A datagram on the wire, from node `from`.
struct Flight {
    from: usize,
    to: SocketAddr,
    bytes: Vec<u8>,
}

struct Trio {
    nodes: [Gateway; 3],
    addresses: [SocketAddr; 3],
    keys: [Key; 3],
    link_up: bool,
    wire: Vec<Flight>,
    now_ms: u64,
    /// Every (sender, packet id) written to a TUN device so far.
    delivered: HashSet<(usize, u32)>,
}

impl Trio {
    fn new() -> Trio {
        let keys = [(); 3].map(|()| Key::generate_private());
        let addresses = [1, 2, 3].map(|n| SocketAddr::from(([192, 0, 2, n], 51820)));
        let to_x = |view| vec![RouteConfig::remapped(net("10.10.0.0/24"), net(view))];
        let fallback = RouteConfig {
            fallback: true,
            ..RouteConfig::remapped(net("10.72.0.0/16"), net("10.73.0.0/16"))
        };
        let states = [
            state(
                keys[X],
                vec![
                    peer(
                        &keys[S],
                        addresses[S],
                        vec![RouteConfig::remapped(
                            net("10.70.0.0/16"),
                            net("10.73.0.0/16"),
                        )],
                    ),
                    peer(
                        &keys[H],
                        addresses[H],
                        vec![RouteConfig::identity(net("10.200.0.0/16")), fallback],
                    ),
                ],
            ),
            state(
                keys[S],
                vec![peer(&keys[X], addresses[X], to_x("10.110.0.0/24"))],
            ),
            state(
                keys[H],
                vec![peer(&keys[X], addresses[X], to_x("10.130.0.0/24"))],
            ),
        ];
        let nodes = [X, S, H].map(|i| Gateway::from_state(addresses[i], &states[i]));
        Trio {
            nodes,
            addresses,
            keys,
            link_up: true,
            wire: Vec::new(),
            now_ms: 1_000_000,
            delivered: HashSet::new(),
        }
    }

    fn carry(&mut self, from: usize, out: Vec<(SocketAddr, Vec<u8>)>) {
        let flights = out
            .into_iter()
            .map(|(to, bytes)| Flight { from, to, bytes });
        self.wire.extend(flights);
    }

    /// Delivers everything in flight and what it answers, losing what crosses X–S while the
    /// link is down; the packets each node wrote to its TUN device.
    fn deliver_all(&mut self) -> [Vec<Vec<u8>>; 3] {
        let mut tun: [Vec<Vec<u8>>; 3] = Default::default();
        for _ in 0..16 {
            if self.wire.is_empty() {
                return tun;
            }
            for flight in std::mem::take(&mut self.wire) {
                let to = self.addresses.iter().position(|a| *a == flight.to);
                let to = to.expect("a node's address");
                if !self.link_up && [flight.from.min(to), flight.from.max(to)] == [X, S] {
                    continue; // lost
                }
                let from = self.addresses[flight.from];
                let received = self.nodes[to].receive(from, &[flight.bytes], at(self.now_ms));
                tun[to].extend(received.packets);
                self.carry(to, received.replies);
            }
        }
        panic!("the gateways kept answering each other");
    }

    /// Whether X's view of S's pods goes through H.
    fn failed_over(&self) -> bool {
        let x = &self.nodes[X].snapshot;
        let slot = x
            .peer(x.by_key[&self.keys[S].public_key()])
            .expect("S's slot");
        let peer = slot.runtime.as_deref().expect("a runtime");
        peer.path.lock().failed_over()
    }

    /// One round of X's prober, as the shell's `probe.rs` runs it (its logging aside); on a
    /// switch of the primary's path, the snapshot is planned again (same state), as
    /// `Device::replan` does.
    fn probe_round(&mut self) {
        let now = at(self.now_ms);
        let x = &self.nodes[X];
        let config = x
            .snapshot
            .state
            .interface
            .conncheck
            .expect("the check is on");
        let round_us = u64::from(config.shortest_interval_ms()) * 1000;
        let (mut wire, mut out, mut switched) = (Wire::default(), transmits(), false);
        for (_, slot) in x.snapshot.slots() {
            if !slot.config.conncheck {
                continue;
            }
            let peer = slot.runtime.as_ref().expect("a runtime");
            let endpoint = peer.endpoint().expect("an endpoint");
            let config = config.for_peer(slot.backed_up);
            let (ping, losses) = {
                let mut prober = peer.conncheck.lock();
                if !prober.is_due(now.mono_us, config.interval_us(), round_us) {
                    continue;
                }
                let ping = prober.next_ping(now.mono_us, config.interval_us());
                (ping, prober.consecutive_losses())
            };
            if slot.backed_up {
                let mut path = peer.path.lock();
                switched |= path.observe(losses, config.loss_threshold, now).is_some();
            }
            if !send_probe(peer, endpoint, ping, now, &mut out) {
                peer.conncheck.lock().delayed(ping.seq);
            }
            wire.send(&mut out);
        }
        if switched {
            let resolved = vec![None; x.snapshot.state.peers.len()];
            let next =
                next_snapshot(&x.snapshot, &x.snapshot.state, &resolved, now).expect("replan");
            self.nodes[X].snapshot = next;
        }
        self.carry(X, wire.0);
    }

    /// One round with the link X–S `up`: the nodes' packets carry `id`. Returns whether X's
    /// view went through H in it.
    fn round(&mut self, up: bool, id: u32) -> Result<bool, TestCaseError> {
        self.link_up = up;
        self.now_ms += ROUND_MS;
        let now = at(self.now_ms);
        for i in [X, S, H] {
            let out = self.nodes[i].tick(now);
            self.carry(i, out);
        }
        self.probe_round();
        let probes = self.deliver_all();
        prop_assert!(probes.iter().all(Vec::is_empty), "probes are consumed");
        for i in [X, S, H] {
            let packet = udp(POD[i], TO[i], &[&[i as u8][..], &id.to_le_bytes()].concat());
            let out = self.nodes[i].send(vec![packet], now);
            self.carry(i, out);
        }
        let tun = self.deliver_all();
        let via_hub = self.failed_over();
        let via = if via_hub { H } else { S };
        let mut arrived = Vec::new();
        for (at_node, packets) in tun.iter().enumerate() {
            for packet in packets {
                let (src, dst, payload) = parse_udp(packet);
                let from = usize::from(payload[0]);
                let packet_id = u32::from_le_bytes(payload[1..5].try_into().expect("an id"));
                prop_assert_eq!(packet_id, id, "from this round");
                prop_assert!(self.delivered.insert((from, id)), "delivered twice");
                let (source, destination) = ARRIVES[at_node];
                prop_assert_eq!(
                    (src.to_string(), dst.to_string()),
                    (source.into(), destination.into())
                );
                arrived.push((from, at_node));
            }
        }
        // X's packet at the peer the path names, and that peer's at X; the other's nowhere.
        let mut expected = vec![(X, via), (via, X)];
        if via == S && !up {
            expected.clear();
        }
        arrived.sort_unstable();
        expected.sort_unstable();
        prop_assert_eq!(arrived, expected, "round {} through {}", id, via);
        Ok(via_hub)
    }

    /// Both tunnels up: X's first packets to S and H start the handshakes.
    fn connect(&mut self) {
        let now = at(self.now_ms);
        let first = vec![
            udp(POD[X], "10.73.0.1", b"to S"),
            udp(POD[X], "10.200.0.1", b"to H"),
        ];
        let out = self.nodes[X].send(first, now);
        self.carry(X, out);
        let tun = self.deliver_all();
        assert_eq!(
            (tun[S].len(), tun[H].len()),
            (1, 1),
            "queued packets delivered"
        );
    }
}

/// Runs `schedule` (runs of rounds with the link X–S up or down) and checks every round
/// (see the module docs); the rounds through H.
fn run(schedule: &[(bool, u8)]) -> Result<Vec<bool>, TestCaseError> {
    let mut trio = Trio::new();
    trio.connect();
    let links: Vec<bool> = schedule
        .iter()
        .flat_map(|(up, rounds)| std::iter::repeat_n(*up, usize::from(*rounds)))
        .collect();
    let mut via_hub = Vec::new();
    for (round, up) in links.iter().enumerate() {
        let hub = trio.round(*up, round as u32)?;
        // The link as it was for the PINGs before this round's observation.
        let before = &links[..round];
        let down = before.iter().rev().take_while(|up| !**up).count();
        let answered = before.iter().rev().take_while(|up| **up).count();
        let was = via_hub.last().copied().unwrap_or(false);
        if down >= THRESHOLD as usize {
            prop_assert!(hub, "round {}: {} PINGs lost, still direct", round, down);
        }
        if hub && !was {
            prop_assert!(
                down >= THRESHOLD as usize,
                "round {}: failed over early",
                round
            );
        }
        if answered >= RETURN_ROUNDS {
            prop_assert!(
                !hub,
                "round {}: {} rounds answered, still via H",
                round,
                answered
            );
        }
        if was && !hub {
            prop_assert!(answered >= RETURN_ROUNDS, "round {}: returned early", round);
        }
        via_hub.push(hub);
    }
    Ok(via_hub)
}

/// Runs of rounds with the link X–S alternately up and down, the first as `first_up` says;
/// many short ones (the link flaps) and longer ones.
fn schedule() -> impl Strategy<Value = Vec<(bool, u8)>> {
    let run = prop_oneof![1u8..=4, 5u8..=20];
    (any::<bool>(), prop::collection::vec(run, 1..12)).prop_map(|(first_up, runs)| {
        let ups = std::iter::successors(Some(first_up), |up| Some(!up));
        ups.zip(runs).collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_view_follows_the_primarys_probes_to_the_fallback_and_back(schedule in schedule()) {
        run(&schedule)?;
    }
}

/// The rounds at which the view switched.
fn switches(schedule: &[(bool, u8)]) -> Vec<usize> {
    let via_hub = run(schedule).expect("checked");
    (1..via_hub.len())
        .filter(|round| via_hub[*round] != via_hub[round - 1])
        .collect()
}

#[test]
fn a_lost_primary_moves_the_view_to_the_hub_and_answered_probes_bring_it_back() {
    // Down from round 10: the fifth lost PING is counted at round 15. Up from round 18: the
    // hold starts at round 19 and lasts 15 rounds.
    assert_eq!(switches(&[(true, 10), (false, 8), (true, 20)]), [15, 34]);
}

#[test]
fn a_flapping_primary_keeps_the_view_on_the_hub_until_it_answered_for_a_whole_hold() {
    // Failed over at round 10; the hold starting at round 14 is broken by the PINGs lost in
    // rounds 25 and 26, and starts again at round 28.
    let schedule = [(true, 5), (false, 8), (true, 12), (false, 2), (true, 20)];
    assert_eq!(switches(&schedule), [10, 43]);
}
