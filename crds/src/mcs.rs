//! The Multi-Cluster Services API (KEP-1645, `multicluster.x-k8s.io`): `ServiceExport` (a user
//! offers a Service to the clusters linked to this one) and `ServiceImport` (kubetun says a
//! Service exists somewhere in the set). `v1beta1` is stored, `v1alpha1` still served, as the
//! CRDs of the MCS API project do; the two versions share every field they both have, so no
//! conversion webhook is needed.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt as _;
use kube::core::crd::merge_crds;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// API group of the Multi-Cluster Services API.
pub const MCS_GROUP: &str = "multicluster.x-k8s.io";
/// The stored version.
pub const MCS_VERSION: &str = "v1beta1";

/// `multicluster.x-k8s.io/v1beta1`, the stored version.
pub mod v1beta1 {
    use std::borrow::Cow;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::CustomResource;

    use super::*;

    /// Offers the Service of the same name and namespace to every cluster linked to this one.
    /// Users create it without a spec, so unlike the derived types a missing `spec` is the
    /// default one; [`ServiceExportDefinition`] only gives the CRD its schema.
    #[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
    pub struct ServiceExport {
        /// Standard object metadata.
        pub metadata: ObjectMeta,
        /// Which labels and annotations go onto the imports.
        #[serde(default)]
        pub spec: ServiceExportSpec,
        /// Written by kubetun.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub status: Option<ServiceExportStatus>,
    }

    impl kube::Resource for ServiceExport {
        type DynamicType = ();
        type Scope = kube::core::NamespaceResourceScope;

        fn kind(_: &()) -> Cow<'_, str> {
            "ServiceExport".into()
        }
        fn group(_: &()) -> Cow<'_, str> {
            MCS_GROUP.into()
        }
        fn version(_: &()) -> Cow<'_, str> {
            MCS_VERSION.into()
        }
        fn plural(_: &()) -> Cow<'_, str> {
            "serviceexports".into()
        }
        fn meta(&self) -> &ObjectMeta {
            &self.metadata
        }
        fn meta_mut(&mut self) -> &mut ObjectMeta {
            &mut self.metadata
        }
    }

    /// The schema of [`ServiceExport`] (see there).
    #[derive(
        CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema,
    )]
    #[kube(
        group = "multicluster.x-k8s.io",
        version = "v1beta1",
        kind = "ServiceExport",
        root = "ServiceExportDefinition",
        namespaced,
        status = "ServiceExportStatus",
        shortname = "svcex",
        printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
        printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
        printcolumn = r#"{"name":"Conflict","type":"string","jsonPath":".status.conditions[?(@.type==\"Conflict\")].status"}"#,
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )]
    #[serde(rename_all = "camelCase")]
    pub struct ServiceExportSpec {
        /// Labels of the ServiceExport carried onto the ServiceImports (no others are).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub exported_labels: BTreeMap<String, String>,
        /// Annotations of the ServiceExport carried onto the ServiceImports.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub exported_annotations: BTreeMap<String, String>,
    }

    /// Written by kubetun: `Valid`, `Ready` and `Conflict`.
    #[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct ServiceExportStatus {
        /// The export's conditions.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub conditions: Vec<Condition>,
    }

    /// A Service that exists in at least one cluster of the set.
    #[derive(
        CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema,
    )]
    #[kube(
        group = "multicluster.x-k8s.io",
        version = "v1beta1",
        derive = "Default",
        kind = "ServiceImport",
        namespaced,
        status = "ServiceImportStatus",
        shortname = "svcim",
        printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
        printcolumn = r#"{"name":"IP","type":"string","jsonPath":".spec.ips"}"#,
        printcolumn = r#"{"name":"Clusters","type":"string","jsonPath":".status.clusters[*].cluster"}"#,
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )]
    #[serde(rename_all = "camelCase")]
    pub struct ServiceImportSpec {
        /// The union of the exporting clusters' ports.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub ports: Vec<ServicePort>,
        /// The ClusterSetIP(s); empty for `Headless`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub ips: Vec<String>,
        /// `ClusterSetIP` or `Headless`.
        #[serde(rename = "type")]
        pub type_: ServiceImportType,
        /// `None` or `ClientIP`, from the oldest export.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub session_affinity: Option<String>,
        /// The ClientIP affinity's settings, from the oldest export.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub session_affinity_config: Option<SessionAffinityConfig>,
        /// `IPv4` and/or `IPv6`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub ip_families: Vec<String>,
        /// `Cluster` or `Local`, from the oldest export (the Service's own, as the API server
        /// defaulted it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub internal_traffic_policy: Option<String>,
        /// The Service's `trafficDistribution` (e.g. `PreferClose`), from the oldest export.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub traffic_distribution: Option<String>,
    }

    /// Written by kubetun: which clusters export the Service.
    #[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    pub struct ServiceImportStatus {
        /// The exporting clusters.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub clusters: Vec<ClusterStatus>,
        /// The import's conditions.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub conditions: Vec<Condition>,
    }
}

/// `multicluster.x-k8s.io/v1alpha1`, still served for older clients.
pub mod v1alpha1 {
    use super::*;
    use kube::CustomResource;

    /// `v1alpha1` of [`super::v1beta1::ServiceExport`] (no spec).
    #[derive(
        CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema,
    )]
    #[kube(
        group = "multicluster.x-k8s.io",
        version = "v1alpha1",
        derive = "Default",
        kind = "ServiceExport",
        namespaced,
        status = "super::v1beta1::ServiceExportStatus",
        shortname = "svcex",
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )]
    pub struct ServiceExportSpec {}

    /// `v1alpha1` of [`super::v1beta1::ServiceImport`].
    #[derive(
        CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema,
    )]
    #[kube(
        group = "multicluster.x-k8s.io",
        version = "v1alpha1",
        derive = "Default",
        kind = "ServiceImport",
        namespaced,
        status = "super::v1beta1::ServiceImportStatus",
        shortname = "svcim",
        printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
        printcolumn = r#"{"name":"IP","type":"string","jsonPath":".spec.ips"}"#,
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )]
    #[serde(rename_all = "camelCase")]
    pub struct ServiceImportSpec {
        /// The union of the exporting clusters' ports.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub ports: Vec<ServicePort>,
        /// The ClusterSetIP(s).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub ips: Vec<String>,
        /// `ClusterSetIP` or `Headless`.
        #[serde(rename = "type")]
        pub type_: ServiceImportType,
        /// `None` or `ClientIP`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub session_affinity: Option<String>,
        /// The ClientIP affinity's settings.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub session_affinity_config: Option<SessionAffinityConfig>,
    }
}

/// `ClusterSetIP` (one virtual IP in each cluster) or `Headless` (per-endpoint records).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ServiceImportType {
    /// One virtual IP per importing cluster, load-balanced over every cluster's endpoints.
    #[default]
    ClusterSetIP,
    /// No virtual IP: DNS answers with the endpoints.
    Headless,
}

impl std::fmt::Display for ServiceImportType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ClusterSetIP => "ClusterSetIP",
            Self::Headless => "Headless",
        })
    }
}

/// A port of an imported Service.
#[derive(
    Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// The port's name (required when there are several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `TCP`, `UDP` or `SCTP`.
    #[serde(default = "tcp")]
    pub protocol: String,
    /// The application protocol (e.g. `http`), as on the Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    /// The port number.
    pub port: i32,
}

fn tcp() -> String {
    "TCP".to_owned()
}

/// ClientIP affinity settings, spelled as on a Service (`clientIP`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub struct SessionAffinityConfig {
    /// The ClientIP settings. Also read as `clientIp`, which kubetun wrote before it followed
    /// the Service's spelling.
    #[serde(
        rename = "clientIP",
        alias = "clientIp",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_ip: Option<ClientIpConfig>,
}

/// How long ClientIP affinity lasts.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    /// Seconds (1 to 86400; Kubernetes' default 10800).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
}

/// One exporting cluster of a ServiceImport.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The cluster's id.
    pub cluster: String,
}

/// The ServiceExport and ServiceImport definitions, both versions served, `v1beta1` stored.
pub fn mcs_crds() -> Vec<CustomResourceDefinition> {
    let export = merge_crds(
        vec![
            v1beta1::ServiceExportDefinition::crd(),
            v1alpha1::ServiceExport::crd(),
        ],
        MCS_VERSION,
    );
    let import = merge_crds(
        vec![
            v1beta1::ServiceImport::crd(),
            v1alpha1::ServiceImport::crd(),
        ],
        MCS_VERSION,
    );
    let mut export = export.expect("the two versions of one kind merge");
    // A ServiceExport is created without a spec (`kind: ServiceExport` and a name).
    for version in &mut export.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema.required = None;
        }
    }
    vec![export, import.expect("the two versions of one kind merge")]
}
