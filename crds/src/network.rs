//! `Network` and `NetworkID`: isolated networks with a unique ID and mutual peerings.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cidr_list_schema;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// An isolated network. It gets a vacant ID from [`NetworkId`] objects; peerings with other
/// Networks that reference it back become Ready and their prefixes become the gateway ACL.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "net.kubetun.io",
    version = "v1alpha1",
    derive = "Default",
    kind = "Network",
    namespaced,
    status = "NetworkStatus",
    shortname = "knet",
    category = "kubetun",
    printcolumn = r#"{"name":"ID","type":"string","jsonPath":".status.id"}"#,
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterId"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(oldSelf.id) || (has(self.id) && self.id == oldSelf.id)").message("spec.id cannot change once set"))]
pub struct NetworkSpec {
    /// Requested ID (canonical decimal); absent to get any vacant one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[1-9][0-9]{0,7}$"))]
    pub id: Option<String>,
    /// The remote cluster this network lives in; absent for a local network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub cluster_id: Option<String>,
    /// Prefixes of this network.
    #[serde(default)]
    #[schemars(schema_with = "cidr_list_schema")]
    pub prefixes: Vec<String>,
    /// Networks this one peers with; a peering is Ready only when the other side references
    /// this network back. Names are unique (a list map keyed by name).
    #[serde(default)]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub peerings: Vec<NetworkPeering>,
}

/// One side of a peering.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPeering {
    /// Name of the peering (unique within the Network).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The peered Network.
    pub network_ref: NetworkRef,
    /// This network's prefixes exposed to the peer; empty exposes all of `spec.prefixes`.
    #[serde(default)]
    #[schemars(schema_with = "cidr_list_schema")]
    pub prefixes: Vec<String>,
}

/// Reference to a Network, optionally in another namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRef {
    /// Network name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace; defaults to the referencing Network's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

/// Lifecycle phase of a Network.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum NetworkPhase {
    /// Waiting for an ID.
    #[default]
    Pending,
    /// Has an ID.
    Available,
    /// No ID could be allocated; see conditions.
    Error,
}

/// State of one peering.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PeeringState {
    /// The other side does not (yet) reference this network, or is not Available.
    #[default]
    Pending,
    /// Both sides reference each other.
    Ready,
    /// The peering is invalid; see message.
    Error,
}

/// Observed state of one peering.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPeeringStatus {
    /// Name of the peering.
    pub name: String,
    /// Pending, Ready or Error.
    pub state: PeeringState,
    /// Why, when not Ready.
    #[serde(default)]
    pub message: String,
    /// The peer's prefixes this network may exchange traffic with (when Ready).
    #[serde(default)]
    pub prefixes: Vec<String>,
    /// UID of the peered Network when Ready (a recreated peer invalidates the peering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_uid: Option<String>,
}

/// Status of a [`Network`].
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatus {
    /// The allocated ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Pending, Available or Error.
    #[serde(default)]
    pub phase: NetworkPhase,
    /// Peerings, sorted by name.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub peerings: Vec<NetworkPeeringStatus>,
    /// The spec generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `IDAllocated`, `RangeExhausted`, ...
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A claimed network ID. Cluster-scoped; `metadata.name` is the canonical decimal ID, so
/// creating it is the lock (AlreadyExists means taken).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "net.kubetun.io",
    version = "v1alpha1",
    derive = "Default",
    kind = "NetworkID",
    // The Rust type keeps Rust casing; the kind follows Kubernetes (`UID`, `ClusterID`).
    root = "NetworkId",
    plural = "networkids",
    shortname = "nid",
    category = "kubetun",
    printcolumn = r#"{"name":"Network","type":"string","jsonPath":".spec.claimRef.name"}"#,
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.claimRef.namespace"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("self.metadata.name.matches('^[1-9][0-9]{0,7}$')").message("metadata.name must be a network ID in canonical decimal form")
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkIdSpec {
    /// The Network holding this ID; immutable (release deletes the object).
    #[x_kube(validation = Rule::new("self == oldSelf").message("claimRef is immutable"))]
    pub claim_ref: ClaimRef,
}

/// Reference to the claiming object, with its UID (a recreated object is a different claimer).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRef {
    /// API group of the claimer.
    pub group: String,
    /// Resource (plural) of the claimer.
    pub resource: String,
    /// Namespace of the claimer.
    pub namespace: String,
    /// Name of the claimer.
    pub name: String,
    /// UID of the claimer.
    #[schemars(length(min = 1))]
    pub uid: String,
}
