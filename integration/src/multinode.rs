//! A cluster with several nodes, as network namespaces, for the route agent: nodes on one L2
//! segment (a bridge namespace), a "pod" behind every node, and a remote "cluster" wired to
//! every node so that any node can play the gateway's node (plain routing stands in for the
//! tunnel). The agent logic runs in-process in each node's namespace ([`converge_node`], which
//! the lab's multi-node clusters use too).
//!
//! Addressing: node `i` is `192.168.77.(10+i)/24` on `eth0` with pod CIDR `10.0.i.0/24` (its
//! pod is `10.0.i.2`, the node side `10.0.i.1`); the remote cluster holds [`REMOTE_HOST`] in
//! [`REMOTE_VIEW`] and reaches node `i` over `169.254.(50+i).0/30`, a link with the tunnel's
//! MTU.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};

use kubetun_agent::diff::{Change, ObservedState};
use kubetun_agent::netlink::{Kernel, NetlinkError};
use kubetun_agent::plan::{AgentSettings, Attachment, Node, PlanInput, RoutePlanError, plan};
use kubetun_agent::{cleanup, converge};
use kubetun_crds::{CidrMapping, ClusterRef, TunnelEndpointSpec};

use crate::lab::named;
use crate::netns::{self, Netns, NetnsError};

/// The remote cluster's view CIDR, as this cluster sees it.
pub const REMOTE_VIEW: &str = "10.201.0.0/16";
/// An address inside [`REMOTE_VIEW`] that answers (ping, iperf3).
pub const REMOTE_HOST: &str = "10.201.0.1";
/// MTU of the links to the remote cluster, as the tunnel's (WireGuard's default).
pub const TUNNEL_MTU: &str = "1420";

/// Why the multi-node cluster could not be built or driven.
#[derive(Debug, thiserror::Error)]
pub enum MultiNodeError {
    /// A namespace command failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// Entering a namespace or starting a runtime failed.
    #[error("entering a namespace: {0}")]
    Enter(#[from] std::io::Error),
    /// The agent's kernel access failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The agent could not plan.
    #[error(transparent)]
    Plan(#[from] RoutePlanError),
}

/// One node: its namespace, its facts as the agent sees them, and the pod behind it.
#[derive(Debug)]
pub struct LabNode {
    /// The node's namespace (its host network).
    pub netns: Netns,
    /// Name, underlay IP and pod CIDR.
    pub facts: Node,
    /// A pod namespace behind the node.
    pub pod: Netns,
    /// The pod's address.
    pub pod_address: Ipv4Addr,
}

/// The nodes, the L2 segment between them and the remote cluster.
#[derive(Debug)]
pub struct MultiNodeCluster {
    nodes: Vec<LabNode>,
    remote: Netns,
    _l2: Netns,
}

impl MultiNodeCluster {
    /// Builds `count` nodes named `<prefix>-n<i>` (namespaces are removed on drop). Every node
    /// forwards and filters reverse paths strictly, so an asymmetric path would drop.
    pub fn build(prefix: &str, count: u8) -> Result<Self, MultiNodeError> {
        let l2 = Netns::new(&format!("{prefix}-l2"))?;
        l2.exec(&["ip", "link", "add", "br0", "type", "bridge"])?;
        l2.exec(&["ip", "link", "set", "br0", "up"])?;
        let remote = Netns::new(&format!("{prefix}-rem"))?;
        remote.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{REMOTE_HOST}/32"),
            "dev",
            "lo",
        ])?;

        let mut nodes = Vec::new();
        for i in 0..count {
            let name = format!("n{i}");
            let host = Netns::new(&format!("{prefix}-{name}"))?;
            let port = format!("port-{name}");
            netns::veth(&host, "eth0", &l2, &port)?;
            l2.exec(&["ip", "link", "set", &port, "master", "br0"])?;
            let ip = Ipv4Addr::new(192, 168, 77, 10 + i);
            host.exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            for sysctl in [
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.rp_filter=1",
                "net.ipv4.conf.default.rp_filter=1",
                "net.ipv4.conf.eth0.rp_filter=1",
            ] {
                host.exec(&["sysctl", "-q", "-w", sysctl])?;
            }

            let pod = Netns::new(&format!("{prefix}-p{i}"))?;
            netns::veth(&pod, "eth0", &host, "pod0")?;
            host.exec(&[
                "ip",
                "addr",
                "add",
                &format!("10.0.{i}.1/24"),
                "dev",
                "pod0",
            ])?;
            let pod_address = Ipv4Addr::new(10, 0, i, 2);
            pod.exec(&[
                "ip",
                "addr",
                "add",
                &format!("{pod_address}/24"),
                "dev",
                "eth0",
            ])?;
            pod.exec(&[
                "ip",
                "route",
                "add",
                "default",
                "via",
                &format!("10.0.{i}.1"),
            ])?;

            let remote_if = format!("n{i}");
            netns::veth(&host, "rem0", &remote, &remote_if)?;
            // The stand-in for the tunnel has the tunnel's MTU.
            host.exec(&["ip", "link", "set", "rem0", "mtu", TUNNEL_MTU])?;
            remote.exec(&["ip", "link", "set", &remote_if, "mtu", TUNNEL_MTU])?;
            let link = 50 + u16::from(i);
            host.exec(&[
                "ip",
                "addr",
                "add",
                &format!("169.254.{link}.1/30"),
                "dev",
                "rem0",
            ])?;
            remote.exec(&[
                "ip",
                "addr",
                "add",
                &format!("169.254.{link}.2/30"),
                "dev",
                &remote_if,
            ])?;

            nodes.push(LabNode {
                netns: host,
                facts: Node {
                    name,
                    ip: IpAddr::V4(ip),
                    pod_cidrs: vec![IpNet::V4(Ipv4Net::new_assert(
                        Ipv4Addr::new(10, 0, i, 0),
                        24,
                    ))],
                },
                pod,
                pod_address,
            });
        }
        Ok(Self {
            nodes,
            remote,
            _l2: l2,
        })
    }

    /// The nodes, in index order.
    pub fn nodes(&self) -> &[LabNode] {
        &self.nodes
    }

    /// The remote cluster's namespace.
    pub fn remote(&self) -> &Netns {
        &self.remote
    }

    /// Every node's facts, as the agent reads them from the Node objects.
    pub fn node_facts(&self) -> Vec<Node> {
        self.nodes.iter().map(|n| n.facts.clone()).collect()
    }

    /// Makes node `gateway` the one whose "gateway" carries the remote view (what a
    /// host-network gateway pod does with its TUN routes), and points the remote's replies at it.
    pub fn host_gateway(&self, gateway: usize) -> Result<(), MultiNodeError> {
        for (i, node) in self.nodes.iter().enumerate() {
            if i != gateway {
                let _ = node.netns.exec(&["ip", "route", "del", REMOTE_VIEW]);
            }
        }
        let link = 50 + gateway;
        self.nodes[gateway].netns.exec(&[
            "ip",
            "route",
            "replace",
            REMOTE_VIEW,
            "via",
            &format!("169.254.{link}.2"),
        ])?;
        self.remote.exec(&[
            "ip",
            "route",
            "replace",
            "default",
            "via",
            &format!("169.254.{link}.1"),
        ])?;
        Ok(())
    }

    /// One agent pass on node `index` with the gateway on node `gateway`; the applied changes.
    pub fn agent_pass(
        &self,
        index: usize,
        gateway: usize,
        attachment: Attachment,
        endpoints: &[TunnelEndpointSpec],
    ) -> Result<Vec<Change>, MultiNodeError> {
        converge_node(
            self.nodes[index].netns.name(),
            &self.nodes[index].facts,
            &self.node_facts(),
            self.nodes[gateway].facts.ip,
            attachment,
            endpoints,
        )
    }

    /// Agent passes on every node with the gateway on node `gateway`.
    pub fn agent_pass_all(
        &self,
        gateway: usize,
        attachment: Attachment,
        endpoints: &[TunnelEndpointSpec],
    ) -> Result<(), MultiNodeError> {
        for index in 0..self.nodes.len() {
            self.agent_pass(index, gateway, attachment, endpoints)?;
        }
        Ok(())
    }

    /// `agent --cleanup` on node `index`; what it removed.
    pub fn agent_cleanup(&self, index: usize) -> Result<Vec<Change>, MultiNodeError> {
        in_namespace(self.nodes[index].netns.name(), async |kernel: Kernel| {
            Ok(cleanup(&kernel).await?)
        })
    }

    /// The agent's tagged state on node `index`.
    pub fn agent_state(&self, index: usize) -> Result<ObservedState, MultiNodeError> {
        observe_node(self.nodes[index].netns.name())
    }
}

/// TunnelEndpoint specs with one remote pod CIDR each, seen as `views`.
pub fn remote_endpoints(views: &[&str]) -> Vec<TunnelEndpointSpec> {
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

/// One agent pass (plan, then converge) in the namespace named `ns`, the host network of node
/// `local`, with the gateway on the node at `gateway_ip`; the applied changes.
pub fn converge_node(
    ns: &str,
    local: &Node,
    nodes: &[Node],
    gateway_ip: IpAddr,
    attachment: Attachment,
    endpoints: &[TunnelEndpointSpec],
) -> Result<Vec<Change>, MultiNodeError> {
    in_namespace(ns, async move |kernel: Kernel| {
        let underlay_mtu = kernel.underlay(local.ip).await?.mtu;
        let desired = plan(&PlanInput {
            settings: kernel.settings(),
            attachment,
            local,
            underlay_mtu,
            gateway_ip,
            gateway_pod_ip: None,
            nodes,
            endpoints,
        })?;
        Ok(converge(&kernel, &desired).await?)
    })
}

/// The agent's tagged state in the namespace named `ns`.
pub fn observe_node(ns: &str) -> Result<ObservedState, MultiNodeError> {
    in_namespace(ns, async |kernel: Kernel| Ok(kernel.observe().await?))
}

/// Runs `work` with an agent kernel handle inside the namespace named `ns`.
fn in_namespace<T: Send>(
    ns: &str,
    work: impl AsyncFnOnce(Kernel) -> Result<T, MultiNodeError> + Send,
) -> Result<T, MultiNodeError> {
    named::run_in(ns, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let kernel = Kernel::connect(AgentSettings::default())?;
            work(kernel).await
        })
    })?
}
