//! What a link's isolation lets through: the setting of the TunnelEndpoint and what this
//! cluster exports to the peer (`isolation`), the gateway's admission of the peer and what
//! it refused, by reason (`admission`), and, per cluster, the gateway's flow table
//! (`flow-table`) or why its status could not be read (`gateway-status`).

use kubetun_crds::{ExportedService, Isolation, TunnelEndpoint};

use super::report::{Checks, Outcome};
use super::side::Side;
use kubetun_controller::gateway_api::{self, AdmissionStatus, StatusResponse};

/// Services named in a detail before "and N more".
const NAMED_SERVICES: usize = 5;

/// The fix when an `exported` link has nothing exported to the peer.
fn nothing_exported_fix(peer: &str) -> String {
    format!(
        "nothing is exported to {peer}: `kubectl apply` a ServiceExport (if it has a \
         net.kubetun.io/consumers annotation, it must name {peer}), or `kubetun network \
         connect --isolation open`"
    )
}

/// The ExportedServices of `own` that `peer` may import (every one without consumers, and
/// those whose consumers name it), as `namespace/name`, sorted.
pub(super) fn exported_to(exports: &[ExportedService], own: &str, peer: &str) -> Vec<String> {
    let mut names: Vec<String> = exports
        .iter()
        .filter(|e| e.spec.cluster.id == own)
        .filter(|e| {
            e.spec
                .consumers
                .as_ref()
                .is_none_or(|c| c.iter().any(|id| id == peer))
        })
        .map(|e| format!("{}/{}", e.spec.namespace, e.spec.name))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The link's isolation (`isolation`), and with the gateway's status its admission of the
/// peer (`admission`).
pub(super) fn isolation_checks(
    checks: &mut Checks,
    side: &Side,
    own: &str,
    peer: &str,
    te: &TunnelEndpoint,
) {
    let c = side.label.as_str();
    let exported = side
        .exports
        .as_ref()
        .map(|exports| exported_to(exports, own, peer));
    match (te.spec.isolation, &exported) {
        (Isolation::Open, _) => checks.push(
            c,
            peer,
            "isolation",
            Outcome::Ok,
            format!("open: {peer} reaches every pod and external address of {own}"),
            "",
        ),
        (Isolation::Exported, Some(names)) if names.is_empty() => checks.push(
            c,
            peer,
            "isolation",
            Outcome::Warning,
            format!(
                "exported, and nothing is exported to {peer}: it reaches no pod of {own} (only \
                 the replies to connections {own} opens towards it)"
            ),
            &nothing_exported_fix(peer),
        ),
        (Isolation::Exported, Some(names)) => {
            let mut shown = names
                .iter()
                .take(NAMED_SERVICES)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            if names.len() > NAMED_SERVICES {
                shown.push_str(&format!(" and {} more", names.len() - NAMED_SERVICES));
            }
            checks.push(
                c,
                peer,
                "isolation",
                Outcome::Ok,
                format!(
                    "exported: {peer} reaches only the {} Service(s) exported to it ({shown})",
                    names.len()
                ),
                "",
            );
        }
        (Isolation::Exported, None) => checks.push(
            c,
            peer,
            "isolation",
            Outcome::Ok,
            format!(
                "exported: {peer} reaches only the Services exported to it (the ExportedServices \
                 could not be listed to name them)"
            ),
            "",
        ),
    }
    if let Some(Ok(status)) = &side.gateway {
        admission_check(
            checks,
            c,
            peer,
            te.spec.isolation,
            exported.as_deref(),
            status,
        );
    }
}

/// The gateway's admission of `peer` against the TunnelEndpoint's isolation (`admission`).
fn admission_check(
    checks: &mut Checks,
    c: &str,
    peer: &str,
    wanted: Isolation,
    exported: Option<&[String]>,
    status: &StatusResponse,
) {
    let admission = status.admissions.iter().find(|a| a.cluster == peer);
    // A gateway without an admission for a cluster lets the remap table decide (open).
    let applied = admission.map_or(Isolation::Open, |a| match a.isolation() {
        gateway_api::Isolation::Open => Isolation::Open,
        gateway_api::Isolation::Exported => Isolation::Exported,
    });
    let refused = admission.map_or_else(|| "nothing refused".to_owned(), describe_drops);
    if applied != wanted {
        checks.push(
            c,
            peer,
            "admission",
            Outcome::Warning,
            format!(
                "the gateway admits {peer} as {applied}, the TunnelEndpoint says {wanted} \
                 ({refused})"
            ),
            "the controller has not pushed the isolation to the gateway yet: it takes effect \
             within seconds; if it stays, check the controller's logs (`kubectl -n \
             kubetun-system logs deploy/kubetun-gateway -c controller`)",
        );
        return;
    }
    let Some(admission) = admission else {
        checks.push(
            c,
            peer,
            "admission",
            Outcome::Ok,
            format!("the gateway admits every packet of {peer} the remap table accepts"),
            "",
        );
        return;
    };
    if applied == Isolation::Exported
        && admission.endpoints == 0
        && exported.is_some_and(|names| !names.is_empty())
    {
        checks.push(
            c,
            peer,
            "admission",
            Outcome::Warning,
            format!(
                "the gateway admits no endpoint to {peer} although Services are exported to it \
                 ({refused})"
            ),
            "the exported Services have no ready endpoints (`kubectl get endpointslices` of \
             each), or the controller has not pushed them yet",
        );
        return;
    }
    let what = match applied {
        Isolation::Exported if admission.policies.is_empty() => {
            format!("{} endpoint(s) admitted", admission.endpoints)
        }
        Isolation::Exported => format!(
            "{} endpoint(s) admitted, {}",
            admission.endpoints,
            describe_policies(admission)
        ),
        Isolation::Open => "open".to_owned(),
    };
    checks.push(
        c,
        peer,
        "admission",
        Outcome::Ok,
        format!("gateway: {what}; {refused}"),
        "",
    );
}

/// `refused not_exported 12, ...` by reason, or `nothing refused`.
fn describe_drops(admission: &AdmissionStatus) -> String {
    let mut drops: Vec<(&String, &u64)> = admission.drops.iter().filter(|(_, n)| **n > 0).collect();
    if drops.is_empty() {
        return "nothing refused".to_owned();
    }
    drops.sort();
    let list = drops
        .iter()
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("refused: {list}")
}

/// `policy shop/web selects 3 source(s), refused 12; ...`: who may open the guarded
/// endpoints.
fn describe_policies(admission: &AdmissionStatus) -> String {
    admission
        .policies
        .iter()
        .map(|p| {
            format!(
                "policy {} selects {} source(s), refused {}",
                p.name, p.sources, p.drops
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The gateway's flow table (`flow-table`), or why its status is missing
/// (`gateway-status`); nothing when it was not asked for.
pub(super) fn gateway_checks(checks: &mut Checks, side: &Side) {
    let c = side.label.as_str();
    match &side.gateway {
        None => {}
        Some(Err(reason)) => checks.push(
            c,
            "",
            "gateway-status",
            Outcome::Warning,
            format!("cannot read the gateway's status: {reason}"),
            "run diagnose where the gateway's control socket is (the gateway's node or pod) \
             with --gateway-socket, or leave the flag out",
        ),
        Some(Ok(status)) => {
            let table = status.flow_table.unwrap_or_default();
            let usage = format!(
                "{} of {} slots in use (connections this cluster's pods opened to linked \
                 clusters)",
                table.in_use, table.capacity
            );
            if table.full > 0 || (table.capacity > 0 && table.in_use >= table.capacity) {
                checks.push(
                    c,
                    "",
                    "flow-table",
                    Outcome::Warning,
                    format!(
                        "{usage}; {} new connection(s) found it full: dropped towards exported \
                         peers, sent unrecorded towards open ones",
                        table.full
                    ),
                    "many connections at once from this cluster's pods to linked clusters: find \
                     their source (`kubetun gateway show`); entries expire as connections end",
                );
            } else {
                checks.push(c, "", "flow-table", Outcome::Ok, usage, "");
            }
        }
    }
}
