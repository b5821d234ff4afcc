//! Key rotation of one cluster's gateway, as `kubetun network rotate-keys` runs it.
//!
//! 1. [`key_secret::begin_rotation`]: a fresh key becomes the current one in Secret
//!    `kubetun-gateway-key`, the former one its previous key (a rotation left unfinished is
//!    resumed instead, with its key).
//! 2. The cluster's controller applies both keys to its gateway (peers keep their tunnels on
//!    the previous key) and, once the gateway runs the new key, announces it in the cluster
//!    info; this waits for that.
//! 3. The new public key goes into every link's NetworkConfigs: on a direct link into ours
//!    (`to-<peer>`) and the peer's copy (`from-<us>`, through the peer's kubeconfig); on a link
//!    a hub's ShortcutConnection manages into ours, which the hub's operator carries over.
//!    Only the key field is written, so MTU or endpoint overrides of the link stay. Each peer's
//!    gateway then initiates a handshake with the new key, which moves that peer's tunnel to it.
//! 4. With `wait`: once no tunnel uses the previous key, the controller removes it from the
//!    Secret; this waits for that.
//!
//! Every step compares before it writes, so a rerun after an interruption (a peer that was
//! unreachable) picks up where the last run stopped and changes nothing that is done.
//! Private keys never leave the Secret: the report and the progress name public keys only.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kubetun_crds::contract::link::{
    MANAGED_BY_CONNECTOR, MANAGED_BY_LABEL, ROLE_LABEL, ROLE_LOCAL,
};
use kubetun_crds::{ConnectionState, NetworkConfig, TunnelEndpoint};
use serde::Serialize;
use tokio::time::Instant;

use crate::connector::{self, ClusterHandle, FIELD_MANAGER, Progress, error_chain, link_owner};
use crate::keys::{GatewayKeys, KeyError};
use crate::planner::{local_config_name, remote_config_name};
use crate::plumbing::key_secret::{self, RotationStart};

/// Bounds of [`rotate_keys`].
#[derive(Debug, Clone, Copy)]
pub struct RotationOptions {
    /// Also wait until every peer uses the new key and the previous key is gone.
    pub wait: bool,
    /// Upper bound of the whole rotation.
    pub timeout: Duration,
    /// Pause between two observations.
    pub poll_interval: Duration,
}

impl Default for RotationOptions {
    fn default() -> Self {
        Self {
            wait: false,
            timeout: Duration::from_secs(120),
            poll_interval: Duration::from_millis(500),
        }
    }
}

/// A rotation failure. Messages name the cluster and what to do; none holds a private key.
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    /// The cluster info or a NetworkConfig could not be read or written.
    #[error(transparent)]
    Connector(#[from] connector::ConnectError),
    /// The key Secret could not be read or written.
    #[error("({cluster}) {source}")]
    Keys {
        /// Role of the cluster.
        cluster: String,
        /// Why.
        #[source]
        source: KeyError,
    },
    /// An API call failed.
    #[error("({cluster}) cannot {action}")]
    Api {
        /// Role of the cluster.
        cluster: String,
        /// What was attempted.
        action: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The controller did not bring the new key to the gateway in time.
    #[error(
        "({cluster}, cluster {cluster_id}) the gateway does not run the new key after {timeout:?} \
         (the cluster info still announces {announced}): check that kubetun-controller and the \
         gateway run, then run the command again to resume the rotation"
    )]
    NotApplied {
        /// Role of the cluster.
        cluster: String,
        cluster_id: String,
        /// The public key the cluster info announces.
        announced: String,
        /// How long was waited.
        timeout: Duration,
    },
}

/// How the new key reaches a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Propagation {
    /// Written into the peer's NetworkConfig through its kubeconfig.
    Direct,
    /// The hub's ShortcutConnection operator carries it over.
    Hub,
    /// Not reachable from here: a direct link whose peer kubeconfig was not given.
    Missing,
}

/// One peer in a rotation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerRotation {
    /// The peer's cluster id.
    pub peer_id: String,
    /// How the key reaches it.
    pub propagation: Propagation,
    /// The new key is in the NetworkConfig(s) this run could write for it.
    pub announced: bool,
    /// Its tunnel uses the new key.
    pub moved: bool,
    /// What is wrong or pending, empty when nothing is.
    pub message: String,
}

/// What a rotation did: `kubetun network rotate-keys -o json|yaml` prints it. Public keys only.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RotationReport {
    /// The rotated cluster.
    pub cluster_id: String,
    /// The new public key.
    pub public_key: String,
    /// The public key it replaces (null once the rotation has ended before this run).
    pub previous_public_key: Option<String>,
    /// An unfinished rotation was continued instead of a new one started.
    pub resumed: bool,
    /// Every tunnel uses the new key and the previous key is gone from the Secret.
    pub complete: bool,
    /// Every linked peer, sorted by id.
    pub peers: Vec<PeerRotation>,
}

impl RotationReport {
    /// Peers the new key could not be written for.
    pub fn unannounced(&self) -> impl Iterator<Item = &PeerRotation> {
        self.peers.iter().filter(|p| !p.announced)
    }

    /// Ids of the peers whose tunnels are still on the previous key.
    pub fn pending(&self) -> Vec<&str> {
        self.peers
            .iter()
            .filter(|p| !p.moved)
            .map(|p| p.peer_id.as_str())
            .collect()
    }
}

/// Rotates the gateway key of `local`; `remotes` are the peers reachable from here (direct
/// links need them; links a hub manages do not).
pub async fn rotate_keys(
    local: &ClusterHandle,
    remotes: &[ClusterHandle],
    options: RotationOptions,
    progress: &dyn Progress,
) -> Result<RotationReport, RotationError> {
    let deadline = Instant::now() + options.timeout;
    let info = local.load_info().await?;
    let own_id = info.cluster.id.clone();
    let keys_error = |source| RotationError::Keys {
        cluster: local.label.clone(),
        source,
    };
    let start = key_secret::begin_rotation(local.client.clone(), &local.namespace)
        .await
        .map_err(keys_error)?;
    let keys = start.keys().clone();
    let new_key = keys.current.public_base64().to_owned();
    let resumed = matches!(start, RotationStart::Resumed(_));
    let previous_public_key = keys.previous.as_ref().map(|k| k.public_base64().to_owned());
    progress.done(
        &local.label,
        &if resumed {
            format!("resuming the unfinished rotation to key {new_key}")
        } else {
            format!(
                "new key {new_key} (replacing {})",
                previous_public_key.as_deref().unwrap_or("-")
            )
        },
    );

    wait_announced(local, &own_id, &new_key, deadline, options, progress).await?;

    let mut remote_infos = Vec::new();
    for remote in remotes {
        match remote.load_info().await {
            Ok(remote_info) => remote_infos.push((remote, remote_info)),
            Err(error) => {
                progress.failed(&remote.label, &format!("skipped: {}", error_chain(&error)))
            }
        }
    }
    let mut peers = Vec::new();
    for peer_id in linked_peers(local, &own_id).await? {
        let remote = remote_infos
            .iter()
            .find(|(_, remote_info)| remote_info.cluster.id == peer_id)
            .map(|(handle, _)| *handle);
        peers.push(announce(local, &own_id, &peer_id, remote, &new_key, progress).await);
    }
    for (remote, remote_info) in &remote_infos {
        if !peers.iter().any(|p| p.peer_id == remote_info.cluster.id) {
            progress.failed(
                &remote.label,
                &format!(
                    "cluster {} has no link with {own_id}: nothing to do there",
                    remote_info.cluster.id
                ),
            );
        }
    }

    let mut report = RotationReport {
        cluster_id: own_id.clone(),
        public_key: new_key.clone(),
        previous_public_key,
        resumed,
        complete: false,
        peers,
    };
    observe(local, &own_id, &new_key, &mut report).await?;
    // A peer the key did not reach keeps the rotation open: waiting for it cannot end well.
    if !options.wait || report.complete || report.unannounced().next().is_some() {
        return Ok(report);
    }
    let waiting = format!(
        "waiting for every tunnel to use the new key ({} of {} moved)",
        report.peers.iter().filter(|p| p.moved).count(),
        report.peers.len()
    );
    progress.waiting(&local.label, &waiting);
    loop {
        if report.complete {
            progress.waited(
                &local.label,
                &format!(
                    "every tunnel uses the new key; the previous key is gone from Secret {}",
                    kubetun_crds::contract::gateway_key::SECRET_NAME
                ),
            );
            return Ok(report);
        }
        if Instant::now() + options.poll_interval > deadline {
            let pending = report.pending();
            progress.failed(
                &local.label,
                &format!(
                    "timed out after {:?}: still on the previous key: {}",
                    options.timeout,
                    pending.join(", ")
                ),
            );
            return Ok(report);
        }
        tokio::time::sleep(options.poll_interval).await;
        observe(local, &own_id, &new_key, &mut report).await?;
    }
}

/// Waits until the cluster info announces `new_key`: the controller does that once the
/// gateway runs it.
async fn wait_announced(
    local: &ClusterHandle,
    own_id: &str,
    new_key: &str,
    deadline: Instant,
    options: RotationOptions,
    progress: &dyn Progress,
) -> Result<(), RotationError> {
    let mut announced = local.load_info().await?.public_key;
    if announced == new_key {
        return Ok(());
    }
    progress.waiting(&local.label, "waiting for the gateway to run the new key");
    while announced != new_key {
        if Instant::now() + options.poll_interval > deadline {
            let error = RotationError::NotApplied {
                cluster: local.label.clone(),
                cluster_id: own_id.to_owned(),
                announced,
                timeout: options.timeout,
            };
            progress.failed(&local.label, &error_chain(&error));
            return Err(error);
        }
        tokio::time::sleep(options.poll_interval).await;
        announced = local.load_info().await?.public_key;
    }
    progress.waited(&local.label, "the gateway runs the new key");
    Ok(())
}

/// The peers the connector linked `local` with: its `to-<peer>` NetworkConfigs, sorted.
async fn linked_peers(local: &ClusterHandle, own_id: &str) -> Result<Vec<String>, RotationError> {
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_CONNECTOR},{ROLE_LABEL}={ROLE_LOCAL}");
    let configs: Api<NetworkConfig> = Api::namespaced(local.client.clone(), &local.namespace);
    let list = configs
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| RotationError::Api {
            cluster: format!("{}, cluster {own_id}", local.label),
            action: format!("list NetworkConfigs -l {selector}"),
            source,
        })?;
    let mut peers: Vec<String> = list
        .items
        .into_iter()
        .map(|nc| nc.spec.destination_cluster.id)
        .collect();
    peers.sort();
    peers.dedup();
    Ok(peers)
}

/// Writes `new_key` into the link's NetworkConfigs this run can reach.
async fn announce(
    local: &ClusterHandle,
    own_id: &str,
    peer_id: &str,
    remote: Option<&ClusterHandle>,
    new_key: &str,
    progress: &dyn Progress,
) -> PeerRotation {
    let mut peer = PeerRotation {
        peer_id: peer_id.to_owned(),
        propagation: Propagation::Missing,
        announced: false,
        moved: false,
        message: String::new(),
    };
    let owner = match link_owner(local, own_id, peer_id).await {
        Ok(owner) => owner,
        Err(error) => {
            peer.message = error_chain(&error);
            progress.failed(&local.label, &peer.message);
            return peer;
        }
    };
    peer.propagation = match (remote, &owner) {
        (Some(_), _) => Propagation::Direct,
        (None, Some(_)) => Propagation::Hub,
        (None, None) => Propagation::Missing,
    };
    let ours = set_public_key(
        local,
        own_id,
        &local_config_name(peer_id),
        new_key,
        progress,
    )
    .await;
    let theirs = match remote {
        Some(remote) => {
            set_public_key(
                remote,
                peer_id,
                &remote_config_name(own_id),
                new_key,
                progress,
            )
            .await
        }
        None => Ok(()),
    };
    match (ours, theirs, peer.propagation) {
        (Err(error), _, _) | (_, Err(error), _) => {
            peer.message = format!(
                "{}; the tunnel stays on the previous key until the key reaches the peer (run \
                 the command again to resume)",
                error_chain(&error)
            );
            progress.failed(&local.label, &peer.message);
        }
        (Ok(()), Ok(()), Propagation::Missing) => {
            peer.message = format!(
                "direct link: pass --remote-kubeconfig of cluster {peer_id} to announce the new \
                 key there (its tunnel stays on the previous key until then)"
            );
            progress.failed(&local.label, &peer.message);
        }
        (Ok(()), Ok(()), Propagation::Hub) => {
            peer.announced = true;
            let shortcut = owner.map(|o| format!("{} on hub {}", o.shortcut, o.hub));
            progress.done(
                &local.label,
                &format!(
                    "{peer_id}: ShortcutConnection {} carries the key over",
                    shortcut.unwrap_or_default()
                ),
            );
        }
        (Ok(()), Ok(()), Propagation::Direct) => peer.announced = true,
    }
    peer
}

/// Sets the public key of NetworkConfig `name` on `handle` (only that field, owned by the
/// connector like the rest of the object), unless it has it already.
async fn set_public_key(
    handle: &ClusterHandle,
    cluster_id: &str,
    name: &str,
    new_key: &str,
    progress: &dyn Progress,
) -> Result<(), connector::ConnectError> {
    let api: Api<NetworkConfig> = Api::namespaced(handle.client.clone(), &handle.namespace);
    let object = format!("NetworkConfig {}/{name}", handle.namespace);
    let api_error = |action: &'static str| {
        let object = object.clone();
        move |source| connector::ConnectError::Api {
            cluster: handle.label.clone(),
            cluster_id: cluster_id.to_owned(),
            action,
            object,
            source,
        }
    };
    let Some(config) = api.get_opt(name).await.map_err(api_error("get"))? else {
        progress.failed(
            &handle.label,
            &format!("{object} not found: is the link complete? (`kubetun network status`)"),
        );
        return Ok(());
    };
    if config.spec.public_key == new_key {
        progress.done(&handle.label, &format!("{object} has the new key"));
        return Ok(());
    }
    if config.labels().get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY_CONNECTOR) {
        return Err(connector::ConnectError::NotManaged {
            cluster: handle.label.clone(),
            cluster_id: cluster_id.to_owned(),
            object,
        });
    }
    let patch = serde_json::json!({ "spec": { "publicKey": new_key } });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    api.patch(name, &params, &Patch::Merge(&patch))
        .await
        .map_err(api_error("update"))?;
    progress.done(&handle.label, &format!("{object} announces the new key"));
    Ok(())
}

/// Updates `moved` and `complete` from the Secret and the TunnelEndpoints.
async fn observe(
    local: &ClusterHandle,
    own_id: &str,
    new_key: &str,
    report: &mut RotationReport,
) -> Result<(), RotationError> {
    let cluster = format!("{}, cluster {own_id}", local.label);
    let secrets: Api<Secret> = Api::namespaced(local.client.clone(), &local.namespace);
    let secret = secrets
        .get(kubetun_crds::contract::gateway_key::SECRET_NAME)
        .await
        .map_err(|source| RotationError::Api {
            cluster: cluster.clone(),
            action: format!(
                "read Secret {}",
                kubetun_crds::contract::gateway_key::SECRET_NAME
            ),
            source,
        })?;
    let keys = GatewayKeys::from_secret(&secret).map_err(|source| RotationError::Keys {
        cluster: cluster.clone(),
        source,
    })?;
    let tunnels: Api<TunnelEndpoint> = Api::namespaced(local.client.clone(), &local.namespace);
    let tunnels: BTreeMap<String, TunnelEndpoint> = tunnels
        .list(&ListParams::default())
        .await
        .map_err(|source| RotationError::Api {
            cluster,
            action: "list TunnelEndpoints".to_owned(),
            source,
        })?
        .items
        .into_iter()
        .map(|te| (te.spec.cluster.id.clone(), te))
        .collect();
    report.complete = keys.current.public_base64() == new_key && keys.previous.is_none();
    for peer in &mut report.peers {
        let connection = tunnels
            .get(&peer.peer_id)
            .and_then(|te| te.status.as_ref())
            .and_then(|s| s.connection.as_ref());
        peer.moved = report.complete
            || connection
                .is_some_and(|c| c.status == ConnectionState::Connected && !c.previous_key);
        if peer.moved && peer.announced {
            peer.message.clear();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_has_stable_field_names() {
        let report = RotationReport {
            cluster_id: "rome".into(),
            public_key: "NEW".into(),
            previous_public_key: Some("OLD".into()),
            resumed: true,
            complete: false,
            peers: vec![PeerRotation {
                peer_id: "europe".into(),
                propagation: Propagation::Missing,
                announced: false,
                moved: false,
                message: "pass --remote-kubeconfig".into(),
            }],
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "clusterId": "rome",
                "publicKey": "NEW",
                "previousPublicKey": "OLD",
                "resumed": true,
                "complete": false,
                "peers": [{
                    "peerId": "europe",
                    "propagation": "missing",
                    "announced": false,
                    "moved": false,
                    "message": "pass --remote-kubeconfig",
                }],
            })
        );
        assert_eq!(
            report
                .unannounced()
                .map(|p| p.peer_id.as_str())
                .collect::<Vec<_>>(),
            ["europe"]
        );
    }
}
