//! The connectivity check's prober task, an IO shell around the pure [`kubetun_gateway_core::conncheck`]
//! state machine: each round it sends a PING through every probed peer's session whose
//! interval has passed ([`kubetun_gateway_core::timers::send_probe`]); peers whose views others back
//! up have their own, usually shorter, interval. The answers are consumed by the ingress core.

use std::sync::Arc;
use std::time::Duration;

use super::net::Sender;
use super::shared::Shared;
use crate::clock;
use kubetun_gateway_core::PROBE_ROOM;
use kubetun_gateway_core::conncheck::ConnCheckConfig;
use kubetun_gateway_core::timers::send_probe;
use kubetun_gateway_core::transmits::Transmits;

/// How often the prober looks at the configuration between probe rounds, so that a change
/// of interval or an enabled check takes effect promptly.
const CONFIG_POLL: Duration = Duration::from_millis(250);
/// Datagrams one probe may take: the probe, or the handshake initiation sent instead.
const PROBES: usize = 1;

/// Sends a PING to every probed peer with an endpoint once per interval while the interface
/// enables the check. Runs until aborted.
pub async fn prober_loop(shared: Arc<Shared>) {
    let mut out = Transmits::new(PROBES, PROBES * PROBE_ROOM);
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
        if !shared.role.is_active(clock::mono_us()) {
            tokio::time::sleep(CONFIG_POLL).await;
            continue;
        }
        let now = tokio::time::Instant::now();
        if now < next_round {
            tokio::time::sleep_until(next_round.min(now + CONFIG_POLL)).await;
            continue;
        }
        let snapshot = shared.snapshot.load_full();
        // Rounds at the shortest interval a peer has; each peer is probed on its own.
        let round_ms = if snapshot.slots().any(|(_, slot)| slot.backed_up) {
            config.shortest_interval_ms()
        } else {
            config.interval_ms
        };
        let round = Duration::from_millis(u64::from(round_ms));
        let round_us = u64::from(round_ms) * 1000;
        // Keep the cadence; after a stall, start again from now rather than bursting.
        next_round = if now.duration_since(next_round) > round {
            now + round
        } else {
            next_round + round
        };
        let sockets = shared.sockets.load();
        let mut sender = Sender::new(&sockets, &shared.drops);
        for (_, slot) in snapshot.slots() {
            if !slot.config.conncheck {
                continue;
            }
            let Some(peer) = &slot.runtime else { continue };
            let Some(endpoint) = peer.endpoint() else {
                continue;
            };
            let config = config.for_peer(slot.backed_up);
            let now = clock::now();
            let (ping, changes, losses) = {
                let mut prober = peer.conncheck.lock();
                if !prober.is_due(now.mono_us, config.interval_us(), round_us) {
                    continue;
                }
                // A reply since the last round, then the loss this round may count.
                let replied = prober.reachability_change(config.loss_threshold);
                let ping = prober.next_ping(now.mono_us, config.interval_us());
                let lost = prober.reachability_change(config.loss_threshold);
                (ping, [replied, lost], prober.consecutive_losses())
            };
            for unreachable in changes.into_iter().flatten() {
                log_reachability(&slot.config.display_name(), unreachable, config);
            }
            if slot.backed_up
                && let Some(failed_over) =
                    peer.path.lock().observe(losses, config.loss_threshold, now)
            {
                log_switch(&slot.config.display_name(), failed_over);
                shared.replan.notify_one();
            }
            if !send_probe(peer, endpoint, ping, now, &mut out) {
                peer.conncheck.lock().delayed(ping.seq);
            }
            sender.send(&mut out);
        }
    }
}

/// Logs a switch of the views other peers back up for `peer`.
fn log_switch(peer: &str, failed_over: bool) {
    if failed_over {
        tracing::warn!(
            peer,
            "fallback: the peer is unreachable; the views other peers back up for it go through them"
        );
    } else {
        tracing::info!(
            peer,
            hold_s = kubetun_gateway_core::path::RETURN_HOLD_US / 1_000_000,
            "fallback over: the peer answered every probe for the hold; its views return to it"
        );
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
