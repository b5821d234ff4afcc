//! Property tests against independent models: round trips through both directions, and a
//! naive longest-match model for fresh, successor and refilled tables.

use super::*;
use ipnet::IpNet;

/// (peer, view prefix, real prefix) reachable from the fuzz table, per family.
const V4_ROUTES: [(PeerId, [u8; 2], [u8; 2]); 4] = [
    (ROME, [10, 68], [10, 70]),
    (MILAN, [10, 69], [10, 70]),
    (ROME, [10, 202], [10, 202]),
    (MILAN, [10, 203], [10, 203]),
];

proptest! {
    #[test]
    fn egress_then_reverse_ingress_is_identity_v4(
        l4 in l4_strategy(),
        route in 0..V4_ROUTES.len(),
        local_host in any::<[u8; 2]>(),
        mut remote_host in any::<[u8; 2]>(),
        payload in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let (peer, view, real) = V4_ROUTES[route];
        if peer == MILAN && real == [10, 203] {
            remote_host[0] &= 0x7f; // inside Milan's ACL
        }
        let local = v4([10, 200, local_host[0], local_host[1]]);
        let view_addr = v4([view[0], view[1], remote_host[0], remote_host[1]]);
        let real_addr = v4([real[0], real[1], remote_host[0], remote_host[1]]);
        round_trip(l4, local, view_addr, real_addr, peer, &payload)?;
    }

    #[test]
    fn egress_then_reverse_ingress_is_identity_v6(
        l4 in l4_strategy().prop_filter("no UDP zero checksum on IPv6", |l| !matches!(l, L4::UdpNoChecksum)),
        milan in any::<bool>(),
        local_host in any::<u64>(),
        remote_host in any::<u64>(),
        payload in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let (peer, view) = if milan { (MILAN, 0xfd00_0069_u128) } else { (ROME, 0xfd00_0068) };
        let local = IpAddr::from(((0xfd00_0200_u128 << 96) | u128::from(local_host)).to_be_bytes());
        let view_addr = IpAddr::from(((view << 96) | u128::from(remote_host)).to_be_bytes());
        let real_addr = IpAddr::from(((0xfd00_0070_u128 << 96) | u128::from(remote_host)).to_be_bytes());
        round_trip(l4, local, view_addr, real_addr, peer, &payload)?;
    }

    #[test]
    fn table_lookup_matches_a_naive_model(
        raw in raw_routes(),
        probes in prop::collection::vec(any::<u32>(), 32),
    ) {
        let accepted = valid_routes(raw);
        let table = builder_for(&accepted).build().expect("valid");
        for probe in probes {
            check_egress(&table, &accepted, probe)?;
        }
    }

    /// Tables built after others (keeping their hash keys and numbering) and refilled into
    /// retired tables' memory answer exactly like fresh builds.
    #[test]
    fn successor_and_refilled_tables_match_fresh_builds(
        first in raw_routes(),
        edits in prop::collection::vec((any::<bool>(), 0u32..64, 8u8..=30, 0u32..64, 0u32..4), 1..8),
        probes in prop::collection::vec(any::<u32>(), 32),
    ) {
        let first = valid_routes(first);
        // The second state: the first one with a few routes removed (`add` false: the edit
        // picks a route by its position) and a few added.
        let removed: std::collections::HashSet<usize> = edits
            .iter()
            .enumerate()
            .filter(|(_, edit)| !edit.0)
            .map(|(i, _)| i * 7 % first.len())
            .collect();
        let added = edits
            .iter()
            .filter(|edit| edit.0)
            .map(|&(_, view, len, real, peer)| (view, len, real, peer))
            .collect();
        let kept = first
            .iter()
            .enumerate()
            .filter(|(i, _)| !removed.contains(i))
            .map(|(_, route)| *route)
            .collect();
        let second = valid_routes_after(kept, added);

        let t1 = builder_for(&first).build().expect("valid");
        let t2 = builder_for(&second).build_after(&t1).expect("valid");
        let t3 = builder_for(&first).build_after(&t2).expect("valid");
        let mut retired = t1.clone();
        retired.refill(&builder_for(&second).build_after(&t3).expect("valid"));
        let fresh = builder_for(&second).build().expect("valid");
        for probe in probes {
            check_egress(&t2, &second, probe)?;
            check_egress(&t3, &first, probe)?;
            check_egress(&retired, &second, probe)?;
            // Ingress from every peer, against a fresh build of the same state.
            let src = IpAddr::from((0x0a00_0000 | (probe & 0x00ff_ffff)).to_be_bytes());
            for peer in 0..4 {
                let mut a = build(src, v4([192, 168, 0, 1]), L4::Udp, b"p");
                let mut b = a.clone();
                prop_assert_eq!(retired.ingress(peer, &mut a), fresh.ingress(peer, &mut b));
                prop_assert_eq!(a, b);
            }
        }
        prop_assert_eq!(retired.views().collect::<Vec<_>>(), fresh.views().collect::<Vec<_>>());
    }
}

/// Routes drawn from a small space so that views and reals nest and collide:
/// `(view bits, length, real bits, peer)`.
fn raw_routes() -> impl Strategy<Value = Vec<(u32, u8, u32, u32)>> {
    prop::collection::vec((0u32..64, 8u8..=30, 0u32..64, 0u32..4), 1..60)
}

fn raw_prefix(bits: u32, len: u8) -> IpNet {
    let addr = (0x0a00_0000 | (bits << 18) | (bits << 8))
        & u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    IpNet::new(std::net::Ipv4Addr::from(addr).into(), len).expect("valid length")
}

/// The routes of `raw` that are valid together.
fn valid_routes(raw: Vec<(u32, u8, u32, u32)>) -> Vec<(PeerId, Route)> {
    valid_routes_after(Vec::new(), raw)
}

/// `accepted` plus the routes of `raw` that are valid together with them.
fn valid_routes_after(
    mut accepted: Vec<(PeerId, Route)>,
    raw: Vec<(u32, u8, u32, u32)>,
) -> Vec<(PeerId, Route)> {
    for (view_bits, len, real_bits, peer) in raw {
        let r = Route {
            view: raw_prefix(view_bits, len),
            real: raw_prefix(real_bits, len),
        };
        let view_taken = accepted.iter().any(|(_, a)| a.view == r.view);
        let real_mapped = accepted.iter().any(|(p, a)| *p == peer && a.real == r.real);
        if !view_taken && !real_mapped {
            accepted.push((peer, r));
        }
    }
    accepted
}

/// A builder with every route of `accepted`; the routes must be valid together.
fn builder_for(accepted: &[(PeerId, Route)]) -> TableBuilder {
    let mut by_peer: std::collections::BTreeMap<PeerId, Vec<Route>> = Default::default();
    for (peer, route) in accepted {
        by_peer.entry(*peer).or_default().push(*route);
    }
    let mut builder = TableBuilder::new();
    for (peer, routes) in by_peer {
        builder
            .add_peer(peer, &routes, None)
            .expect("a valid route set is accepted");
    }
    builder
}

/// Egress of a packet to `probe` (within 10.0.0.0/8) against the naive model of `routes`.
fn check_egress(
    table: &RemapTable,
    routes: &[(PeerId, Route)],
    probe: u32,
) -> Result<(), TestCaseError> {
    let addr = 0x0a00_0000 | (probe & 0x00ff_ffff);
    let mut pkt = build(
        v4([192, 168, 0, 1]),
        IpAddr::from(addr.to_be_bytes()),
        L4::Udp,
        b"p",
    );
    let verdict = table.egress(&mut pkt);
    match naive_egress(routes, addr) {
        Some((peer, real)) => {
            prop_assert_eq!(verdict, Verdict::Forward(peer));
            prop_assert_eq!(dst_of(&pkt), IpAddr::from(real.to_be_bytes()));
        }
        None => prop_assert_eq!(verdict, Verdict::Drop(DropReason::NoRoute)),
    }
    Ok(())
}

/// The longest view containing `addr`, if that route is also the longest real match of its
/// peer for the translated address.
fn naive_egress(routes: &[(PeerId, Route)], addr: u32) -> Option<(PeerId, u32)> {
    let parts = |n: &IpNet| match n {
        IpNet::V4(n) => (u32::from(n.network()), u32::from(n.netmask())),
        IpNet::V6(_) => unreachable!(),
    };
    let (peer, r) = routes
        .iter()
        .filter(|(_, r)| addr & parts(&r.view).1 == parts(&r.view).0)
        .max_by_key(|(_, r)| r.view.prefix_len())?;
    let (real_net, mask) = parts(&r.real);
    let real = real_net | (addr & !mask);
    let owner = routes
        .iter()
        .filter(|(p, o)| p == peer && real & parts(&o.real).1 == parts(&o.real).0)
        .max_by_key(|(_, o)| o.real.prefix_len())?;
    (owner.1 == *r).then_some((*peer, real))
}

fn round_trip(
    l4: L4,
    local: IpAddr,
    view: IpAddr,
    real: IpAddr,
    peer: PeerId,
    payload: &[u8],
) -> Result<(), TestCaseError> {
    let table = fuzz_table();
    let original = build(local, view, l4, payload);
    let mut pkt = original.clone();
    prop_assert_eq!(table.egress(&mut pkt), Verdict::Forward(peer));
    prop_assert_eq!(dst_of(&pkt), real);
    prop_assert_eq!(
        &pkt,
        &build(local, real, l4, payload),
        "egress equals a fresh build"
    );
    assert_checksums(&pkt);
    swap_addresses(&mut pkt);
    prop_assert_eq!(table.ingress(peer, &mut pkt), Verdict::Deliver);
    assert_checksums(&pkt);
    swap_addresses(&mut pkt);
    prop_assert_eq!(pkt, original);
    Ok(())
}
