//! `NetworkConfig`: what one cluster tells a peer about itself.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{CidrMapping, ClusterRef, Endpoint, Isolation, cidr_list_schema};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// The sender's CIDRs, endpoint and public key, addressed to one destination cluster.
///
/// The sender creates it in the destination cluster; the destination processes it (IPAM
/// remaps overlapping CIDRs) and records in the status how it sees the sender.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "net.kubetun.io",
    version = "v1alpha1",
    derive = "Default",
    kind = "NetworkConfig",
    namespaced,
    status = "NetworkConfigStatus",
    shortname = "nc",
    category = "kubetun",
    printcolumn = r#"{"name":"Source","type":"string","jsonPath":".spec.sourceCluster.id"}"#,
    printcolumn = r#"{"name":"Destination","type":"string","jsonPath":".spec.destinationCluster.id"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.endpoint.address"}"#,
    printcolumn = r#"{"name":"Processed","type":"boolean","jsonPath":".status.processed"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.hubOnly) || !self.hubOnly || has(self.fallback)").message("hubOnly needs fallback: the hub path is the only one"))]
pub struct NetworkConfigSpec {
    /// The cluster that wrote this NetworkConfig.
    pub source_cluster: ClusterRef,
    /// The cluster this NetworkConfig is addressed to.
    pub destination_cluster: ClusterRef,
    /// The sender's pod CIDRs.
    #[schemars(schema_with = "cidr_list_schema")]
    pub pod_cidrs: Vec<String>,
    /// The sender's external CIDRs (addresses of non-pod endpoints reachable through it).
    #[serde(default)]
    #[schemars(schema_with = "cidr_list_schema")]
    pub external_cidrs: Vec<String>,
    /// The sender's gateway endpoint.
    pub endpoint: Endpoint,
    /// The sender gateway's WireGuard public key (base64). Never a private key.
    #[schemars(length(min = 44, max = 44))]
    pub public_key: String,
    /// Tunnel MTU the sender uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1280, max = 9000))]
    pub mtu: Option<u32>,
    /// A second path to the sender through a hub, written by the hub's ShortcutConnection
    /// operator when the shortcut allows transit: the receiver's gateway sends through the hub
    /// while the direct tunnel is down, at the same views.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackPath>,
    /// The receiver makes no tunnel to the sender: `fallback`'s hub is the only path (a
    /// ShortcutConnection with `hubOnly`). `endpoint` and `publicKey` still name the sender's
    /// gateway, for when a shortcut is added.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hub_only: bool,
    /// How the sender's gateway admits the destination's packets (`open` or `exported`);
    /// absent: the sender's cluster default. The sender enforces its own setting, read from
    /// what it wrote itself; the destination's copy only informs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
}

/// How the sender is reached through a hub.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FallbackPath {
    /// The hub, a peer of the receiver.
    pub hub: ClusterRef,
    /// The sender's pod CIDRs as the hub sees them, in the order of `podCIDRs`: the addresses
    /// on the wire between the receiver and the hub.
    #[schemars(schema_with = "cidr_list_schema")]
    pub pod_cidrs: Vec<String>,
    /// The sender's external CIDRs as the hub sees them, in the order of `externalCIDRs`.
    #[serde(default)]
    #[schemars(schema_with = "cidr_list_schema")]
    pub external_cidrs: Vec<String>,
}

/// Written by the receiving cluster.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfigStatus {
    /// True once the receiver has processed the spec (CIDRs mapped).
    #[serde(default)]
    pub processed: bool,
    /// How the receiver sees each of the sender's pod CIDRs.
    #[serde(default)]
    pub pod_cidrs: Vec<CidrMapping>,
    /// How the receiver sees each of the sender's external CIDRs.
    #[serde(default)]
    pub external_cidrs: Vec<CidrMapping>,
    /// The spec generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Processed` (and error reasons such as `InvalidCIDR`, `PoolExhausted`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}
