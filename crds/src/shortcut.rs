//! `ShortcutConnection`: a direct leaf-to-leaf link, managed from the hub.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tunnelendpoint::ConnectionState;
use crate::{CidrMapping, Endpoint, Isolation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Links two leaf clusters directly; the hub's operator runs the same exchange as
/// `kubetun network connect` between them.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "net.kubetun.io",
    version = "v1alpha1",
    derive = "Default",
    kind = "ShortcutConnection",
    namespaced,
    status = "ShortcutConnectionStatus",
    // Not `sc`: that is StorageClass (a test checks every short name against discovery).
    shortname = "ksc",
    category = "kubetun",
    printcolumn = r#"{"name":"Left","type":"string","jsonPath":".spec.left.name"}"#,
    printcolumn = r#"{"name":"Right","type":"string","jsonPath":".spec.right.name"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.hubOnly) || !self.hubOnly || (has(self.transit) && self.transit)").message("hubOnly needs transit: the hub forwards between leaves only where transit allows it"))]
pub struct ShortcutConnectionSpec {
    /// One leaf.
    pub left: LeafCluster,
    /// The other leaf.
    pub right: LeafCluster,
    /// Tunnel MTU for the link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1280, max = 9000))]
    pub mtu: Option<u32>,
    /// Let the hub carry the pair's traffic while the shortcut is down (its connectivity
    /// check): each leaf gets the other as a fallback through the hub, at the same views.
    /// Both leaves must be linked to the hub. Off by default: the hub forwards between
    /// leaves only where a ShortcutConnection says so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transit: bool,
    /// No tunnel between the leaves: each reaches the other only through the hub, at the
    /// addresses a shortcut would give (switching to a shortcut later changes none). Needs
    /// `transit`. Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hub_only: bool,
    /// How each leaf's gateway admits the other leaf's packets, over the shortcut and through
    /// the hub alike; absent: each leaf's cluster default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
}

impl ShortcutConnectionSpec {
    /// How the leaves reach each other, as `kubetun shortcut list` says it: `direct` (their
    /// own tunnel), `direct+hub` (the hub while that tunnel is down) or `hub-only`.
    pub fn paths(&self) -> &'static str {
        match (self.transit, self.hub_only) {
            (_, true) => "hub-only",
            (true, false) => "direct+hub",
            (false, false) => "direct",
        }
    }
}

/// How the hub reaches one leaf cluster.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeafCluster {
    /// Name of the leaf (shown in status and tables).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Secret (in the ShortcutConnection's namespace) holding the leaf's kubeconfig.
    pub kubeconfig_secret: SecretKeyRef,
    /// Namespace on the leaf where kubetun's resources live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Overrides the endpoint the leaf's gateway announces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_override: Option<Endpoint>,
}

/// A key of a Secret.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Secret name.
    pub name: String,
    /// Key inside the Secret; defaults to `kubeconfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Lifecycle phase of a shortcut.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ShortcutPhase {
    /// Exchange in progress.
    #[default]
    Pending,
    /// Both directions connected.
    Connected,
    /// A leaf is unreachable or refused; see conditions.
    Error,
    /// Being torn down.
    Deleting,
}

/// How `from` sees `to`'s CIDRs, and the state of `from`'s tunnel to `to`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShortcutDirection {
    /// Viewing leaf.
    pub from: String,
    /// Viewed leaf.
    pub to: String,
    /// `to`'s pod CIDRs as `from` sees them.
    #[serde(default)]
    pub pod_cidrs: Vec<CidrMapping>,
    /// `to`'s external CIDRs as `from` sees them.
    #[serde(default)]
    pub external_cidrs: Vec<CidrMapping>,
    /// `from`'s TunnelEndpoint state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<ConnectionState>,
    /// The path `from`'s traffic to `to` takes: `Direct`, or `ViaHub` while the shortcut is
    /// down and the hub carries it (with `transit`); absent until reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<ShortcutPath>,
    /// RFC 3339 time of the last switch of `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_changed: Option<String>,
}

/// The path of one direction of a shortcut.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ShortcutPath {
    /// Over the shortcut's own tunnel.
    Direct,
    /// Through the hub (the shortcut is down).
    ViaHub,
}

impl std::fmt::Display for ShortcutPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Direct => "direct",
            Self::ViaHub => "via hub",
        })
    }
}

/// Status of a [`ShortcutConnection`].
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShortcutConnectionStatus {
    /// Summary phase.
    #[serde(default)]
    pub phase: ShortcutPhase,
    /// Both directions (left -> right, right -> left).
    #[serde(default)]
    pub directions: Vec<ShortcutDirection>,
    /// The spec generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `LeafReachable` and error reasons.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}
