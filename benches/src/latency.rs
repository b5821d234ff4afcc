//! Round-trip time through each implementation's tunnel at idle: `ping` at a low rate (the
//! tunnel carries nothing else), once per repetition and implementation, in the same rotated
//! order and with the same outside-load check as the throughput runs. Summarised per
//! implementation as the median of the runs' average RTTs and its distance from veth.

use std::time::Duration;

use serde::Serialize;

use crate::cpu::{Snapshot, Usage};
use crate::stats::median;
use crate::testbed::Testbed;
use kubetun_fixtures::implementations::Implementation;

/// How the idle round trip is measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PingSettings {
    /// Echo requests per run (0: no latency runs).
    pub count: u32,
    /// Time between requests.
    pub interval: Duration,
}

/// `ping`'s summary of one run, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PingStats {
    /// Requests sent.
    pub transmitted: u32,
    /// Replies received.
    pub received: u32,
    /// Smallest RTT.
    pub min_ms: f64,
    /// Average RTT.
    pub avg_ms: f64,
    /// Largest RTT.
    pub max_ms: f64,
}

/// One latency run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LatencyRecord {
    /// Repetition (0-based).
    pub repetition: u32,
    pub implementation: Implementation,
    /// ping's numbers, or why the run failed.
    pub result: Result<PingStats, String>,
    /// Whether outside load exceeded the threshold.
    pub disturbed: bool,
}

/// The summary of one implementation's latency runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LatencySummary {
    pub implementation: Implementation,
    /// Undisturbed, successful runs summarised.
    pub runs: usize,
    /// Runs left out because outside load disturbed them.
    pub disturbed: usize,
    /// Median over the runs of the average RTT, µs.
    pub median_avg_us: Option<f64>,
    /// Smallest RTT seen, µs.
    pub min_us: Option<f64>,
    /// `median_avg_us` minus veth's, µs (none without a veth number).
    pub above_veth_us: Option<f64>,
    /// Replies lost over all runs.
    pub lost: u32,
}

/// Parses the last two lines of `ping -q` output.
pub fn parse_ping(output: &str) -> Option<PingStats> {
    let counts = output.lines().find(|l| l.contains("packets transmitted"))?;
    let mut numbers = counts
        .split(", ")
        .filter_map(|part| part.split_whitespace().next()?.parse::<u32>().ok());
    let (transmitted, received) = (numbers.next()?, numbers.next()?);
    let rtt = output.lines().find(|l| l.starts_with("rtt "))?;
    let values = rtt.split(" = ").nth(1)?.split_whitespace().next()?;
    let mut values = values.split('/').filter_map(|v| v.parse::<f64>().ok());
    Some(PingStats {
        transmitted,
        received,
        min_ms: values.next()?,
        avg_ms: values.next()?,
        max_ms: values.next()?,
    })
}

/// Pings through `implementation`'s tunnel (or the veth) from the client namespace.
pub fn measure(
    testbed: &Testbed,
    settings: PingSettings,
    repetition: u32,
    implementation: Implementation,
    max_foreign_share: f64,
) -> LatencyRecord {
    let daemons = testbed.daemon_pids(implementation);
    let before = Snapshot::take(&daemons);
    let result = match testbed.server_address(implementation) {
        Some(server) => ping(testbed, settings, &server.to_string()),
        None => Err(format!("{implementation} is not part of the testbed")),
    };
    let usage = Usage::between(&before, &Snapshot::take(&daemons));
    LatencyRecord {
        repetition,
        implementation,
        result,
        disturbed: usage.foreign_share() > max_foreign_share,
    }
}

fn ping(testbed: &Testbed, settings: PingSettings, address: &str) -> Result<PingStats, String> {
    let interval = format!("{:.3}", settings.interval.as_secs_f64());
    let deadline = settings.interval * settings.count + Duration::from_secs(5);
    let output = testbed
        .client_ns()
        .command("ping")
        .args([
            "-n",
            "-q",
            "-c",
            &settings.count.to_string(),
            "-i",
            &interval,
        ])
        .args(["-w", &deadline.as_secs().to_string(), address])
        .output()
        .map_err(|e| format!("running ping: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    parse_ping(&text).ok_or_else(|| format!("no replies from {address}: {}", text.trim()))
}

/// One summary per implementation, in `implementations` order.
pub fn summarise(
    records: &[LatencyRecord],
    implementations: &[Implementation],
) -> Vec<LatencySummary> {
    let mut summaries: Vec<LatencySummary> = implementations
        .iter()
        .map(|&implementation| {
            let runs: Vec<&LatencyRecord> = records
                .iter()
                .filter(|r| r.implementation == implementation)
                .collect();
            let good: Vec<PingStats> = runs
                .iter()
                .filter(|r| !r.disturbed)
                .filter_map(|r| r.result.as_ref().ok().copied())
                .collect();
            let averages: Vec<f64> = good.iter().map(|s| s.avg_ms * 1000.0).collect();
            LatencySummary {
                implementation,
                runs: good.len(),
                disturbed: runs.iter().filter(|r| r.disturbed).count(),
                median_avg_us: median(&averages),
                min_us: good.iter().map(|s| s.min_ms * 1000.0).reduce(f64::min),
                above_veth_us: None,
                lost: good.iter().map(|s| s.transmitted - s.received).sum(),
            }
        })
        .collect();
    let veth = summaries
        .iter()
        .find(|s| s.implementation == Implementation::Veth)
        .and_then(|s| s.median_avg_us);
    for summary in &mut summaries {
        summary.above_veth_us = match (summary.median_avg_us, veth) {
            (Some(own), Some(veth)) if summary.implementation.is_tunnel() => Some(own - veth),
            _ => None,
        };
    }
    summaries
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "PING 10.99.1.2 (10.99.1.2) 56(84) bytes of data.\n\n\
        --- 10.99.1.2 ping statistics ---\n\
        100 packets transmitted, 99 received, 1% packet loss, time 2019ms\n\
        rtt min/avg/max/mdev = 0.073/0.194/0.328/0.065 ms\n";

    #[test]
    fn parses_ping_summaries() {
        let stats = parse_ping(OUTPUT).expect("parsed");
        assert_eq!((stats.transmitted, stats.received), (100, 99));
        assert_eq!(stats.min_ms, 0.073);
        assert_eq!(stats.avg_ms, 0.194);
        assert_eq!(stats.max_ms, 0.328);
        assert_eq!(
            parse_ping("100 packets transmitted, 0 received, 100% packet loss"),
            None
        );
        assert_eq!(parse_ping(""), None);
    }

    fn record(implementation: Implementation, avg_ms: f64, disturbed: bool) -> LatencyRecord {
        LatencyRecord {
            repetition: 0,
            implementation,
            result: Ok(PingStats {
                transmitted: 10,
                received: 10,
                min_ms: avg_ms / 2.0,
                avg_ms,
                max_ms: avg_ms * 2.0,
            }),
            disturbed,
        }
    }

    #[test]
    fn summaries_take_medians_and_compare_with_veth() {
        use Implementation::{Kubetun, Veth};
        let records = [
            record(Veth, 0.040, false),
            record(Veth, 0.050, false),
            record(Veth, 0.045, false),
            record(Kubetun, 0.200, false),
            record(Kubetun, 0.150, false),
            record(Kubetun, 0.100, true),
        ];
        let summaries = summarise(&records, &[Veth, Kubetun]);
        let veth = &summaries[0];
        assert_eq!(veth.median_avg_us.map(f64::round), Some(45.0));
        assert_eq!(veth.above_veth_us, None);
        let kubetun = &summaries[1];
        assert_eq!((kubetun.runs, kubetun.disturbed), (2, 1));
        assert_eq!(kubetun.median_avg_us.map(f64::round), Some(175.0));
        assert_eq!(kubetun.min_us.map(f64::round), Some(75.0));
        assert_eq!(kubetun.above_veth_us.map(f64::round), Some(130.0));
    }
}
