//! The summary as the markdown section of `benches/RESULTS.md`, and the file updated in place.

use std::fmt::Write as _;
use std::path::Path;

use super::summary::{BenchResults, Outcome};
use crate::model::Test;
use kubetun_fixtures::implementations::Implementation;

/// The heading of this harness's section in the results file.
pub const SECTION_HEADING: &str = "## Throughput (iperf3, netns)";

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
