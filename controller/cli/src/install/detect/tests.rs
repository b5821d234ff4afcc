use super::*;

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|n| n.parse().unwrap()).collect()
}

#[test]
fn node_pod_cidrs_are_covered_per_family() {
    assert_eq!(
        covering(&nets(&[
            "10.244.0.0/24",
            "10.244.1.0/24",
            "10.244.3.0/24",
            "fd00::/64"
        ])),
        nets(&["10.244.0.0/22", "fd00::/64"])
    );
}

#[test]
fn node_addresses_give_their_subnets() {
    let ips: Vec<IpAddr> = ["192.168.1.10", "192.168.1.11", "192.168.0.5"]
        .iter()
        .map(|i| i.parse().unwrap())
        .collect();
    assert_eq!(node_subnets(&ips), nets(&["192.168.0.0/23"]));
}

#[test]
fn overlaps_are_named_with_both_ranges() {
    let pod = nets(&["10.0.0.0/8"]);
    let node = nets(&["10.1.2.0/24"]);
    let service = nets(&["172.20.0.0/16"]);
    let error = check_overlaps(&[
        ("pod CIDR", &pod),
        ("service CIDR", &service),
        ("node subnet", &node),
    ])
    .unwrap_err();
    assert!(
        error.contains("the pod CIDR 10.0.0.0/8 overlaps the node subnet 10.1.2.0/24"),
        "{error}"
    );
    assert_eq!(
        service_from_cluster_ip("10.96.0.1".parse().unwrap()),
        Some("10.96.0.0/12".parse().unwrap())
    );
}

fn node(name: &str, labels: serde_json::Value, addresses: &[(&str, &str)]) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "status": {"addresses": addresses
            .iter()
            .map(|(t, a)| serde_json::json!({"type": t, "address": a}))
            .collect::<Vec<_>>()},
    }))
    .unwrap()
}

fn pod(name: &str, node: Option<&str>, host_ip: &str, ready: bool, deleted: bool) -> Pod {
    let mut pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "kubetun-system"},
        "spec": {"containers": [], "nodeName": node},
        "status": {
            "phase": "Running",
            "hostIP": host_ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    }))
    .unwrap();
    if deleted {
        pod.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
    }
    pod
}

fn nodes() -> Vec<Node> {
    vec![
        node(
            "c",
            serde_json::json!({"gw": "yes"}),
            &[("InternalIP", "10.0.0.3")],
        ),
        node(
            "a",
            serde_json::json!({}),
            &[("InternalIP", "10.0.0.1"), ("ExternalIP", "203.0.113.1")],
        ),
        node(
            "b",
            serde_json::json!({"gw": "yes"}),
            &[("InternalIP", "10.0.0.2")],
        ),
        node(
            "d",
            serde_json::json!({"gw": "yes"}),
            &[("ExternalIP", "203.0.113.4")],
        ),
    ]
}

fn gw() -> BTreeMap<String, String> {
    BTreeMap::from([("gw".to_owned(), "yes".to_owned())])
}

#[test]
fn the_node_port_is_reached_on_the_gateway_pods_node() {
    let pods = [
        pod("kubetun-gateway-old", Some("a"), "10.0.0.1", true, true),
        pod("kubetun-gateway-new", Some("c"), "10.0.0.3", true, false),
    ];
    let found = node_port_endpoint(31820, &pods, &nodes(), &gw()).unwrap();
    assert_eq!((found.address.as_str(), found.port), ("10.0.0.3", 31820));
    assert!(found.node_port);
    assert!(
        found
            .why
            .contains("InternalIP of Node c, where the gateway pod kubetun-gateway-new runs"),
        "{}",
        found.why
    );
    assert!(
        found.why.contains("externalTrafficPolicy: Local"),
        "{}",
        found.why
    );

    // Its node's ExternalIP first; a ready pod before one that is not.
    let pods = [
        pod("kubetun-gateway-1", Some("b"), "10.0.0.2", false, false),
        pod("kubetun-gateway-2", Some("d"), "10.0.0.4", true, false),
    ];
    let found = node_port_endpoint(31820, &pods, &nodes(), &BTreeMap::new()).unwrap();
    assert_eq!(found.address, "203.0.113.4");

    // A node the CLI does not see: the pod's status.hostIP.
    let pods = [pod("kubetun-gateway-1", Some("e"), "10.0.0.5", true, false)];
    let found = node_port_endpoint(31820, &pods, &nodes(), &gw()).unwrap();
    assert_eq!(found.address, "10.0.0.5");
    assert!(
        found.why.contains("status.hostIP of the gateway pod"),
        "{}",
        found.why
    );
}

#[test]
fn before_the_pod_is_scheduled_the_node_port_is_on_a_gateway_node() {
    // Unscheduled and deleted pods do not count.
    let pods = [
        pod("kubetun-gateway-pending", None, "", false, false),
        pod("kubetun-gateway-old", Some("a"), "10.0.0.1", true, true),
    ];
    // The selector's Nodes, by name, ExternalIPs first: d over b and c.
    let found = node_port_endpoint(31820, &pods, &nodes(), &gw()).unwrap();
    assert_eq!(found.address, "203.0.113.4");
    assert!(
        found
            .why
            .contains("Node d, the first of the 3 Node(s) matching --gateway-node-selector gw=yes"),
        "{}",
        found.why
    );
    let without_d: Vec<Node> = nodes()
        .into_iter()
        .filter(|n| n.metadata.name.as_deref() != Some("d"))
        .collect();
    let found = node_port_endpoint(31820, &pods, &without_d, &gw()).unwrap();
    assert_eq!(found.address, "10.0.0.2");

    // No selector: today's rule, the first ExternalIP by name.
    let found = node_port_endpoint(31820, &pods, &nodes(), &BTreeMap::new()).unwrap();
    assert_eq!(found.address, "203.0.113.1");
    assert!(
        found.why.contains("Node a, the first by name"),
        "{}",
        found.why
    );
    assert!(
        !found.why.contains("--gateway-node-selector"),
        "{}",
        found.why
    );

    // A selector no Node matches: the same, saying so.
    let none = BTreeMap::from([("gw".to_owned(), "no".to_owned())]);
    let found = node_port_endpoint(31820, &[], &nodes(), &none).unwrap();
    assert_eq!(found.address, "203.0.113.1");
    assert!(
        found
            .why
            .contains("no Node matching --gateway-node-selector"),
        "{}",
        found.why
    );

    assert_eq!(node_port_endpoint(31820, &[], &[], &gw()), None);
    assert_eq!(
        gateway_nodes_fact(&nodes(), &gw(), 1).to_string(),
        "gateway nodes: b,c,d (the Nodes labelled gw=yes (--gateway-node-selector), of 4 \
         Node(s))"
    );
    let fact = gateway_nodes_fact(&nodes(), &none, 1);
    assert_eq!(fact.value, "none");
    assert!(
        fact.source.contains("`kubectl label node <node> gw=no`"),
        "{fact}"
    );
    let one = BTreeMap::from([
        ("gw".to_owned(), "yes".to_owned()),
        ("zone".to_owned(), String::new()),
    ]);
    let mut labelled = nodes();
    labelled[0]
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("zone".into(), String::new());
    let fact = gateway_nodes_fact(&labelled, &one, 2);
    assert_eq!(fact.value, "c");
    assert!(fact.source.contains("the 2 replicas of --ha"), "{fact}");
    assert!(fact.source.contains("1 stay Pending"), "{fact}");
    assert_eq!(matching_nodes(&nodes(), &gw()), ["b", "c", "d"]);
    assert_eq!(matching_nodes(&nodes(), &none), Vec::<String>::new());
}
