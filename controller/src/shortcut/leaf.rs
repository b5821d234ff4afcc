//! Leaf clients: [`LeafClients`] builds the client of a leaf cluster, by default from its
//! kubeconfig Secret on the hub ([`SecretKubeconfigs`]), naming what is wrong when it cannot.

use std::fmt;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kubetun_crds::LeafCluster;

use super::{DEFAULT_SECRET_KEY, reason};

/// Why a leaf client cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("leaf {leaf}: {message}")]
pub struct LeafError {
    pub leaf: String,
    /// Condition reason ([`reason::KUBECONFIG_MISSING`], [`reason::KUBECONFIG_INVALID`], ...).
    pub reason: &'static str,
    /// What is wrong and what to do.
    pub message: String,
}

/// Builds the client of a leaf cluster. The operator reads kubeconfig Secrets
/// ([`SecretKubeconfigs`]); tests hand in clients directly (any
/// `Fn(&str, &LeafCluster) -> Result<kube::Client, LeafError>` is a `LeafClients`).
pub trait LeafClients: Send + Sync {
    /// The client of `leaf`, whose Secret lives in `namespace` on the hub.
    fn client<'a>(
        &'a self,
        namespace: &'a str,
        leaf: &'a LeafCluster,
    ) -> BoxFuture<'a, Result<kube::Client, LeafError>>;
}

impl<F> LeafClients for F
where
    F: Fn(&str, &LeafCluster) -> Result<kube::Client, LeafError> + Send + Sync,
{
    fn client<'a>(
        &'a self,
        namespace: &'a str,
        leaf: &'a LeafCluster,
    ) -> BoxFuture<'a, Result<kube::Client, LeafError>> {
        Box::pin(std::future::ready(self(namespace, leaf)))
    }
}

/// Leaf clients from the kubeconfig Secrets on the hub.
#[derive(Clone)]
pub struct SecretKubeconfigs {
    hub: kube::Client,
}

impl fmt::Debug for SecretKubeconfigs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretKubeconfigs").finish_non_exhaustive()
    }
}

impl SecretKubeconfigs {
    /// Reads Secrets through `hub`.
    pub fn new(hub: kube::Client) -> Self {
        Self { hub }
    }

    async fn build(&self, namespace: &str, leaf: &LeafCluster) -> Result<kube::Client, LeafError> {
        let secret_ref = &leaf.kubeconfig_secret;
        let key = secret_ref.key.as_deref().unwrap_or(DEFAULT_SECRET_KEY);
        let fail = |reason: &'static str, message: String| LeafError {
            leaf: leaf.name.clone(),
            reason,
            message,
        };
        let secrets: Api<Secret> = Api::namespaced(self.hub.clone(), namespace);
        let secret = secrets
            .get_opt(&secret_ref.name)
            .await
            .map_err(|e| fail(reason::KUBECONFIG_MISSING, format!("cannot read Secret {namespace}/{}: {e}", secret_ref.name)))?
            .ok_or_else(|| {
                fail(
                    reason::KUBECONFIG_MISSING,
                    format!("Secret {namespace}/{} does not exist: create it with the leaf's kubeconfig", secret_ref.name),
                )
            })?;
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| {
                fail(
                    reason::KUBECONFIG_MISSING,
                    format!("Secret {namespace}/{} has no key {key:?}", secret_ref.name),
                )
            })?;
        let invalid = |e: &dyn fmt::Display| {
            fail(
                reason::KUBECONFIG_INVALID,
                format!(
                    "Secret {namespace}/{} key {key:?} is not a usable kubeconfig: {e}",
                    secret_ref.name
                ),
            )
        };
        let text = std::str::from_utf8(&bytes.0).map_err(|e| invalid(&e))?;
        let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| invalid(&e))?;
        crate::cli::install_tls_provider();
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| invalid(&e))?;
        kube::Client::try_from(config).map_err(|e| invalid(&e))
    }
}

impl LeafClients for SecretKubeconfigs {
    fn client<'a>(
        &'a self,
        namespace: &'a str,
        leaf: &'a LeafCluster,
    ) -> BoxFuture<'a, Result<kube::Client, LeafError>> {
        Box::pin(self.build(namespace, leaf))
    }
}
