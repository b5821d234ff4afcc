use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use super::*;
use crate::plan::{DesiredState, LinkIdentity, OverlayLink, Route, RuleSelector};

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

fn route(destination: &str, via: &str, via_overlay: bool) -> Route {
    Route {
        destination: net(destination),
        via: Some(via.parse::<IpAddr>().unwrap()),
        via_overlay,
        mtu: Some(1420),
        advmss: Some(1380),
    }
}

fn link(remote: Option<Ipv4Addr>) -> OverlayLink {
    OverlayLink {
        name: "kubetun.vxlan".to_owned(),
        vni: 1880,
        port: 4880,
        local: Ipv4Addr::new(192, 168, 0, 11),
        remote,
        mtu: 1450,
        address: "240.168.0.11/8".parse().unwrap(),
        flood_to: BTreeSet::new(),
    }
}

fn observed_link(link: &OverlayLink) -> ObservedLink {
    ObservedLink {
        identity: link.identity(),
        mtu: link.mtu,
        up: true,
        addresses: [link.address].into(),
        flood_to: link.flood_to.clone(),
    }
}

fn desired(routes: &[Route], rules: &[RuleSelector], overlay: Option<OverlayLink>) -> DesiredState {
    DesiredState {
        overlay,
        routes: routes
            .iter()
            .map(|r| (r.destination, r.clone()))
            .collect::<BTreeMap<_, _>>(),
        rules: rules.iter().copied().collect(),
        skipped: vec![],
    }
}

#[test]
fn from_nothing_routes_come_before_rules() {
    let want = desired(
        &[route("10.201.0.0/16", "192.168.0.10", false)],
        &[RuleSelector::To(net("10.201.0.0/16"))],
        None,
    );
    assert_eq!(
        diff(&ObservedState::default(), &want),
        vec![
            Change::PutRoute(route("10.201.0.0/16", "192.168.0.10", false)),
            Change::AddRule(RuleSelector::To(net("10.201.0.0/16"))),
        ]
    );
}

#[test]
fn an_agreeing_kernel_needs_no_change() {
    let want = desired(
        &[route("10.201.0.0/16", "240.168.0.10", true)],
        &[RuleSelector::To(net("10.201.0.0/16"))],
        Some(link(Some(Ipv4Addr::new(192, 168, 0, 10)))),
    );
    let have = ObservedState {
        overlay: want.overlay.as_ref().map(observed_link),
        routes: want.routes.values().cloned().collect(),
        rules: want.rules.iter().copied().collect(),
    };
    assert_eq!(diff(&have, &want), vec![]);
}

#[test]
fn stale_rules_go_first_and_changed_routes_are_replaced_in_place() {
    let want = desired(
        &[route("10.201.0.0/16", "192.168.0.12", false)],
        &[RuleSelector::To(net("10.201.0.0/16"))],
        None,
    );
    let have = ObservedState {
        overlay: None,
        routes: vec![
            route("10.201.0.0/16", "192.168.0.10", false),
            route("10.99.0.0/16", "192.168.0.10", false),
        ],
        rules: vec![
            RuleSelector::To(net("10.201.0.0/16")),
            RuleSelector::To(net("10.99.0.0/16")),
        ],
    };
    assert_eq!(
        diff(&have, &want),
        vec![
            Change::DeleteRule(RuleSelector::To(net("10.99.0.0/16"))),
            Change::DeleteRoute(route("10.99.0.0/16", "192.168.0.10", false)),
            Change::PutRoute(route("10.201.0.0/16", "192.168.0.12", false)),
        ]
    );
}

#[test]
fn duplicates_and_foreign_shapes_are_removed() {
    let want = desired(&[route("10.201.0.0/16", "192.168.0.10", false)], &[], None);
    let nexthopless = Route {
        via: None,
        mtu: None,
        advmss: None,
        ..route("10.202.0.0/16", "192.168.0.10", false)
    };
    let have = ObservedState {
        overlay: None,
        routes: vec![
            route("10.201.0.0/16", "192.168.0.10", false),
            route("10.201.0.0/16", "192.168.0.10", false),
            nexthopless.clone(),
        ],
        rules: vec![RuleSelector::Other],
    };
    assert_eq!(
        diff(&have, &want),
        vec![
            Change::DeleteRule(RuleSelector::Other),
            Change::DeleteRoute(route("10.201.0.0/16", "192.168.0.10", false)),
            Change::DeleteRoute(nexthopless),
        ]
    );
}

#[test]
fn a_moved_gateway_recreates_the_overlay_and_its_routes() {
    let old = link(Some(Ipv4Addr::new(192, 168, 0, 10)));
    let new = link(Some(Ipv4Addr::new(192, 168, 0, 12)));
    let have = ObservedState {
        overlay: Some(observed_link(&old)),
        routes: vec![route("10.201.0.0/16", "240.168.0.10", true)],
        rules: vec![RuleSelector::To(net("10.201.0.0/16"))],
    };
    let want = desired(
        &[route("10.201.0.0/16", "240.168.0.12", true)],
        &[RuleSelector::To(net("10.201.0.0/16"))],
        Some(new.clone()),
    );
    assert_eq!(
        diff(&have, &want),
        vec![
            Change::DeleteLink,
            Change::CreateLink(new.clone()),
            Change::AddAddress(new.address),
            Change::SetLinkUp,
            Change::PutRoute(route("10.201.0.0/16", "240.168.0.12", true)),
        ]
    );
}

#[test]
fn overlay_attributes_are_fixed_in_place() {
    let mut want_link = link(None);
    want_link.flood_to = [
        Ipv4Addr::new(192, 168, 0, 12),
        Ipv4Addr::new(192, 168, 0, 13),
    ]
    .into();
    let have = ObservedState {
        overlay: Some(ObservedLink {
            identity: LinkIdentity {
                ..want_link.identity()
            },
            mtu: 1400,
            up: false,
            addresses: ["240.1.1.1/8".parse().unwrap()].into(),
            flood_to: [
                Ipv4Addr::new(192, 168, 0, 12),
                Ipv4Addr::new(192, 168, 0, 99),
            ]
            .into(),
        }),
        routes: vec![],
        rules: vec![],
    };
    let want = desired(&[], &[], Some(want_link.clone()));
    assert_eq!(
        diff(&have, &want),
        vec![
            Change::SetLinkMtu(1450),
            Change::DeleteAddress("240.1.1.1/8".parse().unwrap()),
            Change::AddAddress(want_link.address),
            Change::DeleteFlood(Ipv4Addr::new(192, 168, 0, 99)),
            Change::AddFlood(Ipv4Addr::new(192, 168, 0, 13)),
            Change::SetLinkUp,
        ]
    );
}

#[test]
fn teardown_removes_rules_routes_then_the_link() {
    let have = ObservedState {
        overlay: Some(observed_link(&link(None))),
        routes: vec![route("10.0.1.0/24", "240.168.0.11", true)],
        rules: vec![RuleSelector::From(net("10.201.0.0/16"))],
    };
    assert_eq!(
        teardown(&have),
        vec![
            Change::DeleteRule(RuleSelector::From(net("10.201.0.0/16"))),
            Change::DeleteRoute(route("10.0.1.0/24", "240.168.0.11", true)),
            Change::DeleteLink,
        ]
    );
    assert_eq!(teardown(&ObservedState::default()), vec![]);
}

mod model {
    //! A model kernel: applying the diff to any observed state yields the desired state, and a
    //! second diff is empty.

    use proptest::prelude::*;

    use super::*;

    /// Applies `changes` the way the kernel would (replace by destination, link deletion drops
    /// the routes through it).
    fn apply(mut state: ObservedState, changes: &[Change]) -> ObservedState {
        for change in changes {
            match change {
                Change::DeleteRule(rule) => {
                    let at = state
                        .rules
                        .iter()
                        .position(|r| r == rule)
                        .expect("rule exists");
                    state.rules.remove(at);
                }
                Change::DeleteRoute(route) => {
                    let at = state
                        .routes
                        .iter()
                        .position(|r| r == route)
                        .expect("route exists");
                    state.routes.remove(at);
                }
                Change::DeleteLink => {
                    assert!(state.overlay.take().is_some(), "link exists");
                    state.routes.retain(|r| !r.via_overlay);
                }
                Change::CreateLink(link) => {
                    assert!(state.overlay.is_none(), "link absent");
                    state.overlay = Some(ObservedLink {
                        identity: link.identity(),
                        mtu: link.mtu,
                        up: false,
                        addresses: BTreeSet::new(),
                        flood_to: BTreeSet::new(),
                    });
                }
                Change::SetLinkMtu(mtu) => state.overlay.as_mut().expect("link").mtu = *mtu,
                Change::DeleteAddress(a) => {
                    assert!(state.overlay.as_mut().expect("link").addresses.remove(a));
                }
                Change::AddAddress(a) => {
                    assert!(state.overlay.as_mut().expect("link").addresses.insert(*a));
                }
                Change::DeleteFlood(ip) => {
                    assert!(state.overlay.as_mut().expect("link").flood_to.remove(ip));
                }
                Change::AddFlood(ip) => {
                    assert!(state.overlay.as_mut().expect("link").flood_to.insert(*ip));
                }
                Change::SetLinkUp => state.overlay.as_mut().expect("link").up = true,
                Change::PutRoute(route) => {
                    assert!(
                        !route.via_overlay || state.overlay.is_some(),
                        "overlay routes need the link"
                    );
                    match state
                        .routes
                        .iter()
                        .position(|r| r.destination == route.destination)
                    {
                        Some(at) => state.routes[at] = route.clone(),
                        None => state.routes.push(route.clone()),
                    }
                }
                Change::AddRule(rule) => {
                    assert!(!state.rules.contains(rule), "rule added twice");
                    state.rules.push(*rule);
                }
            }
        }
        state
    }

    fn destination() -> impl Strategy<Value = IpNet> {
        (0u8..4).prop_map(|i| format!("10.{}.0.0/16", 200 + i).parse().unwrap())
    }

    fn route(overlay: bool) -> impl Strategy<Value = Route> {
        (
            destination(),
            10u8..13,
            any::<bool>(),
            prop::option::of(1400u32..1402),
        )
            .prop_map(move |(destination, host, on_overlay, mtu)| Route {
                destination,
                via: Some(IpAddr::V4(Ipv4Addr::new(192, 168, 0, host))),
                via_overlay: overlay && on_overlay,
                mtu,
                advmss: mtu.map(|m| m - 40),
            })
    }

    fn rule() -> impl Strategy<Value = RuleSelector> {
        prop_oneof![
            destination().prop_map(RuleSelector::To),
            destination().prop_map(RuleSelector::From),
            Just(RuleSelector::Other),
        ]
    }

    fn overlay_link() -> impl Strategy<Value = OverlayLink> {
        (
            prop::option::of(10u8..12),
            1440u32..1451,
            prop::collection::btree_set(20u8..24, 0..3),
        )
            .prop_map(|(remote, mtu, flood)| OverlayLink {
                remote: remote.map(|h| Ipv4Addr::new(192, 168, 0, h)),
                mtu,
                flood_to: flood
                    .into_iter()
                    .map(|h| Ipv4Addr::new(192, 168, 0, h))
                    .collect(),
                ..link(None)
            })
    }

    fn observed() -> impl Strategy<Value = ObservedState> {
        prop::option::of((
            overlay_link(),
            any::<bool>(),
            prop::collection::btree_set(0u8..3, 0..3),
        ))
        .prop_flat_map(|link| {
            let has_link = link.is_some();
            let overlay = link.map(|(link, up, addresses)| ObservedLink {
                identity: link.identity(),
                mtu: link.mtu,
                up,
                addresses: addresses
                    .into_iter()
                    .map(|h| Ipv4Net::new(Ipv4Addr::new(240, 168, 0, h), 8).unwrap())
                    .collect(),
                flood_to: link.flood_to,
            });
            (
                Just(overlay),
                prop::collection::vec(route(has_link), 0..6),
                prop::collection::vec(rule(), 0..6),
            )
                .prop_map(|(overlay, routes, rules)| ObservedState {
                    overlay,
                    routes,
                    rules,
                })
        })
    }

    fn wanted() -> impl Strategy<Value = DesiredState> {
        prop::option::of(overlay_link()).prop_flat_map(|overlay| {
            let has_link = overlay.is_some();
            (
                Just(overlay),
                prop::collection::vec(route(has_link), 0..5),
                prop::collection::btree_set(
                    rule().prop_filter("never desired", |r| *r != RuleSelector::Other),
                    0..5,
                ),
            )
                .prop_map(|(overlay, routes, rules)| DesiredState {
                    overlay,
                    routes: routes.into_iter().map(|r| (r.destination, r)).collect(),
                    rules,
                    skipped: vec![],
                })
        })
    }

    proptest! {
        #[test]
        fn applying_the_diff_reaches_the_desired_state(have in observed(), want in wanted()) {
            let changes = diff(&have, &want);
            let after = apply(have, &changes);
            prop_assert_eq!(diff(&after, &want), vec![]);
            let mut routes = after.routes.clone();
            routes.sort();
            prop_assert_eq!(routes, want.routes.values().cloned().collect::<Vec<_>>());
            let rules: BTreeSet<RuleSelector> = after.rules.iter().copied().collect();
            prop_assert_eq!(rules.len(), after.rules.len(), "no duplicate rules");
            prop_assert_eq!(&rules, &want.rules);
            prop_assert_eq!(after.overlay.is_some(), want.overlay.is_some());
        }

        #[test]
        fn teardown_leaves_nothing(have in observed()) {
            prop_assert!(apply(have.clone(), &teardown(&have)).is_empty());
        }
    }
}
