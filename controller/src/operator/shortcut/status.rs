//! The ShortcutConnection's status: both directions, the phase and the `Ready` and
//! `LeafReachable` conditions, from a sync pass or an error, written with server-side apply.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource as _, ResourceExt as _};
use kubetun_crds::contract::shortcut::{LEAF_REACHABLE, READY, reason};
use kubetun_crds::{
    Condition, ShortcutConnection, ShortcutConnectionStatus, ShortcutDirection, ShortcutPath,
    ShortcutPhase,
};

use super::ShortcutError;
use super::objects::{FIELD_MANAGER, key_of};

use crate::connector::{self, Direction, LinkState};
use crate::plumbing::conditions;

/// Records `error` in the condition it belongs to (`LeafReachable` or `Ready`), and marks
/// the link not ready.
pub(super) fn record_error(
    conditions_list: &mut Vec<Condition>,
    error: &ShortcutError,
    generation: Option<i64>,
    now: Time,
) {
    let (type_, reason) = error.condition();
    let message = connector::error_chain(error);
    conditions::set(
        conditions_list,
        type_,
        false,
        reason,
        &message,
        generation,
        now.clone(),
    );
    if type_ == LEAF_REACHABLE {
        conditions::set(
            conditions_list,
            READY,
            false,
            reason,
            &message,
            generation,
            now,
        );
    }
}

/// The status a successful pass yields: both directions, phase and conditions.
pub fn status_from(
    state: &LinkState,
    shortcut: &ShortcutConnection,
    current: ShortcutConnectionStatus,
    generation: Option<i64>,
    now: Time,
) -> ShortcutConnectionStatus {
    let names = [&shortcut.spec.left.name, &shortcut.spec.right.name];
    let direction = |d: &Direction, from: &str, to: &str| ShortcutDirection {
        from: from.to_owned(),
        to: to.to_owned(),
        pod_cidrs: d.pod_cidrs.clone(),
        external_cidrs: d.external_cidrs.clone(),
        connection: d.connection.as_ref().map(|c| c.status),
        path: d.connection.as_ref().map(|c| {
            if c.via_hub.is_some() {
                ShortcutPath::ViaHub
            } else {
                ShortcutPath::Direct
            }
        }),
        path_changed: d.connection.as_ref().and_then(|c| c.path_changed.clone()),
    };
    let directions = vec![
        direction(&state.local_to_remote, names[0], names[1]),
        direction(&state.remote_to_local, names[1], names[0]),
    ];
    let (phase, ready, ready_reason, message) = summarize(state);
    let mut conditions_list = current.conditions;
    conditions::set(
        &mut conditions_list,
        LEAF_REACHABLE,
        true,
        reason::REACHABLE,
        "both leaves answered",
        generation,
        now.clone(),
    );
    conditions::set(
        &mut conditions_list,
        READY,
        ready,
        ready_reason,
        &message,
        generation,
        now,
    );
    ShortcutConnectionStatus {
        phase,
        directions,
        observed_generation: generation,
        conditions: conditions_list,
    }
}

/// Phase, readiness, reason and message of a link.
fn summarize(state: &LinkState) -> (ShortcutPhase, bool, &'static str, String) {
    let directions = state.directions();
    if let Some((d, rejection)) = directions
        .iter()
        .find_map(|d| d.rejection.as_ref().map(|r| (d, r)))
    {
        let message = format!(
            "{} rejected the NetworkConfig of {}: {}",
            d.from_label, d.to.id, rejection.message
        );
        return (ShortcutPhase::Error, false, reason::REJECTED, message);
    }
    if let Some(d) = directions.iter().find(|d| !d.processed) {
        let message = format!(
            "waiting for {} to process the NetworkConfig of {}",
            d.from_label, d.to.id
        );
        return (ShortcutPhase::Pending, false, reason::PROCESSING, message);
    }
    if state.is_connected() {
        return (
            ShortcutPhase::Connected,
            true,
            reason::CONNECTED,
            "both tunnels are connected".to_owned(),
        );
    }
    let failing = directions.iter().find(|d| {
        d.connection
            .as_ref()
            .is_some_and(|c| c.status == kubetun_crds::ConnectionState::Error)
    });
    if let Some(d) = failing {
        let detail = d
            .connection
            .as_ref()
            .map(|c| c.message.clone())
            .unwrap_or_default();
        let message = format!(
            "the tunnel of {} to {} fails: {detail}",
            d.from_label, d.to.id
        );
        return (
            ShortcutPhase::Pending,
            false,
            reason::CONNECTION_ERROR,
            message,
        );
    }
    let waiting: Vec<&str> = directions
        .iter()
        .filter(|d| !d.is_connected())
        .map(|d| d.from_label.as_str())
        .collect();
    let message = format!(
        "waiting for the tunnel of {} to connect",
        waiting.join(" and ")
    );
    (ShortcutPhase::Pending, false, reason::CONNECTING, message)
}

/// Server-side applies the status unless it is unchanged.
pub(super) async fn write_status(
    api: &Api<ShortcutConnection>,
    shortcut: &ShortcutConnection,
    status: ShortcutConnectionStatus,
) -> Result<(), ShortcutError> {
    if shortcut.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let name = shortcut.name_any();
    let patch = serde_json::json!({
        "apiVersion": ShortcutConnection::api_version(&()),
        "kind": ShortcutConnection::kind(&()),
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|source| ShortcutError::Hub {
        action: format!(
            "update the status of ShortcutConnection {}",
            key_of(shortcut)
        ),
        source,
    })?;
    Ok(())
}
