//! What a diagnosis expects to find: the route agent's DaemonSet, how old a handshake may be.

/// A handshake older than this means the session is gone: WireGuard re-handshakes every two
/// minutes while packets flow, and the controller keeps a persistent keepalive.
pub const STALE_HANDSHAKE_SECS: i64 = 180;

/// The route agent's DaemonSet (`deploy/agent/`).
pub const AGENT_DAEMONSET: &str = "kubetun-route-agent";
