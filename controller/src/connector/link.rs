//! Bringing a link up: [`Connector::sync`] applies the four NetworkConfigs and observes both
//! directions once; [`Connector::connect`] repeats it until the link is processed or connected.

use kubetun_crds::contract::link::{ROLE_LOCAL, ROLE_REMOTE};
use kubetun_crds::{NetworkConfig, TunnelEndpoint};
use tokio::time::Instant;

use super::publish::{ConfigTarget, apply_config, mirror_status};
use super::state::{current_processed_status, current_rejection};
use super::{
    ClusterHandle, ConnectError, Connector, Direction, LinkState, Progress, WaitOptions,
    describe_views, error_chain,
};
use crate::planner::{local_config_name, remote_config_name};
use crate::plumbing::cluster_info::ClusterInfo;

impl Connector {
    /// One pass: applies the four NetworkConfigs, mirrors processed statuses and reads both
    /// TunnelEndpoints. Writes only what differs from the desired state and reports only
    /// writes.
    pub async fn sync(&self, progress: &dyn Progress) -> Result<LinkState, ConnectError> {
        self.pass(progress, false).await
    }

    /// [`sync`](Self::sync), also reporting the NetworkConfigs found up to date.
    async fn pass(
        &self,
        progress: &dyn Progress,
        report_unchanged: bool,
    ) -> Result<LinkState, ConnectError> {
        let (local, remote) = self.load_infos().await?;
        let mut writes = 0;
        // With a transit hub, each side's NetworkConfig says how the hub sees that side.
        let (local_fallback, remote_fallback) = match &self.transit {
            Some(transit) => {
                let (l, r) = super::transit::fallback_via(
                    &transit.hub,
                    &transit.grant,
                    &local.cluster.id,
                    &remote.cluster.id,
                )
                .await?;
                (Some(l), Some(r))
            }
            None => (None, None),
        };
        let hub_only = self.transit.as_ref().is_some_and(|t| t.hub_only);
        let [local_isolation, remote_isolation] = self.isolation;
        for (from, from_info, to, to_info, fallback, isolation) in [
            (
                &self.local,
                &local,
                &self.remote,
                &remote,
                local_fallback,
                local_isolation,
            ),
            (
                &self.remote,
                &remote,
                &self.local,
                &local,
                remote_fallback,
                remote_isolation,
            ),
        ] {
            let mut spec = from_info.network_config_for(&to_info.cluster);
            spec.fallback = fallback;
            spec.hub_only = hub_only;
            spec.isolation = isolation;
            let outgoing = ConfigTarget {
                owner: self.owner.as_ref(),
                handle: from,
                cluster_id: &from_info.cluster.id,
                name: local_config_name(&to_info.cluster.id),
                role: ROLE_LOCAL,
                peer_id: &to_info.cluster.id,
            };
            writes += apply_config(outgoing, &spec, progress, report_unchanged).await?;
            let incoming = ConfigTarget {
                owner: self.owner.as_ref(),
                handle: to,
                cluster_id: &to_info.cluster.id,
                name: remote_config_name(&from_info.cluster.id),
                role: ROLE_REMOTE,
                peer_id: &from_info.cluster.id,
            };
            writes += apply_config(incoming, &spec, progress, report_unchanged).await?;
            writes += super::services_access::grant(
                from,
                &from_info.cluster.id,
                to,
                &to_info.cluster.id,
                progress,
            )
            .await?;
        }
        let remote_to_local = self
            .observe(
                &self.remote,
                &remote,
                &self.local,
                &local,
                progress,
                &mut writes,
            )
            .await?;
        let local_to_remote = self
            .observe(
                &self.local,
                &local,
                &self.remote,
                &remote,
                progress,
                &mut writes,
            )
            .await?;
        Ok(LinkState {
            local,
            remote,
            local_to_remote,
            remote_to_local,
            writes,
        })
    }

    /// How `viewer` sees `viewed`: reads `viewer`'s `from-<viewed>`, mirrors its status onto
    /// `viewed`'s `to-<viewer>` once processed, and reads `viewer`'s TunnelEndpoint.
    async fn observe(
        &self,
        viewer: &ClusterHandle,
        viewer_info: &ClusterInfo,
        viewed: &ClusterHandle,
        viewed_info: &ClusterInfo,
        progress: &dyn Progress,
        writes: &mut usize,
    ) -> Result<Direction, ConnectError> {
        let viewer_id = &viewer_info.cluster.id;
        let viewed_id = &viewed_info.cluster.id;
        let incoming_name = remote_config_name(viewed_id);
        let incoming = viewer
            .configs()
            .get_opt(&incoming_name)
            .await
            .map_err(viewer.api_error::<NetworkConfig>(viewer_id, "get", &incoming_name))?;
        let processed_status = incoming.as_ref().and_then(current_processed_status);
        let rejection = incoming.as_ref().and_then(current_rejection);

        if let Some(status) = &processed_status {
            *writes += mirror_status(
                viewed,
                viewed_id,
                &local_config_name(viewer_id),
                status,
                progress,
            )
            .await?;
        }

        let tunnel = viewer
            .tunnels()
            .get_opt(viewed_id)
            .await
            .map_err(viewer.api_error::<TunnelEndpoint>(viewer_id, "get", viewed_id))?
            .filter(|te| te.spec.cluster.id == *viewed_id);
        // A TunnelEndpoint built from an older NetworkConfig (or whose status predates its
        // spec) does not describe this link yet.
        let announced = incoming.as_ref().map(|nc| &nc.spec);
        let tunnel = tunnel.filter(|te| {
            let spec_current = announced.is_some_and(|spec| {
                te.spec.endpoint == spec.endpoint && te.spec.public_key == spec.public_key
            });
            let status_current = te.status.as_ref().is_some_and(|status| {
                status.observed_generation.is_none()
                    || status.observed_generation >= te.metadata.generation
            });
            spec_current && status_current
        });
        let (pod_cidrs, external_cidrs) = match (&tunnel, &processed_status) {
            (Some(te), _) => (
                te.spec.remote_pod_cidrs.clone(),
                te.spec.remote_external_cidrs.clone(),
            ),
            (None, Some(status)) => (status.pod_cidrs.clone(), status.external_cidrs.clone()),
            (None, None) => (Vec::new(), Vec::new()),
        };
        Ok(Direction {
            from_label: viewer.label.clone(),
            from: viewer_info.cluster.clone(),
            to: viewed_info.cluster.clone(),
            processed: processed_status.is_some(),
            pod_cidrs,
            external_cidrs,
            tunnel_endpoint: tunnel.is_some(),
            connection: tunnel.and_then(|te| te.status).and_then(|s| s.connection),
            rejection,
        })
    }

    /// Links the clusters: repeats [`sync`](Self::sync) until both NetworkConfigs are
    /// processed and, with `options.wait`, both tunnels are connected. Fails fast when a
    /// cluster rejects a NetworkConfig.
    pub async fn connect(
        &self,
        options: WaitOptions,
        progress: &dyn Progress,
    ) -> Result<LinkState, ConnectError> {
        let deadline = Instant::now() + options.timeout;
        let mut state = self.pass(progress, true).await?;
        let directions = [
            (Side::Remote, "to process our NetworkConfig"),
            (Side::Local, "to process the remote NetworkConfig"),
        ];
        for (side, what) in directions {
            let handle = self.handle(side);
            let message = format!("waiting {what}");
            progress.waiting(&handle.label, &message);
            loop {
                let direction = side.viewing(&state);
                if let Some(rejection) = &direction.rejection {
                    let error = ConnectError::Rejected {
                        cluster: handle.label.clone(),
                        cluster_id: direction.from.id.clone(),
                        object: handle
                            .object::<NetworkConfig>(&remote_config_name(&direction.to.id)),
                        reason: rejection.reason.clone(),
                        message: rejection.message.clone(),
                    };
                    progress.failed(&handle.label, &error_chain(&error));
                    return Err(error);
                }
                if direction.processed {
                    progress.waited(
                        &handle.label,
                        &format!("processed: {}", describe_views(direction)),
                    );
                    break;
                }
                state = self
                    .next_pass(&state, side, &message, deadline, options, progress)
                    .await?;
            }
        }
        if !options.wait {
            return Ok(state);
        }
        for side in [Side::Local, Side::Remote] {
            let handle = self.handle(side);
            let message = format!(
                "waiting for the tunnel to {} to connect",
                side.viewing(&state).to.id
            );
            progress.waiting(&handle.label, &message);
            while !side.viewing(&state).is_connected() {
                state = self
                    .next_pass(&state, side, &message, deadline, options, progress)
                    .await?;
            }
            let latency = side
                .viewing(&state)
                .connection
                .as_ref()
                .and_then(|c| c.latency.clone())
                .map(|l| format!(" (latency {l})"))
                .unwrap_or_default();
            progress.waited(&handle.label, &format!("tunnel connected{latency}"));
        }
        Ok(state)
    }

    /// Sleeps one poll interval and runs the next pass, or fails when the deadline has passed.
    async fn next_pass(
        &self,
        state: &LinkState,
        side: Side,
        what: &str,
        deadline: Instant,
        options: WaitOptions,
        progress: &dyn Progress,
    ) -> Result<LinkState, ConnectError> {
        if Instant::now() + options.poll_interval > deadline {
            let direction = side.viewing(state);
            let error = ConnectError::Timeout {
                cluster: self.handle(side).label.clone(),
                cluster_id: direction.from.id.clone(),
                what: what.trim_start_matches("waiting ").to_owned(),
                timeout: options.timeout,
                last: direction.describe(),
            };
            progress.failed(&self.handle(side).label, &error_chain(&error));
            return Err(error);
        }
        tokio::time::sleep(options.poll_interval).await;
        self.sync(progress).await
    }

    fn handle(&self, side: Side) -> &ClusterHandle {
        match side {
            Side::Local => &self.local,
            Side::Remote => &self.remote,
        }
    }
}

/// Which handle of a connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Local,
    Remote,
}

impl Side {
    /// The direction this side views.
    fn viewing(self, state: &LinkState) -> &Direction {
        match self {
            Self::Local => &state.local_to_remote,
            Self::Remote => &state.remote_to_local,
        }
    }
}
