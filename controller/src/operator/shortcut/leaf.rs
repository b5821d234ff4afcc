//! Leaf clients: [`LeafClients`] builds the client of a leaf cluster, by default from its
//! kubeconfig Secret on the hub ([`SecretKubeconfigs`]), naming what is wrong when it cannot.

use std::fmt;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kubetun_crds::LeafCluster;
use kubetun_crds::contract::shortcut::{DEFAULT_SECRET_KEY, reason};

use crate::plumbing::kubeconfig::ServerAccess;

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

    /// How other leaves reach `leaf`'s API server (for the credential to read its exported
    /// services); `None` where unknown.
    fn server<'a>(
        &'a self,
        _namespace: &'a str,
        _leaf: &'a LeafCluster,
    ) -> BoxFuture<'a, Option<ServerAccess>> {
        Box::pin(std::future::ready(None))
    }
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
        let (config, invalid) = self.config(namespace, leaf).await?;
        kube::Client::try_from(config).map_err(|e| invalid(&e))
    }

    /// The leaf's kubeconfig, loaded, and how to report an error with it.
    async fn config(
        &self,
        namespace: &str,
        leaf: &LeafCluster,
    ) -> Result<(kube::Config, impl Fn(&dyn fmt::Display) -> LeafError), LeafError> {
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
        // The error goes into the status and an Event: what it shows of the kubeconfig (the
        // parser quotes values and prints the lines around the error, where a token or key
        // may stand) is left out.
        let secret_name = secret_ref.name.clone();
        let leaf_name = leaf.name.clone();
        let namespace_owned = namespace.to_owned();
        let invalid = move |e: &dyn fmt::Display| LeafError {
            leaf: leaf_name.clone(),
            reason: reason::KUBECONFIG_INVALID,
            message: format!(
                "Secret {namespace_owned}/{secret_name} key {key:?} is not a usable kubeconfig: {}",
                without_values(&e.to_string())
            ),
        };
        let text = std::str::from_utf8(&bytes.0).map_err(|e| invalid(&e))?;
        let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| invalid(&e))?;
        crate::plumbing::kubeconfig::install_tls_provider();
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| invalid(&e))?;
        Ok((config, invalid))
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

    fn server<'a>(
        &'a self,
        namespace: &'a str,
        leaf: &'a LeafCluster,
    ) -> BoxFuture<'a, Option<ServerAccess>> {
        Box::pin(async move {
            let (config, _) = self.config(namespace, leaf).await.ok()?;
            Some(ServerAccess::of(&config))
        })
    }
}

/// The first line of an error about a kubeconfig, with the contents of every double-quoted
/// string replaced by `…`: parse errors quote the offending value and show the lines around
/// it, which may hold a token or a key.
fn without_values(text: &str) -> String {
    let first = text.lines().next().unwrap_or_default();
    let mut out = String::with_capacity(first.len());
    let mut quoted = false;
    for c in first.chars() {
        if c == '"' {
            if quoted {
                out.push('…');
            }
            quoted = !quoted;
            out.push(c);
        } else if !quoted {
            out.push(c);
        }
    }
    if quoted {
        out.push('…');
        out.push('"');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_keep_no_value_of_the_kubeconfig() {
        // The parser's message shows the lines around the error, the token's among them.
        let text = "users:\n- name: leaf\n  user:\n    token: s3cr3t-token\n    \
                    insecure: s3cr3t-key\n    username: [\"s3cr3t-name\"]\n";
        let error = Kubeconfig::from_yaml(text).expect_err("a list where a string belongs");
        assert!(error.to_string().contains("s3cr3t"), "{error}");
        let message = without_values(&error.to_string());
        assert!(!message.contains("s3cr3t"), "{message}");
        assert!(message.contains("line 6"), "{message}");
        assert_eq!(
            without_values("a \"b\" c \"d\nsecond line"),
            "a \"…\" c \"…\""
        );
    }
}
