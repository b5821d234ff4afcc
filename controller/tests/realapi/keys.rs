//! The key Secret's rotation states on a real API server: starting a rotation keeps the former
//! key as the previous one, a second start resumes instead of replacing it, concurrent starts
//! agree on one key (resourceVersion preconditions), and ending removes the previous key from
//! the stored object.

use crate::realapi_support;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kubetun_controller::keys::GatewayKeys;
use kubetun_controller::plumbing::key_secret::{self, RotationStart};
use realapi_support::{NAMESPACE, clusters};

#[tokio::test]
async fn rotation_states_of_the_key_secret() {
    let Some([cluster]) = clusters(["keys"]).await else {
        return;
    };
    let client = cluster.client().await.expect("client");
    let original = GatewayKeys::load_or_create(client.clone(), NAMESPACE)
        .await
        .expect("create");
    assert!(original.previous.is_none());

    let started = key_secret::begin_rotation(client.clone(), NAMESPACE)
        .await
        .expect("begin");
    let RotationStart::Started(rotating) = &started else {
        panic!("a new rotation: {started:?}");
    };
    assert_eq!(
        rotating
            .previous
            .as_ref()
            .map(|k| k.public_base64().to_owned()),
        Some(original.current.public_base64().to_owned())
    );
    assert_ne!(
        rotating.current.public_base64(),
        original.current.public_base64()
    );

    // A rerun (or a second CLI at the same time) continues the same rotation.
    let (a, b) = tokio::join!(
        key_secret::begin_rotation(client.clone(), NAMESPACE),
        key_secret::begin_rotation(client.clone(), NAMESPACE)
    );
    for again in [a.expect("again"), b.expect("again")] {
        assert_eq!(again, RotationStart::Resumed(rotating.clone()));
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let stored = GatewayKeys::from_secret(
        &secrets
            .get(kubetun_crds::contract::gateway_key::SECRET_NAME)
            .await
            .expect("get"),
    )
    .expect("keys");
    assert_eq!(&stored, rotating);

    // Ending is conditional on the current key, and removes the previous key's field.
    assert!(
        !key_secret::end_rotation(client.clone(), NAMESPACE, original.current.public_base64())
            .await
            .expect("end with a stale key")
    );
    assert!(
        key_secret::end_rotation(client.clone(), NAMESPACE, rotating.current.public_base64())
            .await
            .expect("end")
    );
    assert!(
        !key_secret::end_rotation(client.clone(), NAMESPACE, rotating.current.public_base64())
            .await
            .expect("end again"),
        "ending twice changes nothing"
    );
    let secret = secrets
        .get(kubetun_crds::contract::gateway_key::SECRET_NAME)
        .await
        .expect("get");
    let data = secret.data.clone().unwrap_or_default();
    assert!(!data.contains_key(kubetun_crds::contract::gateway_key::PREVIOUS_PRIVATE_KEY_FIELD));
    let old_private = original.current.private_base64();
    assert!(
        data.values()
            .all(|v| !String::from_utf8_lossy(&v.0).contains(&old_private)),
        "the replaced private key is gone from the Secret"
    );
    assert_eq!(
        GatewayKeys::from_secret(&secret)
            .expect("keys")
            .current
            .public_base64(),
        rotating.current.public_base64()
    );

    // The next run starts a new rotation.
    let next = key_secret::begin_rotation(client, NAMESPACE)
        .await
        .expect("begin");
    assert!(matches!(next, RotationStart::Started(_)), "{next:?}");
}
