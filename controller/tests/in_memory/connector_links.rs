//! The connector against in-memory clusters running the real controller: linking, the status
//! mirror, idempotency, disconnect/reset scope, foreign objects, unreachable clusters and
//! timeouts.

use crate::connector_support;

use std::collections::BTreeMap;
use std::time::Duration;

use connector_support::{Cluster, Controllers, NAMESPACE, Recorder, quick, settle};
use kube::api::{ObjectMeta, PostParams};
use kubetun_controller::connector::{self, CidrKind, ConnectError, Connector};
use kubetun_crds::contract::link::{MANAGED_BY_CONNECTOR, MANAGED_BY_LABEL, PEER_LABEL};
use kubetun_crds::{ConnectionState, Endpoint, NetworkConfig};

async fn europe_and_rome() -> (Cluster, Cluster) {
    (
        Cluster::start("europe", "Europe", "10.200.0.0/16", "10.70.0.0/16").await,
        Cluster::start("rome", "Rome", "10.202.0.0/16", "10.70.0.0/16").await,
    )
}

fn connector(local: &Cluster, remote: &Cluster) -> Connector {
    Connector::new(local.handle("local"), remote.handle("remote"))
}

#[tokio::test]
async fn connect_links_both_clusters_and_mirrors_each_view_back() {
    let (europe, rome) = europe_and_rome().await;
    let _controllers = Controllers::run(&[&europe, &rome]);
    let progress = Recorder::default();

    let state = connector(&europe, &rome)
        .connect(quick(true), &progress)
        .await
        .unwrap();
    assert!(state.is_processed() && state.is_connected());

    // Each side's outgoing config carries, in its status, exactly how the peer processed it.
    for (origin, peer) in [(&europe, &rome), (&rome, &europe)] {
        let outgoing = origin.config(&format!("to-{}", peer.id())).await.unwrap();
        let incoming = peer.config(&format!("from-{}", origin.id())).await.unwrap();
        assert_eq!(outgoing.spec, incoming.spec);
        let (mirror, source) = (outgoing.status.unwrap(), incoming.status.unwrap());
        assert!(mirror.processed);
        assert_eq!(mirror.pod_cidrs, source.pod_cidrs);
        assert_eq!(mirror.external_cidrs, source.external_cidrs);
        let labels = outgoing.metadata.labels.unwrap();
        assert_eq!(
            labels.get(MANAGED_BY_LABEL).map(String::as_str),
            Some(MANAGED_BY_CONNECTOR)
        );
        assert_eq!(labels.get(PEER_LABEL).map(String::as_str), Some(peer.id()));
    }

    // Identical external CIDRs: each side remaps the other's; pod CIDRs stay as they are.
    let europe_view = &state.local_to_remote;
    assert_eq!(europe_view.pod_cidrs[0].view, "10.202.0.0/16");
    assert_eq!(europe_view.external_cidrs[0].real, "10.70.0.0/16");
    assert_ne!(europe_view.external_cidrs[0].view, "10.70.0.0/16");
    let te = europe.endpoint("rome").await.unwrap();
    assert_eq!(te.spec.remote_external_cidrs, europe_view.external_cidrs);
    assert_eq!(
        te.status.unwrap().connection.unwrap().status,
        ConnectionState::Connected
    );

    // Progress names each side.
    let lines = progress.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("done (local) created NetworkConfig kubetun-system/to-rome"))
    );
    assert!(
        lines.iter().any(
            |l| l.starts_with("done (remote) created NetworkConfig kubetun-system/from-europe")
        )
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("waited (local) tunnel connected")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with(
            "waited (remote) processed: rome sees europe as 10.200.0.0/16, 10.70.0.0/16 → "
        )),
        "{lines:#?}"
    );
}

#[tokio::test]
async fn connecting_twice_writes_nothing() {
    let (europe, rome) = europe_and_rome().await;
    {
        let _controllers = Controllers::run(&[&europe, &rome]);
        connector(&europe, &rome)
            .connect(quick(true), &Recorder::default())
            .await
            .unwrap();
    }
    // Let both controllers finish whatever the last pass started, then freeze the clusters.
    settle(&[&europe, &rome], 3).await;
    let versions = |c: &Cluster| {
        let api = c.configs();
        async move {
            let list = api.list(&Default::default()).await.unwrap();
            list.items
                .into_iter()
                .map(|nc| {
                    (
                        nc.metadata.name.unwrap(),
                        nc.metadata.resource_version.unwrap(),
                    )
                })
                .collect::<BTreeMap<_, _>>()
        }
    };
    let before = (versions(&europe).await, versions(&rome).await);
    let writes_before = (europe.writes(), rome.writes());

    let progress = Recorder::default();
    let state = connector(&europe, &rome)
        .connect(quick(true), &progress)
        .await
        .unwrap();

    assert_eq!(state.writes, 0, "{:#?}", progress.lines());
    assert_eq!((europe.writes(), rome.writes()), writes_before);
    assert_eq!((versions(&europe).await, versions(&rome).await), before);
    // One verbose pass reports each of the four NetworkConfigs once; waits stay quiet.
    let unchanged = progress
        .lines()
        .iter()
        .filter(|l| l.ends_with("up to date"))
        .count();
    assert_eq!(unchanged, 4, "{:#?}", progress.lines());
}

#[tokio::test]
async fn a_changed_endpoint_is_applied_on_the_next_connect() {
    let (europe, rome) = europe_and_rome().await;
    let _controllers = Controllers::run(&[&europe, &rome]);
    connector(&europe, &rome)
        .connect(quick(false), &Recorder::default())
        .await
        .unwrap();

    let mut remote = rome.handle("remote");
    remote.endpoint_override = Some(Endpoint {
        address: "198.51.100.7".into(),
        port: 31820,
    });
    let progress = Recorder::default();
    Connector::new(europe.handle("local"), remote)
        .connect(quick(true), &progress)
        .await
        .unwrap();

    for (cluster, name) in [(&rome, "to-europe"), (&europe, "from-rome")] {
        let nc = cluster.config(name).await.unwrap();
        assert_eq!(nc.spec.endpoint.to_string(), "198.51.100.7:31820", "{name}");
    }
    assert_eq!(
        europe.endpoint("rome").await.unwrap().spec.endpoint.port,
        31820
    );
    assert!(
        progress
            .lines()
            .iter()
            .any(|l| l.contains("updated NetworkConfig kubetun-system/from-rome"))
    );
}

#[tokio::test]
async fn disconnect_removes_exactly_the_link_and_keeps_other_peers() {
    let europe = Cluster::start("europe", "Europe", "10.200.0.0/16", "10.70.0.0/16").await;
    let rome = Cluster::start("rome", "Rome", "10.202.0.0/16", "10.70.0.0/16").await;
    let milan = Cluster::start("milan", "Milan", "10.203.0.0/16", "10.70.0.0/16").await;
    let _controllers = Controllers::run(&[&europe, &rome, &milan]);
    connector(&europe, &rome)
        .connect(quick(true), &Recorder::default())
        .await
        .unwrap();
    connector(&europe, &milan)
        .connect(quick(true), &Recorder::default())
        .await
        .unwrap();
    let milan_link = europe.config("to-milan").await.unwrap().spec;

    let [on_europe, on_rome] = connector(&europe, &rome)
        .disconnect(quick(true), &Recorder::default())
        .await
        .unwrap();

    assert_eq!(
        on_europe.objects,
        [
            "NetworkConfig kubetun-system/from-rome",
            "NetworkConfig kubetun-system/to-rome"
        ]
    );
    assert_eq!(on_rome.objects.len(), 2);
    assert_eq!(europe.config_names().await, ["from-milan", "to-milan"]);
    assert!(rome.config_names().await.is_empty());
    assert!(europe.endpoint("rome").await.is_none());
    assert!(rome.endpoint("europe").await.is_none());
    assert_eq!(europe.config("to-milan").await.unwrap().spec, milan_link);
    assert!(europe.endpoint("milan").await.is_some());

    // Nothing left to remove: a second disconnect succeeds and deletes nothing.
    let again = connector(&europe, &rome)
        .disconnect(quick(false), &Recorder::default())
        .await
        .unwrap();
    assert!(again.iter().all(|r| r.objects.is_empty()));
}

#[tokio::test]
async fn a_foreign_object_in_the_way_is_reported_and_left_alone() {
    let (europe, rome) = europe_and_rome().await;
    let foreign = NetworkConfig {
        metadata: ObjectMeta {
            name: Some("to-rome".into()),
            namespace: Some(NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        spec: europe.info.network_config_for(&rome.info.cluster),
        status: None,
    };
    europe
        .configs()
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let version = europe
        .config("to-rome")
        .await
        .unwrap()
        .metadata
        .resource_version;

    let error = connector(&europe, &rome)
        .sync(&Recorder::default())
        .await
        .unwrap_err();
    assert!(matches!(error, ConnectError::NotManaged { .. }), "{error}");
    let message = connector::error_chain(&error);
    assert!(message.contains("(local, cluster europe)"), "{message}");
    assert!(
        message.contains("NetworkConfig kubetun-system/to-rome"),
        "{message}"
    );
    assert_eq!(
        europe
            .config("to-rome")
            .await
            .unwrap()
            .metadata
            .resource_version,
        version
    );

    // Disconnect does not touch it either: it only deletes what the connector labelled.
    connector(&europe, &rome)
        .disconnect(quick(false), &Recorder::default())
        .await
        .unwrap();
    assert!(europe.config("to-rome").await.is_some());
}

#[tokio::test]
async fn an_unreachable_cluster_is_named_and_reset_cleans_the_reachable_side() {
    let (europe, rome) = europe_and_rome().await;
    {
        let _controllers = Controllers::run(&[&europe, &rome]);
        connector(&europe, &rome)
            .connect(quick(true), &Recorder::default())
            .await
            .unwrap();
    }
    rome.set_unreachable(true);

    let error = connector(&europe, &rome)
        .connect(quick(false), &Recorder::default())
        .await
        .unwrap_err();
    let message = connector::error_chain(&error);
    assert!(
        message.starts_with("(remote) cannot read kubetun's cluster info"),
        "{message}"
    );
    assert!(message.contains("connection refused"), "{message}");

    let progress = Recorder::default();
    let removed = connector::reset(
        &europe.handle("local"),
        &rome.handle("remote"),
        [Some("rome"), None],
        &progress,
    )
    .await
    .unwrap();
    let on_europe = removed[0].as_ref().unwrap();
    assert_eq!(
        on_europe.objects[..2],
        [
            "NetworkConfig kubetun-system/from-rome",
            "NetworkConfig kubetun-system/to-rome",
        ]
    );
    assert!(europe.endpoint("rome").await.is_none());
    assert!(removed[1].is_none());
    assert!(
        progress
            .lines()
            .iter()
            .any(|l| l.starts_with("failed (remote) skipped"))
    );
    assert!(europe.config_names().await.is_empty());

    // Rome comes back: reset cleans its side too.
    rome.set_unreachable(false);
    connector::reset(
        &europe.handle("local"),
        &rome.handle("remote"),
        [None, None],
        &Recorder::default(),
    )
    .await
    .unwrap();
    assert!(rome.config_names().await.is_empty());
    assert!(rome.endpoint("europe").await.is_none());
}

#[tokio::test]
async fn reset_without_a_way_to_know_the_peer_fails_with_the_reason() {
    let (europe, rome) = europe_and_rome().await;
    rome.set_unreachable(true);
    let error = connector::reset(
        &europe.handle("local"),
        &rome.handle("remote"),
        [None, None],
        &Recorder::default(),
    )
    .await
    .unwrap_err();
    let message = connector::error_chain(&error);
    assert!(
        message.contains("peer's cluster id is unknown"),
        "{message}"
    );
    assert!(message.contains("(remote) cannot read"), "{message}");
}

#[tokio::test]
async fn waiting_without_a_controller_times_out_naming_the_cluster() {
    let (europe, rome) = europe_and_rome().await;
    let options = connector::WaitOptions {
        timeout: Duration::from_millis(200),
        ..quick(false)
    };
    let progress = Recorder::default();
    let error = connector(&europe, &rome)
        .connect(options, &progress)
        .await
        .unwrap_err();
    assert!(matches!(error, ConnectError::Timeout { .. }), "{error}");
    let message = connector::error_chain(&error);
    assert!(
        message.starts_with("(remote, cluster rome) timed out"),
        "{message}"
    );
    assert!(message.contains("NetworkConfig not processed"), "{message}");
    assert!(
        progress
            .lines()
            .last()
            .unwrap()
            .starts_with("failed (remote)")
    );
}

#[tokio::test]
async fn a_rejected_network_config_fails_fast_with_the_reason() {
    let (europe, rome) = europe_and_rome().await;
    // Rome announces a pod CIDR with host bits set: Europe refuses it.
    let mut broken = rome.info.clone();
    broken.pod_cidrs = vec!["10.202.0.1/16".parse().unwrap()];
    broken.publish(&rome.client, NAMESPACE).await.unwrap();
    let _controllers = Controllers::run(&[&europe, &rome]);

    let error = connector(&europe, &rome)
        .connect(quick(true), &Recorder::default())
        .await
        .unwrap_err();
    let message = connector::error_chain(&error);
    assert!(matches!(error, ConnectError::Rejected { .. }), "{message}");
    assert!(
        message
            .starts_with("(local, cluster europe) rejected NetworkConfig kubetun-system/from-rome"),
        "{message}"
    );
}

#[tokio::test]
async fn status_lists_every_link_with_views_state_and_what_a_pending_one_waits_for() {
    let europe = Cluster::start("europe", "Europe", "10.200.0.0/16", "10.70.0.0/16").await;
    let rome = Cluster::start("rome", "Rome", "10.202.0.0/16", "10.70.0.0/16").await;
    let milan = Cluster::start("milan", "Milan", "10.203.0.0/16", "10.70.0.0/16").await;
    {
        let _controllers = Controllers::run(&[&europe, &rome]);
        connector(&europe, &rome)
            .connect(quick(true), &Recorder::default())
            .await
            .unwrap();
    }
    // Milan's controller is not running: its link stays half-way.
    connector(&europe, &milan)
        .sync(&Recorder::default())
        .await
        .unwrap();

    let links = connector::link_statuses(&europe.handle("local"))
        .await
        .unwrap();
    let peers: Vec<&str> = links.iter().map(|l| l.peer.id.as_str()).collect();
    assert_eq!(peers, ["milan", "rome"]);

    let milan_link = &links[0];
    assert!(milan_link.connection.is_none());
    assert_eq!(
        milan_link.pending.as_deref(),
        Some("waiting for the peer to process our NetworkConfig")
    );
    assert!(milan_link.local_cidrs.is_empty() && milan_link.remote_cidrs.is_empty());

    let rome_link = &links[1];
    assert_eq!(rome_link.peer.name, "Rome");
    assert_eq!(
        rome_link.endpoint.as_ref().unwrap().to_string(),
        "rome.gateway.example:51820"
    );
    assert_eq!(
        rome_link.connection.as_ref().unwrap().status,
        ConnectionState::Connected
    );
    let find = |cidrs: &[(CidrKind, kubetun_crds::CidrMapping)], kind: CidrKind| {
        cidrs
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, m)| m.clone())
            .unwrap()
    };
    // How Rome sees Europe: pods as they are, the shared external CIDR remapped.
    assert!(!find(&rome_link.local_cidrs, CidrKind::Pod).is_remapped());
    assert!(find(&rome_link.local_cidrs, CidrKind::External).is_remapped());
    // How Europe sees Rome.
    assert_eq!(
        find(&rome_link.remote_cidrs, CidrKind::Pod).real,
        "10.202.0.0/16"
    );
    assert!(find(&rome_link.remote_cidrs, CidrKind::External).is_remapped());

    let rendered = kubetun_cli::network::render_link(rome_link);
    assert!(rendered.starts_with("Peer rome (Rome)\n"), "{rendered}");
    assert!(rendered.contains("connection:     Connected"), "{rendered}");
}
