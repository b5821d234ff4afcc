//! Building the next snapshot from the current one and a validated desired state: which
//! peers keep their runtime (sessions, learned endpoint, counters), which ids and receiver
//! indices the others get, and the remap table. No IO.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use rand_core::RngCore;

use super::ApplyError;
use super::peer::Peer;
use super::snapshot::{Identity, IndexMap, PeerSlot, Snapshot};
use crate::key::Key;
use crate::remap::{self, PeerId, RemapTable, TableBuilder};
use crate::state::DesiredState;

/// The snapshot implementing `next`, given the endpoints resolved for its peers (same order)
/// Fails if the remap table rejects the routes.
pub fn next_snapshot(
    current: &Snapshot,
    next: &DesiredState,
    resolved: &[Option<SocketAddr>],
) -> Result<Snapshot, ApplyError> {
    let plan = plan_peers(current, next)?;
    let table = remap_table(next, &plan.ids, &current.remap)?;
    let identity = next_identity(current, next);

    let mut used_indices: HashSet<u32> = plan
        .reused
        .iter()
        .flatten()
        .map(|peer| peer.index)
        .collect();
    let slot_count = plan
        .ids
        .iter()
        .map(|id| *id as usize + 1)
        .max()
        .unwrap_or(0);
    let mut peers: Vec<Option<PeerSlot>> = Vec::with_capacity(slot_count);
    peers.resize_with(slot_count, || None);
    let mut by_index = IndexMap::default();
    let mut by_key = HashMap::with_capacity(next.peers.len());
    for (i, config) in next.peers.iter().enumerate() {
        let id = plan.ids[i];
        let endpoint = resolved[i];
        let previous = current
            .by_key
            .get(&config.public_key)
            .and_then(|id| current.peer(*id));
        let runtime = match (&plan.reused[i], &identity) {
            (Some(peer), _) => {
                let endpoint_changed =
                    previous.map(|p| &p.config.endpoint) != Some(&config.endpoint);
                if endpoint_changed {
                    peer.set_endpoint(endpoint);
                }
                Some(Arc::clone(peer))
            }
            (None, Some(identity)) => {
                let index = allocate_index(&mut used_indices);
                let tunn = identity.tunn(config, index);
                Some(Arc::new(Peer::new(index, tunn, endpoint)))
            }
            (None, None) => None,
        };
        if let Some(runtime) = &runtime {
            by_index.insert(runtime.index, id);
        }
        by_key.insert(config.public_key, id);
        peers[id as usize] = Some(PeerSlot {
            config: config.clone(),
            runtime,
        });
    }

    let snapshot = Snapshot {
        generation: current.generation + 1,
        state: next.clone(),
        identity,
        peers,
        by_index,
        by_key,
        remap: table,
    };
    Ok(snapshot)
}

/// The identity of `next`: the current one when neither key changed; otherwise new pairs that
/// keep the rate limiters of the keys they share with the current identity.
fn next_identity(current: &Snapshot, next: &DesiredState) -> Option<Arc<Identity>> {
    let (now, then) = (&current.state.interface, &next.interface);
    let key = then.private_key.as_ref()?;
    if now.private_key == then.private_key && now.previous_private_key == then.previous_private_key
    {
        return current.identity.clone();
    }
    let known: Vec<&Identity> = current
        .identity
        .iter()
        .flat_map(|identity| identity.pairs())
        .collect();
    let mut identity = Identity::reusing(key, &known);
    identity.previous = then
        .previous_private_key
        .as_ref()
        .map(|previous| Arc::new(Identity::reusing(previous, &known)));
    Some(Arc::new(identity))
}

/// The remap table of `state` with peer ids `ids` (same order as `state.peers`), laid out like
/// `previous` where it can be (see [`TableBuilder::build_after`]).
fn remap_table(
    state: &DesiredState,
    ids: &[PeerId],
    previous: &RemapTable,
) -> Result<RemapTable, ApplyError> {
    let mut builder = TableBuilder::new();
    builder.local_prefixes(&state.interface.local_prefixes);
    builder.mss_clamp_mtu(Some(state.interface.mtu));
    for (peer, id) in state.peers.iter().zip(ids) {
        let routes: Vec<remap::Route> = peer
            .routes
            .iter()
            .map(|r| remap::Route {
                real: r.real,
                view: r.view,
            })
            .collect();
        builder.add_peer(*id, &routes, peer.acl.as_deref())?;
    }

    Ok(builder.build_after(previous)?)
}

/// Which peers keep their runtime and which id each peer gets.
struct PeerPlan {
    ids: Vec<PeerId>,
    reused: Vec<Option<Arc<Peer>>>,
}

/// A peer keeps its `Tunn` (sessions, learned endpoint, counters) when its own public and
/// preshared keys are unchanged and the key its `Tunn` uses is still one of the interface's
/// (the private key, or during a rotation the previous one); it also keeps its id. New peers
/// take the lowest free ids.
fn plan_peers(current: &Snapshot, next: &DesiredState) -> Result<PeerPlan, ApplyError> {
    let usable_keys: Vec<Key> = [
        next.interface.private_key,
        next.interface.previous_private_key,
    ]
    .into_iter()
    .flatten()
    .map(|key| key.public_key())
    .collect();
    let mut ids: Vec<Option<PeerId>> = Vec::with_capacity(next.peers.len());
    let mut reused = Vec::with_capacity(next.peers.len());
    let mut taken = HashSet::new();
    for config in &next.peers {
        let previous = current
            .by_key
            .get(&config.public_key)
            .and_then(|id| Some((*id, current.peer(*id)?)));
        match previous {
            Some((id, slot))
                if slot.config.preshared_key == config.preshared_key
                    && slot
                        .runtime
                        .as_ref()
                        .is_some_and(|peer| usable_keys.contains(&peer.tunn.lock().1)) =>
            {
                ids.push(Some(id));
                taken.insert(id);
                reused.push(slot.runtime.clone());
            }
            _ => {
                ids.push(None);
                reused.push(None);
            }
        }
    }
    let mut next_free: PeerId = 0;
    let ids = ids
        .into_iter()
        .map(|id| match id {
            Some(id) => Ok(id),
            None => {
                while taken.contains(&next_free) {
                    next_free += 1;
                }
                if next_free > remap::MAX_PEER_ID {
                    return Err(ApplyError::TooManyPeers);
                }
                taken.insert(next_free);
                Ok(next_free)
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(PeerPlan { ids, reused })
}

/// A random, unused, non-zero 24-bit receiver index.
fn allocate_index(used: &mut HashSet<u32>) -> u32 {
    loop {
        let index = rand_core::OsRng.next_u32() & 0x00ff_ffff;
        if index != 0 && used.insert(index) {
            return index;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;
    use crate::state::{Endpoint, PeerConfig, RouteConfig};

    fn key(n: u8) -> Key {
        Key::from_bytes([n; 32])
    }

    fn net(text: &str) -> ipnet::IpNet {
        text.parse().expect("cidr")
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("socket address")
    }

    fn empty() -> Snapshot {
        Snapshot {
            generation: 0,
            state: DesiredState::default(),
            identity: None,
            peers: Vec::new(),
            by_index: IndexMap::default(),
            by_key: HashMap::new(),
            remap: RemapTable::empty(),
        }
    }

    fn peer(n: u8, real: &str, view: &str, endpoint: Option<&str>) -> PeerConfig {
        let mut peer = PeerConfig::new(key(n));
        peer.name = format!("peer{n}");
        peer.routes = vec![RouteConfig {
            real: net(real),
            view: net(view),
        }];
        peer.endpoint = endpoint.map(|e| Endpoint::Addr(addr(e)));
        peer
    }

    fn state(peers: Vec<PeerConfig>) -> DesiredState {
        let mut state = DesiredState::default();
        state.interface.private_key = Some(key(1));
        state.peers = peers;
        state.validate().expect("valid test state");
        state
    }

    fn apply(current: &Snapshot, next: &DesiredState) -> Snapshot {
        let resolved: Vec<Option<SocketAddr>> = next
            .peers
            .iter()
            .map(|p| match &p.endpoint {
                Some(Endpoint::Addr(a)) => Some(*a),
                _ => None,
            })
            .collect();
        next_snapshot(current, next, &resolved).expect("apply")
    }

    fn runtime(snapshot: &Snapshot, n: u8) -> (PeerId, Arc<Peer>) {
        let id = snapshot.by_key[&key(n)];
        let slot = snapshot.peer(id).expect("slot");
        (id, Arc::clone(slot.runtime.as_ref().expect("runtime")))
    }

    #[test]
    fn a_new_peers_tunnel_is_made_on_first_use_not_in_the_apply() {
        let s1 = apply(
            &empty(),
            &state(vec![peer(2, "10.70.0.0/16", "10.201.0.0/16", None)]),
        );
        let (_, session) = runtime(&s1, 2);
        let mut cell = session.tunn.lock();
        assert!(cell.0.made().is_none(), "no Diffie-Hellman in the Apply");
        assert!(cell.0.made_mut().is_none());
        assert_eq!(
            cell.0.get().stats().0,
            None,
            "made on use, without a session"
        );
        assert!(cell.0.made().is_some(), "and kept");
        assert_eq!(cell.1, key(1).public_key(), "tagged with our public key");
    }

    #[test]
    fn stripping_a_retired_snapshot_releases_its_sessions_and_keeps_its_table() {
        let mut s1 = apply(
            &empty(),
            &state(vec![peer(2, "10.70.0.0/16", "10.201.0.0/16", None)]),
        );
        let (_, session) = runtime(&s1, 2);
        assert_eq!(Arc::strong_count(&session), 2);
        let taken = s1.keep_only_remap();
        drop(taken);
        assert_eq!(
            Arc::strong_count(&session),
            1,
            "the snapshot let go of the session"
        );
        assert!(s1.peers.is_empty() && s1.by_key.is_empty() && s1.by_index.is_empty());
        assert!(s1.identity.is_none() && s1.state.interface.private_key.is_none());
        assert_eq!(s1.remap.len(), 1, "the table stays for its memory");
    }

    #[test]
    fn unchanged_keys_keep_session_id_and_roamed_endpoint() {
        let s1 = apply(
            &empty(),
            &state(vec![
                peer(2, "10.70.0.0/16", "10.201.0.0/16", Some("192.0.2.2:51820")),
                peer(3, "10.70.0.0/16", "10.202.0.0/16", None),
            ]),
        );
        assert_eq!(s1.generation, 1);
        assert_eq!(s1.remap.len(), 2);
        let (id2, peer2) = runtime(&s1, 2);
        peer2.roam(addr("198.51.100.7:4000"));

        // New routes, keepalive and a new peer: peer 2 keeps everything it learned.
        let mut changed = peer(2, "10.70.0.0/16", "10.205.0.0/16", Some("192.0.2.2:51820"));
        changed.persistent_keepalive = 25;
        let s2 = apply(
            &s1,
            &state(vec![
                changed.clone(),
                peer(4, "10.80.0.0/16", "10.80.0.0/16", None),
            ]),
        );
        let (id2_after, peer2_after) = runtime(&s2, 2);
        assert!(Arc::ptr_eq(&peer2, &peer2_after), "session must survive");
        assert_eq!(id2, id2_after);
        assert_eq!(peer2_after.endpoint(), Some(addr("198.51.100.7:4000")));
        assert_eq!(s2.by_index[&peer2.index], id2);
        // Peer 3 left; peer 4 reuses the lowest free id.
        let (id4, peer4) = runtime(&s2, 4);
        assert_eq!(id4, 1);
        assert_ne!(peer4.index, peer2.index);
        assert_eq!(s2.by_index.len(), 2);
        assert!(!s2.by_key.contains_key(&key(3)));

        // A new desired endpoint replaces the roamed one.
        changed.endpoint = Some(Endpoint::Addr(addr("192.0.2.9:51820")));
        let s3 = apply(&s2, &state(vec![changed.clone()]));
        let (_, peer2_s3) = runtime(&s3, 2);
        assert!(Arc::ptr_eq(&peer2, &peer2_s3));
        assert_eq!(peer2_s3.endpoint(), Some(addr("192.0.2.9:51820")));

        // A new preshared key means a new session.
        changed.preshared_key = Some(key(9));
        let s4 = apply(&s3, &state(vec![changed.clone()]));
        assert!(!Arc::ptr_eq(&peer2, &runtime(&s4, 2).1));

        // A new interface key resets every peer.
        let mut rekeyed = state(vec![changed]);
        rekeyed.interface.private_key = Some(key(7));
        let s5 = apply(&s4, &rekeyed);
        assert!(!Arc::ptr_eq(&runtime(&s4, 2).1, &runtime(&s5, 2).1));
        assert!(s5.identity.is_some());
    }

    #[test]
    fn a_rotation_keeps_sessions_until_each_peer_moves_to_the_new_key() {
        let s1 = apply(
            &empty(),
            &state(vec![
                peer(2, "10.70.0.0/16", "10.201.0.0/16", None),
                peer(3, "10.71.0.0/16", "10.202.0.0/16", None),
            ]),
        );
        let (_, peer2) = runtime(&s1, 2);
        let (_, peer3) = runtime(&s1, 3);

        // The new key with the old one as previous: every tunnel stays, still on the old key;
        // a peer added meanwhile starts on the new key.
        let mut rotating = state(vec![
            peer(2, "10.70.0.0/16", "10.201.0.0/16", None),
            peer(3, "10.71.0.0/16", "10.202.0.0/16", None),
            peer(4, "10.72.0.0/16", "10.203.0.0/16", None),
        ]);
        rotating.interface.private_key = Some(key(7));
        rotating.interface.previous_private_key = Some(key(1));
        let s2 = apply(&s1, &rotating);
        assert!(Arc::ptr_eq(&peer2, &runtime(&s2, 2).1));
        assert!(Arc::ptr_eq(&peer3, &runtime(&s2, 3).1));
        assert_eq!(peer2.tunn.lock().1, key(1).public_key());
        assert_eq!(runtime(&s2, 4).1.tunn.lock().1, key(7).public_key());
        let identity = s2.identity.as_ref().expect("identity");
        assert_eq!(identity.public_key(), key(7).public_key());
        let previous = identity.previous.as_ref().expect("previous pair");
        let old = s1.identity.as_ref().expect("old identity");
        assert!(
            Arc::ptr_eq(&previous.rate_limiter, &old.rate_limiter),
            "the old key's gate keeps its cookie secret and count"
        );

        // Peer 2 completed a handshake with the new key (what the handshake worker records).
        peer2.tunn.lock().1 = key(7).public_key();
        // The rotation ends: peer 2 keeps its tunnel, peer 3 (still on the old key) starts over.
        let mut rotated = rotating.clone();
        rotated.interface.previous_private_key = None;
        let s3 = apply(&s2, &rotated);
        assert!(Arc::ptr_eq(&peer2, &runtime(&s3, 2).1));
        assert!(!Arc::ptr_eq(&peer3, &runtime(&s3, 3).1));
        assert_eq!(runtime(&s3, 3).1.tunn.lock().1, key(7).public_key());
        let identity = s3.identity.as_ref().expect("identity");
        assert!(identity.previous.is_none());
        assert!(Arc::ptr_eq(
            &identity.rate_limiter,
            &s2.identity.as_ref().expect("identity").rate_limiter
        ));
    }

    #[test]
    fn without_a_private_key_peers_have_no_runtime() {
        let mut keyless = state(vec![peer(2, "10.70.0.0/16", "10.70.0.0/16", None)]);
        keyless.interface.private_key = None;
        let snapshot = apply(&empty(), &keyless);
        assert!(snapshot.identity.is_none());
        assert!(snapshot.by_index.is_empty());
        assert!(snapshot.peer(0).expect("slot").runtime.is_none());
        // Adding the key later creates the runtime.
        let keyed = apply(&snapshot, &state(keyless.peers.clone()));
        assert!(runtime(&keyed, 2).1.index != 0);
    }

    #[test]
    fn remap_conflicts_are_rejected() {
        let mut conflicting = peer(2, "10.70.0.0/16", "10.201.0.0/16", None);
        conflicting.routes.push(RouteConfig {
            real: net("10.70.0.0/16"),
            view: net("10.202.0.0/16"),
        });
        let next = state(vec![conflicting]);
        let error = next_snapshot(&empty(), &next, &[None]).expect_err("conflict");
        assert!(matches!(error, ApplyError::Remap(_)), "{error}");
        assert!(error.to_string().contains("two views"), "{error}");
    }

    #[test]
    fn receiver_indices_are_24_bit_and_unique() {
        let mut used = HashSet::new();
        for _ in 0..10_000 {
            let index = allocate_index(&mut used);
            assert!(index != 0 && index < (1 << 24));
        }
        assert_eq!(used.len(), 10_000);
    }
}
