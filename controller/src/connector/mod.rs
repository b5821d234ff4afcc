//! The connector: links two clusters by exchanging their NetworkConfigs, the same way for the
//! `kubetun network` CLI and the hub's ShortcutConnection operator.
//!
//! For clusters A and B it
//! 1. reads both [`ClusterInfo`]s (endpoint and MTU overrides applied),
//! 2. applies A's `to-<B>` NetworkConfig in A and its copy `from-<A>` in B (and the reverse),
//! 3. once B has processed `from-<A>` (its status maps A's CIDRs), mirrors that status onto
//!    A's `to-<B>`, so A's controller can build the TunnelEndpoint (and the reverse),
//! 4. reads both TunnelEndpoints' connection state.
//!
//! [`Connector::sync`] does one non-blocking pass of these steps (what a reconciler calls);
//! [`Connector::connect`] repeats it until the link is processed (and, with `wait`,
//! connected) or a deadline passes. Every write is preceded by a comparison, so a second run
//! changes nothing. With each cluster's API server address known ([`ClusterHandle::server`]),
//! each side also gets a credential to read the other's exported services
//! (`services_access`). Every object the connector makes carries [`MANAGED_BY_LABEL`] and
//! [`PEER_LABEL`]; [`Connector::disconnect`] and [`forget`] delete exactly those.
//!
//! [`MANAGED_BY_LABEL`]: kubetun_crds::contract::link::MANAGED_BY_LABEL
//! [`PEER_LABEL`]: kubetun_crds::contract::link::PEER_LABEL

mod cluster;
mod delete;
mod error;
mod link;
mod progress;
mod publish;
mod request;
pub mod rotation;
mod services_access;
mod state;
mod status;
mod teardown;
pub mod transit;

pub use cluster::ClusterHandle;
pub use delete::Removed;
pub use error::{ConnectError, error_chain};
pub use progress::{Progress, TracingProgress};
pub use publish::{link_owner, network_config};
pub use request::{Connector, FIELD_MANAGER, LinkOwner, Transit, WaitOptions};
pub use services_access::{credential_name, reader_name, reader_rules};
pub use state::{Direction, LinkState, describe_views};
pub use status::{CidrKind, LinkStatus, link_statuses};
pub use teardown::{forget, reset, wait_removed};

use kubetun_crds::Isolation;

use crate::plumbing::cluster_info::ClusterInfo;

impl Connector {
    /// A connector between `local` and `remote`.
    pub fn new(local: ClusterHandle, remote: ClusterHandle) -> Self {
        Self {
            local,
            remote,
            mtu: None,
            owner: None,
            transit: None,
            isolation: [None, None],
        }
    }

    /// Gives each side a path to the other through a hub both are linked to (see
    /// [`transit::fallback_via`]).
    #[must_use]
    pub fn with_transit(mut self, transit: Option<Transit>) -> Self {
        self.transit = transit;
        self
    }

    /// Marks the link's NetworkConfigs as managed by a hub's ShortcutConnection, so a direct
    /// `disconnect` on a leaf refuses to break it.
    #[must_use]
    pub fn with_owner(mut self, owner: Option<LinkOwner>) -> Self {
        self.owner = owner;
        self
    }

    /// Announces `mtu` on both sides instead of each cluster's own.
    #[must_use]
    pub fn with_mtu(mut self, mtu: Option<u32>) -> Self {
        self.mtu = mtu;
        self
    }

    /// Writes each side's isolation towards the other into the NetworkConfig it announces
    /// itself with (`spec.isolation`); `None` leaves the field out (that side's cluster
    /// default). Changing it on a linked pair updates the NetworkConfigs in place: keys,
    /// endpoints and views stay.
    #[must_use]
    pub fn with_isolation(mut self, local: Option<Isolation>, remote: Option<Isolation>) -> Self {
        self.isolation = [local, remote];
        self
    }

    /// The local handle.
    pub fn local(&self) -> &ClusterHandle {
        &self.local
    }

    /// The remote handle.
    pub fn remote(&self) -> &ClusterHandle {
        &self.remote
    }

    /// Reads both cluster infos (overrides applied) and checks they differ.
    pub async fn load_infos(&self) -> Result<(ClusterInfo, ClusterInfo), ConnectError> {
        let (local, remote) = tokio::join!(self.local.load_info(), self.remote.load_info());
        let (mut local, mut remote) = (local?, remote?);
        if local.cluster.id == remote.cluster.id {
            return Err(ConnectError::SameCluster {
                local: self.local.label.clone(),
                remote: self.remote.label.clone(),
                id: local.cluster.id,
            });
        }
        if let Some(mtu) = self.mtu {
            local.mtu = mtu;
            remote.mtu = mtu;
        }
        Ok((local, remote))
    }
}
