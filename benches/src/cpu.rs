//! CPU accounting from `/proc`: the CPU time of the daemons under test, of the harness itself
//! (including the iperf3 processes it ran and reaped) and of the whole machine, so that a run
//! during which something else used the CPU can be recognised and left out.
//!
//! All times are in clock ticks (`USER_HZ`, 100 per second on Linux).

use std::time::Instant;

use serde::Serialize;

/// Clock ticks per second of the `/proc` counters (`USER_HZ`, fixed at 100 on Linux).
pub const TICKS_PER_SECOND: f64 = 100.0;

/// Machine-wide CPU time from the first line of `/proc/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SystemTimes {
    /// user + nice + system: time spent running tasks.
    pub tasks: u64,
    /// irq + softirq: interrupt work (the harness's own packets, mostly).
    pub interrupts: u64,
    /// Time the hypervisor ran something else while this machine wanted the CPU.
    pub steal: u64,
}

/// Parses the aggregate `cpu` line of `/proc/stat`.
pub fn parse_system_times(proc_stat: &str) -> Option<SystemTimes> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...
    let field = |i: usize| fields.get(i).copied().unwrap_or(0);
    Some(SystemTimes {
        tasks: field(0) + field(1) + field(2),
        interrupts: field(5) + field(6),
        steal: field(7),
    })
}

/// utime + stime (and, with `children`, cutime + cstime) of one `/proc/<pid>/stat` line.
pub fn parse_process_ticks(stat: &str, children: bool) -> Option<u64> {
    // The command name is parenthesised and may contain spaces: fields start after the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime 15, cutime 16, cstime 17.
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    let own = field(14)? + field(15)?;
    if children {
        Some(own + field(16)? + field(17)?)
    } else {
        Some(own)
    }
}

/// The command name (field 2) of a `/proc/<pid>/stat` line.
pub fn parse_command(stat: &str) -> Option<&str> {
    let start = stat.find('(')?;
    let end = stat.rfind(')')?;
    stat.get(start + 1..end)
}

fn read_system() -> SystemTimes {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|text| parse_system_times(&text))
        .unwrap_or_default()
}

/// CPU ticks of process `pid` (all its threads); 0 once it is gone.
pub fn process_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| parse_process_ticks(&stat, false))
        .unwrap_or(0)
}

/// CPU ticks of this process plus every child it has reaped.
fn own_ticks() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| parse_process_ticks(&stat, true))
        .unwrap_or(0)
}

/// CPU ticks of the kernel's softirq threads, which process the harness's packets when
/// interrupts back up.
fn softirq_thread_ticks() -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| parse_command(stat).is_some_and(|c| c.starts_with("ksoftirqd/")))
        .filter_map(|stat| parse_process_ticks(&stat, false))
        .sum()
}

/// A point-in-time reading of every counter a run needs.
#[derive(Debug, Clone)]
pub struct Snapshot {
    at: Instant,
    system: SystemTimes,
    own: u64,
    softirq_threads: u64,
    daemons: Vec<u64>,
}

impl Snapshot {
    /// Reads the counters now; `daemons` are the PIDs of the processes under test.
    pub fn take(daemons: &[u32]) -> Self {
        Self {
            at: Instant::now(),
            system: read_system(),
            own: own_ticks(),
            softirq_threads: softirq_thread_ticks(),
            daemons: daemons.iter().map(|pid| process_ticks(*pid)).collect(),
        }
    }
}

/// CPU use between two snapshots, in seconds of CPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Wall-clock seconds between the snapshots.
    pub wall_seconds: f64,
    /// CPU seconds of each daemon, in the order given.
    pub daemon_seconds: Vec<f64>,
    /// CPU seconds of the harness and the processes it reaped (iperf3).
    pub harness_seconds: f64,
    /// CPU seconds of everything else: task time not accounted to the harness or the daemons,
    /// plus time stolen by the hypervisor.
    pub foreign_seconds: f64,
}

impl Usage {
    /// Computes the usage between `before` and `after`.
    pub fn between(before: &Snapshot, after: &Snapshot) -> Self {
        let ticks = |a: u64, b: u64| b.saturating_sub(a) as f64 / TICKS_PER_SECOND;
        let daemon_seconds: Vec<f64> = before
            .daemons
            .iter()
            .zip(&after.daemons)
            .map(|(a, b)| ticks(*a, *b))
            .collect();
        let harness_seconds = ticks(before.own, after.own);
        let accounted = daemon_seconds.iter().sum::<f64>()
            + harness_seconds
            + ticks(before.softirq_threads, after.softirq_threads);
        let tasks = ticks(before.system.tasks, after.system.tasks);
        let steal = ticks(before.system.steal, after.system.steal);
        Self {
            wall_seconds: after.at.duration_since(before.at).as_secs_f64(),
            daemon_seconds,
            harness_seconds,
            foreign_seconds: (tasks - accounted).max(0.0) + steal,
        }
    }

    /// Foreign CPU as a fraction of one core over the run.
    pub fn foreign_share(&self) -> f64 {
        if self.wall_seconds > 0.0 {
            self.foreign_seconds / self.wall_seconds
        } else {
            0.0
        }
    }

    /// The daemons' CPU as percent of one core over the run.
    pub fn daemon_percent(&self) -> Vec<f64> {
        self.daemon_seconds
            .iter()
            .map(|s| {
                if self.wall_seconds > 0.0 {
                    100.0 * s / self.wall_seconds
                } else {
                    0.0
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat() {
        let text = "cpu  100 5 50 1000 7 3 4 9 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1\n";
        assert_eq!(
            parse_system_times(text),
            Some(SystemTimes {
                tasks: 155,
                interrupts: 7,
                steal: 9,
            })
        );
        assert_eq!(parse_system_times("intr 1\n"), None);
    }

    #[test]
    fn parses_process_stat_with_awkward_names() {
        let stat = "4242 (wg go) worker) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 75 10 5 20 0 8 0 12345 0 0";
        assert_eq!(parse_process_ticks(stat, false), Some(325));
        assert_eq!(parse_process_ticks(stat, true), Some(340));
        assert_eq!(parse_command(stat), Some("wg go) worker"));
        assert_eq!(parse_process_ticks("garbage", false), None);
    }

    fn snapshot(at: Instant, tasks: u64, steal: u64, own: u64, daemons: Vec<u64>) -> Snapshot {
        Snapshot {
            at,
            system: SystemTimes {
                tasks,
                interrupts: 0,
                steal,
            },
            own,
            softirq_threads: 0,
            daemons,
        }
    }

    #[test]
    fn foreign_time_is_what_nobody_in_the_run_used() {
        let start = Instant::now();
        let before = snapshot(start, 1000, 10, 50, vec![100, 200]);
        let after = snapshot(
            start + std::time::Duration::from_secs(10),
            // 10 s of wall time: daemons 8 s + 6 s, harness 3 s, someone else 1 s, steal 0.5 s.
            1000 + 1800,
            60,
            350,
            vec![900, 800],
        );
        let usage = Usage::between(&before, &after);
        assert_eq!(usage.daemon_seconds, vec![8.0, 6.0]);
        assert_eq!(usage.harness_seconds, 3.0);
        assert!((usage.foreign_seconds - 1.5).abs() < 1e-9, "{usage:?}");
        assert!((usage.foreign_share() - 0.15).abs() < 1e-3);
        assert_eq!(usage.daemon_percent(), vec![80.0, 60.0]);
    }

    #[test]
    fn accounting_skew_never_goes_negative() {
        let start = Instant::now();
        let before = snapshot(start, 0, 0, 0, vec![0]);
        let after = snapshot(
            start + std::time::Duration::from_secs(1),
            50,
            0,
            40,
            vec![30],
        );
        assert_eq!(Usage::between(&before, &after).foreign_seconds, 0.0);
    }
}
