//! [`ClusterHandle`]: how the connector reaches one cluster, with the API and error helpers
//! every step uses on it.

use std::fmt;

use kube::Resource;
use kube::api::Api;
use kubetun_crds::{Endpoint, NetworkConfig, TunnelEndpoint};

use super::ConnectError;
use crate::plumbing::cluster_info::ClusterInfo;
use crate::plumbing::kubeconfig::ServerAccess;

/// How the connector reaches one cluster.
#[derive(Clone)]
pub struct ClusterHandle {
    /// Role shown in progress lines and errors: `local`, `remote` or a leaf name.
    pub label: String,
    pub client: kube::Client,
    /// Namespace kubetun runs in on that cluster.
    pub namespace: String,
    /// Replaces the endpoint the cluster's gateway announces (NAT, port forwarding).
    pub endpoint_override: Option<Endpoint>,
    /// How linked clusters reach this cluster's API server, for the credential that lets
    /// them read its exported services; `None`: they get none.
    pub server: Option<ServerAccess>,
}

impl fmt::Debug for ClusterHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterHandle")
            .field("label", &self.label)
            .field("namespace", &self.namespace)
            .field("endpoint_override", &self.endpoint_override)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl ClusterHandle {
    /// A handle without endpoint override.
    pub fn new(
        label: impl Into<String>,
        client: kube::Client,
        namespace: impl Into<String>,
    ) -> Self {
        Self {
            label: label.into(),
            client,
            namespace: namespace.into(),
            endpoint_override: None,
            server: None,
        }
    }

    /// Sets how linked clusters reach this cluster's API server.
    #[must_use]
    pub fn with_server(mut self, server: Option<ServerAccess>) -> Self {
        self.server = server;
        self
    }

    /// Reads the cluster info and applies the endpoint override.
    pub async fn load_info(&self) -> Result<ClusterInfo, ConnectError> {
        let mut info = ClusterInfo::load(&self.client, &self.namespace)
            .await
            .map_err(|source| ConnectError::ClusterInfo {
                cluster: self.label.clone(),
                namespace: self.namespace.clone(),
                source,
            })?;
        if let Some(endpoint) = &self.endpoint_override {
            info.endpoint = endpoint.clone();
        }
        Ok(info)
    }

    pub(super) fn configs(&self) -> Api<NetworkConfig> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub(super) fn tunnels(&self) -> Api<TunnelEndpoint> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub(super) fn object<K: Resource<DynamicType = ()>>(&self, name: &str) -> String {
        format!("{} {}/{name}", K::kind(&()), self.namespace)
    }

    pub(super) fn api_error<K: Resource<DynamicType = ()>>(
        &self,
        cluster_id: &str,
        action: &'static str,
        name: &str,
    ) -> impl FnOnce(kube::Error) -> ConnectError {
        let cluster = self.label.clone();
        let cluster_id = cluster_id.to_owned();
        let object = self.object::<K>(name);
        move |source| ConnectError::Api {
            cluster,
            cluster_id,
            action,
            object,
            source,
        }
    }
}
