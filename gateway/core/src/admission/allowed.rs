//! The allowed sets of one snapshot: which cluster a view address belongs to (a
//! longest-prefix match), and per exported cluster the endpoints it may open. Built off the
//! fast path with the rest of the snapshot; immutable once built.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::reasons::ClusterDrops;
use crate::remap::PrefixIndex;
use crate::state::{AdmissionConfig, AdmittedEndpoint, DesiredState, Isolation};

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
    /// Its policies, in the order of the state.
    pub policies: Vec<Policy>,
}

/// One source policy of an exported cluster.
#[derive(Debug)]
pub struct Policy {
    /// `namespace/name`.
    pub name: String,
    /// How many sources it selects.
    pub sources: usize,
    /// Packets refused at an endpoint this policy is the first (by name) to guard; kept
    /// across applies while the cluster has the policy.
    pub drops: Arc<AtomicU64>,
}

/// A group of sources: the union of the sources of the policies naming an endpoint (or, for
/// an address's ICMP echo, naming any endpoint at that address).
#[derive(Debug)]
pub(crate) struct Group {
    /// The cluster's policy whose counter a refusal at this group increments.
    pub(crate) policy: u32,
}

/// The admissions of a snapshot (see the module documentation).
#[derive(Debug, Default)]
pub struct Admissions {
    pub(crate) clusters: Vec<Cluster>,
    /// Every remote view (admissions' and peers' routes) → cluster index or [`UNADMITTED`].
    pub(crate) views: PrefixIndex,
    /// (cluster, endpoint) → [`OPEN_TO_ALL`] or the index of its [`Group`].
    pub(crate) endpoints: EntryMap,
    pub(crate) groups: Vec<Group>,
    /// (group, source address) for every source of every group.
    pub(crate) sources: EntryMap,
    /// Some cluster has an admission: outbound flows are recorded.
    pub(crate) any: bool,
    /// Some cluster is exported: inbound packets are judged.
    pub(crate) exported: bool,
}

impl Admissions {
    /// The admissions of `state`, keeping the counters of the clusters `previous` knew.
    pub fn build(state: &DesiredState, previous: &Admissions) -> Self {
        let kept: HashMap<&str, &Cluster> = previous
            .clusters
            .iter()
            .map(|cluster| (cluster.name.as_str(), cluster))
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
        let mut builder = Builder::default();
        let mut clusters = Vec::with_capacity(state.admissions.len());
        for (index, admission) in state.admissions.iter().enumerate() {
            let exported = admission.isolation == Isolation::Exported;
            let previous = kept.get(admission.cluster.as_str());
            let count = if exported {
                builder.add(index, admission)
            } else {
                0
            };
            let drops = previous.map_or_else(Default::default, |c| Arc::clone(&c.drops));
            let policies = admission
                .policies
                .iter()
                .map(|policy| Policy {
                    name: policy.name.clone(),
                    sources: policy.sources.len(),
                    drops: previous
                        .and_then(|c| c.policies.iter().find(|p| p.name == policy.name))
                        .map_or_else(Default::default, |p| Arc::clone(&p.drops)),
                })
                .collect();
            clusters.push(Cluster {
                name: admission.cluster.clone(),
                isolation: admission.isolation,
                endpoints: count,
                drops,
                policies,
            });
        }
        Self {
            any: !clusters.is_empty(),
            exported: clusters.iter().any(|c| c.isolation == Isolation::Exported),
            clusters,
            views,
            endpoints: EntryMap::new(builder.endpoints),
            groups: builder.groups,
            sources: EntryMap::new(builder.sources),
        }
    }

    /// The clusters with an admission, in the order of the state.
    pub fn clusters(&self) -> &[Cluster] {
        &self.clusters
    }

    /// Entries of the endpoint set, groups, entries of the source set.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.endpoints.len, self.groups.len(), self.sources.len)
    }

    /// Bytes the two sets and the groups take (their slots, allocated once per build).
    pub fn memory(&self) -> usize {
        self.endpoints.bytes() + self.sources.bytes() + std::mem::size_of_val(&self.groups[..])
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

    /// Whether `source` of the cluster at `index` may open (`address`, `protocol`,
    /// `port`); with `protocol` and `port` 0, whether `address` is one of the endpoints'
    /// addresses that `source` may open.
    #[inline]
    pub(crate) fn admits(&self, index: u32, t: Endpoint) -> Verdict {
        let key = EntryKey::new(index as usize, t.v6, t.address, t.protocol, t.port);
        match self.endpoints.get(&key) {
            None => Verdict::NotExported,
            Some(OPEN_TO_ALL) => Verdict::Admitted,
            Some(group) => {
                if self
                    .sources
                    .contains(&EntryKey::new(group as usize, t.v6, t.source, 0, 0))
                {
                    Verdict::Admitted
                } else {
                    Verdict::NotSelected(group)
                }
            }
        }
    }

    /// Counts a refusal at `group` on the policy it names.
    #[inline]
    pub(crate) fn count_policy_drop(&self, cluster: u32, group: u32) {
        let policy = self.groups[group as usize].policy as usize;
        if let Some(policy) = self.clusters[cluster as usize].policies.get(policy) {
            policy.drops.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What [`Admissions::admits`] is asked: an endpoint (or address) of ours and the remote
/// source that opens it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Endpoint {
    pub(crate) v6: bool,
    pub(crate) address: u128,
    pub(crate) protocol: u8,
    pub(crate) port: u16,
    pub(crate) source: u128,
}

/// The answer of [`Admissions::admits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Admitted,
    /// Not an endpoint (or address) exported to the cluster.
    NotExported,
    /// An endpoint whose policies do not select the source (the group that guards it).
    NotSelected(u32),
}

/// The value of an endpoint no policy names.
const OPEN_TO_ALL: u32 = u32::MAX;

/// The entries of the exported clusters, built one admission at a time.
#[derive(Default)]
struct Builder {
    endpoints: Vec<(EntryKey, u32)>,
    groups: Vec<Group>,
    sources: Vec<(EntryKey, u32)>,
    /// Sorted policy indexes of one cluster → group, so that endpoints guarded by the same
    /// policies share one copy of their sources.
    by_policies: HashMap<Vec<u32>, u32>,
}

impl Builder {
    /// Adds the endpoints of exported admission `index` and the groups of its policies;
    /// returns how many endpoints it has.
    fn add(&mut self, index: usize, admission: &AdmissionConfig) -> usize {
        self.by_policies.clear();
        // Which policies (sorted by name, so the first names the counter) guard each
        // endpoint and each endpoint's address; an address with an endpoint no policy
        // guards answers every source's echo.
        let mut order: Vec<u32> = (0..admission.policies.len() as u32).collect();
        order.sort_by(|a, b| {
            admission.policies[*a as usize]
                .name
                .cmp(&admission.policies[*b as usize].name)
        });
        let mut guards: BTreeMap<AdmittedEndpoint, Vec<u32>> = admission
            .endpoints
            .iter()
            .map(|endpoint| (*endpoint, Vec::new()))
            .collect();
        for policy in &order {
            for endpoint in &admission.policies[*policy as usize].endpoints {
                if let Some(list) = guards.get_mut(endpoint)
                    && list.last() != Some(policy)
                {
                    list.push(*policy);
                }
            }
        }
        let mut addresses: BTreeMap<IpAddr, Option<Vec<u32>>> = BTreeMap::new();
        for (endpoint, policies) in &guards {
            let entry = addresses
                .entry(endpoint.address)
                .or_insert_with(|| Some(Vec::new()));
            match (entry.as_mut(), policies.is_empty()) {
                (Some(_), true) => *entry = None,
                (Some(union), false) => union.extend(policies),
                (None, _) => {}
            }
        }
        for (endpoint, policies) in &guards {
            let (v6, address) = split(endpoint.address);
            let key = EntryKey::new(
                index,
                v6,
                address,
                endpoint.protocol.number(),
                endpoint.port,
            );
            let value = self.group(admission, policies.clone());
            self.endpoints.push((key, value));
        }
        for (address, policies) in addresses {
            let (v6, bits) = split(address);
            let value = match policies {
                None => OPEN_TO_ALL,
                Some(mut policies) => {
                    policies.sort_by(|a, b| {
                        admission.policies[*a as usize]
                            .name
                            .cmp(&admission.policies[*b as usize].name)
                    });
                    policies.dedup();
                    self.group(admission, policies)
                }
            };
            self.endpoints
                .push((EntryKey::new(index, v6, bits, 0, 0), value));
        }
        guards.len()
    }

    /// The group of `policies` (sorted by name), made on first use; [`OPEN_TO_ALL`] for none.
    fn group(&mut self, admission: &AdmissionConfig, policies: Vec<u32>) -> u32 {
        let Some(first) = policies.first().copied() else {
            return OPEN_TO_ALL;
        };
        if let Some(group) = self.by_policies.get(&policies) {
            return *group;
        }
        let group = self.groups.len() as u32;
        self.groups.push(Group { policy: first });
        let mut sources: Vec<IpAddr> = policies
            .iter()
            .flat_map(|p| admission.policies[*p as usize].sources.iter().copied())
            .collect();
        sources.sort_unstable();
        sources.dedup();
        for source in sources {
            let (v6, bits) = split(source);
            self.sources
                .push((EntryKey::new(group as usize, v6, bits, 0, 0), 0));
        }
        self.by_policies.insert(policies, group);
        group
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

/// An open-addressed map from [`EntryKey`] to a `u32`, with linear probing, at most half
/// full, hashed with a random key drawn per build.
#[derive(Debug, Default)]
pub(crate) struct EntryMap {
    slots: Box<[(EntryKey, u32)]>,
    hasher: RandomState,
    /// Entries held.
    len: usize,
}

impl EntryMap {
    /// The map of `entries`; of two entries with the same key the first stays.
    fn new(entries: Vec<(EntryKey, u32)>) -> Self {
        let hasher = RandomState::new();
        if entries.is_empty() {
            return Self {
                slots: Box::default(),
                hasher,
                len: 0,
            };
        }
        let size = (entries.len() * 2).next_power_of_two();
        let mut slots = vec![(EntryKey::default(), 0); size].into_boxed_slice();
        let mut len = 0;
        for (key, value) in entries {
            let mut at = hasher.hash_one(key) as usize & (size - 1);
            while slots[at].0.rest != 0 && slots[at].0 != key {
                at = (at + 1) & (size - 1);
            }
            if slots[at].0.rest == 0 {
                slots[at] = (key, value);
                len += 1;
            }
        }
        Self { slots, hasher, len }
    }

    fn bytes(&self) -> usize {
        std::mem::size_of_val(&self.slots[..])
    }

    #[inline]
    fn get(&self, key: &EntryKey) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut at = self.hasher.hash_one(key) as usize & mask;
        loop {
            let (slot, value) = &self.slots[at];
            if slot == key {
                return Some(*value);
            }
            if slot.rest == 0 {
                return None;
            }
            at = (at + 1) & mask;
        }
    }

    #[inline]
    fn contains(&self, key: &EntryKey) -> bool {
        self.get(key).is_some()
    }
}
