//! A standby replica's controller: keeps its gateway on the state the active replica's
//! controller maintains, and writes nothing to the API server.
//!
//! The desired state is built exactly as the active replica builds it
//! ([`planner::desired_state`] over every TunnelEndpoint, with the keys of the key Secret), so
//! the standby gateway runs the same peers, views and keys, and a takeover is a Hold away.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;

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
