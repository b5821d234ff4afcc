//! The hops of one cluster's link to a peer, in the order they depend on each other: the
//! NetworkConfigs both ways, the TunnelEndpoint, the gateway, the tunnel, its last handshake,
//! the ACL and the isolation (`isolation.rs`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kubetun_crds::{ConnectionState, ConnectionStatus, TunnelEndpoint, TunnelEndpointStatus};

use super::expect::STALE_HANDSHAKE_SECS;
use super::isolation::isolation_checks;
use super::report::{Checks, Outcome};
use super::side::{Side, tunnel_of};
use kubetun_controller::plumbing::conditions;

/// The fix for a missing NetworkConfig, either way.
const CONNECT: &str =
    "run `kubetun network connect` with both kubeconfigs (or check the hub's ShortcutConnection)";

/// The hops of `side`'s link to `peer`, in order.
pub(super) fn link_checks(checks: &mut Checks, side: &Side, own: &str, peer: &str, now_unix: i64) {
    let c = side.label.as_str();
    outgoing_checks(checks, side, own, peer);
    incoming_check(checks, side, own, peer);
    // Every later hop is about the TunnelEndpoint: without it there is nothing to check.
    let Some(te) = tunnel_of(side, peer) else {
        checks.push(c, peer, "tunnel-endpoint", Outcome::Broken,
            format!("no TunnelEndpoint for {peer}"),
            "the controller builds it once both NetworkConfigs are processed: check kubetun-controller logs");
        return;
    };
    checks.push(
        c,
        peer,
        "tunnel-endpoint",
        Outcome::Ok,
        format!(
            "TunnelEndpoint {} to {}",
            te.metadata.name.clone().unwrap_or_default(),
            te.spec.endpoint
        ),
        "",
    );
    let status = te.status.clone().unwrap_or_default();
    gateway_check(checks, c, peer, &status);
    tunnel_check(checks, c, peer, &status);
    if let Some(conn) = &status.connection {
        handshake_check(checks, c, peer, conn, now_unix);
    }
    acl_check(checks, c, peer, te);
    isolation_checks(checks, side, own, peer, te);
}

/// Our NetworkConfig to `peer` (`outgoing-config`) and, when there is one, whether the peer
/// processed it (`processed-by-peer`).
fn outgoing_checks(checks: &mut Checks, side: &Side, own: &str, peer: &str) {
    let c = side.label.as_str();
    let outgoing = side
        .configs
        .iter()
        .find(|cfg| cfg.spec.source_cluster.id == own && cfg.spec.destination_cluster.id == peer);
    match outgoing {
        None => checks.push(
            c,
            peer,
            "outgoing-config",
            Outcome::Broken,
            format!("no NetworkConfig from {own} to {peer}"),
            CONNECT,
        ),
        Some(cfg) => {
            checks.push(
                c,
                peer,
                "outgoing-config",
                Outcome::Ok,
                format!(
                    "NetworkConfig {} announces {own} to {peer}",
                    cfg.metadata.name.clone().unwrap_or_default()
                ),
                "",
            );
            let processed = cfg.status.as_ref().is_some_and(|s| s.processed);
            if processed {
                checks.push(
                    c,
                    peer,
                    "processed-by-peer",
                    Outcome::Ok,
                    format!("{peer} processed it (its views are mirrored back)"),
                    "",
                );
            } else {
                checks.push(c, peer, "processed-by-peer", Outcome::Broken,
                    format!("{peer} has not processed our NetworkConfig (no views mirrored back)"),
                    "check that the peer holds the matching NetworkConfig and its controller runs (`kubetun network status` on the peer, kubetun-controller logs there); re-run `kubetun network connect`");
            }
        }
    }
}

/// The peer's NetworkConfig in this cluster and whether we processed it (`incoming-config`).
fn incoming_check(checks: &mut Checks, side: &Side, own: &str, peer: &str) {
    let c = side.label.as_str();
    let incoming = side
        .configs
        .iter()
        .find(|cfg| cfg.spec.source_cluster.id == peer && cfg.spec.destination_cluster.id == own);
    match incoming {
        None => checks.push(
            c,
            peer,
            "incoming-config",
            Outcome::Broken,
            format!("no NetworkConfig from {peer} in this cluster"),
            CONNECT,
        ),
        Some(cfg) => {
            let status = cfg.status.clone().unwrap_or_default();
            let cond =
                conditions::find(&status.conditions, kubetun_crds::contract::link::PROCESSED);
            if status.processed && cond.is_none_or(|c| c.status == "True") {
                checks.push(
                    c,
                    peer,
                    "incoming-config",
                    Outcome::Ok,
                    format!("{peer}'s NetworkConfig processed (views assigned)"),
                    "",
                );
            } else {
                checks.push(c, peer, "incoming-config", Outcome::Broken,
                    format!("{peer}'s NetworkConfig not processed: {}", describe_condition(cond)),
                    "fix what the condition names (overlapping or invalid CIDRs, an exhausted pool, a wrong destination); the controller retries by itself");
            }
        }
    }
}

/// The gateway's `Applied` condition on the TunnelEndpoint (`gateway-applied`).
fn gateway_check(checks: &mut Checks, c: &str, peer: &str, status: &TunnelEndpointStatus) {
    let applied = conditions::find(&status.conditions, kubetun_crds::contract::link::APPLIED);
    if applied.is_some_and(|a| a.status == "True") {
        checks.push(
            c,
            peer,
            "gateway-applied",
            Outcome::Ok,
            "the gateway runs the state with this peer".to_owned(),
            "",
        );
    } else {
        checks.push(c, peer, "gateway-applied", Outcome::Broken,
            format!("the gateway has not applied it: {}", describe_condition(applied)),
            "check the gateway container (`kubectl -n kubetun-system logs deploy/kubetun-gateway -c gateway`), its /readyz, and the controller's logs for rejected Applies");
    }
}

/// The tunnel's state as the gateway reports it (`tunnel`).
fn tunnel_check(checks: &mut Checks, c: &str, peer: &str, status: &TunnelEndpointStatus) {
    match &status.connection {
        Some(conn) if conn.status == ConnectionState::Connected => {
            checks.push(c, peer, "tunnel", Outcome::Ok,
                format!("Connected{}", conn.latency.as_ref().map(|l| format!(", latency {l}")).unwrap_or_default()), "");
        }
        Some(conn) => {
            let fix = if conn.status == ConnectionState::Connecting {
                "no handshake yet: check that UDP reaches the peer's endpoint from this cluster's gateway (LoadBalancer/NodePort, firewalls) and that the peer's gateway is ready"
            } else {
                "the peer stopped answering: check the peer's gateway pod and the UDP path between the endpoints"
            };
            checks.push(c, peer, "tunnel", Outcome::Broken,
                format!("{}{}", conn.status, if conn.message.is_empty() { String::new() } else { format!(": {}", conn.message) }),
                fix);
        }
        None => checks.push(c, peer, "tunnel", Outcome::Broken,
            "no report from the gateway".to_owned(),
            "the controller mirrors the gateway's peer status here: check that it reaches the gateway's control socket"),
    }
}

/// The age of the last handshake against [`STALE_HANDSHAKE_SECS`] (`handshake`).
fn handshake_check(
    checks: &mut Checks,
    c: &str,
    peer: &str,
    conn: &ConnectionStatus,
    now_unix: i64,
) {
    match conn.last_handshake.as_deref().map(|h| (h, rfc3339_age(h, now_unix))) {
        Some((_, Some(age))) if age <= STALE_HANDSHAKE_SECS => {
            checks.push(c, peer, "handshake", Outcome::Ok, format!("last handshake {age} s ago"), "");
        }
        Some((h, Some(age))) => checks.push(c, peer, "handshake", Outcome::Broken,
            format!("last handshake {age} s ago ({h}), older than {STALE_HANDSHAKE_SECS} s"),
            "the session expired: check the UDP path and the peer's gateway; a rotated key needs `kubetun network connect` again"),
        Some((h, None)) => checks.push(c, peer, "handshake", Outcome::Warning,
            format!("cannot read the handshake time {h:?}"), ""),
        None => checks.push(c, peer, "handshake", Outcome::Broken,
            "never".to_owned(), "no handshake ever completed: see the tunnel hop"),
    }
}

/// The Network ACL the TunnelEndpoint carries (`allowed-ips`).
fn acl_check(checks: &mut Checks, c: &str, peer: &str, te: &TunnelEndpoint) {
    match &te.spec.allowed_prefixes {
        None => checks.push(c, peer, "allowed-ips", Outcome::Ok, "no Network ACL: every peer prefix passes".to_owned(), ""),
        Some(allowed) if allowed.is_empty() => checks.push(c, peer, "allowed-ips", Outcome::Broken,
            "the Network ACL allows nothing from this peer (fail closed)".to_owned(),
            "a Network peering with this cluster is missing or not ready: `kubectl get networks -A` and their conditions"),
        Some(allowed) => checks.push(c, peer, "allowed-ips", Outcome::Ok, format!("Network ACL allows {}", allowed.join(", ")), ""),
    }
}

fn describe_condition(c: Option<&Condition>) -> String {
    c.map_or_else(
        || "no condition yet".to_owned(),
        |c| {
            if c.message.is_empty() {
                format!("{} ({})", c.status, c.reason)
            } else {
                format!("{} ({}: {})", c.status, c.reason, c.message)
            }
        },
    )
}

fn rfc3339_age(text: &str, now_unix: i64) -> Option<i64> {
    let then: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(now_unix - then.as_second())
}
