use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use super::*;
use crate::agent::plan::{DesiredState, LinkIdentity, OverlayLink, Route, RuleSelector};

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
