//! What a link is asked to be: the [`Connector`] between two clusters, who owns the link
//! ([`LinkOwner`]), the hub that carries it ([`Transit`]), how long to wait
//! ([`WaitOptions`]), and the field manager of every write. The ground floor of the
//! connector: its siblings build on it, it names none of them.

use std::time::Duration;

use kubetun_crds::Isolation;

use super::cluster::ClusterHandle;

/// Field manager of the connector's writes.
pub const FIELD_MANAGER: &str = "kubetun-connector";

/// Who manages a link besides whoever runs the connector: the hub's ShortcutConnection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkOwner {
    /// `namespace/name` of the ShortcutConnection on the hub.
    pub shortcut: String,
    /// The hub's cluster id.
    pub hub: String,
}

/// Bounds of [`Connector::connect`] and [`Connector::disconnect`].
#[derive(Debug, Clone, Copy)]
pub struct WaitOptions {
    /// Also wait for both tunnels to connect (connect) or both TunnelEndpoints to go (disconnect).
    pub wait: bool,
    /// Upper bound of the whole operation.
    pub timeout: Duration,
    /// Pause between two observations.
    pub poll_interval: Duration,
}

impl Default for WaitOptions {
    fn default() -> Self {
        Self {
            wait: false,
            timeout: Duration::from_secs(120),
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// Links two clusters. `local` and `remote` are only names: the link is symmetric.
#[derive(Debug, Clone)]
pub struct Connector {
    pub(in crate::connector) local: ClusterHandle,
    pub(in crate::connector) remote: ClusterHandle,
    pub(in crate::connector) mtu: Option<u32>,
    pub(in crate::connector) owner: Option<LinkOwner>,
    pub(in crate::connector) transit: Option<Transit>,
    /// Each side's isolation towards the other, `[local, remote]` (`None`: the field left
    /// out, the side's cluster default).
    pub(in crate::connector) isolation: [Option<Isolation>; 2],
}

/// A hub both clusters of a link are linked to, that carries their traffic.
#[derive(Debug, Clone)]
pub struct Transit {
    /// The hub.
    pub hub: ClusterHandle,
    /// Only through the hub: the clusters make no tunnel to each other. Otherwise the hub
    /// carries their traffic while their own tunnel is down.
    pub hub_only: bool,
    /// Names this link's transit grant on the hub (see [`super::transit::release`]).
    pub grant: String,
}
