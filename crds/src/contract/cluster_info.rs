//! The cluster info ConfigMap: what a cluster announces (read by the CLI, the lab and peers'
//! connectors), and the namespace kubetun runs in.

/// Name of the ConfigMap holding the cluster info.
pub const CONFIG_MAP_NAME: &str = "kubetun-cluster-info";
/// Key of the YAML document in the ConfigMap.
pub const CONFIG_MAP_KEY: &str = "cluster-info.yaml";
/// Namespace kubetun runs in unless configured otherwise.
pub const DEFAULT_NAMESPACE: &str = "kubetun-system";
