//! `metav1.Condition` bookkeeping for every kubetun status, plus the condition types and
//! reasons the controller writes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubetun_crds::Condition;

/// Condition type on a remote NetworkConfig: its CIDRs have been mapped.
pub const PROCESSED: &str = "Processed";
/// Condition type on a TunnelEndpoint: the gateway accepted the state that contains it.
pub const APPLIED: &str = "Applied";
/// Condition type on a TunnelEndpoint: the gateway reports a working tunnel.
pub const CONNECTED: &str = "Connected";

/// Reasons, in `UpperCamelCase` as the API conventions require.
pub mod reason {
    /// Every CIDR has a view.
    pub const PROCESSED: &str = "Processed";
    /// A CIDR does not parse or has host bits set.
    pub const INVALID_CIDR: &str = "InvalidCIDR";
    /// A CIDR needed a remap and no pool has room.
    pub const POOL_EXHAUSTED: &str = "PoolExhausted";
    /// The NetworkConfig is addressed to another cluster.
    pub const WRONG_DESTINATION: &str = "WrongDestination";
    /// The public key is not a base64 X25519 key.
    pub const INVALID_PUBLIC_KEY: &str = "InvalidPublicKey";
    /// Labels and spec disagree about who sent the NetworkConfig.
    pub const INVALID_SOURCE: &str = "InvalidSource";
    /// The spec is unusable for another reason.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A NetworkConfig lacks the role/peer labels (or has an unknown role): not processed.
    pub const MISSING_LABELS: &str = "MissingLabels";
    /// A labelled NetworkConfig does not have the name its labels call for.
    pub const INVALID_NAME: &str = "InvalidName";
    /// A TunnelEndpoint that no NetworkConfig owns (made by hand): removed (Event reason).
    pub const NOT_MANAGED: &str = "NotManaged";
    /// The gateway accepted the state.
    pub const APPLIED: &str = "Applied";
    /// The gateway does not run the desired state (yet).
    pub const PENDING: &str = "Pending";
    /// The gateway refused the state.
    pub const REJECTED: &str = "Rejected";
    /// The gateway cannot be reached.
    pub const GATEWAY_UNAVAILABLE: &str = "GatewayUnavailable";
    /// The tunnel is up.
    pub const CONNECTED: &str = "Connected";
    /// Waiting for the first handshake.
    pub const CONNECTING: &str = "Connecting";
    /// Handshakes fail or the peer is unreachable.
    pub const CONNECTION_ERROR: &str = "ConnectionError";
}

/// Sets condition `type_` in `conditions`. `lastTransitionTime` moves to `now` only when the
/// status flips (or the condition is new); reason, message and generation always update.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Time,
) {
    let status = if status { "True" } else { "False" }.to_owned();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            if existing.status != status {
                existing.last_transition_time = now;
                existing.status = status;
            }
            reason.clone_into(&mut existing.reason);
            message.clone_into(&mut existing.message);
            existing.observed_generation = observed_generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.to_owned(),
            observed_generation,
            last_transition_time: now,
        }),
    }
}

/// The condition of type `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when condition `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).expect("valid timestamp"))
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            PROCESSED,
            false,
            "PoolExhausted",
            "full",
            Some(1),
            at(10),
        );
        set(
            &mut conditions,
            PROCESSED,
            false,
            "InvalidCIDR",
            "bad",
            Some(2),
            at(20),
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert_eq!(conditions[0].reason, "InvalidCIDR");
        assert_eq!(conditions[0].observed_generation, Some(2));

        set(
            &mut conditions,
            PROCESSED,
            true,
            "Processed",
            "ok",
            Some(3),
            at(30),
        );
        assert_eq!(conditions[0].last_transition_time, at(30));
        assert!(is_true(&conditions, PROCESSED));
        assert!(!is_true(&conditions, CONNECTED));
    }

    #[test]
    fn types_are_kept_apart() {
        let mut conditions = Vec::new();
        set(&mut conditions, APPLIED, true, "Applied", "", None, at(1));
        set(
            &mut conditions,
            CONNECTED,
            false,
            "Connecting",
            "",
            None,
            at(1),
        );
        assert_eq!(conditions.len(), 2);
        assert!(is_true(&conditions, APPLIED));
        assert_eq!(
            find(&conditions, CONNECTED).map(|c| c.status.as_str()),
            Some("False")
        );
    }
}
