//! Building the next snapshot from the current one and a validated desired state: which
//! peers keep their runtime (sessions, learned endpoint, counters), which ids and receiver
//! indices the others get, and the remap table. No IO.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use rand_core::RngCore;

use super::peer::Peer;
use super::snapshot::{Identity, IndexMap, PeerSlot, Snapshot};
use crate::admission::allowed::Admissions;
use crate::clock::Now;
use crate::key::Key;
use crate::remap::{self, PeerId, RemapTable, TableBuilder};
use crate::state::{DesiredState, PeerConfig, RouteConfig, StateError};
use ipnet::IpNet;

/// The snapshot implementing `next`, given the endpoints resolved for its peers (same order),
/// at `now` (when new key pairs' rate limiters start). Fails if the remap table rejects the
/// routes.
pub fn next_snapshot(
    current: &Snapshot,
    next: &DesiredState,
    resolved: &[Option<SocketAddr>],
    now: Now,
) -> Result<Snapshot, StateError> {
    let plan = plan_peers(current, next)?;
    let fallbacks = Fallbacks::of(next, &plan.reused);
    let table = remap_table(next, &plan.ids, &current.remap, &fallbacks)?;
    let identity = next_identity(current, next, now);

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
    let mut by_endpoint = HashMap::with_capacity(next.peers.len());
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
        if let Some(endpoint) = endpoint {
            by_endpoint.insert(endpoint, id);
        }
        peers[id as usize] = Some(PeerSlot {
            backed_up: fallbacks.backs_up(config),
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
        by_endpoint,
        remap: table,
        admissions: Admissions::build(next, &current.admissions),
    };
    Ok(snapshot)
}

/// The identity of `next`: the current one when neither key changed; otherwise new pairs that
/// keep the rate limiters of the keys they share with the current identity.
fn next_identity(current: &Snapshot, next: &DesiredState, at: Now) -> Option<Arc<Identity>> {
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
    let mut identity = Identity::reusing(key, &known, at);
    identity.previous = then
        .previous_private_key
        .as_ref()
        .map(|previous| Arc::new(Identity::reusing(previous, &known, at)));
    Some(Arc::new(identity))
}

/// Which views have fallback routes, and which of them have moved to theirs because the
/// primary peer is failed over (its [`super::path::PathState`], kept on its runtime).
struct Fallbacks {
    backed_up: HashSet<IpNet>,
    moved: HashSet<IpNet>,
}

impl Fallbacks {
    fn of(state: &DesiredState, runtimes: &[Option<Arc<Peer>>]) -> Self {
        let backed_up: HashSet<IpNet> = state
            .peers
            .iter()
            .flat_map(|p| &p.routes)
            .filter(|r| r.fallback)
            .map(|r| r.view)
            .collect();
        let moved = state
            .peers
            .iter()
            .zip(runtimes)
            .filter(|(_, runtime)| {
                runtime
                    .as_ref()
                    .is_some_and(|p| p.path.lock().failed_over())
            })
            .flat_map(|(peer, _)| &peer.routes)
            .filter(|r| !r.fallback && backed_up.contains(&r.view))
            .map(|r| r.view)
            .collect();
        Self { backed_up, moved }
    }

    /// Whether other peers back up some of `peer`'s views.
    fn backs_up(&self, peer: &PeerConfig) -> bool {
        peer.routes
            .iter()
            .any(|r| !r.fallback && self.backed_up.contains(&r.view))
    }

    /// Whether `route` is in the table now: a primary route unless its view moved, a
    /// fallback route only while it did.
    fn carries(&self, route: &RouteConfig) -> bool {
        route.fallback == self.moved.contains(&route.view)
    }
}

/// The remap table of `state` with peer ids `ids` (same order as `state.peers`), laid out like
/// `previous` where it can be (see [`TableBuilder::build_after`]).
fn remap_table(
    state: &DesiredState,
    ids: &[PeerId],
    previous: &RemapTable,
    fallbacks: &Fallbacks,
) -> Result<RemapTable, StateError> {
    let mut builder = TableBuilder::new();
    builder.local_prefixes(&state.interface.local_prefixes);
    builder.mss_clamp_mtu(Some(state.interface.mtu));
    for (peer, id) in state.peers.iter().zip(ids) {
        let routes: Vec<remap::Route> = peer
            .routes
            .iter()
            .filter(|r| fallbacks.carries(r))
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
fn plan_peers(current: &Snapshot, next: &DesiredState) -> Result<PeerPlan, StateError> {
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
                    return Err(StateError::TooManyPeers);
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
    use crate::remap::Verdict;
    use crate::state::{Endpoint, PeerConfig, RouteConfig};

    /// The time of every apply here.
    const NOW: Now = Now {
        unix_ms: 1_000_000,
        mono_us: 1_000_000_000,
    };

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
            by_endpoint: HashMap::new(),
            remap: RemapTable::empty(),
            admissions: Default::default(),
        }
    }

    fn peer(n: u8, real: &str, view: &str, endpoint: Option<&str>) -> PeerConfig {
        let mut peer = PeerConfig::new(key(n));
        peer.name = format!("peer{n}");
        peer.routes = vec![RouteConfig::remapped(net(real), net(view))];
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
        next_snapshot(current, next, &resolved, NOW).expect("apply")
    }

    fn runtime(snapshot: &Snapshot, n: u8) -> (PeerId, Arc<Peer>) {
        let id = snapshot.by_key[&key(n)];
        let slot = snapshot.peer(id).expect("slot");
        (id, Arc::clone(slot.runtime.as_ref().expect("runtime")))
    }

    fn udp(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let mut out = Vec::new();
        etherparse::PacketBuilder::ipv4(src, dst, 64)
            .udp(40000, 9000)
            .write(&mut out, b"x")
            .expect("serialize");
        out
    }

    fn addresses(packet: &[u8]) -> ([u8; 4], [u8; 4]) {
        let ip = etherparse::Ipv4HeaderSlice::from_slice(packet).expect("IPv4");
        (ip.source(), ip.destination())
    }

    #[test]
    fn a_failed_over_primarys_backed_up_views_go_through_the_fallback_both_ways() {
        // Peer 2 is the shortcut (10.70/16 seen as 10.73/16); peer 3 the hub, which knows
        // the same cluster as 10.72/16 and backs the view up.
        let shortcut = peer(2, "10.70.0.0/16", "10.73.0.0/16", Some("192.0.2.2:51820"));
        let mut hub = peer(3, "10.200.0.0/16", "10.200.0.0/16", Some("192.0.2.3:51820"));
        hub.routes.push(RouteConfig {
            fallback: true,
            ..RouteConfig::remapped(net("10.72.0.0/16"), net("10.73.0.0/16"))
        });
        let mut next = DesiredState::default();
        next.interface.private_key = Some(key(1));
        next.interface.conncheck = Some(Default::default());
        next.peers = vec![shortcut, hub];
        next.validate().expect("valid");
        let direct = apply(&empty(), &next);
        let (shortcut_id, shortcut_peer) = runtime(&direct, 2);
        let (hub_id, _) = runtime(&direct, 3);
        assert!(direct.peer(shortcut_id).expect("slot").backed_up);
        assert!(!direct.peer(hub_id).expect("slot").backed_up);

        let mut packet = udp([10, 10, 0, 5], [10, 73, 2, 2]);
        assert_eq!(
            direct.remap.egress(&mut packet),
            Verdict::Forward(shortcut_id)
        );
        assert_eq!(addresses(&packet).1, [10, 70, 2, 2]);
        let mut via_hub = udp([10, 72, 2, 2], [10, 10, 0, 5]);
        assert_eq!(
            direct.remap.ingress(hub_id, &mut via_hub),
            Verdict::Drop(remap::DropReason::SourceNotAllowed),
            "the fallback is not in use"
        );

        let now = crate::clock::Now {
            unix_ms: 1,
            mono_us: 1,
        };
        assert_eq!(shortcut_peer.path.lock().observe(5, 5, now), Some(true));
        let failed_over = next_snapshot(&direct, &next, &[None, None], NOW).expect("replan");
        assert!(
            Arc::ptr_eq(&runtime(&failed_over, 2).1, &shortcut_peer),
            "same sessions"
        );
        let mut packet = udp([10, 10, 0, 5], [10, 73, 2, 2]);
        assert_eq!(
            failed_over.remap.egress(&mut packet),
            Verdict::Forward(hub_id)
        );
        assert_eq!(
            addresses(&packet).1,
            [10, 72, 2, 2],
            "the hub's view on the wire"
        );
        let mut reply = udp([10, 72, 2, 2], [10, 10, 0, 5]);
        assert_eq!(
            failed_over.remap.ingress(hub_id, &mut reply),
            Verdict::Deliver
        );
        assert_eq!(
            addresses(&reply).0,
            [10, 73, 2, 2],
            "the same view either way"
        );
        let mut own = udp([10, 200, 0, 9], [10, 10, 0, 5]);
        assert_eq!(
            failed_over.remap.ingress(hub_id, &mut own),
            Verdict::Deliver
        );

        // The hold passed without a loss: back to the shortcut.
        let later = crate::clock::Now {
            unix_ms: 5_000,
            mono_us: 1 + super::super::path::RETURN_HOLD_US,
        };
        assert_eq!(shortcut_peer.path.lock().observe(0, 5, now), None);
        assert_eq!(shortcut_peer.path.lock().observe(0, 5, later), Some(false));
        let back = next_snapshot(&failed_over, &next, &[None, None], NOW).expect("replan");
        let mut packet = udp([10, 10, 0, 5], [10, 73, 2, 2]);
        assert_eq!(
            back.remap.egress(&mut packet),
            Verdict::Forward(shortcut_id)
        );
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
            cell.0.get(NOW).stats_at(NOW.instant()).0,
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
        peer2.roam(addr("198.51.100.7:4000").into());

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
        assert_eq!(peer2_after.remote(), Some(addr("198.51.100.7:4000")));
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
        assert_eq!(peer2_s3.remote(), Some(addr("192.0.2.9:51820")));

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
        conflicting.routes.push(RouteConfig::remapped(
            net("10.70.0.0/16"),
            net("10.202.0.0/16"),
        ));
        let next = state(vec![conflicting]);
        let error = next_snapshot(&empty(), &next, &[None], NOW).expect_err("conflict");
        assert!(matches!(error, StateError::Remap(_)), "{error}");
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
