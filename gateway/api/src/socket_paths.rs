//! Where a gateway's gRPC control socket lives, derived from its interface name. The gateway
//! and the controller both call it, so their defaults cannot drift apart for any interface
//! name.

use std::path::PathBuf;

/// The interface name the deploy manifests use.
pub const DEFAULT_INTERFACE: &str = "kubetun0";

/// Directory of the gRPC control sockets.
pub const GRPC_SOCKET_DIR: &str = "/var/run/kubetun";

/// `/var/run/kubetun/<ifname>.grpc.sock`: where `kubetun-gateway <ifname>` serves gRPC unless
/// told otherwise.
pub fn grpc_socket_path(ifname: &str) -> PathBuf {
    PathBuf::from(GRPC_SOCKET_DIR).join(format!("{ifname}.grpc.sock"))
}
