//! `kubetun diagnose`: walks every hop of a link between two clusters, in the order traffic
//! and configuration depend on each other, and names the first broken one with what to do.
//!
//! Per cluster: the API and kubetun's cluster info; our NetworkConfig to the peer and whether
//! the peer processed it; the peer's NetworkConfig and whether we processed it; the
//! TunnelEndpoint; the gateway having applied it (`Applied`); the tunnel's state and the age
//! of its last handshake; the ACL (`allowedPrefixes`) and the route agent. With both clusters:
//! the peer's key and endpoint as we use them against what the peer announces, both ends'
//! remap tables (what each side says the other sees must match), and the MTU. Per link also
//! its isolation and what is exported to the peer, and with the local gateway's control
//! socket (`--gateway-socket`) what the gateway refused from each peer and its flow table.
//! The checks are pure functions of what was read ([`Side`]), so tests break hops by editing
//! objects.

mod checks;
mod expect;
mod isolation;
mod link;
mod report;
mod side;
#[cfg(test)]
mod tests;

use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;

use super::output::{self, OutputArgs};
use super::{Error, KubeconfigSource};
use kubetun_controller::connector::ClusterHandle;
use kubetun_controller::plumbing::gateway_client::GatewayClient;

pub use checks::diagnose;
pub use expect::{AGENT_DAEMONSET, STALE_HANDSHAKE_SECS};
pub use report::{Check, Outcome, Report, render};
pub use side::{Side, collect};

/// `kubetun diagnose`.
#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// Kubeconfig of the local cluster [default: $KUBECONFIG or ~/.kube/config].
    #[arg(long)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Context in the local kubeconfig.
    #[arg(long)]
    pub context: Option<String>,
    /// Namespace kubetun runs in on the local cluster.
    #[arg(long, default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Kubeconfig of the peer cluster; without it only the local side of every link is
    /// checked.
    #[arg(long)]
    pub remote_kubeconfig: Option<std::path::PathBuf>,
    /// Context in the remote kubeconfig.
    #[arg(long)]
    pub remote_context: Option<String>,
    /// Namespace kubetun runs in on the remote cluster.
    #[arg(long, default_value = DEFAULT_NAMESPACE)]
    pub remote_namespace: String,
    /// Only the link to this peer cluster id (without --remote-kubeconfig).
    #[arg(long)]
    pub peer: Option<String>,
    /// The local gateway's control socket, where diagnose runs beside the gateway (its node
    /// or pod): adds what the gateway refused from each peer, by reason, and its flow table.
    #[arg(long, value_name = "FILE")]
    pub gateway_socket: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Runs `kubetun diagnose`; fails (exit status 1) when a hop is broken.
pub async fn run(args: DiagnoseArgs) -> Result<(), Error> {
    let local_source = KubeconfigSource {
        path: args.kubeconfig.clone(),
        context: args.context.clone(),
    };
    let mut local = match local_source.client("local").await {
        Ok(client) => collect(&ClusterHandle::new("local", client, &args.namespace)).await,
        Err(e) => unreachable_side("local", &e),
    };
    if let Some(socket) = &args.gateway_socket {
        local.gateway = Some(
            GatewayClient::new(socket.clone())
                .status()
                .await
                .map_err(|e| e.to_string()),
        );
    }
    let remote = match &args.remote_kubeconfig {
        None => None,
        Some(path) => {
            let source = KubeconfigSource {
                path: Some(path.clone()),
                context: args.remote_context.clone(),
            };
            Some(match source.client("remote").await {
                Ok(client) => {
                    collect(&ClusterHandle::new(
                        "remote",
                        client,
                        &args.remote_namespace,
                    ))
                    .await
                }
                Err(e) => unreachable_side("remote", &e),
            })
        }
    };
    let report = diagnose(&local, remote.as_ref(), args.peer.as_deref(), now_unix());
    match output::render(args.output.format, &report)? {
        Some(text) => print!("{text}"),
        None => print!("{}", render(&report)),
    }
    match report.broken() {
        Some(check) => Err(Error::Broken(format!("({}) {}", check.cluster, check.hop))),
        None => Ok(()),
    }
}

fn unreachable_side(label: &str, error: &dyn std::fmt::Display) -> Side {
    Side {
        label: label.to_owned(),
        info: Err(error.to_string()),
        configs: Vec::new(),
        tunnels: Vec::new(),
        agent: None,
        exports: None,
        gateway: None,
    }
}
