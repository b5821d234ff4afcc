//! The route agent against real kernels: three "nodes" (namespaces) on one L2 segment (a bridge
//! namespace), a pod behind each node and a remote "cluster" reachable through whichever node
//! hosts the gateway (plain routing stands in for the tunnel). The agent logic runs in-process
//! in each node's namespace, fed TunnelEndpoint specs directly.
//!
//! Shown for both attachments (direct next hop and VXLAN overlay), with strict reverse-path
//! filtering everywhere so asymmetric paths would drop: pods behind member nodes reach the
//! remote view; a second pass changes nothing; state left by a previous run is repaired; after
//! the gateway moves to another node traffic still flows; cleanup leaves nothing tagged while
//! foreign routes and rules in the same table and priority survive.

use std::time::Duration;

use ipnet::IpNet;
use kubetun_agent::diff::Change;
use kubetun_agent::plan::{Attachment, RuleSelector};
use kubetun_integration::multinode::{
    MultiNodeCluster, REMOTE_HOST, REMOTE_VIEW, remote_endpoints,
};
use kubetun_integration::netns;

const PING_TIMEOUT: Duration = Duration::from_secs(5);
const GW: usize = 0;
const A: usize = 1;
const B: usize = 2;

fn scenario(prefix: &str, attachment: Attachment) {
    let cluster = MultiNodeCluster::build(prefix, 3).unwrap();
    let nodes = cluster.nodes();
    let (pod_a, pod_b) = (&nodes[A].pod, &nodes[B].pod);
    let eps = remote_endpoints(&[REMOTE_VIEW]);
    cluster.host_gateway(GW).unwrap();
    assert!(
        !pod_a.ping(REMOTE_HOST, 1),
        "without the agent only the gateway node routes the view"
    );

    cluster.agent_pass_all(GW, attachment, &eps).unwrap();
    assert!(pod_a.wait_ping(REMOTE_HOST, PING_TIMEOUT), "pod behind a");
    assert!(pod_b.wait_ping(REMOTE_HOST, PING_TIMEOUT), "pod behind b");

    let node_a = &nodes[A].netns;
    let routes = node_a
        .exec(&["ip", "route", "show", "table", "1880"])
        .unwrap();
    assert!(routes.contains(REMOTE_VIEW), "{routes}");
    assert!(routes.contains("proto 183"), "{routes}");
    assert!(
        routes.contains("mtu 1420") && routes.contains("advmss 1380"),
        "{routes}"
    );
    let rules = node_a.exec(&["ip", "rule", "show"]).unwrap();
    assert!(
        rules.contains("1880:\tfrom all to 10.201.0.0/16 lookup 1880"),
        "{rules}"
    );
    let rules = nodes[GW].netns.exec(&["ip", "rule", "show"]).unwrap();
    assert!(
        rules.contains("1880:\tfrom 10.201.0.0/16 lookup 1880"),
        "{rules}"
    );

    for index in [GW, A, B] {
        assert_eq!(
            cluster.agent_pass(index, GW, attachment, &eps).unwrap(),
            vec![],
            "node {index} is idempotent"
        );
    }

    // A previous run left a view that is gone now, next to foreign state in our table and at
    // our priority: a restarted agent removes only its own leftovers.
    cluster
        .agent_pass(
            A,
            GW,
            attachment,
            &remote_endpoints(&[REMOTE_VIEW, "10.202.0.0/16"]),
        )
        .unwrap();
    node_a
        .exec(&[
            "ip",
            "route",
            "add",
            "10.99.0.0/16",
            "via",
            "192.168.77.10",
            "table",
            "1880",
        ])
        .unwrap();
    node_a
        .exec(&[
            "ip",
            "rule",
            "add",
            "to",
            "10.98.0.0/16",
            "lookup",
            "1880",
            "priority",
            "1880",
        ])
        .unwrap();
    let repaired = cluster.agent_pass(A, GW, attachment, &eps).unwrap();
    let stale: IpNet = "10.202.0.0/16".parse().unwrap();
    assert_eq!(repaired.len(), 2, "{repaired:?}");
    assert!(
        repaired.contains(&Change::DeleteRule(RuleSelector::To(stale))),
        "{repaired:?}"
    );
    assert!(
        pod_a.wait_ping(REMOTE_HOST, PING_TIMEOUT),
        "after the repair"
    );

    cluster.host_gateway(B).unwrap();
    cluster.agent_pass_all(B, attachment, &eps).unwrap();
    assert!(
        pod_a.wait_ping(REMOTE_HOST, PING_TIMEOUT),
        "pod behind a, gateway on b"
    );
    assert!(
        pod_b.wait_ping(REMOTE_HOST, PING_TIMEOUT),
        "pod behind b, now the gateway node"
    );
    assert!(
        nodes[GW].pod.wait_ping(REMOTE_HOST, PING_TIMEOUT),
        "pod behind the old gateway node"
    );
    let rules = nodes[GW].netns.exec(&["ip", "rule", "show"]).unwrap();
    assert!(
        rules.contains("to 10.201.0.0/16 lookup 1880"),
        "old gateway node is a member: {rules}"
    );

    for index in [GW, A, B] {
        assert!(!cluster.agent_cleanup(index).unwrap().is_empty());
        assert!(
            cluster.agent_state(index).unwrap().is_empty(),
            "node {index}"
        );
        let ns = &nodes[index].netns;
        assert!(!ns.succeeds(&["ip", "link", "show", "kubetun.vxlan"]));
    }
    assert!(!pod_a.ping(REMOTE_HOST, 1), "cleanup removed the path");
    let foreign_routes = node_a
        .exec(&["ip", "route", "show", "table", "1880"])
        .unwrap();
    assert_eq!(
        foreign_routes.trim(),
        "10.99.0.0/16 via 192.168.77.10 dev eth0",
        "foreign route kept"
    );
    let foreign_rules = node_a
        .exec(&["ip", "rule", "show", "priority", "1880"])
        .unwrap();
    assert_eq!(
        foreign_rules.trim(),
        "1880:\tfrom all to 10.98.0.0/16 lookup 1880",
        "foreign rule kept"
    );
}

#[test]
fn direct_routes_follow_the_gateway_and_clean_up() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !netns::require_root("route agent, direct attachment") {
        return;
    }
    scenario("rad", Attachment::Direct);
}

#[test]
fn overlay_routes_follow_the_gateway_and_clean_up() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !netns::require_root("route agent, VXLAN overlay") {
        return;
    }
    scenario("rao", Attachment::Overlay);
}
