//! Clients from kubeconfigs, shared by the operator, the route agent and the CLI:
//! [`KubeconfigSource`] (a file and context, or the in-cluster configuration), the
//! [`KubeconfigError`] it fails with, and [`install_tls_provider`], which every client needs
//! first.

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::connector::ServerAccess;

/// A kubeconfig that cannot be read or has no usable context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("({cluster}) cannot load the kubeconfig {source_desc}: {reason}")]
pub struct KubeconfigError {
    /// `local`, `remote`, `hub`, a leaf name.
    pub cluster: String,
    /// The file (or "from the environment").
    pub source_desc: String,
    /// Why.
    pub reason: String,
}

/// Makes rustls use its `ring` provider process-wide, before any kube client is built. With
/// more than one provider compiled in (feature unification across the workspace does that),
/// rustls refuses to choose and the first TLS connection panics. Idempotent.
pub fn install_tls_provider() {
    // Err means a provider is already installed, which is all this needs.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Where to find one cluster's kubeconfig.
#[derive(Debug, Clone, Default)]
pub struct KubeconfigSource {
    /// Kubeconfig file; `None` uses `$KUBECONFIG` or `~/.kube/config`.
    pub path: Option<PathBuf>,
    /// Context in the file; `None` uses its current context.
    pub context: Option<String>,
}

impl KubeconfigSource {
    fn describe(&self) -> String {
        let file = self.path.as_ref().map_or_else(
            || "from $KUBECONFIG or ~/.kube/config".to_owned(),
            |p| p.display().to_string(),
        );
        match &self.context {
            Some(context) => format!("{file} (context {context})"),
            None => file,
        }
    }

    /// A client for a long-running process: the in-cluster configuration (else `$KUBECONFIG`
    /// or `~/.kube/config`) when neither a file nor a context is given, else [`Self::client`].
    pub async fn client_or_in_cluster(
        &self,
        cluster: &str,
    ) -> Result<kube::Client, KubeconfigError> {
        if self.path.is_none() && self.context.is_none() {
            install_tls_provider();
            return kube::Client::try_default()
                .await
                .map_err(|e| KubeconfigError {
                    cluster: cluster.to_owned(),
                    source_desc: "(in-cluster, $KUBECONFIG or ~/.kube/config)".to_owned(),
                    reason: e.to_string(),
                });
        }
        self.client(cluster).await
    }

    /// The name of the cluster the kubeconfig's context (the given one, else the current
    /// one) points at, as `kubectl config view` shows it; `None` when it cannot be read.
    pub fn context_cluster(&self) -> Option<String> {
        let kubeconfig = match &self.path {
            Some(path) => Kubeconfig::read_from(path),
            None => Kubeconfig::read(),
        }
        .ok()?;
        let context = self
            .context
            .clone()
            .or_else(|| kubeconfig.current_context.clone())?;
        kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == context)?
            .context
            .as_ref()
            .map(|c| c.cluster.clone())
            .filter(|c| !c.is_empty())
    }

    /// Builds a client for `cluster` (a label used in errors).
    pub async fn client(&self, cluster: &str) -> Result<kube::Client, KubeconfigError> {
        Ok(self.client_and_server(cluster).await?.0)
    }

    /// [`Self::client`], and how other clusters reach this API server.
    pub async fn client_and_server(
        &self,
        cluster: &str,
    ) -> Result<(kube::Client, ServerAccess), KubeconfigError> {
        let fail = |reason: String| KubeconfigError {
            cluster: cluster.to_owned(),
            source_desc: self.describe(),
            reason,
        };
        let kubeconfig = match &self.path {
            Some(path) => Kubeconfig::read_from(path),
            None => Kubeconfig::read(),
        }
        .map_err(|e| fail(e.to_string()))?;
        install_tls_provider();
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let server = ServerAccess::of(&config);
        let client = kube::Client::try_from(config).map_err(|e| fail(e.to_string()))?;
        Ok((client, server))
    }
}
