//! The gateway sync: pushes the desired state built from every TunnelEndpoint to the local
//! gateway and brings the gateway's status back into the TunnelEndpoints.
//!
//! The TunnelEndpoints come from the context's [`cache`](crate::operator::network_config::context::State::cache); the
//! watch feeding it wakes the sync when one is created, changed in spec or deleted. This
//! cluster's exports (what the admissions of `exported` links admit) come from the
//! [`exports`](crate::operator::network_config::context::State::exports) board, whose
//! publishes wake it too: an export appearing or going is applied within the services
//! operator's pass plus one sync.
//!
//! The gateway is watched (gRPC `Watch`); whenever it reports a version other than the
//! desired one (it restarted, someone else applied) or the stream breaks and comes back, the
//! whole state is applied again. A state the gateway rejected is not retried until it
//! changes.

pub mod status;

use std::collections::{HashMap, HashSet};

use futures::StreamExt as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt as _;
use kubetun_crds::{Isolation, TunnelEndpoint, TunnelEndpointStatus};

use crate::gateway_api::{DesiredState, StatusResponse};
use crate::operator::network_config::context::Context;
use crate::operator::network_config::error::Error;
use crate::planner;
use crate::plumbing::gateway_client::{GatewayClient, GatewayClientError};
use status::GatewayReport;

/// How often the gateway pushes its status on the watch stream.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// How long one sync (API reads, Apply, status writes) may take before it starts over.
const SYNC_TIMEOUT: Duration = Duration::from_secs(5);
/// After a sync timed out, the next may take twice as long, up to this: with hundreds of
/// TunnelEndpoints on a slow API server a pass needs more than [`SYNC_TIMEOUT`], and a fixed
/// deadline started it over without end.
const SYNC_TIMEOUT_MAX: Duration = Duration::from_secs(60);
/// How long opening the gateway's status watch may take.
const WATCH_OPEN_TIMEOUT: Duration = Duration::from_secs(2);
/// While this cluster's exports are not known yet (the services operator's first pass has
/// not run: a restart), a state with an `exported` link is held back until the controller's
/// context is this old, rather than applied with no exports (which would refuse the flows
/// the gateway still admits); after it, it is applied with none (fail closed).
const EXPORTS_WAIT: Duration = Duration::from_secs(10);
/// Full resync even without any trigger.
const RESYNC: Duration = Duration::from_secs(30);
/// First and largest delay between attempts to reach a gateway that is down.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(1);
/// Counter-only status writes are spread so that all TunnelEndpoints together cause at most
/// one per this interval: bytes change all the time (probes, keepalives), and 500 peers
/// refreshed every [`COUNTER_REFRESH`] were 50 writes per second on a quiet hub.
const COUNTER_WRITE_SPACING: Duration = Duration::from_millis(200);

/// How often one TunnelEndpoint's counters alone are written when there are `endpoints`:
/// `configured`, or longer so the total stays within [`COUNTER_WRITE_SPACING`]. Zero (tests)
/// stays zero.
fn counter_refresh_for(configured: Duration, endpoints: usize) -> Duration {
    if configured.is_zero() {
        return configured;
    }
    let spread = COUNTER_WRITE_SPACING.saturating_mul(u32::try_from(endpoints).unwrap_or(u32::MAX));
    configured.max(spread)
}

/// How long a status write may take to reach the cache through the TunnelEndpoint watch.
const CACHE_LAG: Duration = Duration::from_secs(5);
/// TunnelEndpoint status writes one sync keeps in flight.
const STATUS_WRITES_IN_FLIGHT: usize = 16;
/// How often changed counters (bytes, latency) alone are written to TunnelEndpoint statuses.
const COUNTER_REFRESH: Duration = Duration::from_secs(10);

/// What one sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewaySyncOutcome {
    /// Version of the desired state.
    pub version: String,
    /// Peers in the desired state.
    pub peers: usize,
    /// Whether an Apply was sent (the gateway ran another version).
    pub applied: bool,
    /// Why the gateway does not run the desired state, if it does not.
    pub error: Option<String>,
}

/// The sync loop's state. One per gateway.
#[derive(Debug)]
pub struct GatewaySync {
    ctx: Arc<Context>,
    gateway: GatewayClient,
    counter_refresh: Duration,
    desired_version: Option<String>,
    rejected: Option<(String, String)>,
    last_write: HashMap<String, Instant>,
    /// The TunnelEndpoints as of the last sync, with the statuses written since: watch
    /// updates are matched against these instead of listing the API every second.
    endpoints: Vec<TunnelEndpoint>,
    /// How long the next pass may take ([`SYNC_TIMEOUT`], doubled after each timeout).
    pass_timeout: Duration,
}

impl GatewaySync {
    /// A sync for `gateway`.
    pub fn new(ctx: Arc<Context>, gateway: GatewayClient) -> Self {
        Self {
            ctx,
            gateway,
            counter_refresh: COUNTER_REFRESH,
            desired_version: None,
            rejected: None,
            last_write: HashMap::new(),
            endpoints: Vec::new(),
            pass_timeout: SYNC_TIMEOUT,
        }
    }

    /// Writes counter-only status changes at most every `refresh` (zero: always).
    pub fn with_counter_refresh(mut self, refresh: Duration) -> Self {
        self.counter_refresh = refresh;
        self
    }

    /// One pass: desired state from every TunnelEndpoint, Apply unless the gateway already
    /// runs it, then every TunnelEndpoint's status from the gateway's answer.
    pub async fn sync(&mut self) -> Result<GatewaySyncOutcome, Error> {
        self.ctx.metrics.reconciled("gateway");
        let started = Instant::now();
        let mut endpoints = self.ctx.cache.tunnel_endpoints().await?;
        self.keep_recent_statuses(&mut endpoints);
        let listed = started.elapsed();
        endpoints.sort_by_key(|te| te.name_any());
        let specs: Vec<_> = endpoints.iter().map(|te| te.spec.clone()).collect();
        let exports = self.ctx.exports.current();
        if exports.is_none()
            && specs.iter().any(|s| s.isolation == Isolation::Exported)
            && self.ctx.exports.age() < EXPORTS_WAIT
        {
            tracing::debug!("gateway sync waits for this cluster's exports");
            self.endpoints = endpoints;
            return Ok(GatewaySyncOutcome {
                version: String::new(),
                peers: 0,
                applied: false,
                error: Some("waiting for this cluster's exports".to_owned()),
            });
        }
        let none = planner::admission::Answers::new();
        let desired = planner::desired_state_with(
            &self.ctx.gateway_settings(),
            &specs,
            exports.as_ref().map_or(&[][..], |e| e.endpoints.as_slice()),
            exports.as_ref().map_or(&none, |e| &e.answers),
        );
        let version = desired.version.clone();
        let peers = desired.peers.len();
        self.desired_version = Some(version.clone());

        let pushed = self.push(desired).await;
        let pushed_at = started.elapsed();
        let applied = matches!(pushed, Ok((_, true)));
        let report = match &pushed {
            Ok((status, _)) => {
                self.ctx.set_gateway_status(Some(status.clone()));
                GatewayReport::Reported {
                    status,
                    desired_version: &version,
                }
            }
            Err(error) => {
                self.ctx.set_gateway_status(None);
                GatewayReport::Failed(error)
            }
        };
        let written = self.write_statuses(&mut endpoints, report).await;
        tracing::debug!(
            endpoints = endpoints.len(),
            list_ms = listed.as_millis(),
            push_ms = (pushed_at - listed).as_millis(),
            status_writes_ms = (started.elapsed() - pushed_at).as_millis(),
            "gateway sync pass"
        );
        self.endpoints = endpoints;
        written?;
        Ok(GatewaySyncOutcome {
            version,
            peers,
            applied,
            error: pushed.err().map(|e| e.to_string()),
        })
    }

    /// Puts the statuses written within [`CACHE_LAG`] onto `endpoints`: the cache may not
    /// show them yet, and each pass in between would write them again.
    fn keep_recent_statuses(&self, endpoints: &mut [TunnelEndpoint]) {
        let written: HashMap<&str, &TunnelEndpoint> = self
            .endpoints
            .iter()
            .filter(|te| {
                self.last_write
                    .get(te.name_any().as_str())
                    .is_some_and(|at| at.elapsed() < CACHE_LAG)
            })
            .filter_map(|te| Some((te.metadata.name.as_deref()?, te)))
            .collect();
        for endpoint in endpoints {
            if let Some(previous) = endpoint
                .metadata
                .name
                .as_deref()
                .and_then(|name| written.get(name))
                && previous.metadata.uid == endpoint.metadata.uid
            {
                endpoint.status.clone_from(&previous.status);
            }
        }
    }

    async fn push(
        &mut self,
        desired: DesiredState,
    ) -> Result<(StatusResponse, bool), GatewayClientError> {
        let current = self.gateway.status().await?;
        if current.version == desired.version {
            self.rejected = None;
            return Ok((current, false));
        }
        if let Some((version, message)) = &self.rejected
            && *version == desired.version
        {
            return Err(GatewayClientError::Rejected {
                socket: self.gateway.socket().to_owned(),
                message: message.clone(),
            });
        }
        let version = desired.version.clone();
        let peers = desired.peers.len();
        match self.gateway.apply(desired).await {
            Ok(response) => {
                self.ctx.metrics.gateway_applies.inc();
                self.rejected = None;
                tracing::info!(
                    version,
                    peers,
                    generation = response.generation,
                    changed = response.changed,
                    previous = current.version,
                    "desired state applied to the gateway"
                );
                for error in &response.host_errors {
                    tracing::warn!(%error, "the gateway's host configuration failed; it retries");
                }
            }
            Err(error) => {
                if let GatewayClientError::Rejected { message, .. } = &error {
                    self.ctx.metrics.gateway_rejections.inc();
                    tracing::warn!(version, %error, "the gateway rejected the desired state");
                    self.rejected = Some((version, message.clone()));
                }
                return Err(error);
            }
        }
        Ok((self.gateway.status().await?, true))
    }

    async fn write_statuses(
        &mut self,
        endpoints: &mut [TunnelEndpoint],
        report: GatewayReport<'_>,
    ) -> Result<(), Error> {
        let now = self.ctx.now();
        let refresh = counter_refresh_for(self.counter_refresh, endpoints.len());
        let mut due_writes = Vec::new();
        for (index, endpoint) in endpoints.iter().enumerate() {
            let status = status::status_from_report(endpoint, report, now.clone());
            let due = self
                .last_write
                .get(endpoint.name_any().as_str())
                .is_none_or(|at| at.elapsed() >= refresh);
            let write = status::differs_significantly(endpoint.status.as_ref(), &status)
                || (due && endpoint.status.as_ref() != Some(&status));
            if write {
                due_writes.push((index, status));
            }
        }
        // Concurrently: one request after another, hundreds of peers took longer than a
        // pass may (SYNC_TIMEOUT), and the pass started over without end.
        let ctx = &self.ctx;
        let endpoints_ref: &[TunnelEndpoint] = endpoints;
        let results: Vec<(usize, TunnelEndpointStatus, Result<(), Error>)> =
            futures::stream::iter(due_writes.into_iter().map(|(index, status)| async move {
                let written = status::write_status(ctx, &endpoints_ref[index], &status).await;
                (index, status, written)
            }))
            .buffer_unordered(STATUS_WRITES_IN_FLIGHT)
            .collect()
            .await;
        let mut first_error = None;
        for (index, status, written) in results {
            match written {
                Ok(()) => {
                    let endpoint = &mut endpoints[index];
                    self.last_write.insert(endpoint.name_any(), Instant::now());
                    endpoint.status = Some(status);
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        let present: HashSet<String> = endpoints.iter().map(|e| e.name_any()).collect();
        self.last_write.retain(|name, _| present.contains(name));
        first_error.map_or(Ok(()), Err)
    }

    async fn sync_logged(&mut self) {
        // API requests have no deadline of their own (kube's read timeout is sized for
        // watches); a sync stuck on one gives up and starts over.
        let timeout = self.pass_timeout;
        let Ok(result) = tokio::time::timeout(timeout, self.sync()).await else {
            self.pass_timeout = (timeout * 2).min(SYNC_TIMEOUT_MAX);
            if self.ctx.health.is_down() {
                tracing::debug!(?timeout, "gateway sync timed out; retrying");
            } else {
                tracing::warn!(?timeout, next_timeout = ?self.pass_timeout, "gateway sync timed out; retrying");
            }
            self.ctx.wake_gateway_sync();
            return;
        };
        self.pass_timeout = SYNC_TIMEOUT;
        match result {
            Ok(outcome) => {
                if let Some(error) = outcome.error {
                    tracing::debug!(%error, "gateway does not run the desired state");
                }
            }
            Err(error) => {
                self.ctx.metrics.failed("gateway", &error);
                if matches!(&error, Error::Kube(e) if self.ctx.health.is_down() || crate::plumbing::runtime::is_transient(e))
                {
                    tracing::debug!(%error, "gateway sync failed");
                } else {
                    tracing::warn!(%error, "gateway sync failed");
                }
            }
        }
    }

    /// Runs until the task is dropped: keeps the gateway on the desired state and the
    /// TunnelEndpoint statuses current.
    pub async fn run(mut self) {
        let mut resync = tokio::time::interval(RESYNC);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reconnect_delay = RECONNECT_MIN;
        let mut reachable = None;
        loop {
            // A gateway that accepts but does not answer (stuck, or still starting) is treated
            // as unreachable rather than holding the loop.
            let stream =
                match tokio::time::timeout(WATCH_OPEN_TIMEOUT, self.gateway.watch(WATCH_INTERVAL))
                    .await
                {
                    Ok(result) => result,
                    Err(_) => Err(GatewayClientError::Unavailable {
                        socket: self.gateway.socket().to_owned(),
                        message: format!("the watch did not open within {WATCH_OPEN_TIMEOUT:?}"),
                    }),
                };
            let now_reachable = stream.is_ok();
            if reachable != Some(now_reachable) || now_reachable {
                // A (re)connected gateway gets the state again if it lost it; a gateway that
                // just went away shows up in the TunnelEndpoint statuses.
                self.sync_logged().await;
            }
            if reachable != Some(now_reachable) {
                match &stream {
                    Ok(_) => {
                        tracing::info!(socket = %self.gateway.socket().display(), "gateway connected")
                    }
                    Err(error) => tracing::warn!(%error, "gateway unreachable; retrying"),
                }
            }
            reachable = Some(now_reachable);
            let mut stream = match stream {
                Ok(stream) => {
                    reconnect_delay = RECONNECT_MIN;
                    stream
                }
                Err(error) => {
                    tracing::debug!(%error, "gateway watch failed");
                    tokio::select! {
                        () = tokio::time::sleep(reconnect_delay) => {}
                        () = self.ctx.gateway_sync_requested() => self.sync_logged().await,
                        () = self.ctx.exports.changed() => self.sync_logged().await,
                    }
                    reconnect_delay = (reconnect_delay * 2).min(RECONNECT_MAX);
                    continue;
                }
            };
            loop {
                let pass = tokio::select! {
                    () = self.ctx.gateway_sync_requested() => true,
                    () = self.ctx.exports.changed() => true,
                    _ = resync.tick() => true,
                    message = stream.message() => match message {
                        Ok(Some(status)) => {
                            self.on_status(status).await;
                            false
                        }
                        Ok(None) | Err(_) => {
                            tracing::info!("gateway watch stream ended; reconnecting");
                            break;
                        }
                    },
                };
                if pass && !self.sync_watching(&mut stream).await {
                    tracing::info!("gateway watch stream ended during a sync pass; reconnecting");
                    break;
                }
            }
        }
    }

    /// A sync pass that gives way when the gateway goes away meanwhile (its watch ends): a
    /// pass waiting on a slow API server (one that just restarted answers late) would
    /// otherwise hold off the reconnect, and with it the state a restarted gateway needs, until
    /// the pass's deadline. Statuses that arrive meanwhile are handled after the pass. False
    /// when the watch ended (the pass was dropped; the reconnect passes again at once).
    async fn sync_watching(&mut self, stream: &mut tonic::Streaming<StatusResponse>) -> bool {
        let mut received = Vec::new();
        let ended = {
            let pass = self.sync_logged();
            tokio::pin!(pass);
            loop {
                tokio::select! {
                    () = &mut pass => break false,
                    message = stream.message() => match message {
                        Ok(Some(status)) => received.push(status),
                        Ok(None) | Err(_) => break true,
                    },
                }
            }
        };
        if ended {
            return false;
        }
        for status in received {
            self.on_status(status).await;
        }
        true
    }

    async fn on_status(&mut self, status: StatusResponse) {
        if self.desired_version.as_deref() != Some(status.version.as_str()) {
            // News only when the gateway had confirmed the desired state and lost it (a
            // restart); before the first confirmation this is the normal start.
            let lost = self.ctx.gateway_status().is_some_and(|previous| {
                self.desired_version.as_deref() == Some(previous.version.as_str())
            });
            let desired_version = self.desired_version.as_deref().unwrap_or("");
            if lost {
                tracing::info!(
                    gateway_version = status.version,
                    desired_version,
                    generation = status.generation,
                    "the gateway no longer runs the desired state (restarted?); applying it again"
                );
            } else {
                tracing::debug!(
                    gateway_version = status.version,
                    desired_version,
                    generation = status.generation,
                    "applying desired state to gateway"
                );
            }
            self.sync_logged().await;
            return;
        }
        self.ctx.set_gateway_status(Some(status.clone()));
        let mut endpoints = std::mem::take(&mut self.endpoints);
        let report = GatewayReport::Reported {
            status: &status,
            desired_version: &status.version,
        };
        let written = self.write_statuses(&mut endpoints, report).await;
        self.endpoints = endpoints;
        if let Err(error) = written {
            // Most likely a TunnelEndpoint went away since the last sync: start over.
            tracing::debug!(%error, "cannot update TunnelEndpoint statuses; resyncing");
            self.sync_logged().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_refresh_spreads_with_many_endpoints() {
        let ten = Duration::from_secs(10);
        assert_eq!(counter_refresh_for(ten, 1), ten);
        assert_eq!(counter_refresh_for(ten, 50), ten);
        assert_eq!(counter_refresh_for(ten, 500), Duration::from_secs(100));
        assert_eq!(counter_refresh_for(Duration::ZERO, 500), Duration::ZERO);
    }
}
