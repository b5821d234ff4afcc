//! `TunnelEndpoint`: one per peer, what the gateway is configured from.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{CidrMapping, ClusterRef, Endpoint, Isolation, optional_cidr_list_schema};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// A peer link, merged from our NetworkConfig (as processed by the peer) and the peer's
/// NetworkConfig (as processed by us).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "net.kubetun.io",
    version = "v1alpha1",
    derive = "Default",
    kind = "TunnelEndpoint",
    namespaced,
    status = "TunnelEndpointStatus",
    shortname = "te",
    category = "kubetun",
    printcolumn = r#"{"name":"Peer","type":"string","jsonPath":".spec.cluster.id"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.endpoint.address"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.connection.status"}"#,
    printcolumn = r#"{"name":"Latency","type":"string","jsonPath":".status.connection.latency"}"#,
    printcolumn = r#"{"name":"Via","type":"string","jsonPath":".status.connection.viaHub"}"#,
    printcolumn = r#"{"name":"Isolation","type":"string","jsonPath":".spec.isolation"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TunnelEndpointSpec {
    /// The remote cluster.
    pub cluster: ClusterRef,
    /// Our pod CIDRs (`real`) and how the peer sees them (`view`).
    pub local_pod_cidrs: Vec<CidrMapping>,
    /// Our external CIDRs and how the peer sees them.
    #[serde(default)]
    pub local_external_cidrs: Vec<CidrMapping>,
    /// The peer's pod CIDRs (`real`) and how we see them (`view`).
    pub remote_pod_cidrs: Vec<CidrMapping>,
    /// The peer's external CIDRs and how we see them.
    #[serde(default)]
    pub remote_external_cidrs: Vec<CidrMapping>,
    /// The peer gateway's endpoint.
    pub endpoint: Endpoint,
    /// The peer gateway's WireGuard public key (base64).
    #[schemars(length(min = 44, max = 44))]
    pub public_key: String,
    /// Tunnel MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Network isolation: remote (real) prefixes this link may carry, from ready `Network`
    /// peerings. Absent: no ACL; empty: nothing passes (fail closed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_cidr_list_schema")]
    pub allowed_prefixes: Option<Vec<String>>,
    /// The path through a hub while the direct tunnel is down: the peer's CIDRs as the hub
    /// sees them (`real`, on the wire to the hub) and as we see them (`view`, the same views
    /// as over the direct tunnel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<TunnelFallback>,
    /// No tunnel to the peer: `fallback` is its only path, and its routes are ordinary
    /// routes on the hub's peer (`endpoint` and `publicKey` are not used).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hub_only: bool,
    /// This cluster is a hub that forwards between this peer and others (a ShortcutConnection
    /// allows transit): its gateway accepts this peer's views as sources.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transit: bool,
    /// How this cluster's gateway admits the peer's packets: `open`, or `exported` (only the
    /// endpoints of the Services exported to the peer, and replies).
    #[serde(default)]
    pub isolation: Isolation,
}

impl TunnelEndpointSpec {
    /// The name of the gateway peer whose tunnel carries this peer's traffic (gateway peers
    /// are named by cluster id): its hub's for a hub-only peer, else its own.
    pub fn tunnel_peer(&self) -> &str {
        match &self.fallback {
            Some(fallback) if self.hub_only => &fallback.hub.id,
            _ => &self.cluster.id,
        }
    }
}

/// The fallback path of a TunnelEndpoint.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TunnelFallback {
    /// The hub, a peer with its own TunnelEndpoint.
    pub hub: ClusterRef,
    /// The peer's CIDRs at the hub (`real`) and here (`view`).
    pub routes: Vec<CidrMapping>,
}

/// Connection state of a tunnel.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConnectionState {
    /// A recent handshake; traffic flows.
    Connected,
    /// Waiting for the first handshake.
    #[default]
    Connecting,
    /// No connectivity towards the remote cluster.
    Error,
}

impl std::fmt::Display for ConnectionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Connected => "Connected",
            Self::Connecting => "Connecting",
            Self::Error => "Error",
        })
    }
}

/// Runtime state of the tunnel as the gateway reports it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionStatus {
    /// Connected, Connecting or Error.
    pub status: ConnectionState,
    /// Why, in words a person can act on.
    #[serde(default)]
    pub message: String,
    /// Round-trip latency, human readable (e.g. "1.2ms").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<String>,
    /// Round-trip latency in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<u64>,
    /// RFC 3339 time of the last completed handshake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handshake: Option<String>,
    /// Bytes received from the peer.
    #[serde(default)]
    pub rx_bytes: u64,
    /// Bytes sent to the peer.
    #[serde(default)]
    pub tx_bytes: u64,
    /// The endpoint the gateway currently uses (may be a learned roaming address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The gateway's connectivity check of this peer; absent when it does not run one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<ProbeStatus>,
    /// During a key rotation of this cluster: the tunnel still uses the previous key (the
    /// peer has not completed a handshake with the new one yet).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub previous_key: bool,
    /// With a fallback path: the hub that carries this peer's traffic now (the direct tunnel
    /// is down); absent while it goes direct.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via_hub: Option<String>,
    /// With a fallback path: RFC 3339 time of the last switch between direct and the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_changed: Option<String>,
    /// With a fallback path: switches between direct and the hub so far.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub path_switches: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The gateway's connectivity check of a peer: probes sent through the tunnel every
/// `intervalMs`, answered by the peer's gateway; `lossThreshold` unanswered in a row make the
/// connection `Error`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeStatus {
    /// Milliseconds between probes.
    pub interval_ms: u32,
    /// Unanswered probes in a row that make the connection `Error`.
    pub loss_threshold: u32,
    /// Probes unanswered since the last reply.
    #[serde(default)]
    pub consecutive_losses: u32,
    /// RFC 3339 time of the last reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reply: Option<String>,
    /// Probes sent.
    #[serde(default)]
    pub sent: u64,
    /// Probes not answered within their interval.
    #[serde(default)]
    pub lost: u64,
}

/// Status of a [`TunnelEndpoint`].
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TunnelEndpointStatus {
    /// The gateway's view of the tunnel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<ConnectionStatus>,
    /// The spec generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Applied` (pushed to the gateway), `Connected`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}
