//! The UAPI `get` view of a device report: what `wg show` prints.

use std::time::Duration;

use super::{InterfaceView, PeerView};
use crate::device::DeviceReport;

/// Builds the UAPI `get` view of the device.
pub fn uapi_view(report: &DeviceReport) -> InterfaceView {
    InterfaceView {
        private_key: report.private_key,
        listen_port: report.listen_port,
        fwmark: report.fwmark,
        peers: report
            .peers
            .iter()
            .map(|peer| PeerView {
                public_key: peer.config.public_key,
                preshared_key: peer.config.preshared_key,
                endpoint: peer.endpoint,
                last_handshake: (peer.last_handshake_ms != 0)
                    .then(|| Duration::from_millis(peer.last_handshake_ms)),
                rx_bytes: peer.rx_bytes,
                tx_bytes: peer.tx_bytes,
                persistent_keepalive: peer.config.persistent_keepalive,
                // The local views: unique per device (the remap table is keyed by them), and
                // what this side routes to the peer. Real prefixes may repeat across peers
                // (Rome and Milan both 10.70.0.0/16), which `wg show` would print as two
                // peers owning one prefix. Without remapping, view == real.
                // A fallback route's view is its primary peer's.
                allowed_ips: peer
                    .config
                    .routes
                    .iter()
                    .filter(|r| !r.fallback)
                    .map(|r| r.view)
                    .collect(),
            })
            .collect(),
    }
}
