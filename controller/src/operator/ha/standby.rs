//! A standby replica's controller: keeps its gateway on the state the active replica's
//! controller maintains, and writes nothing to the API server, until it holds the lease
//! ([`Standby`]).
//!
//! The desired state is built exactly as the active replica builds it
//! ([`planner::desired_state`] over every TunnelEndpoint, with the keys of the key Secret), so
//! the standby gateway runs the same peers, views and keys, and a takeover is a Hold away.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;

use super::election::{Election, Timing};
use super::lease::Elector;
use super::metrics::HaMetrics;
use crate::keys::{self, GatewayKeys};
use crate::planner::{self, GatewaySettings};
use crate::plumbing::gateway_client::GatewayClient;

/// How often a standby reads the TunnelEndpoints and the keys. A takeover runs the state of
/// at most this long ago until the new leader's own sync catches up.
pub const STANDBY_SYNC: Duration = Duration::from_secs(1);

/// Why a pass could not update the standby gateway.
#[derive(Debug, thiserror::Error)]
pub enum StandbyError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Keys(#[from] keys::KeyError),
    #[error(transparent)]
    Gateway(#[from] crate::plumbing::gateway_client::GatewayClientError),
}

/// One pass: reads the TunnelEndpoints and the keys, and applies the state if the gateway
/// runs another version. Returns whether it applied.
pub async fn sync(
    client: &Client,
    namespace: &str,
    settings: &mut GatewaySettings,
    gateway: &GatewayClient,
) -> Result<bool, StandbyError> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(kubetun_crds::contract::gateway_key::SECRET_NAME)
        .await?;
    let keys = GatewayKeys::from_secret(&secret)?;
    settings.set_keys(&keys.current, keys.previous.as_ref());
    let specs = crate::plumbing::tunnel_endpoints::list_specs(client, namespace).await?;
    let desired = planner::desired_state(settings, &specs);
    if gateway.status().await?.version == desired.version {
        return Ok(false);
    }
    let peers = desired.peers.len();
    let version = desired.version.clone();
    gateway.apply(desired).await?;
    tracing::info!(version, peers, "standby gateway on the desired state");
    Ok(true)
}

/// Runs [`sync`] every [`STANDBY_SYNC`] until dropped; failures are logged once per
/// distinct message.
pub async fn run(
    client: Client,
    namespace: String,
    mut settings: GatewaySettings,
    gateway: GatewayClient,
) {
    let mut interval = tokio::time::interval(STANDBY_SYNC);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error = None;
    loop {
        interval.tick().await;
        match sync(&client, &namespace, &mut settings, &gateway).await {
            Ok(_) => last_error = None,
            Err(error) => {
                let message = error.to_string();
                if last_error.as_ref() != Some(&message) {
                    tracing::warn!(
                        error = message,
                        "cannot bring the standby gateway up to date"
                    );
                    last_error = Some(message);
                }
            }
        }
    }
}

/// A replica before it holds the gateway lease.
pub struct Standby<'a> {
    /// The cluster's API server.
    pub client: &'a kube::Client,
    /// The kubetun namespace (the Lease's).
    pub namespace: &'a str,
    /// The gateway Lease's name.
    pub lease_name: &'a str,
    /// Underlay IP of this replica's node, named in the Lease.
    pub node_ip: Option<IpAddr>,
    /// This replica's unique name.
    pub replica: &'a str,
    /// The lease timing.
    pub timing: Timing,
    /// The local gateway.
    pub gateway: GatewayClient,
    /// The local gateway's interface settings.
    pub settings: &'a GatewaySettings,
    /// Leader gauge and takeover counter.
    pub metrics: &'a HaMetrics,
}

impl std::fmt::Debug for Standby<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Standby")
            .field("namespace", &self.namespace)
            .field("lease_name", &self.lease_name)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl Standby<'_> {
    /// Keeps the local gateway a standby with the cluster's state until this replica holds
    /// the gateway lease (the controllers' writes must come from one replica at a time);
    /// `None` when a signal stopped it first.
    pub async fn until_leading(self) -> Option<Elector> {
        let gateway = self.gateway;
        let mut elector = Elector::new(
            self.client.clone(),
            self.namespace,
            self.lease_name,
            self.node_ip,
            Election::new(self.replica.to_owned(), self.timing),
            Some(gateway.clone()),
            self.metrics.clone(),
        );
        tracing::info!(
            replica = self.replica,
            lease = self.lease_name,
            "replica: standby until it holds the gateway lease"
        );
        let namespace = self.namespace.to_owned();
        tokio::select! {
            () = elector.acquire() => Some(elector),
            () = run(self.client.clone(), namespace, self.settings.clone(), gateway) => Some(elector),
            () = crate::plumbing::shutdown::signal() => {
                tracing::info!("stopped while on standby");
                None
            }
        }
    }
}
