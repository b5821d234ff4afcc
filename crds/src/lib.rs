//! Custom resource types of the `net.kubetun.io/v1alpha1` API group.
//!
//! - [`NetworkConfig`]: what one cluster tells a peer (its CIDRs, endpoint, public key); the
//!   receiver writes how it sees the sender into the status.
//! - [`TunnelEndpoint`]: one per peer, merged from both NetworkConfigs; what the gateway gets.
//! - [`ShortcutConnection`]: a leaf-to-leaf link managed from a hub.
//! - [`Network`] / [`NetworkId`] (kind `NetworkID`): isolated networks with a cluster-unique ID (VNI) claimed by
//!   create-as-lock, and peerings whose prefixes become the gateway ACL.
//! - [`ExportedService`]: one exported Service as its cluster offers it to linked clusters.
//! - [`ExportPolicy`]: which remote pods may call an exported Service; [`ClientIdentity`]: a
//!   client cluster's answer, the addresses of its pods the exporter's selectors match.
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
mod exportpolicy;
mod fields;
pub mod mcs;
mod network;
mod networkconfig;
mod shortcut;
mod tunnelendpoint;

pub use exportedservice::*;
pub use exportpolicy::*;
pub use fields::{
    CIDR_PATTERN, CidrMapping, ClusterRef, Endpoint, Isolation, cidr_list_schema, cidr_schema,
    optional_cidr_list_schema,
};
pub use network::*;
pub use networkconfig::*;
pub use shortcut::*;
pub use tunnelendpoint::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

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
        ExportPolicy::crd(),
        ClientIdentity::crd(),
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

/// Re-export of the condition type used in every status.
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
