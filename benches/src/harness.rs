//! The measurement loop: for each repetition, each test (TCP 1 stream, TCP 4 streams, UDP),
//! each implementation in an order rotated per repetition, one bounded iperf3 run with the CPU
//! accounted before and after. A run during which outside load exceeded the threshold is
//! marked disturbed and retried after waiting for the machine to go quiet. After each
//! repetition's throughput runs, one idle round-trip run per implementation
//! ([`crate::latency`]), under the same rules.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kubetun_testenv::iperf::{self, ClientSpec, Report};

use crate::cpu::{Snapshot, Usage};
use crate::latency::{self, LatencyRecord};
use crate::machine::Machine;
pub use crate::model::{BenchConfig, RunRecord, Test};
use crate::report::{self, BenchResults};
use crate::testbed::{Testbed, TestbedError};
use crate::udp_drops::{self, UdpDrops};
use kubetun_fixtures::implementations::Implementation;

/// Why the harness could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The testbed could not be built.
    #[error(transparent)]
    Testbed(#[from] TestbedError),
    /// Nothing to measure.
    #[error("no implementations or no tests selected")]
    Empty,
}

/// Builds the testbed, runs every measurement and summarises them; progress goes to `out`.
/// Setting `stop` (e.g. from a signal) or running out of `time_budget` ends the run after the
/// measurement in progress; the results then summarise what was measured and say so.
pub fn run(
    config: &BenchConfig,
    stop: &AtomicBool,
    out: &mut dyn Write,
) -> Result<BenchResults, BenchError> {
    if config.implementations.is_empty() || config.tests.is_empty() || config.repetitions == 0 {
        return Err(BenchError::Empty);
    }
    let machine = Machine::detect(&config.binaries);
    for (implementation, reason) in &config.left_out {
        say(out, &format!("left out {implementation}: {reason}"));
    }
    say(
        out,
        &format!(
            "building the testbed: {}",
            config
                .implementations
                .iter()
                .map(|i| i.name())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    let testbed = Testbed::new(
        &config.prefix,
        &config.work_dir,
        &config.implementations,
        &config.binaries,
        config.mtu,
    )?;
    let started = Instant::now();
    let mut runs = Vec::new();
    let mut latency_runs: Vec<LatencyRecord> = Vec::new();
    let mut stopped_early = None;
    'measure: for repetition in 0..config.repetitions {
        let order = rotated(&config.implementations, repetition as usize);
        for &test in &config.tests {
            for &implementation in &order {
                for attempt in 0..=config.retries {
                    if let Err(why) =
                        ready_for(&testbed, config, stop, started, implementation, out)
                    {
                        stopped_early = Some(why);
                        break 'measure;
                    }
                    let record =
                        run_once(&testbed, config, repetition, attempt, test, implementation);
                    say(out, &describe(config, &record));
                    let disturbed = record.disturbed;
                    runs.push(record);
                    if !disturbed {
                        break;
                    }
                }
            }
        }
        if config.ping.count == 0 {
            continue;
        }
        for &implementation in &order {
            for _attempt in 0..=config.retries {
                if let Err(why) = ready_for(&testbed, config, stop, started, implementation, out) {
                    stopped_early = Some(why);
                    break 'measure;
                }
                let record = latency::measure(
                    &testbed,
                    config.ping,
                    repetition,
                    implementation,
                    config.max_foreign_share,
                );
                say(out, &describe_latency(config, &record));
                let disturbed = record.disturbed;
                latency_runs.push(record);
                if !disturbed {
                    break;
                }
            }
        }
    }
    drop(testbed);
    say(
        out,
        &format!(
            "measured in {:.0} s{}",
            started.elapsed().as_secs_f64(),
            stopped_early
                .as_ref()
                .map_or_else(String::new, |why| format!(" ({why})"))
        ),
    );
    Ok(report::summarise(
        machine,
        config,
        runs,
        latency_runs,
        stopped_early,
    ))
}

/// Gets the machine ready for a run of `implementation`: of the poll-mode daemons only its own
/// run, and the machine is quiet (or was waited for). `Err` says why no run may start: a
/// signal, or the time budget is used up.
fn ready_for(
    testbed: &Testbed,
    config: &BenchConfig,
    stop: &AtomicBool,
    started: Instant,
    implementation: Implementation,
    out: &mut dyn Write,
) -> Result<(), String> {
    testbed.focus(implementation);
    if !wait_quiet(testbed, config, stop) {
        say(out, "  the machine did not go quiet; measuring anyway");
    }
    if stop.load(Ordering::SeqCst) {
        return Err("interrupted by a signal".to_owned());
    }
    match config.time_budget {
        Some(budget) if started.elapsed() >= budget => Err(format!(
            "stopped when its time budget of {} s was used up",
            budget.as_secs()
        )),
        _ => Ok(()),
    }
}

/// `items` rotated left by `by`, so every implementation takes every position in turn.
fn rotated<T: Copy>(items: &[T], by: usize) -> Vec<T> {
    let mut order = items.to_vec();
    if !order.is_empty() {
        let len = order.len();
        order.rotate_left(by % len);
    }
    order
}

/// Waits until one second passes with outside load under the threshold, `quiet_wait`
/// elapsed or `stop` is set. Returns whether the machine went quiet.
fn wait_quiet(testbed: &Testbed, config: &BenchConfig, stop: &AtomicBool) -> bool {
    let deadline = Instant::now() + config.quiet_wait;
    let daemons = testbed.all_daemon_pids();
    loop {
        let before = Snapshot::take(&daemons);
        std::thread::sleep(Duration::from_secs(1));
        let usage = Usage::between(&before, &Snapshot::take(&daemons));
        if usage.foreign_share() <= config.max_foreign_share {
            return true;
        }
        if Instant::now() >= deadline || stop.load(Ordering::SeqCst) {
            return false;
        }
    }
}

fn run_once(
    testbed: &Testbed,
    config: &BenchConfig,
    repetition: u32,
    attempt: u32,
    test: Test,
    implementation: Implementation,
) -> RunRecord {
    let daemons = testbed.daemon_pids(implementation);
    let drops_before = test
        .is_udp()
        .then(|| udp_drops::read(testbed, implementation));
    let (result, usage) = match testbed.server_address(implementation) {
        Some(server) => measure(testbed, config, test, server, &daemons),
        None => (
            Err(format!("{implementation} is not part of the testbed")),
            Usage::between(&Snapshot::take(&[]), &Snapshot::take(&[])),
        ),
    };
    let udp_drops = drops_before
        .map(|before| UdpDrops::between(before, udp_drops::read(testbed, implementation)));
    let result = (result, usage, udp_drops);
    let (result, usage, udp_drops) = result;
    RunRecord {
        repetition,
        attempt,
        test,
        implementation,
        disturbed: usage.foreign_share() > config.max_foreign_share,
        result,
        usage,
        udp_drops,
    }
}

fn measure(
    testbed: &Testbed,
    config: &BenchConfig,
    test: Test,
    server: std::net::Ipv4Addr,
    daemons: &[u32],
) -> (Result<Report, String>, Usage) {
    let log = config.work_dir.join("iperf3-server.json");
    let spec = ClientSpec {
        server: server.to_string(),
        port: iperf::DEFAULT_PORT,
        mode: test.mode(config),
        seconds: config.seconds,
        // iperf3 counts the datagrams of an omitted UDP warm-up as lost (over 100% loss).
        omit: if test.is_udp() { 0 } else { config.omit },
    };
    let before = Snapshot::take(daemons);
    let server_process = iperf::Server::start(
        testbed.server_ns(),
        &server.to_string(),
        iperf::DEFAULT_PORT,
        &log,
    );
    let result = match server_process {
        Ok(server_process) => {
            let report = iperf::run_client(testbed.client_ns(), &spec);
            // The server exits after its one test; reaping it adds its CPU time to ours.
            server_process.finish(Duration::from_secs(5));
            report.map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    let usage = Usage::between(&before, &Snapshot::take(daemons));
    (result, usage)
}

fn describe(config: &BenchConfig, record: &RunRecord) -> String {
    let head = format!(
        "  rep {}/{} {:<6} {:<13}",
        record.repetition + 1,
        config.repetitions,
        record.test.name(),
        record.implementation.name()
    );
    let cpu: Vec<String> = record
        .usage
        .daemon_percent()
        .iter()
        .map(|p| format!("{p:.0}%"))
        .collect();
    let cpu = if cpu.is_empty() {
        String::new()
    } else {
        format!(", daemon CPU {}", cpu.join(" + "))
    };
    let foreign = format!(
        "outside load {:.0}% of a core{}",
        100.0 * record.usage.foreign_share(),
        if record.disturbed {
            " — DISTURBED"
        } else {
            ""
        }
    );
    match &record.result {
        Ok(report) => format!(
            "{head} {:>7.2} Gbit/s{}{cpu}, {foreign}",
            report.received_bps / 1e9,
            match (report.retransmits, report.lost_percent) {
                (Some(r), _) => format!(", {r} retransmits"),
                (_, Some(l)) => format!(", {l:.1}% lost"),
                _ => String::new(),
            }
        ),
        Err(error) => format!("{head} FAILED: {error}"),
    }
}

fn describe_latency(config: &BenchConfig, record: &LatencyRecord) -> String {
    let head = format!(
        "  rep {}/{} {:<6} {:<17}",
        record.repetition + 1,
        config.repetitions,
        "ping",
        record.implementation.name()
    );
    let disturbed = if record.disturbed {
        " — DISTURBED"
    } else {
        ""
    };
    match &record.result {
        Ok(stats) => format!(
            "{head} rtt min {:.3} / avg {:.3} / max {:.3} ms, {}/{} answered{disturbed}",
            stats.min_ms, stats.avg_ms, stats.max_ms, stats.received, stats.transmitted
        ),
        Err(error) => format!("{head} FAILED: {error}"),
    }
}

fn say(out: &mut dyn Write, line: &str) {
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_rotates_per_repetition() {
        let items = [1, 2, 3];
        assert_eq!(rotated(&items, 0), [1, 2, 3]);
        assert_eq!(rotated(&items, 1), [2, 3, 1]);
        assert_eq!(rotated(&items, 4), [2, 3, 1]);
        assert_eq!(rotated::<u8>(&[], 3), Vec::<u8>::new());
    }

    #[test]
    fn test_names_round_trip() {
        for test in Test::ALL {
            assert_eq!(Test::from_name(test.name()), Some(test));
        }
        assert_eq!(Test::from_name("sctp"), None);
    }
}
