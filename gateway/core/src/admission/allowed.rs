//! The allowed sets of one snapshot: which cluster a view address belongs to (a
//! longest-prefix match), and per exported cluster the endpoints it may open. Built off the
//! fast path with the rest of the snapshot; immutable once built.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;

use super::reasons::ClusterDrops;
use crate::remap::PrefixIndex;
use crate::state::{DesiredState, Isolation};

/// The value of a view that belongs to a remote cluster without an admission (a peer's
/// route the admissions do not name): remote, open.
pub(crate) const UNADMITTED: u32 = u32::MAX;

/// One remote cluster with an admission.
#[derive(Debug)]
pub struct Cluster {
    /// Its id.
    pub name: String,
    pub isolation: Isolation,
    /// How many endpoints it may open (exported).
    pub endpoints: usize,
    /// Its refusals.
    pub drops: Arc<ClusterDrops>,
}

/// The admissions of a snapshot (see the module documentation).
#[derive(Debug, Default)]
pub struct Admissions {
    pub(crate) clusters: Vec<Cluster>,
    /// Every remote view (admissions' and peers' routes) → cluster index or [`UNADMITTED`].
    pub(crate) views: PrefixIndex,
    pub(crate) endpoints: EndpointSet,
    /// Some cluster has an admission: outbound flows are recorded.
    pub(crate) any: bool,
    /// Some cluster is exported: inbound packets are judged.
    pub(crate) exported: bool,
}

impl Admissions {
    /// The admissions of `state`, keeping the counters of the clusters `previous` knew.
    pub fn build(state: &DesiredState, previous: &Admissions) -> Self {
        let kept: HashMap<&str, &Arc<ClusterDrops>> = previous
            .clusters
            .iter()
            .map(|cluster| (cluster.name.as_str(), &cluster.drops))
            .collect();
        let route_views = state
            .peers
            .iter()
            .flat_map(|peer| peer.routes.iter().map(|route| (route.view, UNADMITTED)));
        // Admissions' views last: they win over an identical route view.
        let admitted = state
            .admissions
            .iter()
            .enumerate()
            .flat_map(|(index, a)| a.views.iter().map(move |view| (*view, index as u32)));
        let views = PrefixIndex::new(route_views.chain(admitted));
        let mut entries = Vec::new();
        let mut clusters = Vec::with_capacity(state.admissions.len());
        for (index, admission) in state.admissions.iter().enumerate() {
            let exported = admission.isolation == Isolation::Exported;
            let mut count = 0;
            if exported {
                let mut endpoints = admission.endpoints.clone();
                endpoints.sort_unstable();
                endpoints.dedup();
                count = endpoints.len();
                for endpoint in endpoints {
                    let (v6, address) = split(endpoint.address);
                    let port = EntryKey::new(
                        index,
                        v6,
                        address,
                        endpoint.protocol.number(),
                        endpoint.port,
                    );
                    entries.push(port);
                    // The address alone (ICMP echo).
                    entries.push(EntryKey::new(index, v6, address, 0, 0));
                }
            }
            let drops = kept
                .get(admission.cluster.as_str())
                .map_or_else(Default::default, |d| Arc::clone(d));
            clusters.push(Cluster {
                name: admission.cluster.clone(),
                isolation: admission.isolation,
                endpoints: count,
                drops,
            });
        }
        Self {
            any: !clusters.is_empty(),
            exported: clusters.iter().any(|c| c.isolation == Isolation::Exported),
            clusters,
            views,
            endpoints: EndpointSet::new(entries),
        }
    }

    /// The clusters with an admission, in the order of the state.
    pub fn clusters(&self) -> &[Cluster] {
        &self.clusters
    }

    /// The cluster index of a remote address (`UNADMITTED` for a remote address of no
    /// admission), `None` for an address that is no remote view.
    #[inline]
    pub(crate) fn cluster_of(&self, v6: bool, address: u128) -> Option<u32> {
        if v6 {
            self.views.lookup_v6(address)
        } else {
            self.views.lookup_v4(address as u32)
        }
    }

    /// Whether the cluster at `index` may open (`address`, `protocol`, `port`); with
    /// `protocol` and `port` 0, whether `address` is one of its endpoints' addresses.
    #[inline]
    pub(crate) fn admits(
        &self,
        index: u32,
        v6: bool,
        address: u128,
        protocol: u8,
        port: u16,
    ) -> bool {
        self.endpoints
            .contains(&EntryKey::new(index as usize, v6, address, protocol, port))
    }
}

/// An address as the data path holds it: the family and the bits (IPv4 in the low 32).
fn split(address: IpAddr) -> (bool, u128) {
    match address {
        IpAddr::V4(v4) => (false, u128::from(u32::from(v4))),
        IpAddr::V6(v6) => (true, u128::from(v6)),
    }
}

/// One endpoint of one cluster, or one of its addresses (protocol and port 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct EntryKey {
    address: u128,
    /// Cluster index, family, protocol and port packed: `cluster << 32 | v6 << 24 |
    /// protocol << 16 | port`, with 1 << 63 marking a used slot.
    rest: u64,
}

const USED: u64 = 1 << 63;

impl EntryKey {
    #[inline]
    fn new(cluster: usize, v6: bool, address: u128, protocol: u8, port: u16) -> Self {
        let rest = USED
            | (cluster as u64) << 32
            | u64::from(v6) << 24
            | u64::from(protocol) << 16
            | u64::from(port);
        Self { address, rest }
    }
}

/// An open-addressed set of [`EntryKey`]s with linear probing, at most half full, hashed
/// with a random key drawn per build.
#[derive(Debug, Default)]
pub(crate) struct EndpointSet {
    slots: Box<[EntryKey]>,
    hasher: RandomState,
}

impl EndpointSet {
    fn new(entries: Vec<EntryKey>) -> Self {
        let hasher = RandomState::new();
        if entries.is_empty() {
            return Self {
                slots: Box::default(),
                hasher,
            };
        }
        let size = (entries.len() * 2).next_power_of_two();
        let mut slots = vec![EntryKey::default(); size].into_boxed_slice();
        for entry in entries {
            let mut at = hasher.hash_one(entry) as usize & (size - 1);
            while slots[at].rest != 0 && slots[at] != entry {
                at = (at + 1) & (size - 1);
            }
            slots[at] = entry;
        }
        Self { slots, hasher }
    }

    #[inline]
    fn contains(&self, key: &EntryKey) -> bool {
        if self.slots.is_empty() {
            return false;
        }
        let mask = self.slots.len() - 1;
        let mut at = self.hasher.hash_one(key) as usize & mask;
        loop {
            let slot = &self.slots[at];
            if slot == key {
                return true;
            }
            if slot.rest == 0 {
                return false;
            }
            at = (at + 1) & mask;
        }
    }
}
