//! The lab end to end: the seed topology (Europe hub, Rome, Milan and Paris leaves, all with
//! external CIDR 10.70.0.0/16; Rome and Paris linked only through Europe) built as namespaces with real gateways, linked with the controller's
//! IPAM and planner over gRPC, checked by ping and a 1 s iperf3, its Service fetched by name
//! from a Rome pod, then removed — also after a gateway was killed, as after a crash. Needs
//! root.

use std::path::{Path, PathBuf};

use kubetun_integration::lab::fabric::runs_gateway;
use kubetun_integration::lab::{self, LabOptions};
use kubetun_integration::netns::{bin_path, namespaces_with_prefix, require_root};
use kubetun_integration::topology::Topology;

/// Names of this test's namespaces start with it (never a user's lab or another test).
const PREFIX: &str = "tl";

fn kill_hard(pid: u32) {
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
}

fn state_dir(dir: &Path) -> PathBuf {
    dir.join("lab")
}

#[test]
fn seed_topology_links_remaps_and_tears_down() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !require_root("lab::seed_topology_links_remaps_and_tears_down") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = state_dir(tmp.path());
    let _down = lab::DownOnDrop(dir.clone());
    let options = LabOptions {
        topology: Topology::seed(),
        prefix: PREFIX.to_owned(),
        state_dir: dir.clone(),
        gateway_binary: bin_path("kubetun-gateway"),
        iperf_seconds: 1,
        apiserver: false,
    };

    let mut out = Vec::new();
    let result = lab::up(&options, &mut out);
    print!("{}", String::from_utf8_lossy(&out));
    let report = result.expect("lab up");
    let failures: Vec<_> = report.failures().collect();
    assert!(failures.is_empty(), "failed checks: {failures:#?}");
    assert!(
        report
            .checks
            .iter()
            .any(|c| c.description.starts_with("iperf3")),
        "an iperf3 check ran"
    );

    // The seed's Service: exported by Milan and Paris, fetched by name from a Rome pod, with
    // every step of the demo checked.
    let services: Vec<_> = report
        .checks
        .iter()
        .filter(|c| c.phase == "services")
        .collect();
    assert_eq!(services.len(), 4, "{services:#?}");
    assert!(
        services.iter().any(|c| c
            .description
            .contains("answers from Milan (shortcut) and Paris (through Europe)")),
        "{services:#?}"
    );

    // Rome and Paris reached each other through Europe only, with the quoted headers of ICMP
    // errors translated on both hops.
    for check in [
        "tcp Rome ext",
        "tcp Paris ext",
        "icmp error Rome",
        "icmp error Paris",
    ] {
        assert!(
            report
                .checks
                .iter()
                .any(|c| c.phase == "through the hub" && c.description.starts_with(check)),
            "a {check} check through the hub ran"
        );
    }

    // Every cluster sees each peer's 10.70.0.0/16 under a distinct view, none of them its own
    // (Rome sees Paris through Europe at a view of its own, as over a shortcut).
    let peers = [("Europe", 3), ("Rome", 3), ("Milan", 2), ("Paris", 2)];
    for table in &report.tables {
        let mut views: Vec<&str> = table
            .peers
            .iter()
            .flat_map(|p| &p.external_cidrs)
            .map(|m| m.view.as_str())
            .collect();
        let expected = peers.iter().find(|(name, _)| *name == table.cluster);
        assert_eq!(Some(views.len()), expected.map(|e| e.1), "{table:?}");
        assert!(!views.contains(&"10.70.0.0/16"), "{table:?}");
        views.sort_unstable();
        views.dedup();
        assert_eq!(
            Some(views.len()),
            expected.map(|e| e.1),
            "distinct: {table:?}"
        );
    }

    let status = lab::status(&dir).expect("status");
    assert_eq!(status.clusters.len(), 4);
    for cluster in &status.clusters {
        assert!(cluster.running, "{} gateway runs", cluster.name);
        for peer in &cluster.peers {
            assert_eq!(
                peer.state, "Connected",
                "{} -> {}",
                cluster.name, peer.mapping.peer
            );
            assert!(!peer.reachable_at.is_empty());
        }
    }

    // A crashed gateway: `down` still removes everything.
    let europe_pid = status.clusters[0].pid.expect("pid");
    kill_hard(europe_pid);
    lab::down(&dir, &mut std::io::sink()).expect("down");
    assert_eq!(namespaces_with_prefix(PREFIX), Vec::<String>::new());
    for cluster in &status.clusters {
        let pid = cluster.pid.expect("pid");
        assert!(!runs_gateway(pid), "gateway {pid} stopped");
    }
    assert!(!dir.exists(), "the state directory is removed");
    assert!(
        !Path::new(&format!("/etc/netns/{PREFIX}-rome-pod1")).exists(),
        "the pod's resolver files are removed"
    );
}
