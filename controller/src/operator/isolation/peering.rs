//! The peering handshake between Networks, as pure functions over Network objects.
//!
//! A peering listed in `spec.peerings` is Ready only when the referenced Network lists this
//! Network back and both sides hold an ID; everything else is reported as Pending (or Error
//! for a peering that can never become Ready) instead of being left out, so users see why.
//! [`referencing`] is the reverse lookup the watch mapping needs: a change of N concerns every
//! Network that references N (including one whose reference N just removed), not N's own
//! targets. [`acl_for_cluster`] turns Ready peerings into the prefixes a gateway may accept
//! from a remote cluster, failing closed.

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::fmt;

use ipnet::IpNet;
use kube::ResourceExt;
use kubetun_crds::{Network, NetworkPeering, NetworkPeeringStatus, NetworkRef, PeeringState};

/// Namespace and name of a Network.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NetworkKey {
    /// Namespace of the Network.
    pub namespace: String,
    /// Name of the Network.
    pub name: String,
}

impl NetworkKey {
    /// Builds a key.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of a stored Network (an object without a namespace is in "default").
    pub fn of(network: &Network) -> Self {
        Self::new(
            network.namespace().unwrap_or_else(|| "default".to_owned()),
            network.name_any(),
        )
    }

    /// The Network a reference points to; an omitted namespace is the referrer's.
    pub fn target(referrer_namespace: &str, reference: &NetworkRef) -> Self {
        Self::new(
            reference
                .namespace
                .as_deref()
                .filter(|ns| !ns.is_empty())
                .unwrap_or(referrer_namespace),
            reference.name.clone(),
        )
    }
}

impl fmt::Display for NetworkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a peering is not Ready, as shown in `status.peerings[].message`.
pub mod message {
    /// The peer exists but has no peering pointing at this Network.
    pub const NOT_REFERENCED: &str = "peer does not reference us";
    /// This Network has no ID yet.
    pub const SELF_PENDING: &str = "waiting for this network's ID";
    /// The peer has no ID yet.
    pub const PEER_PENDING: &str = "peer has no ID yet";
    /// The peer is being deleted.
    pub const PEER_DELETING: &str = "peer is being deleted";
    /// The peering points at its own Network.
    pub const SELF_PEERING: &str = "a network cannot peer with itself";
}

/// What reading a referenced Network found.
#[derive(Debug, Clone, Copy)]
pub enum Peer<'a> {
    /// The Network exists.
    Found(&'a Network),
    /// No such Network.
    Missing,
    /// It may exist but cannot be read (e.g. no permission in its namespace); the reason.
    Unreadable(&'a str),
}

impl<'a> From<Option<&'a Network>> for Peer<'a> {
    fn from(found: Option<&'a Network>) -> Self {
        found.map_or(Self::Missing, Self::Found)
    }
}

/// The peerings of `network` as they should appear in its status, sorted by name.
///
/// `self_available` says whether `network` holds an ID (the caller may just have allocated
/// it); `lookup` reads a peer. A missing or unreadable peer yields a Pending entry and the
/// remaining peerings are still evaluated.
pub fn peering_statuses<'a>(
    network: &Network,
    self_available: bool,
    lookup: impl Fn(&NetworkKey) -> Peer<'a>,
) -> Vec<NetworkPeeringStatus> {
    let own_key = NetworkKey::of(network);
    let own_uid = network.uid();
    let mut seen_targets: Vec<(&NetworkKey, &str)> = Vec::new();
    let targets: Vec<(NetworkKey, &NetworkPeering)> = network
        .spec
        .peerings
        .iter()
        .map(|p| (NetworkKey::target(&own_key.namespace, &p.network_ref), p))
        .collect();

    let mut statuses: Vec<NetworkPeeringStatus> = Vec::with_capacity(targets.len());
    for (target, peering) in &targets {
        let status = if *target == own_key {
            error(peering, message::SELF_PEERING.to_owned())
        } else if let Some((_, first)) = seen_targets.iter().find(|(t, _)| *t == target) {
            error(
                peering,
                format!("peering {first} already references network {target}"),
            )
        } else {
            seen_targets.push((target, &peering.name));
            evaluate(
                &own_key,
                own_uid.as_deref(),
                self_available,
                peering,
                target,
                lookup(target),
            )
        };
        statuses.push(status);
    }
    statuses.sort_by(|a, b| a.name.cmp(&b.name));
    statuses
}

fn evaluate(
    own_key: &NetworkKey,
    own_uid: Option<&str>,
    self_available: bool,
    peering: &NetworkPeering,
    target: &NetworkKey,
    peer: Peer<'_>,
) -> NetworkPeeringStatus {
    let peer = match peer {
        Peer::Found(peer) => peer,
        Peer::Missing => return pending(peering, format!("peer network {target} not found")),
        Peer::Unreadable(reason) => {
            return pending(
                peering,
                format!("cannot read peer network {target}: {reason}"),
            );
        }
    };
    if peer.metadata.deletion_timestamp.is_some() {
        return pending(peering, message::PEER_DELETING.to_owned());
    }
    let peer_namespace = NetworkKey::of(peer).namespace;
    // The peer's entry pointing back at us; a peer naming our UID in its status for a
    // different object would be stale, so only the spec reference counts.
    let Some(back) = peer
        .spec
        .peerings
        .iter()
        .find(|p| NetworkKey::target(&peer_namespace, &p.network_ref) == *own_key)
    else {
        return pending(peering, message::NOT_REFERENCED.to_owned());
    };
    if !self_available {
        return pending(peering, message::SELF_PENDING.to_owned());
    }
    if peer.status.as_ref().and_then(|s| s.id.as_ref()).is_none() {
        return pending(peering, message::PEER_PENDING.to_owned());
    }
    if own_uid.is_none() {
        return pending(peering, message::SELF_PENDING.to_owned());
    }
    match exposed_prefixes(peer, back) {
        Ok(prefixes) => NetworkPeeringStatus {
            name: peering.name.clone(),
            state: PeeringState::Ready,
            message: String::new(),
            prefixes: prefixes.iter().map(ToString::to_string).collect(),
            peer_uid: peer.metadata.uid.clone(),
        },
        Err(reason) => error(peering, reason),
    }
}

/// The prefixes `peer` exposes through its peering `back`: the peering's own list, or all of
/// the peer's prefixes when that list is empty. Every exposed prefix must lie inside one of the
/// peer's prefixes, so a peering cannot widen what the peer owns.
fn exposed_prefixes(peer: &Network, back: &NetworkPeering) -> Result<BTreeSet<IpNet>, String> {
    let owned = parse_all(&peer.spec.prefixes)
        .map_err(|bad| format!("peer has an invalid prefix {bad:?}"))?;
    if back.prefixes.is_empty() {
        return Ok(owned);
    }
    let exposed = parse_all(&back.prefixes)
        .map_err(|bad| format!("peer exposes an invalid prefix {bad:?}"))?;
    if let Some(outside) = exposed
        .iter()
        .find(|e| !owned.iter().any(|o| o.contains(*e)))
    {
        return Err(format!(
            "peer exposes {outside}, which is outside its prefixes"
        ));
    }
    Ok(exposed)
}

fn parse_all(prefixes: &[String]) -> Result<BTreeSet<IpNet>, &str> {
    prefixes
        .iter()
        .map(|p| {
            p.parse::<IpNet>()
                .map(|n| n.trunc())
                .map_err(|_| p.as_str())
        })
        .collect()
}

fn pending(peering: &NetworkPeering, message: String) -> NetworkPeeringStatus {
    NetworkPeeringStatus {
        name: peering.name.clone(),
        state: PeeringState::Pending,
        message,
        prefixes: Vec::new(),
        peer_uid: None,
    }
}

fn error(peering: &NetworkPeering, message: String) -> NetworkPeeringStatus {
    NetworkPeeringStatus {
        name: peering.name.clone(),
        state: PeeringState::Error,
        message,
        prefixes: Vec::new(),
        peer_uid: None,
    }
}

/// Every Network among `networks` whose `spec.peerings` reference `key`, sorted.
///
/// This is what must be reconciled when `key` changes or disappears.
pub fn referencing<'a>(
    networks: impl IntoIterator<Item = &'a Network>,
    key: &NetworkKey,
) -> Vec<NetworkKey> {
    let mut found: Vec<NetworkKey> = networks
        .into_iter()
        .filter_map(|n| {
            let own = NetworkKey::of(n);
            let references = n
                .spec
                .peerings
                .iter()
                .any(|p| NetworkKey::target(&own.namespace, &p.network_ref) == *key);
            (references && own != *key).then_some(own)
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The remote (real) prefixes a gateway may accept from `cluster_id`.
///
/// The remote cluster's networks are the Networks whose `spec.clusterId` is `cluster_id`;
/// their allowed prefixes are those recorded on Ready peerings of other Networks with them
/// (matched by the peer UID, so a recreated remote Network does not inherit a stale peering).
/// `None` when no Network mentions the cluster (no isolation configured); `Some(vec![])` when
/// one does but nothing is Ready (fail closed). The result is sorted and deduplicated.
pub fn acl_for_cluster<N: Borrow<Network>>(networks: &[N], cluster_id: &str) -> Option<Vec<IpNet>> {
    let networks = || networks.iter().map(Borrow::<Network>::borrow);
    let remote_uids: BTreeSet<String> = networks()
        .filter(|n| n.spec.cluster_id.as_deref() == Some(cluster_id))
        .map(|n| n.uid().unwrap_or_default())
        .collect();
    if remote_uids.is_empty() {
        return None;
    }
    let allowed: BTreeSet<IpNet> = networks()
        .filter(|n| n.spec.cluster_id.as_deref() != Some(cluster_id))
        .filter_map(|n| n.status.as_ref())
        .flat_map(|s| &s.peerings)
        .filter(|p| p.state == PeeringState::Ready)
        .filter(|p| {
            p.peer_uid
                .as_ref()
                .is_some_and(|uid| !uid.is_empty() && remote_uids.contains(uid))
        })
        .flat_map(|p| &p.prefixes)
        .filter_map(|p| p.parse::<IpNet>().ok().map(|n| n.trunc()))
        .collect();
    Some(allowed.into_iter().collect())
}

#[cfg(test)]
mod tests;
