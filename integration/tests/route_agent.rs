//! The route agent against real kernels: three "nodes" (namespaces) on one L2 segment (a bridge
//! namespace), a pod behind each member node and a remote "cluster" behind the gateway node
//! (plain routing stands in for the tunnel). The agent logic runs in-process in each node's
//! namespace, fed TunnelEndpoint specs directly.
//!
//! Shown for both attachments (direct next hop and VXLAN overlay), with strict reverse-path
//! filtering everywhere so asymmetric paths would drop: pods behind member nodes reach the
//! remote view; a second pass changes nothing; state left by a previous run is repaired; after
//! the gateway moves to another node traffic still flows; cleanup leaves nothing tagged while
//! foreign routes and rules in the same table and priority survive.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use kubetun_controller::agent::diff::Change;
use kubetun_controller::agent::netlink::Kernel;
use kubetun_controller::agent::plan::{AgentSettings, Attachment, Node, PlanInput, plan};
use kubetun_controller::agent::{cleanup, converge};
use kubetun_crds::{CidrMapping, ClusterRef, TunnelEndpointSpec};
use kubetun_integration::netns::{self, Netns};

const REMOTE_VIEW: &str = "10.201.0.0/16";
const REMOTE_HOST: &str = "10.201.0.1";
const PING_TIMEOUT: Duration = Duration::from_secs(5);

struct Lab {
    _l2: Netns,
    gw: Netns,
    a: Netns,
    b: Netns,
    pod_a: Netns,
    pod_b: Netns,
    remote: Netns,
    nodes: Vec<Node>,
}

impl Lab {
    fn node(&self, name: &str) -> (&Netns, &Node) {
        let ns = match name {
            "gw" => &self.gw,
            "a" => &self.a,
            _ => &self.b,
        };
        (ns, self.nodes.iter().find(|n| n.name == name).unwrap())
    }
}

fn node(name: &str, ip: &str, pods: &str) -> Node {
    Node {
        name: name.to_owned(),
        ip: ip.parse().unwrap(),
        pod_cidrs: vec![pods.parse().unwrap()],
    }
}

fn build(prefix: &str) -> Lab {
    let ns = |n: &str| Netns::new(&format!("{prefix}-{n}")).unwrap();
    let l2 = ns("l2");
    l2.exec(&["ip", "link", "add", "br0", "type", "bridge"])
        .unwrap();
    l2.exec(&["ip", "link", "set", "br0", "up"]).unwrap();
    let nodes = vec![
        node("gw", "192.168.77.10", "10.0.0.0/24"),
        node("a", "192.168.77.11", "10.0.1.0/24"),
        node("b", "192.168.77.12", "10.0.2.0/24"),
    ];
    let (gw, a, b) = (ns("gw"), ns("a"), ns("b"));
    for (host, spec) in [&gw, &a, &b].into_iter().zip(&nodes) {
        let port = format!("port-{}", spec.name);
        netns::veth(host, "eth0", &l2, &port).unwrap();
        l2.exec(&["ip", "link", "set", &port, "master", "br0"])
            .unwrap();
        host.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", spec.ip),
            "dev",
            "eth0",
        ])
        .unwrap();
        for sysctl in [
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=1",
            "net.ipv4.conf.default.rp_filter=1",
            "net.ipv4.conf.eth0.rp_filter=1",
        ] {
            host.exec(&["sysctl", "-q", "-w", sysctl]).unwrap();
        }
    }
    let pod = |host: &Netns, name: &str, pods: &str| {
        let pod = ns(name);
        netns::veth(&pod, "eth0", host, "pod0").unwrap();
        host.exec(&["ip", "addr", "add", &format!("{pods}.1/24"), "dev", "pod0"])
            .unwrap();
        pod.exec(&["ip", "addr", "add", &format!("{pods}.2/24"), "dev", "eth0"])
            .unwrap();
        pod.exec(&["ip", "route", "add", "default", "via", &format!("{pods}.1")])
            .unwrap();
        pod
    };
    let pod_a = pod(&a, "pa", "10.0.1");
    let pod_b = pod(&b, "pb", "10.0.2");

    // The remote cluster hangs off both gw and b, standing in for the tunnel of whichever
    // node runs the gateway.
    let remote = ns("rem");
    remote
        .exec(&[
            "ip",
            "addr",
            "add",
            &format!("{REMOTE_HOST}/32"),
            "dev",
            "lo",
        ])
        .unwrap();
    for (host, link, subnet) in [(&gw, "gw0", "169.254.50"), (&b, "b0", "169.254.51")] {
        netns::veth(host, "rem0", &remote, link).unwrap();
        host.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{subnet}.1/30"),
            "dev",
            "rem0",
        ])
        .unwrap();
        remote
            .exec(&["ip", "addr", "add", &format!("{subnet}.2/30"), "dev", link])
            .unwrap();
    }
    Lab {
        _l2: l2,
        gw,
        a,
        b,
        pod_a,
        pod_b,
        remote,
        nodes,
    }
}

/// Makes `node` the one whose "gateway" carries the remote view, as a gateway pod would.
fn host_gateway(lab: &Lab, node: &str) {
    let (old, new, subnet) = match node {
        "gw" => (&lab.b, &lab.gw, "169.254.50"),
        _ => (&lab.gw, &lab.b, "169.254.51"),
    };
    let _ = old.exec(&["ip", "route", "del", REMOTE_VIEW]);
    new.exec(&[
        "ip",
        "route",
        "replace",
        REMOTE_VIEW,
        "via",
        &format!("{subnet}.2"),
    ])
    .unwrap();
    lab.remote
        .exec(&[
            "ip",
            "route",
            "replace",
            "default",
            "via",
            &format!("{subnet}.1"),
        ])
        .unwrap();
}

fn endpoints(views: &[&str]) -> Vec<TunnelEndpointSpec> {
    views
        .iter()
        .enumerate()
        .map(|(i, view)| TunnelEndpointSpec {
            cluster: ClusterRef {
                id: format!("remote-{i}"),
                name: format!("remote-{i}"),
            },
            remote_pod_cidrs: vec![CidrMapping {
                real: "10.70.0.0/16".to_owned(),
                view: (*view).to_owned(),
            }],
            ..TunnelEndpointSpec::default()
        })
        .collect()
}

fn in_namespace<T: Send>(ns: &Netns, work: impl AsyncFnOnce(Kernel) -> T + Send) -> T {
    netns::run_in(ns, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let kernel = Kernel::connect(AgentSettings::default()).unwrap();
            work(kernel).await
        })
    })
    .unwrap()
}

/// One agent pass on `node` with the gateway on `gateway`; returns the applied changes.
fn agent_pass(
    lab: &Lab,
    node: &str,
    gateway: &str,
    attachment: Attachment,
    endpoints: &[TunnelEndpointSpec],
) -> Vec<Change> {
    let (ns, local) = lab.node(node);
    let gateway_ip: IpAddr = lab.node(gateway).1.ip;
    let nodes = lab.nodes.clone();
    in_namespace(ns, async move |kernel: Kernel| {
        let underlay_mtu = kernel.underlay(local.ip).await.unwrap().mtu;
        let desired = plan(&PlanInput {
            settings: kernel.settings(),
            attachment,
            local,
            underlay_mtu,
            gateway_ip,
            gateway_pod_ip: None,
            nodes: &nodes,
            endpoints,
        })
        .unwrap();
        converge(&kernel, &desired).await.unwrap()
    })
}

fn all_agents(lab: &Lab, gateway: &str, attachment: Attachment, endpoints: &[TunnelEndpointSpec]) {
    for node in ["gw", "a", "b"] {
        agent_pass(lab, node, gateway, attachment, endpoints);
    }
}

fn tagged(ns: &Netns) -> bool {
    !in_namespace(ns, async |kernel: Kernel| {
        kernel.observe().await.unwrap().is_empty()
    })
}

fn scenario(prefix: &str, attachment: Attachment) {
    let lab = build(prefix);
    let eps = endpoints(&[REMOTE_VIEW]);
    host_gateway(&lab, "gw");
    assert!(
        !lab.pod_a.ping(REMOTE_HOST, 1),
        "without the agent only the gateway node routes the view"
    );

    all_agents(&lab, "gw", attachment, &eps);
    assert!(
        lab.pod_a.wait_ping(REMOTE_HOST, PING_TIMEOUT),
        "pod behind a"
    );
    assert!(
        lab.pod_b.wait_ping(REMOTE_HOST, PING_TIMEOUT),
        "pod behind b"
    );

    let routes = lab
        .a
        .exec(&["ip", "route", "show", "table", "1880"])
        .unwrap();
    assert!(routes.contains("10.201.0.0/16"), "{routes}");
    assert!(routes.contains("proto 183"), "{routes}");
    assert!(
        routes.contains("mtu 1420") && routes.contains("advmss 1380"),
        "{routes}"
    );
    let rules = lab.a.exec(&["ip", "rule", "show"]).unwrap();
    assert!(
        rules.contains("1880:\tfrom all to 10.201.0.0/16 lookup 1880"),
        "{rules}"
    );
    let rules = lab.gw.exec(&["ip", "rule", "show"]).unwrap();
    assert!(
        rules.contains("1880:\tfrom 10.201.0.0/16 lookup 1880"),
        "{rules}"
    );

    for node in ["gw", "a", "b"] {
        assert_eq!(
            agent_pass(&lab, node, "gw", attachment, &eps),
            vec![],
            "{node} is idempotent"
        );
    }

    // A previous run left a view that is gone now, next to foreign state in our table and at
    // our priority: a restarted agent removes only its own leftovers.
    agent_pass(
        &lab,
        "a",
        "gw",
        attachment,
        &endpoints(&[REMOTE_VIEW, "10.202.0.0/16"]),
    );
    lab.a
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
    lab.a
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
    let repaired = agent_pass(&lab, "a", "gw", attachment, &eps);
    let stale: IpNet = "10.202.0.0/16".parse().unwrap();
    assert!(
        repaired.iter().any(|c| matches!(c, Change::DeleteRule(r) if *r == kubetun_controller::agent::plan::RuleSelector::To(stale))),
        "{repaired:?}"
    );
    assert_eq!(repaired.len(), 2, "{repaired:?}");
    assert!(
        lab.pod_a.wait_ping(REMOTE_HOST, PING_TIMEOUT),
        "after the repair"
    );

    host_gateway(&lab, "b");
    all_agents(&lab, "b", attachment, &eps);
    assert!(
        lab.pod_a.wait_ping(REMOTE_HOST, PING_TIMEOUT),
        "pod behind a, gateway on b"
    );
    assert!(
        lab.pod_b.wait_ping(REMOTE_HOST, PING_TIMEOUT),
        "pod behind b, now the gateway node"
    );
    let rules = lab.gw.exec(&["ip", "rule", "show"]).unwrap();
    assert!(
        rules.contains("to 10.201.0.0/16 lookup 1880"),
        "old gateway node is a member: {rules}"
    );

    for ns in [&lab.gw, &lab.a, &lab.b] {
        let removed = in_namespace(ns, async |kernel: Kernel| cleanup(&kernel).await.unwrap());
        assert!(!removed.is_empty());
        assert!(!tagged(ns), "{} still holds tagged state", ns.name());
        assert!(!ns.succeeds(&["ip", "link", "show", "kubetun.vxlan"]));
    }
    assert!(!lab.pod_a.ping(REMOTE_HOST, 1), "cleanup removed the path");
    let foreign_routes = lab
        .a
        .exec(&["ip", "route", "show", "table", "1880"])
        .unwrap();
    assert_eq!(
        foreign_routes.trim(),
        "10.99.0.0/16 via 192.168.77.10 dev eth0",
        "foreign route kept"
    );
    let foreign_rules = lab
        .a
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
    if !netns::require_root("route agent, direct attachment") {
        return;
    }
    scenario("rad", Attachment::Direct);
}

#[test]
fn overlay_routes_follow_the_gateway_and_clean_up() {
    if !netns::require_root("route agent, VXLAN overlay") {
        return;
    }
    scenario("rao", Attachment::Overlay);
}
