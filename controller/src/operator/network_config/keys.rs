//! The controller's side of a key rotation: follows Secret `kubetun-gateway-key`.
//!
//! 1. A changed Secret (`kubetun network rotate-keys` wrote a new key and kept the former one
//!    as the previous key) goes into the gateway settings, and the gateway sync applies both
//!    keys: peers keep their tunnels on the previous key until they handshake with the new one.
//! 2. Once the gateway reports the new public key, the cluster info ConfigMap announces it,
//!    so connectors (the CLI, the hub's operator) can carry it to every peer.
//! 3. Once no peer's tunnel uses the previous key any more, the previous key is removed from
//!    the Secret, which (back in step 1) ends the rotation on the gateway.
//!
//! [`next_step`] is the pure decision; [`run`] the watch and the writes around it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher;

use crate::gateway_api::StatusResponse;
use crate::keys::GatewayKeys;
use crate::operator::network_config::context::Context;
use crate::planner::GatewaySettings;
use crate::plumbing::key_secret;
use crate::plumbing::runtime;

/// How often the gateway's status is checked for the next step of a rotation.
const STEP_INTERVAL: Duration = Duration::from_millis(200);
/// Pause after a failed write, so a lasting failure is not logged five times a second.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(2);

/// What a rotation needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing (no rotation, or waiting for the gateway or the peers).
    Wait,
    /// Announce this public key in the cluster info.
    Publish(String),
    /// Every peer uses the new key: remove the previous key from the Secret.
    End,
}

/// The next step, given the settings, the public key the cluster info announces and the
/// gateway's latest status (`None` without a gateway, or while it is unreachable;
/// `has_gateway` tells which).
pub fn next_step(
    settings: &GatewaySettings,
    published: &str,
    gateway: Option<&StatusResponse>,
    has_gateway: bool,
) -> Step {
    // The key is announced only once the gateway runs it: a peer that learned it earlier
    // could not reach us.
    let running = match gateway {
        Some(status) => status.public_key == settings.public_key,
        None => !has_gateway,
    };
    if !running {
        return Step::Wait;
    }
    if published != settings.public_key {
        return Step::Publish(settings.public_key.clone());
    }
    let rotating = !settings.previous_public_key.is_empty();
    let peers_moved = gateway.is_none_or(|status| status.peers.iter().all(|p| !p.previous_key));
    if rotating && peers_moved {
        Step::End
    } else {
        Step::Wait
    }
}

/// Follows the key Secret and drives rotations until the task is dropped.
pub async fn run(ctx: Arc<Context>) {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let config = watcher::Config::default().fields(&format!(
        "metadata.name={}",
        kubetun_crds::contract::gateway_key::SECRET_NAME
    ));
    let changes = runtime::watch(secrets, config, &ctx.health, "Secret");
    futures::pin_mut!(changes);
    let mut published = ctx.cluster.public_key.clone();
    let mut tick = tokio::time::interval(STEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = changes.next() => match event {
                Some(Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret))) => {
                    take_keys(&ctx, &secret);
                }
                Some(_) => {}
                // The watch retries on its own and never ends; should it, the other tasks
                // of the controller go on.
                None => std::future::pending::<()>().await,
            },
            _ = tick.tick() => step(&ctx, &mut published).await,
        }
    }
}

/// Takes the next step of a rotation, if one is due; `published` is the key the cluster info
/// announces.
async fn step(ctx: &Context, published: &mut String) {
    let settings = ctx.gateway_settings();
    let status = ctx.gateway_status();
    let failure = match next_step(&settings, published, status.as_ref(), ctx.gateway.is_some()) {
        Step::Wait => return,
        Step::Publish(key) => {
            let mut info = ctx.cluster.clone();
            info.public_key.clone_from(&key);
            match info.publish(&ctx.client, &ctx.namespace).await {
                Ok(()) => {
                    tracing::info!(public_key = key, "cluster info announces the new key");
                    *published = key;
                    return;
                }
                Err(error) => format!("cannot publish the new key: {error}"),
            }
        }
        Step::End => {
            match key_secret::end_rotation(ctx.client.clone(), &ctx.namespace, &settings.public_key)
                .await
            {
                Ok(true) => {
                    tracing::info!(
                        public_key = settings.public_key,
                        "every peer uses the new key: previous key removed"
                    );
                    return;
                }
                // The Secret moved on; its watch event brings the new state.
                Ok(false) => return,
                Err(error) => format!("cannot end the key rotation: {error}"),
            }
        }
    };
    if ctx.health.is_down() {
        // Said once by ApiHealth; each retry is not news.
        tracing::debug!("{failure}; retrying");
    } else {
        tracing::warn!("{failure}; retrying");
        tokio::time::sleep(RETRY_AFTER_ERROR).await;
    }
}

/// Takes the keys of a changed Secret into the gateway settings.
fn take_keys(ctx: &Context, secret: &Secret) {
    match GatewayKeys::from_secret(secret) {
        Ok(keys) => {
            if ctx.set_gateway_keys(&keys) {
                tracing::info!(
                    public_key = keys.current.public_base64(),
                    previous_public_key = keys.previous.as_ref().map(|k| k.public_base64()),
                    "gateway keys changed"
                );
                ctx.wake_gateway_sync();
            }
        }
        Err(error) => tracing::warn!(%error, "ignoring the changed key Secret"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway_api::PeerStatus;

    fn settings(public: &str, previous: &str) -> GatewaySettings {
        GatewaySettings {
            private_key: format!("{public}-private"),
            public_key: public.into(),
            previous_private_key: if previous.is_empty() {
                String::new()
            } else {
                format!("{previous}-private")
            },
            previous_public_key: previous.into(),
            ..GatewaySettings::default()
        }
    }

    fn status(public: &str, previous_key: &[bool]) -> StatusResponse {
        StatusResponse {
            public_key: public.into(),
            peers: previous_key
                .iter()
                .map(|&previous_key| PeerStatus {
                    previous_key,
                    ..PeerStatus::default()
                })
                .collect(),
            ..StatusResponse::default()
        }
    }

    #[test]
    fn the_key_is_announced_once_the_gateway_runs_it() {
        let rotating = settings("new", "old");
        assert_eq!(
            next_step(&rotating, "old", Some(&status("old", &[false])), true),
            Step::Wait
        );
        assert_eq!(next_step(&rotating, "old", None, true), Step::Wait);
        assert_eq!(
            next_step(&rotating, "old", Some(&status("new", &[true])), true),
            Step::Publish("new".into())
        );
        assert_eq!(
            next_step(&rotating, "old", None, false),
            Step::Publish("new".into())
        );
    }

    #[test]
    fn the_rotation_ends_when_no_peer_uses_the_previous_key() {
        let rotating = settings("new", "old");
        assert_eq!(
            next_step(&rotating, "new", Some(&status("new", &[false, true])), true),
            Step::Wait
        );
        assert_eq!(
            next_step(
                &rotating,
                "new",
                Some(&status("new", &[false, false])),
                true
            ),
            Step::End
        );
        assert_eq!(
            next_step(&rotating, "new", Some(&status("new", &[])), true),
            Step::End
        );
        let done = settings("new", "");
        assert_eq!(
            next_step(&done, "new", Some(&status("new", &[false])), true),
            Step::Wait
        );
    }
}
