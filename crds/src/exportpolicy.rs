//! `ExportPolicy`: which remote pods may call an exported Service, by cluster, namespace
//! labels and pod labels; and `ClientIdentity`, what a client cluster answers about its own
//! pods when an exporter's policies ask.
//!
//! The policy lives in the exporting cluster, in the Service's namespace (its owner decides,
//! as with a NetworkPolicy). Its selectors travel to the client clusters in the Service's
//! offer ([`crate::ExportedServiceSpec::client_selectors`]); each client answers with one
//! `ClientIdentity` per exporter, named `for-<exporter>`, holding the real addresses of the
//! pods each selector matches and nothing else about them; the exporter reads it with its
//! read-only credential (which may read that one object), maps the addresses into its views
//! and its gateway admits only those sources to the Service's endpoints.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Who may call one exported Service of this namespace. Policies add up: a remote pod one of
/// them selects may call the ports it names. A Service without a policy is open to every pod
/// of every cluster it is exported to; with policies, only to what they select (a policy
/// that selects nothing admits nothing).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "net.kubetun.io",
    version = "v1alpha1",
    derive = "Default",
    kind = "ExportPolicy",
    namespaced,
    status = "ExportPolicyStatus",
    shortname = "kxp",
    category = "kubetun",
    printcolumn = r#"{"name":"Service","type":"string","jsonPath":".spec.service"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Selected","type":"integer","jsonPath":".status.selected"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ExportPolicySpec {
    /// The exported Service it guards: a Service (with its ServiceExport) of this name in
    /// the policy's namespace.
    #[schemars(length(min = 1, max = 63))]
    pub service: String,
    /// The Service's ports (`port`, as in the Service) it guards; empty: every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub ports: Vec<i32>,
    /// Who may call: a remote pod any entry selects. Empty: nobody.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub from: Vec<PolicyPeer>,
}

/// Remote pods, by cluster, namespace labels and pod labels (all must match).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyPeer {
    /// The client clusters' ids.
    #[schemars(length(min = 1, max = 64))]
    pub clusters: Vec<String>,
    /// Their namespaces, by labels (`kubernetes.io/metadata.name` names one); absent: every
    /// namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Their pods in those namespaces, by labels; absent: every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

/// What the exporter's controller made of a policy.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportPolicyStatus {
    /// `Valid` (the spec and its Service) and `Enforced` (every client answered and the
    /// gateway has the result).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Remote pods selected, over every client cluster.
    #[serde(default)]
    pub selected: u32,
    /// Per client cluster the policy names.
    #[serde(default)]
    pub clients: Vec<PolicyClient>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One client cluster of a policy.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyClient {
    /// Its id.
    pub cluster: String,
    /// Its pods the policy selects.
    pub selected: u32,
    /// Addresses it named outside the pod CIDRs it announced (dropped).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rejected: u32,
    /// Why nothing is selected there yet (no link, no answer, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What an exporter asks a client about: the pods matching a pair of selectors. Part of the
/// Service's offer.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientSelector {
    /// Names the answer ([`IdentitySelection::key`]): a digest of the two selectors.
    #[schemars(length(min = 1, max = 64))]
    pub key: String,
    /// The clusters asked.
    #[schemars(length(min = 1, max = 64))]
    pub clusters: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

/// A client cluster's answer to one exporter: for every selector that exporter's offers ask
/// it about, the real addresses of its matching pods. Named `for-<exporter>`, in kubetun's
/// namespace of the client; written by the client's controller, read by the exporter's.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "net.kubetun.io",
    version = "v1alpha1",
    derive = "Default",
    kind = "ClientIdentity",
    namespaced,
    shortname = "kci",
    category = "kubetun",
    printcolumn = r#"{"name":"Exporter","type":"string","jsonPath":".spec.exporter"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClientIdentitySpec {
    /// The cluster that answers (its id).
    #[schemars(length(min = 1, max = 63))]
    pub cluster: String,
    /// The exporter it answers.
    #[schemars(length(min = 1, max = 63))]
    pub exporter: String,
    /// One per selector asked.
    #[serde(default)]
    #[schemars(length(max = 4096))]
    pub selections: Vec<IdentitySelection>,
}

/// The pods one selector matches.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentitySelection {
    /// The selector's [`ClientSelector::key`].
    pub key: String,
    /// Their addresses (IPv4 or IPv6), sorted.
    #[serde(default)]
    #[schemars(length(max = 65536))]
    pub addresses: Vec<String>,
}
