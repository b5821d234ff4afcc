//! The IO shell of the election: reads and writes the `coordination.k8s.io/v1` Lease, and
//! keeps the local gateway's role in step with the outcome (gRPC `Hold`).
//!
//! Why not a crate: kube-leader-election (the one that builds with kube 4) decides expiry by
//! comparing the record's `renewTime` with the local wall clock, so clock skew between nodes
//! moves the takeover, and the gateway's self-fencing (see `gateway/core/src/role.rs`) is
//! only safe if a candidate measures the lease on its own monotonic clock
//! ([`super::election`]). It also steps in whole seconds, and failover within 2 s needs
//! sub-second retries.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::{Client, Resource as _};
use kubetun_crds::contract::lease::NODE_IP_ANNOTATION;

use super::election::{Decision, Election, Observed};
use super::metrics::HaMetrics;
use crate::plumbing::gateway_client::GatewayClient;

/// Reporter of the failover events.
const EVENT_REPORTER: &str = "kubetun-controller";
/// How long a Hold call to the local gateway may take: a later one would extend the
/// gateway's activity past the lease (the margin between renew deadline and lease duration
/// covers it).
const HOLD_DEADLINE: Duration = Duration::from_millis(100);

/// Why an election step failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the Lease API did not answer within {0:?}")]
    Timeout(Duration),
}

/// What one step of the loop found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// This replica leads (it renewed or acquired the lease).
    Leading,
    /// Another replica leads.
    Following { holder: String },
    /// The step could not tell (conflict, refused request, gateway down): try again.
    Unsure,
    /// The API server did not answer the read or the write usefully (away, timed out,
    /// starting, refusing); a write conflict is [`Step::Unsure`].
    Unreachable,
}

/// One replica's election: the Lease, the pure state machine, the local gateway.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    node_ip: Option<IpAddr>,
    election: Election,
    gateway: Option<GatewayClient>,
    recorder: Recorder,
    metrics: HaMetrics,
    /// The holder seen last, to report a takeover with the name of the replica it replaces.
    last_holder: Option<String>,
    /// Set while this replica led when the API server stopped answering: its gateway stays
    /// active until the API server answers again (see [`Elector::step`]).
    sticky_since: Option<Instant>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("lease", &self.name)
            .field("identity", &self.election.identity())
            .finish_non_exhaustive()
    }
}

impl Elector {
    /// An elector for Lease `name` in `namespace`. `node_ip` goes into the Lease for the
    /// route agents while this replica holds it.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        node_ip: Option<IpAddr>,
        election: Election,
        gateway: Option<GatewayClient>,
        metrics: HaMetrics,
    ) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            name: name.to_owned(),
            node_ip,
            election,
            gateway,
            recorder: Recorder::new(client, Reporter::from(EVENT_REPORTER)),
            metrics,
            last_holder: None,
            sticky_since: None,
        }
    }

    /// Whether this replica leads now.
    fn leads(&self) -> bool {
        self.election.leads(Instant::now())
    }

    /// Steps until this replica leads, keeping its gateway on standby meanwhile.
    pub async fn acquire(&mut self) {
        let mut following = None;
        loop {
            let started = Instant::now();
            match self.step().await {
                Step::Leading => return,
                Step::Following { holder } => {
                    if following.as_ref() != Some(&holder) {
                        tracing::info!(
                            lease = self.name,
                            holder,
                            "standby: another replica holds the gateway lease"
                        );
                        following = Some(holder);
                    }
                }
                Step::Unsure | Step::Unreachable => {}
            }
            self.sleep_rest(started).await;
        }
    }

    /// Renews while this replica leads; returns once it lost the lease (its gateway is on
    /// standby then).
    pub async fn keep(&mut self) {
        loop {
            let started = Instant::now();
            match self.step().await {
                Step::Leading => {}
                Step::Following { holder } => {
                    tracing::warn!(
                        lease = self.name,
                        holder,
                        "lost the gateway lease to another replica"
                    );
                    return;
                }
                Step::Unsure | Step::Unreachable
                    if !self.leads() && self.sticky_since.is_none() =>
                {
                    // `step` has put the gateway on standby already.
                    tracing::warn!(
                        lease = self.name,
                        "could not renew the gateway lease within the renew deadline; stepping down"
                    );
                    return;
                }
                Step::Unsure | Step::Unreachable => {}
            }
            self.sleep_rest(started).await;
        }
    }

    /// Gives the lease up on a graceful stop, so another replica takes over at once instead
    /// of after the lease duration.
    pub async fn release(&mut self) {
        self.election.resign();
        self.hold(Duration::ZERO).await;
        let answer_by = Instant::now() + self.election.timing().renew_deadline * 2;
        let Ok(Some(mut lease)) = self.bounded(answer_by, self.api.get_opt(&self.name)).await
        else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.election.identity()) {
            return;
        }
        spec.holder_identity = None;
        if let Some(annotations) = lease.metadata.annotations.as_mut() {
            annotations.remove(NODE_IP_ANNOTATION);
        }
        match self
            .bounded(
                answer_by,
                self.api.replace(&self.name, &PostParams::default(), &lease),
            )
            .await
        {
            Ok(_) => tracing::info!(lease = self.name, "gateway lease released"),
            Err(error) => tracing::debug!(%error, "cannot release the gateway lease"),
        }
    }

    async fn sleep_rest(&self, started: Instant) {
        let period = self.election.timing().retry_period;
        tokio::time::sleep(period.saturating_sub(started.elapsed())).await;
    }

    /// One read, decision and (if due) write; then the gateway's role follows the outcome.
    ///
    /// When the API server stops answering (answers errors, or answers too late to keep the
    /// gateway held) while this replica leads, its gateway stays active (re-held every step
    /// for the renew deadline) until the API server answers again: then the replica renews,
    /// or steps down if another one took the Lease meanwhile. An API-server restart thus costs no traffic. Candidates forget what they
    /// observed when a read fails, so after an outage they wait a whole lease duration
    /// again and the holder renews first. The price: a holder cut off from the API server
    /// alone stays active beside the replica that takes over, until it reaches the API
    /// server again (both forward; the remotes follow whichever handshaked last). A
    /// controller that is dead or frozen takes no steps, so its gateway still lapses.
    pub async fn step(&mut self) -> Step {
        let started = Instant::now();
        let was_active = self.election.leads(started) || self.sticky_since.is_some();
        // A replica whose gateway does not answer must neither take nor keep the lease:
        // the replica that holds it would carry no traffic. The probe is a Hold for the
        // time this replica may still carry traffic (zero on standby), so it also keeps
        // the role.
        let held_for = self.active_for(started);
        let gateway_alive = self.hold(held_for).await;
        // An active replica's requests must be answered while its gateway is still held,
        // with time left for the next Hold: an API server that answers later (starting,
        // starved, frozen) counts as away, and the gateway is held on instead of lapsing
        // in the middle of the step.
        let answer_by = if was_active {
            started + held_for.saturating_sub(HOLD_DEADLINE)
        } else {
            started + self.election.timing().renew_deadline * 2
        };
        let step = match self.try_step(started, answer_by, gateway_alive).await {
            Ok(step) => step,
            // Away, starting (a restarted API server answers 403 until its RBAC caches are
            // filled) or refusing: nobody can write the Lease meanwhile, so whoever leads
            // keeps leading until a read shows otherwise.
            Err(error) => {
                tracing::debug!(lease = self.name, %error, "the API server does not answer the election");
                self.election.forget();
                Step::Unreachable
            }
        };
        let now = Instant::now();
        // A step that outlasted its own bounds did not run for a while (its process was
        // frozen or starved): the failure it saw may be its own timeout, and another
        // replica may hold the Lease by now, so it must not keep its gateway active.
        let suspended = now.duration_since(started) > self.step_bound();
        match (&step, self.sticky_since) {
            (Step::Unreachable, None) if was_active && gateway_alive && !suspended => {
                tracing::warn!(
                    lease = self.name,
                    "the API server does not answer: the gateway stays active until it does"
                );
                self.sticky_since = Some(now);
            }
            // Only a renewal in time or another holder ends an outage: a conflict or a
            // renewal that came too late leaves the next read to tell.
            (Step::Unreachable | Step::Unsure, _) => {}
            (_, Some(since)) => {
                tracing::info!(
                    lease = self.name,
                    outage_ms = since.elapsed().as_millis(),
                    "the API server answers again"
                );
                self.sticky_since = None;
            }
            (_, None) => {}
        }
        if !gateway_alive {
            self.sticky_since = None;
        }
        let active = self.election.leads(now) || self.sticky_since.is_some();
        if active {
            self.hold(self.active_for(now)).await;
        } else if was_active {
            self.hold(Duration::ZERO).await;
        }
        self.metrics.set_leading(active);
        match step {
            // Written, but too late to count (the write took longer than the deadline).
            Step::Leading if !self.election.leads(now) => Step::Unsure,
            step => step,
        }
    }

    /// The longest a step takes while its process runs: a Hold, a read and a write, each
    /// bounded, and a retry period of slack.
    fn step_bound(&self) -> Duration {
        let timing = self.election.timing();
        HOLD_DEADLINE + timing.renew_deadline * 2 + timing.retry_period
    }

    /// How long the gateway may carry traffic from `now` without another step.
    fn active_for(&self, now: Instant) -> Duration {
        if self.sticky_since.is_some() {
            self.election.timing().renew_deadline
        } else {
            self.election.remaining(now)
        }
    }

    async fn try_step(
        &mut self,
        started: Instant,
        answer_by: Instant,
        gateway_alive: bool,
    ) -> Result<Step, LeaseError> {
        let current = self
            .bounded(answer_by, self.api.get_opt(&self.name))
            .await?;
        let observed = current.as_ref().map(observed);
        let holder = observed
            .as_ref()
            .and_then(|o| o.holder.clone())
            .filter(|h| !h.is_empty());
        match self.election.observe(observed.as_ref(), started) {
            Decision::Follow { holder } => {
                self.election.resign();
                self.last_holder = Some(holder.clone());
                Ok(Step::Following { holder })
            }
            Decision::Claim { .. } if !gateway_alive => {
                if holder.as_deref() == Some(self.election.identity()) {
                    tracing::warn!(
                        lease = self.name,
                        "the local gateway does not answer; letting the lease expire"
                    );
                }
                self.election.resign();
                Ok(Step::Unsure)
            }
            Decision::Claim { takeover } => {
                let lease = self.claim_record(current, takeover);
                let sent = Instant::now();
                let written = self
                    .bounded(answer_by, async {
                        if lease.metadata.resource_version.is_some() {
                            self.api
                                .replace(&self.name, &PostParams::default(), &lease)
                                .await
                        } else {
                            self.api.create(&PostParams::default(), &lease).await
                        }
                    })
                    .await;
                match written {
                    Ok(lease) => {
                        self.election.claimed(sent);
                        // A record that named this replica already was renewed, not taken.
                        if holder.as_deref() != Some(self.election.identity()) {
                            let previous = holder.or_else(|| self.last_holder.take());
                            self.announce(&lease, previous).await;
                        }
                        Ok(Step::Leading)
                    }
                    // Someone else wrote first; the next read shows who.
                    Err(LeaseError::Kube(kube::Error::Api(status))) if status.code == 409 => {
                        Ok(Step::Unsure)
                    }
                    Err(error) => Err(error),
                }
            }
        }
    }

    /// `request` within the renew deadline and by `answer_by`: a later answer could not
    /// count anyway.
    async fn bounded<T>(
        &self,
        answer_by: Instant,
        request: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LeaseError> {
        let started = Instant::now();
        let deadline = answer_by.min(started + self.election.timing().renew_deadline);
        tokio::time::timeout_at(deadline.into(), request)
            .await
            .map_err(|_| LeaseError::Timeout(deadline.saturating_duration_since(started)))?
            .map_err(LeaseError::from)
    }

    /// The record naming this replica, built on the one read (its resourceVersion makes the
    /// write conditional).
    fn claim_record(&self, current: Option<Lease>, takeover: bool) -> Lease {
        let now = MicroTime(Timestamp::now());
        let mut lease = current.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let seconds = self.election.timing().lease_duration.as_secs();
        spec.lease_duration_seconds = Some(i32::try_from(seconds).unwrap_or(i32::MAX));
        spec.renew_time = Some(now.clone());
        if takeover || spec.holder_identity.as_deref() != Some(self.election.identity()) {
            spec.holder_identity = Some(self.election.identity().to_owned());
            spec.acquire_time = Some(now);
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        match self.node_ip {
            Some(ip) => {
                annotations.insert(NODE_IP_ANNOTATION.to_owned(), ip.to_string());
            }
            None => {
                annotations.remove(NODE_IP_ANNOTATION);
            }
        }
        lease
    }

    /// Logs, counts and records an event for a takeover by this replica.
    async fn announce(&self, lease: &Lease, previous: Option<String>) {
        let identity = self.election.identity();
        let note = match &previous {
            Some(previous) if previous != identity => {
                format!("{identity} took the gateway over from {previous}")
            }
            _ => format!("{identity} holds the gateway lease"),
        };
        tracing::info!(
            lease = self.name,
            previous = previous.as_deref().unwrap_or(""),
            "active: {note}"
        );
        self.metrics.promoted();
        crate::plumbing::events::publish_with(
            &self.recorder,
            &lease.object_ref(&()),
            EventType::Normal,
            "GatewayFailover",
            "AcquireLease",
            &note,
        )
        .await;
    }

    /// Holds the gateway active for `active_for` (zero: standby); true when it answered.
    /// Without a local gateway there is nothing to hold and nothing that can be down.
    async fn hold(&self, active_for: Duration) -> bool {
        let Some(gateway) = &self.gateway else {
            return true;
        };
        match gateway.hold(active_for, HOLD_DEADLINE).await {
            Ok(_) => true,
            Err(error) => {
                tracing::debug!(%error, "the gateway did not take the hold");
                false
            }
        }
    }
}

/// The parts of a Lease whose change restarts a candidate's wait.
fn observed(lease: &Lease) -> Observed {
    let spec = lease.spec.clone().unwrap_or_default();
    Observed {
        holder: spec.holder_identity,
        renew_time: spec.renew_time.map(|t| t.0.to_string()),
        transitions: spec.lease_transitions.unwrap_or(0),
    }
}
