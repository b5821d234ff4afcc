//! The admission rules, packet by packet, on hand-built packets (after the ingress remap:
//! sources are views; before the egress remap: destinations are views).

use std::net::IpAddr;

use etherparse::PacketBuilder;

use super::allowed::Admissions;
use super::flows::FlowTable;
use super::reasons::AdmissionDrop;
use crate::clock::Now;
use crate::key::Key;
use crate::state::{
    AdmissionConfig, AdmittedEndpoint, DesiredState, Isolation, PeerConfig, Protocol, RouteConfig,
};

const POD: [u8; 4] = [10, 0, 0, 5];
const OTHER_POD: [u8; 4] = [10, 0, 0, 6];
/// A pod of exported cluster b, as this gateway sees it.
const B: [u8; 4] = [10, 68, 0, 7];
/// A pod of open cluster c.
const C: [u8; 4] = [10, 69, 0, 7];
/// A pod of exported cluster d (another leaf behind this hub).
const D: [u8; 4] = [10, 71, 0, 7];
/// A pod of a peer's route no admission names.
const U: [u8; 4] = [10, 72, 0, 7];
const POD6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5];
const B6: [u8; 16] = [0xfd, 0x68, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];

pub(super) fn at(secs: u64) -> Now {
    Now {
        unix_ms: 0,
        mono_us: secs * 1_000_000,
    }
}

pub(super) fn endpoint(address: &str, protocol: Protocol, port: u16) -> AdmittedEndpoint {
    AdmittedEndpoint {
        address: address.parse::<IpAddr>().expect("address"),
        protocol,
        port,
    }
}

pub(super) fn admission(cluster: &str, isolation: Isolation, views: &[&str]) -> AdmissionConfig {
    AdmissionConfig {
        cluster: cluster.to_owned(),
        isolation,
        views: views.iter().map(|v| v.parse().expect("view")).collect(),
        endpoints: Vec::new(),
        policies: Vec::new(),
    }
}

fn state(b: Isolation) -> DesiredState {
    let mut b = admission("b", b, &["10.68.0.0/16", "fd68::/64"]);
    b.endpoints = vec![
        endpoint("10.0.0.5", Protocol::Tcp, 80),
        endpoint("10.0.0.5", Protocol::Udp, 53),
        endpoint("10.0.0.5", Protocol::Sctp, 3868),
        endpoint("fd00::5", Protocol::Tcp, 80),
    ];
    let mut peer = PeerConfig::new(Key::from_bytes([9; 32]));
    peer.routes = vec![RouteConfig::remapped(
        "10.70.0.0/16".parse().expect("real"),
        "10.72.0.0/16".parse().expect("view"),
    )];
    let state = DesiredState {
        peers: vec![peer],
        admissions: vec![
            b,
            admission("c", Isolation::Open, &["10.69.0.0/16"]),
            admission("d", Isolation::Exported, &["10.71.0.0/16"]),
        ],
        ..DesiredState::default()
    };
    state.validate().expect("valid");
    state
}

struct Fixture {
    admissions: Admissions,
    flows: FlowTable,
}

impl Fixture {
    fn new(b: Isolation) -> Self {
        Self {
            admissions: Admissions::build(&state(b), &Admissions::default()),
            flows: FlowTable::new(1024),
        }
    }

    fn inbound(&self, packet: &[u8], secs: u64) -> bool {
        self.admissions.ingress(&self.flows, packet, at(secs))
    }

    fn outbound(&self, packet: &[u8], secs: u64) -> bool {
        self.admissions.egress(&self.flows, packet, at(secs))
    }

    fn drops(&self, cluster: usize, reason: AdmissionDrop) -> u64 {
        self.admissions.clusters()[cluster].drops.get(reason)
    }
}

#[derive(Clone, Copy)]
pub(super) enum Tcp {
    Syn,
    SynAck,
    Ack,
    Fin,
}

pub(super) fn tcp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, flags: Tcp) -> Vec<u8> {
    let builder = PacketBuilder::ipv4(src, dst, 64).tcp(sport, dport, 1, 1000);
    let builder = match flags {
        Tcp::Syn => builder.syn(),
        Tcp::SynAck => builder.syn().ack(1),
        Tcp::Ack => builder.ack(1),
        Tcp::Fin => builder.fin().ack(1),
    };
    let mut packet = Vec::new();
    builder.write(&mut packet, &[]).expect("tcp");
    packet
}

pub(super) fn udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    let mut packet = Vec::new();
    PacketBuilder::ipv4(src, dst, 64)
        .udp(sport, dport)
        .write(&mut packet, b"x")
        .expect("udp");
    packet
}

fn sctp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    let mut packet = udp(src, dst, sport, dport);
    packet[9] = 132;
    packet
}

pub(super) fn echo(src: [u8; 4], dst: [u8; 4], id: u16, request: bool) -> Vec<u8> {
    let builder = PacketBuilder::ipv4(src, dst, 64);
    let builder = if request {
        builder.icmpv4_echo_request(id, 1)
    } else {
        builder.icmpv4_echo_reply(id, 1)
    };
    let mut packet = Vec::new();
    builder.write(&mut packet, b"ping").expect("echo");
    packet
}

/// An ICMP error from `src` to `dst` quoting `quoted` (type 3 code 4: fragmentation needed).
pub(super) fn icmp_error(src: [u8; 4], dst: [u8; 4], kind: u8, quoted: &[u8]) -> Vec<u8> {
    let mut packet = Vec::new();
    PacketBuilder::ipv4(src, dst, 64)
        .icmpv4_raw(kind, 4, [0, 0, 5, 0x78])
        .write(&mut packet, &quoted[..quoted.len().min(28)])
        .expect("icmp error");
    packet
}

fn tcp6(src: [u8; 16], dst: [u8; 16], sport: u16, dport: u16, syn: bool) -> Vec<u8> {
    let builder = PacketBuilder::ipv6(src, dst, 64).tcp(sport, dport, 1, 1000);
    let builder = if syn { builder.syn() } else { builder.ack(1) };
    let mut packet = Vec::new();
    builder.write(&mut packet, &[]).expect("tcp6");
    packet
}

fn packet_too_big(src: [u8; 16], dst: [u8; 16], quoted: &[u8]) -> Vec<u8> {
    let mut packet = Vec::new();
    PacketBuilder::ipv6(src, dst, 64)
        .icmpv6_raw(2, 0, [0, 0, 5, 0x00])
        .write(&mut packet, quoted)
        .expect("packet too big");
    packet
}

fn echo6(src: [u8; 16], dst: [u8; 16], request: bool) -> Vec<u8> {
    let builder = PacketBuilder::ipv6(src, dst, 64);
    let builder = if request {
        builder.icmpv6_echo_request(9, 1)
    } else {
        builder.icmpv6_echo_reply(9, 1)
    };
    let mut packet = Vec::new();
    builder.write(&mut packet, b"ping").expect("echo6");
    packet
}

const BX: usize = 0; // cluster b's index

#[test]
fn an_exported_clusters_connection_to_an_endpoint_is_admitted() {
    let f = Fixture::new(Isolation::Exported);
    assert!(f.inbound(&tcp(B, POD, 40_000, 80, Tcp::Syn), 1));
    assert!(f.inbound(&tcp(B, POD, 40_000, 80, Tcp::Ack), 1));
    assert!(f.inbound(&udp(B, POD, 40_001, 53), 1));
    assert!(f.inbound(&sctp(B, POD, 40_002, 3868), 1));
    // The endpoint's replies need no record and leave none.
    assert!(f.outbound(&udp(POD, B, 53, 40_001), 1));
    assert_eq!(f.flows.in_use(at(1)), 0);
    assert_eq!(f.drops(BX, AdmissionDrop::NotExported), 0);
}

#[test]
fn another_port_protocol_or_address_is_dropped_and_counted() {
    let f = Fixture::new(Isolation::Exported);
    assert!(!f.inbound(&tcp(B, POD, 40_000, 81, Tcp::Syn), 1));
    assert!(
        !f.inbound(&udp(B, POD, 40_000, 80), 1),
        "TCP 80 is exported, UDP 80 is not"
    );
    assert!(!f.inbound(&tcp(B, OTHER_POD, 40_000, 80, Tcp::Syn), 1));
    // An ACK scan finds nothing either: no flow, no admission.
    assert!(!f.inbound(&tcp(B, OTHER_POD, 40_000, 22, Tcp::Ack), 1));
    assert_eq!(f.drops(BX, AdmissionDrop::NotExported), 4);
    let mut gre = udp(B, POD, 1, 2);
    gre[9] = 47;
    assert!(!f.inbound(&gre, 1));
    assert_eq!(f.drops(BX, AdmissionDrop::OtherProtocol), 1);
}

#[test]
fn the_replies_of_a_tcp_flow_we_opened_are_admitted_until_it_closes() {
    let f = Fixture::new(Isolation::Exported);
    // Unsolicited first.
    assert!(!f.inbound(&tcp(B, POD, 443, 50_000, Tcp::SynAck), 1));
    assert!(f.outbound(&tcp(POD, B, 50_000, 443, Tcp::Syn), 1));
    assert!(f.inbound(&tcp(B, POD, 443, 50_000, Tcp::SynAck), 1));
    assert!(f.inbound(&tcp(B, POD, 443, 50_000, Tcp::Ack), 2));
    // Not the same flow: another local port, another remote port, another pod.
    assert!(!f.inbound(&tcp(B, POD, 443, 50_001, Tcp::Ack), 2));
    assert!(!f.inbound(&tcp(B, POD, 444, 50_000, Tcp::Ack), 2));
    assert!(!f.inbound(&tcp(B, OTHER_POD, 443, 50_000, Tcp::Ack), 2));
    // Established: it outlives the SYN timeout.
    assert!(f.inbound(&tcp(B, POD, 443, 50_000, Tcp::Ack), 1000));
    // A FIN shortens it to 10 s.
    assert!(f.outbound(&tcp(POD, B, 50_000, 443, Tcp::Fin), 1000));
    assert!(f.inbound(&tcp(B, POD, 443, 50_000, Tcp::Ack), 1009));
    assert!(!f.inbound(&tcp(B, POD, 443, 50_000, Tcp::Ack), 1020));
    assert_eq!(f.drops(BX, AdmissionDrop::NotExported), 5);
}

#[test]
fn an_unanswered_syn_expires_quickly_and_other_segments_open_nothing() {
    let f = Fixture::new(Isolation::Exported);
    assert!(f.outbound(&tcp(POD, B, 50_000, 443, Tcp::Syn), 1));
    assert!(!f.inbound(&tcp(B, POD, 443, 50_000, Tcp::SynAck), 40));
    // Our ACK of a connection the peer opened records nothing.
    assert!(f.outbound(&tcp(POD, B, 22, 40_000, Tcp::Ack), 41));
    assert!(!f.inbound(&tcp(B, POD, 40_000, 22, Tcp::Ack), 41));
}

#[test]
fn the_replies_of_udp_and_echo_flows_we_opened_are_admitted_until_they_expire() {
    let f = Fixture::new(Isolation::Exported);
    assert!(!f.inbound(&udp(B, POD, 53, 33_000), 1));
    assert!(f.outbound(&udp(POD, B, 33_000, 53), 1));
    assert!(f.inbound(&udp(B, POD, 53, 33_000), 2));
    assert!(f.inbound(&udp(B, POD, 53, 33_000), 120));
    assert!(!f.inbound(&udp(B, POD, 53, 33_000), 241));
    assert!(!f.inbound(&echo(B, POD, 7, false), 1));
    assert!(f.outbound(&echo(POD, B, 7, true), 1));
    assert!(f.inbound(&echo(B, POD, 7, false), 2));
    assert!(!f.inbound(&echo(B, POD, 8, false), 2), "another echo id");
    assert!(!f.inbound(&echo(B, POD, 7, false), 40));
    assert_eq!(f.drops(BX, AdmissionDrop::NotExported), 2);
    assert_eq!(f.drops(BX, AdmissionDrop::UnrelatedIcmp), 3);
}

#[test]
fn an_echo_request_to_an_endpoints_address_is_admitted_to_no_other() {
    let f = Fixture::new(Isolation::Exported);
    assert!(f.inbound(&echo(B, POD, 1, true), 1));
    assert!(!f.inbound(&echo(B, OTHER_POD, 1, true), 1));
    assert_eq!(f.drops(BX, AdmissionDrop::NotExported), 1);
}

#[test]
fn icmp_errors_are_admitted_only_for_admitted_flows() {
    let f = Fixture::new(Isolation::Exported);
    // About a flow we opened (fragmentation needed, time exceeded).
    let ours = tcp(POD, B, 50_000, 443, Tcp::Syn);
    assert!(f.outbound(&ours, 1));
    assert!(f.inbound(&icmp_error(B, POD, 3, &ours), 2));
    assert!(f.inbound(&icmp_error(B, POD, 11, &ours), 2));
    // About our export's reply.
    let reply = tcp(POD, B, 80, 40_000, Tcp::SynAck);
    assert!(f.inbound(&icmp_error(B, POD, 3, &reply), 2));
    // About an echo request we sent.
    let ping = echo(POD, B, 5, true);
    assert!(f.outbound(&ping, 1));
    assert!(f.inbound(&icmp_error(B, POD, 3, &ping), 2));
    // About anything else, or no error at all (a redirect).
    let unknown = tcp(POD, B, 50_001, 443, Tcp::Syn);
    assert!(!f.inbound(&icmp_error(B, POD, 3, &unknown), 2));
    assert!(!f.inbound(
        &icmp_error(B, OTHER_POD, 12, &tcp(OTHER_POD, B, 1, 2, Tcp::Ack)),
        2
    ));
    assert!(!f.inbound(&icmp_error(B, POD, 5, &ours), 2));
    assert_eq!(f.drops(BX, AdmissionDrop::UnrelatedIcmp), 3);
}

#[test]
fn transit_to_another_clusters_view_passes() {
    let f = Fixture::new(Isolation::Exported);
    assert!(f.inbound(&tcp(B, D, 40_000, 22, Tcp::Syn), 1));
    assert!(f.inbound(&tcp(B, U, 40_000, 22, Tcp::Syn), 1));
    // Forwarded on at the hub: no flow is recorded for another cluster's pod.
    assert!(f.outbound(&tcp(B, D, 40_000, 22, Tcp::Syn), 1));
    assert_eq!(f.flows.in_use(at(1)), 0);
    assert_eq!(f.drops(BX, AdmissionDrop::NotExported), 0);
}

#[test]
fn open_and_unadmitted_clusters_pass_everything() {
    let f = Fixture::new(Isolation::Exported);
    assert!(f.inbound(&tcp(C, OTHER_POD, 1, 22, Tcp::Syn), 1));
    assert!(f.inbound(&tcp(U, OTHER_POD, 1, 22, Tcp::Ack), 1));
    let mut gre = udp(C, POD, 1, 2);
    gre[9] = 47;
    assert!(f.inbound(&gre, 1));
    // b open: nothing is judged (the table records for a later switch).
    let open = Fixture::new(Isolation::Open);
    assert!(open.inbound(&tcp(B, OTHER_POD, 1, 22, Tcp::Syn), 1));
    assert!(open.outbound(&tcp(POD, B, 50_000, 443, Tcp::Syn), 1));
    assert_eq!(open.flows.in_use(at(1)), 1);
    // Towards a cluster without admission nothing is recorded.
    assert!(open.outbound(&tcp(POD, U, 50_000, 443, Tcp::Syn), 1));
    assert_eq!(open.flows.in_use(at(1)), 1);
}

#[test]
fn without_admissions_nothing_is_judged_or_recorded() {
    let admissions = Admissions::default();
    let flows = FlowTable::new(1024);
    assert!(admissions.ingress(&flows, &tcp(B, POD, 1, 22, Tcp::Syn), at(1)));
    assert!(admissions.egress(&flows, &tcp(POD, B, 1, 22, Tcp::Syn), at(1)));
    assert_eq!(flows.in_use(at(1)), 0);
}

#[test]
fn a_flow_opened_while_open_survives_the_switch_to_exported() {
    let flows = FlowTable::new(1024);
    let open = Admissions::build(&state(Isolation::Open), &Admissions::default());
    assert!(open.egress(&flows, &tcp(POD, B, 50_000, 443, Tcp::Syn), at(1)));
    assert!(open.ingress(&flows, &tcp(B, POD, 443, 50_000, Tcp::SynAck), at(1)));
    let exported = Admissions::build(&state(Isolation::Exported), &open);
    assert!(exported.ingress(&flows, &tcp(B, POD, 443, 50_000, Tcp::Ack), at(2)));
    assert!(!exported.ingress(&flows, &tcp(B, POD, 443, 50_001, Tcp::Ack), at(2)));
    // The counters carry over to the next build of the same cluster.
    let again = Admissions::build(&state(Isolation::Exported), &exported);
    assert_eq!(
        again.clusters()[BX].drops.get(AdmissionDrop::NotExported),
        1
    );
    assert_eq!(again.clusters()[BX].endpoints, 4);
}

#[test]
fn a_full_table_drops_towards_exported_and_passes_towards_open() {
    let full = Fixture {
        admissions: Admissions::build(&state(Isolation::Exported), &Admissions::default()),
        flows: FlowTable::new(0),
    };
    assert!(!full.outbound(&tcp(POD, B, 50_000, 443, Tcp::Syn), 1));
    assert_eq!(full.drops(BX, AdmissionDrop::FlowTableFull), 1);
    assert!(full.outbound(&tcp(POD, C, 50_000, 443, Tcp::Syn), 1));
    assert_eq!(full.flows.full(), 2);
    // The export's own replies need no slot.
    assert!(full.outbound(&udp(POD, B, 53, 40_000), 1));
}

#[test]
fn ipv6_follows_the_same_rules() {
    let f = Fixture::new(Isolation::Exported);
    assert!(f.inbound(&tcp6(B6, POD6, 40_000, 80, true), 1));
    assert!(!f.inbound(&tcp6(B6, POD6, 40_000, 81, true), 1));
    assert!(f.outbound(&tcp6(POD6, B6, 50_000, 443, true), 1));
    assert!(f.inbound(&tcp6(B6, POD6, 443, 50_000, false), 2));
    let ours = tcp6(POD6, B6, 50_000, 443, false);
    assert!(f.inbound(&packet_too_big(B6, POD6, &ours), 2));
    let unknown = tcp6(POD6, B6, 50_001, 443, false);
    assert!(!f.inbound(&packet_too_big(B6, POD6, &unknown), 2));
    // Echo: to the endpoint's address, and the reply of ours.
    assert!(f.inbound(&echo6(B6, POD6, true), 2));
    assert!(!f.inbound(&echo6(B6, POD6, false), 2));
    assert!(f.outbound(&echo6(POD6, B6, true), 2));
    assert!(f.inbound(&echo6(B6, POD6, false), 3));
    assert_eq!(f.drops(BX, AdmissionDrop::NotExported), 1);
    assert_eq!(f.drops(BX, AdmissionDrop::UnrelatedIcmp), 2);
}

#[test]
fn a_later_fragment_from_an_exported_cluster_is_dropped() {
    let f = Fixture::new(Isolation::Exported);
    let mut fragment = udp(B, POD, 40_001, 53);
    fragment[6] = 0;
    fragment[7] = 8; // offset 64 bytes
    assert!(!f.inbound(&fragment, 1));
    assert_eq!(f.drops(BX, AdmissionDrop::Fragment), 1);
}
