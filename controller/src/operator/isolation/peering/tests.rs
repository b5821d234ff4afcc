use super::*;
use kubetun_crds::{NetworkSpec, NetworkStatus};
use std::collections::BTreeMap;

fn network(ns: &str, name: &str, uid: &str, id: Option<&str>, prefixes: &[&str]) -> Network {
    let mut n = Network::new(
        name,
        NetworkSpec {
            prefixes: prefixes.iter().map(|p| (*p).to_owned()).collect(),
            ..NetworkSpec::default()
        },
    );
    n.metadata.namespace = Some(ns.to_owned());
    n.metadata.uid = Some(uid.to_owned());
    n.status = Some(NetworkStatus {
        id: id.map(str::to_owned),
        ..NetworkStatus::default()
    });
    n
}

fn peer_with(
    mut n: Network,
    peering: &str,
    target: &str,
    namespace: Option<&str>,
    exposed: &[&str],
) -> Network {
    n.spec.peerings.push(NetworkPeering {
        name: peering.to_owned(),
        network_ref: NetworkRef {
            name: target.to_owned(),
            namespace: namespace.map(str::to_owned),
        },
        prefixes: exposed.iter().map(|p| (*p).to_owned()).collect(),
    });
    n
}

fn index(networks: &[Network]) -> BTreeMap<NetworkKey, Network> {
    networks
        .iter()
        .map(|n| (NetworkKey::of(n), n.clone()))
        .collect()
}

fn statuses_of(n: &Network, all: &[Network]) -> Vec<NetworkPeeringStatus> {
    let idx = index(all);
    peering_statuses(n, true, |k| idx.get(k).into())
}

#[test]
fn mutual_peering_is_ready_with_the_peers_exposed_prefixes() {
    let a = peer_with(
        network("ns", "a", "uid-a", Some("201"), &["10.1.0.0/16"]),
        "to-b",
        "b",
        None,
        &[],
    );
    let b = peer_with(
        network("ns", "b", "uid-b", Some("202"), &["10.2.0.0/16"]),
        "to-a",
        "a",
        Some("ns"),
        &["10.2.3.0/24"],
    );
    let all = [a.clone(), b.clone()];

    let sa = statuses_of(&a, &all);
    assert_eq!(sa.len(), 1);
    assert_eq!(sa[0].state, PeeringState::Ready);
    assert_eq!(sa[0].prefixes, vec!["10.2.3.0/24"]);
    assert_eq!(sa[0].peer_uid.as_deref(), Some("uid-b"));

    let sb = statuses_of(&b, &all);
    assert_eq!(sb[0].state, PeeringState::Ready);
    assert_eq!(
        sb[0].prefixes,
        vec!["10.1.0.0/16"],
        "empty list exposes all prefixes"
    );
    assert_eq!(sb[0].peer_uid.as_deref(), Some("uid-a"));
}

#[test]
fn one_sided_peering_is_pending_with_a_reason() {
    let a = peer_with(
        network("ns", "a", "uid-a", Some("201"), &[]),
        "to-b",
        "b",
        None,
        &[],
    );
    let b = network("ns", "b", "uid-b", Some("202"), &["10.2.0.0/16"]);
    let s = statuses_of(&a, &[a.clone(), b]);
    assert_eq!(s[0].state, PeeringState::Pending);
    assert_eq!(s[0].message, message::NOT_REFERENCED);
    assert!(s[0].prefixes.is_empty());
    assert_eq!(s[0].peer_uid, None);
}

#[test]
fn missing_peer_does_not_stop_the_other_peerings() {
    let a = peer_with(
        peer_with(
            network("ns", "a", "uid-a", Some("201"), &[]),
            "a-missing",
            "gone",
            None,
            &[],
        ),
        "b-present",
        "b",
        None,
        &[],
    );
    let b = peer_with(
        network("ns", "b", "uid-b", Some("202"), &["10.2.0.0/16"]),
        "back",
        "a",
        None,
        &[],
    );
    let s = statuses_of(&a, &[a.clone(), b]);
    assert_eq!(s.len(), 2);
    assert_eq!(
        (s[0].name.as_str(), s[0].state),
        ("a-missing", PeeringState::Pending)
    );
    assert!(s[0].message.contains("not found"), "{}", s[0].message);
    assert_eq!(
        (s[1].name.as_str(), s[1].state),
        ("b-present", PeeringState::Ready)
    );
}

#[test]
fn unreadable_peer_is_pending_with_the_reason() {
    let a = peer_with(
        network("x", "a", "uid-a", Some("201"), &[]),
        "p",
        "b",
        Some("y"),
        &[],
    );
    let s = peering_statuses(&a, true, |_| Peer::Unreadable("forbidden"));
    assert_eq!(s[0].state, PeeringState::Pending);
    assert_eq!(s[0].message, "cannot read peer network y/b: forbidden");
}

#[test]
fn peer_without_id_or_self_without_id_is_pending() {
    let a = peer_with(
        network("ns", "a", "uid-a", Some("201"), &[]),
        "p",
        "b",
        None,
        &[],
    );
    let b = peer_with(
        network("ns", "b", "uid-b", None, &["10.2.0.0/16"]),
        "p",
        "a",
        None,
        &[],
    );
    let all = [a.clone(), b.clone()];
    assert_eq!(statuses_of(&a, &all)[0].message, message::PEER_PENDING);
    let idx = index(&all);
    let s = peering_statuses(&b, false, |k| idx.get(k).into());
    assert_eq!(s[0].message, message::SELF_PENDING);
}

#[test]
fn self_and_duplicate_references_are_errors() {
    let a = peer_with(
        peer_with(
            peer_with(
                network("ns", "a", "uid-a", Some("201"), &[]),
                "self",
                "a",
                None,
                &[],
            ),
            "first",
            "b",
            None,
            &[],
        ),
        "second",
        "b",
        Some("ns"),
        &[],
    );
    let b = peer_with(
        network("ns", "b", "uid-b", Some("202"), &["10.2.0.0/16"]),
        "p",
        "a",
        None,
        &[],
    );
    let s = statuses_of(&a, &[a.clone(), b]);
    let by_name: BTreeMap<_, _> = s.iter().map(|p| (p.name.as_str(), p)).collect();
    assert_eq!(by_name["self"].state, PeeringState::Error);
    assert_eq!(by_name["first"].state, PeeringState::Ready);
    assert_eq!(by_name["second"].state, PeeringState::Error);
    assert!(by_name["second"].message.contains("first"));
}

#[test]
fn cross_namespace_reference_must_match_namespace() {
    let a = peer_with(
        network("x", "a", "uid-a", Some("201"), &[]),
        "p",
        "b",
        Some("y"),
        &[],
    );
    // b references "a" in its own namespace y, which is not x/a.
    let b = peer_with(
        network("y", "b", "uid-b", Some("202"), &["10.2.0.0/16"]),
        "p",
        "a",
        None,
        &[],
    );
    assert_eq!(
        statuses_of(&a, &[a.clone(), b.clone()])[0].state,
        PeeringState::Pending
    );
    let b = peer_with(
        network("y", "b", "uid-b", Some("202"), &["10.2.0.0/16"]),
        "p",
        "a",
        Some("x"),
        &[],
    );
    assert_eq!(
        statuses_of(&a, &[a.clone(), b])[0].state,
        PeeringState::Ready
    );
}

#[test]
fn exposing_prefixes_outside_the_peers_own_is_an_error() {
    let a = peer_with(
        network("ns", "a", "uid-a", Some("201"), &[]),
        "p",
        "b",
        None,
        &[],
    );
    let b = peer_with(
        network("ns", "b", "uid-b", Some("202"), &["10.2.0.0/16"]),
        "p",
        "a",
        None,
        &["10.0.0.0/8"],
    );
    let s = statuses_of(&a, &[a.clone(), b]);
    assert_eq!(s[0].state, PeeringState::Error);
    assert!(s[0].message.contains("10.0.0.0/8"));
}

#[test]
fn statuses_are_sorted_by_name_whatever_the_spec_order() {
    let mut a = network("ns", "a", "uid-a", Some("201"), &[]);
    for name in ["zeta", "alpha", "mid"] {
        a = peer_with(a, name, &format!("peer-{name}"), None, &[]);
    }
    let names: Vec<_> = statuses_of(&a, &[a.clone()])
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["alpha", "mid", "zeta"]);
}

#[test]
fn reverse_lookup_finds_every_referrer() {
    let target = network("ns", "t", "uid-t", None, &[]);
    let r1 = peer_with(network("ns", "r1", "1", None, &[]), "p", "t", None, &[]);
    let r2 = peer_with(
        network("other", "r2", "2", None, &[]),
        "p",
        "t",
        Some("ns"),
        &[],
    );
    let unrelated = peer_with(network("other", "u", "3", None, &[]), "p", "t", None, &[]);
    let found = referencing([&target, &r1, &r2, &unrelated], &NetworkKey::of(&target));
    assert_eq!(
        found,
        vec![NetworkKey::new("ns", "r1"), NetworkKey::new("other", "r2")]
    );
}

fn with_peerings(mut n: Network, peerings: Vec<NetworkPeeringStatus>) -> Network {
    n.status.get_or_insert_with(NetworkStatus::default).peerings = peerings;
    n
}

fn ready(name: &str, peer_uid: &str, prefixes: &[&str]) -> NetworkPeeringStatus {
    NetworkPeeringStatus {
        name: name.to_owned(),
        state: PeeringState::Ready,
        message: String::new(),
        prefixes: prefixes.iter().map(|p| (*p).to_owned()).collect(),
        peer_uid: Some(peer_uid.to_owned()),
    }
}

#[test]
fn acl_is_none_without_networks_for_the_cluster() {
    let local = network("ns", "local", "uid-l", Some("1"), &["10.0.0.0/16"]);
    assert_eq!(acl_for_cluster(&[local], "rome"), None);
}

#[test]
fn acl_fails_closed_when_no_peering_is_ready() {
    let mut remote = network("ns", "rome-net", "uid-r", Some("2"), &["10.70.0.0/16"]);
    remote.spec.cluster_id = Some("rome".to_owned());
    let mut pending = ready("p", "uid-r", &["10.70.0.0/16"]);
    pending.state = PeeringState::Pending;
    let local = with_peerings(
        network("ns", "local", "uid-l", Some("1"), &[]),
        vec![pending],
    );
    assert_eq!(acl_for_cluster(&[local, remote], "rome"), Some(vec![]));
}

#[test]
fn acl_collects_ready_prefixes_of_the_clusters_networks_only() {
    let mut rome_a = network("ns", "rome-a", "uid-ra", Some("2"), &[]);
    rome_a.spec.cluster_id = Some("rome".to_owned());
    let mut rome_b = network("ns", "rome-b", "uid-rb", Some("3"), &[]);
    rome_b.spec.cluster_id = Some("rome".to_owned());
    let mut milan = network("ns", "milan", "uid-m", Some("4"), &[]);
    milan.spec.cluster_id = Some("milan".to_owned());
    let local = with_peerings(
        network("ns", "local", "uid-l", Some("1"), &[]),
        vec![
            ready("a", "uid-ra", &["10.70.1.0/24", "10.70.0.0/24"]),
            ready("b", "uid-rb", &["10.70.1.0/24"]),
            ready("m", "uid-m", &["10.80.0.0/16"]),
            ready("stale", "uid-recreated", &["10.99.0.0/16"]),
        ],
    );
    let acl = acl_for_cluster(&[local, rome_a, rome_b, milan], "rome").expect("rome has networks");
    let expected: Vec<IpNet> = ["10.70.0.0/24", "10.70.1.0/24"]
        .iter()
        .map(|p| p.parse().expect("valid"))
        .collect();
    assert_eq!(acl, expected);
}
