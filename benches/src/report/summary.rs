//! The runs summarised per test and implementation: median goodput with min–max, the daemons'
//! CPU, retransmits or loss, and the ratios to kubetun within the same run.

use serde::Serialize;

use crate::latency::{self, LatencyRecord, LatencySummary, PingSettings};
use crate::machine::Machine;
use crate::model::{BenchConfig, RunRecord, Test};
use crate::stats::median;
use crate::udp_drops::UdpDrops;
use kubetun_fixtures::implementations::Implementation;

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

pub(super) fn measured(
    cells: &[Cell],
    test: Test,
    implementation: Implementation,
) -> Option<&Measured> {
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
