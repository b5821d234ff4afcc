//! The pure "custom resources -> gateway state" planner: no IO, no clock.
//!
//! - [`process_network_config`]: a peer's NetworkConfig -> how this cluster sees its CIDRs
//!   (IPAM), what the receiver writes into the `from-` NetworkConfig's status.
//! - [`tunnel_endpoint_spec`]: our processed `to-` NetworkConfig + the peer's processed
//!   `from-` NetworkConfig -> the TunnelEndpoint of that peer.
//! - [`desired_state_with`]: every TunnelEndpoint and this cluster's exports -> the gateway's
//!   whole desired state (peers, routes and [`admission`]s), in a deterministic order,
//!   versioned by a hash of its content ([`desired_state`]: with no exports).
//!
//! Isolation: a link's setting is what *this* cluster wrote into its `to-` NetworkConfig
//! (its admin with `kubetun network connect`, or the hub's ShortcutConnection operator for
//! the link), else the cluster default ([`GatewaySettings::isolation`]). The peer's
//! `from-` NetworkConfig (a copy of what the peer sends) is never read for it: a peer holds no
//! credential to write into this cluster (its services credential reads ExportedServices
//! only, and the connector copies the peer's spec into `from-` only), so nothing the peer
//! writes can widen what this cluster's gateway admits from it.
//!
//! Naming conventions shared with the connector live here too ([`local_config_name`],
//! [`remote_config_name`]); the labels are in `kubetun_crds::contract::link`.

use std::str::FromStr;

use ipnet::IpNet;
use kubetun_crds::contract::link::{PEER_LABEL, TRANSIT_ANNOTATION_PREFIX};
use kubetun_crds::{
    CidrMapping, FallbackPath, Isolation, NetworkConfig, NetworkConfigSpec, NetworkConfigStatus,
    TunnelEndpointSpec, TunnelFallback,
};
use prost::Message as _;

use crate::gateway_api::{self, DesiredState};
use crate::ipam::{Ipam, IpamError};
use crate::keys::{GatewayKey, KeyError, parse_public_key};

pub mod admission;
mod digest;
pub mod endpoints;
pub mod policy;

pub use admission::link_isolation;
pub use endpoints::{ExportEndpoints, PolicyPlan};

/// The annotation of one transit grant (see [`TRANSIT_ANNOTATION_PREFIX`]).
pub fn transit_annotation(grant: &str) -> String {
    format!("{TRANSIT_ANNOTATION_PREFIX}{grant}")
}

/// Whether a `from-` NetworkConfig carries a transit grant.
pub fn allows_transit(config: &NetworkConfig) -> bool {
    config
        .metadata
        .annotations
        .iter()
        .flatten()
        .any(|(key, value)| key.starts_with(TRANSIT_ANNOTATION_PREFIX) && value == "true")
}

/// Name of the NetworkConfig this cluster sends to `peer_id` (its status mirrors the peer's
/// processing).
pub fn local_config_name(peer_id: &str) -> String {
    format!("to-{peer_id}")
}

/// Name of the NetworkConfig `peer_id` sent to this cluster.
pub fn remote_config_name(peer_id: &str) -> String {
    format!("from-{peer_id}")
}

/// Why a NetworkConfig cannot be processed or turned into a TunnelEndpoint. Every message
/// names the offending field and value so a person can fix it.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A CIDR does not parse or has host bits set.
    #[error("spec.{field} entry {cidr:?} is not a valid CIDR: {reason}")]
    InvalidCidr {
        /// `podCIDRs` or `externalCIDRs`.
        field: &'static str,
        /// The offending value.
        cidr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The peer announces no pod CIDR.
    #[error("spec.podCIDRs is empty: the peer must announce at least one pod CIDR")]
    NoPodCidr,
    /// The fallback path does not fit the peer's CIDRs.
    #[error("spec.fallback: {0}")]
    InvalidFallback(String),
    /// The public key is malformed.
    #[error("spec.publicKey: {0}")]
    InvalidPublicKey(#[source] KeyError),
    /// The NetworkConfig is addressed to another cluster.
    #[error(
        "spec.destinationCluster.id is {got:?} but this cluster is {expected:?}: the NetworkConfig was \
         created in the wrong cluster"
    )]
    WrongDestination {
        /// This cluster's id.
        expected: String,
        /// The destination in the spec.
        got: String,
    },
    /// Labels and spec disagree about the sender.
    #[error("label {PEER_LABEL}={label:?} does not match spec.sourceCluster.id {source_id:?}")]
    InvalidSource {
        /// The peer label.
        label: String,
        /// The source in the spec.
        source_id: String,
    },
    /// A peer's NetworkConfig is not named after its sender.
    #[error("a NetworkConfig from {source_id:?} must be named {expected:?}, not {name:?}")]
    Misnamed {
        /// The object's name.
        name: String,
        /// The name it must have.
        expected: String,
        /// The source in the spec.
        source_id: String,
    },
    /// IPAM could not map or restore a CIDR.
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// One of the two NetworkConfigs has not been processed for its current spec.
    #[error("NetworkConfig {name} is not processed yet ({why})")]
    NotProcessed {
        /// Which NetworkConfig.
        name: String,
        /// What is missing.
        why: &'static str,
    },
}

impl PlanError {
    /// The condition reason for this error.
    pub fn reason(&self) -> &'static str {
        use kubetun_crds::contract::link::reason;
        match self {
            Self::InvalidCidr { .. } => reason::INVALID_CIDR,
            Self::NoPodCidr | Self::NotProcessed { .. } | Self::InvalidFallback(_) => {
                reason::INVALID_SPEC
            }
            Self::InvalidPublicKey(_) => reason::INVALID_PUBLIC_KEY,
            Self::WrongDestination { .. } => reason::WRONG_DESTINATION,
            Self::InvalidSource { .. } | Self::Misnamed { .. } => reason::INVALID_SOURCE,
            Self::Ipam(IpamError::PoolExhausted { .. }) => reason::POOL_EXHAUSTED,
            Self::Ipam(IpamError::RestoreConflict { .. }) => reason::INVALID_SPEC,
        }
    }
}

/// How this cluster sees a peer's CIDRs, in the order the peer announced them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerView {
    /// The peer's pod CIDRs and their views.
    pub pod_cidrs: Vec<CidrMapping>,
    /// The peer's external CIDRs and their views.
    pub external_cidrs: Vec<CidrMapping>,
}

/// Parses a CIDR strictly: host bits must be zero.
pub fn parse_cidr(field: &'static str, cidr: &str) -> Result<IpNet, PlanError> {
    let invalid = |reason: String| PlanError::InvalidCidr {
        field,
        cidr: cidr.to_owned(),
        reason,
    };
    let net = IpNet::from_str(cidr.trim()).map_err(|e| invalid(e.to_string()))?;
    if net != net.trunc() {
        return Err(invalid(format!(
            "host bits are set, did you mean {}?",
            net.trunc()
        )));
    }
    Ok(net)
}

fn parse_cidrs(field: &'static str, cidrs: &[String]) -> Result<Vec<IpNet>, PlanError> {
    cidrs.iter().map(|c| parse_cidr(field, c)).collect()
}

/// Checks that a peer's NetworkConfig named `name` is addressed to `local_cluster_id`, is
/// named after its sender and, when the peer label is known, that the label names the sender.
pub fn check_addressing(
    name: &str,
    spec: &NetworkConfigSpec,
    local_cluster_id: &str,
    peer_label: Option<&str>,
) -> Result<(), PlanError> {
    let expected = remote_config_name(&spec.source_cluster.id);
    if name != expected {
        return Err(PlanError::Misnamed {
            name: name.to_owned(),
            expected,
            source_id: spec.source_cluster.id.clone(),
        });
    }
    if spec.destination_cluster.id != local_cluster_id {
        return Err(PlanError::WrongDestination {
            expected: local_cluster_id.to_owned(),
            got: spec.destination_cluster.id.clone(),
        });
    }
    match peer_label {
        Some(label) if label != spec.source_cluster.id => Err(PlanError::InvalidSource {
            label: label.to_owned(),
            source_id: spec.source_cluster.id.clone(),
        }),
        _ => Ok(()),
    }
}

/// Maps a peer's CIDRs (owner: `spec.sourceCluster.id`). Idempotent; prefixes the peer no
/// longer announces are released. On error nothing new stays allocated.
pub fn process_network_config(
    ipam: &mut Ipam,
    spec: &NetworkConfigSpec,
) -> Result<PeerView, PlanError> {
    let owner = spec.source_cluster.id.as_str();
    parse_public_key(&spec.public_key).map_err(PlanError::InvalidPublicKey)?;
    if spec.pod_cidrs.is_empty() {
        return Err(PlanError::NoPodCidr);
    }
    let pods = parse_cidrs("podCIDRs", &spec.pod_cidrs)?;
    let externals = parse_cidrs("externalCIDRs", &spec.external_cidrs)?;
    let announced: Vec<IpNet> = pods.iter().chain(&externals).copied().collect();
    ipam.release_except(owner, &announced);

    let mut added = Vec::new();
    let mut map_all = |reals: &[IpNet]| -> Result<Vec<CidrMapping>, IpamError> {
        reals
            .iter()
            .map(|real| {
                let existed = ipam.view_of(owner, *real).is_some();
                let view = ipam.map(owner, *real)?;
                if !existed {
                    added.push(*real);
                }
                Ok(CidrMapping {
                    real: real.to_string(),
                    view: view.to_string(),
                })
            })
            .collect()
    };
    let result = map_all(&pods).and_then(|pod_cidrs| {
        map_all(&externals).map(|external_cidrs| PeerView {
            pod_cidrs,
            external_cidrs,
        })
    });
    match result {
        Ok(view) => Ok(view),
        Err(e) => {
            let kept: Vec<IpNet> = announced
                .iter()
                .filter(|r| !added.contains(r))
                .copied()
                .collect();
            ipam.release_except(owner, &kept);
            Err(e.into())
        }
    }
}

/// Re-registers the views recorded in a processed `from-` NetworkConfig's status, so that a
/// restarted controller gives the peer the same views. Statuses that do not describe the
/// current spec are skipped (the peer is processed again).
pub fn restore_from_status(
    ipam: &mut Ipam,
    spec: &NetworkConfigSpec,
    status: &NetworkConfigStatus,
) -> Result<bool, PlanError> {
    if !status.processed || !status_matches_spec(spec, status) {
        return Ok(false);
    }
    let owner = spec.source_cluster.id.as_str();
    for (field, mapping) in status
        .pod_cidrs
        .iter()
        .map(|m| ("status.podCIDRs", m))
        .chain(
            status
                .external_cidrs
                .iter()
                .map(|m| ("status.externalCIDRs", m)),
        )
    {
        let real = parse_cidr(field, &mapping.real)?;
        let view = parse_cidr(field, &mapping.view)?;
        ipam.restore(owner, real, view)?;
    }
    Ok(true)
}

/// True when the status maps exactly the CIDRs the spec announces, in order.
pub fn status_matches_spec(spec: &NetworkConfigSpec, status: &NetworkConfigStatus) -> bool {
    fn same(reals: &[String], mappings: &[CidrMapping]) -> bool {
        reals.len() == mappings.len()
            && reals.iter().zip(mappings).all(|(r, m)| {
                match (IpNet::from_str(r.trim()), IpNet::from_str(&m.real)) {
                    (Ok(a), Ok(b)) => a.trunc() == b.trunc(),
                    _ => false,
                }
            })
    }
    same(&spec.pod_cidrs, &status.pod_cidrs) && same(&spec.external_cidrs, &status.external_cidrs)
}

fn processed_status<'a>(
    config: &'a NetworkConfig,
    why: &'static str,
) -> Result<&'a NetworkConfigStatus, PlanError> {
    let not_processed = || PlanError::NotProcessed {
        name: config.metadata.name.clone().unwrap_or_default(),
        why,
    };
    let status = config
        .status
        .as_ref()
        .filter(|s| s.processed)
        .ok_or_else(not_processed)?;
    if status_matches_spec(&config.spec, status) {
        Ok(status)
    } else {
        Err(not_processed())
    }
}

/// The TunnelEndpoint of the peer `remote` comes from. `local` is our `to-` NetworkConfig
/// whose status says how the peer sees us; `remote` is the peer's `from-` NetworkConfig whose
/// status says how we see the peer. `allowed_prefixes` is left to the caller (Network ACL).
/// The isolation is `local`'s, else `open` (see [`tunnel_endpoint_spec_with`]).
pub fn tunnel_endpoint_spec(
    local: &NetworkConfig,
    remote: &NetworkConfig,
) -> Result<TunnelEndpointSpec, PlanError> {
    tunnel_endpoint_spec_with(local, remote, Isolation::Open)
}

/// [`tunnel_endpoint_spec`] with the cluster's default isolation: the TunnelEndpoint's
/// isolation is `local`'s own setting (ours, never the peer's `remote`), else
/// `default_isolation`.
pub fn tunnel_endpoint_spec_with(
    local: &NetworkConfig,
    remote: &NetworkConfig,
    default_isolation: Isolation,
) -> Result<TunnelEndpointSpec, PlanError> {
    let ours = processed_status(local, "the peer has not mapped our CIDRs yet")?;
    let theirs = processed_status(remote, "this cluster has not mapped the peer's CIDRs yet")?;
    parse_public_key(&remote.spec.public_key).map_err(PlanError::InvalidPublicKey)?;
    let mtu = match (local.spec.mtu, remote.spec.mtu) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let transit = allows_transit(remote);
    Ok(TunnelEndpointSpec {
        cluster: remote.spec.source_cluster.clone(),
        local_pod_cidrs: ours.pod_cidrs.clone(),
        local_external_cidrs: ours.external_cidrs.clone(),
        remote_pod_cidrs: theirs.pod_cidrs.clone(),
        remote_external_cidrs: theirs.external_cidrs.clone(),
        endpoint: remote.spec.endpoint.clone(),
        public_key: remote.spec.public_key.clone(),
        mtu,
        allowed_prefixes: None,
        fallback: match &remote.spec.fallback {
            Some(path) => Some(fallback_routes(path, theirs)?),
            None if remote.spec.hub_only => {
                return Err(PlanError::InvalidFallback(
                    "hubOnly needs a fallback: the hub path is the only one".to_owned(),
                ));
            }
            None => None,
        },
        hub_only: remote.spec.hub_only,
        transit,
        isolation: link_isolation(local.spec.isolation, default_isolation),
    })
}

/// The fallback path's routes: the peer's CIDRs as the hub sees them (in the order of the
/// spec's CIDRs, which the status follows) to the views this cluster gave them.
fn fallback_routes(
    path: &FallbackPath,
    theirs: &NetworkConfigStatus,
) -> Result<TunnelFallback, PlanError> {
    let invalid = |why: String| PlanError::InvalidFallback(why);
    if path.pod_cidrs.len() != theirs.pod_cidrs.len()
        || path.external_cidrs.len() != theirs.external_cidrs.len()
    {
        return Err(invalid(format!(
            "{} pod and {} external CIDRs at the hub for {} and {} here",
            path.pod_cidrs.len(),
            path.external_cidrs.len(),
            theirs.pod_cidrs.len(),
            theirs.external_cidrs.len()
        )));
    }
    let routes = path
        .pod_cidrs
        .iter()
        .zip(&theirs.pod_cidrs)
        .chain(path.external_cidrs.iter().zip(&theirs.external_cidrs))
        .map(|(at_hub, here)| {
            let hub = IpNet::from_str(at_hub.trim())
                .map_err(|_| invalid(format!("{at_hub:?} is not a CIDR")))?
                .trunc();
            let view = IpNet::from_str(&here.view)
                .map_err(|_| invalid(format!("view {:?} is not a CIDR", here.view)))?;
            if hub.prefix_len() != view.prefix_len()
                || hub.addr().is_ipv4() != view.addr().is_ipv4()
            {
                return Err(invalid(format!(
                    "{hub} at the hub and view {view} differ in family or length"
                )));
            }
            Ok(CidrMapping {
                real: hub.to_string(),
                view: view.to_string(),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(TunnelFallback {
        hub: path.hub.clone(),
        routes,
    })
}

/// Milliseconds between the gateway's connectivity probes to each peer (every peer of a
/// TunnelEndpoint is a kubetun gateway, which answers them).
pub const CONNCHECK_INTERVAL_MS: u32 = 2000;
/// Consecutive unanswered probes after which the gateway reports a peer unreachable.
pub const CONNCHECK_LOSS_THRESHOLD: u32 = 5;
/// Milliseconds between probes of a peer whose traffic a hub takes over when it is
/// unreachable (a shortcut with transit): five losses then move it within about a second.
pub const CONNCHECK_FALLBACK_INTERVAL_MS: u32 = 200;

fn nonzero_or(value: u32, default: u32) -> u32 {
    if value == 0 { default } else { value }
}

/// Interface settings of the local gateway. `Debug` never prints the private key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct GatewaySettings {
    /// Base64 private key (sent to the gateway only).
    pub private_key: String,
    /// Base64 public key of `private_key`; what the version hash covers instead of it.
    pub public_key: String,
    /// During a key rotation, the base64 private key used before `private_key` (empty: none);
    /// sent to the gateway only.
    pub previous_private_key: String,
    /// Base64 public key of `previous_private_key` (empty: none).
    pub previous_public_key: String,
    /// UDP listen port.
    pub listen_port: u32,
    /// Tunnel MTU.
    pub mtu: u32,
    /// Addresses of the TUN device.
    pub addresses: Vec<String>,
    /// Local pod, service and external prefixes allowed to reach peers.
    pub local_prefixes: Vec<String>,
    /// Whether the gateway installs routes for the views.
    pub manage_routes: bool,
    /// Persistent keepalive for every peer, seconds (0: off).
    pub persistent_keepalive: u32,
    /// Milliseconds between connectivity probes (0: [`CONNCHECK_INTERVAL_MS`]).
    pub conncheck_interval_ms: u32,
    /// Unanswered probes before a peer is unreachable (0: [`CONNCHECK_LOSS_THRESHOLD`]).
    pub conncheck_loss_threshold: u32,
    /// Milliseconds between probes of a peer with a fallback through a hub (0:
    /// [`CONNCHECK_FALLBACK_INTERVAL_MS`]).
    pub conncheck_fallback_interval_ms: u32,
    /// The cluster default isolation: how the gateway admits a linked cluster whose link sets
    /// none (`--isolation`, `KUBETUN_ISOLATION`; absent: `open`).
    pub isolation: Isolation,
}

impl GatewaySettings {
    /// Sets the four key fields: `current`, and `previous` during a rotation (else empty).
    pub fn set_keys(&mut self, current: &GatewayKey, previous: Option<&GatewayKey>) {
        self.private_key = current.private_base64();
        self.public_key = current.public_base64().to_owned();
        self.previous_private_key = previous.map(GatewayKey::private_base64).unwrap_or_default();
        self.previous_public_key = previous
            .map(|k| k.public_base64().to_owned())
            .unwrap_or_default();
    }
}

impl std::fmt::Debug for GatewaySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewaySettings")
            .field("public_key", &self.public_key)
            .field("previous_public_key", &self.previous_public_key)
            .field("listen_port", &self.listen_port)
            .field("mtu", &self.mtu)
            .field("addresses", &self.addresses)
            .field("local_prefixes", &self.local_prefixes)
            .field("manage_routes", &self.manage_routes)
            .field("persistent_keepalive", &self.persistent_keepalive)
            .field("conncheck_interval_ms", &self.conncheck_interval_ms)
            .field("conncheck_loss_threshold", &self.conncheck_loss_threshold)
            .field(
                "conncheck_fallback_interval_ms",
                &self.conncheck_fallback_interval_ms,
            )
            .field("isolation", &self.isolation)
            .finish_non_exhaustive()
    }
}

/// [`desired_state_with`] for a cluster that exports nothing: a peer in `exported` mode may
/// open no connection.
pub fn desired_state(settings: &GatewaySettings, endpoints: &[TunnelEndpointSpec]) -> DesiredState {
    desired_state_with(settings, endpoints, &[], &admission::Answers::new())
}

/// The gateway's whole desired state: one peer per TunnelEndpoint (sorted by cluster id) but
/// the hub-only ones, its routes real -> view (pod CIDRs first, then external, then the
/// fallback and hub-only routes of the peers it is the hub of), and its ACL; one admission per
/// TunnelEndpoint (sorted likewise), whose `exported` endpoints are those of the `exports`
/// offered to its cluster, guarded by their policies with the sources of the cluster's
/// `answers` ([`policy`]). The version is a hash of everything but the private keys (their
/// public keys stand in for them), admissions included.
pub fn desired_state_with(
    settings: &GatewaySettings,
    endpoints: &[TunnelEndpointSpec],
    exports: &[ExportEndpoints],
    answers: &admission::Answers,
) -> DesiredState {
    let mut sorted: Vec<&TunnelEndpointSpec> = endpoints.iter().collect();
    sorted.sort_by(|a, b| a.cluster.id.cmp(&b.cluster.id));
    let route = |m: &CidrMapping, fallback: bool| gateway_api::Route {
        real: m.real.clone(),
        view: m.view.clone(),
        fallback,
    };
    let mut peers: Vec<gateway_api::Peer> = sorted
        .iter()
        .filter(|te| !te.hub_only)
        .map(|te| gateway_api::Peer {
            public_key: te.public_key.clone(),
            name: te.cluster.id.clone(),
            preshared_key: String::new(),
            endpoint: te.endpoint.to_string(),
            persistent_keepalive: settings.persistent_keepalive,
            routes: te
                .remote_pod_cidrs
                .iter()
                .chain(&te.remote_external_cidrs)
                .map(|m| route(m, false))
                .collect(),
            acl: te
                .allowed_prefixes
                .as_ref()
                .map(|allowed| gateway_api::Acl {
                    allowed: allowed.clone(),
                }),
            conncheck_disabled: false,
        })
        .collect();
    // A peer's fallback path is a set of routes on its hub's peer, at the same views; for a
    // peer reached only through the hub they are ordinary routes.
    for te in &sorted {
        let Some(fallback) = &te.fallback else {
            continue;
        };
        if let Some(hub) = peers.iter_mut().find(|p| p.name == fallback.hub.id) {
            hub.routes
                .extend(fallback.routes.iter().map(|m| route(m, !te.hub_only)));
        }
    }
    // A hub forwards between leaves that allow transit: their views are sources it sends.
    let mut local_prefixes = settings.local_prefixes.clone();
    for te in sorted.iter().filter(|te| te.transit) {
        local_prefixes.extend(
            te.remote_pod_cidrs
                .iter()
                .chain(&te.remote_external_cidrs)
                .map(|m| m.view.clone()),
        );
    }
    let mut state = DesiredState {
        version: String::new(),
        interface: Some(gateway_api::Interface {
            private_key: settings.public_key.clone(),
            previous_private_key: settings.previous_public_key.clone(),
            listen_port: settings.listen_port,
            fwmark: 0,
            mtu: settings.mtu,
            addresses: settings.addresses.clone(),
            local_prefixes,
            manage_routes: settings.manage_routes,
            conncheck: Some(gateway_api::ConnCheck {
                interval_ms: nonzero_or(settings.conncheck_interval_ms, CONNCHECK_INTERVAL_MS),
                loss_threshold: nonzero_or(
                    settings.conncheck_loss_threshold,
                    CONNCHECK_LOSS_THRESHOLD,
                ),
                fallback_interval_ms: nonzero_or(
                    settings.conncheck_fallback_interval_ms,
                    CONNCHECK_FALLBACK_INTERVAL_MS,
                ),
            }),
        }),
        peers,
        admissions: admission::admissions(&sorted, exports, answers).0,
    };
    state.version = content_hash(&state);
    if let Some(interface) = state.interface.as_mut() {
        interface.private_key.clone_from(&settings.private_key);
        interface
            .previous_private_key
            .clone_from(&settings.previous_private_key);
    }
    state
}

/// A version for a hand-written state: the hash of its content without the private key
/// (a version is echoed in statuses and must not depend on secrets).
pub fn version_of(state: &DesiredState) -> String {
    let mut state = state.clone();
    state.version.clear();
    if let Some(interface) = state.interface.as_mut() {
        interface.private_key.clear();
        interface.previous_private_key.clear();
    }
    content_hash(&state)
}

fn content_hash(state: &DesiredState) -> String {
    format!("{:016x}", digest::fnv1a64(&state.encode_to_vec()))
}

#[cfg(test)]
mod tests;
