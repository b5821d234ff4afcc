//! A shortcut on three real API servers (hub, rome, milan): `kubetun shortcut create --wait`
//! returns as soon as the leaves are linked (the operator reacts to the leaves' events), the
//! CLI writes the Secrets before the ShortcutConnection, a direct `network disconnect` on a
//! leaf refuses to break the hub's link, and deleting the shortcut removes the link and its
//! kubeconfig Secrets although no garbage collector runs.

use crate::realapi_support;

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::watcher;
use kubetun_controller::operator::shortcut;
use kubetun_crds::{NetworkConfig, ShortcutConnection};
use realapi_support::{Leaf, NAMESPACE, kubetun, text};

/// The resourceVersion at which each object was first seen (its creation revision; etcd
/// revisions are ordered across all objects of a cluster). Counts `listed` up once its
/// initial list is done: an object created before that would be seen at a later revision.
async fn record_creations<K>(
    api: Api<K>,
    into: std::sync::Arc<std::sync::Mutex<Vec<(String, u64)>>>,
    listed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let events = watcher(api, watcher::Config::default());
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        if let Ok(watcher::Event::InitDone) = event {
            listed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        if let Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) = event {
            let kind = K::kind(&()).into_owned();
            let rv: u64 = obj.resource_version().unwrap().parse().unwrap();
            let mut seen = into.lock().unwrap();
            let name = format!("{kind}/{}", obj.name_any());
            if !seen.iter().any(|(n, _)| *n == name) {
                seen.push((name, rv));
            }
        }
    }
}

#[tokio::test]
async fn shortcut_is_event_driven_guarded_and_cleaned_up() {
    let Some([hub, rome, milan]) = realapi_support::clusters(["hub", "rome", "milan"]).await else {
        return;
    };
    let _rome = Leaf::start(&rome, "rome", "10.202.0.0/16", "10.70.0.0/16").await;
    let _milan = Leaf::start(&milan, "milan", "10.203.0.0/16", "10.70.0.0/16").await;
    let hub_client = hub.client().await.unwrap();
    let operator = tokio::spawn(shortcut::run(
        hub_client.clone(),
        Some(NAMESPACE.to_owned()),
        "europe".to_owned(),
        kubetun_controller::plumbing::runtime::ApiHealth::new(hub_client.clone()),
    ));

    let creations = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let listed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let recorders = [
        tokio::spawn(record_creations::<Secret>(
            Api::namespaced(hub_client.clone(), NAMESPACE),
            creations.clone(),
            listed.clone(),
        )),
        tokio::spawn(record_creations::<ShortcutConnection>(
            Api::namespaced(hub_client.clone(), NAMESPACE),
            creations.clone(),
            listed.clone(),
        )),
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    while listed.load(std::sync::atomic::Ordering::SeqCst) < recorders.len() {
        assert!(
            Instant::now() < deadline,
            "the recorders' watches did not list"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let (hub_k, rome_k, milan_k) = (
        hub.kubeconfig_path(),
        rome.kubeconfig_path(),
        milan.kubeconfig_path(),
    );
    let started = Instant::now();
    let out = kubetun(&[
        "shortcut",
        "create",
        "rome-milan",
        "--kubeconfig",
        hub_k.to_str().unwrap(),
        "--left-name",
        "rome",
        "--left-kubeconfig",
        rome_k.to_str().unwrap(),
        "--right-name",
        "milan",
        "--right-kubeconfig",
        milan_k.to_str().unwrap(),
        "--wait",
        "--timeout",
        "60s",
    ])
    .await;
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    println!("shortcut create --wait returned after {took:?}");
    // The old operator re-checked a pending shortcut every 5 s and needed two such rounds.
    assert!(
        took < Duration::from_secs(4),
        "took {took:?}:\n{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stdout).contains("connected"),
        "{}",
        text(&out.stdout)
    );

    // Secrets first, then the ShortcutConnection.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = creations.lock().unwrap().clone();
    let rv = |name: &str| seen.iter().find(|(n, _)| n == name).map(|(_, rv)| *rv);
    let shortcut_rv = rv("ShortcutConnection/rome-milan").unwrap();
    for leaf in ["rome", "milan"] {
        let secret = rv(&format!("Secret/rome-milan-{leaf}-kubeconfig")).unwrap();
        assert!(secret < shortcut_rv, "{seen:?}");
    }
    recorders.iter().for_each(tokio::task::JoinHandle::abort);

    // A leaf knows whose link it is and refuses a direct disconnect or reset, also a reset of
    // one side alone (the other cluster unreachable).
    let unreachable = rome_k.with_file_name("missing-kubeconfig");
    let refusals: [&[&str]; 3] = [
        &[
            "disconnect",
            "--remote-kubeconfig",
            milan_k.to_str().unwrap(),
        ],
        &["reset", "--remote-kubeconfig", milan_k.to_str().unwrap()],
        &[
            "reset",
            "--remote-kubeconfig",
            unreachable.to_str().unwrap(),
            "--remote-cluster-id",
            "milan",
        ],
    ];
    for extra in refusals {
        let mut argv = vec![
            "network",
            extra[0],
            "--kubeconfig",
            rome_k.to_str().unwrap(),
        ];
        argv.extend_from_slice(&extra[1..]);
        let out = kubetun(&argv).await;
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{argv:?}: {}", text(&out.stdout));
        assert!(
            stderr.contains("ShortcutConnection kubetun-system/rome-milan on hub europe")
                && stderr.contains("--force"),
            "{argv:?}: {stderr}"
        );
    }
    let rome_configs: Api<NetworkConfig> = Api::namespaced(rome.client().await.unwrap(), NAMESPACE);
    assert_eq!(
        rome_configs
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );

    // Deleting the shortcut removes the link and the kubeconfig Secrets (no GC here).
    let out = kubetun(&[
        "shortcut",
        "delete",
        "rome-milan",
        "--kubeconfig",
        hub_k.to_str().unwrap(),
        "--wait",
        "--timeout",
        "30s",
    ])
    .await;
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let secrets: Api<Secret> = Api::namespaced(hub_client.clone(), NAMESPACE);
    let left: Vec<String> = secrets
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| s.name_any())
        .filter(|n| n.starts_with("rome-milan-"))
        .collect();
    assert!(left.is_empty(), "kubeconfig Secrets left behind: {left:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !rome_configs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(Instant::now() < deadline, "rome still has NetworkConfigs");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    operator.abort();
}
