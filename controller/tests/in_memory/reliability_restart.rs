//! A controller restart changes nothing it already decided: a fresh Network controller
//! (empty caches) on the same API server keeps every Network's ID and every NetworkId claim,
//! writes nothing for them, and a Network created afterwards gets an ID nobody holds.

use crate::network_common;

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::{ListParams, PostParams};
use network_common::*;

/// Name → (status ID, resourceVersion) of every Network, and every NetworkId with its
/// claimer and resourceVersion.
async fn snapshot(
    client: &kube::Client,
) -> (
    BTreeMap<String, (Option<String>, Option<String>)>,
    BTreeMap<String, (String, Option<String>)>,
) {
    let networks = networks(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| {
            let id = n.status.as_ref().and_then(|s| s.id.clone());
            (n.name_any(), (id, n.resource_version()))
        })
        .collect();
    let ids = network_ids(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|nid| {
            let version = nid.resource_version();
            (nid.name_any(), (nid.spec.claim_ref.uid, version))
        })
        .collect();
    (networks, ids)
}

#[tokio::test]
async fn a_restarted_controller_keeps_every_network_id_and_writes_nothing() {
    let names = ["blue", "green", "red", "teal", "gold"];
    let client = fake_api(
        names
            .iter()
            .map(|n| network(n, &format!("uid-{n}")))
            .collect(),
        vec![],
    )
    .await;
    let first = context(&client, options(100, 109));
    for name in names {
        reconcile(&client, &first, name).await.unwrap();
    }
    let before = snapshot(&client).await;
    assert_eq!(before.1.len(), names.len(), "one claim per Network");
    assert!(before.0.values().all(|(id, _)| id.is_some()));
    drop(first);

    // The new controller meets the Networks in another order than the first one did.
    let second = context(&client, options(100, 109));
    for name in names.iter().rev() {
        reconcile(&client, &second, name).await.unwrap();
    }
    let after = snapshot(&client).await;
    assert_eq!(after, before, "a restart rewrote or reallocated something");

    // A Network created after the restart gets a free ID.
    networks(&client)
        .create(&PostParams::default(), &network("plum", "uid-plum"))
        .await
        .unwrap();
    reconcile(&client, &second, "plum").await.unwrap();
    let plum = status_id(&client, "plum").await.expect("plum gets an ID");
    assert!(
        before
            .0
            .values()
            .all(|(id, _)| id.as_deref() != Some(&plum)),
        "{plum} was already held"
    );
    assert_eq!(claims(&client).await.len(), names.len() + 1);
}
