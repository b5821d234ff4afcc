//! Kubernetes Events that explain to an operator why an object is not acted on (or what was
//! done to it instead), next to the status condition that says the same.
//!
//! Published best effort: a lost Event must not fail a reconcile. Each call uses a fresh
//! [`Recorder`]: callers publish only when a condition changes, and kube's recorder folds
//! Events with the same reason and action into one series that keeps the *first* note, so a
//! shared recorder would repeat a stale message after the object changed.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// `reportingController` of the Events the controller process publishes.
pub const REPORTER: &str = "kubetun-controller";

/// Longest note the Events API takes (1 kB).
const MAX_NOTE: usize = 1024;

/// Publishes a Warning Event about `regarding`. `note` must hold no secret: it is as
/// readable as the object itself.
pub async fn warn(
    client: &kube::Client,
    regarding: &ObjectReference,
    reason: &str,
    action: &str,
    note: &str,
) {
    publish(client, regarding, EventType::Warning, reason, action, note).await;
}

/// Publishes a Normal Event about `regarding` (see [`warn`]).
pub async fn normal(
    client: &kube::Client,
    regarding: &ObjectReference,
    reason: &str,
    action: &str,
    note: &str,
) {
    publish(client, regarding, EventType::Normal, reason, action, note).await;
}

async fn publish(
    client: &kube::Client,
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    let recorder = Recorder::new(client.clone(), Reporter::from(REPORTER));
    publish_with(&recorder, regarding, type_, reason, action, note).await;
}

/// Publishes an Event about `regarding` through `recorder`, best effort (a failure is logged
/// at debug); the note is cut to what the Events API takes.
pub async fn publish_with(
    recorder: &Recorder,
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(truncate(note, MAX_NOTE).to_owned()),
        action: action.to_owned(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, regarding).await {
        tracing::debug!(
            kind = regarding.kind.as_deref().unwrap_or_default(),
            name = regarding.name.as_deref().unwrap_or_default(),
            reason,
            %error,
            "cannot publish event"
        );
    }
}

/// `text` cut to at most `max` bytes at a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("short", 1024), "short");
        let long = "é".repeat(600);
        let cut = truncate(&long, MAX_NOTE);
        assert!(cut.len() <= MAX_NOTE);
        assert_eq!(cut.chars().count(), 512);
    }
}
