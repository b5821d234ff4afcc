//! TunnelEndpoints' status, computed from what the gateway reports (the gateway sync's half;
//! the spec half is the NetworkConfig reconcile's, [`super::super::tunnel_endpoint`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::Api;
use kubetun_crds::contract::link::reason;
use kubetun_crds::{
    ConnectionState, ConnectionStatus, ProbeStatus, TunnelEndpoint, TunnelEndpointSpec,
    TunnelEndpointStatus,
};

use crate::gateway_api::{self, PeerStatus, StatusResponse};
use crate::operator::network_config::context::Context;
use crate::operator::network_config::error::Error;
use crate::plumbing::conditions;
use crate::plumbing::gateway_client::GatewayClientError;

/// What the gateway said about the last push.
#[derive(Debug, Clone, Copy)]
pub enum GatewayReport<'a> {
    /// The gateway answered with its status; `desired_version` is what we want it to run.
    Reported {
        /// The gateway's status.
        status: &'a StatusResponse,
        /// Version of the desired state.
        desired_version: &'a str,
    },
    /// The gateway could not be reached or refused the state.
    Failed(&'a GatewayClientError),
}

/// How a TunnelEndpoint's traffic travels, which its connection status reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerPath<'a> {
    /// Over the peer's own tunnel only.
    Direct,
    /// Over the peer's own tunnel, and through this hub while that tunnel is down.
    WithFallback(&'a str),
    /// Through this hub only: the hub's tunnel is the peer's.
    HubOnly(&'a str),
}

impl<'a> PeerPath<'a> {
    /// The path `spec` describes.
    pub fn of(spec: &'a TunnelEndpointSpec) -> Self {
        match &spec.fallback {
            Some(fallback) if spec.hub_only => Self::HubOnly(&fallback.hub.id),
            Some(fallback) => Self::WithFallback(&fallback.hub.id),
            None => Self::Direct,
        }
    }
}

/// The connection status of a peer reached over `path` as the gateway reports the tunnel
/// (`None`: not in the gateway).
pub fn connection_status(peer: Option<&PeerStatus>, path: PeerPath) -> ConnectionStatus {
    let mut connection = peer.map_or_else(
        || ConnectionStatus {
            status: ConnectionState::Connecting,
            message: "the gateway does not run this peer yet".to_owned(),
            ..ConnectionStatus::default()
        },
        |peer| tunnel_status(peer, path),
    );
    if let PeerPath::HubOnly(hub) = path {
        connection.message = format!("through hub {hub}: {}", connection.message);
        connection.via_hub = Some(hub.to_owned());
    }
    connection
}

/// What the gateway reports of the tunnel `peer`; with a fallback, which way it goes.
fn tunnel_status(peer: &PeerStatus, path: PeerPath) -> ConnectionStatus {
    let fallback_hub = match path {
        PeerPath::WithFallback(hub) => Some(hub),
        PeerPath::Direct | PeerPath::HubOnly(_) => None,
    };
    let state = gateway_api::ConnectionState::try_from(peer.state).unwrap_or_default();
    let (status, default_message) = match state {
        gateway_api::ConnectionState::Connected => {
            (ConnectionState::Connected, "VPN connection established")
        }
        gateway_api::ConnectionState::Error => (
            ConnectionState::Error,
            "no network connectivity towards the remote cluster",
        ),
        gateway_api::ConnectionState::Connecting | gateway_api::ConnectionState::Unspecified => (
            ConnectionState::Connecting,
            "waiting for the VPN connection to be established",
        ),
    };
    let latency_us = (peer.latency_us > 0).then_some(peer.latency_us);
    ConnectionStatus {
        status,
        message: if peer.message.is_empty() {
            default_message.to_owned()
        } else {
            peer.message.clone()
        },
        latency: latency_us.map(format_latency),
        latency_us,
        last_handshake: rfc3339_ms(peer.last_handshake_unix_ms),
        rx_bytes: peer.rx_bytes,
        tx_bytes: peer.tx_bytes,
        endpoint: (!peer.endpoint.is_empty()).then(|| peer.endpoint.clone()),
        probes: peer.conncheck.map(|c| ProbeStatus {
            interval_ms: c.interval_ms,
            loss_threshold: c.loss_threshold,
            consecutive_losses: c.consecutive_losses,
            last_reply: rfc3339_ms(c.last_reply_unix_ms),
            sent: c.probes_sent,
            lost: c.probes_lost,
        }),
        previous_key: peer.previous_key,
        via_hub: fallback_hub.filter(|_| peer.failed_over).map(str::to_owned),
        path_changed: fallback_hub.and_then(|_| rfc3339_ms(peer.path_changed_unix_ms)),
        path_switches: fallback_hub.map_or(0, |_| peer.path_switches),
    }
}

/// A Unix time in milliseconds as RFC 3339; `None` for 0 (never) or out of range.
fn rfc3339_ms(unix_ms: i64) -> Option<String> {
    (unix_ms > 0)
        .then(|| Timestamp::from_millisecond(unix_ms).ok())
        .flatten()
        .map(|t| t.to_string())
}

fn format_latency(us: u64) -> String {
    if us < 1000 {
        format!("{us}µs")
    } else {
        format!("{:.1}ms", us as f64 / 1000.0)
    }
}

/// The status `endpoint` should have given the gateway's report: condition `Applied`, the
/// connection, and condition `Connected`.
pub fn status_from_report(
    endpoint: &TunnelEndpoint,
    report: GatewayReport<'_>,
    now: Time,
) -> TunnelEndpointStatus {
    let mut status = endpoint.status.clone().unwrap_or_default();
    let generation = endpoint.metadata.generation;
    status.observed_generation = generation;
    let connection = match report {
        GatewayReport::Reported {
            status: gateway,
            desired_version,
        } => {
            let path = PeerPath::of(&endpoint.spec);
            let peer = if let PeerPath::HubOnly(hub) = path {
                gateway.peers.iter().find(|p| p.name == hub)
            } else {
                gateway
                    .peers
                    .iter()
                    .find(|p| p.public_key == endpoint.spec.public_key)
            };
            let (applied, why, message) = if gateway.version != desired_version {
                (
                    false,
                    reason::PENDING,
                    format!(
                        "the gateway runs state {:?}, waiting for {desired_version:?}",
                        gateway.version
                    ),
                )
            } else if peer.is_none() {
                (
                    false,
                    reason::PENDING,
                    "the gateway state does not contain this peer".to_owned(),
                )
            } else {
                // Not the state's version or generation: they change whenever any peer
                // does, and every TunnelEndpoint's status would be rewritten for it.
                (
                    true,
                    reason::APPLIED,
                    "the gateway runs this peer".to_owned(),
                )
            };
            conditions::set(
                &mut status.conditions,
                kubetun_crds::contract::link::APPLIED,
                applied,
                why,
                &message,
                generation,
                now.clone(),
            );
            connection_status(peer, path)
        }
        GatewayReport::Failed(error) => {
            let why = if error.is_rejection() {
                reason::REJECTED
            } else {
                reason::GATEWAY_UNAVAILABLE
            };
            conditions::set(
                &mut status.conditions,
                kubetun_crds::contract::link::APPLIED,
                false,
                why,
                &error.to_string(),
                generation,
                now.clone(),
            );
            ConnectionStatus {
                status: ConnectionState::Error,
                message: error.to_string(),
                ..ConnectionStatus::default()
            }
        }
    };
    let (connected, why) = match connection.status {
        ConnectionState::Connected => (true, reason::CONNECTED),
        ConnectionState::Connecting => (false, reason::CONNECTING),
        ConnectionState::Error => (false, reason::CONNECTION_ERROR),
    };
    conditions::set(
        &mut status.conditions,
        kubetun_crds::contract::link::CONNECTED,
        connected,
        why,
        &connection.message,
        generation,
        now,
    );
    status.connection = Some(connection);
    status
}

/// True when the two statuses differ in more than counters and latency (worth an immediate
/// write; counters alone are refreshed at a slower pace).
pub fn differs_significantly(a: Option<&TunnelEndpointStatus>, b: &TunnelEndpointStatus) -> bool {
    let Some(a) = a else { return true };
    let key = |s: &TunnelEndpointStatus| {
        (
            s.observed_generation,
            s.connection.as_ref().map(|c| {
                (
                    c.status,
                    c.message.clone(),
                    c.endpoint.clone(),
                    c.last_handshake.is_some(),
                    // A switch between direct and the hub is news, not a counter.
                    c.via_hub.clone(),
                )
            }),
            s.conditions
                .iter()
                .map(|c| {
                    (
                        c.type_.clone(),
                        c.status.clone(),
                        c.reason.clone(),
                        c.message.clone(),
                    )
                })
                .collect::<Vec<_>>(),
        )
    };
    key(a) != key(b)
}

/// Writes `status` onto the TunnelEndpoint (server-side apply on the status subresource).
pub async fn write_status(
    ctx: &Context,
    endpoint: &TunnelEndpoint,
    status: &TunnelEndpointStatus,
) -> Result<(), Error> {
    let api: Api<TunnelEndpoint> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    crate::operator::network_config::status_patch::apply_status(&api, &endpoint.name_any(), status)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::network_config::tunnel_endpoint::tests::endpoint_named;

    fn endpoint() -> TunnelEndpoint {
        let mut te = endpoint_named("rome");
        te.metadata.generation = Some(3);
        te
    }

    fn now() -> Time {
        Time(Timestamp::from_second(1_800_000_000).expect("valid"))
    }

    fn gateway(version: &str, state: gateway_api::ConnectionState) -> StatusResponse {
        StatusResponse {
            version: version.into(),
            generation: 7,
            peers: vec![PeerStatus {
                public_key: "KEY".into(),
                name: "rome".into(),
                endpoint: "192.0.2.2:51820".into(),
                last_handshake_unix_ms: 1_800_000_000_000,
                rx_bytes: 10,
                tx_bytes: 20,
                latency_us: 1500,
                state: state as i32,
                ..PeerStatus::default()
            }],
            ..StatusResponse::default()
        }
    }

    #[test]
    fn connected_peer_in_the_desired_version() {
        let status = status_from_report(
            &endpoint(),
            GatewayReport::Reported {
                status: &gateway("v1", gateway_api::ConnectionState::Connected),
                desired_version: "v1",
            },
            now(),
        );
        let connection = status.connection.as_ref().expect("connection set");
        assert_eq!(connection.status, ConnectionState::Connected);
        assert_eq!(connection.latency.as_deref(), Some("1.5ms"));
        assert_eq!(connection.rx_bytes, 10);
        assert_eq!(
            connection.last_handshake.as_deref(),
            Some("2027-01-15T08:00:00Z")
        );
        assert!(conditions::is_true(
            &status.conditions,
            kubetun_crds::contract::link::APPLIED
        ));
        assert!(conditions::is_true(
            &status.conditions,
            kubetun_crds::contract::link::CONNECTED
        ));
        assert_eq!(status.observed_generation, Some(3));
    }

    #[test]
    fn old_gateway_version_is_pending_and_errors_are_readable() {
        let pending = status_from_report(
            &endpoint(),
            GatewayReport::Reported {
                status: &gateway("v0", gateway_api::ConnectionState::Error),
                desired_version: "v1",
            },
            now(),
        );
        let applied = conditions::find(&pending.conditions, kubetun_crds::contract::link::APPLIED)
            .expect("set");
        assert_eq!(applied.reason, "Pending");
        assert!(applied.message.contains("\"v1\""));
        assert_eq!(
            pending.connection.as_ref().map(|c| c.status),
            Some(ConnectionState::Error)
        );

        let error = GatewayClientError::Unavailable {
            socket: "/run/gw.sock".into(),
            message: "No such file or directory".into(),
        };
        let down = status_from_report(&endpoint(), GatewayReport::Failed(&error), now());
        let applied =
            conditions::find(&down.conditions, kubetun_crds::contract::link::APPLIED).expect("set");
        assert_eq!(applied.reason, "GatewayUnavailable");
        assert!(
            applied.message.contains("No such file"),
            "{}",
            applied.message
        );
        assert!(differs_significantly(Some(&pending), &down));
    }

    #[test]
    fn probe_latency_and_the_unreachable_message_reach_the_status() {
        let mut report = gateway("v1", gateway_api::ConnectionState::Connected);
        report.peers[0].latency_us = 420;
        fn desired(status: &StatusResponse) -> GatewayReport<'_> {
            GatewayReport::Reported {
                status,
                desired_version: "v1",
            }
        }
        let connected = status_from_report(&endpoint(), desired(&report), now());
        let connection = connected.connection.as_ref().expect("connection set");
        assert_eq!(connection.latency_us, Some(420));
        assert_eq!(connection.latency.as_deref(), Some("420µs"));

        let message = "no reply to the last 5 connectivity probes (2 s interval)";
        report.peers[0].state = gateway_api::ConnectionState::Error as i32;
        report.peers[0].message = message.into();
        report.peers[0].conncheck = Some(gateway_api::ConnCheckStatus {
            interval_ms: 2000,
            loss_threshold: 5,
            consecutive_losses: 5,
            last_reply_unix_ms: 1_800_000_000_000,
            last_rtt_us: 400,
            probes_sent: 40,
            probes_lost: 5,
        });
        let mut te = endpoint();
        te.status = Some(connected.clone());
        let lost = status_from_report(&te, desired(&report), now());
        let connection = lost.connection.as_ref().expect("connection set");
        assert_eq!(connection.status, ConnectionState::Error);
        assert_eq!(connection.message, message);
        let probes = connection.probes.as_ref().expect("probe status");
        assert_eq!(probes.consecutive_losses, 5);
        assert_eq!((probes.sent, probes.lost), (40, 5));
        assert_eq!(probes.last_reply.as_deref(), Some("2027-01-15T08:00:00Z"));
        let condition = conditions::find(&lost.conditions, kubetun_crds::contract::link::CONNECTED)
            .expect("set");
        assert_eq!(condition.status, "False");
        assert_eq!(condition.reason, reason::CONNECTION_ERROR);
        assert_eq!(condition.message, message);
        assert!(
            differs_significantly(Some(&connected), &lost),
            "written at once"
        );

        // The next reply: Connected again, written at once too.
        report.peers[0].state = gateway_api::ConnectionState::Connected as i32;
        report.peers[0].message.clear();
        te.status = Some(lost.clone());
        let back = status_from_report(&te, desired(&report), now());
        assert_eq!(
            back.connection.as_ref().map(|c| c.status),
            Some(ConnectionState::Connected)
        );
        assert!(differs_significantly(Some(&lost), &back));
    }

    #[test]
    fn counters_alone_are_not_significant() {
        let report = gateway("v1", gateway_api::ConnectionState::Connected);
        let a = status_from_report(
            &endpoint(),
            GatewayReport::Reported {
                status: &report,
                desired_version: "v1",
            },
            now(),
        );
        let mut more = report.clone();
        more.peers[0].rx_bytes = 1_000_000;
        more.peers[0].latency_us = 900;
        let b = status_from_report(
            &endpoint(),
            GatewayReport::Reported {
                status: &more,
                desired_version: "v1",
            },
            now(),
        );
        assert_ne!(a, b);
        assert!(!differs_significantly(Some(&a), &b));
    }
}
