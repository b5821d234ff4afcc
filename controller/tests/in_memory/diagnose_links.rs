//! `kubetun diagnose` against in-memory clusters running the real controller: what
//! `collect` reads from two linked clusters passes every hop, and the report names the hop
//! that a disconnected side, a deleted TunnelEndpoint or an unreachable API server breaks.

use crate::connector_support;

use std::time::{SystemTime, UNIX_EPOCH};

use connector_support::{Cluster, Controllers, Recorder, quick};
use kube::api::DeleteParams;
use kubetun_cli::diagnose::{self, Outcome, Report};
use kubetun_controller::connector::Connector;

fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

async fn run(local: &Cluster, remote: &Cluster) -> Report {
    let l = diagnose::collect(&local.handle("local")).await;
    let r = diagnose::collect(&remote.handle("remote")).await;
    diagnose::diagnose(&l, Some(&r), None, now())
}

fn first_broken(report: &Report) -> Option<(String, String)> {
    report.broken().map(|c| (c.cluster.clone(), c.hop.clone()))
}

#[tokio::test]
async fn linked_clusters_pass_and_each_break_is_named() {
    let europe = Cluster::start("europe", "Europe", "10.200.0.0/16", "10.70.0.0/16").await;
    let rome = Cluster::start("rome", "Rome", "10.202.0.0/16", "10.70.0.0/16").await;
    let controllers = Controllers::run(&[&europe, &rome]);
    Connector::new(europe.handle("local"), rome.handle("remote"))
        .connect(quick(true), &Recorder::default())
        .await
        .unwrap();

    let report = run(&europe, &rome).await;
    assert_eq!(first_broken(&report), None, "{}", diagnose::render(&report));
    // The remap tables were compared from both ends (10.70.0.0/16 is remapped both ways).
    let remaps: Vec<_> = report.checks.iter().filter(|c| c.hop == "remap").collect();
    assert_eq!(remaps.len(), 2);
    assert!(remaps.iter().all(|c| c.outcome == Outcome::Ok));
    // The in-memory clusters have no route agent: a warning, not a break.
    assert!(
        report
            .checks
            .iter()
            .any(|c| c.hop == "route-agent" && c.outcome == Outcome::Warning)
    );

    // The API server of the remote cluster goes away.
    rome.set_unreachable(true);
    let report = run(&europe, &rome).await;
    assert_eq!(
        first_broken(&report),
        Some(("remote".into(), "api".into())),
        "{}",
        diagnose::render(&report)
    );
    rome.set_unreachable(false);

    // Europe's TunnelEndpoint is deleted with its controller stopped.
    drop(controllers);
    europe
        .endpoints()
        .delete("rome", &DeleteParams::default())
        .await
        .unwrap();
    let report = run(&europe, &rome).await;
    assert_eq!(
        first_broken(&report),
        Some(("local".into(), "tunnel-endpoint".into())),
        "{}",
        diagnose::render(&report)
    );
}
