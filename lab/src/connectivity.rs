//! Checks shared by bring-up and gateway moves: the probes of one link and the bounded wait
//! until every gateway reports its peers Connected.

use std::time::{Duration, Instant};

use kubetun_controller::gateway_api::ConnectionState;
use kubetun_controller::plumbing::gateway_client::GatewayClient;

use crate::checks::{self, Check};
use crate::state::ClusterState;

/// How long every link may take to report Connected after the checks.
const CONNECTED_TIMEOUT: Duration = Duration::from_secs(10);

/// The links of `clusters` whose gateway does not report the peer Connected.
pub(super) fn not_connected<'a>(
    runtime: &tokio::runtime::Runtime,
    clusters: impl Iterator<Item = (&'a ClusterState, &'a GatewayClient)>,
) -> Vec<String> {
    let mut pending = Vec::new();
    for (cluster, client) in clusters {
        match runtime.block_on(client.status()) {
            Ok(status) => {
                for te in &cluster.tunnel_endpoints {
                    let peer = status.peers.iter().find(|p| p.name == te.tunnel_peer());
                    if peer.is_none_or(|p| p.state() != ConnectionState::Connected) {
                        pending.push(format!("{} -> {}", cluster.name, te.cluster.name));
                    }
                }
            }
            Err(e) => pending.push(format!("{} ({e})", cluster.name)),
        }
    }
    pending
}

/// The checks of one link: first pods and external endpoints both ways, and with a
/// multi-node side pods behind non-gateway nodes both ways (ping and TCP).
pub(super) fn link_checks(phase: &str, a: &ClusterState, b: &ClusterState) -> Vec<Check> {
    let mut checks = checks::ping_both_ways(phase, a, b);
    checks.extend(checks::ping_off_gateway(phase, a, b));
    checks.extend(checks::tcp_off_gateway(phase, a, b));
    checks
}

/// Polls `not_connected` (the links not reporting Connected) until it is empty or
/// [`CONNECTED_TIMEOUT`] passes.
pub(super) fn connected_check(
    phase: &str,
    description: String,
    mut not_connected: impl FnMut() -> Vec<String>,
) -> Check {
    let deadline = Instant::now() + CONNECTED_TIMEOUT;
    let mut pending = not_connected();
    while !pending.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        pending = not_connected();
    }
    let outcome = if pending.is_empty() {
        Ok("all links connected".to_owned())
    } else {
        Err(format!("not connected: {}", pending.join(", ")))
    };
    Check::new(phase, description, outcome)
}
