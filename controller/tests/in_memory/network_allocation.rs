//! Network ID allocation against an in-memory API server: unique IDs, races, exhaustion,
//! lost create responses, requested IDs, release and surplus claims.

use crate::network_common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use kube::ResourceExt;
use kube_fake_client::Error as FakeError;
use kubetun_controller::plumbing::runtime::ApiHealth;
use kubetun_crds::contract::network::{CLAIM_UID_LABEL, FINALIZER, condition, reason};
use kubetun_crds::{ClaimRef, GROUP, NetworkId, NetworkIdSpec, NetworkPhase};
use network_common::*;

fn claim(id: u32, name: &str, uid: &str) -> NetworkId {
    let mut nid = NetworkId::new(
        &id.to_string(),
        NetworkIdSpec {
            claim_ref: ClaimRef {
                group: GROUP.to_owned(),
                resource: "networks".to_owned(),
                namespace: NS.to_owned(),
                name: name.to_owned(),
                uid: uid.to_owned(),
            },
        },
    );
    nid.labels_mut()
        .insert(CLAIM_UID_LABEL.to_owned(), uid.to_owned());
    nid
}

#[tokio::test]
async fn each_network_gets_its_own_id_and_keeps_it() {
    let names = ["a", "b", "c", "d", "e"];
    let client = fake_api(
        names
            .iter()
            .map(|n| network(n, &format!("uid-{n}")))
            .collect(),
        vec![],
    )
    .await;
    let ctx = context(&client, options(200, 299));
    for name in names {
        reconcile(&client, &ctx, name).await.unwrap();
    }

    let held = claims(&client).await;
    assert_eq!(held.len(), names.len());
    for name in names {
        let n = networks(&client).get(name).await.unwrap();
        let status = n.status.unwrap();
        assert_eq!(status.phase, NetworkPhase::Available);
        let id: u32 = status.id.unwrap().parse().unwrap();
        assert!((200..=299).contains(&id));
        assert!(
            held.contains(&(id, format!("uid-{name}"))),
            "{name} holds {id}"
        );
        let allocated = status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::ID_ALLOCATED)
            .unwrap();
        assert_eq!(allocated.status, "True");
        let nid = network_ids(&client).get(&id.to_string()).await.unwrap();
        assert_eq!(
            nid.labels().get(CLAIM_UID_LABEL),
            Some(&format!("uid-{name}"))
        );
        assert_eq!(nid.spec.claim_ref.name, name);
    }

    // Reconciling again changes nothing.
    let before = status_id(&client, "c").await;
    reconcile(&client, &ctx, "c").await.unwrap();
    assert_eq!(status_id(&client, "c").await, before);
    assert_eq!(claims(&client).await.len(), names.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_allocations_in_a_tiny_range_never_share_an_id() {
    for round in 0..10 {
        let names: Vec<String> = (0..4).map(|i| format!("n{i}")).collect();
        let client = fake_api(
            names
                .iter()
                .map(|n| network(n, &format!("uid-{n}")))
                .collect(),
            vec![],
        )
        .await;
        let ctx = context(&client, options(200, 203));
        let tasks: Vec<_> = names
            .iter()
            .map(|name| {
                let (client, ctx, name) = (client.clone(), ctx.clone(), name.clone());
                tokio::spawn(async move { reconcile(&client, &ctx, &name).await })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }

        let claims = claims(&client).await;
        let ids: BTreeSet<u32> = claims.iter().map(|(id, _)| *id).collect();
        let uids: BTreeSet<&str> = claims.iter().map(|(_, uid)| uid.as_str()).collect();
        assert_eq!(ids, (200..=203).collect(), "round {round}: {claims:?}");
        assert_eq!(
            uids.len(),
            4,
            "round {round}: one claim per network: {claims:?}"
        );
        let mut recorded = BTreeSet::new();
        for name in &names {
            let id = status_id(&client, name).await.unwrap();
            assert!(
                recorded.insert(id.clone()),
                "round {round}: {id} recorded twice"
            );
        }
    }
}

#[tokio::test]
async fn full_range_reports_range_exhausted() {
    let client = fake_api(
        vec![
            network("a", "uid-a"),
            network("b", "uid-b"),
            network("c", "uid-c"),
        ],
        vec![],
    )
    .await;
    let ctx = context(&client, options(200, 201));
    for name in ["a", "b", "c"] {
        reconcile(&client, &ctx, name).await.unwrap();
    }
    let c = networks(&client).get("c").await.unwrap().status.unwrap();
    assert_eq!(c.id, None);
    assert_eq!(c.phase, NetworkPhase::Error);
    let allocated = c
        .conditions
        .iter()
        .find(|c| c.type_ == condition::ID_ALLOCATED)
        .unwrap();
    assert_eq!(allocated.status, "False");
    assert_eq!(allocated.reason, reason::RANGE_EXHAUSTED);
    assert_eq!(
        allocated.message,
        "all 2 network IDs in [200, 201] are taken"
    );
    assert_eq!(claims(&client).await.len(), 2);
}

/// The first NetworkId create lands on the server but the client sees an error (a timeout,
/// say); with `fail_claim_read`, the read that follows fails too.
fn lost_first_create(fail_claim_read: bool) -> Faults {
    let creates = Arc::new(AtomicU32::new(0));
    let read_armed = Arc::new(AtomicBool::new(false));
    let arm = read_armed.clone();
    Faults {
        lose_create_response: Some(Box::new(move |_| {
            (creates.fetch_add(1, Ordering::SeqCst) == 0).then(|| {
                arm.store(fail_claim_read, Ordering::SeqCst);
                FakeError::Internal("stream reset before response".into())
            })
        })),
        fail_get: Some(Box::new(move |_| {
            read_armed
                .swap(false, Ordering::SeqCst)
                .then(|| FakeError::Internal("connection refused".into()))
        })),
        ..Faults::default()
    }
}

#[tokio::test]
async fn lost_create_response_is_resolved_by_reading_the_claim() {
    let client = fake_api_with(
        vec![network("a", "uid-a")],
        vec![],
        lost_first_create(false),
    )
    .await;
    let ctx = context(&client, options(200, 299));
    reconcile(&client, &ctx, "a").await.unwrap();

    let claims = claims(&client).await;
    assert_eq!(claims.len(), 1, "no second ID was claimed: {claims:?}");
    assert_eq!(status_id(&client, "a").await, Some(claims[0].0.to_string()));
}

#[tokio::test]
async fn lost_create_response_is_found_by_label_on_the_next_reconcile() {
    let client = fake_api_with(vec![network("a", "uid-a")], vec![], lost_first_create(true)).await;
    let ctx = context(&client, options(200, 299));

    // Neither the create nor the read that should resolve it answered: abort, claim nothing else.
    assert!(reconcile(&client, &ctx, "a").await.is_err());
    let landed = claims(&client).await;
    assert_eq!(landed.len(), 1, "the create landed once: {landed:?}");
    assert_eq!(status_id(&client, "a").await, None);

    reconcile(&client, &ctx, "a").await.unwrap();
    assert_eq!(
        claims(&client).await,
        landed,
        "the landed claim is reused, not leaked"
    );
    assert_eq!(status_id(&client, "a").await, Some(landed[0].0.to_string()));
}

#[tokio::test]
async fn a_refused_create_aborts_instead_of_trying_the_next_id() {
    let creates = Arc::new(AtomicU32::new(0));
    let counter = creates.clone();
    let faults = Faults {
        refuse_create: Some(Box::new(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            Some(FakeError::InvalidRequest(
                "admission webhook denied the request".into(),
            ))
        })),
        ..Faults::default()
    };
    let client = fake_api_with(vec![network("a", "uid-a")], vec![], faults).await;
    let ctx = context(&client, options(200, 299));
    assert!(reconcile(&client, &ctx, "a").await.is_err());
    assert_eq!(creates.load(Ordering::SeqCst), 1);
    assert!(claims(&client).await.is_empty());
}

#[tokio::test]
async fn requested_ids_are_claimed_exactly_or_reported() {
    let mut wants_free = network("free", "uid-free");
    wants_free.spec.id = Some("250".to_owned());
    let mut wants_taken = network("taken", "uid-taken");
    wants_taken.spec.id = Some("210".to_owned());
    let mut wants_outside = network("outside", "uid-outside");
    wants_outside.spec.id = Some("5000".to_owned());
    let client = fake_api(
        vec![wants_free, wants_taken, wants_outside],
        vec![claim(210, "holder", "uid-holder")],
    )
    .await;
    let ctx = context(&client, options(200, 299));
    for name in ["free", "taken", "outside"] {
        reconcile(&client, &ctx, name).await.unwrap();
    }
    assert_eq!(status_id(&client, "free").await.as_deref(), Some("250"));

    for (name, expected_reason, fragment) in [
        ("taken", reason::ID_TAKEN, "held by network kubetun/holder"),
        (
            "outside",
            reason::ID_OUT_OF_RANGE,
            "outside the configured range [200, 299]",
        ),
    ] {
        let status = networks(&client).get(name).await.unwrap().status.unwrap();
        assert_eq!(status.phase, NetworkPhase::Error);
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::ID_ALLOCATED)
            .unwrap();
        assert_eq!(c.reason, expected_reason);
        assert!(c.message.contains(fragment), "{}", c.message);
    }
    assert_eq!(
        claims(&client).await,
        vec![(210, "uid-holder".to_owned()), (250, "uid-free".to_owned())]
    );
}

#[tokio::test]
async fn deletion_releases_the_id_and_the_finalizer() {
    let mut a = deleting(network("a", "uid-a"));
    a.status = Some(kubetun_crds::NetworkStatus {
        id: Some("220".to_owned()),
        ..Default::default()
    });
    let client = fake_api(
        vec![a],
        vec![claim(220, "a", "uid-a"), claim(221, "b", "uid-b")],
    )
    .await;
    let ctx = context(&client, options(200, 299));
    reconcile(&client, &ctx, "a").await.unwrap();
    assert_eq!(claims(&client).await, vec![(221, "uid-b".to_owned())]);
    let finalizers = networks(&client)
        .get_opt("a")
        .await
        .unwrap()
        .map(|n| n.finalizers().to_vec())
        .unwrap_or_default();
    assert!(!finalizers.contains(&FINALIZER.to_owned()));
}

#[tokio::test]
async fn release_leaves_an_id_reclaimed_by_another_network() {
    // a's ID 230 was collected and re-claimed by b; a's late release must not touch it.
    let mut a = deleting(network("a", "uid-a"));
    a.status = Some(kubetun_crds::NetworkStatus {
        id: Some("230".to_owned()),
        ..Default::default()
    });
    let client = fake_api(vec![a], vec![claim(230, "b", "uid-b")]).await;
    let ctx = context(&client, options(200, 299));
    reconcile(&client, &ctx, "a").await.unwrap();
    assert_eq!(claims(&client).await, vec![(230, "uid-b".to_owned())]);
}

#[tokio::test]
async fn surplus_claims_of_one_network_are_released() {
    let mut a = network("a", "uid-a");
    a.status = Some(kubetun_crds::NetworkStatus {
        id: Some("241".to_owned()),
        ..Default::default()
    });
    let client = fake_api(
        vec![a],
        vec![claim(240, "a", "uid-a"), claim(241, "a", "uid-a")],
    )
    .await;
    let ctx = context(&client, options(200, 299));
    reconcile(&client, &ctx, "a").await.unwrap();
    assert_eq!(claims(&client).await, vec![(241, "uid-a".to_owned())]);
    assert_eq!(status_id(&client, "a").await.as_deref(), Some("241"));
}

#[tokio::test]
async fn a_network_without_finalizer_gets_it_first() {
    // (Another finalizer is present: the fake cannot JSON-patch-test an absent list as null.)
    let mut a = network("a", "uid-a");
    a.metadata.finalizers = Some(vec!["example.com/other".to_owned()]);
    let client = fake_api(vec![a], vec![]).await;
    let ctx = context(&client, options(200, 299));
    reconcile(&client, &ctx, "a").await.unwrap();
    let a = networks(&client).get("a").await.unwrap();
    assert_eq!(
        a.finalizers(),
        ["example.com/other".to_owned(), FINALIZER.to_owned()]
    );
    assert!(
        claims(&client).await.is_empty(),
        "allocation waits for the finalizer"
    );
    reconcile(&client, &ctx, "a").await.unwrap();
    assert_eq!(claims(&client).await.len(), 1);
}

#[tokio::test]
async fn allocations_and_exhaustion_are_published_as_events_once() {
    use k8s_openapi::api::events::v1::Event;
    use kube::runtime::events::{Recorder, Reporter};

    let client = fake_api(vec![network("a", "uid-a"), network("b", "uid-b")], vec![]).await;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "kubetun-network".to_owned(),
            instance: Some("test".to_owned()),
        },
    );
    let ctx = Arc::new(
        kubetun_controller::operator::isolation::Context::new(
            client.clone(),
            &options(200, 200),
            ApiHealth::new(client.clone()),
        )
        .unwrap()
        .with_recorder(recorder),
    );
    for _ in 0..2 {
        reconcile(&client, &ctx, "a").await.unwrap();
        reconcile(&client, &ctx, "b").await.unwrap();
    }

    let events: kube::Api<Event> = kube::Api::namespaced(client.clone(), NS);
    let mut seen: Vec<(String, String, String)> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| {
            // A repeated publish would turn the event into a series.
            assert!(e.series.is_none(), "published more than once: {e:?}");
            (
                e.regarding.and_then(|r| r.name).unwrap_or_default(),
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (
                "a".to_owned(),
                "Normal".to_owned(),
                reason::ALLOCATED.to_owned()
            ),
            (
                "b".to_owned(),
                "Warning".to_owned(),
                reason::RANGE_EXHAUSTED.to_owned()
            ),
        ],
        "one event per change, none for unchanged outcomes"
    );
}

fn claimer(name: &str, uid: &str) -> ClaimRef {
    ClaimRef {
        group: GROUP.to_owned(),
        resource: "networks".to_owned(),
        namespace: NS.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
    }
}

/// Counts NetworkId creates that reach the API.
fn counting_creates() -> (Faults, Arc<AtomicU32>) {
    let creates = Arc::new(AtomicU32::new(0));
    let counter = creates.clone();
    let faults = Faults {
        refuse_create: Some(Box::new(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            None
        })),
        ..Faults::default()
    };
    (faults, creates)
}

#[tokio::test]
async fn attempts_are_bounded_and_wrap_around_the_range() {
    use kubetun_controller::operator::isolation::allocator::{AllocError, IdAllocator};
    use kubetun_controller::operator::isolation::ids::IdRange;

    let taken: Vec<NetworkId> = (200..=209)
        .map(|id| claim(id, "other", "uid-other"))
        .collect();
    let (faults, creates) = counting_creates();
    let client = fake_api_with(vec![], taken, faults).await;
    let range = IdRange::new(200, 299).unwrap();

    let bounded = IdAllocator::new(client.clone(), range, 3);
    let err = bounded
        .claim_any(&claimer("a", "uid-a"), 200, |_| false)
        .await
        .unwrap_err();
    assert!(
        matches!(err, AllocError::AttemptsExceeded { attempts: 3, .. }),
        "{err}"
    );
    assert_eq!(creates.load(Ordering::SeqCst), 3);

    // Starting near the end wraps to the beginning after 299.
    let wide = IdAllocator::new(client.clone(), range, 100);
    let high: Vec<NetworkId> = (298..=299)
        .map(|id| claim(id, "other", "uid-other"))
        .collect();
    for nid in high {
        network_ids(&client)
            .create(&Default::default(), &nid)
            .await
            .unwrap();
    }
    let id = wide
        .claim_any(&claimer("b", "uid-b"), 298, |_| false)
        .await
        .unwrap();
    assert_eq!(id, 210, "298 and 299 taken, then 200..=209 taken, then 210");
}

#[tokio::test]
async fn ids_known_taken_from_the_cache_cost_no_request() {
    use kubetun_controller::operator::isolation::allocator::IdAllocator;
    use kubetun_controller::operator::isolation::ids::IdRange;

    let (faults, creates) = counting_creates();
    let client = fake_api_with(vec![], vec![], faults).await;
    let allocator = IdAllocator::new(client, IdRange::new(200, 203).unwrap(), 1);
    // Only 203 looks vacant; with a budget of one create it must still be found.
    let id = allocator
        .claim_any(&claimer("a", "uid-a"), 200, |id| id != 203)
        .await
        .unwrap();
    assert_eq!(id, 203);
    assert_eq!(creates.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_unusable_range_is_refused_up_front() {
    use kubetun_controller::operator::isolation::NetworkError;
    let client = fake_api(vec![], vec![]).await;
    for (min, max) in [(0, 10), (300, 200), (1, 1 << 24)] {
        let err = kubetun_controller::operator::isolation::Context::new(
            client.clone(),
            &options(min, max),
            ApiHealth::new(client.clone()),
        )
        .unwrap_err();
        assert!(
            matches!(err, NetworkError::InvalidRange(_)),
            "{min}..={max}: {err}"
        );
    }
}
