//! Why the controller process stops ([`ProcessError`]).

use std::net::SocketAddr;

use crate::keys::KeyError;
use crate::operator::isolation::NetworkError;
use crate::operator::network_config::error::Error;
use crate::operator::shortcut::ShortcutError;
use crate::plumbing::cluster_info::ClusterInfoError;

/// What ends [`super::run`] with a failure. Messages name the flag to look at.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The metrics address cannot be bound.
    #[error("cannot listen on {addr} (--metrics-addr / KUBETUN_METRICS_ADDR; 0 disables it)")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The DNS address cannot be bound.
    #[error("cannot serve DNS on {addr} (--dns-addr / KUBETUN_DNS_ADDR; 0 disables it)")]
    Dns {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A replica was started without a local gateway.
    #[error("--replica elects the active gateway: it needs a local gateway (drop --no-gateway)")]
    ReplicaWithoutGateway,
    /// The gateway keys could not be loaded or created.
    #[error(transparent)]
    Keys(#[from] KeyError),
    /// The cluster info could not be published.
    #[error("cannot publish the cluster info")]
    Publish(#[source] ClusterInfoError),
    /// The NetworkConfig controller could not start.
    #[error(transparent)]
    Controller(#[from] Error),
    /// The ShortcutConnection operator failed.
    #[error("the ShortcutConnection operator failed")]
    Shortcut(#[source] ShortcutError),
    /// The Network controllers failed.
    #[error("the Network controllers failed")]
    Networks(#[source] NetworkError),
    /// The metrics server's task ended abnormally.
    #[error("the metrics server stopped")]
    MetricsTask(#[source] tokio::task::JoinError),
    /// The metrics server failed.
    #[error("cannot serve metrics (--metrics-addr)")]
    ServeMetrics(#[source] std::io::Error),
    /// This replica lost the gateway lease.
    #[error("this replica lost the gateway lease; exiting to start again as a standby")]
    LeaseLost,
}
