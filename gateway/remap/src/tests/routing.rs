//! Which peer a packet goes to or may come from: views, source checks, ACLs and nested
//! prefixes.

use super::*;

#[test]
fn identical_real_cidrs_route_by_view() {
    let table = fuzz_table();
    let local = v4([10, 200, 0, 5]);
    for (view, peer) in [([10, 68, 1, 2], ROME), ([10, 69, 1, 2], MILAN)] {
        let mut pkt = build(local, v4(view), L4::Tcp, b"hello");
        assert_eq!(table.egress(&mut pkt), Verdict::Forward(peer));
        assert_eq!(
            dst_of(&pkt),
            v4([10, 70, 1, 2]),
            "dst rewritten view -> real"
        );
        assert_checksums(&pkt);
    }
    for (peer, view) in [(ROME, [10, 68, 1, 2]), (MILAN, [10, 69, 1, 2])] {
        let mut pkt = build(v4([10, 70, 1, 2]), local, L4::Udp, b"reply");
        assert_eq!(table.ingress(peer, &mut pkt), Verdict::Deliver);
        assert_eq!(src_of(&pkt), v4(view), "src rewritten real -> view");
        assert_checksums(&pkt);
    }
}

#[test]
fn unmapped_routes_pass_unchanged() {
    let table = fuzz_table();
    let original = build(v4([10, 200, 0, 5]), v4([10, 202, 3, 4]), L4::Tcp, b"x");
    let mut pkt = original.clone();
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
    assert_eq!(pkt, original);
}

#[test]
fn egress_without_route_is_dropped() {
    let table = fuzz_table();
    let mut pkt = build(v4([10, 200, 0, 5]), v4([10, 71, 0, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Drop(DropReason::NoRoute));
    let mut pkt = build(v6("fd00:200::5"), v6("fd00:70::1"), L4::Udp, b"x");
    assert_eq!(
        table.egress(&mut pkt),
        Verdict::Drop(DropReason::NoRoute),
        "a real prefix is not a view"
    );
}

#[test]
fn ingress_checks_the_peer_and_its_sources() {
    let table = fuzz_table();
    let local = v4([10, 200, 0, 5]);
    let mut pkt = build(v4([10, 203, 0, 1]), local, L4::Udp, b"x");
    assert_eq!(
        table.ingress(ROME, &mut pkt),
        Verdict::Drop(DropReason::SourceNotAllowed)
    );
    let mut pkt = build(v4([10, 202, 0, 1]), local, L4::Udp, b"x");
    assert_eq!(
        table.ingress(77, &mut pkt),
        Verdict::Drop(DropReason::UnknownPeer)
    );
    assert_eq!(
        table.ingress(MAX_PEER_ID, &mut pkt),
        Verdict::Drop(DropReason::UnknownPeer)
    );
    assert_eq!(table.ingress(ROME, &mut pkt), Verdict::Deliver);
}

#[test]
fn local_sources_are_restricted() {
    let table = fuzz_table();
    let mut pkt = build(v4([10, 201, 0, 5]), v4([10, 68, 0, 1]), L4::Udp, b"x");
    assert_eq!(
        table.egress(&mut pkt),
        Verdict::Drop(DropReason::LocalSourceNotAllowed)
    );
    let mut pkt = build(v6("fd00:201::5"), v6("fd00:68::1"), L4::Udp, b"x");
    assert_eq!(
        table.egress(&mut pkt),
        Verdict::Drop(DropReason::LocalSourceNotAllowed)
    );
    let mut pkt = build(v6("fd00:200::5"), v6("fd00:68::1"), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(ROME));
}

#[test]
fn acl_applies_to_real_remote_addresses_in_both_directions() {
    let table = fuzz_table();
    let local = v4([10, 200, 0, 5]);
    // Milan's ACL allows 10.203.0.0/17 and its external 10.70.0.0/16 (seen as 10.69.0.0/16).
    let mut pkt = build(local, v4([10, 69, 9, 9]), L4::Tcp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(MILAN));
    let mut pkt = build(local, v4([10, 203, 200, 1]), L4::Tcp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Drop(DropReason::Acl));
    let mut pkt = build(v4([10, 203, 200, 1]), local, L4::Tcp, b"x");
    assert_eq!(
        table.ingress(MILAN, &mut pkt),
        Verdict::Drop(DropReason::Acl)
    );
    let mut pkt = build(v4([10, 203, 1, 1]), local, L4::Tcp, b"x");
    assert_eq!(table.ingress(MILAN, &mut pkt), Verdict::Deliver);
}

#[test]
fn empty_acl_fails_closed() {
    let mut builder = TableBuilder::new();
    builder
        .add_peer(1, &[route("10.202.0.0/16", "10.202.0.0/16")], Some(&[]))
        .expect("valid");
    let table = builder.build().expect("valid");
    let mut pkt = build(v4([10, 200, 0, 1]), v4([10, 202, 0, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Drop(DropReason::Acl));
    let mut pkt = build(v4([10, 202, 0, 1]), v4([10, 200, 0, 1]), L4::Udp, b"x");
    assert_eq!(table.ingress(1, &mut pkt), Verdict::Drop(DropReason::Acl));
}

#[test]
fn nested_views_of_different_peers_follow_the_longest_match() {
    // A hub announces 10.0.0.0/8; a direct shortcut to Rome announces 10.202.0.0/16.
    let mut builder = TableBuilder::new();
    builder
        .add_peer(1, &[route("10.0.0.0/8", "10.0.0.0/8")], None)
        .expect("valid");
    builder
        .add_peer(2, &[route("10.202.0.0/16", "10.202.0.0/16")], None)
        .expect("valid");
    let table = builder.build().expect("valid");
    let local = v4([192, 168, 0, 1]);
    let mut pkt = build(local, v4([10, 202, 1, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(2));
    let mut pkt = build(local, v4([10, 5, 1, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(1));
    // The hub may not speak for Rome's addresses: replies would go to the shortcut.
    let mut pkt = build(v4([10, 202, 1, 1]), local, L4::Udp, b"x");
    assert_eq!(
        table.ingress(1, &mut pkt),
        Verdict::Drop(DropReason::SourceNotAllowed)
    );
    let mut pkt = build(v4([10, 5, 1, 1]), local, L4::Udp, b"x");
    assert_eq!(table.ingress(1, &mut pkt), Verdict::Deliver);
}

#[test]
fn nested_real_prefixes_of_one_peer_stay_a_bijection() {
    let mut builder = TableBuilder::new();
    let routes = [
        route("10.70.0.0/16", "10.68.0.0/16"),
        route("10.70.5.0/24", "10.99.5.0/24"),
    ];
    builder.add_peer(1, &routes, None).expect("valid");
    let table = builder.build().expect("valid");
    let local = v4([10, 200, 0, 1]);
    // 10.70.5.x answers as 10.99.5.x, so 10.68.5.x is no name for it.
    let mut pkt = build(local, v4([10, 68, 5, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Drop(DropReason::NoRoute));
    let mut pkt = build(local, v4([10, 99, 5, 1]), L4::Udp, b"x");
    assert_eq!(table.egress(&mut pkt), Verdict::Forward(1));
    assert_eq!(dst_of(&pkt), v4([10, 70, 5, 1]));
    let mut pkt = build(v4([10, 70, 5, 1]), local, L4::Udp, b"x");
    assert_eq!(table.ingress(1, &mut pkt), Verdict::Deliver);
    assert_eq!(src_of(&pkt), v4([10, 99, 5, 1]));
    let mut pkt = build(v4([10, 70, 6, 1]), local, L4::Udp, b"x");
    assert_eq!(table.ingress(1, &mut pkt), Verdict::Deliver);
    assert_eq!(src_of(&pkt), v4([10, 68, 6, 1]));
}
