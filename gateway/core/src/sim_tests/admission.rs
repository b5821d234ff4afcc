//! Two gateways through the whole core (remap, sessions, batches): B holds A as an
//! exported cluster with one endpoint, UDP 10.20.0.7:53. A reaches the endpoint and nothing
//! else of B; B's pods open flows to A and get the replies; B switching A from open to
//! exported keeps a flow B's pod opened before the switch.

use etherparse::PacketBuilder;

use super::super::tests::{Gateway, at, settle, side_a, side_b};
use crate::admission::reasons::AdmissionDrop;
use crate::plan::next_snapshot;
use crate::state::{AdmissionConfig, AdmittedEndpoint, DesiredState, Isolation, Protocol};

fn udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    let mut packet = Vec::new();
    PacketBuilder::ipv4(src, dst, 64)
        .udp(sport, dport)
        .write(&mut packet, b"admission")
        .expect("udp");
    packet
}

/// B's admission of A (seen through A's view 10.110.0.0/24).
fn admission_of_a(isolation: Isolation) -> AdmissionConfig {
    AdmissionConfig {
        cluster: "a".into(),
        isolation,
        views: vec!["10.110.0.0/24".parse().expect("view")],
        endpoints: vec![AdmittedEndpoint {
            address: "10.20.0.7".parse().expect("address"),
            protocol: Protocol::Udp,
            port: 53,
        }],
        policies: Vec::new(),
    }
}

/// Applies `state` to `gateway` as the shell does (a new snapshot; the flow table stays).
fn apply(gateway: &mut Gateway, state: &DesiredState, now: crate::Now) {
    let resolved: Vec<_> = state
        .peers
        .iter()
        .map(|peer| match peer.endpoint {
            Some(crate::state::Endpoint::Addr(address)) => Some(address),
            _ => None,
        })
        .collect();
    gateway.snapshot = next_snapshot(&gateway.snapshot, state, &resolved, now).expect("apply");
}

#[test]
fn an_exported_cluster_reaches_its_endpoint_and_the_replies_of_our_flows_only() {
    let now = at(2_000_000);
    let (sa, sb) = (side_a(), side_b());
    let mut a = Gateway::new(&sa, &sb, 0);
    let mut b = Gateway::new(&sb, &sa, 0);
    let mut state = b.snapshot.state.clone();
    state.admissions = vec![admission_of_a(Isolation::Open)];
    state.validate().expect("valid");
    apply(&mut b, &state, now);

    // The handshake, with a packet to the endpoint (B seen from A as 10.120.0.0/24).
    let first = a.send(vec![udp([10, 10, 0, 5], [10, 120, 0, 7], 5000, 53)], now);
    let (_, at_b) = settle(&mut a, &mut b, first, now);
    assert_eq!(at_b.len(), 1, "to the endpoint, while open");

    // B's pod opens a flow to A while A is open; then A becomes exported.
    let out = b.send(vec![udp([10, 20, 0, 9], [10, 110, 0, 5], 6000, 7000)], now);
    let received = a.receive(
        b.address,
        &out.into_iter().map(|d| d.1).collect::<Vec<_>>(),
        now,
    );
    assert_eq!(received.packets.len(), 1);
    state.admissions = vec![admission_of_a(Isolation::Exported)];
    apply(&mut b, &state, now);

    let to_b = |a: &mut Gateway, packet: Vec<u8>| {
        a.send(vec![packet], now)
            .into_iter()
            .map(|(_, datagram)| datagram)
            .collect::<Vec<_>>()
    };
    // The endpoint: admitted.
    let datagrams = to_b(&mut a, udp([10, 10, 0, 5], [10, 120, 0, 7], 5000, 53));
    assert_eq!(b.receive(a.address, &datagrams, now).packets.len(), 1);
    // Another port of the same pod, another pod: dropped at B, counted on cluster a.
    let datagrams = to_b(&mut a, udp([10, 10, 0, 5], [10, 120, 0, 7], 5000, 54));
    assert!(b.receive(a.address, &datagrams, now).packets.is_empty());
    let datagrams = to_b(&mut a, udp([10, 10, 0, 5], [10, 120, 0, 8], 5000, 53));
    assert!(b.receive(a.address, &datagrams, now).packets.is_empty());
    let cluster = &b.snapshot.admissions.clusters()[0];
    assert_eq!(cluster.drops.get(AdmissionDrop::NotExported), 2);
    // The reply of the flow B's pod opened before the switch: admitted, translated.
    let datagrams = to_b(&mut a, udp([10, 10, 0, 5], [10, 120, 0, 9], 7000, 6000));
    let reply = b.receive(a.address, &datagrams, now).packets;
    assert_eq!(reply.len(), 1, "the flow survived the switch");
    assert_eq!(
        &reply[0][12..16],
        &[10, 110, 0, 5],
        "source rewritten to A's view"
    );
    // A flow B opens after the switch is admitted too, its port only.
    let out = b.send(vec![udp([10, 20, 0, 9], [10, 110, 0, 5], 6001, 7001)], now);
    assert_eq!(out.len(), 1);
    let datagrams = to_b(&mut a, udp([10, 10, 0, 5], [10, 120, 0, 9], 7001, 6001));
    assert_eq!(b.receive(a.address, &datagrams, now).packets.len(), 1);
    let datagrams = to_b(&mut a, udp([10, 10, 0, 5], [10, 120, 0, 9], 7001, 6002));
    assert!(b.receive(a.address, &datagrams, now).packets.is_empty());
    let cluster = &b.snapshot.admissions.clusters()[0];
    assert_eq!(cluster.drops.get(AdmissionDrop::NotExported), 3);
}
