//! Claiming network IDs by create-as-lock on cluster-scoped `NetworkId` objects.
//!
//! The object name is the canonical ID, so the API server's atomic create decides who owns an
//! ID: `AlreadyExists` (matched by reason, not by the 409 it shares with optimistic-lock
//! conflicts) means taken. Unlike ironcore-net, which this follows:
//! - every claim carries the [`CLAIM_UID_LABEL`] so [`IdAllocator::claims_of`] finds IDs a
//!   Network already holds (a create whose response was lost is found, not leaked);
//! - an ambiguous create error (5xx, transport, undecodable response) is resolved with a GET
//!   and `claimRef.uid`, and any other error aborts instead of trying the next candidate;
//! - attempts are bounded, and release checks the claimer UID and deletes with a UID
//!   precondition, so a late release never removes someone else's claim.

use std::collections::BTreeSet;

use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use kubetun_crds::contract::network::CLAIM_UID_LABEL;
use kubetun_crds::{ClaimRef, NetworkId, NetworkIdSpec};

use super::ids::{IdRange, parse_canonical};

/// Why no ID could be claimed.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// Every ID of the range is taken.
    #[error("all {} network IDs in {range} are taken", range.size())]
    Exhausted {
        /// The configured range.
        range: IdRange,
    },
    /// The attempt budget ran out before a vacant ID was found.
    #[error("no vacant network ID in {range} after {attempts} attempts")]
    AttemptsExceeded {
        /// The configured range.
        range: IdRange,
        /// Creates tried.
        attempts: u32,
    },
    /// The API refused or failed in a way that is not "taken"; the caller should retry later.
    #[error("NetworkId API request failed: {0}")]
    Api(#[source] kube::Error),
}

/// Result of trying to claim one specific ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The ID is now (or already was) claimed by the caller.
    Claimed(u32),
    /// Someone else holds it (`holder` is `None` when it vanished while we looked).
    Taken {
        id: u32,
        /// Its current claimer.
        holder: Option<ClaimRef>,
    },
}

/// Result of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The claim was deleted.
    Released,
    /// No NetworkId of that name exists.
    AlreadyGone,
    /// The NetworkId belongs to another claimer and was left alone.
    ClaimedByOther,
}

/// Claims and releases IDs within one range.
#[derive(Clone)]
pub struct IdAllocator {
    api: Api<NetworkId>,
    range: IdRange,
    max_attempts: u32,
}

impl std::fmt::Debug for IdAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdAllocator")
            .field("range", &self.range)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl IdAllocator {
    /// An allocator over `range` that tries at most `max_attempts` creates per allocation.
    pub fn new(client: Client, range: IdRange, max_attempts: u32) -> Self {
        Self {
            api: Api::all(client),
            range,
            max_attempts: max_attempts.max(1),
        }
    }

    /// The configured range.
    pub fn range(&self) -> IdRange {
        self.range
    }

    /// IDs currently claimed by `uid`, ascending. Objects being deleted or whose label and
    /// claimRef disagree are not claims.
    pub async fn claims_of(&self, uid: &str) -> Result<Vec<u32>, kube::Error> {
        let selector = format!("{CLAIM_UID_LABEL}={uid}");
        let list = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?;
        let ids: BTreeSet<u32> = list
            .items
            .iter()
            .filter(|nid| nid.metadata.deletion_timestamp.is_none())
            .filter(|nid| nid.spec.claim_ref.uid == uid)
            .filter_map(|nid| parse_canonical(&nid.name_any()).ok())
            .collect();
        Ok(ids.into_iter().collect())
    }

    /// Claims exactly `id` for `claimer` (which must carry its UID).
    pub async fn claim(&self, claimer: &ClaimRef, id: u32) -> Result<ClaimOutcome, AllocError> {
        match self.create(claimer, id).await {
            Ok(()) => Ok(ClaimOutcome::Claimed(id)),
            Err(err) if is_already_exists(&err) => {
                let holder = self.holder(id).await.map_err(AllocError::Api)?;
                Ok(match holder {
                    Some(holder) if holder.uid == claimer.uid => ClaimOutcome::Claimed(id),
                    holder => ClaimOutcome::Taken { id, holder },
                })
            }
            Err(err) => self.resolve_ambiguous(claimer, id, err).await,
        }
    }

    /// Claims some vacant ID for `claimer`, trying candidates from `start` and wrapping around.
    ///
    /// `known_taken` lets a cache skip IDs without a request; it is an optimisation only, the
    /// create decides. Only creates count against the attempt budget.
    pub async fn claim_any(
        &self,
        claimer: &ClaimRef,
        start: u32,
        known_taken: impl Fn(u32) -> bool,
    ) -> Result<u32, AllocError> {
        let mut attempts = 0;
        for id in self.range.candidates(start) {
            if known_taken(id) {
                continue;
            }
            if attempts == self.max_attempts {
                return Err(AllocError::AttemptsExceeded {
                    range: self.range,
                    attempts,
                });
            }
            attempts += 1;
            match self.create(claimer, id).await {
                Ok(()) => return Ok(id),
                // Taken, possibly by an object still being deleted: try the next one.
                Err(err) if is_already_exists(&err) => {}
                Err(err) => match self.resolve_ambiguous(claimer, id, err).await? {
                    ClaimOutcome::Claimed(id) => return Ok(id),
                    ClaimOutcome::Taken { .. } => {}
                },
            }
        }
        Err(AllocError::Exhausted { range: self.range })
    }

    /// Deletes the NetworkId `id` if `uid` claims it; the delete carries the NetworkId's own
    /// UID as precondition, so a claim recreated in between survives.
    pub async fn release(&self, id: u32, uid: &str) -> Result<Release, kube::Error> {
        let name = id.to_string();
        let Some(nid) = self.api.get_opt(&name).await? else {
            return Ok(Release::AlreadyGone);
        };
        if nid.spec.claim_ref.uid != uid {
            return Ok(Release::ClaimedByOther);
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: nid.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(&name, &params).await {
            Ok(_) => Ok(Release::Released),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(Release::AlreadyGone),
            // A failed UID precondition is a Conflict: the name now belongs to a new object.
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(Release::ClaimedByOther),
            Err(err) => Err(err),
        }
    }

    async fn create(&self, claimer: &ClaimRef, id: u32) -> Result<(), kube::Error> {
        let mut nid = NetworkId::new(
            &id.to_string(),
            NetworkIdSpec {
                claim_ref: claimer.clone(),
            },
        );
        nid.labels_mut()
            .insert(CLAIM_UID_LABEL.to_owned(), claimer.uid.clone());
        self.api
            .create(&PostParams::default(), &nid)
            .await
            .map(drop)
    }

    async fn holder(&self, id: u32) -> Result<Option<ClaimRef>, kube::Error> {
        Ok(self
            .api
            .get_opt(&id.to_string())
            .await?
            .map(|nid| nid.spec.claim_ref))
    }

    /// After a create failed with something other than AlreadyExists: if the request may have
    /// reached the server, look whether the object exists and is ours; otherwise abort.
    async fn resolve_ambiguous(
        &self,
        claimer: &ClaimRef,
        id: u32,
        err: kube::Error,
    ) -> Result<ClaimOutcome, AllocError> {
        if !is_ambiguous(&err) {
            return Err(AllocError::Api(err));
        }
        match self.holder(id).await {
            Ok(Some(holder)) if holder.uid == claimer.uid => {
                tracing::info!(
                    id,
                    "create reported an error but the claim exists; keeping it"
                );
                Ok(ClaimOutcome::Claimed(id))
            }
            // Not (yet) ours: abort and let the next reconcile's label lookup settle it.
            Ok(_) | Err(_) => Err(AllocError::Api(err)),
        }
    }
}

/// True for the API's "name is taken" answer.
pub fn is_already_exists(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.is_already_exists())
}

/// True when a failed write may nevertheless have been applied: server errors, transport
/// failures and responses that could not be read. Definite 4xx refusals are not ambiguous.
pub fn is_ambiguous(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code >= 500 || status.code == 0,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure("x", reason).with_code(code)))
    }

    #[test]
    fn already_exists_is_matched_by_reason_not_code() {
        assert!(is_already_exists(&api_error(409, "AlreadyExists")));
        assert!(!is_already_exists(&api_error(409, "Conflict")));
    }

    #[test]
    fn only_server_side_and_transport_failures_are_ambiguous() {
        assert!(is_ambiguous(&api_error(500, "InternalError")));
        assert!(is_ambiguous(&api_error(504, "Timeout")));
        assert!(!is_ambiguous(&api_error(403, "Forbidden")));
        assert!(!is_ambiguous(&api_error(422, "Invalid")));
        assert!(!is_ambiguous(&api_error(429, "TooManyRequests")));
    }
}
