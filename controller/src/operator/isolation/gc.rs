//! Garbage collection of orphaned `NetworkId` claims.
//!
//! The Network finalizer releases an ID in the normal case; this sweep catches the rest
//! (finalizer removed by hand, claimer recreated under the same name). A claim is orphaned
//! when an uncached GET finds no claimer or a claimer with another UID. A claim younger than
//! the grace period is never collected, so an ID created moments before its claimer becomes
//! visible (the race ironcore-net has) is safe. Deletes carry the NetworkId's UID as
//! precondition.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::{Client, ResourceExt};
use kubetun_crds::contract::network::NETWORKS_RESOURCE;
use kubetun_crds::{GROUP, Network, NetworkId};

/// Grace period the controller uses before a claim without claimer is collected.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(120);

/// What the claimer lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimer {
    /// An object with this UID exists under the claimRef's namespace/name.
    Present { uid: String },
    /// Nothing exists under the claimRef's namespace/name.
    Absent,
}

/// Decision for one NetworkId.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Claimed by a live claimer, being deleted already, or not ours to judge.
    Keep,
    /// Orphaned but within the grace period: look again after this long.
    RecheckAfter(Duration),
    /// Orphaned: delete it.
    Delete {
        /// Why, for logs.
        reason: String,
    },
}

/// True when the claim was made by a kubetun Network (other claimers are left alone).
pub fn claimed_by_network(nid: &NetworkId) -> bool {
    nid.spec.claim_ref.group == GROUP && nid.spec.claim_ref.resource == NETWORKS_RESOURCE
}

/// Judges one NetworkId given its claimer, the time and the grace period.
pub fn verdict(nid: &NetworkId, claimer: &Claimer, now: Timestamp, grace: Duration) -> Verdict {
    if nid.metadata.deletion_timestamp.is_some() || !claimed_by_network(nid) {
        return Verdict::Keep;
    }
    let Some(reason) = orphan_reason(nid, claimer) else {
        return Verdict::Keep;
    };
    // Without a creation time the object is treated as brand new.
    let created = nid
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    let age = now.duration_since(created);
    let remaining = k8s_openapi::jiff::SignedDuration::try_from(grace)
        .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
        - age;
    if remaining.is_positive() {
        let wait = Duration::try_from(remaining).unwrap_or(grace);
        return Verdict::RecheckAfter(wait);
    }
    Verdict::Delete { reason }
}

/// Why `nid` is no live Network's claim given its claimer; `None` when it is.
pub fn orphan_reason(nid: &NetworkId, claimer: &Claimer) -> Option<String> {
    let claim = &nid.spec.claim_ref;
    match claimer {
        Claimer::Present { uid } if *uid == claim.uid => None,
        Claimer::Present { uid } => Some(format!(
            "network {}/{} has uid {uid}, not the claim's uid {} (it was recreated, or the claim \
             was not made by the controller)",
            claim.namespace, claim.name, claim.uid
        )),
        Claimer::Absent => Some(format!(
            "network {}/{} does not exist",
            claim.namespace, claim.name
        )),
    }
}

/// What [`collect`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Collected {
    /// Held by its Network, being deleted, or not a Network's claim: nothing to do.
    Kept,
    /// Orphaned, within the grace period: deleted once `recheck` has passed, at `deadline`,
    /// unless its claimer appears.
    Orphaned {
        /// Why, in words.
        reason: String,
        /// When to look again.
        recheck: Duration,
        /// When the grace period ends.
        deadline: Timestamp,
    },
    /// Orphaned and deleted (or gone, or changed, meanwhile).
    Deleted {
        /// Why, in words.
        reason: String,
    },
}

/// Looks up the claimer of `nid` without a cache.
pub async fn lookup_claimer(client: &Client, nid: &NetworkId) -> Result<Claimer, kube::Error> {
    let claim = &nid.spec.claim_ref;
    let networks: Api<Network> = Api::namespaced(client.clone(), &claim.namespace);
    Ok(match networks.get_opt(&claim.name).await? {
        Some(network) => Claimer::Present {
            uid: network.uid().unwrap_or_default(),
        },
        None => Claimer::Absent,
    })
}

/// Applies a verdict: deletes an orphaned NetworkId (only that very object), or says when
/// it will.
pub async fn collect(
    client: &Client,
    nid: &NetworkId,
    now: Timestamp,
    grace: Duration,
) -> Result<Collected, kube::Error> {
    if nid.metadata.deletion_timestamp.is_some() || !claimed_by_network(nid) {
        return Ok(Collected::Kept);
    }
    let claimer = lookup_claimer(client, nid).await?;
    match verdict(nid, &claimer, now, grace) {
        Verdict::Keep => Ok(Collected::Kept),
        Verdict::RecheckAfter(wait) => Ok(Collected::Orphaned {
            reason: orphan_reason(nid, &claimer).unwrap_or_default(),
            recheck: wait,
            deadline: nid
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(now, |t| t.0)
                .checked_add(k8s_openapi::jiff::SignedDuration::try_from(grace).unwrap_or_default())
                .unwrap_or(now),
        }),
        Verdict::Delete { reason } => {
            let api: Api<NetworkId> = Api::all(client.clone());
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: nid.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&nid.name_any(), &params).await {
                Ok(_) => {
                    tracing::info!(id = %nid.name_any(), %reason, "collected orphaned network ID");
                    Ok(Collected::Deleted { reason })
                }
                Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => {
                    Ok(Collected::Kept)
                }
                Err(err) => Err(err),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kubetun_crds::{ClaimRef, NetworkIdSpec};

    fn nid(created_at: i64) -> NetworkId {
        let mut nid = NetworkId::new(
            "300",
            NetworkIdSpec {
                claim_ref: ClaimRef {
                    group: GROUP.to_owned(),
                    resource: NETWORKS_RESOURCE.to_owned(),
                    namespace: "ns".to_owned(),
                    name: "net".to_owned(),
                    uid: "uid-1".to_owned(),
                },
            },
        );
        nid.metadata.creation_timestamp =
            Some(Time(Timestamp::from_second(created_at).expect("valid")));
        nid
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).expect("valid")
    }

    const GRACE: Duration = Duration::from_secs(60);

    #[test]
    fn live_claimer_keeps_the_id() {
        let present = Claimer::Present {
            uid: "uid-1".to_owned(),
        };
        assert_eq!(verdict(&nid(0), &present, at(10_000), GRACE), Verdict::Keep);
    }

    #[test]
    fn orphan_within_grace_is_rechecked_when_grace_ends() {
        assert_eq!(
            verdict(&nid(1000), &Claimer::Absent, at(1040), GRACE),
            Verdict::RecheckAfter(Duration::from_secs(20))
        );
    }

    #[test]
    fn orphan_after_grace_is_deleted_and_so_is_a_uid_mismatch() {
        assert!(matches!(
            verdict(&nid(1000), &Claimer::Absent, at(1060), GRACE),
            Verdict::Delete { .. }
        ));
        let recreated = Claimer::Present {
            uid: "uid-2".to_owned(),
        };
        assert!(matches!(
            verdict(&nid(1000), &recreated, at(2000), GRACE),
            Verdict::Delete { .. }
        ));
    }

    #[test]
    fn orphans_are_told_why() {
        let claim = nid(0);
        assert_eq!(
            orphan_reason(
                &claim,
                &Claimer::Present {
                    uid: "uid-1".to_owned()
                }
            ),
            None
        );
        let recreated = orphan_reason(
            &claim,
            &Claimer::Present {
                uid: "uid-2".to_owned(),
            },
        )
        .expect("another uid");
        assert!(
            recreated.contains("ns/net has uid uid-2, not the claim's uid uid-1"),
            "{recreated}"
        );
        assert_eq!(
            orphan_reason(&claim, &Claimer::Absent).as_deref(),
            Some("network ns/net does not exist")
        );
    }

    #[test]
    fn foreign_claims_are_not_judged() {
        let mut foreign = nid(0);
        foreign.spec.claim_ref.group = "example.com".to_owned();
        assert_eq!(
            verdict(&foreign, &Claimer::Absent, at(10_000), GRACE),
            Verdict::Keep
        );
    }
}
