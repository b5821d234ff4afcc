//! What a cluster tells its peers about itself, published in ConfigMap
//! [`CONFIG_MAP_NAME`] so that connectors (CLI, ShortcutConnection operator) can build the
//! NetworkConfig this cluster sends to a peer.

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kubetun_crds::contract::cluster_info::{CONFIG_MAP_KEY, CONFIG_MAP_NAME};
use kubetun_crds::{ClusterRef, Endpoint, NetworkConfigSpec};
use serde::{Deserialize, Serialize};

/// Field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "kubetun-controller";

/// Reading or publishing the cluster info failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterInfoError {
    /// The ConfigMap does not exist: the controller has not started in that cluster.
    #[error(
        "ConfigMap {namespace}/{CONFIG_MAP_NAME} not found: is kubetun-controller running in this cluster?"
    )]
    NotPublished {
        /// Namespace searched.
        namespace: String,
    },
    /// The ConfigMap exists but does not hold a valid document.
    #[error("ConfigMap {namespace}/{CONFIG_MAP_NAME} key {CONFIG_MAP_KEY} is invalid: {reason}")]
    Invalid {
        /// Namespace searched.
        namespace: String,
        /// Parse error.
        reason: String,
    },
    /// API error.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// A comma-separated CIDR list as a flag; `""` is the empty list (to clear a recorded one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Cidrs(pub Vec<IpNet>);

/// Parses `--pod-cidr` and the like.
pub fn parse_cidrs(text: &str) -> Result<Cidrs, String> {
    text.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            part.parse()
                .map_err(|_| format!("{part:?} is not a CIDR (example: 10.0.0.0/16)"))
        })
        .collect::<Result<_, _>>()
        .map(Cidrs)
}

/// A cluster's identity, CIDRs and gateway endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInfo {
    /// Identity.
    pub cluster: ClusterRef,
    pub pod_cidrs: Vec<IpNet>,
    /// External CIDRs (non-pod endpoints reachable through this cluster).
    #[serde(default)]
    pub external_cidrs: Vec<IpNet>,
    /// Service CIDRs: local only, never announced, but never a view either.
    #[serde(default)]
    pub service_cidrs: Vec<IpNet>,
    /// The gateway's public endpoint.
    pub endpoint: Endpoint,
    /// The gateway's WireGuard public key (base64).
    pub public_key: String,
    /// Tunnel MTU.
    pub mtu: u32,
}

impl ClusterInfo {
    /// Every local range IPAM must keep out of views: pod, service and external CIDRs.
    pub fn local_ranges(&self) -> Vec<IpNet> {
        self.pod_cidrs
            .iter()
            .chain(&self.service_cidrs)
            .chain(&self.external_cidrs)
            .copied()
            .collect()
    }

    /// The spec of the NetworkConfig this cluster sends to `destination`.
    pub fn network_config_for(&self, destination: &ClusterRef) -> NetworkConfigSpec {
        NetworkConfigSpec {
            source_cluster: self.cluster.clone(),
            destination_cluster: destination.clone(),
            pod_cidrs: self.pod_cidrs.iter().map(ToString::to_string).collect(),
            external_cidrs: self
                .external_cidrs
                .iter()
                .map(ToString::to_string)
                .collect(),
            endpoint: self.endpoint.clone(),
            public_key: self.public_key.clone(),
            mtu: Some(self.mtu),
            fallback: None,
            hub_only: false,
            isolation: None,
        }
    }

    /// The ConfigMap document.
    pub fn to_yaml(&self) -> Result<String, serde_yaml::Error> {
        serde_yaml::to_string(self)
    }

    /// Parses the ConfigMap document.
    pub fn from_yaml(yaml: &str) -> Result<Self, serde_yaml::Error> {
        serde_yaml::from_str(yaml)
    }

    /// Reads the cluster info the controller of the cluster behind `client` published.
    pub async fn load(client: &kube::Client, namespace: &str) -> Result<Self, ClusterInfoError> {
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let map =
            maps.get_opt(CONFIG_MAP_NAME)
                .await?
                .ok_or_else(|| ClusterInfoError::NotPublished {
                    namespace: namespace.to_owned(),
                })?;
        let invalid = |reason: String| ClusterInfoError::Invalid {
            namespace: namespace.to_owned(),
            reason,
        };
        let yaml = map
            .data
            .as_ref()
            .and_then(|d| d.get(CONFIG_MAP_KEY))
            .ok_or_else(|| invalid("key missing".to_owned()))?;
        Self::from_yaml(yaml).map_err(|e| invalid(e.to_string()))
    }

    /// Creates or updates the ConfigMap (server-side apply).
    pub async fn publish(
        &self,
        client: &kube::Client,
        namespace: &str,
    ) -> Result<(), ClusterInfoError> {
        let yaml = self.to_yaml().map_err(|e| ClusterInfoError::Invalid {
            namespace: namespace.to_owned(),
            reason: e.to_string(),
        })?;
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(CONFIG_MAP_NAME.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/part-of".to_owned(),
                    "kubetun".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(CONFIG_MAP_KEY.to_owned(), yaml)])),
            ..ConfigMap::default()
        };
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let mut value = serde_json::to_value(&map).map_err(|e| ClusterInfoError::Invalid {
            namespace: namespace.to_owned(),
            reason: e.to_string(),
        })?;
        value["apiVersion"] = "v1".into();
        value["kind"] = "ConfigMap".into();
        maps.patch(
            CONFIG_MAP_NAME,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&value),
        )
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rome() -> ClusterInfo {
        ClusterInfo {
            cluster: ClusterRef {
                id: "rome".into(),
                name: "Rome".into(),
            },
            pod_cidrs: vec!["10.202.0.0/16".parse().unwrap()],
            external_cidrs: vec!["10.70.0.0/16".parse().unwrap()],
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
            endpoint: Endpoint {
                address: "192.0.2.2".into(),
                port: 51820,
            },
            public_key: "x".repeat(44),
            mtu: 1420,
        }
    }

    #[test]
    fn yaml_round_trips() {
        let info = rome();
        assert_eq!(
            ClusterInfo::from_yaml(&info.to_yaml().unwrap()).unwrap(),
            info
        );
    }

    #[test]
    fn network_config_announces_pod_and_external_but_not_service_cidrs() {
        let spec = rome().network_config_for(&ClusterRef {
            id: "europe".into(),
            name: String::new(),
        });
        assert_eq!(spec.source_cluster.id, "rome");
        assert_eq!(spec.destination_cluster.id, "europe");
        assert_eq!(spec.pod_cidrs, vec!["10.202.0.0/16"]);
        assert_eq!(spec.external_cidrs, vec!["10.70.0.0/16"]);
        assert_eq!(spec.mtu, Some(1420));
        assert_eq!(rome().local_ranges().len(), 3);
    }
}
