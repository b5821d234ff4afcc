use super::markdown::*;
use super::summary::*;
use crate::cpu::Usage;
use crate::latency::PingSettings;
use crate::machine::Machine;
use crate::model::{BenchConfig, RunRecord, Test};
use crate::udp_drops::UdpDrops;
use kubetun_fixtures::implementations::Implementation;
use kubetun_testenv::iperf::Report;
use std::time::Duration;

fn config(implementations: Vec<Implementation>, tests: Vec<Test>) -> BenchConfig {
    BenchConfig {
        prefix: "kb".into(),
        work_dir: "/nonexistent".into(),
        implementations,
        tests,
        seconds: 10,
        omit: 1,
        repetitions: 3,
        udp_bitrate: 0,
        udp_paced_bitrate: 1_000_000_000,
        ping: PingSettings {
            count: 10,
            interval: Duration::from_millis(20),
        },
        mtu: 1420,
        max_foreign_share: 0.1,
        retries: 1,
        quiet_wait: Duration::from_secs(1),
        time_budget: None,
        binaries: Default::default(),
        left_out: vec![(Implementation::BoringtunCli, "not installed".into())],
    }
}

fn run(
    test: Test,
    implementation: Implementation,
    repetition: u32,
    attempt: u32,
    gbps: f64,
    disturbed: bool,
) -> RunRecord {
    RunRecord {
        repetition,
        attempt,
        test,
        implementation,
        result: Ok(Report {
            received_bps: gbps * 1e9,
            sent_bps: gbps * 1e9,
            retransmits: (test != Test::Udp).then_some(10),
            lost_percent: (test == Test::Udp).then_some(1.5),
            remote_host: "10.99.1.2".into(),
            local_host: "10.99.1.1".into(),
        }),
        usage: Usage {
            wall_seconds: 10.0,
            daemon_seconds: if implementation.is_tunnel() {
                vec![5.0, 7.0]
            } else {
                vec![]
            },
            harness_seconds: 4.0,
            foreign_seconds: if disturbed { 5.0 } else { 0.1 },
        },
        udp_drops: (test == Test::Udp).then_some(UdpDrops {
            before_tunnel: 3,
            in_tunnel: gbps as u64,
            at_receiver: 100,
        }),
        disturbed,
    }
}

fn machine() -> Machine {
    Machine {
        cpu_model: "AMD EPYC".into(),
        cpus: 2,
        hypervisor: Some("KVM".into()),
        kernel: "6.18.44".into(),
        date: "2026-11-22 01:00 UTC".into(),
        iperf3: "iperf 3.12".into(),
        daemons: vec![(
            Implementation::WireguardGo,
            "wireguard-go v0.0.20220316".into(),
        )],
    }
}

#[test]
fn cells_ratios_and_disturbance() {
    use Implementation::{Kubetun, Veth, WireguardGo};
    let config = config(
        vec![Veth, Kubetun, WireguardGo],
        vec![Test::Tcp1, Test::Udp],
    );
    let mut runs = Vec::new();
    for (rep, (k, w)) in [(2.0, 1.0), (3.0, 1.5), (2.5, 0.5)].into_iter().enumerate() {
        let rep = rep as u32;
        runs.push(run(Test::Tcp1, Veth, rep, 0, 30.0, false));
        runs.push(run(Test::Tcp1, Kubetun, rep, 0, k, false));
        runs.push(run(Test::Tcp1, WireguardGo, rep, 0, w, false));
        runs.push(run(Test::Udp, Veth, rep, 0, 10.0, false));
        runs.push(run(Test::Udp, Kubetun, rep, 0, 2.0, false));
    }
    // wireguard-go UDP: repetition 1 stays disturbed after its retry; the others recover.
    for rep in 0..3 {
        runs.push(run(Test::Udp, WireguardGo, rep, 0, 9.0, true));
        runs.push(run(Test::Udp, WireguardGo, rep, 1, 1.0, rep == 1));
    }
    let ping = |implementation, avg_ms| crate::latency::LatencyRecord {
        repetition: 0,
        implementation,
        result: Ok(crate::latency::PingStats {
            transmitted: 10,
            received: 10,
            min_ms: avg_ms / 2.0,
            avg_ms,
            max_ms: avg_ms * 2.0,
        }),
        disturbed: false,
    };
    let latency_runs = vec![ping(Veth, 0.05), ping(Kubetun, 0.2), ping(WireguardGo, 0.4)];
    let results = summarise(machine(), &config, runs, latency_runs, None);

    let kubetun = measured(&results.cells, Test::Tcp1, Kubetun).unwrap();
    assert_eq!(kubetun.median_gbps, 2.5);
    assert_eq!((kubetun.min_gbps, kubetun.max_gbps), (2.0, 3.0));
    assert_eq!(kubetun.daemon_cpu_percent, Some(120.0));
    assert_eq!(kubetun.retransmits, Some(10.0));
    assert_eq!(
        measured(&results.cells, Test::Tcp1, Veth)
            .unwrap()
            .daemon_cpu_percent,
        None
    );
    let udp = measured(&results.cells, Test::Udp, Kubetun).unwrap();
    assert_eq!((udp.lost_percent, udp.retransmits), (Some(1.5), None));

    let wg_udp = results
        .cells
        .iter()
        .find(|c| c.test == Test::Udp && c.implementation == WireguardGo)
        .unwrap();
    assert_eq!(
        wg_udp.outcome,
        Outcome::Disturbed {
            disturbed: 1,
            runs: 3
        }
    );

    let ratio = |test| {
        results
            .ratios
            .iter()
            .find(|r| r.test == test && r.baseline == WireguardGo)
            .unwrap()
            .ratio
    };
    assert_eq!(ratio(Test::Tcp1), Some(2.5));
    assert_eq!(ratio(Test::Udp), None, "no ratio against a disturbed cell");
    assert!(
        results
            .ratios
            .iter()
            .all(|r| r.baseline != Implementation::BoringtunCli)
    );

    let md = render_markdown(&results);
    assert!(md.starts_with(SECTION_HEADING), "{md}");
    assert!(
        md.contains("| TCP, 1 stream | **30.00** (30.00–30.00) | **2.50** (2.00–3.00) | **1.00** (0.50–1.50) | 2.50× |"),
        "{md}"
    );
    assert!(
        md.contains(
            "| UDP | **10.00** (10.00–10.00) | **2.00** (2.00–2.00) | disturbed (1 of 3 runs) | – |"
        ),
        "{md}"
    );
    assert!(md.contains("CPU 120%, 10 retr."), "{md}");
    assert!(
        md.contains("CPU 120%, 1.5% lost, dropped 3 / 2 / 100"),
        "{md}"
    );
    assert!(
        md.contains("AMD EPYC (2 CPUs, KVM guest), Linux 6.18.44"),
        "{md}"
    );
    assert!(
        md.contains("Left out: boringtun-cli (not installed)."),
        "{md}"
    );
    assert!(md.contains("`ping -c 10 -i 0.02`"), "{md}");
    assert!(
        md.contains("| kubetun | **200** | 100 | 150 | 1 | 0 |"),
        "{md}"
    );
    assert!(
        md.contains("| veth (ceiling) | **50** | 25 | – | 1 | 0 |"),
        "{md}"
    );
}

#[test]
fn a_failed_run_fails_the_cell() {
    let config = config(vec![Implementation::Kubetun], vec![Test::Tcp4]);
    let mut failed = run(Test::Tcp4, Implementation::Kubetun, 0, 0, 1.0, false);
    failed.result = Err("iperf3: unable to connect".into());
    let results = summarise(machine(), &config, vec![failed], Vec::new(), None);
    assert!(
        matches!(&results.cells[0].outcome, Outcome::Failed { error } if error.contains("unable"))
    );
    assert!(render_markdown(&results).contains("| TCP, 4 streams | failed |"));
}

#[test]
fn an_early_stop_is_reported_and_unmeasured_cells_say_so() {
    let config = config(
        vec![Implementation::Kubetun, Implementation::WireguardGo],
        vec![Test::Tcp1],
    );
    let runs = vec![run(Test::Tcp1, Implementation::Kubetun, 0, 0, 2.0, false)];
    let results = summarise(
        machine(),
        &config,
        runs,
        Vec::new(),
        Some("interrupted by a signal".into()),
    );
    assert_eq!(results.cells[1].outcome, Outcome::NotRun);
    let md = render_markdown(&results);
    assert!(
        md.contains("The run interrupted by a signal: cells summarise"),
        "{md}"
    );
    assert!(
        md.contains("| **2.00** (2.00–2.00) | not run | – |"),
        "{md}"
    );
}

#[test]
fn replaces_only_its_own_section() {
    let existing = "# Benchmark results\n\n## Remap fast path\n\nfast\n\n\
                    ## Throughput (iperf3, netns)\n\nold table\n\n## Later\n\nkeep\n";
    let updated = replace_section(existing, "## Throughput (iperf3, netns)\n\nnew table\n");
    assert_eq!(
        updated,
        "# Benchmark results\n\n## Remap fast path\n\nfast\n\n\
         ## Throughput (iperf3, netns)\n\nnew table\n\n## Later\n\nkeep\n"
    );
    let appended = replace_section(
        "# Benchmark results\n\n## Remap fast path\n\nfast\n",
        "## Throughput (iperf3, netns)\n\nt\n",
    );
    assert_eq!(
        appended,
        "# Benchmark results\n\n## Remap fast path\n\nfast\n\n## Throughput (iperf3, netns)\n\nt\n"
    );
    assert_eq!(
        replace_section("", "## Throughput (iperf3, netns)\n\nt"),
        "# Benchmark results\n\n## Throughput (iperf3, netns)\n\nt\n"
    );
}
