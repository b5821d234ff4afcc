//! Endpoint names: resolved when a state is applied, all at once and each within a timeout
//! (an unresolvable name rejects the state after at most that long, with a log line),
//! and re-resolved periodically for peers without a recent handshake, so a peer whose DNS
//! record moved is found again without a new apply.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::error::ApplyError;
use super::shared::Shared;
use crate::clock::unix_ms;
use kubetun_gateway_core::state::{DesiredState, Endpoint};

/// How often names are re-resolved.
const RERESOLVE_INTERVAL: Duration = Duration::from_secs(30);
/// A peer that handshook more recently than this keeps its (possibly roamed) endpoint.
const HEALTHY_HANDSHAKE_MS: u64 = 135_000;

/// Longest wait for one name. The system resolver retries for 8–10 s on an unreachable DNS
/// server; an apply waits for its names, so a bad one must fail fast.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether any peer's endpoint is a name (only those need a lookup).
pub fn has_names(state: &DesiredState) -> bool {
    state
        .peers
        .iter()
        .any(|peer| matches!(peer.endpoint, Some(Endpoint::Host { .. })))
}

/// The endpoint of every peer of `state` (same order), names resolved to their first address.
/// All names are looked up at once, each bounded by [`RESOLVE_TIMEOUT`], so a state with
/// unresolvable names is rejected after at most that long; each failure is logged.
pub async fn resolve_endpoints(
    state: &DesiredState,
) -> Result<Vec<Option<SocketAddr>>, ApplyError> {
    let lookups = state.peers.iter().map(|peer| async move {
        match &peer.endpoint {
            None => Ok(None),
            Some(Endpoint::Addr(addr)) => Ok(Some(*addr)),
            Some(Endpoint::Host { host, port }) => {
                lookup(host, *port).await.map(Some).map_err(|reason| {
                    tracing::warn!(
                        peer = %peer.display_name(),
                        endpoint = %format!("{host}:{port}"),
                        %reason,
                        "cannot resolve endpoint"
                    );
                    ApplyError::Resolve {
                        peer: peer.display_name(),
                        endpoint: format!("{host}:{port}"),
                        reason,
                    }
                })
            }
        }
    });
    futures::future::join_all(lookups)
        .await
        .into_iter()
        .collect()
}

async fn lookup(host: &str, port: u16) -> Result<SocketAddr, String> {
    let started = std::time::Instant::now();
    let result =
        match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port))).await {
            Err(_) => Err(format!("no answer within {RESOLVE_TIMEOUT:?}")),
            Ok(Err(error)) => Err(error.to_string()),
            Ok(Ok(mut addrs)) => addrs.next().ok_or_else(|| "no addresses".to_owned()),
        };
    tracing::debug!(%host, elapsed = ?started.elapsed(), ok = result.is_ok(), "endpoint name looked up");
    result
}

/// Every [`RERESOLVE_INTERVAL`], re-resolves the names of peers without a healthy session
/// and moves them to the new address if it changed.
pub async fn reresolve_loop(shared: Arc<Shared>) {
    let mut interval = tokio::time::interval(RERESOLVE_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        interval.tick().await;
        let snapshot = shared.snapshot.load_full();
        for (_, slot) in snapshot.slots() {
            let (Some(Endpoint::Host { host, port }), Some(peer)) =
                (&slot.config.endpoint, &slot.runtime)
            else {
                continue;
            };
            let last = peer.stats.last_handshake_ms.load(Ordering::Relaxed);
            if last != 0 && unix_ms().saturating_sub(last) < HEALTHY_HANDSHAKE_MS {
                continue;
            }
            match lookup(host, *port).await {
                Ok(addr) if peer.remote() != Some(addr) => {
                    tracing::info!(
                        peer = %slot.config.display_name(),
                        endpoint = %addr,
                        "endpoint name resolves to a new address"
                    );
                    peer.set_endpoint(Some(addr));
                }
                Ok(_) => {}
                Err(reason) => tracing::debug!(%host, %reason, "re-resolving endpoint failed"),
            }
        }
    }
}
