//! Summaries of the runs: per test and implementation the median goodput with min–max, the
//! daemons' CPU, retransmits or loss, and the kubetun ratios computed within the same run;
//! rendered as the `## Throughput (iperf3, netns)` section of `benches/RESULTS.md` and as
//! JSON.
//!
//! A cell with a disturbed run (outside load over the threshold even after retries) reports
//! no number: it says "disturbed".

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::latency::{self, LatencyRecord, LatencySummary, PingSettings};
use crate::machine::Machine;
use crate::model::{BenchConfig, RunRecord, Test};
use crate::stats::median;
use crate::udp_drops::UdpDrops;
use kubetun_fixtures::implementations::Implementation;

/// The heading of this harness's section in the results file.
pub const SECTION_HEADING: &str = "## Throughput (iperf3, netns)";

/// Everything one harness run produced.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchResults {
    /// What it ran on.
    pub machine: Machine,
    /// How it was run.
    pub settings: Settings,
    /// One cell per test and implementation.
    pub cells: Vec<Cell>,
    /// kubetun's median divided by each other implementation's, per test.
    pub ratios: Vec<Ratio>,
    /// The idle round trip per implementation.
    pub latency: Vec<LatencySummary>,
    /// Implementations left out, with the reason.
    pub left_out: Vec<(Implementation, String)>,
    /// Why the run ended before every repetition was measured, if it did.
    pub stopped_early: Option<String>,
    /// Every run, including disturbed and retried ones.
    pub runs: Vec<RunRecord>,
    /// Every latency run.
    pub latency_runs: Vec<LatencyRecord>,
}

/// The settings that shape the numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// Measured seconds per run.
    pub seconds: u32,
    /// Warm-up seconds left out.
    pub omit: u32,
    /// Runs per cell.
    pub repetitions: u32,
    /// Tunnel MTU.
    pub mtu: u32,
    /// UDP offered rate (0: unlimited).
    pub udp_bitrate: u64,
    /// The paced UDP test's offered rate.
    pub udp_paced_bitrate: u64,
    /// UDP payload bytes.
    pub udp_length: u32,
    /// Outside-load threshold, share of one core.
    pub max_foreign_share: f64,
    /// The idle round-trip runs.
    pub ping: PingSettings,
}

/// One test × implementation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cell {
    pub test: Test,
    pub implementation: Implementation,
    /// The numbers, or why there are none.
    pub outcome: Outcome,
}

/// The numbers of a cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Outcome {
    /// Every run was undisturbed and succeeded.
    Measured(Measured),
    /// At least one run stayed disturbed by outside load; no number is reported.
    Disturbed {
        /// Runs (final attempts) that were disturbed.
        disturbed: usize,
        /// Runs in the cell.
        runs: usize,
    },
    /// A run failed.
    Failed {
        /// The first failure.
        error: String,
    },
    /// The run stopped early, before this cell was measured.
    NotRun,
}

/// Medians and ranges of a cell's runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Measured {
    /// Runs summarised.
    pub runs: usize,
    /// Median receiver goodput, Gbit/s.
    pub median_gbps: f64,
    /// Smallest run, Gbit/s.
    pub min_gbps: f64,
    /// Largest run, Gbit/s.
    pub max_gbps: f64,
    /// Median daemon CPU, both ends together, percent of one core (none for veth).
    pub daemon_cpu_percent: Option<f64>,
    /// Median TCP retransmits per run.
    pub retransmits: Option<f64>,
    /// Median UDP loss, percent.
    pub lost_percent: Option<f64>,
    /// UDP: median datagrams dropped per run, by place (each field's own median).
    pub udp_drops: Option<UdpDrops>,
}

/// kubetun's median over another implementation's, for one test.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ratio {
    pub test: Test,
    /// The implementation kubetun is compared with.
    pub baseline: Implementation,
    /// kubetun median / baseline median (none if either cell has no number).
    pub ratio: Option<f64>,
}

/// Summarises `runs` into cells and ratios.
pub fn summarise(
    machine: Machine,
    config: &BenchConfig,
    runs: Vec<RunRecord>,
    latency_runs: Vec<LatencyRecord>,
    stopped_early: Option<String>,
) -> BenchResults {
    let mut cells = Vec::new();
    for &test in &config.tests {
        for &implementation in &config.implementations {
            cells.push(Cell {
                test,
                implementation,
                outcome: outcome(&runs, test, implementation),
            });
        }
    }
    let ratios = config
        .tests
        .iter()
        .flat_map(|&test| {
            [Implementation::WireguardGo, Implementation::BoringtunCli]
                .into_iter()
                .filter(|b| config.implementations.contains(b))
                .filter(|_| config.implementations.contains(&Implementation::Kubetun))
                .map(move |baseline| (test, baseline))
        })
        .map(|(test, baseline)| Ratio {
            test,
            baseline,
            ratio: match (
                measured(&cells, test, Implementation::Kubetun),
                measured(&cells, test, baseline),
            ) {
                (Some(k), Some(b)) if b.median_gbps > 0.0 => Some(k.median_gbps / b.median_gbps),
                _ => None,
            },
        })
        .collect();
    BenchResults {
        machine,
        settings: Settings {
            seconds: config.seconds,
            omit: config.omit,
            repetitions: config.repetitions,
            mtu: config.mtu,
            udp_bitrate: config.udp_bitrate,
            udp_paced_bitrate: config.udp_paced_bitrate,
            udp_length: config.udp_length(),
            max_foreign_share: config.max_foreign_share,
            ping: config.ping,
        },
        cells,
        ratios,
        latency: if latency_runs.is_empty() {
            Vec::new()
        } else {
            latency::summarise(&latency_runs, &config.implementations)
        },
        left_out: config.left_out.clone(),
        stopped_early,
        runs,
        latency_runs,
    }
}

fn measured(cells: &[Cell], test: Test, implementation: Implementation) -> Option<&Measured> {
    cells
        .iter()
        .find(|c| c.test == test && c.implementation == implementation)
        .and_then(|c| match &c.outcome {
            Outcome::Measured(m) => Some(m),
            _ => None,
        })
}

/// The final attempt of each repetition decides the cell.
fn outcome(runs: &[RunRecord], test: Test, implementation: Implementation) -> Outcome {
    let mut finals: Vec<&RunRecord> = Vec::new();
    for run in runs
        .iter()
        .filter(|r| r.test == test && r.implementation == implementation)
    {
        match finals.iter_mut().find(|f| f.repetition == run.repetition) {
            Some(existing) if existing.attempt < run.attempt => *existing = run,
            Some(_) => {}
            None => finals.push(run),
        }
    }
    if finals.is_empty() {
        return Outcome::NotRun;
    }
    if let Some(error) = finals.iter().find_map(|r| r.result.as_ref().err()) {
        return Outcome::Failed {
            error: error.clone(),
        };
    }
    let disturbed = finals.iter().filter(|r| r.disturbed).count();
    if disturbed > 0 {
        return Outcome::Disturbed {
            disturbed,
            runs: finals.len(),
        };
    }
    let reports: Vec<_> = finals
        .iter()
        .filter_map(|r| r.result.as_ref().ok())
        .collect();
    let gbps: Vec<f64> = reports.iter().map(|r| r.received_bps / 1e9).collect();
    let cpu: Vec<f64> = finals
        .iter()
        .map(|r| r.usage.daemon_percent().iter().sum())
        .collect();
    let retransmits: Vec<f64> = reports
        .iter()
        .filter_map(|r| r.retransmits.map(|n| n as f64))
        .collect();
    let lost: Vec<f64> = reports.iter().filter_map(|r| r.lost_percent).collect();
    let drops: Vec<UdpDrops> = finals.iter().filter_map(|r| r.udp_drops).collect();
    let median_of = |field: fn(&UdpDrops) -> u64| {
        let values: Vec<f64> = drops.iter().map(|d| field(d) as f64).collect();
        median(&values).map_or(0, |m| m.round() as u64)
    };
    let udp_drops = (test.is_udp() && !drops.is_empty()).then(|| UdpDrops {
        before_tunnel: median_of(|d| d.before_tunnel),
        in_tunnel: median_of(|d| d.in_tunnel),
        at_receiver: median_of(|d| d.at_receiver),
    });
    Outcome::Measured(Measured {
        runs: finals.len(),
        median_gbps: median(&gbps).unwrap_or(0.0),
        min_gbps: gbps.iter().copied().fold(f64::INFINITY, f64::min),
        max_gbps: gbps.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        daemon_cpu_percent: implementation.is_tunnel().then(|| median(&cpu)).flatten(),
        retransmits: if test.is_udp() {
            None
        } else {
            median(&retransmits)
        },
        lost_percent: if test.is_udp() { median(&lost) } else { None },
        udp_drops,
    })
}

fn column_label(implementation: Implementation) -> String {
    match implementation {
        Implementation::Veth => "veth (ceiling)".to_owned(),
        other => other.name().to_owned(),
    }
}

fn throughput_text(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Measured(m) => format!(
            "**{:.2}** ({:.2}–{:.2})",
            m.median_gbps, m.min_gbps, m.max_gbps
        ),
        Outcome::Disturbed { disturbed, runs } => {
            format!("disturbed ({disturbed} of {runs} runs)")
        }
        Outcome::Failed { .. } => "failed".to_owned(),
        Outcome::NotRun => "not run".to_owned(),
    }
}

fn details_text(test: Test, outcome: &Outcome) -> String {
    match outcome {
        Outcome::Measured(m) => {
            let mut parts = Vec::new();
            if let Some(cpu) = m.daemon_cpu_percent {
                parts.push(format!("CPU {cpu:.0}%"));
            }
            match test {
                Test::Udp | Test::UdpPaced => {
                    if let Some(lost) = m.lost_percent {
                        parts.push(format!("{lost:.1}% lost"));
                    }
                    if let Some(d) = m.udp_drops {
                        parts.push(format!(
                            "dropped {} / {} / {}",
                            d.before_tunnel, d.in_tunnel, d.at_receiver
                        ));
                    }
                }
                Test::Tcp1 | Test::Tcp4 => {
                    if let Some(retransmits) = m.retransmits {
                        parts.push(format!("{retransmits:.0} retr."));
                    }
                }
            }
            parts.join(", ")
        }
        Outcome::Disturbed { .. } | Outcome::NotRun => "–".to_owned(),
        Outcome::Failed { error } => error.replace('|', "/"),
    }
}

/// The results as the markdown section of the results file (heading included).
pub fn render_markdown(results: &BenchResults) -> String {
    let settings = &results.settings;
    let implementations: Vec<Implementation> = {
        let mut seen = Vec::new();
        for cell in &results.cells {
            if !seen.contains(&cell.implementation) {
                seen.push(cell.implementation);
            }
        }
        seen
    };
    let tests: Vec<Test> = {
        let mut seen = Vec::new();
        for cell in &results.cells {
            if !seen.contains(&cell.test) {
                seen.push(cell.test);
            }
        }
        seen
    };
    let cell = |test: Test, implementation: Implementation| {
        results
            .cells
            .iter()
            .find(|c| c.test == test && c.implementation == implementation)
            .map(|c| &c.outcome)
    };
    let baselines: Vec<Implementation> = {
        let mut seen = Vec::new();
        for ratio in &results.ratios {
            if !seen.contains(&ratio.baseline) {
                seen.push(ratio.baseline);
            }
        }
        seen
    };

    let mut md = String::new();
    let _ = writeln!(md, "{SECTION_HEADING}\n");
    let _ = writeln!(
        md,
        "Measured {} on {}. Two network namespaces joined by a veth pair; each implementation \
         runs one tunnel over it, configured identically with `wg setconf` (MTU {}); iperf3 \
         runs through the tunnel ({}). {} runs of {} s per cell ({}), the \
         implementations interleaved round-robin per repetition.",
        results.machine.date,
        results.machine.describe(),
        settings.mtu,
        results.machine.iperf3,
        settings.repetitions,
        settings.seconds,
        if settings.omit > 0 {
            format!(
                "`iperf3 -t {} -O {}`, UDP without `-O`",
                settings.seconds, settings.omit
            )
        } else {
            format!("`iperf3 -t {}`", settings.seconds)
        },
    );
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "Receiver goodput in Gbit/s: **median** (min–max). UDP offers {} with {} B datagrams; \
         paced UDP offers {:.2} Gbit/s. A cell reads \"disturbed\" when, during one of its \
         runs, CPU time outside the harness and the daemons (or stolen by the hypervisor) \
         exceeded {:.0}% of one core even after retries; it then reports no number.",
        if settings.udp_bitrate == 0 {
            "as fast as the sender can (`-b 0`)".to_owned()
        } else {
            format!("{:.2} Gbit/s", settings.udp_bitrate as f64 / 1e9)
        },
        settings.udp_length,
        settings.udp_paced_bitrate as f64 / 1e9,
        100.0 * settings.max_foreign_share
    );
    let _ = writeln!(md);
    if let Some(why) = &results.stopped_early {
        let _ = writeln!(
            md,
            "The run {why}: cells summarise the repetitions completed by then.\n"
        );
    }

    let mut header = String::from("| Test |");
    let mut rule = String::from("|---|");
    for implementation in &implementations {
        let _ = write!(header, " {} |", column_label(*implementation));
        rule.push_str("---:|");
    }
    for baseline in &baselines {
        let _ = write!(header, " kubetun ÷ {} |", baseline.name());
        rule.push_str("---:|");
    }
    let _ = writeln!(md, "{header}\n{rule}");
    for &test in &tests {
        let mut row = format!("| {} |", test.label());
        for &implementation in &implementations {
            let text = cell(test, implementation).map_or_else(|| "–".to_owned(), throughput_text);
            let _ = write!(row, " {text} |");
        }
        for &baseline in &baselines {
            let ratio = results
                .ratios
                .iter()
                .find(|r| r.test == test && r.baseline == baseline)
                .and_then(|r| r.ratio);
            let text = ratio.map_or_else(|| "–".to_owned(), |r| format!("{r:.2}×"));
            let _ = write!(row, " {text} |");
        }
        let _ = writeln!(md, "{row}");
    }

    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "Daemon CPU (both ends together, % of one core, median) and TCP retransmits per run or \
         UDP loss (median); for UDP also where the datagrams were dropped (median per run): \
         before the tunnel (sender's TUN queue) / in the tunnel (receiving daemon's socket: \
         not decrypted in time) / at the receiver (iperf3's socket, after the tunnel):\n"
    );
    let mut header = String::from("| Test |");
    let mut rule = String::from("|---|");
    for implementation in &implementations {
        let _ = write!(header, " {} |", column_label(*implementation));
        rule.push_str("---|");
    }
    let _ = writeln!(md, "{header}\n{rule}");
    for &test in &tests {
        let mut row = format!("| {} |", test.label());
        for &implementation in &implementations {
            let text =
                cell(test, implementation).map_or_else(String::new, |o| details_text(test, o));
            let _ = write!(row, " {text} |");
        }
        let _ = writeln!(md, "{row}");
    }

    render_latency(&mut md, results);

    let _ = writeln!(md);
    let mut versions: Vec<String> = results
        .machine
        .daemons
        .iter()
        .map(|(i, v)| format!("{i}: `{v}`"))
        .collect();
    versions.insert(0, format!("iperf3: `{}`", results.machine.iperf3));
    let _ = writeln!(md, "Versions: {}.", versions.join("; "));
    for (implementation, reason) in &results.left_out {
        let _ = writeln!(md, "\nLeft out: {implementation} ({reason}).");
    }
    let _ = writeln!(
        md,
        "\nReproduce (as root, release build): `target/release/kubetun-bench --seconds {} \
         --repetitions {} --write-results benches/RESULTS.md`.",
        settings.seconds, settings.repetitions
    );
    md
}

/// The idle round-trip table, if latency was measured.
fn render_latency(md: &mut String, results: &BenchResults) {
    if results.latency.is_empty() {
        return;
    }
    let ping = &results.settings.ping;
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "Idle round trip through the tunnel (`ping -c {} -i {}`, one run per repetition, \
         interleaved like the throughput runs): median over the runs of the average RTT, the \
         smallest RTT seen, and the median's distance from veth's.\n",
        ping.count,
        ping.interval.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "| Implementation | median avg RTT (µs) | min RTT (µs) | above veth (µs) | runs | lost |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    let number = |value: Option<f64>| value.map_or_else(|| "–".to_owned(), |v| format!("{v:.0}"));
    for summary in &results.latency {
        let runs = if summary.disturbed > 0 {
            format!(
                "{} ({} disturbed, left out)",
                summary.runs, summary.disturbed
            )
        } else {
            summary.runs.to_string()
        };
        let _ = writeln!(
            md,
            "| {} | **{}** | {} | {} | {runs} | {} |",
            column_label(summary.implementation),
            number(summary.median_avg_us),
            number(summary.min_us),
            number(summary.above_veth_us),
            summary.lost
        );
    }
}

/// Replaces this harness's section of `existing` (from its heading to the next `## `
/// heading) with `section`, or appends it; other sections stay as they are.
pub fn replace_section(existing: &str, section: &str) -> String {
    let section = section.trim_end();
    let lines: Vec<&str> = existing.lines().collect();
    let start = lines.iter().position(|l| l.trim_end() == SECTION_HEADING);
    match start {
        Some(start) => {
            let end = lines[start + 1..]
                .iter()
                .position(|l| l.starts_with("## "))
                .map_or(lines.len(), |offset| start + 1 + offset);
            let mut out: Vec<String> = lines[..start].iter().map(|l| (*l).to_owned()).collect();
            out.push(section.to_owned());
            if end < lines.len() {
                out.push(String::new());
                out.extend(lines[end..].iter().map(|l| (*l).to_owned()));
            }
            let mut text = out.join("\n");
            text.push('\n');
            text
        }
        None => {
            let mut text = if existing.trim().is_empty() {
                "# Benchmark results\n".to_owned()
            } else {
                existing.trim_end().to_owned() + "\n"
            };
            text.push('\n');
            text.push_str(section);
            text.push('\n');
            text
        }
    }
}

/// Writes `section` into the results file at `path` (created if missing).
pub fn update_results_file(path: &Path, section: &str) -> std::io::Result<()> {
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    std::fs::write(path, replace_section(&existing, section))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Usage;
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
        assert!(md.contains("| UDP | **10.00** (10.00–10.00) | **2.00** (2.00–2.00) | disturbed (1 of 3 runs) | – |"), "{md}");
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
}
