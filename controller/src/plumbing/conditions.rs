//! `metav1.Condition` bookkeeping for every kubetun status, plus the condition types and
//! reasons the controller writes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubetun_crds::Condition;

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
    use kubetun_crds::contract::link::{APPLIED, CONNECTED, PROCESSED};

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
