//! Source policies: an endpoint a policy names opens only to the sources of the policies
//! naming it; the others stay open to every source of the cluster.

use super::allowed::Admissions;
use super::flows::FlowTable;
use super::reasons::AdmissionDrop;
use super::tests::{Tcp, admission, at, echo, endpoint, icmp_error, tcp, udp};
use crate::state::{DesiredState, Isolation, Protocol, SourcePolicy};

const POD: [u8; 4] = [10, 0, 0, 5];
const OTHER_POD: [u8; 4] = [10, 0, 0, 6];
/// Two pods of cluster b as this gateway sees them: the frontend the policies select and
/// another pod.
const FRONTEND: [u8; 4] = [10, 68, 0, 7];
const OTHER: [u8; 4] = [10, 68, 0, 8];

fn policy(name: &str, endpoints: &[(&str, Protocol, u16)], sources: &[[u8; 4]]) -> SourcePolicy {
    SourcePolicy {
        name: name.into(),
        endpoints: endpoints
            .iter()
            .map(|(address, protocol, port)| endpoint(address, *protocol, *port))
            .collect(),
        sources: sources.iter().map(|s| (*s).into()).collect(),
    }
}

/// Cluster b exported: web (POD tcp/80, tcp/443) guarded by `policies`; dns (POD udp/53)
/// and OTHER_POD tcp/80 by none.
fn build(policies: Vec<SourcePolicy>, previous: &Admissions) -> Admissions {
    let mut b = admission("b", Isolation::Exported, &["10.68.0.0/16"]);
    b.endpoints = vec![
        endpoint("10.0.0.5", Protocol::Tcp, 80),
        endpoint("10.0.0.5", Protocol::Tcp, 443),
        endpoint("10.0.0.5", Protocol::Udp, 53),
        endpoint("10.0.0.6", Protocol::Tcp, 80),
    ];
    b.policies = policies;
    let state = DesiredState {
        admissions: vec![b],
        ..DesiredState::default()
    };
    state.validate().expect("valid");
    Admissions::build(&state, previous)
}

const WEB: &[(&str, Protocol, u16)] = &[
    ("10.0.0.5", Protocol::Tcp, 80),
    ("10.0.0.5", Protocol::Tcp, 443),
];

fn drops(admissions: &Admissions, reason: AdmissionDrop) -> u64 {
    admissions.clusters()[0].drops.get(reason)
}

fn policy_drops(admissions: &Admissions, index: usize) -> u64 {
    admissions.clusters()[0].policies[index]
        .drops
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn only_the_selected_source_opens_a_guarded_endpoint() {
    let a = build(
        vec![policy("shop/web", WEB, &[FRONTEND])],
        &Admissions::default(),
    );
    let flows = FlowTable::new(64);
    assert!(a.ingress(&flows, &tcp(FRONTEND, POD, 40_000, 80, Tcp::Syn), at(1)));
    assert!(a.ingress(&flows, &tcp(FRONTEND, POD, 40_000, 443, Tcp::Ack), at(1)));
    assert!(!a.ingress(&flows, &tcp(OTHER, POD, 40_000, 80, Tcp::Syn), at(1)));
    assert!(!a.ingress(&flows, &tcp(OTHER, POD, 40_000, 443, Tcp::Ack), at(1)));
    assert_eq!(drops(&a, AdmissionDrop::NotSelected), 2);
    assert_eq!(drops(&a, AdmissionDrop::NotExported), 0);
    assert_eq!(policy_drops(&a, 0), 2);
    // The endpoints no policy names stay open to every source; other ports stay closed.
    assert!(a.ingress(&flows, &udp(OTHER, POD, 5000, 53), at(1)));
    assert!(a.ingress(&flows, &tcp(OTHER, OTHER_POD, 40_000, 80, Tcp::Syn), at(1)));
    assert!(!a.ingress(&flows, &tcp(FRONTEND, POD, 40_000, 22, Tcp::Syn), at(1)));
    assert_eq!(drops(&a, AdmissionDrop::NotExported), 1);
}

#[test]
fn a_policy_that_selects_nothing_admits_nothing() {
    let a = build(vec![policy("shop/web", WEB, &[])], &Admissions::default());
    let flows = FlowTable::new(64);
    assert!(!a.ingress(&flows, &tcp(FRONTEND, POD, 40_000, 80, Tcp::Syn), at(1)));
    assert!(!a.ingress(&flows, &tcp(OTHER, POD, 40_000, 443, Tcp::Syn), at(1)));
    assert_eq!(drops(&a, AdmissionDrop::NotSelected), 2);
    assert_eq!(a.clusters()[0].policies[0].sources, 0);
}

#[test]
fn policies_naming_one_endpoint_add_up_and_the_first_by_name_counts() {
    let a = build(
        vec![
            policy("shop/z-admins", &WEB[..1], &[OTHER]),
            policy("shop/a-frontend", WEB, &[FRONTEND]),
        ],
        &Admissions::default(),
    );
    let flows = FlowTable::new(64);
    assert!(a.ingress(&flows, &tcp(FRONTEND, POD, 40_000, 80, Tcp::Syn), at(1)));
    assert!(a.ingress(&flows, &tcp(OTHER, POD, 40_000, 80, Tcp::Syn), at(1)));
    // Port 443 only the frontend policy names.
    assert!(a.ingress(&flows, &tcp(FRONTEND, POD, 40_000, 443, Tcp::Syn), at(1)));
    assert!(!a.ingress(&flows, &tcp(OTHER, POD, 40_000, 443, Tcp::Syn), at(1)));
    assert_eq!(policy_drops(&a, 1), 1, "shop/a-frontend guards 443");
    assert_eq!(policy_drops(&a, 0), 0);
}

#[test]
fn echo_to_a_guarded_address_answers_its_sources_only() {
    // Every endpoint at 10.0.0.5 guarded: only the frontend may ping it.
    let dns = ("10.0.0.5", Protocol::Udp, 53);
    let all = [WEB[0], WEB[1], dns];
    let a = build(
        vec![policy("shop/web", &all, &[FRONTEND])],
        &Admissions::default(),
    );
    let flows = FlowTable::new(64);
    assert!(a.ingress(&flows, &echo(FRONTEND, POD, 1, true), at(1)));
    assert!(!a.ingress(&flows, &echo(OTHER, POD, 1, true), at(1)));
    assert_eq!(drops(&a, AdmissionDrop::NotSelected), 1);
    // With one endpoint there unguarded (dns), every source may.
    let a = build(
        vec![policy("shop/web", WEB, &[FRONTEND])],
        &Admissions::default(),
    );
    assert!(a.ingress(&flows, &echo(OTHER, POD, 1, true), at(1)));
}

#[test]
fn relabelled_away_an_established_connection_is_cut() {
    let selected = build(
        vec![policy("shop/web", WEB, &[FRONTEND])],
        &Admissions::default(),
    );
    let flows = FlowTable::new(64);
    assert!(selected.ingress(&flows, &tcp(FRONTEND, POD, 40_000, 80, Tcp::Ack), at(1)));
    // The next apply no longer selects it: the same connection's next segment is refused,
    // and the policy's counter carries over.
    assert!(!selected.ingress(&flows, &tcp(OTHER, POD, 40_000, 80, Tcp::Ack), at(1)));
    let cut = build(vec![policy("shop/web", WEB, &[OTHER])], &selected);
    assert!(!cut.ingress(&flows, &tcp(FRONTEND, POD, 40_000, 80, Tcp::Ack), at(2)));
    assert!(cut.ingress(&flows, &tcp(OTHER, POD, 40_000, 80, Tcp::Ack), at(2)));
    assert_eq!(policy_drops(&cut, 0), 2);
}

#[test]
fn replies_and_icmp_errors_of_a_guarded_endpoint_follow_its_sources() {
    let a = build(
        vec![policy("shop/web", WEB, &[FRONTEND])],
        &Admissions::default(),
    );
    let flows = FlowTable::new(64);
    // An ICMP error quoting a segment of web to the frontend is admitted, one quoting a
    // segment to another pod is not.
    let to_frontend = tcp(POD, FRONTEND, 80, 40_000, Tcp::Ack);
    let to_other = tcp(POD, OTHER, 80, 40_000, Tcp::Ack);
    assert!(a.ingress(&flows, &icmp_error(FRONTEND, POD, 3, &to_frontend), at(1)));
    assert!(!a.ingress(&flows, &icmp_error(OTHER, POD, 3, &to_other), at(1)));
    assert_eq!(drops(&a, AdmissionDrop::UnrelatedIcmp), 1);
}

#[test]
fn a_flow_our_pod_opened_is_answered_whatever_the_policies() {
    let a = build(vec![policy("shop/web", WEB, &[])], &Admissions::default());
    let flows = FlowTable::new(64);
    assert!(a.egress(&flows, &tcp(POD, OTHER, 80, 9000, Tcp::Syn), at(1)));
    assert!(a.ingress(&flows, &tcp(OTHER, POD, 9000, 80, Tcp::SynAck), at(1)));
}

#[test]
fn endpoints_guarded_by_the_same_policies_share_one_copy_of_the_sources() {
    let sources: Vec<[u8; 4]> = (0..200u8).map(|i| [10, 68, 1, i]).collect();
    let a = build(
        vec![policy("shop/web", WEB, &sources)],
        &Admissions::default(),
    );
    // Two endpoints, one address: two groups (the endpoints' and the address's echo).
    assert!(a.groups.len() <= 2, "{} groups", a.groups.len());
    let flows = FlowTable::new(64);
    for source in &sources {
        assert!(a.ingress(&flows, &tcp(*source, POD, 40_000, 443, Tcp::Syn), at(1)));
    }
}
