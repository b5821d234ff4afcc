//! Peer connection state and the status report built from device readings: the gRPC
//! `StatusResponse` (the UAPI `get` view is [`crate::uapi::report`]'s). Pure: time is passed
//! in.

use crate::device::{DeviceReport, PeerReport};
use crate::proto;
use kubetun_gateway_core::state::Isolation;

/// A session older than this is gone (WireGuard's REJECT_AFTER_TIME).
pub const SESSION_LIFETIME_MS: u64 = 180_000;
/// Handshakes unanswered for longer than this make the peer ERROR.
pub const HANDSHAKE_FAILING_AFTER_MS: u64 = 20_000;

/// The connection state of a peer at `now_ms`, with a human-readable explanation.
pub fn connection_state(report: &PeerReport, now_ms: u64) -> (proto::ConnectionState, String) {
    use proto::ConnectionState as S;
    if !report.active {
        return (S::Error, "interface has no private key".into());
    }
    if report.endpoint.is_none() {
        return (
            S::Error,
            "no endpoint: waiting for the peer to connect".into(),
        );
    }
    if let Some(conncheck) = report.conncheck.as_ref().filter(|c| c.is_unreachable()) {
        // Stable wording (the threshold, not the growing count): the controller writes a
        // TunnelEndpoint status whenever the message changes.
        return (
            S::Error,
            format!(
                "no reply to the last {} connectivity probes ({} interval)",
                conncheck.config.loss_threshold,
                conncheck.config.interval_text()
            ),
        );
    }
    let pending = report.handshake_pending_since_ms;
    if pending != 0 && now_ms.saturating_sub(pending) > HANDSHAKE_FAILING_AFTER_MS {
        let secs = now_ms.saturating_sub(pending) / 1000;
        return (S::Error, format!("no handshake response for {secs} s"));
    }
    let last = report.last_handshake_ms;
    if last != 0 && now_ms.saturating_sub(last) < SESSION_LIFETIME_MS {
        return (S::Connected, String::new());
    }
    (S::Connecting, "waiting for a handshake".into())
}

/// Builds the gRPC status of the device.
pub fn status_response(report: &DeviceReport, now_ms: u64) -> proto::StatusResponse {
    proto::StatusResponse {
        version: report.version.clone(),
        generation: report.generation,
        interface_name: report.interface_name.clone(),
        public_key: report
            .private_key
            .map(|k| k.public_key().to_base64())
            .unwrap_or_default(),
        listen_port: report.listen_port.map_or(0, u32::from),
        peers: report
            .peers
            .iter()
            .map(|peer| {
                let (state, mut message) = connection_state(peer, now_ms);
                if peer.previous_key && message.is_empty() {
                    // Stable wording: the controller writes a status whenever it changes.
                    message =
                        "on the previous key until the peer handshakes with the new one".to_owned();
                }
                proto::PeerStatus {
                    public_key: peer.config.public_key.to_base64(),
                    name: peer.config.name.clone(),
                    endpoint: peer.endpoint.map(|e| e.to_string()).unwrap_or_default(),
                    last_handshake_unix_ms: i64::try_from(peer.last_handshake_ms)
                        .unwrap_or(i64::MAX),
                    rx_bytes: peer.rx_bytes,
                    tx_bytes: peer.tx_bytes,
                    rx_packets: peer.rx_packets,
                    tx_packets: peer.tx_packets,
                    latency_us: peer.latency_us.unwrap_or(0),
                    state: state.into(),
                    message,
                    routes: peer
                        .config
                        .routes
                        .iter()
                        .map(|route| proto::Route {
                            real: route.real.to_string(),
                            view: route.view.to_string(),
                            fallback: route.fallback,
                        })
                        .collect(),
                    acl: peer.config.acl.as_ref().map(|allowed| proto::Acl {
                        allowed: allowed.iter().map(ToString::to_string).collect(),
                    }),
                    conncheck: peer.conncheck.as_ref().map(|c| proto::ConnCheckStatus {
                        interval_ms: c.config.interval_ms,
                        loss_threshold: c.config.loss_threshold,
                        consecutive_losses: c.reading.consecutive_losses,
                        last_reply_unix_ms: i64::try_from(c.last_reply_unix_ms).unwrap_or(i64::MAX),
                        last_rtt_us: c.reading.last_rtt_us.unwrap_or(0),
                        probes_sent: c.reading.probes_sent,
                        probes_lost: c.reading.probes_lost,
                    }),
                    previous_key: peer.previous_key,
                    failed_over: peer.path.is_some_and(|p| p.failed_over()),
                    path_switches: peer.path.map_or(0, |p| p.switches()),
                    path_changed_unix_ms: peer.path.map_or(0, |p| {
                        i64::try_from(p.changed_unix_ms()).unwrap_or(i64::MAX)
                    }),
                }
            })
            .collect(),
        drops: report
            .drops
            .iter()
            .map(|(reason, count)| ((*reason).to_owned(), *count))
            .collect(),
        host_errors: report.host_errors.clone(),
        active: report.active,
        active_remaining_ms: report
            .active_remaining
            .filter(|_| report.active)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        leased: report.active_remaining.is_some(),
        promotions: report.promotions,
        admissions: report
            .admissions
            .iter()
            .map(|admission| proto::AdmissionStatus {
                cluster: admission.cluster.clone(),
                isolation: match admission.isolation {
                    Isolation::Open => proto::Isolation::Open,
                    Isolation::Exported => proto::Isolation::Exported,
                }
                .into(),
                endpoints: u32::try_from(admission.endpoints).unwrap_or(u32::MAX),
                drops: admission
                    .drops
                    .iter()
                    .map(|(reason, count)| ((*reason).to_owned(), *count))
                    .collect(),
                policies: admission
                    .policies
                    .iter()
                    .map(|policy| proto::PolicyStatus {
                        name: policy.name.clone(),
                        sources: u32::try_from(policy.sources).unwrap_or(u32::MAX),
                        drops: policy.drops,
                    })
                    .collect(),
            })
            .collect(),
        flow_table: Some(proto::FlowTableStatus {
            capacity: report.flow_table.capacity as u64,
            in_use: report.flow_table.in_use as u64,
            full: report.flow_table.full,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::uapi::report::uapi_view;
    use kubetun_gateway_core::key::Key;
    use kubetun_gateway_core::state::PeerConfig;
    use proto::ConnectionState as S;

    /// A device with one peer, listening on 51820.
    fn device(peer: PeerReport, remap_rules: usize) -> DeviceReport {
        DeviceReport {
            interface_name: "kt0".into(),
            version: String::new(),
            generation: 1,
            private_key: None,
            listen_port: Some(51820),
            fwmark: 0,
            peers: vec![peer],
            drops: Vec::new(),
            remap_rules,
            host_errors: Vec::new(),
            active: true,
            active_remaining: None,
            promotions: 0,
            admissions: Vec::new(),
            flow_table: Default::default(),
        }
    }

    fn report() -> PeerReport {
        PeerReport {
            config: PeerConfig::new(Key::from_bytes([3; 32])),
            endpoint: Some("192.0.2.1:51820".parse().expect("addr")),
            active: true,
            rx_bytes: 0,
            tx_bytes: 0,
            rx_packets: 0,
            tx_packets: 0,
            handshakes: 0,
            last_handshake_ms: 0,
            handshake_pending_since_ms: 0,
            latency_us: None,
            conncheck: None,
            previous_key: false,
            path: None,
        }
    }

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn connected_only_with_a_fresh_handshake() {
        let mut r = report();
        assert_eq!(connection_state(&r, NOW).0, S::Connecting);
        r.last_handshake_ms = NOW - 5_000;
        assert_eq!(connection_state(&r, NOW).0, S::Connected);
        r.last_handshake_ms = NOW - SESSION_LIFETIME_MS;
        assert_eq!(connection_state(&r, NOW).0, S::Connecting);
    }

    #[test]
    fn error_when_unreachable_or_failing() {
        let mut r = report();
        r.handshake_pending_since_ms = NOW - 10_000;
        assert_eq!(connection_state(&r, NOW).0, S::Connecting);
        r.handshake_pending_since_ms = NOW - 25_000;
        let (state, message) = connection_state(&r, NOW);
        assert_eq!(state, S::Error);
        assert!(message.contains("25 s"), "{message}");

        let mut r = report();
        r.endpoint = None;
        assert_eq!(connection_state(&r, NOW).0, S::Error);
        let mut r = report();
        r.active = false;
        assert_eq!(connection_state(&r, NOW).0, S::Error);
    }

    fn conncheck(losses: u32) -> crate::device::ConnCheckReport {
        crate::device::ConnCheckReport {
            config: kubetun_gateway_core::conncheck::ConnCheckConfig::default(),
            reading: kubetun_gateway_core::conncheck::ProberReading {
                consecutive_losses: losses,
                srtt_us: Some(800),
                ..Default::default()
            },
            last_reply_unix_ms: NOW - 10_000,
        }
    }

    #[test]
    fn conncheck_losses_make_a_connected_peer_error_until_a_reply() {
        let mut r = report();
        r.last_handshake_ms = NOW - 5_000;
        r.conncheck = Some(conncheck(4));
        assert_eq!(connection_state(&r, NOW).0, S::Connected, "below threshold");
        r.conncheck = Some(conncheck(5));
        let (state, message) = connection_state(&r, NOW);
        assert_eq!(state, S::Error);
        assert_eq!(
            message,
            "no reply to the last 5 connectivity probes (2 s interval)"
        );
        r.conncheck = Some(conncheck(9));
        assert_eq!(
            connection_state(&r, NOW).1,
            message,
            "the message stays put"
        );
        r.conncheck = Some(conncheck(0));
        assert_eq!(
            connection_state(&r, NOW).0,
            S::Connected,
            "a reply recovers"
        );
    }

    #[test]
    fn status_carries_the_conncheck_reading() {
        let mut r = report();
        r.latency_us = Some(800);
        r.conncheck = Some(conncheck(2));
        let device = device(r, 0);
        let status = status_response(&device, NOW);
        let peer = &status.peers[0];
        assert_eq!(peer.latency_us, 800);
        let conncheck = peer.conncheck.as_ref().expect("conncheck on");
        assert_eq!(conncheck.consecutive_losses, 2);
        assert_eq!(conncheck.interval_ms, 2000);
        assert_eq!(conncheck.last_reply_unix_ms, (NOW - 10_000) as i64);
    }

    #[test]
    fn uapi_view_reports_local_views() {
        let mut r = report();
        r.config.routes = vec![
            kubetun_gateway_core::state::RouteConfig::remapped(
                "10.70.0.0/16".parse().expect("cidr"),
                "10.201.0.0/16".parse().expect("cidr"),
            ),
            kubetun_gateway_core::state::RouteConfig::remapped(
                "10.203.0.0/16".parse().expect("cidr"),
                "10.203.0.0/16".parse().expect("cidr"),
            ),
        ];
        r.last_handshake_ms = 1_500;
        let device = device(r, 1);
        let view = uapi_view(&device);
        assert_eq!(view.listen_port, Some(51820));
        assert_eq!(
            view.peers[0].allowed_ips,
            vec![
                "10.201.0.0/16".parse().expect("cidr"),
                "10.203.0.0/16".parse().expect("cidr")
            ]
        );
        assert_eq!(
            view.peers[0].last_handshake,
            Some(Duration::from_millis(1_500))
        );
    }

    #[test]
    fn uapi_get_shows_no_prefix_on_two_peers_when_real_cidrs_overlap() {
        // Rome and Milan both have 10.70.0.0/16; this gateway sees them as two views.
        let peer = |key: u8, view: &str| {
            let mut r = report();
            r.config = PeerConfig::new(Key::from_bytes([key; 32]));
            r.config.routes = vec![kubetun_gateway_core::state::RouteConfig::remapped(
                "10.70.0.0/16".parse().expect("cidr"),
                view.parse().expect("cidr"),
            )];
            r
        };
        let mut device = device(peer(3, "10.201.0.0/16"), 2);
        device.peers.push(peer(4, "10.202.0.0/16"));
        let text = crate::uapi::format_get(&uapi_view(&device));
        let allowed: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("allowed_ip="))
            .collect();
        assert_eq!(allowed, ["10.201.0.0/16", "10.202.0.0/16"], "{text}");
    }
}
