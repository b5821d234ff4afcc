//! The NetworkId sweep against an in-memory API server: orphaned claims are collected only
//! after the grace period (injected time), claims of live Networks and foreign claims stay.

use crate::network_common;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kubetun_controller::operator::isolation::{NetworkIdContext, reconcile_network_id};
use kubetun_controller::plumbing::runtime::ApiHealth;
use kubetun_crds::contract::network::CLAIM_UID_LABEL;
use kubetun_crds::{ClaimRef, GROUP, NetworkId, NetworkIdSpec};
use network_common::*;

const CREATED: i64 = 1_800_000_000;
const GRACE: Duration = Duration::from_secs(120);

fn claim(id: u32, group: &str, name: &str, uid: &str) -> NetworkId {
    let mut nid = NetworkId::new(
        &id.to_string(),
        NetworkIdSpec {
            claim_ref: ClaimRef {
                group: group.to_owned(),
                resource: "networks".to_owned(),
                namespace: NS.to_owned(),
                name: name.to_owned(),
                uid: uid.to_owned(),
            },
        },
    );
    nid.labels_mut()
        .insert(CLAIM_UID_LABEL.to_owned(), uid.to_owned());
    nid.metadata.creation_timestamp = Some(Time(at(CREATED)));
    nid
}

fn context_at(client: &kube::Client, now: i64) -> Arc<NetworkIdContext> {
    Arc::new(
        NetworkIdContext::new(client.clone(), ApiHealth::new(client.clone()))
            .with_gc_grace(GRACE)
            .with_clock(move || at(now)),
    )
}

async fn sweep(client: &kube::Client, now: i64, id: u32) -> Action {
    let nid = network_ids(client).get(&id.to_string()).await.unwrap();
    reconcile_network_id(Arc::new(nid), context_at(client, now))
        .await
        .unwrap()
}

#[tokio::test]
async fn orphaned_claim_is_collected_only_after_the_grace_period() {
    let client = fake_api(vec![], vec![claim(300, GROUP, "gone", "uid-gone")]).await;

    let action = sweep(&client, CREATED + 30, 300).await;
    assert_eq!(
        action,
        Action::requeue(Duration::from_secs(90)),
        "recheck when grace ends"
    );
    assert_eq!(
        claims(&client).await.len(),
        1,
        "young claims are never collected"
    );

    sweep(&client, CREATED + 121, 300).await;
    assert!(claims(&client).await.is_empty());
}

#[tokio::test]
async fn claim_of_a_recreated_network_is_collected() {
    // The claim names uid-old; the Network of that name now has uid-new.
    let client = fake_api(
        vec![network("net", "uid-new")],
        vec![
            claim(301, GROUP, "net", "uid-old"),
            claim(302, GROUP, "net", "uid-new"),
        ],
    )
    .await;
    sweep(&client, CREATED + 3600, 301).await;
    sweep(&client, CREATED + 3600, 302).await;
    assert_eq!(claims(&client).await, vec![(302, "uid-new".to_owned())]);
}

#[tokio::test]
async fn foreign_and_out_of_scope_claims_are_left_alone() {
    let client = fake_api(vec![], vec![claim(303, "example.com", "x", "uid-x")]).await;
    sweep(&client, CREATED + 3600, 303).await;
    assert_eq!(
        claims(&client).await.len(),
        1,
        "foreign claims are not ours to judge"
    );

    let client = fake_api(vec![], vec![claim(304, GROUP, "gone", "uid-gone")]).await;
    let nid = network_ids(&client).get("304").await.unwrap();
    let scoped = Arc::new(
        NetworkIdContext::new(client.clone(), ApiHealth::new(client.clone()))
            .with_gc_grace(GRACE)
            .with_clock(|| at(CREATED + 3600))
            .with_namespace(Some("elsewhere".to_owned())),
    );
    reconcile_network_id(Arc::new(nid), scoped).await.unwrap();
    assert_eq!(
        claims(&client).await.len(),
        1,
        "claims from other namespaces are out of scope"
    );
}
