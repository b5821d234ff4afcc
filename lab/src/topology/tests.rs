use super::*;

fn seed_with(edit: impl FnOnce(&mut Topology)) -> Result<(), TopologyError> {
    let mut topology = Topology::seed();
    edit(&mut topology);
    topology.validate()
}

#[test]
fn every_example_topology_is_valid() {
    for (name, text) in [
        ("seed.yaml", SEED_YAML),
        (
            "overlap.yaml",
            include_str!("../../../examples/overlap.yaml"),
        ),
        ("multinode.yaml", MULTINODE_YAML),
    ] {
        Topology::from_yaml(text).unwrap_or_else(|e| panic!("examples/{name}: {e}"));
    }
}

#[test]
fn seed_topology_parses() {
    let seed = Topology::seed();
    let names: Vec<_> = seed.clusters.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["Europe", "Rome", "Milan", "Paris"]);
    let external: Vec<_> = seed.clusters.iter().map(|c| c.external_cidr).collect();
    assert!(
        external
            .iter()
            .all(|c| *c == Some("10.70.0.0/16".parse().unwrap()))
    );
    assert_eq!(seed.links.len(), 3);
    assert_eq!(seed.shortcuts, [LinkSpec("Rome".into(), "Milan".into())]);
    assert_eq!(seed.hub_only, [LinkSpec("Rome".into(), "Paris".into())]);
    assert_eq!(seed.mtu, 1420);
}

#[test]
fn addresses_follow_the_layout() {
    let seed = Topology::seed();
    let rome = seed.cluster("rome").unwrap();
    assert_eq!(rome.gateway_pod_address(), Ipv4Addr::new(10, 202, 0, 1));
    assert_eq!(rome.pod_address(1), Ipv4Addr::new(10, 202, 0, 11));
    assert_eq!(rome.external_address(2), Some(Ipv4Addr::new(10, 70, 0, 12)));
    assert_eq!(seed.underlay_address(0), Ipv4Addr::new(198, 18, 0, 1));
    assert_eq!(seed.underlay_address(2), Ipv4Addr::new(198, 18, 0, 3));
}

#[test]
fn translate_keeps_host_bits() {
    let view: Ipv4Net = "10.201.0.0/16".parse().unwrap();
    assert_eq!(
        translate(Ipv4Addr::new(10, 70, 3, 4), view),
        Ipv4Addr::new(10, 201, 3, 4)
    );
}

#[test]
fn peers_by_phase() {
    let seed = Topology::seed();
    let names = |peers: Vec<&ClusterSpec>| -> Vec<String> {
        peers.into_iter().map(|c| c.name.clone()).collect()
    };
    assert_eq!(
        names(seed.peers_of("Europe", false)),
        ["Rome", "Milan", "Paris"]
    );
    assert_eq!(names(seed.peers_of("Rome", false)), ["Europe"]);
    assert_eq!(
        names(seed.peers_of("Rome", true)),
        ["Europe", "Milan", "Paris"]
    );
    assert_eq!(names(seed.peers_of("Milan", true)), ["Europe", "Rome"]);
}

#[test]
fn rejects_unknown_fields_and_bad_yaml() {
    let err = Topology::from_yaml("underlay: 198.18.0.0/24\nclusters: []\nfoo: 1\n");
    assert!(matches!(err, Err(TopologyError::Yaml(_))), "{err:?}");
    let err = Topology::from_yaml("underlay: not-a-cidr\nclusters: []\n");
    assert!(matches!(err, Err(TopologyError::Yaml(_))), "{err:?}");
}

#[test]
fn rejects_empty_topology() {
    let err = Topology::from_yaml("underlay: 198.18.0.0/24\nclusters: []\n");
    assert!(matches!(err, Err(TopologyError::NoClusters)), "{err:?}");
}

#[test]
fn rejects_bad_cluster_names() {
    for bad in ["", "9lives", "new-york", "toolongname", "über"] {
        let err = seed_with(|t| t.clusters[0].name = bad.into());
        assert!(
            matches!(err, Err(TopologyError::ClusterName(_))),
            "{bad}: {err:?}"
        );
    }
}

#[test]
fn rejects_duplicate_clusters_case_insensitively() {
    let err = seed_with(|t| t.clusters[1].name = "EUROPE".into());
    assert!(
        matches!(err, Err(TopologyError::DuplicateCluster(_))),
        "{err:?}"
    );
}

#[test]
fn rejects_host_bits_and_tiny_cidrs() {
    let err = seed_with(|t| t.clusters[0].pod_cidr = "10.200.0.1/16".parse().unwrap());
    let message = err.unwrap_err().to_string();
    assert!(message.contains("did you mean 10.200.0.0/16"), "{message}");
    let err = seed_with(|t| t.clusters[0].pod_cidr = "10.200.0.0/29".parse().unwrap());
    assert!(
        matches!(err, Err(TopologyError::TooSmall { .. })),
        "{err:?}"
    );
    let err = seed_with(|t| t.underlay = "198.18.0.0/31".parse().unwrap());
    assert!(
        matches!(err, Err(TopologyError::TooSmall { .. })),
        "{err:?}"
    );
}

#[test]
fn rejects_overlaps_inside_a_cluster_and_with_the_underlay() {
    let err = seed_with(|t| t.clusters[0].external_cidr = Some("10.200.4.0/24".parse().unwrap()));
    assert!(matches!(err, Err(TopologyError::Overlap { .. })), "{err:?}");
    let err = seed_with(|t| t.underlay = "10.0.0.0/8".parse().unwrap());
    assert!(matches!(err, Err(TopologyError::Overlap { .. })), "{err:?}");
}

#[test]
fn overlapping_cidrs_across_clusters_are_allowed() {
    seed_with(|t| t.clusters[1].pod_cidr = t.clusters[0].pod_cidr).unwrap();
}

#[test]
fn rejects_externals_without_cidr_and_too_many_endpoints() {
    let err = seed_with(|t| t.clusters[0].external_cidr = None);
    assert!(
        matches!(err, Err(TopologyError::Endpoints { .. })),
        "{err:?}"
    );
    seed_with(|t| {
        t.clusters[0].external_cidr = None;
        t.clusters[0].externals = 0;
    })
    .unwrap();
    let err = seed_with(|t| t.clusters[0].pods = MAX_ENDPOINTS + 1);
    assert!(
        matches!(err, Err(TopologyError::Endpoints { .. })),
        "{err:?}"
    );
}

#[test]
fn rejects_bad_links() {
    let err = seed_with(|t| t.links.push(LinkSpec("Rome".into(), "Lyon".into())));
    let message = err.unwrap_err().to_string();
    assert!(message.contains("unknown cluster \"Lyon\""), "{message}");
    let err = seed_with(|t| t.links.push(LinkSpec("Rome".into(), "rome".into())));
    assert!(
        matches!(err, Err(TopologyError::SelfLink { .. })),
        "{err:?}"
    );
    let err = seed_with(|t| t.shortcuts.push(LinkSpec("rome".into(), "europe".into())));
    assert!(
        matches!(err, Err(TopologyError::DuplicateLink { .. })),
        "{err:?}"
    );
    // A pair through the hub needs one linked to both.
    let err = seed_with(|t| t.links.retain(|l| l.1 != "Paris"));
    assert_eq!(
        err.unwrap_err().to_string(),
        "hub-only Rome <-> Paris: no cluster is linked to both, to carry their traffic"
    );
}

#[test]
fn node_slices_split_the_pod_cidr() {
    let mut spec = Topology::seed().clusters[1].clone();
    assert!(!spec.is_multi_node());
    assert_eq!(
        spec.node_pod_cidr(0),
        spec.pod_cidr,
        "one node holds the whole CIDR"
    );
    spec.nodes = 3;
    let slices: Vec<String> = (0..3).map(|i| spec.node_pod_cidr(i).to_string()).collect();
    assert_eq!(
        slices,
        ["10.202.0.0/18", "10.202.64.0/18", "10.202.128.0/18"]
    );
    assert_eq!(spec.node_pod_address(1, 2), Ipv4Addr::new(10, 202, 64, 12));
    assert_eq!(spec.node_address(2), Ipv4Addr::new(100, 64, 0, 13));
    assert!(spec.pod_cidr.contains(&spec.node_pod_address(0, 1)));
}

#[test]
fn multi_node_example_parses() {
    let topology = Topology::from_yaml(MULTINODE_YAML).unwrap();
    assert!(topology.clusters.iter().all(ClusterSpec::is_multi_node));
    let hops: Vec<NodeHop> = topology.clusters.iter().map(|c| c.node_hop).collect();
    assert_eq!(
        hops,
        [NodeHop::Direct, NodeHop::Overlay],
        "both hops are exercised"
    );
    let pods: HashSet<_> = topology.clusters.iter().map(|c| c.pod_cidr).collect();
    assert_eq!(pods.len(), 1, "the example's clusters share their pod CIDR");
}

#[test]
fn rejects_bad_node_counts_and_node_network_overlaps() {
    for bad in [0, MAX_NODES + 1] {
        let err = seed_with(|t| t.clusters[0].nodes = bad);
        assert!(matches!(err, Err(TopologyError::Nodes { .. })), "{err:?}");
    }
    let err = seed_with(|t| {
        t.clusters[0].nodes = 8;
        t.clusters[0].pod_cidr = "10.200.0.0/28".parse().unwrap();
    });
    assert!(matches!(err, Err(TopologyError::Nodes { .. })), "{err:?}");
    let err = seed_with(|t| {
        t.clusters[0].nodes = 2;
        t.clusters[0].pod_cidr = "100.64.0.0/16".parse().unwrap();
    });
    assert!(matches!(err, Err(TopologyError::Overlap { .. })), "{err:?}");
    // A single-node cluster never uses the node network.
    seed_with(|t| t.clusters[0].pod_cidr = "100.64.0.0/16".parse().unwrap()).unwrap();
}

#[test]
fn rejects_bad_mtu() {
    let err = seed_with(|t| t.mtu = 576);
    assert!(matches!(err, Err(TopologyError::Mtu(576))), "{err:?}");
}
