//! Clients from kubeconfigs, shared by the operator, the route agent and the CLI:
//! [`KubeconfigSource`] (a file and context, or the in-cluster configuration), the
//! [`KubeconfigError`] it fails with, [`install_tls_provider`], which every client needs
//! first, [`ServerAccess`] (what a kubeconfig says about its API server) and
//! [`peer_client`] (a client from a credential Secret's kubeconfig).

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};

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

/// How other clusters reach a cluster's API server: what a credential's kubeconfig names.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerAccess {
    /// `https://…` as the kubeconfig that reached it says.
    pub url: String,
    /// The CA certificates (DER) the kubeconfig trusts, if it names any.
    pub ca_der: Vec<Vec<u8>>,
    /// The kubeconfig skips TLS verification.
    pub insecure: bool,
    /// The name the server's certificate is checked against, when not the URL's host
    /// (`tls-server-name`: an API server reached at an address its certificate does not name).
    pub tls_server_name: Option<String>,
}

impl std::fmt::Debug for ServerAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerAccess")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl ServerAccess {
    /// What `config` (a loaded kubeconfig) says about its API server.
    pub fn of(config: &kube::Config) -> Self {
        Self {
            url: config
                .cluster_url
                .to_string()
                .trim_end_matches('/')
                .to_owned(),
            ca_der: config.root_cert.clone().unwrap_or_default(),
            insecure: config.accept_invalid_certs,
            tls_server_name: config.tls_server_name.clone(),
        }
    }
}

/// A client from a credential's kubeconfig; the error names what is wrong, never its contents.
pub async fn peer_client(kubeconfig: &[u8]) -> Result<kube::Client, String> {
    let text = std::str::from_utf8(kubeconfig).map_err(|_| "not UTF-8".to_owned())?;
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|_| "not a kubeconfig".to_owned())?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|_| "the kubeconfig has no usable cluster, user or context".to_owned())?;
    kube::Client::try_from(config)
        .map_err(|e| format!("cannot build a client: {}", first_line(&e.to_string())))
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}
