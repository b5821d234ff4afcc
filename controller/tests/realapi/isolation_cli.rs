//! `kubetun network connect --isolation` on real API servers with two leaves running their
//! reconcilers: a link made without the flag leaves each side's isolation out (its cluster's
//! default); the flag writes it into the NetworkConfig each side announces itself with, on
//! both clusters; a re-run without the flag keeps it; a re-run with another value changes it
//! in place (same objects, same keys, the TunnelEndpoints stay); `network status` shows the
//! link's isolation.

use crate::realapi_support::{self, Leaf, NAMESPACE, text};

use kube::Api;
use kubetun_crds::{Isolation, NetworkConfig, TunnelEndpoint};

/// Runs `kubetun network connect` between the two kubeconfigs with `extra`; its stdout.
async fn connect(rome: &str, milan: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "network",
        "connect",
        "--kubeconfig",
        rome,
        "--remote-kubeconfig",
        milan,
        "--wait",
        "--timeout",
        "60s",
    ];
    args.extend_from_slice(extra);
    let out = realapi_support::kubetun(&args).await;
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "connect {extra:?}: {stdout}{}",
        text(&out.stderr)
    );
    stdout
}

/// `(uid, isolation, public key)` of each NetworkConfig of the link, in a fixed order:
/// Rome's `to-milan` and `from-milan`, Milan's `to-rome` and `from-rome`.
async fn configs(
    rome: &kube::Client,
    milan: &kube::Client,
) -> Vec<(String, Option<Isolation>, String)> {
    let mut out = Vec::new();
    for (client, names) in [
        (rome, ["to-milan", "from-milan"]),
        (milan, ["to-rome", "from-rome"]),
    ] {
        let api = Api::<NetworkConfig>::namespaced(client.clone(), NAMESPACE);
        for name in names {
            let nc = api.get(name).await.unwrap();
            out.push((
                nc.metadata.uid.unwrap(),
                nc.spec.isolation,
                nc.spec.public_key,
            ));
        }
    }
    out
}

/// The TunnelEndpoints' uids: `[Rome's of Milan, Milan's of Rome]`.
async fn tunnel_uids(rome: &kube::Client, milan: &kube::Client) -> [String; 2] {
    let uid = |client: &kube::Client, peer: &'static str| {
        let api = Api::<TunnelEndpoint>::namespaced(client.clone(), NAMESPACE);
        async move { api.get(peer).await.unwrap().metadata.uid.unwrap() }
    };
    [uid(rome, "milan").await, uid(milan, "rome").await]
}

#[tokio::test]
async fn connect_sets_keeps_and_changes_the_isolation_in_place() {
    let Some([rome_cluster, milan_cluster]) = realapi_support::clusters(["rome", "milan"]).await
    else {
        return;
    };
    let _rome = Leaf::start(&rome_cluster, "rome", "10.60.0.0/16", "10.90.0.0/16").await;
    let _milan = Leaf::start(&milan_cluster, "milan", "10.61.0.0/16", "10.91.0.0/16").await;
    let (rome, milan) = (
        rome_cluster.client().await.unwrap(),
        milan_cluster.client().await.unwrap(),
    );
    let (rome_k, milan_k) = (
        rome_cluster.kubeconfig_path(),
        milan_cluster.kubeconfig_path(),
    );
    let (rome_k, milan_k) = (rome_k.to_str().unwrap(), milan_k.to_str().unwrap());

    // A new link without the flag: each side on its cluster's default, the field left out.
    let stdout = connect(rome_k, milan_k, &[]).await;
    assert!(
        stdout.contains("isolation of rome towards milan: rome's cluster default"),
        "{stdout}"
    );
    assert!(
        stdout.contains("isolation of milan towards rome: milan's cluster default"),
        "{stdout}"
    );
    let first = configs(&rome, &milan).await;
    assert!(first.iter().all(|(_, i, _)| i.is_none()), "{first:?}");
    let tunnels = tunnel_uids(&rome, &milan).await;

    // The flag: both sides, in the NetworkConfigs of both clusters, in place.
    let stdout = connect(rome_k, milan_k, &["--isolation", "exported"]).await;
    assert!(
        stdout.contains("isolation of rome towards milan: exported (--isolation)")
            && stdout.contains("isolation of milan towards rome: exported (--isolation)"),
        "{stdout}"
    );
    let exported = configs(&rome, &milan).await;
    for ((uid, isolation, key), (uid_before, _, key_before)) in exported.iter().zip(&first) {
        assert_eq!(*isolation, Some(Isolation::Exported), "{exported:?}");
        assert_eq!(
            (uid, key),
            (uid_before, key_before),
            "re-created or re-keyed"
        );
    }
    assert_eq!(
        tunnel_uids(&rome, &milan).await,
        tunnels,
        "a tunnel was torn down"
    );

    // A re-run without the flag (as after a key rotation) keeps it.
    let stdout = connect(rome_k, milan_k, &[]).await;
    assert!(
        stdout.contains(
            "isolation of rome towards milan: exported (the link's; --isolation changes it)"
        ),
        "{stdout}"
    );
    assert_eq!(configs(&rome, &milan).await, exported);

    // Another value changes it in place.
    connect(rome_k, milan_k, &["--isolation", "open"]).await;
    let open = configs(&rome, &milan).await;
    for ((uid, isolation, key), (uid_before, _, key_before)) in open.iter().zip(&first) {
        assert_eq!(*isolation, Some(Isolation::Open), "{open:?}");
        assert_eq!(
            (uid, key),
            (uid_before, key_before),
            "re-created or re-keyed"
        );
    }
    assert_eq!(
        tunnel_uids(&rome, &milan).await,
        tunnels,
        "a tunnel was torn down"
    );

    // network status shows the TunnelEndpoint's isolation.
    let out = realapi_support::kubetun(&["network", "status", "--kubeconfig", rome_k]).await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let te = Api::<TunnelEndpoint>::namespaced(rome.clone(), NAMESPACE)
        .get("milan")
        .await
        .unwrap();
    assert!(
        stdout.contains(&format!("isolation:      {}", te.spec.isolation)),
        "{stdout}"
    );
}
