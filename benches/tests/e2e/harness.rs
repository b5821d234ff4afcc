//! The throughput harness, one short iteration (1 s per run, one repetition, every test), so
//! it cannot rot: kubetun, wireguard-go and veth always; boringtun-cli when it is installed
//! (under CI=true it is installed with cargo, bounded in time). Needs root.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kubetun_benches::harness::{self, BenchConfig, Test};
use kubetun_benches::latency::PingSettings;
use kubetun_benches::report::{self, Outcome};
use kubetun_fixtures::implementations::{Binaries, Implementation};
use kubetun_testenv::bin_path;
use kubetun_testenv::netns::{command_exists, namespaces_with_prefix, require_root};

/// Names of this test's namespaces and interfaces start with it.
const PREFIX: &str = "th";

fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

#[test]
fn one_short_iteration_measures_every_implementation() {
    let _turn = kubetun_testenv::turn(module_path!());
    if !require_root("harness::one_short_iteration_measures_every_implementation") {
        return;
    }
    for tool in ["wg", "iperf3", "wireguard-go"] {
        assert!(command_exists(tool), "{tool} is required (see .ci/run)");
    }
    let work = tempfile::tempdir().expect("tempdir");
    let mut out = Vec::new();
    // The baseline is a second gateway build only a user passes in.
    let requested: Vec<_> = Implementation::ALL
        .into_iter()
        .filter(|i| *i != Implementation::KubetunBaseline)
        .collect();
    let install = under_ci().then_some(Duration::from_secs(1200));
    let (binaries, left_out) = kubetun_fixtures::implementations::locate_binaries(
        &requested,
        Binaries {
            kubetun: Some(bin_path("kubetun-gateway")),
            ..Binaries::default()
        },
        &kubetun_fixtures::implementations::tools_dir(
            &kubetun_fixtures::implementations::default_work_dir(),
        ),
        install,
        &mut out,
    );
    for (implementation, reason) in &left_out {
        assert_eq!(
            *implementation,
            Implementation::BoringtunCli,
            "only boringtun-cli may be left out: {reason}"
        );
        assert!(
            !under_ci(),
            "under CI boringtun-cli must be installed: {reason}"
        );
        println!("NOTE: boringtun-cli is left out of this run: {reason}");
    }
    let config = BenchConfig {
        prefix: PREFIX.to_owned(),
        work_dir: work.path().to_owned(),
        implementations: requested
            .into_iter()
            .filter(|i| !left_out.iter().any(|(l, _)| l == i))
            .collect(),
        tests: Test::ALL.to_vec(),
        seconds: 1,
        omit: 0,
        repetitions: 1,
        udp_bitrate: 0,
        udp_paced_bitrate: 200_000_000,
        ping: PingSettings {
            count: 5,
            interval: Duration::from_millis(20),
        },
        mtu: 1420,
        max_foreign_share: 0.10,
        retries: 1,
        quiet_wait: Duration::from_secs(5),
        time_budget: None,
        binaries,
        left_out,
    };

    let result = harness::run(&config, &AtomicBool::new(false), &mut out);
    print!("{}", String::from_utf8_lossy(&out));
    let results = result.expect("harness run");

    assert_eq!(
        results.cells.len(),
        config.implementations.len() * Test::ALL.len()
    );
    for cell in &results.cells {
        match &cell.outcome {
            Outcome::Measured(m) => {
                assert!(m.median_gbps > 0.0, "{cell:?}");
                assert_eq!(
                    m.daemon_cpu_percent.is_some(),
                    cell.implementation.is_tunnel()
                );
            }
            // A busy machine is reported, not measured; that is the harness working.
            Outcome::Disturbed { .. } => println!("disturbed: {cell:?}"),
            Outcome::NotRun => panic!("{cell:?} was not run"),
            Outcome::Failed { error } => {
                panic!(
                    "{} {} failed: {error}",
                    cell.implementation,
                    cell.test.name()
                )
            }
        }
    }
    assert_eq!(results.latency.len(), config.implementations.len());
    for summary in &results.latency {
        if summary.disturbed == 0 {
            let rtt = summary.median_avg_us.expect("an idle round trip");
            assert!(rtt > 0.0 && rtt < 100_000.0, "{summary:?}");
        }
    }
    let markdown = report::render_markdown(&results);
    println!("{markdown}");
    assert!(markdown.contains("Idle round trip"));
    assert!(markdown.starts_with(report::SECTION_HEADING));
    assert!(markdown.contains("kubetun ÷ wireguard-go"));

    // Nothing is left behind.
    assert_eq!(
        namespaces_with_prefix(PREFIX),
        Vec::<String>::new(),
        "namespaces of the harness remain"
    );
}
