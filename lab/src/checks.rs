//! Connectivity checks across remapped addresses: a pod (or external endpoint) of one cluster
//! reaches its counterpart in a peer at the address its own cluster uses for it (the view),
//! by ping and by a short bounded iperf3 run whose server must see the client at the address
//! the *server's* cluster uses for it.
//!
//! Multi-node clusters add: pods behind nodes other than the gateway's reach the peer's pods
//! (ping, and a TCP exchange whose server must see the client at its view), and the route
//! agent's table holds every remote view on every node.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use ipnet::Ipv4Net;
use kubetun_crds::CidrMapping;
use serde::Serialize;

use crate::fabric::Fabric;
use crate::named;
use crate::state::{ClusterState, Member};
use crate::topology::translate;
use kubetun_testenv::iperf::{self, ClientSpec, Mode};
use kubetun_testenv::netns;

/// How long the first packet of a path may take (it waits for a handshake).
const FIRST_CONTACT: Duration = Duration::from_secs(10);
/// Echo requests per ping check once the path answered.
const PINGS: u32 = 3;
/// TCP port of the TCP exchange checks.
const TCP_PORT: u16 = 5180;
/// A UDP port nothing in the lab listens on (discard).
const CLOSED_PORT: u16 = 9;
/// Why a check between two clusters could not start.
const NO_ROUTE: &str = "no route between the two clusters";
/// The route agent's routing table.
const AGENT_TABLE: &str = "1880";

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// Which step of `up` ran it (`links`, `shortcuts`).
    pub phase: String,
    /// What was checked.
    pub description: String,
    /// Whether it passed.
    pub passed: bool,
    /// Measurements or the failure reason.
    pub detail: String,
}

impl Check {
    /// A check of `phase` that passed with the detail of `Ok` or failed with that of `Err`.
    pub fn new(phase: &str, description: String, outcome: Result<String, String>) -> Check {
        let (passed, detail) = match outcome {
            Ok(detail) => (true, detail),
            Err(detail) => (false, detail),
        };
        Check {
            phase: phase.to_owned(),
            description,
            passed,
            detail,
        }
    }
}

/// Pods or external endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Pod namespaces (pod CIDR).
    Pod,
    /// External-endpoint namespaces (external CIDR).
    External,
}

impl Kind {
    /// The cluster's pods or external endpoints.
    fn members(self, cluster: &ClusterState) -> &[Member] {
        match self {
            Self::Pod => &cluster.pods,
            Self::External => &cluster.externals,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Pod => "pod",
            Self::External => "ext",
        }
    }
}

/// The address at which `from` reaches `addr` of cluster `to`: `addr` translated into the
/// view `from` uses for the CIDR of `to` that contains it.
pub fn reach_address(from: &ClusterState, to: &ClusterState, addr: Ipv4Addr) -> Option<Ipv4Addr> {
    let endpoint = from
        .tunnel_endpoints
        .iter()
        .find(|te| te.cluster.id == to.id)?;
    endpoint
        .remote_pod_cidrs
        .iter()
        .chain(&endpoint.remote_external_cidrs)
        .find_map(|mapping| view_for(mapping, addr))
}

fn view_for(mapping: &CidrMapping, addr: Ipv4Addr) -> Option<Ipv4Addr> {
    let real: Ipv4Net = mapping.real.parse().ok()?;
    let view: Ipv4Net = mapping.view.parse().ok()?;
    real.contains(&addr).then(|| translate(addr, view))
}

/// Pings, in both directions, from the first pod and the first external endpoint of each
/// cluster to their counterparts in the other.
pub fn ping_both_ways(phase: &str, a: &ClusterState, b: &ClusterState) -> Vec<Check> {
    let mut checks = Vec::new();
    for (from, to) in [(a, b), (b, a)] {
        for kind in [Kind::Pod, Kind::External] {
            checks.extend(Ends::first(kind, from, to).map(|ends| ping(phase, ends)));
        }
    }
    checks
}

/// The pod a check uses in `cluster`: the first one behind a node other than the gateway's
/// when the cluster has several nodes, else the first one.
pub fn off_gateway_pod(cluster: &ClusterState) -> Option<&Member> {
    cluster
        .pods_off_gateway()
        .next()
        .or_else(|| cluster.pods.first())
}

/// The pods [`off_gateway_pod`] picks in `from` and `to`.
fn off_gateway_ends<'a>(from: &'a ClusterState, to: &'a ClusterState) -> Option<Ends<'a>> {
    Some(Ends {
        kind: Kind::Pod,
        from,
        src: off_gateway_pod(from)?,
        to,
        dst: off_gateway_pod(to)?,
    })
}

/// ` (node2)` for a pod behind a node of a multi-node cluster, `*` marking the gateway's node;
/// empty otherwise.
fn node_suffix(cluster: &ClusterState, member: &Member) -> String {
    cluster
        .nodes
        .iter()
        .enumerate()
        .find(|(_, node)| node.pods.contains(member))
        .map_or_else(String::new, |(index, node)| {
            let mark = if index == cluster.gateway_node {
                "*"
            } else {
                ""
            };
            format!(" ({}{mark})", node.name)
        })
}

/// Pings, in both directions, between pods behind non-gateway nodes (when a side has several
/// nodes; its first pod otherwise). Empty when neither side has several nodes.
pub fn ping_off_gateway(phase: &str, a: &ClusterState, b: &ClusterState) -> Vec<Check> {
    if !a.is_multi_node() && !b.is_multi_node() {
        return Vec::new();
    }
    let mut checks = Vec::new();
    for (from, to) in [(a, b), (b, a)] {
        checks.extend(off_gateway_ends(from, to).map(|ends| ping(phase, ends)));
    }
    checks
}

/// TCP exchanges, in both directions, between the pods [`ping_off_gateway`] uses: the client
/// connects to the server's view and the server must see the client at the view the server's
/// cluster uses for it. Empty when neither side has several nodes.
pub fn tcp_off_gateway(phase: &str, a: &ClusterState, b: &ClusterState) -> Vec<Check> {
    if !a.is_multi_node() && !b.is_multi_node() {
        return Vec::new();
    }
    let mut checks = Vec::new();
    for (from, to) in [(a, b), (b, a)] {
        checks.extend(off_gateway_ends(from, to).map(|ends| tcp(phase, ends)));
    }
    checks
}

/// The two ends of a check: member `src` of `from` reaching member `dst` of `to` at the view
/// `from` uses for it.
#[derive(Debug, Clone, Copy)]
pub struct Ends<'a> {
    /// Pods or external endpoints.
    pub kind: Kind,
    pub from: &'a ClusterState,
    pub src: &'a Member,
    pub to: &'a ClusterState,
    pub dst: &'a Member,
}

impl<'a> Ends<'a> {
    /// The first `kind` member of `from` towards the first of `to`, if both have one.
    pub fn first(kind: Kind, from: &'a ClusterState, to: &'a ClusterState) -> Option<Self> {
        Some(Self {
            kind,
            from,
            src: kind.members(from).first()?,
            to,
            dst: kind.members(to).first()?,
        })
    }

    /// The address at which `src` reaches `dst` ([`reach_address`]).
    fn target(&self) -> Option<Ipv4Addr> {
        reach_address(self.from, self.to, self.dst.address)
    }

    /// `<what> Rome ext 10.70.0.11 -> Paris ext 10.70.0.11 at 10.205.0.11`, with the members'
    /// nodes in a multi-node cluster.
    fn describe(&self, what: &str, target: Option<Ipv4Addr>) -> String {
        let label = self.kind.label();
        format!(
            "{what} {} {label} {}{} -> {} {label} {}{} at {}",
            self.from.name,
            self.src.address,
            node_suffix(self.from, self.src),
            self.to.name,
            self.dst.address,
            node_suffix(self.to, self.dst),
            target.map_or_else(|| "?".to_owned(), |t| t.to_string())
        )
    }
}

/// One TCP exchange between `ends` at the target's view; the server must see the client at
/// the view its own cluster uses for it.
pub fn tcp(phase: &str, ends: Ends) -> Check {
    let target = ends.target();
    let expected = reach_address(ends.to, ends.from, ends.src.address);
    let description = ends.describe("tcp", target);
    let outcome = match (target, expected) {
        (Some(target), Some(expected)) => named::tcp_exchange(
            &ends.src.namespace,
            &ends.dst.namespace,
            ends.dst.address,
            target,
            TCP_PORT,
            FIRST_CONTACT,
        )
        .and_then(|seen| {
            if seen.ip() == std::net::IpAddr::V4(expected) {
                Ok(format!(
                    "echoed; the server saw the client as {}",
                    seen.ip()
                ))
            } else {
                Err(format!(
                    "the server saw the client as {}, expected {expected}",
                    seen.ip()
                ))
            }
        }),
        _ => Err(NO_ROUTE.to_owned()),
    };
    Check::new(phase, description, outcome)
}

/// A UDP datagram between `ends` to a closed port: the ICMP port-unreachable error must come
/// back and match the sender's socket, which needs the header it quotes translated on every
/// hop back.
pub fn port_unreachable(phase: &str, ends: Ends) -> Check {
    let target = ends.target();
    let description = ends.describe("icmp error", target) + " (udp to a closed port)";
    let outcome = match target {
        Some(target) => named::udp_refused(&ends.src.namespace, target, CLOSED_PORT, FIRST_CONTACT)
            .map(|took| {
                format!(
                    "port unreachable came back after {:.0} ms",
                    took.as_secs_f64() * 1000.0
                )
            }),
        None => Err(NO_ROUTE.to_owned()),
    };
    Check::new(phase, description, outcome)
}

/// Every node of a multi-node cluster holds a route in the agent's table for every remote
/// view; member nodes route them `via` the gateway's node.
pub fn agent_routes(phase: &str, cluster: &ClusterState) -> Check {
    let views = cluster.remote_views();
    let gateway = cluster.nodes.get(cluster.gateway_node);
    let mut problems = Vec::new();
    for (index, node) in cluster.nodes.iter().enumerate() {
        let routes = match netns::exec_in(
            &node.namespace,
            &["ip", "route", "show", "table", AGENT_TABLE, "proto", "183"],
        ) {
            Ok(routes) => routes,
            Err(e) => {
                problems.push(format!("{}: {e}", node.name));
                continue;
            }
        };
        if index == cluster.gateway_node {
            // The gateway's node routes the other nodes' pod slices for the return path.
            for (other_index, other) in cluster.nodes.iter().enumerate() {
                let via = cluster.node_next_hop(other_index);
                let route = via.map(|via| format!("{} via {via} ", other.pod_cidr));
                if other_index != index && !route.is_some_and(|r| routes.contains(&r)) {
                    problems.push(format!(
                        "{} lacks {} via {}",
                        node.name, other.pod_cidr, other.name
                    ));
                }
            }
            continue;
        }
        for view in &views {
            let via = cluster
                .gateway_next_hop()
                .map(|via| format!("{view} via {via} "));
            if !via.is_some_and(|via| routes.contains(&via)) {
                problems.push(format!("{} lacks {view} via the gateway's node", node.name));
            }
        }
    }
    Check {
        phase: phase.to_owned(),
        description: format!(
            "route agent table {AGENT_TABLE} on every node of {} (gateway on {})",
            cluster.name,
            gateway.map_or("?", |g| g.name.as_str())
        ),
        passed: problems.is_empty(),
        detail: if problems.is_empty() {
            format!(
                "{} nodes, {} remote views",
                cluster.nodes.len(),
                views.len()
            )
        } else {
            problems.join("; ")
        },
    }
}

/// Pings between `ends`: a first reply within [`FIRST_CONTACT`], then [`PINGS`] more.
fn ping(phase: &str, ends: Ends) -> Check {
    let Ends {
        from, dst, to, src, ..
    } = ends;
    let Some(target) = ends.target() else {
        let label = ends.kind.label();
        return Check::new(
            phase,
            format!("ping {} {label} -> {} {label}", from.name, to.name),
            Err(format!(
                "{} has no route to {} of {}",
                from.name, dst.address, to.name
            )),
        );
    };
    let description = ends.describe("ping", Some(target));
    let answered = named::wait_ping(&src.namespace, target, FIRST_CONTACT)
        && named::ping(&src.namespace, target, PINGS);
    let outcome = if answered {
        Ok("replies received".to_owned())
    } else {
        Err("no reply".to_owned())
    };
    Check::new(phase, description, outcome)
}

/// A bounded TCP iperf3 run between the first external endpoints of `from` and `to` (both in
/// overlapping external CIDRs): the client targets the view `from` uses, and the server must
/// see the client at the view `to` uses for `from`'s external CIDR.
pub fn iperf_external(
    fabric: &Fabric,
    phase: &str,
    from: &ClusterState,
    to: &ClusterState,
    seconds: u32,
    log_dir: &Path,
) -> Check {
    let (Some(src), Some(dst)) = (from.externals.first(), to.externals.first()) else {
        return Check {
            phase: phase.to_owned(),
            description: format!("iperf3 {} ext -> {} ext", from.name, to.name),
            passed: true,
            detail: "skipped: no external endpoints".to_owned(),
        };
    };
    let target = reach_address(from, to, dst.address);
    let expected_peer = reach_address(to, from, src.address);
    let description = format!(
        "iperf3 -t {seconds} {} ext {} -> {} ext {} at {}",
        from.name,
        src.address,
        to.name,
        dst.address,
        target.map_or_else(|| "?".to_owned(), |t| t.to_string())
    );
    let outcome = match (target, expected_peer) {
        (Some(target), Some(expected_peer)) => {
            run_iperf(fabric, src, dst, target, expected_peer, seconds, log_dir)
        }
        _ => Err("no route between the two clusters".to_owned()),
    };
    Check::new(phase, description, outcome)
}

/// File name of the iperf3 server report of a check whose server runs in `namespace`.
pub fn iperf_log_name(namespace: &str) -> String {
    format!("iperf3-{namespace}.json")
}

fn run_iperf(
    fabric: &Fabric,
    src: &Member,
    dst: &Member,
    target: Ipv4Addr,
    expected_peer: Ipv4Addr,
    seconds: u32,
    log_dir: &Path,
) -> Result<String, String> {
    let server_ns = fabric.ns(&dst.namespace).map_err(|e| e.to_string())?;
    let client_ns = fabric.ns(&src.namespace).map_err(|e| e.to_string())?;
    let log = log_dir.join(iperf_log_name(&dst.namespace));
    let server = iperf::Server::start(
        server_ns,
        &dst.address.to_string(),
        iperf::DEFAULT_PORT,
        &log,
    )
    .map_err(|e| e.to_string())?;
    let spec = ClientSpec {
        server: target.to_string(),
        port: iperf::DEFAULT_PORT,
        mode: Mode::Tcp { streams: 1 },
        seconds,
        omit: 0,
    };
    let report = iperf::run_client(client_ns, &spec);
    server.finish(Duration::from_secs(3));
    let report = report.map_err(|e| e.to_string())?;
    let seen = std::fs::read_to_string(&log)
        .map_err(|e| format!("{}: {e}", log.display()))
        .and_then(|json| iperf::parse_server_peer(&json).map_err(|e| e.to_string()))?;
    let rate = format!(
        "{:.2} Gbit/s, {} retransmits",
        report.received_bps / 1e9,
        report.retransmits.unwrap_or(0)
    );
    if report.received_bps <= 0.0 {
        return Err(format!("no data received ({rate})"));
    }
    if seen != expected_peer.to_string() {
        return Err(format!(
            "{rate}, but the server saw the client as {seen}, expected {expected_peer}"
        ));
    }
    Ok(format!("{rate}; the server saw the client as {seen}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubetun_crds::{ClusterRef, Endpoint, TunnelEndpointSpec};

    fn cluster(id: &str, endpoints: Vec<TunnelEndpointSpec>) -> ClusterState {
        ClusterState {
            name: id.to_uppercase(),
            id: id.into(),
            namespace: format!("{id}-gw"),
            interface: format!("kt-{id}"),
            grpc_socket: "/dev/null".into(),
            uapi_socket: "/dev/null".into(),
            log: "/dev/null".into(),
            pid: None,
            public_key: String::new(),
            underlay_address: Ipv4Addr::new(198, 18, 0, 1),
            listen_port: 51820,
            pod_cidr: "10.202.0.0/16".parse().unwrap(),
            external_cidr: Some("10.70.0.0/16".parse().unwrap()),
            pods: vec![],
            externals: vec![],
            tunnel_endpoints: endpoints,
            applied_version: String::new(),
            nodes: vec![],
            node_hop: crate::topology::NodeHop::Direct,
            gateway_node: 0,
            mtu: 1420,
            key_file: "/dev/null".into(),
            control_plane: None,
        }
    }

    #[test]
    fn reach_address_translates_into_the_view() {
        let te = TunnelEndpointSpec {
            cluster: ClusterRef {
                id: "milan".into(),
                name: "Milan".into(),
            },
            remote_pod_cidrs: vec![CidrMapping {
                real: "10.203.0.0/16".into(),
                view: "10.203.0.0/16".into(),
            }],
            remote_external_cidrs: vec![CidrMapping {
                real: "10.70.0.0/16".into(),
                view: "10.68.0.0/16".into(),
            }],
            endpoint: Endpoint {
                address: "198.18.0.3".into(),
                port: 51820,
            },
            ..TunnelEndpointSpec::default()
        };
        let rome = cluster("rome", vec![te]);
        let milan = cluster("milan", vec![]);
        assert_eq!(
            reach_address(&rome, &milan, Ipv4Addr::new(10, 70, 0, 11)),
            Some(Ipv4Addr::new(10, 68, 0, 11))
        );
        assert_eq!(
            reach_address(&rome, &milan, Ipv4Addr::new(10, 203, 0, 11)),
            Some(Ipv4Addr::new(10, 203, 0, 11))
        );
        assert_eq!(
            reach_address(&rome, &milan, Ipv4Addr::new(10, 9, 0, 1)),
            None
        );
        assert_eq!(
            reach_address(&milan, &rome, Ipv4Addr::new(10, 70, 0, 11)),
            None
        );
    }
}
