//! Wiring of the Network controller and the NetworkId GC controller to their watches.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kubetun_crds::{Network, NetworkId};

use super::peering::{NetworkKey, referencing};
use super::reconciler::{
    Context, network_error_policy, network_id_error_policy, reconcile_network, reconcile_network_id,
};
use super::{Error, NetworkOptions};

/// Runs the Network controller and the NetworkId GC until a termination signal.
///
/// `namespace` restricts Networks (and the GC's judgement of claims) to one namespace;
/// NetworkIds are cluster-scoped and always watched cluster-wide. Fails early when the range
/// is invalid or the CRDs are not installed.
pub async fn run(
    client: Client,
    namespace: Option<String>,
    opts: NetworkOptions,
) -> Result<(), Error> {
    let networks: Api<Network> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let network_ids: Api<NetworkId> = Api::all(client.clone());
    let probe = ListParams::default().limit(1);
    if let Err(source) = networks.list(&probe).await {
        return Err(Error::CrdNotInstalled {
            kind: "Network",
            source: Box::new(source),
        });
    }
    if let Err(source) = network_ids.list(&probe).await {
        return Err(Error::CrdNotInstalled {
            kind: "NetworkId",
            source: Box::new(source),
        });
    }

    let id_controller = Controller::new(network_ids.clone(), watcher::Config::default());
    let id_store = id_controller.store();
    let network_controller = Controller::new(networks.clone(), watcher::Config::default());
    let network_store = network_controller.store();

    let ctx = Arc::new(
        Context::new(client, &opts)?
            .with_namespace(namespace)
            .with_id_cache(id_store.clone()),
    );

    let network_loop = network_controller
        // A change of N concerns every Network that references N.
        .watches(
            networks.clone(),
            watcher::Config::default(),
            move |changed: Network| referrers(&network_store, &changed),
        )
        // A claim that appears or disappears concerns its claimer.
        .watches(
            network_ids.clone(),
            watcher::Config::default(),
            |nid: NetworkId| {
                let claim = &nid.spec.claim_ref;
                Some(ObjectRef::<Network>::new(&claim.name).within(&claim.namespace))
            },
        )
        .shutdown_on_signal()
        .run(reconcile_network, network_error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "network controller event");
            }
        });

    let gc_loop = id_controller
        // A deleted or recreated Network concerns the claims made under its UID.
        .watches(
            networks,
            watcher::Config::default(),
            move |changed: Network| claims_of(&id_store, &changed),
        )
        .shutdown_on_signal()
        .run(reconcile_network_id, network_id_error_policy, ctx)
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
