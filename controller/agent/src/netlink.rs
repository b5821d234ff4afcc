//! The netlink shell of the agent: reads the kernel state tagged as the agent's and applies
//! [`Change`]s, through rtnetlink in the network namespace of the thread that connected.
//!
//! Only tagged objects are ever read back or touched: routes of the agent's table with the
//! agent's protocol, rules at the agent's priority pointing at that table (and carrying the
//! agent's protocol when the kernel reports one), and the VXLAN device of the overlay's name
//! (a non-VXLAN device of that name is refused, never deleted).

use std::net::{IpAddr, Ipv4Addr};

use futures::TryStreamExt;
use ipnet::{IpNet, Ipv4Net};
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteMetric, RouteProtocol,
    RouteScope, RouteType,
};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{Handle, IpVersion, LinkUnspec, LinkVxlan};

use super::diff::{Change, ObservedLink, ObservedState};
use super::plan::{AgentSettings, LinkIdentity, OverlayLink, Route, RuleSelector};

const ENOENT: i32 = 2;
const ESRCH: i32 = 3;
const ENODEV: i32 = 19;
const EADDRNOTAVAIL: i32 = 99;

/// A failed kernel read or change.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The netlink socket could not be opened.
    #[error("opening a netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    /// The kernel refused a request.
    #[error("{operation}: {source}")]
    Request {
        /// What was asked, in `ip` terms.
        operation: String,
        /// The kernel's answer.
        #[source]
        source: rtnetlink::Error,
    },
    /// A device with the overlay's name exists and is not a VXLAN device.
    #[error("device {name} exists and is not a VXLAN device; refusing to touch it")]
    ForeignLink {
        /// The device name.
        name: String,
    },
    /// The overlay device vanished between two steps.
    #[error("device {name} does not exist")]
    MissingLink {
        /// The device name.
        name: String,
    },
    /// No interface holds the node's address, so the underlay MTU is unknown.
    #[error("no interface holds the node address {0}")]
    NoUnderlay(IpAddr),
}

fn request(operation: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetlinkError {
    let operation = operation.into();
    move |source| NetlinkError::Request { operation, source }
}

fn errno(error: &rtnetlink::Error) -> Option<i32> {
    match error {
        rtnetlink::Error::NetlinkError(message) => Some(-message.raw_code()),
        _ => None,
    }
}

/// True for the answers of deleting something that is already gone.
fn already_gone(error: &rtnetlink::Error) -> bool {
    matches!(errno(error), Some(ENOENT | ESRCH | ENODEV | EADDRNOTAVAIL))
}

/// The node's underlay interface, as far as the plan needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Underlay {
    pub mtu: u32,
    /// The subnet of the node's address on it: a gateway node inside it shares the L2.
    pub network: IpNet,
}

/// The kernel of one network namespace, as far as the agent's tagged objects go.
#[derive(Debug, Clone)]
pub struct Kernel {
    handle: Handle,
    settings: AgentSettings,
}

impl Kernel {
    /// Opens a netlink socket in the calling thread's network namespace. Must run inside a
    /// tokio runtime, which drives the connection.
    pub fn connect(settings: AgentSettings) -> Result<Self, NetlinkError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(NetlinkError::Socket)?;
        tokio::spawn(connection);
        Ok(Self { handle, settings })
    }

    /// The settings whose tags this kernel view reads and writes.
    pub fn settings(&self) -> &AgentSettings {
        &self.settings
    }

    /// Everything tagged as the agent's.
    pub async fn observe(&self) -> Result<ObservedState, NetlinkError> {
        let link = self.overlay_message().await?;
        let overlay_index = link.as_ref().map(|l| l.header.index);
        let overlay = match link {
            Some(link) => Some(self.observe_link(&link).await?),
            None => None,
        };
        Ok(ObservedState {
            overlay,
            routes: self.observe_routes(overlay_index).await?,
            rules: self.observe_rules().await?,
        })
    }

    /// The underlay interface of the node: the one holding `address`.
    pub async fn underlay(&self, address: IpAddr) -> Result<Underlay, NetlinkError> {
        let mut addresses = self
            .handle
            .address()
            .get()
            .set_address_filter(address)
            .execute();
        let Some(found) = addresses
            .try_next()
            .await
            .map_err(request(format!("ip address show to {address}")))?
        else {
            return Err(NetlinkError::NoUnderlay(address));
        };
        let network = IpNet::new(address, found.header.prefix_len)
            .map_err(|_| NetlinkError::NoUnderlay(address))?
            .trunc();
        let mut links = self
            .handle
            .link()
            .get()
            .match_index(found.header.index)
            .execute();
        let link = links
            .try_next()
            .await
            .map_err(request(format!(
                "ip link show index {}",
                found.header.index
            )))?
            .ok_or(NetlinkError::NoUnderlay(address))?;
        let mtu = link
            .attributes
            .iter()
            .find_map(|a| match a {
                LinkAttribute::Mtu(mtu) => Some(*mtu),
                _ => None,
            })
            .ok_or(NetlinkError::NoUnderlay(address))?;
        Ok(Underlay { mtu, network })
    }

    /// Applies `changes` in order; stops at the first failure.
    pub async fn apply(&self, changes: &[Change]) -> Result<(), NetlinkError> {
        for change in changes {
            self.apply_one(change).await?;
        }
        Ok(())
    }

    async fn apply_one(&self, change: &Change) -> Result<(), NetlinkError> {
        let name = &self.settings.overlay.link_name;
        match change {
            Change::DeleteRule(rule) => {
                let result = self
                    .handle
                    .rule()
                    .del(self.rule_message(*rule))
                    .execute()
                    .await;
                ignore_gone(result, format!("ip rule del {}", describe_rule(*rule)))
            }
            Change::DeleteRoute(route) => {
                let message = self.route_message(route, None);
                let result = self.handle.route().del(message).execute().await;
                ignore_gone(
                    result,
                    format!(
                        "ip route del {} table {}",
                        route.destination, self.settings.table
                    ),
                )
            }
            Change::DeleteLink => {
                let Some(link) = self.overlay_message().await? else {
                    return Ok(());
                };
                let result = self.handle.link().del(link.header.index).execute().await;
                ignore_gone(result, format!("ip link del {name}"))
            }
            Change::CreateLink(link) => self.create_link(link).await,
            Change::SetLinkMtu(mtu) => {
                let index = self.overlay_index().await?;
                self.handle
                    .link()
                    .set(LinkUnspec::new_with_index(index).mtu(*mtu).build())
                    .execute()
                    .await
                    .map_err(request(format!("ip link set {name} mtu {mtu}")))
            }
            Change::SetLinkUp => {
                let index = self.overlay_index().await?;
                self.handle
                    .link()
                    .set(LinkUnspec::new_with_index(index).up().build())
                    .execute()
                    .await
                    .map_err(request(format!("ip link set {name} up")))
            }
            Change::AddAddress(address) => {
                let index = self.overlay_index().await?;
                self.handle
                    .address()
                    .add(index, IpAddr::V4(address.addr()), address.prefix_len())
                    .replace()
                    .execute()
                    .await
                    .map_err(request(format!("ip address add {address} dev {name}")))
            }
            Change::DeleteAddress(address) => {
                let index = self.overlay_index().await?;
                let result = self
                    .handle
                    .address()
                    .del(address_message(index, *address))
                    .execute()
                    .await;
                ignore_gone(result, format!("ip address del {address} dev {name}"))
            }
            Change::AddFlood(remote) => self.add_flood(*remote).await,
            Change::DeleteFlood(remote) => {
                let index = self.overlay_index().await?;
                let result = self
                    .handle
                    .neighbours()
                    .del(flood_message(index, *remote))
                    .execute()
                    .await;
                ignore_gone(
                    result,
                    format!("bridge fdb del 00:00:00:00:00:00 dst {remote} dev {name}"),
                )
            }
            Change::PutRoute(route) => {
                let overlay = if route.via_overlay {
                    Some(self.overlay_index().await?)
                } else {
                    None
                };
                self.handle
                    .route()
                    .add(self.route_message(route, overlay))
                    .replace()
                    .execute()
                    .await
                    .map_err(request(format!(
                        "ip route replace {} via {} table {}",
                        route.destination,
                        route.via.map_or_else(|| "-".to_owned(), |v| v.to_string()),
                        self.settings.table
                    )))
            }
            Change::AddRule(rule) => {
                let mut add = self.handle.rule().add();
                *add.message_mut() = self.rule_message(*rule);
                add.execute()
                    .await
                    .map_err(request(format!("ip rule add {}", describe_rule(*rule))))
            }
        }
    }

    async fn create_link(&self, link: &OverlayLink) -> Result<(), NetlinkError> {
        let mut builder = LinkVxlan::new(&link.name, link.vni)
            .local(link.local)
            .port(link.port)
            .learning(true)
            .mtu(link.mtu);
        if let Some(remote) = link.remote {
            builder = builder.remote(remote);
        }
        self.handle
            .link()
            .add(builder.build())
            .execute()
            .await
            .map_err(request(format!(
                "ip link add {} type vxlan id {} dstport {} local {}",
                link.name, link.vni, link.port, link.local
            )))
    }

    async fn add_flood(&self, remote: Ipv4Addr) -> Result<(), NetlinkError> {
        let index = self.overlay_index().await?;
        let operation = format!(
            "bridge fdb append 00:00:00:00:00:00 dst {remote} dev {}",
            self.settings.overlay.link_name
        );
        let mut message = NetlinkMessage::from(RouteNetlinkMessage::NewNeighbour(flood_message(
            index, remote,
        )));
        message.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND;
        let mut handle = self.handle.clone();
        let mut responses = handle
            .request(message)
            .map_err(request(operation.clone()))?;
        while let Some(response) = futures::StreamExt::next(&mut responses).await {
            if let NetlinkPayload::Error(error) = response.payload {
                return Err(NetlinkError::Request {
                    operation,
                    source: rtnetlink::Error::NetlinkError(error),
                });
            }
        }
        Ok(())
    }

    async fn overlay_message(&self) -> Result<Option<LinkMessage>, NetlinkError> {
        let name = &self.settings.overlay.link_name;
        let mut links = self.handle.link().get().match_name(name.clone()).execute();
        let link = match links.try_next().await {
            Ok(link) => link,
            Err(error) if errno(&error) == Some(ENODEV) => None,
            Err(error) => return Err(request(format!("ip link show {name}"))(error)),
        };
        match link {
            Some(link) if vxlan_data(&link).is_none() => {
                Err(NetlinkError::ForeignLink { name: name.clone() })
            }
            other => Ok(other),
        }
    }

    async fn overlay_index(&self) -> Result<u32, NetlinkError> {
        self.overlay_message()
            .await?
            .map(|link| link.header.index)
            .ok_or_else(|| NetlinkError::MissingLink {
                name: self.settings.overlay.link_name.clone(),
            })
    }

    async fn observe_link(&self, link: &LinkMessage) -> Result<ObservedLink, NetlinkError> {
        let index = link.header.index;
        let name = &self.settings.overlay.link_name;
        let data = vxlan_data(link).unwrap_or_default();
        let identity = LinkIdentity {
            vni: data
                .iter()
                .find_map(|d| match d {
                    InfoVxlan::Id(id) => Some(*id),
                    _ => None,
                })
                .unwrap_or_default(),
            port: data
                .iter()
                .find_map(|d| match d {
                    InfoVxlan::Port(port) => Some(*port),
                    _ => None,
                })
                .unwrap_or_default(),
            local: data
                .iter()
                .find_map(|d| match d {
                    InfoVxlan::Local(ip) => Some(*ip),
                    _ => None,
                })
                .unwrap_or(Ipv4Addr::UNSPECIFIED),
            remote: data.iter().find_map(|d| match d {
                InfoVxlan::Group(ip) => Some(*ip),
                _ => None,
            }),
        };
        let mtu = link
            .attributes
            .iter()
            .find_map(|a| match a {
                LinkAttribute::Mtu(mtu) => Some(*mtu),
                _ => None,
            })
            .unwrap_or_default();

        let addresses: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(request(format!("ip address show dev {name}")))?;
        let addresses = addresses
            .iter()
            .filter_map(|message| {
                message.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Local(IpAddr::V4(ip)) => {
                        Ipv4Net::new(*ip, message.header.prefix_len).ok()
                    }
                    _ => None,
                })
            })
            .collect();

        let mut neighbours = self.handle.neighbours().get();
        neighbours = neighbours.set_address_family(AddressFamily::Bridge);
        let fdb: Vec<NeighbourMessage> = neighbours
            .execute()
            .try_collect()
            .await
            .map_err(request(format!("bridge fdb show dev {name}")))?;
        let flood_to = fdb
            .iter()
            .filter(|entry| entry.header.ifindex == index)
            .filter(|entry| {
                entry.attributes.iter().any(|a| {
                    matches!(a, NeighbourAttribute::LinkLayerAddress(mac) if mac.iter().all(|b| *b == 0))
                })
            })
            .filter_map(|entry| {
                entry.attributes.iter().find_map(|a| match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(*ip),
                    // Bridge-family entries carry the VTEP address undecoded.
                    NeighbourAttribute::Destination(NeighbourAddress::Other(bytes)) => {
                        <[u8; 4]>::try_from(bytes.as_slice()).ok().map(Ipv4Addr::from)
                    }
                    _ => None,
                })
            })
            // A device created with a remote holds that flood entry itself.
            .filter(|ip| Some(*ip) != identity.remote)
            .collect();

        Ok(ObservedLink {
            identity,
            mtu,
            up: link.header.flags.contains(LinkFlags::Up),
            addresses,
            flood_to,
        })
    }

    async fn observe_routes(&self, overlay_index: Option<u32>) -> Result<Vec<Route>, NetlinkError> {
        let mut routes = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut query = RouteMessage::default();
            query.header.address_family = family;
            let messages: Vec<RouteMessage> = self
                .handle
                .route()
                .get(query)
                .execute()
                .try_collect()
                .await
                .map_err(request(format!(
                    "ip route show table {}",
                    self.settings.table
                )))?;
            routes.extend(
                messages
                    .iter()
                    .filter(|m| self.is_ours(m))
                    .filter_map(|m| parse_route(m, overlay_index)),
            );
        }
        Ok(routes)
    }

    fn is_ours(&self, route: &RouteMessage) -> bool {
        let table = route
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Table(table) => Some(*table),
                _ => None,
            })
            .unwrap_or(u32::from(route.header.table));
        table == self.settings.table && u8::from(route.header.protocol) == self.settings.protocol
    }

    async fn observe_rules(&self) -> Result<Vec<RuleSelector>, NetlinkError> {
        let mut rules = Vec::new();
        for version in [IpVersion::V4, IpVersion::V6] {
            let messages: Vec<RuleMessage> = self
                .handle
                .rule()
                .get(version)
                .execute()
                .try_collect()
                .await
                .map_err(request("ip rule show"))?;
            rules.extend(
                messages
                    .iter()
                    .filter(|m| self.is_our_rule(m))
                    .map(parse_rule),
            );
        }
        Ok(rules)
    }

    fn is_our_rule(&self, rule: &RuleMessage) -> bool {
        let mut priority = None;
        let mut table = u32::from(rule.header.table);
        let mut protocol_matches = true;
        for attribute in &rule.attributes {
            match attribute {
                RuleAttribute::Priority(p) => priority = Some(*p),
                RuleAttribute::Table(t) => table = *t,
                RuleAttribute::Protocol(p) => {
                    protocol_matches = u8::from(*p) == self.settings.protocol;
                }
                _ => {}
            }
        }
        priority == Some(self.settings.rule_priority)
            && table == self.settings.table
            && protocol_matches
    }

    fn rule_message(&self, rule: RuleSelector) -> RuleMessage {
        let mut message = RuleMessage::default();
        message.header.action = RuleAction::ToTable;
        message.header.table = RouteHeader::RT_TABLE_UNSPEC;
        message.header.family = AddressFamily::Inet;
        match rule {
            RuleSelector::To(prefix) => {
                message.header.family = family_of(prefix);
                message.header.dst_len = prefix.prefix_len();
                message
                    .attributes
                    .push(RuleAttribute::Destination(prefix.addr()));
            }
            RuleSelector::From(prefix) => {
                message.header.family = family_of(prefix);
                message.header.src_len = prefix.prefix_len();
                message
                    .attributes
                    .push(RuleAttribute::Source(prefix.addr()));
            }
            RuleSelector::Other => {}
        }
        message
            .attributes
            .push(RuleAttribute::Priority(self.settings.rule_priority));
        message
            .attributes
            .push(RuleAttribute::Table(self.settings.table));
        if rule != RuleSelector::Other {
            message
                .attributes
                .push(RuleAttribute::Protocol(RouteProtocol::from(
                    self.settings.protocol,
                )));
        }
        message
    }

    fn route_message(&self, route: &Route, overlay_index: Option<u32>) -> RouteMessage {
        let mut message = RouteMessage::default();
        message.header.address_family = family_of(route.destination);
        message.header.destination_prefix_length = route.destination.prefix_len();
        message.header.table = RouteHeader::RT_TABLE_UNSPEC;
        message.header.protocol = RouteProtocol::from(self.settings.protocol);
        message.header.scope = RouteScope::Universe;
        message.header.kind = RouteType::Unicast;
        message
            .attributes
            .push(RouteAttribute::Destination(route.destination.addr().into()));
        message
            .attributes
            .push(RouteAttribute::Table(self.settings.table));
        if let Some(via) = route.via {
            message.attributes.push(RouteAttribute::Gateway(via.into()));
        }
        if let Some(index) = overlay_index {
            message.attributes.push(RouteAttribute::Oif(index));
        }
        let metrics: Vec<RouteMetric> = route
            .mtu
            .map(RouteMetric::Mtu)
            .into_iter()
            .chain(route.advmss.map(RouteMetric::Advmss))
            .collect();
        if !metrics.is_empty() {
            message.attributes.push(RouteAttribute::Metrics(metrics));
        }
        message
    }
}

fn ignore_gone(
    result: Result<(), rtnetlink::Error>,
    operation: String,
) -> Result<(), NetlinkError> {
    match result {
        Err(error) if !already_gone(&error) => Err(NetlinkError::Request {
            operation,
            source: error,
        }),
        _ => Ok(()),
    }
}

fn vxlan_data(link: &LinkMessage) -> Option<Vec<InfoVxlan>> {
    let infos = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => Some(infos),
        _ => None,
    })?;
    let is_vxlan = infos
        .iter()
        .any(|info| matches!(info, LinkInfo::Kind(InfoKind::Vxlan)));
    if !is_vxlan {
        return None;
    }
    Some(
        infos
            .iter()
            .find_map(|info| match info {
                LinkInfo::Data(InfoData::Vxlan(data)) => Some(data.clone()),
                _ => None,
            })
            .unwrap_or_default(),
    )
}

fn parse_route(message: &RouteMessage, overlay_index: Option<u32>) -> Option<Route> {
    let mut destination = None;
    let mut via = None;
    let mut oif = None;
    let mut mtu = None;
    let mut advmss = None;
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Destination(address) => destination = route_address(address),
            RouteAttribute::Gateway(address) => via = route_address(address),
            RouteAttribute::Oif(index) => oif = Some(*index),
            RouteAttribute::Metrics(metrics) => {
                for metric in metrics {
                    match metric {
                        RouteMetric::Mtu(value) => mtu = Some(*value),
                        RouteMetric::Advmss(value) => advmss = Some(*value),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let destination = destination.unwrap_or(match message.header.address_family {
        AddressFamily::Inet6 => IpAddr::from([0u16; 8]),
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    });
    let destination = IpNet::new(destination, message.header.destination_prefix_length).ok()?;
    Some(Route {
        destination,
        via,
        via_overlay: oif.is_some() && oif == overlay_index,
        mtu,
        advmss,
    })
}

fn route_address(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        _ => None,
    }
}

fn parse_rule(message: &RuleMessage) -> RuleSelector {
    let mut destination = None;
    let mut source = None;
    for attribute in &message.attributes {
        match attribute {
            RuleAttribute::Destination(ip) => destination = Some(*ip),
            RuleAttribute::Source(ip) => source = Some(*ip),
            _ => {}
        }
    }
    let prefix = |ip: IpAddr, len: u8| IpNet::new(ip, len).ok();
    match (destination, source) {
        (Some(ip), None) => {
            prefix(ip, message.header.dst_len).map_or(RuleSelector::Other, RuleSelector::To)
        }
        (None, Some(ip)) => {
            prefix(ip, message.header.src_len).map_or(RuleSelector::Other, RuleSelector::From)
        }
        _ => RuleSelector::Other,
    }
}

fn describe_rule(rule: RuleSelector) -> String {
    match rule {
        RuleSelector::To(prefix) => format!("to {prefix}"),
        RuleSelector::From(prefix) => format!("from {prefix}"),
        RuleSelector::Other => "(untyped)".to_owned(),
    }
}

fn family_of(prefix: IpNet) -> AddressFamily {
    match prefix {
        IpNet::V4(_) => AddressFamily::Inet,
        IpNet::V6(_) => AddressFamily::Inet6,
    }
}

fn address_message(index: u32, address: Ipv4Net) -> AddressMessage {
    let mut message = AddressMessage::default();
    message.header.family = AddressFamily::Inet;
    message.header.prefix_len = address.prefix_len();
    message.header.index = index;
    message
        .attributes
        .push(AddressAttribute::Local(IpAddr::V4(address.addr())));
    message
        .attributes
        .push(AddressAttribute::Address(IpAddr::V4(address.addr())));
    message
}

fn flood_message(index: u32, remote: Ipv4Addr) -> NeighbourMessage {
    let mut message = NeighbourMessage::default();
    message.header.family = AddressFamily::Bridge;
    message.header.ifindex = index;
    message.header.state = NeighbourState::Permanent;
    message.header.flags = NeighbourFlags::Own;
    message
        .attributes
        .push(NeighbourAttribute::LinkLayerAddress(vec![0; 6]));
    message
        .attributes
        .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(
            remote,
        )));
    message
}
