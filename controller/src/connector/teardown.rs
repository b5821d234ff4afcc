//! Taking links down: [`Connector::disconnect`] when both clusters answer, [`forget`] and
//! [`reset`] for whatever side still does, and [`wait_removed`] until finalizers let go.

use kube::ResourceExt;
use kube::api::ListParams;
use kubetun_crds::contract::link::{MANAGED_BY_CONNECTOR, MANAGED_BY_LABEL, PEER_LABEL};
use kubetun_crds::{NetworkConfig, TunnelEndpoint};
use tokio::time::Instant;

use super::delete::{Removed, delete_ignoring_missing};
use super::{ClusterHandle, ConnectError, Connector, Progress, WaitOptions, error_chain};

impl Connector {
    /// Removes the link: deletes, on both clusters, the NetworkConfigs the connector made for
    /// the other one. With `options.wait`, waits until both controllers have removed their
    /// TunnelEndpoint.
    pub async fn disconnect(
        &self,
        options: WaitOptions,
        progress: &dyn Progress,
    ) -> Result<[Removed; 2], ConnectError> {
        let (local, remote) = self.load_infos().await?;
        let removed_local =
            remove_link(&self.local, &local.cluster.id, &remote.cluster.id, progress).await?;
        let removed_remote = remove_link(
            &self.remote,
            &remote.cluster.id,
            &local.cluster.id,
            progress,
        )
        .await?;
        if options.wait {
            let deadline = Instant::now() + options.timeout;
            for (handle, own, peer) in [
                (&self.local, &local, &remote),
                (&self.remote, &remote, &local),
            ] {
                let peer_id = &peer.cluster.id;
                let message = format!("waiting for TunnelEndpoint {peer_id} to be removed");
                progress.waiting(&handle.label, &message);
                loop {
                    let present = handle
                        .tunnels()
                        .get_opt(peer_id)
                        .await
                        .map_err(handle.api_error::<TunnelEndpoint>(
                            &own.cluster.id,
                            "get",
                            peer_id,
                        ))?
                        .is_some();
                    if !present {
                        progress
                            .waited(&handle.label, &format!("TunnelEndpoint {peer_id} removed"));
                        break;
                    }
                    if Instant::now() + options.poll_interval > deadline {
                        let error = ConnectError::Timeout {
                            cluster: handle.label.clone(),
                            cluster_id: own.cluster.id.clone(),
                            what: format!("TunnelEndpoint {peer_id} to be removed"),
                            timeout: options.timeout,
                            last: "still present".to_owned(),
                        };
                        progress.failed(&handle.label, &error_chain(&error));
                        return Err(error);
                    }
                    tokio::time::sleep(options.poll_interval).await;
                }
            }
        }
        Ok([removed_local, removed_remote])
    }
}

/// Removes, on one cluster, everything the connector made for `peer_id` and the
/// TunnelEndpoint the controller built from it — for a peer that is gone or unreachable.
/// `cluster_id` only labels errors; pass the id if known, else the handle's label.
pub async fn forget(
    handle: &ClusterHandle,
    cluster_id: &str,
    peer_id: &str,
    progress: &dyn Progress,
) -> Result<Removed, ConnectError> {
    let mut removed = remove_link(handle, cluster_id, peer_id, progress).await?;
    let tunnels = handle.tunnels();
    let stale = tunnels
        .get_opt(peer_id)
        .await
        .map_err(handle.api_error::<TunnelEndpoint>(cluster_id, "get", peer_id))?;
    if stale.is_some_and(|te| te.spec.cluster.id == peer_id) {
        delete_ignoring_missing(&tunnels, peer_id)
            .await
            .map_err(handle.api_error::<TunnelEndpoint>(cluster_id, "delete", peer_id))?;
        let object = handle.object::<TunnelEndpoint>(peer_id);
        progress.done(&handle.label, &format!("deletion of {object} requested"));
        removed.objects.push(object);
        removed.deleted.push(("TunnelEndpoint", peer_id.to_owned()));
    }
    Ok(removed)
}

/// Disconnects and forgets: cleans every reachable side even when the other one is not.
/// `peer_ids` gives each side's peer id when the other cluster's info cannot be read
/// (`[id the local cluster knows the remote by, id the remote knows the local by]`).
pub async fn reset(
    local: &ClusterHandle,
    remote: &ClusterHandle,
    peer_ids: [Option<&str>; 2],
    progress: &dyn Progress,
) -> Result<[Option<Removed>; 2], ConnectError> {
    let (local_info, remote_info) = tokio::join!(local.load_info(), remote.load_info());
    let mut problems = Vec::new();
    let mut result = [None, None];
    let sides = [
        (local, &local_info, &remote_info, peer_ids[0]),
        (remote, &remote_info, &local_info, peer_ids[1]),
    ];
    for (slot, (handle, own, peer, fallback_peer)) in result.iter_mut().zip(sides) {
        let own_id = match own {
            Ok(info) => info.cluster.id.clone(),
            Err(error) => {
                let message = error_chain(error);
                progress.failed(&handle.label, &format!("skipped: {message}"));
                problems.push(message);
                continue;
            }
        };
        let Some(peer_id) = peer
            .as_ref()
            .map(|info| info.cluster.id.clone())
            .ok()
            .or(fallback_peer.map(str::to_owned))
        else {
            // The flag of `kubetun network reset` that supplies this side's peer id.
            let flag = if std::ptr::eq(handle, local) {
                "--remote-cluster-id"
            } else {
                "--local-cluster-id"
            };
            let message = format!(
                "skipped: the peer's cluster id is unknown (its cluster info cannot be read); \
                 pass it with {flag}"
            );
            progress.failed(&handle.label, &message);
            problems.push(format!("({}) {message}", handle.label));
            continue;
        };
        match forget(handle, &own_id, &peer_id, progress).await {
            Ok(removed) => *slot = Some(removed),
            Err(error) => problems.push(error_chain(&error)),
        }
    }
    if result.iter().all(Option::is_none) {
        return Err(ConnectError::NothingReset(problems.join("; ")));
    }
    Ok(result)
}

/// Waits until every object `removed` lists is gone from `handle` (finalizers done), or
/// fails after `timeout` naming what is left and the finalizers holding it.
pub async fn wait_removed(
    handle: &ClusterHandle,
    cluster_id: &str,
    removed: &Removed,
    options: WaitOptions,
    progress: &dyn Progress,
) -> Result<(), ConnectError> {
    if removed.deleted.is_empty() {
        return Ok(());
    }
    let deadline = Instant::now() + options.timeout;
    progress.waiting(
        &handle.label,
        &format!(
            "waiting for {} object(s) to be removed",
            removed.deleted.len()
        ),
    );
    loop {
        let mut left = Vec::new();
        for (kind, name) in &removed.deleted {
            let finalizers = match *kind {
                "TunnelEndpoint" => handle
                    .tunnels()
                    .get_opt(name)
                    .await
                    .map_err(handle.api_error::<TunnelEndpoint>(cluster_id, "get", name))?
                    .map(|o| o.finalizers().to_vec()),
                _ => handle
                    .configs()
                    .get_opt(name)
                    .await
                    .map_err(handle.api_error::<NetworkConfig>(cluster_id, "get", name))?
                    .map(|o| o.finalizers().to_vec()),
            };
            if let Some(finalizers) = finalizers {
                let held = if finalizers.is_empty() {
                    "being deleted".to_owned()
                } else {
                    format!("finalizer {}", finalizers.join(", "))
                };
                left.push(format!("{kind} {}/{name} ({held})", handle.namespace));
            }
        }
        if left.is_empty() {
            progress.waited(
                &handle.label,
                &format!("removed {}", removed.objects.join(", ")),
            );
            return Ok(());
        }
        if Instant::now() + options.poll_interval > deadline {
            let error = ConnectError::StillTerminating {
                cluster: handle.label.clone(),
                cluster_id: cluster_id.to_owned(),
                objects: left.join(", "),
                timeout: options.timeout,
            };
            progress.failed(
                &handle.label,
                &format!("still terminating: {}", left.join(", ")),
            );
            return Err(error);
        }
        tokio::time::sleep(options.poll_interval).await;
    }
}

/// Deletes every NetworkConfig the connector made on `handle` for `peer_id`.
/// Removes the link's NetworkConfigs and services credentials on one side.
async fn remove_link(
    handle: &ClusterHandle,
    cluster_id: &str,
    peer_id: &str,
    progress: &dyn Progress,
) -> Result<Removed, ConnectError> {
    let mut removed = remove_configs(handle, cluster_id, peer_id, progress).await?;
    super::services_access::revoke(handle, cluster_id, peer_id, &mut removed, progress).await?;
    Ok(removed)
}

async fn remove_configs(
    handle: &ClusterHandle,
    cluster_id: &str,
    peer_id: &str,
    progress: &dyn Progress,
) -> Result<Removed, ConnectError> {
    let api = handle.configs();
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_CONNECTOR},{PEER_LABEL}={peer_id}");
    let configs = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(handle.api_error::<NetworkConfig>(
            cluster_id,
            "list",
            &format!("-l {selector}"),
        ))?;
    let mut names: Vec<String> = configs.iter().map(ResourceExt::name_any).collect();
    names.sort();
    let mut removed = Removed::default();
    for name in names {
        delete_ignoring_missing(&api, &name)
            .await
            .map_err(handle.api_error::<NetworkConfig>(cluster_id, "delete", &name))?;
        let object = handle.object::<NetworkConfig>(&name);
        progress.done(&handle.label, &format!("deletion of {object} requested"));
        removed.objects.push(object);
        removed.deleted.push(("NetworkConfig", name));
    }
    if removed.objects.is_empty() {
        progress.done(
            &handle.label,
            &format!("no NetworkConfig for {peer_id} to delete"),
        );
    }
    Ok(removed)
}
