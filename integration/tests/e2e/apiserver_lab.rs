//! Shared by the tests that run the seed lab on real API servers (`real_apiservers.rs`,
//! `key_rotation.rs`): bringing it up, reading its state, reaching its clusters.

use std::path::Path;
use std::time::Duration;

use kubetun_integration::lab::apiserver;
use kubetun_integration::lab::checks::reach_address;
use kubetun_integration::lab::state::{ClusterState, LabState};
use kubetun_integration::lab::{self, LabOptions};
use kubetun_integration::netns::{bin_path, require_root};
use kubetun_integration::topology::Topology;

pub const EUROPE: usize = 0;
pub const ROME: usize = 1;
pub const MILAN: usize = 2;
pub const PARIS: usize = 3;

/// Whether the test can run: root and the API-server binaries; under CI=true a missing one
/// fails instead of skipping.
pub fn can_run(test: &str) -> bool {
    if !require_root(test) {
        return false;
    }
    if let Err(e) = kubetun_testenv::Assets::find() {
        assert!(!kubetun_testenv::required(), "CI=true: {e}");
        eprintln!("skipping: {e}");
        return false;
    }
    true
}

/// `kubetun-lab up --apiserver` of the seed topology into `dir` (names prefixed `prefix`),
/// with every check passed.
pub async fn up_seed_lab(prefix: &str, dir: &Path) -> LabState {
    let options = LabOptions {
        topology: Topology::seed(),
        prefix: prefix.to_owned(),
        state_dir: dir.to_path_buf(),
        gateway_binary: bin_path("kubetun-gateway"),
        iperf_seconds: 0,
        apiserver: true,
    };
    let (result, out) = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let result = lab::up(&options, &mut out);
        (result, String::from_utf8_lossy(&out).into_owned())
    })
    .await
    .expect("up task");
    print!("{out}");
    let report = result.expect("lab up --apiserver");
    let failures: Vec<_> = report.failures().collect();
    assert!(failures.is_empty(), "failed checks: {failures:#?}");
    let services = report
        .checks
        .iter()
        .filter(|c| c.phase == "services")
        .count();
    assert_eq!(services, 4, "the Service demo ran through the API servers");
    state(dir)
}

pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// A pod of `from` and the address at which it reaches a pod of `to`.
pub fn pod_path(from: &ClusterState, to: &ClusterState) -> (String, String) {
    let target = to.pods[0].address;
    let view = reach_address(from, to, target).expect("a view of the peer's pod");
    (from.pods[0].namespace.clone(), view.to_string())
}

pub fn state(dir: &Path) -> LabState {
    LabState::load(dir).expect("state").expect("lab up")
}

pub fn plane(cluster: &ClusterState) -> &apiserver::ControlPlaneState {
    cluster.control_plane.as_ref().expect("control plane")
}

/// A client with the cluster's admin kubeconfig.
pub async fn admin(cluster: &ClusterState) -> kube::Client {
    kubetun_testenv::client_for(&plane(cluster).kubeconfig)
        .await
        .expect("admin client")
}
