//! What a sync pass observed: each [`Direction`] of the link and the [`LinkState`] holding
//! both, and how a NetworkConfig's status says it was processed or rejected.

use kubetun_crds::{
    CidrMapping, ClusterRef, Condition, ConnectionStatus, NetworkConfig, NetworkConfigStatus,
};

use crate::planner::status_matches_spec;
use crate::plumbing::cluster_info::ClusterInfo;
use crate::plumbing::conditions;

/// How one cluster sees the other and the state of its tunnel towards it.
#[derive(Debug, Clone, PartialEq)]
pub struct Direction {
    /// Role of the viewing cluster.
    pub from_label: String,
    /// The viewing cluster.
    pub from: ClusterRef,
    /// The viewed cluster.
    pub to: ClusterRef,
    /// `from` has mapped `to`'s CIDRs for the current spec.
    pub processed: bool,
    /// `to`'s pod CIDRs as `from` sees them (from the TunnelEndpoint when it is current).
    pub pod_cidrs: Vec<CidrMapping>,
    /// `to`'s external CIDRs as `from` sees them.
    pub external_cidrs: Vec<CidrMapping>,
    /// `from`'s TunnelEndpoint towards `to` exists, matches the current NetworkConfigs and
    /// has a status for its current spec.
    pub tunnel_endpoint: bool,
    /// Connection state of `from`'s TunnelEndpoint.
    pub connection: Option<ConnectionStatus>,
    /// `from`'s `Processed=False` condition, when it refused `to`'s NetworkConfig.
    pub rejection: Option<Condition>,
}

impl Direction {
    /// True when `from`'s tunnel reports Connected.
    pub fn is_connected(&self) -> bool {
        self.connection
            .as_ref()
            .is_some_and(|c| c.status == kubetun_crds::ConnectionState::Connected)
    }

    pub(super) fn describe(&self) -> String {
        if let Some(rejection) = &self.rejection {
            return format!("rejected: {}: {}", rejection.reason, rejection.message);
        }
        if !self.processed {
            return "NetworkConfig not processed".to_owned();
        }
        match &self.connection {
            None if !self.tunnel_endpoint => "no up-to-date TunnelEndpoint yet".to_owned(),
            None => "the gateway has not reported the tunnel yet".to_owned(),
            Some(c) if c.message.is_empty() => c.status.to_string(),
            Some(c) => format!("{}: {}", c.status, c.message),
        }
    }
}

/// The link as observed by one [`Connector::sync`] pass.
///
/// [`Connector::sync`]: super::Connector::sync
#[derive(Debug, Clone, PartialEq)]
pub struct LinkState {
    /// The local cluster's info (overrides applied).
    pub local: ClusterInfo,
    /// The remote cluster's info (overrides applied).
    pub remote: ClusterInfo,
    pub local_to_remote: Direction,
    pub remote_to_local: Direction,
    /// Objects created or changed by the pass.
    pub writes: usize,
}

impl LinkState {
    /// Both clusters have mapped each other's CIDRs.
    pub fn is_processed(&self) -> bool {
        self.local_to_remote.processed && self.remote_to_local.processed
    }

    /// Both tunnels report Connected.
    pub fn is_connected(&self) -> bool {
        self.local_to_remote.is_connected() && self.remote_to_local.is_connected()
    }

    /// Both directions, local first.
    pub fn directions(&self) -> [&Direction; 2] {
        [&self.local_to_remote, &self.remote_to_local]
    }
}

/// The status of a `from-` NetworkConfig when it is processed for its current spec.
pub(super) fn current_processed_status(config: &NetworkConfig) -> Option<NetworkConfigStatus> {
    config
        .status
        .as_ref()
        .filter(|s| s.processed && status_matches_spec(&config.spec, s))
        .cloned()
}

/// The `Processed=False` condition of a NetworkConfig, when it describes the current spec.
pub(super) fn current_rejection(config: &NetworkConfig) -> Option<Condition> {
    let status = config.status.as_ref()?;
    let condition = conditions::find(&status.conditions, kubetun_crds::contract::link::PROCESSED)?;
    let current = match (condition.observed_generation, config.metadata.generation) {
        (Some(observed), Some(generation)) => observed == generation,
        _ => true,
    };
    (condition.status == "False" && current && !status.processed).then(|| condition.clone())
}

/// `real → view` pairs of a direction, remapped ones marked, for progress lines.
pub fn describe_views(direction: &Direction) -> String {
    let pairs: Vec<String> = direction
        .pod_cidrs
        .iter()
        .chain(&direction.external_cidrs)
        .map(|m| {
            if m.is_remapped() {
                format!("{} → {}", m.real, m.view)
            } else {
                m.real.clone()
            }
        })
        .collect();
    format!(
        "{} sees {} as {}",
        direction.from.id,
        direction.to.id,
        pairs.join(", ")
    )
}
