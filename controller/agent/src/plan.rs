//! The pure route planner: which overlay link, routes and policy rules one node needs, given
//! the TunnelEndpoints, where the gateway runs and the node's own facts. No IO, no clock.
//!
//! Two roles:
//!
//! - **member node** (any node but the gateway's): one rule `to <view> lookup <table>` per
//!   remote view CIDR, and in the table a route `<view> via <gateway>`: the gateway node's IP
//!   when the nodes share an L2 ([`Attachment::Direct`]), or the gateway node's overlay address
//!   on a VXLAN device whose remote is the gateway node ([`Attachment::Overlay`]).
//! - **gateway node**: a host-network gateway's own routes send the views into its TUN device,
//!   so no egress rule is needed; a gateway in its own pod network namespace gets the same
//!   `to <view>` rules as members, with routes via the gateway pod's IP. For symmetric return
//!   paths it adds `from <view> lookup <table>` and in the table every other node's pod CIDRs
//!   via that node (directly or over the overlay, whose device floods to every member node).
//!
//! Route MTUs and advertised MSS follow the tunnel: a packet the tunnel cannot carry is
//! refused at its source instead of on the gateway.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};
use kubetun_crds::TunnelEndpointSpec;

/// Bytes a VXLAN encapsulation over IPv4 adds (outer IPv4 + UDP + VXLAN + inner Ethernet).
pub const VXLAN_OVERHEAD: u32 = 50;
/// Tunnel MTU assumed when a TunnelEndpoint names none (WireGuard's default over IPv4).
pub const DEFAULT_TUNNEL_MTU: u32 = 1420;
/// IPv4 + TCP header bytes: advertised MSS = MTU - this, for IPv4 destinations.
const TCP_IPV4_HEADERS: u32 = 40;
/// IPv6 + TCP header bytes.
const TCP_IPV6_HEADERS: u32 = 60;

/// The kernel objects that mark state as the agent's own, and the overlay parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSettings {
    /// Routing table holding every route of the agent.
    pub table: u32,
    /// Priority of every policy rule of the agent.
    pub rule_priority: u32,
    /// Route and rule protocol number tagging them as the agent's (`proto 0xb7`).
    pub protocol: u8,
    /// Parameters of the VXLAN overlay, used by [`Attachment::Overlay`].
    pub overlay: OverlaySettings,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            table: 1880,
            rule_priority: 1880,
            protocol: 0xb7,
            overlay: OverlaySettings::default(),
        }
    }
}

/// The VXLAN overlay between member nodes and the gateway node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlaySettings {
    /// Name of the VXLAN device (at most 15 bytes).
    pub link_name: String,
    /// VXLAN network identifier.
    pub vni: u32,
    /// UDP destination port.
    pub port: u16,
    /// Overlay addresses: a node's overlay address is this network plus the host bits of the
    /// node's IP (so every node computes every other node's address without coordination).
    pub network: Ipv4Net,
}

impl Default for OverlaySettings {
    fn default() -> Self {
        Self {
            link_name: "kubetun.vxlan".to_owned(),
            vni: 1880,
            port: 4880,
            network: Ipv4Net::new_assert(Ipv4Addr::new(240, 0, 0, 0), 8),
        }
    }
}

impl OverlaySettings {
    /// The overlay address of the node whose underlay IP is `node_ip`, if its host bits make a
    /// usable address (not the overlay network's first or last address).
    pub fn address_of(&self, node_ip: Ipv4Addr) -> Option<Ipv4Addr> {
        let host = u32::from(node_ip) & u32::from(self.network.hostmask());
        let address = Ipv4Addr::from(u32::from(self.network.network()) | host);
        (address != self.network.network() && address != self.network.broadcast())
            .then_some(address)
    }
}

/// How nodes reach each other for the node <-> gateway hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attachment {
    /// Same L2 segment: routes go `via <node IP>`.
    Direct,
    /// No shared L2: routes go over a VXLAN device.
    Overlay,
    /// Direct towards nodes inside this subnet (the local underlay's), overlay otherwise.
    Auto(IpNet),
}

impl Attachment {
    /// True when the hop towards the node at `ip` goes over the overlay.
    pub fn uses_overlay(self, ip: IpAddr) -> bool {
        match self {
            Self::Direct => false,
            Self::Overlay => true,
            Self::Auto(subnet) => !subnet.contains(&ip),
        }
    }
}

/// What the agent knows about a node: its name, underlay IP and pod CIDRs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Kubernetes node name.
    pub name: String,
    /// The node's underlay (InternalIP) address.
    pub ip: IpAddr,
    /// The node's pod CIDRs (`spec.podCIDRs`).
    pub pod_cidrs: Vec<IpNet>,
}

/// Everything the plan depends on.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// Table, priority, protocol and overlay parameters.
    pub settings: &'a AgentSettings,
    /// How this node reaches the gateway node.
    pub attachment: Attachment,
    /// The node the agent runs on.
    pub local: &'a Node,
    /// MTU of the local underlay interface (the one holding `local.ip`).
    pub underlay_mtu: u32,
    /// Underlay IP of the node the gateway runs on.
    pub gateway_ip: IpAddr,
    /// The gateway pod's own IP when it runs in a pod network namespace (not host network):
    /// the gateway node then routes the views to it.
    pub gateway_pod_ip: Option<IpAddr>,
    /// Every node of the cluster (the local one may be among them).
    pub nodes: &'a [Node],
    /// Every TunnelEndpoint of the cluster.
    pub endpoints: &'a [TunnelEndpointSpec],
}

/// The VXLAN device a node should have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayLink {
    /// Device name.
    pub name: String,
    /// VXLAN network identifier.
    pub vni: u32,
    /// UDP destination port.
    pub port: u16,
    /// Local VTEP address (the node's underlay IP).
    pub local: Ipv4Addr,
    /// The single remote VTEP (member nodes: the gateway node); `None` on the gateway node,
    /// which floods to [`OverlayLink::flood_to`] instead.
    pub remote: Option<Ipv4Addr>,
    /// Device MTU: underlay MTU minus the VXLAN overhead.
    pub mtu: u32,
    /// The node's overlay address and the overlay prefix length.
    pub address: Ipv4Net,
    /// Underlay IPs the device floods broadcast and unknown frames to (all-zero FDB entries).
    pub flood_to: BTreeSet<Ipv4Addr>,
}

impl OverlayLink {
    /// The attributes fixed at creation: a device that differs in these must be recreated.
    pub fn identity(&self) -> LinkIdentity {
        LinkIdentity {
            vni: self.vni,
            port: self.port,
            local: self.local,
            remote: self.remote,
        }
    }
}

/// VXLAN attributes that can only be set when the device is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkIdentity {
    /// VXLAN network identifier.
    pub vni: u32,
    /// UDP destination port.
    pub port: u16,
    /// Local VTEP address.
    pub local: Ipv4Addr,
    /// Remote VTEP address, if any.
    pub remote: Option<Ipv4Addr>,
}

/// A route of the agent's table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Route {
    /// Destination prefix.
    pub destination: IpNet,
    /// Next hop; `None` only for a route observed in the kernel without one.
    pub via: Option<IpAddr>,
    /// True when the route leaves through the overlay device.
    pub via_overlay: bool,
    /// Path MTU (`mtu` metric).
    pub mtu: Option<u32>,
    /// Advertised TCP MSS (`advmss` metric).
    pub advmss: Option<u32>,
}

/// What a policy rule of the agent matches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuleSelector {
    /// `to <prefix>`: egress towards a remote view.
    To(IpNet),
    /// `from <prefix>`: return traffic from a remote view, on the gateway node.
    From(IpNet),
    /// Neither or both: only ever observed (a tagged rule the agent did not make).
    Other,
}

/// A remote CIDR the planner could not route, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The CIDR as written in the TunnelEndpoint or the Node.
    pub cidr: String,
    /// Why it has no route.
    pub reason: String,
}

/// The whole state one node should have; the agent makes the kernel match it exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredState {
    /// The overlay device, with [`Attachment::Overlay`] only.
    pub overlay: Option<OverlayLink>,
    /// Routes of the agent's table, by destination.
    pub routes: BTreeMap<IpNet, Route>,
    /// Policy rules, all at the agent's priority and pointing at its table.
    pub rules: BTreeSet<RuleSelector>,
    /// Inputs that could not be turned into routes.
    pub skipped: Vec<Skipped>,
}

/// Why no plan can be made at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutePlanError {
    /// The VXLAN overlay is built over IPv4 underlay addresses.
    #[error("the overlay needs IPv4 node addresses; {node} has {ip}")]
    OverlayNeedsIpv4 {
        /// The node (or "gateway node").
        node: String,
        /// Its address.
        ip: IpAddr,
    },
    /// A node IP whose host bits give no usable overlay address.
    #[error("node address {ip} maps to no usable address in the overlay network {network}")]
    NoOverlayAddress {
        /// The node's underlay IP.
        ip: Ipv4Addr,
        /// The overlay network.
        network: Ipv4Net,
    },
    /// The underlay MTU leaves no room for the overlay.
    #[error("underlay MTU {mtu} is too small for a VXLAN overlay")]
    UnderlayMtuTooSmall {
        /// The underlay MTU.
        mtu: u32,
    },
}

/// Every remote view CIDR of `endpoints` with the smallest tunnel MTU that carries it.
/// Unparsable entries are reported as skipped.
pub fn remote_views(endpoints: &[TunnelEndpointSpec]) -> (BTreeMap<IpNet, u32>, Vec<Skipped>) {
    let mut views = BTreeMap::new();
    let mut skipped = Vec::new();
    for endpoint in endpoints {
        let mtu = endpoint.mtu.unwrap_or(DEFAULT_TUNNEL_MTU);
        let mappings = endpoint
            .remote_pod_cidrs
            .iter()
            .chain(&endpoint.remote_external_cidrs);
        for mapping in mappings {
            match parse_cidr(&mapping.view) {
                Ok(view) => {
                    views
                        .entry(view)
                        .and_modify(|known: &mut u32| *known = (*known).min(mtu))
                        .or_insert(mtu);
                }
                Err(reason) => skipped.push(Skipped {
                    cidr: mapping.view.clone(),
                    reason: format!("remote view of cluster {:?}: {reason}", endpoint.cluster.id),
                }),
            }
        }
    }
    (views, skipped)
}

fn parse_cidr(text: &str) -> Result<IpNet, String> {
    let net: IpNet = text.parse().map_err(|e| format!("not a CIDR ({e})"))?;
    if net.trunc() != net {
        return Err("host bits are set".to_owned());
    }
    Ok(net)
}

/// The desired state of one node.
pub fn plan(input: &PlanInput<'_>) -> Result<DesiredState, RoutePlanError> {
    let (views, mut skipped) = remote_views(input.endpoints);
    let mut state = DesiredState::default();

    if input.local.ip == input.gateway_ip {
        for view in views.keys() {
            state.rules.insert(RuleSelector::From(*view));
        }
        let mut flood_to = BTreeSet::new();
        for node in input.nodes.iter().filter(|n| n.ip != input.local.ip) {
            let overlay = input.attachment.uses_overlay(node.ip);
            let via = match next_hop(input, &node.name, node.ip, overlay) {
                Ok(via) => via,
                Err(reason) => {
                    skipped.extend(node.pod_cidrs.iter().map(|cidr| Skipped {
                        cidr: cidr.to_string(),
                        reason: format!("pod CIDR of node {}: {reason}", node.name),
                    }));
                    continue;
                }
            };
            if let (true, IpAddr::V4(ip)) = (overlay, node.ip) {
                flood_to.insert(ip);
            }
            for cidr in &node.pod_cidrs {
                if !same_family(cidr.addr(), via) {
                    skipped.push(family_mismatch(cidr, via, &node.name));
                    continue;
                }
                state.routes.insert(
                    *cidr,
                    Route {
                        destination: *cidr,
                        via: Some(via),
                        via_overlay: overlay,
                        mtu: None,
                        advmss: None,
                    },
                );
            }
        }
        if let Some(pod_ip) = input.gateway_pod_ip {
            for (view, tunnel_mtu) in &views {
                if !same_family(view.addr(), pod_ip) {
                    skipped.push(family_mismatch(view, pod_ip, "the gateway pod"));
                    continue;
                }
                state.rules.insert(RuleSelector::To(*view));
                state.routes.insert(
                    *view,
                    egress_route(*view, pod_ip, false, (*tunnel_mtu).min(input.underlay_mtu)),
                );
            }
        }
        if !flood_to.is_empty() || input.attachment == Attachment::Overlay {
            state.overlay = Some(overlay_link(input, None, flood_to)?);
        }
    } else {
        let overlay = input.attachment.uses_overlay(input.gateway_ip);
        let via = next_hop(input, "gateway node", input.gateway_ip, overlay)?;
        if overlay {
            let IpAddr::V4(remote) = input.gateway_ip else {
                return Err(RoutePlanError::OverlayNeedsIpv4 {
                    node: "gateway node".to_owned(),
                    ip: input.gateway_ip,
                });
            };
            state.overlay = Some(overlay_link(input, Some(remote), BTreeSet::new())?);
        }
        let path_mtu = state
            .overlay
            .as_ref()
            .map_or(input.underlay_mtu, |link| link.mtu);
        for (view, tunnel_mtu) in views {
            if !same_family(view.addr(), via) {
                skipped.push(family_mismatch(&view, via, "gateway node"));
                continue;
            }
            state.rules.insert(RuleSelector::To(view));
            state.routes.insert(
                view,
                egress_route(view, via, overlay, tunnel_mtu.min(path_mtu)),
            );
        }
    }
    state.skipped = skipped;
    Ok(state)
}

/// The route of a remote view, with the path MTU and the MSS that fits it.
fn egress_route(view: IpNet, via: IpAddr, via_overlay: bool, mtu: u32) -> Route {
    let headers = match view {
        IpNet::V4(_) => TCP_IPV4_HEADERS,
        IpNet::V6(_) => TCP_IPV6_HEADERS,
    };
    Route {
        destination: view,
        via: Some(via),
        via_overlay,
        mtu: Some(mtu),
        advmss: Some(mtu.saturating_sub(headers)),
    }
}

/// The address to route through to reach `node` at `node_ip`.
fn next_hop(
    input: &PlanInput<'_>,
    node: &str,
    node_ip: IpAddr,
    overlay: bool,
) -> Result<IpAddr, RoutePlanError> {
    match (overlay, node_ip) {
        (false, ip) => Ok(ip),
        (true, IpAddr::V4(ip)) => input.settings.overlay.address_of(ip).map(IpAddr::V4).ok_or(
            RoutePlanError::NoOverlayAddress {
                ip,
                network: input.settings.overlay.network,
            },
        ),
        (true, ip @ IpAddr::V6(_)) => Err(RoutePlanError::OverlayNeedsIpv4 {
            node: node.to_owned(),
            ip,
        }),
    }
}

fn overlay_link(
    input: &PlanInput<'_>,
    remote: Option<Ipv4Addr>,
    flood_to: BTreeSet<Ipv4Addr>,
) -> Result<OverlayLink, RoutePlanError> {
    let settings = &input.settings.overlay;
    let IpAddr::V4(local) = input.local.ip else {
        return Err(RoutePlanError::OverlayNeedsIpv4 {
            node: input.local.name.clone(),
            ip: input.local.ip,
        });
    };
    let address = settings
        .address_of(local)
        .ok_or(RoutePlanError::NoOverlayAddress {
            ip: local,
            network: settings.network,
        })?;
    let mtu = input
        .underlay_mtu
        .checked_sub(VXLAN_OVERHEAD)
        .filter(|mtu| *mtu >= 1280)
        .ok_or(RoutePlanError::UnderlayMtuTooSmall {
            mtu: input.underlay_mtu,
        })?;
    Ok(OverlayLink {
        name: settings.link_name.clone(),
        vni: settings.vni,
        port: settings.port,
        local,
        remote,
        mtu,
        address: Ipv4Net::new_assert(address, settings.network.prefix_len()),
        flood_to,
    })
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

fn family_mismatch(cidr: &IpNet, via: IpAddr, whose: &str) -> Skipped {
    Skipped {
        cidr: cidr.to_string(),
        reason: format!("no next hop of its address family towards {whose} (next hop is {via})"),
    }
}

#[cfg(test)]
mod tests;
