//! Multi-cluster scenarios against in-memory API servers and fake gateways: the seed
//! topology, deletion and re-creation, restarts of the controller and of the gateway.

use crate::controller_support;

use std::time::Duration;

use controller_support::{Cluster, announce, connect, settle};
use kube::api::DeleteParams;
use kubetun_controller::operator::network_config::GatewaySync;
use kubetun_controller::plumbing::conditions;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_crds::ConnectionState;

/// Europe (hub), Rome and Milan: every cluster uses external CIDR 10.70.0.0/16.
async fn seed_topology() -> (Cluster, Cluster, Cluster) {
    let europe = Cluster::start("europe", "10.200.0.0/16", "10.70.0.0/16").await;
    let rome = Cluster::start("rome", "10.202.0.0/16", "10.70.0.0/16").await;
    let milan = Cluster::start("milan", "10.203.0.0/16", "10.70.0.0/16").await;
    connect(&europe, &rome).await;
    connect(&europe, &milan).await;
    (europe, rome, milan)
}

#[tokio::test]
async fn seed_topology_keeps_pod_cidrs_and_remaps_identical_external_cidrs() {
    let (europe, rome, milan) = seed_topology().await;

    // Europe keeps the leaves' pod CIDRs and remaps both identical external CIDRs apart.
    assert_eq!(
        europe.view_of("rome", "10.202.0.0/16").await.as_deref(),
        Some("10.202.0.0/16")
    );
    assert_eq!(
        europe.view_of("milan", "10.203.0.0/16").await.as_deref(),
        Some("10.203.0.0/16")
    );
    let rome_ext = europe.view_of("rome", "10.70.0.0/16").await.unwrap();
    let milan_ext = europe.view_of("milan", "10.70.0.0/16").await.unwrap();
    assert_ne!(rome_ext, "10.70.0.0/16");
    assert_ne!(milan_ext, "10.70.0.0/16");
    assert_ne!(rome_ext, milan_ext);
    assert!(rome_ext.ends_with("/16") && milan_ext.ends_with("/16"));

    // Each leaf sees Europe's pod CIDR as is and its external CIDR remapped.
    assert_eq!(
        rome.view_of("europe", "10.200.0.0/16").await.as_deref(),
        Some("10.200.0.0/16")
    );
    assert_ne!(
        rome.view_of("europe", "10.70.0.0/16").await.as_deref(),
        Some("10.70.0.0/16")
    );
    assert!(milan.view_of("europe", "10.70.0.0/16").await.is_some());

    // Europe's TunnelEndpoint for Rome merges both sides.
    let te = europe.endpoint("rome").await.unwrap();
    assert_eq!(te.spec.public_key, rome.key.public_base64());
    assert_eq!(te.spec.remote_external_cidrs[0].view, rome_ext);
    let rome_view_of_europe_ext = rome.view_of("europe", "10.70.0.0/16").await.unwrap();
    assert_eq!(
        te.spec.local_external_cidrs[0].view,
        rome_view_of_europe_ext
    );
    assert_eq!(te.spec.endpoint.to_string(), "rome.gateway.example:51820");

    // The gateway runs both peers with real -> view routes, and reports them connected.
    let state = europe.gateway.current().unwrap();
    let names: Vec<_> = state.peers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["milan", "rome"]);
    let rome_peer = &state.peers[1];
    assert!(
        rome_peer
            .routes
            .iter()
            .any(|r| r.real == "10.70.0.0/16" && r.view == rome_ext)
    );
    assert!(
        rome_peer
            .routes
            .iter()
            .any(|r| r.real == "10.202.0.0/16" && r.view == "10.202.0.0/16")
    );
    let status = te.status.unwrap();
    assert_eq!(
        status.connection.unwrap().status,
        ConnectionState::Connected
    );
    assert!(conditions::is_true(
        &status.conditions,
        kubetun_crds::contract::link::APPLIED
    ));
    assert!(conditions::is_true(
        &status.conditions,
        kubetun_crds::contract::link::CONNECTED
    ));

    // Leaves have a single peer each: the hub.
    assert_eq!(rome.gateway.current().unwrap().peers.len(), 1);
    assert_eq!(milan.gateway.current().unwrap().peers.len(), 1);
}

#[tokio::test]
async fn a_quiet_pass_changes_nothing_and_applies_nothing() {
    let (europe, _rome, _milan) = seed_topology().await;
    let applies = europe.gateway.applied().len();
    let before = europe.configs().get("from-rome").await.unwrap();
    let report = europe.sync().await;
    let after = europe.configs().get("from-rome").await.unwrap();
    assert_eq!(
        before.metadata.resource_version,
        after.metadata.resource_version
    );
    assert_eq!(europe.gateway.applied().len(), applies);
    assert!(!report.gateway.unwrap().applied);
    assert_eq!(report.tunnel_endpoints, ["milan", "rome"]);
    assert_eq!(report.processed, ["from-milan", "from-rome"]);
}

#[tokio::test]
async fn deleting_a_peer_releases_its_views_and_recreating_it_restores_the_link() {
    let (europe, rome, milan) = seed_topology().await;
    let rome_ext = europe.view_of("rome", "10.70.0.0/16").await.unwrap();

    europe
        .configs()
        .delete("from-rome", &DeleteParams::default())
        .await
        .unwrap();
    let report = europe.sync().await;
    assert_eq!(report.released, ["rome"]);
    assert!(europe.endpoint("rome").await.is_none());
    let names: Vec<_> = europe
        .gateway
        .current()
        .unwrap()
        .peers
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names, ["milan"]);
    assert!(europe.ctx.ipam().allocations().all(|a| a.owner != "rome"));

    // The freed block goes to the next peer that needs one; Rome coming back gets a view again.
    announce(&rome, &europe).await;
    settle(&[&europe, &rome, &milan]).await;
    let again = europe.view_of("rome", "10.70.0.0/16").await.unwrap();
    assert_eq!(
        again, rome_ext,
        "best-fit is deterministic: the same hole is reused"
    );
    assert!(europe.endpoint("rome").await.is_some());
    assert_eq!(europe.gateway.current().unwrap().peers.len(), 2);
}

#[tokio::test]
async fn controller_restart_rebuilds_identical_views_from_the_api() {
    let (mut europe, rome, milan) = seed_topology().await;
    let before: Vec<_> = europe
        .ctx
        .ipam()
        .allocations()
        .map(|a| (a.owner.to_owned(), a.real, a.view))
        .collect();
    let applies = europe.gateway.applied().len();

    europe.restart_controller().await;
    let after: Vec<_> = europe
        .ctx
        .ipam()
        .allocations()
        .map(|a| (a.owner.to_owned(), a.real, a.view))
        .collect();
    assert_eq!(before, after);
    assert_eq!(before.len(), 4);

    // The restarted controller keeps every status and the gateway state as they were.
    let status_before = europe.status_of("from-milan").await;
    settle(&[&europe, &rome, &milan]).await;
    assert_eq!(europe.status_of("from-milan").await, status_before);
    assert_eq!(
        europe.gateway.applied().len(),
        applies,
        "the gateway already runs the state"
    );
}

#[tokio::test]
async fn restarted_gateway_is_reapplied_by_sync_once() {
    let (mut europe, _rome, _milan) = seed_topology().await;
    let version = europe.gateway.current().unwrap().version;
    europe.gateway.restart().await.unwrap();
    assert!(europe.gateway.current().is_none());
    let report = europe.sync().await;
    assert!(report.gateway.unwrap().applied);
    assert_eq!(europe.gateway.current().unwrap().version, version);
}

#[tokio::test]
async fn restarted_gateway_is_reapplied_by_the_watch_loop_within_two_seconds() {
    let (mut europe, _rome, _milan) = seed_topology().await;
    let version = europe.gateway.current().unwrap().version;
    let sync = GatewaySync::new(
        europe.ctx.clone(),
        GatewayClient::new(europe.gateway.socket()),
    );
    let task = tokio::spawn(sync.run());
    tokio::time::sleep(Duration::from_millis(300)).await;

    europe.gateway.restart().await.unwrap();
    let started = tokio::time::Instant::now();
    loop {
        if europe
            .gateway
            .current()
            .is_some_and(|s| s.version == version)
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "not re-applied within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A gateway that stays down shows up in the TunnelEndpoint status.
    europe.gateway.stop().await;
    let started = tokio::time::Instant::now();
    loop {
        let te = europe.endpoint("rome").await.unwrap();
        let connection = te.status.and_then(|s| s.connection).unwrap();
        if connection.status == ConnectionState::Error && connection.message.contains("unavailable")
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "gateway outage not reported: {connection:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
}

#[tokio::test]
async fn a_rejected_state_is_reported_on_every_tunnel_endpoint() {
    let (mut europe, _rome, _milan) = seed_topology().await;
    europe.gateway.restart().await.unwrap();
    europe.gateway.reject_with(Some(
        "peer milan: view 10.201.0.0/16 overlaps a local route",
    ));
    let report = europe.sync().await;
    assert!(
        report
            .gateway
            .unwrap()
            .error
            .unwrap()
            .contains("overlaps a local route")
    );
    let status = europe.endpoint("milan").await.unwrap().status.unwrap();
    let applied =
        conditions::find(&status.conditions, kubetun_crds::contract::link::APPLIED).unwrap();
    assert_eq!(applied.status, "False");
    assert_eq!(applied.reason, "Rejected");
    assert!(applied.message.contains("overlaps a local route"));
}
