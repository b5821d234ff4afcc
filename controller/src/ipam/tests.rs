use super::*;
use proptest::prelude::*;

fn net(s: &str) -> IpNet {
    s.parse().expect("valid CIDR in test")
}

/// Europe's IPAM in the seed topology: its own pod and external CIDRs are local ranges.
fn europe() -> Ipam {
    Ipam::new(IpamConfig {
        pools: rfc1918_pools(),
        reserved: vec![net("10.200.0.0/16"), net("10.70.0.0/16")],
    })
}

#[test]
fn seed_topology_keeps_pod_cidrs_and_remaps_identical_externals_apart() {
    let mut ipam = europe();
    let rome_pod = ipam.map("rome", net("10.202.0.0/16")).unwrap();
    let rome_ext = ipam.map("rome", net("10.70.0.0/16")).unwrap();
    let milan_pod = ipam.map("milan", net("10.203.0.0/16")).unwrap();
    let milan_ext = ipam.map("milan", net("10.70.0.0/16")).unwrap();

    assert_eq!(rome_pod, net("10.202.0.0/16"));
    assert_eq!(milan_pod, net("10.203.0.0/16"));
    // Best-fit packs the remap into the buddy of Europe's own external CIDR ...
    assert_eq!(rome_ext, net("10.71.0.0/16"));
    // ... and Milan's identical CIDR into the next smallest hole, the buddy of Europe's pods.
    assert_eq!(milan_ext, net("10.201.0.0/16"));
}

#[test]
fn map_is_idempotent_and_owners_are_independent() {
    let mut ipam = europe();
    let first = ipam.map("rome", net("10.70.0.0/16")).unwrap();
    assert_eq!(ipam.map("rome", net("10.70.0.0/16")).unwrap(), first);
    assert_eq!(
        ipam.map("rome", net("10.70.1.2/16")).unwrap(),
        first,
        "host bits are ignored"
    );
    let other = ipam.map("milan", net("10.70.0.0/16")).unwrap();
    assert_ne!(first, other);
}

#[test]
fn a_cidr_overlapping_another_peers_kept_cidr_is_remapped() {
    let mut ipam = europe();
    assert_eq!(
        ipam.map("rome", net("10.202.0.0/16")).unwrap(),
        net("10.202.0.0/16")
    );
    let milan = ipam.map("milan", net("10.202.0.0/16")).unwrap();
    assert_ne!(milan, net("10.202.0.0/16"));
    assert_eq!(milan.prefix_len(), 16);
}

#[test]
fn non_overlapping_cidr_outside_the_pools_is_kept() {
    let mut ipam = europe();
    assert_eq!(
        ipam.map("rome", net("100.64.0.0/16")).unwrap(),
        net("100.64.0.0/16")
    );
}

#[test]
fn exhaustion_is_an_error_naming_the_conflict() {
    let mut ipam = Ipam::new(IpamConfig {
        pools: vec![net("10.0.0.0/23")],
        reserved: vec![net("10.0.0.0/24")],
    });
    assert_eq!(
        ipam.map("a", net("10.0.0.0/24")).unwrap(),
        net("10.0.1.0/24")
    );
    let err = ipam.map("b", net("10.0.0.0/24")).unwrap_err();
    assert!(
        matches!(err, IpamError::PoolExhausted { len: 24, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("10.0.0.0/24"), "{err}");
    assert_eq!(ipam.view_of("b", net("10.0.0.0/24")), None);
}

#[test]
fn release_frees_prefixes_for_the_next_owner() {
    let mut ipam = Ipam::new(IpamConfig {
        pools: vec![net("10.0.0.0/23")],
        reserved: vec![net("10.0.0.0/24")],
    });
    let a = ipam.map("a", net("10.0.0.0/24")).unwrap();
    ipam.release("a");
    assert_eq!(ipam.map("b", net("10.0.0.0/24")).unwrap(), a);
}

#[test]
fn release_except_keeps_only_announced_prefixes() {
    let mut ipam = europe();
    ipam.map("rome", net("10.202.0.0/16")).unwrap();
    ipam.map("rome", net("10.70.0.0/16")).unwrap();
    ipam.release_except("rome", &[net("10.202.0.0/16")]);
    let left: Vec<_> = ipam.allocations().map(|a| a.real).collect();
    assert_eq!(left, vec![net("10.202.0.0/16")]);
}

#[test]
fn restore_refuses_overlaps_and_length_changes() {
    let mut ipam = europe();
    let err = ipam
        .restore("rome", net("10.70.0.0/16"), net("10.200.0.0/16"))
        .unwrap_err();
    assert!(matches!(err, IpamError::RestoreConflict { .. }));
    let err = ipam
        .restore("rome", net("10.70.0.0/16"), net("10.71.0.0/24"))
        .unwrap_err();
    assert!(matches!(err, IpamError::RestoreConflict { .. }));
    ipam.restore("rome", net("10.70.0.0/16"), net("10.99.0.0/16"))
        .unwrap();
    ipam.restore("rome", net("10.70.0.0/16"), net("10.99.0.0/16"))
        .unwrap();
    assert!(
        ipam.restore("rome", net("10.70.0.0/16"), net("10.98.0.0/16"))
            .is_err()
    );
    assert!(
        ipam.restore("milan", net("10.70.0.0/16"), net("10.99.0.0/16"))
            .is_err()
    );
}

#[test]
fn ipv6_needs_an_ipv6_pool() {
    let mut ipam = Ipam::new(IpamConfig {
        pools: rfc1918_pools(),
        reserved: vec![net("fd00:10::/64")],
    });
    assert!(matches!(
        ipam.map("a", net("fd00:10::/64")),
        Err(IpamError::PoolExhausted { .. })
    ));
    let mut ipam = Ipam::new(IpamConfig {
        pools: vec![net("fd00::/48")],
        reserved: vec![net("fd00::/64")],
    });
    assert_eq!(
        ipam.map("a", net("fd00::/64")).unwrap(),
        net("fd00:0:0:1::/64")
    );
}

fn arb_prefix() -> impl Strategy<Value = IpNet> {
    // Small address space on purpose: collisions and exhaustion are frequent.
    (0u32..64, 20u8..=26).prop_map(|(block, len)| {
        let addr = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) | (block << 12));
        IpNet::V4(Ipv4Net::new_assert(addr, len)).trunc()
    })
}

fn small_config() -> IpamConfig {
    IpamConfig {
        pools: vec![net("10.0.0.0/16")],
        reserved: vec![net("10.0.0.0/22"), net("10.0.64.0/20")],
    }
}

fn assert_no_overlap(ipam: &Ipam) {
    let views: Vec<IpNet> = ipam.allocations().map(|a| a.view).collect();
    for (i, a) in views.iter().enumerate() {
        for b in &views[i + 1..] {
            assert!(!overlaps(*a, *b), "views {a} and {b} overlap");
        }
        for r in ipam.reserved() {
            assert!(!overlaps(*a, *r), "view {a} overlaps local range {r}");
        }
    }
}

proptest! {
    #[test]
    fn views_never_overlap_and_keep_length(
        requests in proptest::collection::vec((0usize..6, arb_prefix()), 1..40)
    ) {
        let mut ipam = Ipam::new(small_config());
        for (owner, real) in requests {
            if let Ok(view) = ipam.map(&owner.to_string(), real) {
                prop_assert_eq!(view.prefix_len(), real.prefix_len());
            }
            assert_no_overlap(&ipam);
        }
    }

    #[test]
    fn map_is_idempotent(requests in proptest::collection::vec((0usize..6, arb_prefix()), 1..40)) {
        let mut ipam = Ipam::new(small_config());
        let mut seen = Vec::new();
        for (owner, real) in requests {
            if let Ok(view) = ipam.map(&owner.to_string(), real) {
                seen.push((owner, real, view));
            }
        }
        for (owner, real, view) in seen {
            prop_assert_eq!(ipam.map(&owner.to_string(), real), Ok(view));
        }
    }

    #[test]
    fn restore_rebuilds_the_same_state(
        requests in proptest::collection::vec((0usize..6, arb_prefix()), 1..40),
        next in arb_prefix(),
    ) {
        let mut ipam = Ipam::new(small_config());
        for (owner, real) in &requests {
            let _ = ipam.map(&owner.to_string(), *real);
        }
        let mut rebuilt = Ipam::new(small_config());
        for a in ipam.allocations() {
            prop_assert_eq!(rebuilt.restore(a.owner, a.real, a.view), Ok(()));
        }
        let before: Vec<_> = ipam.allocations().map(|a| (a.owner.to_owned(), a.real, a.view)).collect();
        let after: Vec<_> = rebuilt.allocations().map(|a| (a.owner.to_owned(), a.real, a.view)).collect();
        prop_assert_eq!(before, after);
        // Both continue identically.
        prop_assert_eq!(ipam.map("new", next), rebuilt.map("new", next));
    }

    #[test]
    fn release_frees_everything_of_the_owner(
        requests in proptest::collection::vec((0usize..6, arb_prefix()), 1..40),
        victim in 0usize..6,
    ) {
        let mut ipam = Ipam::new(small_config());
        for (owner, real) in &requests {
            let _ = ipam.map(&owner.to_string(), *real);
        }
        let freed: Vec<IpNet> = ipam.allocations().filter(|a| a.owner == victim.to_string()).map(|a| a.view).collect();
        ipam.release(&victim.to_string());
        prop_assert!(ipam.allocations().all(|a| a.owner != victim.to_string()));
        // Every freed view can be restored by someone else: nothing else holds it.
        for view in freed {
            prop_assert_eq!(ipam.restore("other", view, view), Ok(()));
            ipam.release("other");
        }
    }

    #[test]
    fn exhaustion_only_when_no_aligned_block_is_free(
        requests in proptest::collection::vec((0usize..6, arb_prefix()), 1..60)
    ) {
        let mut ipam = Ipam::new(small_config());
        for (owner, real) in requests {
            if let Err(IpamError::PoolExhausted { len, .. }) = ipam.map(&owner.to_string(), real) {
                // Brute force: every aligned block of that length in the pool is taken.
                let pool = net("10.0.0.0/16");
                let in_use: Vec<IpNet> = ipam
                    .reserved()
                    .iter()
                    .copied()
                    .chain(ipam.allocations().map(|a| a.view))
                    .collect();
                let count = 1u32 << (len - 16);
                for i in 0..count {
                    let addr = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + (i << (32 - len)));
                    let block = IpNet::V4(Ipv4Net::new_assert(addr, len));
                    prop_assert!(block.trunc() == block && pool.contains(&block));
                    prop_assert!(in_use.iter().any(|u| overlaps(*u, block)), "{block} was free");
                }
            }
        }
    }
}
