//! The lab with multi-node clusters end to end (`examples/multinode.yaml`): Paris (3 nodes,
//! direct hop to the gateway's node) and Berlin (2 nodes, VXLAN overlay hop) share every CIDR (pods 10.100.0.0/16, externals 10.70.0.0/16), so each side
//! reaches the other only through remapped views. Real gateways on each cluster's first node,
//! the route agent converged on every node. Pods behind nodes other than the gateway's ping and
//! exchange TCP with the peer's pods in both directions (the server must see the client at its
//! view); then Paris' gateway moves to node 2 and the same holds, the old node has lost the TUN
//! and the underlay, and the agent's routes follow; then Berlin's moves too (its overlay is
//! rebuilt) and the same holds again. Needs root.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use kubetun_integration::lab::checks::reach_address;
use kubetun_integration::lab::fabric::runs_gateway;
use kubetun_integration::lab::named;
use kubetun_integration::lab::state::{ClusterState, LabState, Member};
use kubetun_integration::lab::{self, LabOptions};
use kubetun_integration::netns::{bin_path, namespaces_with_prefix, require_root};
use kubetun_integration::topology::{MULTINODE_YAML, NodeHop, Topology};

/// Names of this test's namespaces start with it (never a user's lab or another test).
const PREFIX: &str = "tmn";
/// How long a path may take to answer (a handshake after the move included).
const CONVERGE: Duration = Duration::from_secs(20);
/// Port of this test's own TCP exchanges.
const TCP_PORT: u16 = 5281;

fn load(dir: &std::path::Path) -> (ClusterState, ClusterState) {
    let state = LabState::load(dir).unwrap().expect("lab state");
    let find = |id: &str| state.clusters.iter().find(|c| c.id == id).unwrap().clone();
    (find("paris"), find("berlin"))
}

/// Pods behind the nodes that do not run the gateway.
fn off_gateway(cluster: &ClusterState) -> Vec<Member> {
    let pods: Vec<Member> = cluster.pods_off_gateway().cloned().collect();
    assert!(!pods.is_empty(), "{} has non-gateway nodes", cluster.name);
    pods
}

/// `src` of `from` pings `dst` of `to` at its view and exchanges TCP with it; the server sees
/// the client at the view `to` uses for it.
fn assert_reaches(from: &ClusterState, src: &Member, to: &ClusterState, dst: &Member, when: &str) {
    let target = reach_address(from, to, dst.address).expect("a view of the peer");
    let expected = reach_address(to, from, src.address).expect("a view back");
    assert!(
        !from.pod_cidr.contains(&target),
        "{target} is remapped out of {}'s own pod CIDR",
        from.name
    );
    let what = format!(
        "{when}: {} {} -> {} {} at {target}",
        from.name, src.namespace, to.name, dst.namespace
    );
    assert!(
        named::wait_ping(&src.namespace, target, CONVERGE),
        "ping {what}"
    );
    let seen = named::tcp_exchange(
        &src.namespace,
        &dst.namespace,
        dst.address,
        target,
        TCP_PORT,
        CONVERGE,
    )
    .unwrap_or_else(|e| panic!("tcp {what}: {e}"));
    assert_eq!(
        seen.ip(),
        IpAddr::V4(expected),
        "tcp {what}: client seen at"
    );
}

/// Every pod off Paris' gateway node reaches Berlin's pod off its gateway node, and back.
fn assert_cross_cluster(paris: &ClusterState, berlin: &ClusterState, when: &str) {
    let berlin_pod = &off_gateway(berlin)[0];
    for paris_pod in off_gateway(paris) {
        assert_reaches(paris, &paris_pod, berlin, berlin_pod, when);
        assert_reaches(berlin, berlin_pod, paris, &paris_pod, when);
    }
}

/// The agent's table on every node: members route every view via the gateway's node, the
/// gateway's node routes the other nodes' slices for return traffic from the views; with the
/// overlay, every next hop is an overlay address on the agent's VXLAN device.
fn assert_agent_routes(cluster: &ClusterState) {
    let gateway = cluster.gateway_next_hop().expect("next hop to the gateway");
    let overlay = cluster.node_hop == NodeHop::Overlay;
    let views = cluster.remote_views();
    assert_eq!(views.len(), 2, "{}: pod and external view", cluster.name);
    for (index, node) in cluster.nodes.iter().enumerate() {
        let routes = named::exec(
            &node.namespace,
            &["ip", "route", "show", "table", "1880", "proto", "183"],
        )
        .unwrap();
        let rules =
            named::exec(&node.namespace, &["ip", "rule", "show", "priority", "1880"]).unwrap();
        let label = format!(
            "{} {}: routes {routes:?} rules {rules:?}",
            cluster.name, node.name
        );
        assert_eq!(
            has_link(&node.namespace, "kubetun.vxlan"),
            overlay,
            "{label}: VXLAN device"
        );
        assert_eq!(routes.contains("dev kubetun.vxlan"), overlay, "{label}");
        if index == cluster.gateway_node {
            for (other_index, other) in cluster.nodes.iter().enumerate() {
                if other_index == index {
                    continue;
                }
                let via = cluster.node_next_hop(other_index).unwrap();
                let route = format!("{} via {via} ", other.pod_cidr);
                assert!(routes.contains(&route), "{label}");
            }
            for view in &views {
                assert!(
                    rules.contains(&format!("from {view} lookup 1880")),
                    "{label}"
                );
            }
        } else {
            for view in &views {
                assert!(
                    routes.contains(&format!("{view} via {gateway} ")),
                    "{label}"
                );
                assert!(rules.contains(&format!("to {view} lookup 1880")), "{label}");
            }
        }
    }
}

fn has_link(ns: &str, link: &str) -> bool {
    named::exec(ns, &["ip", "link", "show", link]).is_ok()
}

#[test]
fn pods_off_the_gateway_node_reach_the_peer_before_and_after_the_gateway_moves() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !require_root("lab_multinode") {
        return;
    }
    let started = Instant::now();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("lab");
    let _down = lab::DownOnDrop(dir.clone());
    let options = LabOptions {
        topology: Topology::from_yaml(MULTINODE_YAML).unwrap(),
        prefix: PREFIX.to_owned(),
        state_dir: dir.clone(),
        gateway_binary: bin_path("kubetun-gateway"),
        iperf_seconds: 0,
        apiserver: false,
    };

    let mut out = Vec::new();
    let result = lab::up(&options, &mut out);
    print!("{}", String::from_utf8_lossy(&out));
    let report = result.expect("lab up");
    let failures: Vec<_> = report.failures().collect();
    assert!(failures.is_empty(), "failed checks: {failures:#?}");
    for kind in ["tcp ", "route agent table"] {
        assert!(
            report
                .checks
                .iter()
                .any(|c| c.description.starts_with(kind)),
            "`up` ran a {kind:?} check"
        );
    }

    let (paris, berlin) = load(&dir);
    assert_eq!(paris.pod_cidr, berlin.pod_cidr, "the pod CIDRs overlap");
    assert_eq!(paris.external_cidr, berlin.external_cidr);
    assert_eq!((paris.nodes.len(), berlin.nodes.len()), (3, 2));
    assert_eq!(
        (paris.node_hop, berlin.node_hop),
        (NodeHop::Direct, NodeHop::Overlay)
    );
    assert_eq!(paris.gateway_node, 0, "the gateway starts on node1");
    assert!(has_link(&paris.nodes[0].namespace, &paris.interface));
    assert_agent_routes(&paris);
    assert_agent_routes(&berlin);
    assert_cross_cluster(&paris, &berlin, "before the move");

    let old_pid = paris.pid.expect("pid");
    let mut out = Vec::new();
    let result = lab::move_gateway(&dir, "Paris", 1, &mut out);
    print!("{}", String::from_utf8_lossy(&out));
    let checks = result.expect("move the gateway");
    let failed: Vec<_> = checks.iter().filter(|c| !c.passed).collect();
    assert!(
        failed.is_empty(),
        "failed checks after the move: {failed:#?}"
    );

    let (paris, berlin_after) = load(&dir);
    assert_eq!(berlin_after, berlin, "nothing about the peer changed");
    assert_eq!(paris.gateway_node, 1);
    assert_eq!(paris.namespace, paris.nodes[1].namespace);
    let new_pid = paris.pid.expect("pid");
    assert_ne!(new_pid, old_pid);
    assert!(!runs_gateway(old_pid), "the old gateway process is gone");
    assert!(runs_gateway(new_pid), "the new gateway runs");
    let (old_node, new_node) = (&paris.nodes[0].namespace, &paris.nodes[1].namespace);
    assert!(
        !has_link(old_node, &paris.interface),
        "old node lost the TUN"
    );
    assert!(!has_link(old_node, "ul0"), "old node lost the underlay");
    assert!(has_link(new_node, &paris.interface), "new node has the TUN");
    assert!(has_link(new_node, "ul0"), "new node has the underlay");
    assert_agent_routes(&paris);
    // node1's pod is now behind a member node, node3's still is: both are checked.
    let off: Vec<Ipv4Addr> = off_gateway(&paris).iter().map(|m| m.address).collect();
    assert!(off.contains(&paris.nodes[0].pods[0].address), "{off:?}");
    assert_cross_cluster(&paris, &berlin, "after the move");

    // Berlin's gateway moves too: its VXLAN overlay is rebuilt around the new gateway's node.
    let mut out = Vec::new();
    let result = lab::move_gateway(&dir, "berlin", 1, &mut out);
    print!("{}", String::from_utf8_lossy(&out));
    let checks = result.expect("move Berlin's gateway");
    let failed: Vec<_> = checks.iter().filter(|c| !c.passed).collect();
    assert!(
        failed.is_empty(),
        "failed checks after Berlin's move: {failed:#?}"
    );
    let (paris, berlin) = load(&dir);
    assert_eq!(berlin.gateway_node, 1);
    assert!(!has_link(&berlin.nodes[0].namespace, &berlin.interface));
    assert!(has_link(&berlin.nodes[1].namespace, &berlin.interface));
    assert_agent_routes(&berlin);
    assert_cross_cluster(&paris, &berlin, "after both moves");
    let berlin_pid = berlin.pid.expect("pid");

    lab::down(&dir, &mut std::io::sink()).expect("down");
    assert_eq!(namespaces_with_prefix(PREFIX), Vec::<String>::new());
    for pid in [new_pid, berlin_pid] {
        assert!(!runs_gateway(pid), "gateway {pid} stopped");
    }
    println!("lab_multinode took {:?}", started.elapsed());
}
