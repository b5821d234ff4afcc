//! Wiring of the Network controller and the NetworkId GC controller to their watches.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt};
use kubetun_crds::{Network, NetworkId};

use super::peering::{NetworkKey, referencing};
use super::reconciler::{Context, NetworkIdContext, reconcile_network, reconcile_network_id};
use super::{NetworkError, NetworkOptions};
use crate::plumbing::runtime::{self, ApiHealth};

/// `reportingController` of the Events the Network controller publishes.
const EVENT_REPORTER: &str = "kubetun-network";

/// Runs the Network controller and the NetworkId GC until a termination signal.
///
/// `namespace` restricts Networks (and the GC's judgement of claims) to one namespace;
/// NetworkIds are cluster-scoped and always watched cluster-wide. Fails early when the range
/// is invalid or the CRDs are not installed.
pub async fn run(
    client: Client,
    namespace: Option<String>,
    opts: NetworkOptions,
    health: ApiHealth,
) -> Result<(), NetworkError> {
    let health = &health;
    let networks: Api<Network> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let network_ids: Api<NetworkId> = Api::all(client.clone());
    let probe = ListParams::default().limit(1);
    if let Err(source) = networks.list(&probe).await {
        return Err(NetworkError::CrdNotInstalled {
            kind: "Network",
            source: Box::new(source),
        });
    }
    if let Err(source) = network_ids.list(&probe).await {
        return Err(NetworkError::CrdNotInstalled {
            kind: "NetworkID",
            source: Box::new(source),
        });
    }

    let id_controller = runtime::controller(
        network_ids.clone(),
        watcher::Config::default(),
        health,
        "NetworkID",
    );
    let id_store = id_controller.store();
    let network_controller = runtime::controller(
        networks.clone(),
        watcher::Config::default(),
        health,
        "Network",
    );
    let network_store = network_controller.store();

    let recorder = Recorder::new(client.clone(), Reporter::from(EVENT_REPORTER));
    let network_ctx = Arc::new(
        Context::new(client.clone(), &opts, health.clone())?
            .with_id_cache(id_store.clone())
            .with_recorder(recorder.clone()),
    );
    let id_ctx = Arc::new(
        NetworkIdContext::new(client, health.clone())
            .with_namespace(namespace)
            .with_recorder(recorder),
    );

    let network_loop = network_controller
        // A change of N concerns every Network that references N.
        .watches_stream(
            runtime::watch(
                networks.clone(),
                watcher::Config::default(),
                health,
                "Network",
            )
            .touched_objects(),
            move |changed: Network| referrers(&network_store, &changed),
        )
        // A claim that appears or disappears concerns its claimer.
        .watches_stream(
            runtime::watch(
                network_ids.clone(),
                watcher::Config::default(),
                health,
                "NetworkID",
            )
            .touched_objects(),
            |nid: NetworkId| {
                let claim = &nid.spec.claim_ref;
                Some(ObjectRef::<Network>::new(&claim.name).within(&claim.namespace))
            },
        )
        .graceful_shutdown_on(crate::plumbing::shutdown::signal())
        .run(reconcile_network, runtime::error_policy, network_ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "network controller event");
            }
        });

    let gc_loop = id_controller
        // A deleted or recreated Network concerns the claims made under its UID.
        .watches_stream(
            runtime::watch(networks, watcher::Config::default(), health, "Network")
                .touched_objects(),
            move |changed: Network| claims_of(&id_store, &changed),
        )
        .graceful_shutdown_on(crate::plumbing::shutdown::signal())
        .run(reconcile_network_id, runtime::error_policy, id_ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "network ID controller event");
            }
        });

    tracing::info!(
        min = opts.min_vni,
        max = opts.max_vni,
        "network controllers started"
    );
    futures::join!(network_loop, gc_loop);
    Ok(())
}

fn referrers(store: &Store<Network>, changed: &Network) -> Vec<ObjectRef<Network>> {
    let state = store.state();
    referencing(state.iter().map(AsRef::as_ref), &NetworkKey::of(changed))
        .into_iter()
        .map(|key| ObjectRef::new(&key.name).within(&key.namespace))
        .collect()
}

fn claims_of(store: &Store<NetworkId>, changed: &Network) -> Vec<ObjectRef<NetworkId>> {
    let Some(uid) = changed.uid() else {
        return Vec::new();
    };
    let key = NetworkKey::of(changed);
    store
        .state()
        .iter()
        .filter(|nid| {
            let claim = &nid.spec.claim_ref;
            claim.uid == uid || (claim.namespace == key.namespace && claim.name == key.name)
        })
        .map(|nid| ObjectRef::new(&nid.name_any()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store;
    use kubetun_crds::{ClaimRef, GROUP, NetworkIdSpec, NetworkPeering, NetworkRef, NetworkSpec};

    fn network(ns: &str, name: &str, uid: &str, peers: &[&str]) -> Network {
        let mut n = Network::new(
            name,
            NetworkSpec {
                peerings: peers
                    .iter()
                    .map(|p| NetworkPeering {
                        name: format!("to-{p}"),
                        network_ref: NetworkRef {
                            name: (*p).to_owned(),
                            namespace: None,
                        },
                        prefixes: Vec::new(),
                    })
                    .collect(),
                ..NetworkSpec::default()
            },
        );
        n.metadata.namespace = Some(ns.to_owned());
        n.metadata.uid = Some(uid.to_owned());
        n
    }

    fn claim(id: &str, name: &str, uid: &str) -> NetworkId {
        NetworkId::new(
            id,
            NetworkIdSpec {
                claim_ref: ClaimRef {
                    group: GROUP.to_owned(),
                    resource: "networks".to_owned(),
                    namespace: "ns".to_owned(),
                    name: name.to_owned(),
                    uid: uid.to_owned(),
                },
            },
        )
    }

    #[test]
    fn a_change_requeues_the_networks_referencing_it_even_after_it_dropped_them() {
        let (reader, mut writer) = store::<Network>();
        for n in [
            network("ns", "a", "1", &["b"]),
            network("ns", "c", "3", &["b", "a"]),
            network("ns", "d", "4", &[]),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(n));
        }
        // b no longer references anyone; a and c still reference b and must re-evaluate.
        let changed = network("ns", "b", "2", &[]);
        let refs = referrers(&reader, &changed);
        assert_eq!(
            refs,
            vec![
                ObjectRef::new("a").within("ns"),
                ObjectRef::new("c").within("ns")
            ]
        );
        // A deleted Network maps the same way.
        writer.apply_watcher_event(&watcher::Event::Delete(network("ns", "c", "3", &[])));
        assert_eq!(
            referrers(&reader, &changed),
            vec![ObjectRef::new("a").within("ns")]
        );
    }

    #[test]
    fn a_network_change_requeues_its_claims_by_uid_and_by_name() {
        let (reader, mut writer) = store::<NetworkId>();
        for nid in [
            claim("200", "a", "uid-a"),
            claim("201", "a", "uid-old-a"),
            claim("202", "b", "uid-b"),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(nid));
        }
        let mut refs = claims_of(&reader, &network("ns", "a", "uid-a", &[]));
        refs.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(refs, vec![ObjectRef::new("200"), ObjectRef::new("201")]);
    }
}
