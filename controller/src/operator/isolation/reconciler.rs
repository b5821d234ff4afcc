//! Reconcile functions of the Network and NetworkId controllers, and their contexts
//! ([`Context`], [`NetworkIdContext`]: [`runtime::Context`] around what each needs).
//!
//! [`reconcile_network`] runs inside [`finalizer`]: Apply makes sure the Network holds exactly
//! one ID (reusing a claim found by UID before allocating, releasing extra claims), evaluates
//! its peerings and writes the status by server-side apply; Cleanup releases its claims.
//! [`reconcile_network_id`] is the GC sweep for one NetworkId. The status itself is computed by
//! the pure [`desired_status`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use kubetun_crds::contract::network::{FINALIZER, NETWORKS_RESOURCE, condition, reason};
use kubetun_crds::{
    ClaimRef, GROUP, Network, NetworkId, NetworkPeeringStatus, NetworkPhase, NetworkStatus,
    PeeringState,
};
use rand_core::{OsRng, RngCore};

use super::allocator::{AllocError, ClaimOutcome, IdAllocator, Release};

use super::gc;
use super::ids::{IdRange, parse_canonical};
use super::peering::{NetworkKey, Peer, peering_statuses};
use super::{NetworkError, NetworkOptions};
use crate::plumbing::conditions;
use crate::plumbing::runtime::{self, ApiHealth};

/// Field manager of the status written by server-side apply.
pub const FIELD_MANAGER: &str = "kubetun-network";
/// How often a healthy Network is looked at again without any event.
pub const RESYNC: Duration = Duration::from_secs(600);

/// The Network controller's name in logs and backoff keys.
const NETWORK_KIND: &str = "network";
/// The NetworkID garbage collection's name in logs and backoff keys.
const NETWORK_ID_KIND: &str = "networkid";

/// What the Network controller needs besides [`runtime::Context`]'s parts.
pub struct Networks {
    allocator: IdAllocator,
    known_ids: Option<Store<NetworkId>>,
}

impl std::fmt::Debug for Networks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Networks")
            .field("allocator", &self.allocator)
            .finish_non_exhaustive()
    }
}

impl Networks {
    fn known_taken(&self, id: u32) -> bool {
        self.known_ids
            .as_ref()
            .is_some_and(|store| store.get(&ObjectRef::new(&id.to_string())).is_some())
    }
}

/// The Network controller's context.
pub type Context = runtime::Context<Networks>;

impl Context {
    /// A context with the system clock and no Events.
    pub fn new(
        client: Client,
        opts: &NetworkOptions,
        health: ApiHealth,
    ) -> Result<Self, NetworkError> {
        let range = IdRange::new(opts.min_vni, opts.max_vni)?;
        let state = Networks {
            allocator: IdAllocator::new(client.clone(), range, opts.max_attempts),
            known_ids: None,
        };
        Ok(Self::with_state(NETWORK_KIND, client, health, state))
    }

    /// Lets allocation skip IDs a NetworkId cache already knows as taken.
    #[must_use]
    pub fn with_id_cache(mut self, store: Store<NetworkId>) -> Self {
        self.state.known_ids = Some(store);
        self
    }

    /// An Event about `network`'s ID. Best effort.
    async fn announce_id(&self, network: &Network, type_: EventType, reason: &str, note: &str) {
        let regarding = network.object_ref(&());
        self.publish(&regarding, type_, reason, "ClaimNetworkID", note)
            .await;
    }
}

/// What the NetworkID garbage collection needs besides [`runtime::Context`]'s parts.
#[derive(Debug)]
pub struct NetworkIds {
    gc_grace: Duration,
    namespace: Option<String>,
}

/// The NetworkID garbage collection's context.
pub type NetworkIdContext = runtime::Context<NetworkIds>;

impl NetworkIdContext {
    /// A context with the system clock, the default GC grace period and no Events.
    pub fn new(client: Client, health: ApiHealth) -> Self {
        let state = NetworkIds {
            gc_grace: gc::DEFAULT_GRACE_PERIOD,
            namespace: None,
        };
        Self::with_state(NETWORK_ID_KIND, client, health, state)
    }

    /// Replaces the GC grace period.
    #[must_use]
    pub fn with_gc_grace(mut self, grace: Duration) -> Self {
        self.state.gc_grace = grace;
        self
    }

    /// Restricts the GC to claims of Networks in `namespace` (`None`: every namespace).
    #[must_use]
    pub fn with_namespace(mut self, namespace: Option<String>) -> Self {
        self.state.namespace = namespace;
        self
    }
}

/// Reconciles one Network (finalizer, ID, peerings, status).
pub async fn reconcile_network(
    network: Arc<Network>,
    ctx: Arc<Context>,
) -> Result<Action, NetworkError> {
    let namespace = network
        .namespace()
        .ok_or(NetworkError::MissingMetadata("namespace"))?;
    let api: Api<Network> = Api::namespaced(ctx.client.clone(), &namespace);
    let reconciled = network.clone();
    let action = finalizer(&api, FINALIZER, network, |event| async {
        match event {
            Event::Apply(network) => apply(&network, &api, &ctx).await,
            Event::Cleanup(network) => cleanup(&network, &ctx).await,
        }
    })
    .await
    .map_err(|err| NetworkError::Finalizer(Box::new(err)))?;
    ctx.reconciled(&*reconciled);
    Ok(action)
}

/// Event action of the NetworkID garbage collection.
const COLLECT: &str = "CollectNetworkID";

/// GC sweep for one NetworkId: deletes it when its Network is gone (after the grace period).
/// An orphaned claim is announced with a Warning Event at once, saying when it goes (NetworkIDs
/// have no status: they are create-as-lock objects).
pub async fn reconcile_network_id(
    nid: Arc<NetworkId>,
    ctx: Arc<NetworkIdContext>,
) -> Result<Action, NetworkError> {
    let in_scope = ctx
        .namespace
        .as_ref()
        .is_none_or(|ns| *ns == nid.spec.claim_ref.namespace);
    if !in_scope {
        return Ok(Action::await_change());
    }
    let collected = gc::collect(&ctx.client, &nid, ctx.now().0, ctx.gc_grace).await?;
    ctx.reconciled(&*nid);
    Ok(Action::requeue(match collected {
        gc::Collected::Kept => RESYNC,
        gc::Collected::Orphaned {
            reason: why,
            recheck,
            deadline,
        } => {
            // The same note each time: the recorder folds the repeats into one series.
            let note = format!(
                "{why}: this NetworkID is no Network's claim, so the controller deletes it at \
                 {deadline} (the grace period after its creation) unless that Network appears. \
                 NetworkIDs are the controller's: a Network claims one by itself, or the one its \
                 spec.id names; do not create them by hand"
            );
            let regarding = nid.object_ref(&());
            ctx.publish(
                &regarding,
                EventType::Warning,
                reason::ORPHANED,
                COLLECT,
                &note,
            )
            .await;
            recheck
        }
        gc::Collected::Deleted { reason: why } => {
            let note = format!("{why}: deleted this claim, the ID is free again");
            let regarding = nid.object_ref(&());
            ctx.publish(
                &regarding,
                EventType::Normal,
                reason::COLLECTED,
                COLLECT,
                &note,
            )
            .await;
            RESYNC
        }
    }))
}

/// The claimRef a Network's claims carry.
pub fn claimer_of(network: &Network) -> Result<ClaimRef, NetworkError> {
    Ok(ClaimRef {
        group: GROUP.to_owned(),
        resource: NETWORKS_RESOURCE.to_owned(),
        namespace: network
            .namespace()
            .ok_or(NetworkError::MissingMetadata("namespace"))?,
        name: network.name_any(),
        uid: network.uid().ok_or(NetworkError::MissingMetadata("uid"))?,
    })
}

async fn apply(
    network: &Network,
    api: &Api<Network>,
    ctx: &Context,
) -> Result<Action, NetworkError> {
    let claimer = claimer_of(network)?;
    let outcome = ensure_id(network, &claimer, ctx).await?;
    let peers = fetch_peers(network, &ctx.client).await?;
    let peerings = peering_statuses(network, outcome.id().is_some(), |key| {
        match peers.get(key) {
            Some(Ok(peer)) => Peer::Found(peer),
            Some(Err(reason)) => Peer::Unreadable(reason),
            None => Peer::Missing,
        }
    });
    let status = desired_status(network, &outcome, peerings, ctx.now());
    if network.status.as_ref() != Some(&status) {
        let patch = serde_json::json!({
            "apiVersion": Network::api_version(&()),
            "kind": Network::kind(&()),
            "status": status,
        });
        api.patch_status(
            &network.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
        // After the write: a failed write retries, and must not repeat the event.
        announce(network, &outcome, ctx).await;
    }
    Ok(match outcome {
        IdOutcome::Allocated(_) => Action::requeue(RESYNC),
        IdOutcome::Unavailable(unavailable) => Action::requeue(unavailable.retry_after),
    })
}

/// Publishes an Event when the ID outcome differs from what the status already says.
async fn announce(network: &Network, outcome: &IdOutcome, ctx: &Context) {
    let previous = network.status.as_ref();
    match outcome {
        IdOutcome::Allocated(id) => {
            let recorded = previous.and_then(|s| s.id.as_deref());
            if recorded != Some(id.to_string().as_str()) {
                let note = format!("holds network ID {id}");
                ctx.announce_id(network, EventType::Normal, reason::ALLOCATED, &note)
                    .await;
            }
        }
        IdOutcome::Unavailable(u) => {
            let already_reported = previous
                .and_then(|s| conditions::find(&s.conditions, condition::ID_ALLOCATED))
                .is_some_and(|c| c.status == "False" && c.reason == u.reason);
            if !already_reported {
                ctx.announce_id(network, EventType::Warning, u.reason, &u.message)
                    .await;
            }
        }
    }
}

async fn cleanup(network: &Network, ctx: &Context) -> Result<Action, NetworkError> {
    let claimer = claimer_of(network)?;
    let mut ids = ctx.allocator.claims_of(&claimer.uid).await?;
    // A claim whose label was lost is still found through the recorded ID.
    if let Some(recorded) = recorded_id(network).filter(|id| !ids.contains(id)) {
        ids.push(recorded);
    }
    for id in ids {
        match ctx.allocator.release(id, &claimer.uid).await? {
            Release::Released => {
                tracing::info!(network = %NetworkKey::of(network), id, "released network ID");
                let note = format!("released network ID {id}");
                ctx.announce_id(network, EventType::Normal, reason::RELEASED, &note)
                    .await;
            }
            Release::ClaimedByOther => {
                tracing::warn!(network = %NetworkKey::of(network), id, "network ID is claimed by another network; not releasing it");
            }
            Release::AlreadyGone => {}
        }
    }
    Ok(Action::await_change())
}

/// The ID a Network's status records, if canonical.
fn recorded_id(network: &Network) -> Option<u32> {
    network
        .status
        .as_ref()
        .and_then(|s| s.id.as_deref())
        .and_then(|id| parse_canonical(id).ok())
}

/// Whether the Network holds an ID after the allocation step of a reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdOutcome {
    /// The Network holds this ID.
    Allocated(u32),
    /// It holds none; the status says why.
    Unavailable(Unavailable),
}

impl IdOutcome {
    /// The held ID.
    pub fn id(&self) -> Option<u32> {
        match self {
            Self::Allocated(id) => Some(*id),
            Self::Unavailable(_) => None,
        }
    }
}

/// Why a Network holds no ID, and when to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// Condition reason.
    pub reason: &'static str,
    /// Condition message.
    pub message: String,
    /// Phase to report.
    pub phase: NetworkPhase,
    /// When to reconcile again.
    pub retry_after: Duration,
}

fn unavailable(
    reason: &'static str,
    message: String,
    phase: NetworkPhase,
    retry_after: Duration,
) -> IdOutcome {
    IdOutcome::Unavailable(Unavailable {
        reason,
        message,
        phase,
        retry_after,
    })
}

/// Makes the Network hold exactly one ID: an existing claim found by UID wins, then the
/// requested `spec.id`, then the ID recorded in the status, then any vacant one.
async fn ensure_id(
    network: &Network,
    claimer: &ClaimRef,
    ctx: &Context,
) -> Result<IdOutcome, NetworkError> {
    let allocator = &ctx.allocator;
    let range = allocator.range();
    let requested = match network.spec.id.as_deref().filter(|id| !id.is_empty()) {
        None => None,
        Some(raw) => match parse_canonical(raw) {
            Err(err) => {
                let retry = Duration::from_secs(300);
                return Ok(unavailable(
                    reason::INVALID_ID,
                    err.to_string(),
                    NetworkPhase::Error,
                    retry,
                ));
            }
            Ok(id) if !range.contains(id) => {
                let message = format!("requested ID {id} is outside the configured range {range}");
                let retry = Duration::from_secs(300);
                return Ok(unavailable(
                    reason::ID_OUT_OF_RANGE,
                    message,
                    NetworkPhase::Error,
                    retry,
                ));
            }
            Ok(id) => Some(id),
        },
    };
    let recorded = recorded_id(network).filter(|id| range.contains(*id));

    let claims = allocator.claims_of(&claimer.uid).await?;
    let kept = match requested {
        Some(id) => claims.contains(&id).then_some(id),
        None => recorded
            .filter(|id| claims.contains(id))
            .or_else(|| claims.first().copied()),
    };

    let id = match (kept, requested) {
        (Some(id), _) => id,
        (None, Some(id)) => match allocator.claim(claimer, id).await? {
            ClaimOutcome::Claimed(id) => id,
            ClaimOutcome::Taken { holder, .. } => {
                let by = holder.map_or_else(
                    || "another network".to_owned(),
                    |h| format!("network {}/{}", h.namespace, h.name),
                );
                let message = format!("requested ID {id} is held by {by}");
                return Ok(unavailable(
                    reason::ID_TAKEN,
                    message,
                    NetworkPhase::Error,
                    Duration::from_secs(60),
                ));
            }
        },
        (None, None) => {
            // Keep the recorded ID if its claim vanished and nobody took it.
            let reclaimed = match recorded {
                Some(id) => match allocator.claim(claimer, id).await? {
                    ClaimOutcome::Claimed(id) => Some(id),
                    ClaimOutcome::Taken { .. } => None,
                },
                None => None,
            };
            match reclaimed {
                Some(id) => id,
                None => {
                    let start = range.start_from(OsRng.next_u32());
                    match allocator
                        .claim_any(claimer, start, |id| ctx.known_taken(id))
                        .await
                    {
                        Ok(id) => id,
                        Err(err @ AllocError::Exhausted { .. }) => {
                            let retry = Duration::from_secs(60);
                            return Ok(unavailable(
                                reason::RANGE_EXHAUSTED,
                                err.to_string(),
                                NetworkPhase::Error,
                                retry,
                            ));
                        }
                        Err(err @ AllocError::AttemptsExceeded { .. }) => {
                            let retry = Duration::from_secs(10);
                            return Ok(unavailable(
                                reason::ALLOCATION_FAILED,
                                err.to_string(),
                                NetworkPhase::Pending,
                                retry,
                            ));
                        }
                        Err(err @ AllocError::Api(_)) => return Err(err.into()),
                    }
                }
            }
        }
    };

    // Claims beyond the kept one come from a create whose response was lost or from a
    // changed spec.id; they must not leak.
    for extra in claims.into_iter().filter(|claimed| *claimed != id) {
        allocator.release(extra, &claimer.uid).await?;
        tracing::info!(network = %NetworkKey::of(network), id = extra, "released surplus network ID");
    }
    Ok(IdOutcome::Allocated(id))
}

/// Uncached reads of every peer the spec names; missing peers are absent. A peer the API
/// refuses to show (403: e.g. another namespace without permission) is recorded with the
/// reason so the peering reports it; any other failure fails the reconcile (and is retried)
/// rather than turning Ready peerings Pending on a transient error.
async fn fetch_peers(
    network: &Network,
    client: &Client,
) -> Result<BTreeMap<NetworkKey, Result<Network, String>>, NetworkError> {
    let own = NetworkKey::of(network);
    let mut peers = BTreeMap::new();
    for peering in &network.spec.peerings {
        let target = NetworkKey::target(&own.namespace, &peering.network_ref);
        if target == own || peers.contains_key(&target) {
            continue;
        }
        let api: Api<Network> = Api::namespaced(client.clone(), &target.namespace);
        match api.get_opt(&target.name).await {
            Ok(Some(peer)) => {
                peers.insert(target, Ok(peer));
            }
            Ok(None) => {}
            Err(kube::Error::Api(status)) if status.is_forbidden() => {
                peers.insert(target, Err("forbidden".to_owned()));
            }
            Err(err) => return Err(err.into()),
        }
    }
    Ok(peers)
}

/// The status a Network should have: ID and phase from `outcome`, the given peerings, and
/// conditions updated from the previous status (transition times move only on flips).
pub fn desired_status(
    network: &Network,
    outcome: &IdOutcome,
    peerings: Vec<NetworkPeeringStatus>,
    now: Time,
) -> NetworkStatus {
    let generation = network.metadata.generation;
    let mut conditions = network
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let (id, phase) = match outcome {
        IdOutcome::Allocated(id) => {
            let message = format!("holds network ID {id}");
            conditions::set(
                &mut conditions,
                condition::ID_ALLOCATED,
                true,
                reason::ALLOCATED,
                &message,
                generation,
                now.clone(),
            );
            (Some(id.to_string()), NetworkPhase::Available)
        }
        IdOutcome::Unavailable(u) => {
            conditions::set(
                &mut conditions,
                condition::ID_ALLOCATED,
                false,
                u.reason,
                &u.message,
                generation,
                now.clone(),
            );
            (None, u.phase)
        }
    };

    let names_in = |state: PeeringState| -> Vec<&str> {
        peerings
            .iter()
            .filter(|p| p.state == state)
            .map(|p| p.name.as_str())
            .collect()
    };
    let (errors, pending) = (
        names_in(PeeringState::Error),
        names_in(PeeringState::Pending),
    );
    let (ready, peering_reason, message) = if !errors.is_empty() {
        (
            false,
            reason::PEERING_ERROR,
            format!("invalid peerings: {}", errors.join(", ")),
        )
    } else if !pending.is_empty() {
        (
            false,
            reason::PEERINGS_PENDING,
            format!("pending peerings: {}", pending.join(", ")),
        )
    } else {
        (
            true,
            reason::PEERINGS_READY,
            match peerings.len() {
                0 => "no peerings".to_owned(),
                1 => "1 peering ready".to_owned(),
                n => format!("{n} peerings ready"),
            },
        )
    };
    conditions::set(
        &mut conditions,
        condition::PEERINGS_READY,
        ready,
        peering_reason,
        &message,
        generation,
        now,
    );

    NetworkStatus {
        id,
        phase,
        peerings,
        observed_generation: generation,
        conditions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use kubetun_crds::NetworkSpec;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).expect("valid"))
    }

    fn peering(name: &str, state: PeeringState) -> NetworkPeeringStatus {
        NetworkPeeringStatus {
            name: name.to_owned(),
            state,
            ..NetworkPeeringStatus::default()
        }
    }

    fn condition<'a>(status: &'a NetworkStatus, type_: &str) -> &'a kubetun_crds::Condition {
        conditions::find(&status.conditions, type_).expect("condition present")
    }

    #[test]
    fn status_reports_the_id_and_keeps_transition_times_while_nothing_flips() {
        let mut network = Network::new("n", NetworkSpec::default());
        network.metadata.generation = Some(3);
        let first = desired_status(&network, &IdOutcome::Allocated(250), vec![], at(100));
        assert_eq!(first.id.as_deref(), Some("250"));
        assert_eq!(first.phase, NetworkPhase::Available);
        assert_eq!(first.observed_generation, Some(3));
        assert_eq!(condition(&first, condition::ID_ALLOCATED).status, "True");
        let peerings_ready = condition(&first, condition::PEERINGS_READY);
        assert_eq!(peerings_ready.status, "True");
        assert_eq!(peerings_ready.message, "no peerings");

        network.status = Some(first.clone());
        let again = desired_status(&network, &IdOutcome::Allocated(250), vec![], at(200));
        assert_eq!(
            again, first,
            "an unchanged outcome yields an identical status (no write)"
        );
    }

    #[test]
    fn unavailable_id_and_peering_states_become_conditions() {
        let network = Network::new("n", NetworkSpec::default());
        let outcome = unavailable(
            reason::RANGE_EXHAUSTED,
            "all 4 network IDs in [200, 203] are taken".to_owned(),
            NetworkPhase::Error,
            Duration::from_secs(60),
        );
        let peerings = vec![
            peering("a", PeeringState::Ready),
            peering("b", PeeringState::Pending),
            peering("c", PeeringState::Pending),
        ];
        let status = desired_status(&network, &outcome, peerings, at(100));
        assert_eq!(status.id, None);
        assert_eq!(status.phase, NetworkPhase::Error);
        let id = condition(&status, condition::ID_ALLOCATED);
        assert_eq!(
            (id.status.as_str(), id.reason.as_str()),
            ("False", reason::RANGE_EXHAUSTED)
        );
        let peering_ready = condition(&status, condition::PEERINGS_READY);
        assert_eq!(peering_ready.reason, reason::PEERINGS_PENDING);
        assert_eq!(peering_ready.message, "pending peerings: b, c");

        let with_error = desired_status(
            &network,
            &IdOutcome::Allocated(1),
            vec![
                peering("x", PeeringState::Error),
                peering("y", PeeringState::Pending),
            ],
            at(100),
        );
        assert_eq!(
            condition(&with_error, condition::PEERINGS_READY).reason,
            reason::PEERING_ERROR,
            "errors outrank pending peerings"
        );
    }
}
