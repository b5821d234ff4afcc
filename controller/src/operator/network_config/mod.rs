//! The NetworkConfig controller: this cluster's links as NetworkConfigs and TunnelEndpoints,
//! and the local gateway kept on their desired state (the IO shell around [`crate::planner`]
//! and [`crate::ipam`]).
//!
//! - [`context`]: what the controller's loops share ([`context::Context`]).
//! - [`reconcile`]: processes peers' NetworkConfigs (IPAM, status, finalizer).
//! - [`tunnel_endpoint`]: one TunnelEndpoint per fully processed pair of NetworkConfigs (the
//!   spec; the status is the gateway sync's).
//! - [`gateway`]: pushes the desired state of all TunnelEndpoints to the gateway and writes
//!   their status from its report ([`gateway::status`]).
//! - [`keys`]: follows the gateway key Secret through a key rotation.
//! - [`cache`]: watch-fed caches of what the others read, fed by [`run`].
//! - [`error`] and [`status_patch`]: the ground floor (the error, status writes).
//!
//! [`run`] wires them to watches with the kube-runtime `Controller`; [`sync_once`] is one
//! complete pass over every object of the namespace (what the watches do over time), used
//! by tests and benchmarks against in-memory API servers.

pub mod cache;
pub mod context;
pub mod error;
pub mod gateway;
pub mod keys;
pub mod reconcile;
pub mod status_patch;
pub mod tunnel_endpoint;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, ListParams};
use kube::runtime::{PredicateConfig, WatchStreamExt as _, predicates, reflector, watcher};

use kube::ResourceExt as _;
use kubetun_crds::{Network, NetworkConfig, TunnelEndpoint};

use crate::operator::network_config::context::Context;
use crate::operator::network_config::error::Error;
use crate::planner;
use crate::plumbing::conditions;
use crate::plumbing::runtime;

pub use gateway::{GatewaySync, GatewaySyncOutcome};

/// How often the garbage collector of [`run`] looks for leftovers.
const GC_INTERVAL: Duration = Duration::from_secs(60);

/// What one [`sync_once`] pass found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Peers' NetworkConfigs processed successfully.
    pub processed: Vec<String>,
    /// Peers' NetworkConfigs that could not be processed, with the condition reason.
    pub rejected: Vec<(String, String)>,
    /// TunnelEndpoints present after the pass.
    pub tunnel_endpoints: Vec<String>,
    /// Peers whose views were released because their NetworkConfig is gone.
    pub released: Vec<String>,
    /// The gateway sync, when a gateway is configured.
    pub gateway: Option<GatewaySyncOutcome>,
}

/// One complete reconciliation of the namespace: every NetworkConfig (finalizers included),
/// garbage collection of leftovers, and one gateway sync.
pub async fn sync_once(ctx: &Arc<Context>) -> Result<SyncReport, Error> {
    let configs: Api<NetworkConfig> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let mut report = SyncReport::default();
    let mut listed = configs.list(&ListParams::default()).await?.items;
    listed.sort_by_key(|nc| nc.name_any());
    // A local NetworkConfig only ensures its peer's TunnelEndpoint, which the peer's remote
    // NetworkConfig does too when there is one.
    let remote_peers: BTreeSet<String> = listed
        .iter()
        .filter_map(|nc| match reconcile::role_of(nc) {
            Some(reconcile::Role::Remote { peer }) => Some(peer.to_owned()),
            _ => None,
        })
        .collect();
    for nc in listed {
        let name = nc.name_any();
        let remote = match reconcile::role_of(&nc) {
            Some(reconcile::Role::Local { peer }) if remote_peers.contains(peer) => continue,
            Some(reconcile::Role::Remote { .. }) => true,
            _ => false,
        };
        reconcile::reconcile(Arc::new(nc), ctx.clone()).await?;
        if remote
            && let Some(nc) = configs.get_opt(&name).await?
            && let Some(status) = &nc.status
        {
            match conditions::find(&status.conditions, kubetun_crds::contract::link::PROCESSED) {
                Some(c) if c.status == "True" => report.processed.push(name.clone()),
                Some(c) => report.rejected.push((name.clone(), c.reason.clone())),
                None => {}
            }
        }
    }
    report.released = collect_garbage(ctx).await?;
    if let Some(gateway) = &ctx.gateway {
        let mut sync =
            GatewaySync::new(ctx.clone(), gateway.clone()).with_counter_refresh(Duration::ZERO);
        report.gateway = Some(sync.sync().await?);
    }
    let endpoints: Api<TunnelEndpoint> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    report.tunnel_endpoints = endpoints
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|te| te.name_any())
        .collect();
    report.tunnel_endpoints.sort();
    Ok(report)
}

/// Releases the views of peers whose `from-` NetworkConfig is gone and deletes
/// TunnelEndpoints without one. The finalizer normally does this; this catches objects
/// removed while the controller was down or forcibly (finalizer stripped). TunnelEndpoints
/// no NetworkConfig owns (made by hand) are removed with an Event saying why
/// ([`tunnel_endpoint::remove_stray`]). Returns the released peers.
pub async fn collect_garbage(ctx: &Context) -> Result<Vec<String>, Error> {
    let configs: Api<NetworkConfig> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let present: BTreeSet<String> = configs
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|nc| nc.name_any())
        .collect();
    let gone: Vec<String> = ctx
        .ipam()
        .owners()
        .filter(|owner| !present.contains(&planner::remote_config_name(owner)))
        .map(str::to_owned)
        .collect();
    for owner in &gone {
        ctx.ipam().release(owner);
        tracing::info!(peer = owner, "views released: its NetworkConfig is gone");
    }
    let endpoints: Api<TunnelEndpoint> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    for te in endpoints.list(&ListParams::default()).await?.items {
        let peer = te.name_any();
        if !tunnel_endpoint::is_managed(&te) {
            // Made by hand: removed with an Event that says why (normally at once, by `run`).
            tunnel_endpoint::remove_stray(ctx, &te).await?;
        } else if !present.contains(&planner::remote_config_name(&peer)) {
            tunnel_endpoint::remove(ctx, &peer).await?;
        }
    }
    Ok(gone)
}

/// Runs the NetworkConfig controller (owning TunnelEndpoints, re-run on Network changes for
/// the ACLs), the periodic garbage collector and, when a gateway is configured, the gateway
/// sync, until the process is asked to stop. Their watches feed the context's
/// [`cache`](crate::operator::network_config::context::State::cache).
pub async fn run(ctx: Arc<Context>) {
    let configs: Api<NetworkConfig> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let endpoints: Api<TunnelEndpoint> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let networks: Api<Network> = Api::all(ctx.client.clone());
    let health = &ctx.health;
    let (network_store, network_writer) = reflector::store();
    let network_changes = runtime::watch(networks, watcher::Config::default(), health, "Network")
        .reflect(network_writer)
        .touched_objects()
        .filter_map(|event| async move { event.ok().map(|_: Network| ()) });

    // The gateway sync builds the desired state from the cache: it is woken once the cache
    // shows a TunnelEndpoint created, changed in spec, deleted, or relisted.
    let (endpoint_store, endpoint_writer) = reflector::store();
    let wake = {
        let ctx = ctx.clone();
        move || ctx.wake_gateway_sync()
    };
    let wake_on_spec = wake.clone();
    // TunnelEndpoints no NetworkConfig owns (made by hand) are removed, with an Event, as
    // soon as they are seen.
    let (stray_tx, mut stray_rx) = tokio::sync::mpsc::unbounded_channel::<TunnelEndpoint>();
    // Owned TunnelEndpoints trigger their NetworkConfig on spec changes only: the gateway
    // sync rewrites their status all the time. A TunnelEndpoint deleted by hand comes back
    // with the periodic requeue.
    let endpoint_changes = runtime::watch(
        endpoints,
        watcher::Config::default(),
        health,
        "TunnelEndpoint",
    )
    .reflect(endpoint_writer)
    .inspect(move |event| {
        if matches!(
            event,
            Ok(watcher::Event::Delete(_) | watcher::Event::InitDone)
        ) {
            wake();
        }
        if let Ok(watcher::Event::Apply(te) | watcher::Event::InitApply(te)) = event
            && !tunnel_endpoint::is_managed(te)
        {
            let _ = stray_tx.send(te.clone());
        }
    })
    .touched_objects()
    .predicate_filter(predicates::generation, PredicateConfig::default())
    .inspect(move |_| wake_on_spec());
    let controller =
        runtime::controller(configs, watcher::Config::default(), health, "NetworkConfig");
    let _feeding = ctx.cache.feed(cache::Stores {
        network_configs: controller.store(),
        tunnel_endpoints: endpoint_store,
        networks: network_store,
    });
    let controller = controller
        .owns_stream(endpoint_changes)
        .reconcile_all_on(network_changes)
        .graceful_shutdown_on(crate::plumbing::shutdown::signal())
        .run(
            |nc, ctx: Arc<Context>| async move {
                let result = reconcile::reconcile(nc.clone(), ctx.clone()).await;
                if result.is_ok() {
                    ctx.reconciled(&*nc);
                }
                result
            },
            runtime::error_policy,
            ctx.clone(),
        )
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(networkconfig = %object.name, "reconciled"),
                Err(error) => tracing::debug!(%error, "reconcile error"),
            }
        });

    let gc_ctx = ctx.clone();
    let gc = async move {
        let mut interval = tokio::time::interval(GC_INTERVAL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            if let Err(error) = collect_garbage(&gc_ctx).await {
                gc_ctx.metrics.failed("gc", &error);
                tracing::warn!(%error, "garbage collection failed");
            }
        }
    };

    let strays = async {
        while let Some(te) = stray_rx.recv().await {
            if let Err(error) = tunnel_endpoint::remove_stray(&ctx, &te).await {
                // The periodic garbage collection tries again.
                tracing::warn!(tunnelendpoint = %te.name_any(), %error, "cannot remove a TunnelEndpoint made by hand");
            }
        }
        futures::future::pending::<()>().await;
    };

    let gateway = async {
        match ctx.gateway.clone() {
            Some(client) => GatewaySync::new(ctx.clone(), client).run().await,
            None => futures::future::pending().await,
        }
    };

    // The controller ends on SIGTERM/SIGINT; everything else ends with it.
    tokio::select! {
        () = controller => {}
        () = gc => {}
        () = gateway => {}
        () = strays => {}
        () = keys::run(ctx.clone()) => {}
    }
}
