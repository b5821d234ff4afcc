//! `ExportedService`: what a cluster offers its linked clusters of one exported Service, in
//! its own (real) addresses. The exporting cluster's controller writes one per valid
//! ServiceExport into kubetun's namespace; linked clusters read them with a credential that
//! may read nothing else, and turn them into ServiceImports and EndpointSlices in their own
//! views of the exporter's addresses.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ClusterRef;
use crate::exportpolicy::ClientSelector;
use crate::mcs::{ServiceImportType, ServicePort, SessionAffinityConfig};

/// One exported Service as its cluster offers it; named `<namespace>.<name>`.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "net.kubetun.io",
    version = "v1alpha1",
    kind = "ExportedService",
    namespaced,
    shortname = "kexp",
    category = "kubetun",
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.namespace"}"#,
    printcolumn = r#"{"name":"Service","type":"string","jsonPath":".spec.name"}"#,
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ExportedServiceSpec {
    /// The exporting cluster.
    pub cluster: ClusterRef,
    /// The Service's namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// The Service's name.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// When the ServiceExport was created: the oldest export wins a conflict.
    pub export_created: Time,
    /// `ClusterSetIP`, or `Headless` for a Service without a ClusterIP.
    #[serde(rename = "type")]
    pub type_: ServiceImportType,
    /// The Service's ports.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub ports: Vec<ServicePort>,
    /// `None` or `ClientIP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<String>,
    /// The ClientIP affinity's settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// `IPv4` and/or `IPv6`.
    #[serde(default)]
    pub ip_families: Vec<String>,
    /// The Service's `internalTrafficPolicy` (`Cluster` or `Local`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<String>,
    /// The Service's `trafficDistribution` (e.g. `PreferClose`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_distribution: Option<String>,
    /// The ServiceExport's `exportedLabels`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The ServiceExport's `exportedAnnotations`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The Service's endpoints in the exporter's addresses, grouped as its EndpointSlices
    /// group them (by address type and ports).
    #[serde(default)]
    #[schemars(length(max = 1000))]
    pub slices: Vec<ExportedSlice>,
    /// The cluster ids that may import the Service (the ServiceExport's
    /// `net.kubetun.io/consumers` annotation); absent: every linked cluster. A cluster not
    /// named imports nothing of it, and the exporter's gateway refuses its packets to these
    /// endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumers: Option<Vec<String>>,
    /// The selectors of the Service's ExportPolicies: what the exporter asks each client
    /// cluster named there about its pods. Empty: no policy guards the Service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub client_selectors: Vec<ClientSelector>,
}

/// Endpoints of one address type that share their ports.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportedSlice {
    /// `IPv4` or `IPv6`.
    pub address_type: String,
    /// The ports the endpoints listen on (target ports).
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub ports: Vec<ExportedEndpointPort>,
    /// The endpoints.
    #[serde(default)]
    #[schemars(length(max = 1000))]
    pub endpoints: Vec<ExportedEndpoint>,
}

/// A port of an endpoint.
#[derive(
    Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct ExportedEndpointPort {
    /// The Service port's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The port number.
    pub port: i32,
    /// The application protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
}

/// One endpoint (a pod) of an exported Service.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportedEndpoint {
    /// Its addresses in the exporting cluster.
    #[schemars(length(min = 1, max = 100))]
    pub addresses: Vec<String>,
    /// Ready to take traffic.
    #[serde(default)]
    pub ready: bool,
    /// Serving (possibly terminating).
    #[serde(default)]
    pub serving: bool,
    /// Terminating.
    #[serde(default)]
    pub terminating: bool,
    /// The hostname a headless Service's DNS names it by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}
