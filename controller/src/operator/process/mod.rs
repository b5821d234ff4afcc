//! One `kubetun-controller` process: binds its listeners, serves metrics and probes, waits
//! as a standby replica until it holds the gateway lease, publishes the cluster info, then
//! runs every controller until one stops, the lease is lost or a signal comes ([`run`]).
//! The binary only turns its flags into [`Options`].
//!
//! - [`listeners`]: the sockets, bound before anything else.
//! - [`metrics`]: the registry and the HTTP server of `/metrics`, `/healthz`, `/readyz`.
//! - [`error`]: why the process stops.

pub mod error;
pub mod listeners;
pub mod metrics;

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use error::ProcessError;
use listeners::{ListenAddr, Listeners};
use metrics::{Metrics, serve_http};

use crate::ipam::IpamConfig;
use crate::keys::GatewayKeys;
use crate::operator::ha::Timing;
use crate::operator::ha::standby::Standby;
use crate::operator::isolation::{self, NetworkOptions};
use crate::operator::network_config;
use crate::operator::network_config::context::{Context, ControllerConfig};
use crate::operator::services;
use crate::operator::shortcut;
use crate::planner::GatewaySettings;
use crate::plumbing::cluster_info::ClusterInfo;
use crate::plumbing::gateway_client::GatewayClient;

/// What the flags configure.
#[derive(Debug)]
pub struct Options {
    /// Namespace of every kubetun object of this cluster.
    pub namespace: String,
    /// This cluster's id.
    pub cluster_id: String,
    /// This cluster is the hub: run the ShortcutConnection operator.
    pub hub: bool,
    /// The local gateway, unless there is none.
    pub gateway: Option<GatewayClient>,
    /// Where `/metrics` and the probes are served.
    pub metrics_addr: ListenAddr,
    /// Where the DNS server listens.
    pub dns_addr: ListenAddr,
    /// This cluster's info (its public key comes from the key Secret).
    pub info: ClusterInfo,
    /// The local gateway's interface settings (its keys come from the key Secret).
    pub settings: GatewaySettings,
    /// IPAM pools and reserved ranges.
    pub ipam: IpamConfig,
    /// The Network controllers' options.
    pub networks: NetworkOptions,
    /// With `--replica`: this controller and its gateway are one of several replicas.
    pub replica: Option<Replica>,
}

/// One of several gateway replicas: a Lease elects the active one.
#[derive(Debug)]
pub struct Replica {
    /// This replica's unique name.
    pub name: String,
    /// The gateway Lease's name.
    pub lease_name: String,
    /// Underlay IP of this replica's node.
    pub node_ip: Option<IpAddr>,
    /// The lease timing.
    pub timing: Timing,
}

/// The controller: metrics, the standby wait of a replica, then every reconciler until one
/// stops, the lease is lost or a signal comes.
pub async fn run(client: kube::Client, options: Options) -> Result<(), ProcessError> {
    let listeners = Listeners::bind(options.metrics_addr, options.dns_addr).await?;
    let gateway = options.gateway.clone();

    let metrics = Metrics::default();
    let dns_table = services::dns_server::SharedTable::default();
    let dns = async {
        match listeners.dns {
            Some(sockets) => {
                services::dns_server::serve(sockets, dns_table.clone(), metrics.dns.clone()).await
            }
            None => std::future::pending().await,
        }
    };
    let ctx_slot: Arc<OnceLock<Arc<Context>>> = Arc::default();
    let mut http = match listeners.metrics {
        Some(listener) => tokio::spawn(serve_http(
            listener,
            metrics.registry.clone(),
            ctx_slot.clone(),
        )),
        None => tokio::spawn(std::future::pending()),
    };

    let mut elector = match &options.replica {
        Some(replica) => {
            let Some(gateway) = gateway.clone() else {
                return Err(ProcessError::ReplicaWithoutGateway);
            };
            let standby = Standby {
                client: &client,
                namespace: &options.namespace,
                lease_name: &replica.lease_name,
                node_ip: replica.node_ip,
                replica: &replica.name,
                timing: replica.timing,
                gateway,
                settings: &options.settings,
                metrics: &metrics.ha,
            };
            match standby.until_leading().await {
                Some(elector) => Some(elector),
                None => return Ok(()),
            }
        }
        None => None,
    };

    let config = publish_cluster(&client, &options).await?;
    let ctx = Context::new(client.clone(), config, gateway).await?;
    metrics.register_controller(&ctx);
    let _ = ctx_slot.set(ctx.clone());
    let lease_lost = async {
        match elector.as_mut() {
            Some(elector) => elector.keep().await,
            None => std::future::pending().await,
        }
    };
    let services = async {
        if services::sync::available(&ctx).await {
            services::sync::run(ctx.clone(), dns_table.clone(), metrics.services.clone()).await;
        } else {
            // Nothing is exported: `exported` links admit no connection.
            ctx.exports.publish(Default::default());
        }
        std::future::pending().await
    };
    tracing::info!("running; SIGTERM or ctrl+c stops gracefully");
    tokio::select! {
        () = network_config::run(ctx.clone()) => tracing::info!("controller stopped"),
        () = services => {}
        () = dns => {}
        result = shortcut_operator(&client, &options, &ctx) => {
            result.map_err(ProcessError::Shortcut)?;
        }
        result = isolation::run(client.clone(), None, options.networks, ctx.health.clone()) => {
            result.map_err(ProcessError::Networks)?;
        }
        result = &mut http => {
            result.map_err(ProcessError::MetricsTask)?.map_err(ProcessError::ServeMetrics)?;
        }
        () = lease_lost => {
            return Err(ProcessError::LeaseLost);
        }
    }
    if let Some(elector) = elector.as_mut() {
        elector.release().await;
    }
    Ok(())
}

/// Loads (or creates) the gateway keys, publishes this cluster's info with its public key,
/// and returns what the reconcilers are configured with.
async fn publish_cluster(
    client: &kube::Client,
    options: &Options,
) -> Result<ControllerConfig, ProcessError> {
    let mut info = options.info.clone();
    let mut settings = options.settings.clone();
    let keys = GatewayKeys::load_or_create(client.clone(), &options.namespace).await?;
    info.public_key = keys.current.public_base64().to_owned();
    info.publish(client, &options.namespace)
        .await
        .map_err(ProcessError::Publish)?;
    tracing::info!(cluster = %info.cluster.id, public_key = info.public_key, "cluster info published");
    settings.set_keys(&keys.current, keys.previous.as_ref());
    Ok(ControllerConfig {
        namespace: options.namespace.clone(),
        cluster: info,
        ipam: options.ipam.clone(),
        gateway: settings,
    })
}

/// On the hub (`--hub`) the ShortcutConnection operator. Elsewhere ShortcutConnections are
/// marked as such (NotHub), so none sits unexplained; a leaf without that CRD runs on without
/// it.
async fn shortcut_operator(
    client: &kube::Client,
    options: &Options,
    ctx: &Context,
) -> Result<(), shortcut::ShortcutError> {
    if options.hub {
        tracing::info!("hub: running the ShortcutConnection operator");
        return shortcut::run(
            client.clone(),
            Some(options.namespace.clone()),
            options.cluster_id.clone(),
            ctx.health.clone(),
        )
        .await;
    }
    let explained = shortcut::run_not_hub(
        client.clone(),
        options.namespace.clone(),
        options.cluster_id.clone(),
        ctx.health.clone(),
    )
    .await;
    if let Err(error) = explained {
        tracing::warn!(
            "ShortcutConnections are not watched: {}",
            crate::connector::error_chain(&error)
        );
        std::future::pending::<()>().await;
    }
    Ok(())
}
