//! The peering handshake through the Network reconciler: mutual peerings become Ready on both
//! sides, one-sided ones stay Pending, removing one side clears both, and the ACL follows.

use crate::network_common;

use ipnet::IpNet;
use kube::api::{ListParams, Patch, PatchParams};
use kubetun_controller::operator::isolation::acl_for_cluster;
use kubetun_controller::operator::isolation::peering::message;
use kubetun_crds::{Network, NetworkPeeringStatus, PeeringState};
use network_common::*;

async fn peerings(client: &kube::Client, name: &str) -> Vec<NetworkPeeringStatus> {
    networks(client)
        .get(name)
        .await
        .unwrap()
        .status
        .map(|s| s.peerings)
        .unwrap_or_default()
}

async fn all(client: &kube::Client) -> Vec<Network> {
    networks(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// Reconciles every named Network twice, so each side sees the other's allocated ID.
async fn settle(client: &kube::Client, names: &[&str]) {
    let ctx = context(client, options(200, 299));
    for _ in 0..2 {
        for name in names {
            reconcile(client, &ctx, name).await.unwrap();
        }
    }
}

fn rome_network() -> Network {
    let mut rome = with_prefixes(network("rome", "uid-rome"), &["10.70.0.0/16"]);
    rome.spec.cluster_id = Some("rome-cluster".to_owned());
    rome
}

#[tokio::test]
async fn mutual_peering_is_ready_on_both_sides_and_opens_the_acl() {
    let local = peering_to(
        with_prefixes(network("local", "uid-local"), &["10.1.0.0/16"]),
        "to-rome",
        "rome",
    );
    let rome = peering_to(rome_network(), "to-local", "local");
    let client = fake_api(vec![local, rome], vec![]).await;
    settle(&client, &["local", "rome"]).await;

    let local_side = peerings(&client, "local").await;
    assert_eq!(local_side.len(), 1);
    assert_eq!(local_side[0].state, PeeringState::Ready);
    assert_eq!(local_side[0].prefixes, ["10.70.0.0/16"]);
    assert_eq!(local_side[0].peer_uid.as_deref(), Some("uid-rome"));
    let rome_side = peerings(&client, "rome").await;
    assert_eq!(rome_side[0].state, PeeringState::Ready);
    assert_eq!(rome_side[0].prefixes, ["10.1.0.0/16"]);

    let expected: Vec<IpNet> = vec!["10.70.0.0/16".parse().unwrap()];
    assert_eq!(
        acl_for_cluster(&all(&client).await, "rome-cluster"),
        Some(expected)
    );
    assert_eq!(acl_for_cluster(&all(&client).await, "milan-cluster"), None);
}

#[tokio::test]
async fn one_sided_peering_stays_pending_and_the_acl_fails_closed() {
    let local = peering_to(network("local", "uid-local"), "to-rome", "rome");
    let client = fake_api(vec![local, rome_network()], vec![]).await;
    settle(&client, &["local", "rome"]).await;

    let local_side = peerings(&client, "local").await;
    assert_eq!(local_side[0].state, PeeringState::Pending);
    assert_eq!(local_side[0].message, message::NOT_REFERENCED);
    assert!(peerings(&client, "rome").await.is_empty());
    assert_eq!(
        acl_for_cluster(&all(&client).await, "rome-cluster"),
        Some(vec![])
    );
}

#[tokio::test]
async fn removing_one_side_clears_both() {
    let local = peering_to(network("local", "uid-local"), "to-rome", "rome");
    let rome = peering_to(rome_network(), "to-local", "local");
    let client = fake_api(vec![local, rome], vec![]).await;
    settle(&client, &["local", "rome"]).await;
    assert!(
        acl_for_cluster(&all(&client).await, "rome-cluster").is_some_and(|acl| !acl.is_empty())
    );

    // rome drops its peering; both Networks are reconciled (the reverse lookup requeues local).
    networks(&client)
        .patch(
            "rome",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"peerings": []}})),
        )
        .await
        .unwrap();
    settle(&client, &["rome", "local"]).await;

    assert!(peerings(&client, "rome").await.is_empty());
    let local_side = peerings(&client, "local").await;
    assert_eq!(local_side[0].state, PeeringState::Pending);
    assert!(local_side[0].prefixes.is_empty());
    assert_eq!(
        acl_for_cluster(&all(&client).await, "rome-cluster"),
        Some(vec![])
    );
}

#[tokio::test]
async fn a_missing_peer_does_not_hide_the_others() {
    let local = peering_to(
        peering_to(network("local", "uid-local"), "a-gone", "gone"),
        "b-rome",
        "rome",
    );
    let rome = peering_to(rome_network(), "to-local", "local");
    let client = fake_api(vec![local, rome], vec![]).await;
    settle(&client, &["local", "rome"]).await;

    let local_side = peerings(&client, "local").await;
    let states: Vec<(&str, PeeringState)> = local_side
        .iter()
        .map(|p| (p.name.as_str(), p.state))
        .collect();
    assert_eq!(
        states,
        [
            ("a-gone", PeeringState::Pending),
            ("b-rome", PeeringState::Ready)
        ]
    );
}
