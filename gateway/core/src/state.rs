//! The gateway's desired state: one model fed by both control surfaces (the gRPC `Apply` and the
//! WireGuard UAPI `set`). A state is parsed and validated completely before the device applies
//! it, so an invalid request never leaves a half-applied configuration behind.
//!
//! Pure: no IO; DNS names in endpoints are kept as names and resolved by the device.

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::conncheck::{ConnCheckConfig, MAX_INTERVAL_MS, MAX_LOSS_THRESHOLD, MIN_INTERVAL_MS};
use crate::key::{Key, KeyError};
use crate::remap;

/// Default tunnel MTU (1500 minus the IPv6 + UDP + WireGuard overhead), as wg-quick uses.
pub const DEFAULT_MTU: u16 = 1420;
/// The smallest MTU accepted (IPv6 minimum link MTU).
pub const MIN_MTU: u16 = 1280;
/// The largest MTU accepted (jumbo frames minus encapsulation overhead).
pub const MAX_MTU: u16 = 9000;

/// Why a desired state was rejected. Messages name the offending peer and value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The interface private key is malformed.
    #[error("interface private_key: {0}")]
    PrivateKey(KeyError),
    /// The interface's previous private key is malformed.
    #[error("interface previous_private_key: {0}")]
    PreviousPrivateKey(KeyError),
    /// A peer's public or preshared key is malformed.
    #[error("peer {peer}: {field}: {source}")]
    PeerKey {
        /// Index or name of the peer in the request.
        peer: String,
        /// `public_key` or `preshared_key`.
        field: &'static str,
        /// What was wrong with it.
        source: KeyError,
    },
    /// A prefix or address did not parse.
    #[error("{context}: invalid CIDR {value:?}")]
    Cidr {
        /// Where the value was found.
        context: String,
        /// The offending text.
        value: String,
    },
    /// A prefix has bits set below its mask.
    #[error("{context}: {value} has host bits set (did you mean {canonical}?)")]
    HostBits {
        /// Where the value was found.
        context: String,
        /// The offending prefix.
        value: IpNet,
        /// The prefix with the host bits cleared.
        canonical: IpNet,
    },
    /// A route's view differs from its real prefix in family or length.
    #[error("peer {peer}: view {view} must have the same family and length as real {real}")]
    ViewShape {
        peer: String,
        /// The real prefix.
        real: IpNet,
        view: IpNet,
    },
    /// The same view prefix is used twice.
    #[error("view {view} is used by both peer {first} and peer {second}")]
    DuplicateView {
        /// The duplicated view.
        view: IpNet,
        /// The first peer using it.
        first: String,
        /// The second peer using it.
        second: String,
    },
    /// Two peers share a public key.
    #[error("peer {0}: duplicate public key")]
    DuplicatePeer(String),
    /// A peer has the gateway's own public key.
    #[error("peer {0}: public key is the interface's own public key")]
    OwnKey(String),
    /// An endpoint is not `host:port` / `[v6]:port`.
    #[error("peer {peer}: invalid endpoint {value:?} (expected host:port or [v6]:port)")]
    Endpoint {
        peer: String,
        /// The offending text.
        value: String,
    },
    /// A fallback route whose view no other peer carries as a primary route.
    #[error(
        "peer {peer}: fallback route for view {view}: no other peer has a primary route with that view"
    )]
    FallbackWithoutPrimary { peer: String, view: IpNet },
    /// Two fallback routes for one view.
    #[error("view {view} has fallback routes on both peer {first} and peer {second}")]
    DuplicateFallback {
        view: IpNet,
        first: String,
        second: String,
    },
    /// The peer a fallback backs up is never probed, so it could never be found unreachable.
    #[error(
        "fallback route for view {view} (peer {backup}): the connectivity check must be enabled on the interface and for peer {primary}"
    )]
    FallbackUnprobed {
        view: IpNet,
        backup: String,
        primary: String,
    },
    /// The remap table rejected the routes.
    #[error(transparent)]
    Remap(#[from] remap::RemapError),
    /// More peers than the remap table can index.
    #[error("too many peers (at most {})", remap::MAX_PEER_ID + 1)]
    TooManyPeers,
    /// An admission is malformed, duplicated or overlaps another cluster's.
    #[error("admission {cluster}: {problem}")]
    Admission {
        /// The remote cluster it names (or its index in the request when unnamed).
        cluster: String,
        /// What is wrong, with the offending value.
        problem: String,
    },
    /// A numeric field is out of range.
    #[error("{field}: {value} is out of range {min}..={max}")]
    OutOfRange {
        field: &'static str,
        /// The value given.
        value: u64,
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
    },
}

/// Where a peer is reached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// A literal socket address.
    Addr(SocketAddr),
    /// A DNS name, resolved by the device.
    Host {
        /// The name.
        host: String,
        /// The UDP port.
        port: u16,
    },
}

impl Endpoint {
    /// Parses `ip:port`, `[v6]:port` or `name:port`.
    pub fn parse(text: &str) -> Option<Endpoint> {
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Some(Endpoint::Addr(addr));
        }
        let (host, port) = text.rsplit_once(':')?;
        let port = port.parse::<u16>().ok()?;
        let valid_host = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
        valid_host.then(|| Endpoint::Host {
            host: host.to_owned(),
            port,
        })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Addr(addr) => write!(f, "{addr}"),
            Endpoint::Host { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// One of a peer's real prefixes and the local view of it (equal when not remapped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RouteConfig {
    /// The prefix as it appears on the wire (and the allowed source prefix of the peer).
    pub real: IpNet,
    /// The prefix local clients use to reach it.
    pub view: IpNet,
    /// A backup path: the view is another peer's (its primary route), and this route carries
    /// it, both ways, only while that peer is unreachable (see [`crate::path`]).
    pub fallback: bool,
}

impl RouteConfig {
    /// A route that is not remapped (a plain WireGuard allowed IP).
    pub fn identity(prefix: IpNet) -> Self {
        Self::remapped(prefix, prefix)
    }

    /// A primary route from `real` to `view`.
    pub fn remapped(real: IpNet, view: IpNet) -> Self {
        Self {
            real,
            view,
            fallback: false,
        }
    }
}

/// Interface-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceConfig {
    /// The X25519 private key; without one the gateway has no peers' sessions.
    pub private_key: Option<Key>,
    /// During a key rotation, the key used before `private_key`: peers whose tunnels were
    /// made with it keep using it until they complete a handshake with `private_key`. Never
    /// equal to `private_key`, and `None` without one.
    pub previous_private_key: Option<Key>,
    /// UDP port; 0 lets the kernel choose.
    pub listen_port: u16,
    /// `SO_MARK` on the UDP sockets; 0 = none.
    pub fwmark: u32,
    /// TUN MTU.
    pub mtu: u16,
    /// Addresses assigned to the TUN device.
    pub addresses: Vec<IpNet>,
    /// Local sources allowed to reach peers; empty = unrestricted.
    pub local_prefixes: Vec<IpNet>,
    /// Install a route to the TUN for every view prefix.
    pub manage_routes: bool,
    /// The gateway-to-gateway connectivity check; `None`: off.
    pub conncheck: Option<ConnCheckConfig>,
}

impl Default for InterfaceConfig {
    fn default() -> Self {
        Self {
            private_key: None,
            previous_private_key: None,
            listen_port: 0,
            fwmark: 0,
            mtu: DEFAULT_MTU,
            addresses: Vec::new(),
            local_prefixes: Vec::new(),
            manage_routes: false,
            conncheck: None,
        }
    }
}

/// One peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// The peer's identity.
    pub public_key: Key,
    /// Human name used in logs, metrics and status.
    pub name: String,
    /// Optional preshared key.
    pub preshared_key: Option<Key>,
    /// Where to send; `None` waits for the peer to contact us.
    pub endpoint: Option<Endpoint>,
    /// Persistent keepalive interval in seconds; 0 disables.
    pub persistent_keepalive: u16,
    /// Real prefixes with their views.
    pub routes: Vec<RouteConfig>,
    /// Network isolation: only these remote (real) prefixes pass, in both directions.
    pub acl: Option<Vec<IpNet>>,
    /// Probe this peer when the interface enables the connectivity check (false for peers
    /// that are not kubetun gateways and never answer).
    pub conncheck: bool,
}

impl PeerConfig {
    /// A peer with no endpoint, routes or options.
    pub fn new(public_key: Key) -> Self {
        Self {
            public_key,
            name: String::new(),
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: 0,
            routes: Vec::new(),
            acl: None,
            conncheck: true,
        }
    }

    /// The name for logs and metrics: the configured name, else the base64 public key.
    pub fn display_name(&self) -> String {
        if self.name.is_empty() {
            self.public_key.to_base64()
        } else {
            self.name.clone()
        }
    }
}

/// The whole desired configuration of one gateway.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DesiredState {
    /// Opaque caller-chosen version, echoed in status.
    pub version: String,
    /// Interface settings.
    pub interface: InterfaceConfig,
    /// Peers, in the order given.
    pub peers: Vec<PeerConfig>,
    /// What each remote cluster may open towards this one; a cluster without an entry is
    /// open.
    pub admissions: Vec<AdmissionConfig>,
}

/// The most admissions one state may hold (a cluster is numbered in 16 bits on the data path).
pub const MAX_ADMISSIONS: usize = 65_534;

/// How much of this cluster a remote cluster's packets may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Isolation {
    /// Everything the remap table accepts (a gateway without admissions).
    #[default]
    Open,
    /// Only the admitted endpoints (and ICMP echo to their addresses), the replies of the
    /// flows this cluster opened, and the ICMP errors that belong to either.
    Exported,
}

impl Isolation {
    /// The snake_case name used in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Isolation::Open => "open",
            Isolation::Exported => "exported",
        }
    }
}

/// The transport protocol of an admitted endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The IP protocol number.
    pub const fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }
}

/// A local endpoint a remote cluster may open connections to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdmittedEndpoint {
    /// The local (real) address.
    pub address: IpAddr,
    pub protocol: Protocol,
    /// Never 0.
    pub port: u16,
}

/// The admission of one remote cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// The remote cluster's id (names its counters and status); unique, not empty.
    pub cluster: String,
    pub isolation: Isolation,
    /// Its addresses as this gateway sees them (views), canonical; never overlapping another
    /// cluster's.
    pub views: Vec<IpNet>,
    /// With [`Isolation::Exported`], what it may open; ignored when open.
    pub endpoints: Vec<AdmittedEndpoint>,
    /// With [`Isolation::Exported`], which of its pods may open which endpoints: an endpoint
    /// some policy names opens only to the sources of the policies naming it (none: to
    /// nobody); one no policy names, to every source of the cluster. Ignored when open.
    pub policies: Vec<SourcePolicy>,
}

/// Who of a remote cluster may open some of the endpoints admitted to it: the addresses (as
/// this gateway sees them, host addresses in the cluster's views) of the pods a policy
/// selects there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcePolicy {
    /// Names its counter (`namespace/name` of the policy); unique within the admission.
    pub name: String,
    /// Endpoints of the admission's `endpoints`.
    pub endpoints: Vec<AdmittedEndpoint>,
    /// The selected pods' addresses, each inside one of the admission's views.
    pub sources: Vec<IpAddr>,
}

impl DesiredState {
    /// Whether `peer` gets connectivity probes: the interface enables the check and the
    /// peer does not opt out. Such a peer is a kubetun gateway.
    pub fn probes(&self, peer: &PeerConfig) -> bool {
        peer.conncheck && self.interface.conncheck.is_some()
    }

    /// The interface public key, if a private key is set.
    pub fn public_key(&self) -> Option<Key> {
        self.interface.private_key.map(|k| k.public_key())
    }

    /// Checks the invariants the parsers cannot see one field at a time: unique peers, no peer
    /// with our own key, route shapes, canonical prefixes, unique views, MTU range.
    pub fn validate(&self) -> Result<(), StateError> {
        let mtu = self.interface.mtu;
        if !(MIN_MTU..=MAX_MTU).contains(&mtu) {
            return Err(StateError::OutOfRange {
                field: "interface mtu",
                value: u64::from(mtu),
                min: u64::from(MIN_MTU),
                max: u64::from(MAX_MTU),
            });
        }
        for prefix in &self.interface.local_prefixes {
            canonical("interface local_prefixes", *prefix)?;
        }
        if let Some(conncheck) = &self.interface.conncheck {
            validate_conncheck(conncheck)?;
        }
        let own = self.public_key();
        let previous = self.interface.previous_private_key.map(|k| k.public_key());
        let mut keys = HashSet::new();
        // Primary views are unique; each may have one fallback on another peer.
        let mut views: std::collections::HashMap<IpNet, (String, bool)> = Default::default();
        let mut fallbacks: std::collections::HashMap<IpNet, String> = Default::default();
        for peer in &self.peers {
            let name = peer.display_name();
            if !keys.insert(peer.public_key) {
                return Err(StateError::DuplicatePeer(name));
            }
            if Some(peer.public_key) == own || Some(peer.public_key) == previous {
                return Err(StateError::OwnKey(name));
            }
            for route in &peer.routes {
                let context = format!("peer {name}: route");
                canonical(&context, route.real)?;
                canonical(&context, route.view)?;
                let same_family = route.real.addr().is_ipv4() == route.view.addr().is_ipv4();
                if !same_family || route.real.prefix_len() != route.view.prefix_len() {
                    return Err(StateError::ViewShape {
                        peer: name,
                        real: route.real,
                        view: route.view,
                    });
                }
                if route.fallback {
                    if let Some(first) = fallbacks.insert(route.view, name.clone()) {
                        return Err(StateError::DuplicateFallback {
                            view: route.view,
                            first,
                            second: name,
                        });
                    }
                    continue;
                }
                let probed = self.probes(peer);
                if let Some((first, _)) = views.insert(route.view, (name.clone(), probed)) {
                    return Err(StateError::DuplicateView {
                        view: route.view,
                        first,
                        second: name,
                    });
                }
            }
            for prefix in peer.acl.iter().flatten() {
                canonical(&format!("peer {name}: acl"), *prefix)?;
            }
        }
        validate_admissions(&self.admissions)?;
        for (view, backup) in fallbacks {
            match views.get(&view) {
                Some((primary, _)) if *primary == backup => {
                    return Err(StateError::FallbackWithoutPrimary { peer: backup, view });
                }
                None => return Err(StateError::FallbackWithoutPrimary { peer: backup, view }),
                Some((primary, false)) => {
                    return Err(StateError::FallbackUnprobed {
                        view,
                        backup,
                        primary: primary.clone(),
                    });
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// Rejects unnamed or duplicate clusters, non-canonical views, views that overlap another
/// cluster's (a packet's source must name one cluster), and endpoints on port 0.
fn validate_admissions(admissions: &[AdmissionConfig]) -> Result<(), StateError> {
    if admissions.len() > MAX_ADMISSIONS {
        return Err(StateError::OutOfRange {
            field: "admissions",
            value: admissions.len() as u64,
            min: 0,
            max: MAX_ADMISSIONS as u64,
        });
    }
    let problem = |cluster: &str, problem: String| StateError::Admission {
        cluster: cluster.to_owned(),
        problem,
    };
    let mut names = HashSet::new();
    // Every view with its cluster, sorted by address then length: an overlap is a prefix
    // containing the next one of another cluster, or the one after it, so a sweep that
    // keeps the innermost open prefixes finds it.
    let mut views: Vec<(IpNet, &str)> = Vec::new();
    for (index, admission) in admissions.iter().enumerate() {
        let name = admission.cluster.as_str();
        if name.is_empty() {
            return Err(problem(
                &format!("#{index}"),
                "the cluster id is empty".into(),
            ));
        }
        if !names.insert(name) {
            return Err(problem(
                name,
                "a second admission for the same cluster".into(),
            ));
        }
        for view in &admission.views {
            canonical(&format!("admission {name}: view"), *view)?;
            views.push((*view, name));
        }
        for endpoint in &admission.endpoints {
            if endpoint.port == 0 {
                return Err(problem(
                    name,
                    format!(
                        "endpoint {} {:?}: port 0 (expected 1..=65535)",
                        endpoint.address, endpoint.protocol
                    ),
                ));
            }
        }
        validate_policies(admission).map_err(|p| problem(name, p))?;
    }
    views.sort_by_key(|(view, _)| (view.addr().is_ipv6(), view.network(), view.prefix_len()));
    // The prefixes containing the current one, outermost first.
    let mut open: Vec<(IpNet, &str)> = Vec::new();
    for (view, name) in views {
        while open.last().is_some_and(|(outer, _)| !outer.contains(&view)) {
            open.pop();
        }
        if let Some((outer, other)) = open.iter().find(|(_, other)| *other != name) {
            return Err(problem(
                name,
                format!("view {view} overlaps view {outer} of cluster {other}"),
            ));
        }
        open.push((view, name));
    }
    Ok(())
}

/// Rejects unnamed or duplicate policies, policies naming an endpoint the admission does not
/// admit, and sources outside the cluster's views (they could never be its packets).
fn validate_policies(admission: &AdmissionConfig) -> Result<(), String> {
    let admitted: HashSet<&AdmittedEndpoint> = admission.endpoints.iter().collect();
    let mut names = HashSet::new();
    for policy in &admission.policies {
        let name = policy.name.as_str();
        if name.is_empty() {
            return Err("a policy without a name".into());
        }
        if !names.insert(name) {
            return Err(format!("policy {name}: a second policy of that name"));
        }
        if let Some(e) = policy.endpoints.iter().find(|e| !admitted.contains(e)) {
            return Err(format!(
                "policy {name}: endpoint {} {:?} {} is not among the admitted endpoints",
                e.address, e.protocol, e.port
            ));
        }
        if let Some(source) = policy
            .sources
            .iter()
            .find(|source| !admission.views.iter().any(|view| view.contains(*source)))
        {
            return Err(format!(
                "policy {name}: source {source} is in none of the cluster's views"
            ));
        }
    }
    Ok(())
}

/// Rejects probe intervals and thresholds that make no sense: probes more often than every
/// 100 ms are load rather than a check, and a minute apart or 100 losses they detect nothing.
fn validate_conncheck(conncheck: &ConnCheckConfig) -> Result<(), StateError> {
    for (field, value) in [
        ("interface conncheck interval_ms", conncheck.interval_ms),
        (
            "interface conncheck fallback_interval_ms",
            conncheck.fallback_interval_ms,
        ),
    ] {
        if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&value) {
            return Err(StateError::OutOfRange {
                field,
                value: u64::from(value),
                min: u64::from(MIN_INTERVAL_MS),
                max: u64::from(MAX_INTERVAL_MS),
            });
        }
    }
    if !(1..=MAX_LOSS_THRESHOLD).contains(&conncheck.loss_threshold) {
        return Err(StateError::OutOfRange {
            field: "interface conncheck loss_threshold",
            value: u64::from(conncheck.loss_threshold),
            min: 1,
            max: u64::from(MAX_LOSS_THRESHOLD),
        });
    }
    Ok(())
}

/// Parses `addr/len`; a bare address is a host prefix.
pub fn parse_cidr(context: &str, text: &str) -> Result<IpNet, StateError> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| StateError::Cidr {
            context: context.to_owned(),
            value: text.to_owned(),
        })
}

fn canonical(context: &str, prefix: IpNet) -> Result<(), StateError> {
    let canonical = prefix.trunc();
    if canonical == prefix {
        Ok(())
    } else {
        Err(StateError::HostBits {
            context: context.to_owned(),
            value: prefix,
            canonical,
        })
    }
}
