//! The ShortcutConnection operator on the seed topology: Europe (hub) linked to Rome and
//! Milan, every cluster with external CIDR 10.70.0.0/16; a shortcut Rome <-> Milan managed
//! from Europe, with leaf clients handed in directly (or read from kubeconfig Secrets).

use crate::connector_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use connector_support::{Cluster, Controllers, NAMESPACE, Recorder, quick};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use kubetun_controller::connector::Connector;
use kubetun_controller::operator::shortcut::{self, Context, LeafError, SecretKubeconfigs};
use kubetun_controller::plumbing::conditions;
use kubetun_controller::plumbing::runtime::{self, ApiHealth};
use kubetun_crds::contract::shortcut::{FINALIZER, LEAF_REACHABLE, READY, reason};
use kubetun_crds::{
    ConnectionState, LeafCluster, NetworkConfigSpec, NetworkConfigStatus, SecretKeyRef,
    ShortcutConnection, ShortcutConnectionSpec, ShortcutPhase,
};

struct Topology {
    europe: Cluster,
    rome: Cluster,
    milan: Cluster,
    _controllers: Controllers,
}

/// Europe linked to Rome and to Milan with the connector, controllers running.
async fn seed_topology() -> Topology {
    let europe = Cluster::start("europe", "Europe", "10.200.0.0/16", "10.70.0.0/16").await;
    let rome = Cluster::start("rome", "Rome", "10.202.0.0/16", "10.70.0.0/16").await;
    let milan = Cluster::start("milan", "Milan", "10.203.0.0/16", "10.70.0.0/16").await;
    let controllers = Controllers::run(&[&europe, &rome, &milan]);
    for leaf in [&rome, &milan] {
        Connector::new(europe.handle("local"), leaf.handle("remote"))
            .connect(quick(true), &Recorder::default())
            .await
            .unwrap();
    }
    Topology {
        europe,
        rome,
        milan,
        _controllers: controllers,
    }
}

fn leaf(name: &str) -> LeafCluster {
    LeafCluster {
        name: name.into(),
        kubeconfig_secret: SecretKeyRef {
            name: format!("{name}-kubeconfig"),
            key: None,
        },
        namespace: Some(NAMESPACE.into()),
        endpoint_override: None,
    }
}

/// Creates the shortcut Rome <-> Milan on the hub.
async fn create_shortcut(hub: &Cluster) -> Api<ShortcutConnection> {
    let api: Api<ShortcutConnection> = Api::namespaced(hub.client.clone(), NAMESPACE);
    let mut sc = ShortcutConnection::new(
        "rome-milan",
        ShortcutConnectionSpec {
            left: leaf("rome"),
            right: leaf("milan"),
            mtu: None,
            ..Default::default()
        },
    );
    sc.metadata.namespace = Some(NAMESPACE.into());
    api.create(&PostParams::default(), &sc).await.unwrap();
    api
}

/// An operator context whose leaf clients are the test clusters' clients.
fn injected(topology: &Topology) -> Arc<Context> {
    let rome = topology.rome.client.clone();
    let milan = topology.milan.client.clone();
    let leaves = move |_: &str, leaf: &LeafCluster| match leaf.name.as_str() {
        "rome" => Ok(rome.clone()),
        "milan" => Ok(milan.clone()),
        other => Err(LeafError {
            leaf: other.to_owned(),
            reason: reason::KUBECONFIG_MISSING,
            message: format!("no such test leaf {other}"),
        }),
    };
    Arc::new(Context::new(
        topology.europe.client.clone(),
        Arc::new(leaves),
        ApiHealth::new(topology.europe.client.clone()),
    ))
}

/// Reconciles the shortcut until `done` holds for it (the controllers keep running).
async fn reconcile_until(
    api: &Api<ShortcutConnection>,
    ctx: &Arc<Context>,
    done: impl Fn(&ShortcutConnection) -> bool,
) -> ShortcutConnection {
    for _ in 0..500 {
        let sc = api.get("rome-milan").await.unwrap();
        if done(&sc) {
            return sc;
        }
        let _ = shortcut::reconcile(Arc::new(sc), ctx.clone()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "shortcut never reached the expected state: {:#?}",
        api.get("rome-milan").await.unwrap().status
    );
}

fn phase(sc: &ShortcutConnection) -> Option<ShortcutPhase> {
    sc.status.as_ref().map(|s| s.phase)
}

/// The hub links as each cluster holds them: NetworkConfig specs and statuses.
async fn hub_links(
    topology: &Topology,
) -> BTreeMap<String, (NetworkConfigSpec, Option<NetworkConfigStatus>)> {
    let mut links = BTreeMap::new();
    for (cluster, names) in [
        (
            &topology.europe,
            ["to-rome", "from-rome", "to-milan", "from-milan"].as_slice(),
        ),
        (&topology.rome, ["to-europe", "from-europe"].as_slice()),
        (&topology.milan, ["to-europe", "from-europe"].as_slice()),
    ] {
        for name in names {
            let nc = cluster.config(name).await.unwrap();
            links.insert(format!("{}/{name}", cluster.id()), (nc.spec, nc.status));
        }
    }
    links
}

#[tokio::test]
async fn the_hub_status_shows_what_each_leaf_holds() {
    let topology = seed_topology().await;
    let api = create_shortcut(&topology.europe).await;
    let ctx = injected(&topology);

    let sc = reconcile_until(&api, &ctx, |sc| phase(sc) == Some(ShortcutPhase::Connected)).await;
    assert!(sc.finalizers().iter().any(|f| f == FINALIZER));
    let status = sc.status.unwrap();
    assert!(conditions::is_true(&status.conditions, READY));
    assert!(conditions::is_true(&status.conditions, LEAF_REACHABLE));
    assert_eq!(status.directions.len(), 2);

    for (direction, viewer, viewed) in [
        (&status.directions[0], &topology.rome, &topology.milan),
        (&status.directions[1], &topology.milan, &topology.rome),
    ] {
        assert_eq!(
            (direction.from.as_str(), direction.to.as_str()),
            (viewer.id(), viewed.id())
        );
        let te = viewer.endpoint(viewed.id()).await.unwrap();
        assert_eq!(direction.pod_cidrs, te.spec.remote_pod_cidrs);
        assert_eq!(direction.external_cidrs, te.spec.remote_external_cidrs);
        assert_eq!(direction.connection, Some(ConnectionState::Connected));
        assert_eq!(direction.pod_cidrs[0].view, direction.pod_cidrs[0].real);
        assert_eq!(direction.external_cidrs[0].real, "10.70.0.0/16");
        assert_ne!(direction.external_cidrs[0].view, "10.70.0.0/16");

        // The leaf's own 10.70.0.0/16, the hub's and the other leaf's all differ.
        let via_hub = viewer
            .endpoint("europe")
            .await
            .unwrap()
            .spec
            .remote_external_cidrs[0]
            .view
            .clone();
        assert_ne!(direction.external_cidrs[0].view, via_hub);
    }
    // Each leaf now has two peers: the hub and the other leaf.
    assert_eq!(topology.rome.gateway.current().unwrap().peers.len(), 2);

    // A further pass on a settled link leaves the shortcut untouched (no status write).
    let sc = api.get("rome-milan").await.unwrap();
    let version = sc.metadata.resource_version.clone();
    shortcut::reconcile(Arc::new(sc), ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        api.get("rome-milan")
            .await
            .unwrap()
            .metadata
            .resource_version,
        version
    );
}

#[tokio::test]
async fn deleting_the_shortcut_removes_the_leaf_link_and_keeps_the_hub_links() {
    let topology = seed_topology().await;
    let api = create_shortcut(&topology.europe).await;
    let ctx = injected(&topology);
    reconcile_until(&api, &ctx, |sc| phase(sc) == Some(ShortcutPhase::Connected)).await;
    let before = hub_links(&topology).await;

    // The API server marks the object for deletion; the finalizer runs the teardown.
    let mut deleting = api.get("rome-milan").await.unwrap();
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let action = shortcut::reconcile(Arc::new(deleting), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    assert!(api.get("rome-milan").await.unwrap().finalizers().is_empty());
    api.delete("rome-milan", &DeleteParams::default())
        .await
        .unwrap();

    assert_eq!(
        topology.rome.config_names().await,
        ["from-europe", "to-europe"]
    );
    assert_eq!(
        topology.milan.config_names().await,
        ["from-europe", "to-europe"]
    );
    for _ in 0..100 {
        if topology.rome.endpoint("milan").await.is_none()
            && topology.milan.endpoint("rome").await.is_none()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(topology.rome.endpoint("milan").await.is_none());
    assert!(topology.milan.endpoint("rome").await.is_none());

    assert_eq!(hub_links(&topology).await, before);
    for (cluster, peer) in [
        (&topology.europe, "rome"),
        (&topology.europe, "milan"),
        (&topology.rome, "europe"),
    ] {
        let te = cluster.endpoint(peer).await.unwrap();
        assert_eq!(
            te.status.unwrap().connection.unwrap().status,
            ConnectionState::Connected
        );
    }
}

#[tokio::test]
async fn an_unreachable_leaf_gives_a_readable_condition_and_backs_off() {
    let topology = seed_topology().await;
    let api = create_shortcut(&topology.europe).await;
    let ctx = injected(&topology);
    reconcile_until(&api, &ctx, |sc| phase(sc) == Some(ShortcutPhase::Connected)).await;

    topology.milan.set_unreachable(true);
    let sc = api.get("rome-milan").await.unwrap();
    let error = shortcut::reconcile(Arc::new(sc), ctx.clone())
        .await
        .unwrap_err();
    let status = api.get("rome-milan").await.unwrap().status.unwrap();
    assert_eq!(status.phase, ShortcutPhase::Error);
    let reachable = conditions::find(&status.conditions, LEAF_REACHABLE).unwrap();
    assert_eq!(
        (reachable.status.as_str(), reachable.reason.as_str()),
        ("False", reason::LEAF_UNREACHABLE)
    );
    assert!(
        reachable
            .message
            .starts_with("(milan) cannot read kubetun's cluster info"),
        "{}",
        reachable.message
    );
    assert!(
        reachable.message.contains("connection refused"),
        "{}",
        reachable.message
    );
    assert!(!conditions::is_true(&status.conditions, READY));
    // The last known directions stay visible.
    assert_eq!(status.directions.len(), 2);

    let sc = Arc::new(api.get("rome-milan").await.unwrap());
    let first = runtime::error_policy(sc.clone(), &error, ctx.clone());
    let second = runtime::error_policy(sc, &error, ctx.clone());
    assert_eq!(first, Action::requeue(Duration::from_secs(5)));
    assert_eq!(second, Action::requeue(Duration::from_secs(10)));

    topology.milan.set_unreachable(false);
    let sc = reconcile_until(&api, &ctx, |sc| phase(sc) == Some(ShortcutPhase::Connected)).await;
    assert!(conditions::is_true(
        &sc.status.unwrap().conditions,
        LEAF_REACHABLE
    ));
}

#[tokio::test]
async fn kubeconfig_secrets_that_are_missing_or_broken_are_named() {
    let topology = seed_topology().await;
    let api = create_shortcut(&topology.europe).await;
    let hub = topology.europe.client.clone();
    let ctx = Arc::new(Context::new(
        hub.clone(),
        Arc::new(SecretKubeconfigs::new(hub.clone())),
        ApiHealth::new(hub.clone()),
    ));

    let sc = api.get("rome-milan").await.unwrap();
    shortcut::reconcile(Arc::new(sc), ctx.clone())
        .await
        .unwrap_err();
    let status = api.get("rome-milan").await.unwrap().status.unwrap();
    let reachable = conditions::find(&status.conditions, LEAF_REACHABLE).unwrap();
    assert_eq!(reachable.reason, reason::KUBECONFIG_MISSING);
    assert!(
        reachable
            .message
            .contains("Secret kubetun-system/rome-kubeconfig does not exist"),
        "{}",
        reachable.message
    );

    let secrets: Api<Secret> = Api::namespaced(hub, NAMESPACE);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("rome-kubeconfig".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "kubeconfig".to_owned(),
            ByteString(b"clusters: [oops".to_vec()),
        )])),
        ..Secret::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let sc = api.get("rome-milan").await.unwrap();
    shortcut::reconcile(Arc::new(sc), ctx.clone())
        .await
        .unwrap_err();
    let status = api.get("rome-milan").await.unwrap().status.unwrap();
    assert_eq!(status.phase, ShortcutPhase::Error);
    let reachable = conditions::find(&status.conditions, LEAF_REACHABLE).unwrap();
    assert_eq!(reachable.reason, reason::KUBECONFIG_INVALID);
    assert!(
        reachable
            .message
            .starts_with("leaf rome: Secret kubetun-system/rome-kubeconfig key \"kubeconfig\""),
        "{}",
        reachable.message
    );
}

#[tokio::test]
async fn the_shortcuts_isolation_reaches_both_leaves_and_leaves_the_hub_links_alone() {
    let topology = seed_topology().await;
    for cluster in [&topology.europe, &topology.rome, &topology.milan] {
        // No services here: nothing is exported.
        cluster.ctx.exports.publish(Default::default());
    }
    let api: Api<ShortcutConnection> = Api::namespaced(topology.europe.client.clone(), NAMESPACE);
    let mut sc = ShortcutConnection::new(
        "rome-milan",
        ShortcutConnectionSpec {
            left: leaf("rome"),
            right: leaf("milan"),
            isolation: Some(kubetun_crds::Isolation::Exported),
            ..Default::default()
        },
    );
    sc.metadata.namespace = Some(NAMESPACE.into());
    api.create(&PostParams::default(), &sc).await.unwrap();
    let ctx = injected(&topology);
    reconcile_until(&api, &ctx, |sc| phase(sc) == Some(ShortcutPhase::Connected)).await;

    for (viewer, viewed) in [
        (&topology.rome, &topology.milan),
        (&topology.milan, &topology.rome),
    ] {
        let own = viewer.config(&format!("to-{}", viewed.id())).await.unwrap();
        assert_eq!(own.spec.isolation, Some(kubetun_crds::Isolation::Exported));
        let te = viewer.endpoint(viewed.id()).await.unwrap();
        assert_eq!(te.spec.isolation, kubetun_crds::Isolation::Exported);
        // The gateway admits nothing of the other leaf: nothing is exported.
        let mut admitted = None;
        for _ in 0..250 {
            admitted = viewer.gateway.current().and_then(|state| {
                state
                    .admissions
                    .into_iter()
                    .find(|a| a.cluster == viewed.id())
            });
            if admitted.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let admitted = admitted.expect("an admission of the other leaf");
        assert_eq!(
            admitted.isolation,
            kubetun_controller::gateway_api::Isolation::Exported as i32
        );
        assert!(admitted.endpoints.is_empty());
        // The hub link keeps the leaf's default (open).
        let hub = viewer.endpoint("europe").await.unwrap();
        assert_eq!(hub.spec.isolation, kubetun_crds::Isolation::Open);
    }

    // Open again from the hub: both leaves follow.
    let mut sc = api.get("rome-milan").await.unwrap();
    sc.spec.isolation = Some(kubetun_crds::Isolation::Open);
    api.replace("rome-milan", &PostParams::default(), &sc)
        .await
        .unwrap();
    reconcile_until(&api, &ctx, |_| true).await;
    let mut opened = false;
    for _ in 0..250 {
        let sc = api.get("rome-milan").await.unwrap();
        let _ = shortcut::reconcile(Arc::new(sc), ctx.clone()).await;
        let rome = topology.rome.endpoint("milan").await.unwrap();
        let milan = topology.milan.endpoint("rome").await.unwrap();
        if rome.spec.isolation == kubetun_crds::Isolation::Open
            && milan.spec.isolation == kubetun_crds::Isolation::Open
        {
            opened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(opened, "both leaves open once the shortcut says so");
}
