//! The connectivity check's IO shell around the pure [`super::conncheck`] core: the prober
//! task that sends a PING through every probed peer's session each interval, and the hook the
//! decrypting task calls on every decrypted packet to consume probes (record PONGs, answer
//! PINGs).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use boringtun::noise::TunnResult;

use super::conncheck::{self, ConnCheckConfig, Probe, ProbeKind};
use super::datapath::{Shared, send_to_peer};
use super::dispatch::is_initiation;
use super::peer::Peer;
use crate::remap::DropReason;

/// How often the prober looks at the configuration between probe rounds, so that a change
/// of interval or an enabled check takes effect promptly.
const CONFIG_POLL: Duration = Duration::from_millis(250);
/// Room for an encrypted probe, or the handshake initiation boringtun sends instead when the
/// peer has no session yet (148 bytes).
const OUT_ROOM: usize = 256;

/// Monotonic microseconds since the first call: the prober's clock.
pub fn mono_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
}

/// Sends a PING to every probed peer with an endpoint once per interval while the interface
/// enables the check. Runs until aborted.
pub async fn prober_loop(shared: Arc<Shared>) {
    let mut out = [0u8; OUT_ROOM];
    let mut active: Option<ConnCheckConfig> = None;
    let mut next_round = tokio::time::Instant::now();
    loop {
        let config = shared.snapshot.load().state.interface.conncheck;
        if config != active {
            // Enabled or retuned: probe right away, then on the new interval.
            active = config;
            next_round = tokio::time::Instant::now();
        }
        let Some(config) = config else {
            tokio::time::sleep(CONFIG_POLL).await;
            continue;
        };
        let now = tokio::time::Instant::now();
        if now < next_round {
            tokio::time::sleep_until(next_round.min(now + CONFIG_POLL)).await;
            continue;
        }
        let interval = Duration::from_millis(u64::from(config.interval_ms));
        // Keep the cadence; after a stall, start again from now rather than bursting.
        next_round = if now.duration_since(next_round) > interval {
            now + interval
        } else {
            next_round + interval
        };
        let snapshot = shared.snapshot.load_full();
        for (_, slot) in snapshot.slots() {
            if !slot.config.conncheck {
                continue;
            }
            let Some(peer) = &slot.runtime else { continue };
            let Some(endpoint) = peer.endpoint() else {
                continue;
            };
            let (ping, changes) = {
                let mut prober = peer.conncheck.lock();
                // A reply since the last round, then the loss this round may count.
                let replied = prober.reachability_change(config.loss_threshold);
                let ping = prober.next_ping(mono_us(), config.interval_us());
                let lost = prober.reachability_change(config.loss_threshold);
                (ping, [replied, lost])
            };
            for unreachable in changes.into_iter().flatten() {
                log_reachability(&slot.config.display_name(), unreachable, config);
            }
            if !send_probe(&shared, peer, endpoint, ping, &mut out).await {
                peer.conncheck.lock().delayed(ping.seq);
            }
        }
    }
}

/// Logs a change of a peer's reachability (once per transition, not per probe).
fn log_reachability(peer: &str, unreachable: bool, config: ConnCheckConfig) {
    if unreachable {
        tracing::warn!(
            peer,
            probes = config.loss_threshold,
            interval_ms = config.interval_ms,
            "peer unreachable: no reply to the last connectivity probes"
        );
    } else {
        tracing::info!(
            peer,
            "peer reachable again: a connectivity probe was answered"
        );
    }
}

/// Encrypts `probe` with the peer's session and sends it; true when it left at once. Without
/// a session boringtun queues it (sent once a handshake completes) and sends a handshake
/// initiation instead, so probes also bring a tunnel up.
async fn send_probe(
    shared: &Shared,
    peer: &Peer,
    endpoint: SocketAddr,
    probe: Probe,
    out: &mut [u8],
) -> bool {
    let packet = probe.encode();
    let result = peer.tunn.lock().0.encapsulate(&packet, out);
    match result {
        TunnResult::WriteToNetwork(datagram) => {
            let direct = !is_initiation(datagram);
            tracing::trace!(index = peer.index, seq = probe.seq, kind = ?probe.kind, direct, "probe sent");
            send_to_peer(shared, peer, datagram, endpoint).await;
            direct
        }
        TunnResult::Err(error) => {
            tracing::trace!(?error, "probe not encrypted");
            false
        }
        _ => false,
    }
}

/// Probes found among one peer's decrypted packets. A PONG is recorded at once; a PING is
/// kept and answered by [`ProbeInbox::answer`] after the `Tunn` lock is released.
#[derive(Debug, Default)]
pub struct ProbeInbox {
    ping: Option<Probe>,
}

impl ProbeInbox {
    /// Consumes `packet` when it is addressed to the probe prefix and returns true; such a
    /// packet never reaches the remap stage or the TUN device. One that is not a well-formed
    /// probe is counted as a bad packet. Every other packet: false, untouched.
    pub fn take(&mut self, shared: &Shared, peer: &Peer, packet: &[u8]) -> bool {
        if !conncheck::is_probe_destination(packet) {
            return false;
        }
        match conncheck::parse(packet) {
            Some(probe) if probe.kind == ProbeKind::Pong => {
                let outcome = peer.conncheck.lock().on_pong(probe.seq, mono_us());
                tracing::trace!(
                    index = peer.index,
                    seq = probe.seq,
                    ?outcome,
                    "probe answered"
                );
            }
            // Only the latest PING of a batch is answered; PINGs come one per interval.
            Some(ping) => self.ping = Some(ping),
            None => shared.drops.remap(DropReason::BadPacket),
        }
        true
    }

    /// Sends the PONG for the PING taken, if any, through the same peer's session.
    pub async fn answer(&mut self, shared: &Shared, peer: &Peer) {
        let Some(ping) = self.ping.take() else { return };
        let Some(endpoint) = peer.endpoint() else {
            return;
        };
        let mut out = [0u8; OUT_ROOM];
        send_probe(shared, peer, endpoint, ping.answer(), &mut out).await;
    }
}
