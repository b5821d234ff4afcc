//! Custom resource types of the `net.kubetun.io/v1alpha1` API group.
//!
//! - [`NetworkConfig`]: what one cluster tells a peer (its CIDRs, endpoint, public key); the
//!   receiver writes how it sees the sender into the status.
//! - [`TunnelEndpoint`]: one per peer, merged from both NetworkConfigs; what the gateway gets.
//! - [`ShortcutConnection`]: a leaf-to-leaf link managed from a hub.
//! - [`Network`] / [`NetworkId`] (kind `NetworkID`): isolated networks with a cluster-unique ID (VNI) claimed by
//!   create-as-lock, and peerings whose prefixes become the gateway ACL.
//! - [`ExportedService`]: one exported Service as its cluster offers it to linked clusters.
//!
//! [`mcs`] holds the Multi-Cluster Services API (`multicluster.x-k8s.io`: ServiceExport,
//! ServiceImport) that kubetun implements.
//!
//! [`contract`] names what the programs share on objects (labels, annotations, finalizers,
//! Secret keys, condition types and reasons).
//!
//! [`all_crds`] lists kubetun's definitions and [`mcs::mcs_crds`] the MCS API's; the `crdgen`
//! binary prints either as YAML.

pub mod contract;
mod exportedservice;
pub mod mcs;
mod network;
mod networkconfig;
mod shortcut;
mod tunnelendpoint;

pub use exportedservice::*;
pub use network::*;
pub use networkconfig::*;
pub use shortcut::*;
pub use tunnelendpoint::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every kubetun resource.
pub const GROUP: &str = "net.kubetun.io";
/// API version of every kubetun resource.
pub const VERSION: &str = "v1alpha1";

/// Every CustomResourceDefinition of the group, in a stable order.
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        NetworkConfig::crd(),
        TunnelEndpoint::crd(),
        ShortcutConnection::crd(),
        Network::crd(),
        NetworkId::crd(),
        ExportedService::crd(),
    ];
    // The schema's title comes from the Rust type; tools show it, so it names the kind
    // (`NetworkID`, not the Rust-cased `NetworkId`).
    for crd in &mut crds {
        let kind = crd.spec.names.kind.clone();
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                schema.title = Some(kind.clone());
            }
        }
    }
    crds
}

/// kubetun's CRDs as one multi-document YAML stream (what `deploy/crds/kubetun.yaml` holds).
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    to_yaml(all_crds())
}

/// The MCS API's CRDs as one YAML stream (what `deploy/crds/multicluster.yaml` holds).
pub fn mcs_crds_yaml() -> Result<String, serde_yaml::Error> {
    to_yaml(mcs::mcs_crds())
}

fn to_yaml(crds: Vec<CustomResourceDefinition>) -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}

/// Identity of a cluster: a stable ID and a human name.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRef {
    /// Stable unique cluster ID.
    #[schemars(length(min = 1, max = 63))]
    pub id: String,
    /// Human readable cluster name.
    #[serde(default)]
    pub name: String,
}

/// A WireGuard endpoint: address (IP or DNS name) and UDP port.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// IP address or DNS name.
    #[schemars(length(min = 1, max = 253))]
    pub address: String,
    /// UDP port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.address.contains(':') {
            write!(f, "[{}]:{}", self.address, self.port)
        } else {
            write!(f, "{}:{}", self.address, self.port)
        }
    }
}

/// A real CIDR and the CIDR a cluster uses for it. `view == real` means not remapped.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CidrMapping {
    /// The CIDR as its owner announces it (real addresses on the wire).
    #[schemars(schema_with = "cidr_schema")]
    pub real: String,
    /// The CIDR the viewing cluster uses for it (same prefix length).
    #[schemars(schema_with = "cidr_schema")]
    pub view: String,
}

impl CidrMapping {
    /// True when the view differs from the real CIDR.
    pub fn is_remapped(&self) -> bool {
        self.real != self.view
    }
}

/// Pattern an IPv4 or IPv6 CIDR must match in the schema. It accepts exactly the address
/// forms the controller parses (IPv6 in full or `::`-compressed form, no zone, no embedded
/// IPv4) and prefix lengths in range; host bits are checked by the controller. RE2 syntax, as
/// the API server evaluates it.
pub const CIDR_PATTERN: &str = concat!(
    "^(",
    r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])/([0-9]|[12][0-9]|3[0-2])",
    "|",
    "(",
    r"([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}",
    r"|([0-9a-fA-F]{1,4}:){1,7}:",
    r"|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}",
    r"|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}",
    r"|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}",
    r"|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}",
    r"|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}",
    r"|[0-9a-fA-F]{1,4}:(:[0-9a-fA-F]{1,4}){1,6}",
    r"|:((:[0-9a-fA-F]{1,4}){1,7}|:)",
    ")",
    r"/([0-9]|[1-9][0-9]|1[01][0-9]|12[0-8])",
    ")$"
);

/// Schema of one CIDR string.
pub fn cidr_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "pattern": CIDR_PATTERN,
        "maxLength": 49,
    })
}

/// Schema of a list of CIDR strings.
pub fn cidr_list_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "type": "string", "pattern": CIDR_PATTERN, "maxLength": 49 },
        "maxItems": 64,
    })
}

/// Schema of an optional list of CIDR strings (`null` distinct from `[]`).
pub fn optional_cidr_list_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "nullable": true,
        "items": { "type": "string", "pattern": CIDR_PATTERN, "maxLength": 49 },
        "maxItems": 64,
    })
}

/// Re-export of the condition type used in every status.
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
