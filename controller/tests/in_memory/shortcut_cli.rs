//! `kubetun shortcut create` on an in-memory hub: what it writes, that a second run writes
//! nothing (and keeps the isolation when not given), that it refuses foreign Secrets, and
//! that the operator consumes what it wrote.

use crate::connector_support;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use connector_support::{NAMESPACE, Recorder, Switches, api_server};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kubetun_cli::Error;
use kubetun_cli::shortcut::{LeafRequest, ShortcutRequest, apply_shortcut, secret_name};
use kubetun_controller::operator::shortcut::{self, Context, SecretKubeconfigs};
use kubetun_controller::plumbing::conditions;
use kubetun_controller::plumbing::runtime::ApiHealth;
use kubetun_crds::contract::shortcut::{LEAF_REACHABLE, SHORTCUT_LABEL, reason};
use kubetun_crds::{Isolation, ShortcutConnection, ShortcutPhase};

/// A kubeconfig whose API server does not listen: the client (TLS included) builds, every
/// call fails.
fn kubeconfig(leaf: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
current-context: {leaf}
clusters:
- name: {leaf}
  cluster:
    server: https://127.0.0.1:9
    insecure-skip-tls-verify: true
contexts:
- name: {leaf}
  context: {{cluster: {leaf}, user: {leaf}-admin}}
users:
- name: {leaf}-admin
  user:
    token: not-a-real-token
"
    )
}

fn request() -> ShortcutRequest {
    let leaf = |name: &str| LeafRequest {
        name: name.into(),
        namespace: NAMESPACE.into(),
        endpoint: None,
        kubeconfig: kubeconfig(name),
    };
    ShortcutRequest {
        name: "rome-milan".into(),
        namespace: NAMESPACE.into(),
        left: leaf("rome"),
        right: leaf("milan"),
        mtu: Some(1380),
        transit: false,
        hub_only: false,
        isolation: Some(Isolation::Exported),
    }
}

#[tokio::test]
async fn create_writes_the_shortcut_and_owned_secrets_once() {
    let switches = Arc::new(Switches::default());
    let hub = api_server(&switches).await;

    let sc = apply_shortcut(&hub, &request(), &Recorder::default())
        .await
        .unwrap();
    assert_eq!(
        sc.spec.left.kubeconfig_secret.name,
        "rome-milan-rome-kubeconfig"
    );
    assert_eq!(sc.spec.right.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(sc.spec.mtu, Some(1380));
    assert_eq!(sc.spec.isolation, Some(Isolation::Exported));

    let secrets: Api<Secret> = Api::namespaced(hub.clone(), NAMESPACE);
    for leaf in ["rome", "milan"] {
        let secret = secrets.get(&secret_name("rome-milan", leaf)).await.unwrap();
        let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ShortcutConnection", sc.metadata.uid.as_deref().unwrap())
        );
        let labels = secret.metadata.labels.unwrap();
        assert_eq!(
            labels.get(SHORTCUT_LABEL).map(String::as_str),
            Some("rome-milan")
        );
        let stored = String::from_utf8(secret.data.unwrap()["kubeconfig"].0.clone()).unwrap();
        assert_eq!(stored, kubeconfig(leaf));
    }

    let writes = switches.writes.load(Ordering::SeqCst);
    let progress = Recorder::default();
    apply_shortcut(&hub, &request(), &progress).await.unwrap();
    assert_eq!(
        switches.writes.load(Ordering::SeqCst),
        writes,
        "{:#?}",
        progress.lines()
    );
    assert_eq!(
        progress
            .lines()
            .iter()
            .filter(|l| l.ends_with("up to date"))
            .count(),
        3
    );

    // Without --isolation a re-run keeps the shortcut's (and writes nothing); another value
    // changes it.
    let unset = ShortcutRequest {
        isolation: None,
        ..request()
    };
    let sc = apply_shortcut(&hub, &unset, &Recorder::default())
        .await
        .unwrap();
    assert_eq!(sc.spec.isolation, Some(Isolation::Exported));
    assert_eq!(switches.writes.load(Ordering::SeqCst), writes);
    let open = ShortcutRequest {
        isolation: Some(Isolation::Open),
        ..request()
    };
    let sc = apply_shortcut(&hub, &open, &Recorder::default())
        .await
        .unwrap();
    assert_eq!(sc.spec.isolation, Some(Isolation::Open));
}

#[tokio::test]
async fn create_refuses_a_foreign_secret_and_identical_leaves() {
    let hub = api_server(&Arc::new(Switches::default())).await;
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), NAMESPACE);
    let foreign = Secret {
        metadata: ObjectMeta {
            name: Some(secret_name("rome-milan", "rome")),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    secrets
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();

    let error = apply_shortcut(&hub, &request(), &Recorder::default())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Usage(_)), "{error}");
    assert!(
        error.to_string().contains(
            "Secret kubetun-system/rome-milan-rome-kubeconfig exists but does not belong"
        )
    );
    assert!(
        secrets
            .get(&secret_name("rome-milan", "rome"))
            .await
            .unwrap()
            .data
            .is_none()
    );

    let mut same = request();
    same.right.name = "rome".into();
    let error = apply_shortcut(&hub, &same, &Recorder::default())
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("both leaves are named \"rome\""),
        "{error}"
    );
}

#[tokio::test]
async fn the_operator_reads_the_secrets_create_wrote() {
    let hub = api_server(&Arc::new(Switches::default())).await;
    apply_shortcut(&hub, &request(), &Recorder::default())
        .await
        .unwrap();
    let ctx = Arc::new(Context::new(
        hub.clone(),
        Arc::new(SecretKubeconfigs::new(hub.clone())),
        ApiHealth::new(hub.clone()),
    ));
    let api: Api<ShortcutConnection> = Api::namespaced(hub, NAMESPACE);

    let sc = api.get("rome-milan").await.unwrap();
    shortcut::reconcile(Arc::new(sc), ctx).await.unwrap_err();

    // The kubeconfig parsed and a client was built: the failure is the leaf not answering.
    let status = api.get("rome-milan").await.unwrap().status.unwrap();
    assert_eq!(status.phase, ShortcutPhase::Error);
    let reachable = conditions::find(&status.conditions, LEAF_REACHABLE).unwrap();
    assert_eq!(
        reachable.reason,
        reason::LEAF_UNREACHABLE,
        "{}",
        reachable.message
    );
    assert!(
        reachable
            .message
            .starts_with("(rome) cannot read kubetun's cluster info"),
        "{}",
        reachable.message
    );
}
