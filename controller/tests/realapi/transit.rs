//! Transit through the hub on three real API servers (hub Europe, leaves Rome and Milan with
//! the same pod CIDR): both leaves are linked to the hub with `kubetun network connect`, and
//! the hub's operator links them with a ShortcutConnection.
//!
//! - Without `transit` the hub forwards nothing between them: no leaf has a fallback route
//!   and the hub's gateway accepts no leaf view as a source.
//! - With `transit` (set on the existing shortcut), each leaf's TunnelEndpoint of the other
//!   gets a fallback through the hub: the other's CIDRs as the hub sees them (on the wire)
//!   to the leaf's own views of it, the same as over the shortcut. The leaf's gateway gets
//!   them as fallback routes on its hub peer, and the hub's gateway accepts both leaves'
//!   views as sources.
//!
//! - With `hubOnly`, neither leaf has a tunnel to the other: the hub's addresses are ordinary
//!   routes on the hub peer at the same views, and the shortcut's status says `ViaHub`. The
//!   API server refuses `hubOnly` without `transit`.
//! - With `transit` off again, the hub withdraws its grant: it accepts neither leaf's views
//!   as sources any more.
//!
//! The data path of this (switching on the connectivity check, hysteresis, a TCP stream
//! across the switches) is `integration/tests/gateway_fallback.rs`.

use crate::realapi_support;

use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use kubetun_controller::gateway_api::DesiredState;
use kubetun_controller::operator::shortcut;
use kubetun_controller::planner::remote_config_name;
use kubetun_crds::contract::link::TRANSIT_ANNOTATION_PREFIX;
use kubetun_crds::{NetworkConfig, ShortcutConnection, TunnelEndpoint};
use realapi_support::{Leaf, NAMESPACE, kubetun, text};

async fn run(args: &[&str]) {
    let out = kubetun(args).await;
    assert!(
        out.status.success(),
        "kubetun {args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Waits until the leaf's gateway runs a state `done` accepts; returns it.
async fn wait_state(leaf: &Leaf, what: &str, done: impl Fn(&DesiredState) -> bool) -> DesiredState {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(state) = leaf.gateway.current().filter(|s| done(s)) {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {what}",
            leaf.info.cluster.id
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `(real, view)` of the fallback routes on peer `hub` in `state`.
fn fallback_routes(state: &DesiredState, hub: &str) -> Vec<(String, String)> {
    state
        .peers
        .iter()
        .filter(|p| p.name == hub)
        .flat_map(|p| &p.routes)
        .filter(|r| r.fallback)
        .map(|r| (r.real.clone(), r.view.clone()))
        .collect()
}

/// Merges `spec` into the spec of ShortcutConnection `rome-milan`.
async fn set_spec(shortcuts: &Api<ShortcutConnection>, spec: serde_json::Value) {
    shortcuts
        .patch(
            "rome-milan",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

fn local_prefixes(state: &DesiredState) -> Vec<String> {
    state
        .interface
        .as_ref()
        .map(|i| i.local_prefixes.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn transit_through_the_hub_only_where_a_shortcut_allows_it() {
    let Some([hub, rome, milan]) = realapi_support::clusters(["hub", "rome", "milan"]).await else {
        return;
    };
    let europe = Leaf::start(&hub, "europe", "10.200.0.0/16", "10.80.0.0/16").await;
    let rome_leaf = Leaf::start(&rome, "rome", "10.70.0.0/16", "10.90.0.0/16").await;
    let milan_leaf = Leaf::start(&milan, "milan", "10.70.0.0/16", "10.91.0.0/16").await;
    let hub_client = hub.client().await.unwrap();
    let _operator = tokio::spawn(shortcut::run(
        hub_client.clone(),
        Some(NAMESPACE.to_owned()),
        "europe".to_owned(),
        kubetun_controller::plumbing::runtime::ApiHealth::new(hub_client.clone()),
    ));
    let (hub_k, rome_k, milan_k) = (
        hub.kubeconfig_path(),
        rome.kubeconfig_path(),
        milan.kubeconfig_path(),
    );
    let (hub_k, rome_k, milan_k) = (
        hub_k.to_str().unwrap(),
        rome_k.to_str().unwrap(),
        milan_k.to_str().unwrap(),
    );
    for leaf in [rome_k, milan_k] {
        run(&[
            "network",
            "connect",
            "--kubeconfig",
            hub_k,
            "--remote-kubeconfig",
            leaf,
            "--wait",
            "--timeout",
            "60s",
        ])
        .await;
    }
    run(&[
        "shortcut",
        "create",
        "rome-milan",
        "--kubeconfig",
        hub_k,
        "--left-name",
        "rome",
        "--left-kubeconfig",
        rome_k,
        "--right-name",
        "milan",
        "--right-kubeconfig",
        milan_k,
        "--wait",
        "--timeout",
        "60s",
    ])
    .await;

    // No transit: nothing through the hub.
    let rome_state = wait_state(&rome_leaf, "peers europe and milan", |s| s.peers.len() == 2).await;
    assert!(fallback_routes(&rome_state, "europe").is_empty());
    let hub_state = wait_state(&europe, "peers rome and milan", |s| s.peers.len() == 2).await;
    let hub_configs: Api<NetworkConfig> = Api::namespaced(hub_client.clone(), NAMESPACE);
    let hub_view = |config: NetworkConfig| config.status.unwrap().pod_cidrs[0].view.clone();
    let hub_sees_rome = hub_view(hub_configs.get(&remote_config_name("rome")).await.unwrap());
    let hub_sees_milan = hub_view(hub_configs.get(&remote_config_name("milan")).await.unwrap());
    assert_ne!(
        hub_sees_rome, hub_sees_milan,
        "the hub remaps the overlapping leaves apart"
    );
    assert!(!local_prefixes(&hub_state).contains(&hub_sees_rome));

    // Transit on: both leaves get the other through the hub, at the same views.
    let shortcuts: Api<ShortcutConnection> = Api::namespaced(hub_client.clone(), NAMESPACE);
    set_spec(&shortcuts, serde_json::json!({ "transit": true })).await;
    for (leaf, other, other_at_hub) in [
        (&rome_leaf, "milan", &hub_sees_milan),
        (&milan_leaf, "rome", &hub_sees_rome),
    ] {
        let state = wait_state(leaf, "a fallback on the hub peer", |s| {
            !fallback_routes(s, "europe").is_empty()
        })
        .await;
        let tunnels: Api<TunnelEndpoint> = Api::namespaced(leaf.client.clone(), NAMESPACE);
        let direct = tunnels
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|te| te.spec.cluster.id == other)
            .unwrap();
        let view = direct.spec.remote_pod_cidrs[0].view.clone();
        let fallback = direct.spec.fallback.as_ref().expect("a fallback path");
        assert_eq!(fallback.hub.id, "europe");
        assert_eq!(
            fallback.routes[0].real, *other_at_hub,
            "the hub's view on the wire"
        );
        assert_eq!(fallback.routes[0].view, view, "one address whichever path");
        assert!(
            fallback_routes(&state, "europe").contains(&(other_at_hub.clone(), view.clone())),
            "{:?}",
            fallback_routes(&state, "europe")
        );
        println!(
            "{}: {other} at {view} directly (real 10.70.0.0/16) and through the hub (real {other_at_hub})",
            leaf.info.cluster.id
        );
    }
    let hub_state = wait_state(&europe, "transit sources", |s| {
        let local = local_prefixes(s);
        local.contains(&hub_sees_rome) && local.contains(&hub_sees_milan)
    })
    .await;
    println!("hub accepts as sources: {:?}", local_prefixes(&hub_state));

    // The API server refuses hubOnly without transit, with the reason.
    let mut refused = shortcuts.get("rome-milan").await.unwrap();
    refused.metadata = kube::api::ObjectMeta {
        name: Some("refused".to_owned()),
        ..Default::default()
    };
    refused.status = None;
    refused.spec.transit = false;
    refused.spec.hub_only = true;
    let error = shortcuts
        .create(&Default::default(), &refused)
        .await
        .expect_err("hubOnly without transit");
    assert!(
        error.to_string().contains("hubOnly needs transit"),
        "{error}"
    );

    // Hub only: no tunnel between the leaves, the hub's routes at the same views.
    set_spec(&shortcuts, serde_json::json!({ "hubOnly": true })).await;
    for (leaf, other, other_at_hub) in [
        (&rome_leaf, "milan", &hub_sees_milan),
        (&milan_leaf, "rome", &hub_sees_rome),
    ] {
        let state = wait_state(leaf, "the hub peer only", |s| s.peers.len() == 1).await;
        assert_eq!(state.peers[0].name, "europe");
        let tunnels: Api<TunnelEndpoint> = Api::namespaced(leaf.client.clone(), NAMESPACE);
        let te = tunnels.get(other).await.unwrap();
        assert!(te.spec.hub_only);
        let view = te.spec.remote_pod_cidrs[0].view.clone();
        let routes: Vec<(String, String, bool)> = state.peers[0]
            .routes
            .iter()
            .map(|r| (r.real.clone(), r.view.clone(), r.fallback))
            .collect();
        assert!(
            routes.contains(&(other_at_hub.clone(), view.clone(), false)),
            "{other} at {view} through the hub, always: {routes:?}"
        );
        println!(
            "{}: {other} at {view} through the hub only",
            leaf.info.cluster.id
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = shortcuts.get_status("rome-milan").await.unwrap().status;
        let paths: Vec<_> = status
            .iter()
            .flat_map(|s| &s.directions)
            .map(|d| d.path)
            .collect();
        if paths.len() == 2
            && paths
                .iter()
                .all(|p| *p == Some(kubetun_crds::ShortcutPath::ViaHub))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "both directions via the hub: {paths:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Back to a shortcut: the direct peers return, at the views the hub path used.
    set_spec(&shortcuts, serde_json::json!({ "hubOnly": false })).await;
    for leaf in [&rome_leaf, &milan_leaf] {
        wait_state(leaf, "the shortcut peer back", |s| {
            s.peers.len() == 2 && !fallback_routes(s, "europe").is_empty()
        })
        .await;
    }

    // Transit off: the hub withdraws the grant and accepts neither leaf's views as sources.
    set_spec(
        &shortcuts,
        serde_json::json!({ "transit": false, "hubOnly": false }),
    )
    .await;
    wait_state(&europe, "no transit sources", |s| {
        let local = local_prefixes(s);
        !local.contains(&hub_sees_rome) && !local.contains(&hub_sees_milan)
    })
    .await;
    for leaf in ["rome", "milan"] {
        let config = hub_configs.get(&remote_config_name(leaf)).await.unwrap();
        let grants: Vec<&String> = config
            .metadata
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k)
            .filter(|k| k.starts_with(TRANSIT_ANNOTATION_PREFIX))
            .collect();
        assert!(grants.is_empty(), "{leaf}: {grants:?}");
    }
}
