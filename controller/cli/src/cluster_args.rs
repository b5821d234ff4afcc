//! Which cluster a `kubetun service` command talks to ([`ClusterArgs`]).

use std::path::PathBuf;

use clap::Args;
use kube::Client;

use crate::{Error, KubeconfigSource};

/// Which cluster.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Kubeconfig (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig.
    #[arg(long)]
    pub context: Option<String>,
}

impl ClusterArgs {
    /// A client of the cluster.
    pub(crate) async fn client(&self) -> Result<Client, Error> {
        let source = KubeconfigSource {
            path: self.kubeconfig.clone(),
            context: self.context.clone(),
        };
        Ok(source.client("local").await?)
    }
}
