//! Invalid NetworkConfigs end in a `Processed=False` condition a person can act on, never in
//! a TunnelEndpoint; fixing the spec recovers.

use crate::controller_support;

use controller_support::{Cluster, announce, announce_spec, labelled, put, settle};
use kubetun_controller::ipam::IpamConfig;
use kubetun_controller::planner::remote_config_name;
use kubetun_controller::plumbing::conditions;
use kubetun_crds::contract::link::ROLE_REMOTE;
use kubetun_crds::{Condition, NetworkConfigSpec};

async fn processed_condition(cluster: &Cluster, name: &str) -> Condition {
    let status = cluster.status_of(name).await;
    assert!(
        !status.processed
            || conditions::is_true(&status.conditions, kubetun_crds::contract::link::PROCESSED)
    );
    conditions::find(&status.conditions, kubetun_crds::contract::link::PROCESSED)
        .cloned()
        .unwrap_or_else(|| panic!("{name} has no Processed condition"))
}

/// Europe and Rome where Rome announces `spec` instead of its real info.
async fn europe_receiving(edit: impl FnOnce(&mut NetworkConfigSpec)) -> (Cluster, Cluster) {
    let europe = Cluster::start("europe", "10.200.0.0/16", "10.70.0.0/16").await;
    let rome = Cluster::start("rome", "10.202.0.0/16", "10.70.0.0/16").await;
    announce(&europe, &rome).await;
    let mut spec = rome.info.network_config_for(&europe.info.cluster);
    edit(&mut spec);
    announce_spec(&rome, &europe, spec).await;
    settle(&[&europe, &rome]).await;
    (europe, rome)
}

async fn assert_rejected(europe: &Cluster, reason: &str, message_part: &str) {
    let condition = processed_condition(europe, "from-rome").await;
    assert_eq!(condition.status, "False");
    assert_eq!(condition.reason, reason);
    assert!(
        condition.message.contains(message_part),
        "{}",
        condition.message
    );
    assert!(!europe.status_of("from-rome").await.processed);
    assert!(europe.endpoint("rome").await.is_none());
    assert!(europe.gateway.current().unwrap().peers.is_empty());
    assert!(europe.ctx.ipam().allocations().all(|a| a.owner != "rome"));
}

#[tokio::test]
async fn a_cidr_with_host_bits_is_rejected_with_the_fix_in_the_message() {
    let (europe, rome) =
        europe_receiving(|spec| spec.pod_cidrs = vec!["10.202.7.1/16".into()]).await;
    assert_rejected(&europe, "InvalidCIDR", "did you mean 10.202.0.0/16?").await;

    // Fixing the spec recovers without any other intervention.
    announce(&rome, &europe).await;
    settle(&[&europe, &rome]).await;
    assert!(conditions::is_true(
        &europe.status_of("from-rome").await.conditions,
        kubetun_crds::contract::link::PROCESSED
    ));
    assert!(europe.endpoint("rome").await.is_some());

    // Breaking a working peer tears the link down and frees its views.
    let mut spec = rome.info.network_config_for(&europe.info.cluster);
    spec.external_cidrs = vec!["10.70.0.0/33".into()];
    announce_spec(&rome, &europe, spec).await;
    settle(&[&europe, &rome]).await;
    assert_rejected(
        &europe,
        "InvalidCIDR",
        "spec.externalCIDRs entry \"10.70.0.0/33\"",
    )
    .await;
}

#[tokio::test]
async fn a_config_for_another_cluster_is_rejected() {
    let (europe, _rome) =
        europe_receiving(|spec| spec.destination_cluster.id = "paris".into()).await;
    assert_rejected(
        &europe,
        "WrongDestination",
        "\"paris\" but this cluster is \"europe\"",
    )
    .await;
}

#[tokio::test]
async fn a_malformed_public_key_is_rejected() {
    let (europe, _rome) = europe_receiving(|spec| spec.public_key = "!".repeat(44)).await;
    assert_rejected(&europe, "InvalidPublicKey", "spec.publicKey").await;
}

#[tokio::test]
async fn overlap_with_the_local_pod_cidr_without_room_to_remap_is_pool_exhaustion() {
    // Europe's only pool is its own pod CIDR: nothing is left to remap Rome's copy of it to.
    let europe = Cluster::start_with(
        "europe",
        "10.200.0.0/16",
        "10.70.0.0/16",
        IpamConfig {
            pools: vec!["10.200.0.0/16".parse().unwrap()],
            reserved: vec![],
        },
    )
    .await;
    let rome = Cluster::start("rome", "10.200.0.0/16", "10.70.0.0/16").await;
    announce(&europe, &rome).await;
    announce(&rome, &europe).await;
    settle(&[&europe, &rome]).await;
    assert_rejected(
        &europe,
        "PoolExhausted",
        "10.200.0.0/16 overlaps 10.200.0.0/16",
    )
    .await;
    let condition = processed_condition(&europe, "from-rome").await;
    assert!(
        condition.message.contains("add a pool"),
        "{}",
        condition.message
    );
    // Rome has room and processed Europe fine; the link just is not complete.
    assert!(rome.status_of("from-europe").await.processed);
}

#[tokio::test]
async fn a_config_not_named_after_its_sender_is_rejected_and_cannot_release_the_real_peer() {
    let europe = Cluster::start("europe", "10.200.0.0/16", "10.70.0.0/16").await;
    let rome = Cluster::start("rome", "10.202.0.0/16", "10.70.0.0/16").await;
    announce(&europe, &rome).await;
    announce(&rome, &europe).await;
    settle(&[&europe, &rome]).await;
    let view = europe.view_of("rome", "10.70.0.0/16").await.unwrap();

    // Someone copies Rome's spec under another peer's name.
    let spec = rome.info.network_config_for(&europe.info.cluster);
    put(
        &europe.configs(),
        &labelled(remote_config_name("milan"), ROLE_REMOTE, "milan", spec),
    )
    .await;
    europe.sync().await;
    let condition = processed_condition(&europe, "from-milan").await;
    assert_eq!(condition.reason, "InvalidSource");
    assert!(
        condition.message.contains("must be named \"from-rome\""),
        "{}",
        condition.message
    );

    europe
        .configs()
        .delete("from-milan", &Default::default())
        .await
        .unwrap();
    europe.sync().await;
    assert_eq!(europe.view_of("rome", "10.70.0.0/16").await.unwrap(), view);
    assert!(europe.ctx.ipam().allocations().any(|a| a.owner == "rome"));
    assert!(europe.endpoint("rome").await.is_some());
}
