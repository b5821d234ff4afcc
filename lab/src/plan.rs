//! Each lab cluster's control plane, run with the controller's own code: the cluster's
//! [`ClusterInfo`] and gateway key, its [`Ipam`], the NetworkConfigs exchanged with peers
//! (processed by the receiver with [`process_network_config`]), the TunnelEndpoints built by
//! [`tunnel_endpoint_spec_with`] and the gateway state from [`desired_state_with`].
//!
//! What a Kubernetes API server would store (NetworkConfigs and their status) is kept in
//! memory; everything computed from it is the controller's.

use std::collections::BTreeMap;

use ipnet::{IpNet, Ipv4Net};
use kubetun_controller::connector::transit::path_through;
use kubetun_controller::gateway_api::DesiredState;
use kubetun_controller::ipam::{Ipam, IpamConfig, rfc1918_pools};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::planner::admission::Answers;
use kubetun_controller::planner::{
    ExportEndpoints, GatewaySettings, PlanError, check_addressing, desired_state_with,
    local_config_name, process_network_config, remote_config_name, transit_annotation,
    tunnel_endpoint_spec_with,
};
use kubetun_controller::plumbing::cluster_info::ClusterInfo;
use kubetun_crds::{
    ClusterRef, Endpoint, Isolation, NetworkConfig, NetworkConfigStatus, TunnelEndpointSpec,
};

use crate::table::{ClusterTable, PeerMapping};
use crate::topology::{ClusterSpec, GATEWAY_PORT, Topology};

/// Persistent keepalive the lab asks for, so links stay up while the lab is idle.
pub const KEEPALIVE_SECONDS: u32 = 10;

/// One cluster's control-plane state.
#[derive(Debug)]
struct ClusterControl {
    info: ClusterInfo,
    key: GatewayKey,
    ipam: Ipam,
    settings: GatewaySettings,
    /// `to-<peer>`: what this cluster sent, with the status the peer wrote.
    sent: BTreeMap<String, NetworkConfig>,
    /// `from-<peer>`: what peers sent, with the status this cluster wrote.
    received: BTreeMap<String, NetworkConfig>,
    /// Peer IDs in the order they were linked.
    peers: Vec<String>,
}

/// The control planes of all clusters of a topology.
#[derive(Debug)]
pub struct ControlPlanes {
    clusters: Vec<ClusterControl>,
}

impl ControlPlanes {
    /// Fresh control planes: a new key per gateway, IPAM with the RFC 1918 pools and the
    /// cluster's own ranges and the underlay reserved.
    pub fn new(topology: &Topology) -> Self {
        let clusters = topology
            .clusters
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                let key = GatewayKey::generate();
                let info = cluster_info(spec, &key, topology, index);
                let mut reserved = info.local_ranges();
                reserved.push(IpNet::V4(topology.underlay));
                let ipam = Ipam::new(IpamConfig {
                    pools: rfc1918_pools(),
                    reserved,
                });
                let settings = gateway_settings(
                    &key,
                    topology.mtu,
                    local_prefixes(spec.pod_cidr, spec.external_cidr),
                );
                ClusterControl {
                    info,
                    key,
                    ipam,
                    settings,
                    sent: BTreeMap::new(),
                    received: BTreeMap::new(),
                    peers: Vec::new(),
                }
            })
            .collect();
        Self { clusters }
    }

    /// The gateway public key of cluster `index` (base64).
    pub fn public_key(&self, index: usize) -> &str {
        self.clusters[index].key.public_base64()
    }

    /// The gateway key of cluster `index` (kept in a 0600 file so a moved gateway reuses it).
    pub fn key(&self, index: usize) -> &GatewayKey {
        &self.clusters[index].key
    }

    /// Links clusters `a` and `b`: each side's NetworkConfig is processed by the other side's
    /// IPAM, as the connector and the NetworkConfig reconciler do.
    pub fn link(&mut self, a: usize, b: usize) -> Result<(), PlanError> {
        self.deliver(a, b)?;
        self.deliver(b, a)?;
        for (local, remote) in [(a, b), (b, a)] {
            let id = self.clusters[remote].info.cluster.id.clone();
            if !self.clusters[local].peers.contains(&id) {
                self.clusters[local].peers.push(id);
            }
        }
        Ok(())
    }

    /// Makes hub `hub` the fallback of the link between leaves `a` and `b` (or, `hub_only`,
    /// its only path), as the hub's operator does for a ShortcutConnection with `transit`
    /// (and `hubOnly`): each leaf's `from-` copy of the other gets the other's CIDRs as the
    /// hub sees them, and the hub's copies of both leaves get a transit grant.
    pub fn add_transit(
        &mut self,
        hub: usize,
        a: usize,
        b: usize,
        hub_only: bool,
    ) -> Result<(), PlanError> {
        let hub_ref = self.clusters[hub].info.cluster.clone();
        for (leaf, other) in [(a, b), (b, a)] {
            let other_id = self.clusters[other].info.cluster.id.clone();
            let at_hub = self.clusters[hub]
                .received
                .get(&other_id)
                .and_then(|nc| nc.status.clone())
                .ok_or_else(|| PlanError::NotProcessed {
                    name: remote_config_name(&other_id),
                    why: "transit needs both leaves linked to the hub",
                })?;
            if let Some(config) = self.clusters[leaf].received.get_mut(&other_id) {
                config.spec.fallback = Some(path_through(&hub_ref, &at_hub));
                config.spec.hub_only = hub_only;
            }
        }
        for leaf in [a, b] {
            let id = self.clusters[leaf].info.cluster.id.clone();
            if let Some(config) = self.clusters[hub].received.get_mut(&id) {
                config
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(transit_annotation("lab"), "true".to_owned());
            }
        }
        Ok(())
    }

    /// `from` creates its NetworkConfig in `to`; `to` processes it and writes the status,
    /// which the connector mirrors back into `from`'s copy.
    fn deliver(&mut self, from: usize, to: usize) -> Result<(), PlanError> {
        let from_id = self.clusters[from].info.cluster.id.clone();
        let to_ref = self.clusters[to].info.cluster.clone();
        let spec = self.clusters[from].info.network_config_for(&to_ref);
        check_addressing(
            &remote_config_name(&from_id),
            &spec,
            &to_ref.id,
            Some(&from_id),
        )?;
        let view = process_network_config(&mut self.clusters[to].ipam, &spec)?;
        let status = NetworkConfigStatus {
            processed: true,
            pod_cidrs: view.pod_cidrs,
            external_cidrs: view.external_cidrs,
            observed_generation: None,
            conditions: Vec::new(),
        };
        let mut sent = NetworkConfig::new(&local_config_name(&to_ref.id), spec.clone());
        sent.status = Some(status.clone());
        let mut received = NetworkConfig::new(&remote_config_name(&from_id), spec);
        received.status = Some(status);
        self.clusters[from].sent.insert(to_ref.id.clone(), sent);
        self.clusters[to].received.insert(from_id, received);
        Ok(())
    }

    /// The TunnelEndpoints of cluster `index`, one per linked peer, in link order.
    pub fn tunnel_endpoints(&self, index: usize) -> Result<Vec<TunnelEndpointSpec>, PlanError> {
        let cluster = &self.clusters[index];
        cluster
            .peers
            .iter()
            .map(|peer| {
                let missing = |name: String| PlanError::NotProcessed {
                    name,
                    why: "the NetworkConfig was never exchanged",
                };
                let local = cluster
                    .sent
                    .get(peer)
                    .ok_or_else(|| missing(local_config_name(peer)))?;
                let remote = cluster
                    .received
                    .get(peer)
                    .ok_or_else(|| missing(remote_config_name(peer)))?;
                tunnel_endpoint_spec_with(local, remote, cluster.settings.isolation)
            })
            .collect()
    }

    /// Sets the isolation of every link of cluster `index` (its cluster default: the lab's
    /// links set none of their own), as `kubetun network connect --isolation` does for one.
    pub fn set_isolation(&mut self, index: usize, isolation: Isolation) {
        self.clusters[index].settings.isolation = isolation;
    }

    /// The gateway state of cluster `index` for `endpoints`, with what it exports and the
    /// linked clusters' answers to its policies.
    pub fn desired_state(
        &self,
        index: usize,
        endpoints: &[TunnelEndpointSpec],
        exports: &[ExportEndpoints],
        answers: &Answers,
    ) -> DesiredState {
        desired_state_with(&self.clusters[index].settings, endpoints, exports, answers)
    }
}

/// What the controller configures every lab gateway with, besides its peers: its key, port,
/// MTU, local prefixes, routes for the views and a persistent keepalive.
pub fn gateway_settings(
    key: &GatewayKey,
    mtu: u32,
    local_prefixes: Vec<String>,
) -> GatewaySettings {
    GatewaySettings {
        private_key: key.private_base64(),
        public_key: key.public_base64().to_owned(),
        listen_port: u32::from(GATEWAY_PORT),
        mtu,
        addresses: Vec::new(),
        local_prefixes,
        manage_routes: true,
        persistent_keepalive: KEEPALIVE_SECONDS,
        // The controller's probing: every 2 s, but every 200 ms for a shortcut the hub backs
        // up, whose death is then found within a second.
        ..GatewaySettings::default()
    }
}

/// The remap table of a cluster from its TunnelEndpoints.
pub fn remap_table(
    topology: &Topology,
    cluster: &ClusterSpec,
    endpoints: &[TunnelEndpointSpec],
) -> ClusterTable {
    ClusterTable {
        cluster: cluster.name.clone(),
        peers: endpoints
            .iter()
            .map(|te| PeerMapping {
                peer: topology
                    .cluster(&te.cluster.id)
                    .map_or_else(|| te.cluster.id.clone(), |c| c.name.clone()),
                pod_cidrs: te.remote_pod_cidrs.clone(),
                external_cidrs: te.remote_external_cidrs.clone(),
            })
            .collect(),
    }
}

fn cluster_info(
    spec: &ClusterSpec,
    key: &GatewayKey,
    topology: &Topology,
    index: usize,
) -> ClusterInfo {
    ClusterInfo {
        cluster: ClusterRef {
            id: spec.id(),
            name: spec.name.clone(),
        },
        pod_cidrs: vec![IpNet::V4(spec.pod_cidr)],
        external_cidrs: spec.external_cidr.map(IpNet::V4).into_iter().collect(),
        service_cidrs: Vec::new(),
        endpoint: Endpoint {
            address: topology.underlay_address(index).to_string(),
            port: GATEWAY_PORT,
        },
        public_key: key.public_base64().to_owned(),
        mtu: topology.mtu,
    }
}

/// The prefixes a cluster's gateway forwards for: its pod and external CIDRs.
pub fn local_prefixes(pod_cidr: Ipv4Net, external_cidr: Option<Ipv4Net>) -> Vec<String> {
    std::iter::once(pod_cidr)
        .chain(external_cidr)
        .map(|cidr: Ipv4Net| cidr.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed_planes() -> (Topology, ControlPlanes) {
        let topology = Topology::seed();
        let planes = ControlPlanes::new(&topology);
        (topology, planes)
    }

    fn views(te: &TunnelEndpointSpec) -> Vec<(String, String)> {
        te.remote_pod_cidrs
            .iter()
            .chain(&te.remote_external_cidrs)
            .map(|m| (m.real.clone(), m.view.clone()))
            .collect()
    }

    #[test]
    fn hub_links_remap_the_overlapping_external_cidrs() {
        let (_, mut planes) = seed_planes();
        planes.link(0, 1).unwrap();
        planes.link(0, 2).unwrap();
        let europe = planes.tunnel_endpoints(0).unwrap();
        assert_eq!(europe.len(), 2);
        assert_eq!(europe[0].cluster.id, "rome");
        let rome_views = views(&europe[0]);
        let milan_views = views(&europe[1]);
        assert_eq!(
            rome_views[0],
            ("10.202.0.0/16".into(), "10.202.0.0/16".into())
        );
        assert_eq!(
            milan_views[0],
            ("10.203.0.0/16".into(), "10.203.0.0/16".into())
        );
        // Both leaves announce 10.70.0.0/16, Europe's own external CIDR: two distinct remaps.
        assert_eq!(rome_views[1].0, "10.70.0.0/16");
        assert_ne!(rome_views[1].1, "10.70.0.0/16");
        assert_ne!(milan_views[1].1, "10.70.0.0/16");
        assert_ne!(rome_views[1].1, milan_views[1].1);
        // What Rome announces to Europe is how Europe sees Rome's pods (and vice versa).
        let rome = planes.tunnel_endpoints(1).unwrap();
        assert_eq!(rome.len(), 1);
        assert_eq!(
            rome[0].local_external_cidrs,
            europe[0].remote_external_cidrs
        );
    }

    #[test]
    fn shortcut_adds_a_second_peer_without_changing_the_first() {
        let (_, mut planes) = seed_planes();
        planes.link(0, 1).unwrap();
        planes.link(0, 2).unwrap();
        let before = planes.tunnel_endpoints(1).unwrap();
        planes.link(1, 2).unwrap();
        let after = planes.tunnel_endpoints(1).unwrap();
        assert_eq!(after.len(), 2);
        assert_eq!(after[0], before[0]);
        assert_eq!(after[1].cluster.id, "milan");
        let state = planes.desired_state(1, &after, &[], &Answers::new());
        assert_eq!(state.peers.len(), 2);
        assert!(state.interface.unwrap().manage_routes);
    }

    #[test]
    fn remap_table_uses_display_names() {
        let (topology, mut planes) = seed_planes();
        planes.link(0, 1).unwrap();
        let endpoints = planes.tunnel_endpoints(0).unwrap();
        let table = remap_table(&topology, &topology.clusters[0], &endpoints);
        assert_eq!(table.cluster, "Europe");
        assert_eq!(table.peers[0].peer, "Rome");
    }
}
