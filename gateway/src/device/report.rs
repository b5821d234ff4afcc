//! The status readings of the device ([`DeviceReport`], one [`PeerReport`] per peer, one
//! [`AdmissionReport`] per admitted cluster, the [`FlowTableReport`]): what
//! the gRPC status, the UAPI `get` and the metrics are made from.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kubetun_gateway_core::snapshot::PeerSlot;

/// A status reading of the device.
#[derive(Debug, Clone)]
pub struct DeviceReport {
    pub interface_name: String,
    /// The version of the active desired state.
    pub version: String,
    /// The active generation.
    pub generation: u64,
    pub private_key: Option<kubetun_gateway_core::key::Key>,
    /// The bound UDP port.
    pub listen_port: Option<u16>,
    /// The socket mark.
    pub fwmark: u32,
    /// Every configured peer.
    pub peers: Vec<PeerReport>,
    /// Drop counters by reason.
    pub drops: Vec<(&'static str, u64)>,
    /// Number of remap rules.
    pub remap_rules: usize,
    /// Host configuration that failed and is being retried (see [`super::ApplyOutcome`]).
    pub host_errors: Vec<String>,
    /// Whether this replica carries traffic (see [`kubetun_gateway_core::role`]).
    pub active: bool,
    /// How long it stays active without a lease renewal; `None` for a gateway alone.
    pub active_remaining: Option<Duration>,
    /// How often it became active under a lease.
    pub promotions: u64,
    /// Per remote cluster with an admission, in the order of the state.
    pub admissions: Vec<AdmissionReport>,
    /// The flow table.
    pub flow_table: FlowTableReport,
}

/// A status reading of one remote cluster's admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionReport {
    pub cluster: String,
    pub isolation: kubetun_gateway_core::state::Isolation,
    /// Endpoints it may open (exported).
    pub endpoints: usize,
    /// Its packets refused, by reason (zeros included).
    pub drops: Vec<(&'static str, u64)>,
    /// Its source policies.
    pub policies: Vec<PolicyReport>,
}

/// One source policy of an exported cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyReport {
    /// `namespace/name`.
    pub name: String,
    /// Sources it selects.
    pub sources: usize,
    /// Packets refused at the endpoints it guards.
    pub drops: u64,
}

/// A status reading of the flow table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowTableReport {
    /// Slots.
    pub capacity: usize,
    /// Slots holding a live flow.
    pub in_use: usize,
    /// New flows that found no free slot.
    pub full: u64,
}

/// A status reading of one peer.
#[derive(Debug, Clone)]
pub struct PeerReport {
    /// Its desired configuration.
    pub config: kubetun_gateway_core::state::PeerConfig,
    /// The endpoint in use.
    pub endpoint: Option<SocketAddr>,
    /// Whether the peer has a session state machine (the interface has a key).
    pub active: bool,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Datagrams received.
    pub rx_packets: u64,
    /// Datagrams sent.
    pub tx_packets: u64,
    /// Completed handshakes.
    pub handshakes: u64,
    /// Unix ms of the last handshake; 0 = never.
    pub last_handshake_ms: u64,
    /// Unix ms since which handshakes go unanswered; 0 = none pending.
    pub handshake_pending_since_ms: u64,
    /// Round-trip time: the smoothed probe RTT when the connectivity check is on for this
    /// peer, else the RTT of the last handshake.
    pub latency_us: Option<u64>,
    /// The connectivity check; `None` when it is off for this peer.
    pub conncheck: Option<ConnCheckReport>,
    /// During a key rotation: the peer's tunnel has not moved to the new key yet (it uses the
    /// previous key, or has completed no handshake with the new one).
    pub previous_key: bool,
    /// Where the views other peers back up for this one go; `None` when none are backed up.
    pub path: Option<kubetun_gateway_core::path::PathState>,
}

/// A status reading of one peer's connectivity check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnCheckReport {
    /// The settings in effect.
    pub config: kubetun_gateway_core::conncheck::ConnCheckConfig,
    /// Losses, RTTs, counters.
    pub reading: kubetun_gateway_core::conncheck::ProberReading,
    /// Unix ms of the last reply; 0 = none yet.
    pub last_reply_unix_ms: u64,
}

impl ConnCheckReport {
    /// True once the last `loss_threshold` probes went unanswered.
    pub fn is_unreachable(&self) -> bool {
        self.reading.consecutive_losses >= self.config.loss_threshold
    }
}

impl PeerReport {
    /// The reading of `slot`'s peer.
    pub(super) fn new(
        slot: &PeerSlot,
        conncheck: Option<kubetun_gateway_core::conncheck::ConnCheckConfig>,
        rotating_to: Option<kubetun_gateway_core::key::Key>,
    ) -> Self {
        let mut report = PeerReport {
            config: slot.config.clone(),
            endpoint: None,
            active: false,
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
        };
        if let Some(peer) = &slot.runtime {
            report.path = slot.backed_up.then(|| *peer.path.lock());
            let stats = &peer.stats;
            report.active = true;
            report.endpoint = peer.remote();
            report.rx_bytes = stats.rx_bytes.load(Ordering::Relaxed);
            report.tx_bytes = stats.tx_bytes.load(Ordering::Relaxed);
            report.rx_packets = stats.rx_packets.load(Ordering::Relaxed);
            report.tx_packets = stats.tx_packets.load(Ordering::Relaxed);
            report.handshakes = stats.handshakes.load(Ordering::Relaxed);
            report.last_handshake_ms = stats.last_handshake_ms.load(Ordering::Relaxed);
            report.handshake_pending_since_ms =
                stats.handshake_pending_since_ms.load(Ordering::Relaxed);
            let (rtt_ms, tunnel_key) = {
                let tunn = peer.tunn.lock();
                let rtt_ms = tunn.0.made().and_then(|t| t.stats().4);
                (rtt_ms, tunn.1)
            };
            report.previous_key =
                rotating_to.is_some_and(|new| new != tunnel_key || !peer.proven_on_its_key());
            report.latency_us = rtt_ms.map(|ms| u64::from(ms) * 1000);
            if let Some(config) = conncheck
                .filter(|_| slot.config.conncheck)
                .map(|c| c.for_peer(slot.backed_up))
            {
                let reading = peer.conncheck.lock().reading();
                // The prober's clock is monotonic; status speaks Unix time.
                let last_reply_unix_ms = reading.last_reply_us.map_or(0, |at| {
                    let age_ms = crate::clock::mono_us().saturating_sub(at) / 1000;
                    crate::clock::unix_ms().saturating_sub(age_ms)
                });
                report.latency_us = reading.srtt_us;
                report.conncheck = Some(ConnCheckReport {
                    config,
                    reading,
                    last_reply_unix_ms,
                });
            }
        }
        report
    }
}
