//! What a benchmark run is configured with and what one iperf3 run recorded: shared by the
//! measurement loop ([`crate::harness`]) and the summaries ([`crate::report`]), below both.

use std::path::PathBuf;
use std::time::Duration;

use kubetun_testenv::iperf::{Mode, Report};
use serde::{Deserialize, Serialize};

use crate::cpu::Usage;
use crate::latency::PingSettings;
use crate::udp_drops::UdpDrops;
use kubetun_fixtures::implementations::{Binaries, Implementation};

/// One row of the results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Test {
    /// TCP, one stream.
    Tcp1,
    /// TCP, four parallel streams.
    Tcp4,
    /// UDP at the configured offered rate.
    Udp,
    /// UDP at a fixed offered rate the tunnels can carry: loss there is the tunnel's own.
    UdpPaced,
}

impl Test {
    /// Every test, in row order.
    pub const ALL: [Self; 4] = [Self::Tcp1, Self::Tcp4, Self::Udp, Self::UdpPaced];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp1 => "tcp-1",
            Self::Tcp4 => "tcp-4",
            Self::Udp => "udp",
            Self::UdpPaced => "udp-paced",
        }
    }

    /// Parses [`Test::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Whether the test runs UDP (loss, no retransmits, no warm-up left out).
    pub fn is_udp(self) -> bool {
        matches!(self, Self::Udp | Self::UdpPaced)
    }

    /// The row label in the table.
    pub fn label(self) -> &'static str {
        match self {
            Self::Tcp1 => "TCP, 1 stream",
            Self::Tcp4 => "TCP, 4 streams",
            Self::Udp => "UDP",
            Self::UdpPaced => "UDP, paced",
        }
    }

    pub(crate) fn mode(self, config: &BenchConfig) -> Mode {
        match self {
            Self::Tcp1 => Mode::Tcp { streams: 1 },
            Self::Tcp4 => Mode::Tcp { streams: 4 },
            Self::Udp => Mode::Udp {
                bitrate: config.udp_bitrate,
                length: config.udp_length(),
            },
            Self::UdpPaced => Mode::Udp {
                bitrate: config.udp_paced_bitrate,
                length: config.udp_length(),
            },
        }
    }
}

/// What to measure and how.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Prefix of the namespace and interface names.
    pub prefix: String,
    /// Directory for daemon logs and sockets.
    pub work_dir: PathBuf,
    /// The implementations (columns).
    pub implementations: Vec<Implementation>,
    /// The tests (rows).
    pub tests: Vec<Test>,
    /// Measured seconds per run (`iperf3 -t`).
    pub seconds: u32,
    /// Warm-up seconds left out of each run (`iperf3 -O`).
    pub omit: u32,
    /// Runs per cell.
    pub repetitions: u32,
    /// UDP offered rate in bits/s (0: as fast as the sender can).
    pub udp_bitrate: u64,
    /// The paced UDP test's offered rate in bits/s.
    pub udp_paced_bitrate: u64,
    /// The idle round-trip runs (one per repetition and implementation).
    pub ping: PingSettings,
    /// Tunnel MTU.
    pub mtu: u32,
    /// Outside CPU load, as a share of one core, above which a run counts as disturbed.
    pub max_foreign_share: f64,
    /// Extra attempts for a disturbed run.
    pub retries: u32,
    /// How long to wait for the machine to go quiet before each run.
    pub quiet_wait: Duration,
    /// Stop starting new runs after this long (the results say so).
    pub time_budget: Option<Duration>,
    /// The daemons' executables.
    pub binaries: Binaries,
    /// Implementations left out before the run, with the reason (reported with the results).
    pub left_out: Vec<(Implementation, String)>,
}

impl BenchConfig {
    /// UDP datagram payload: the largest that fits the tunnel MTU unfragmented.
    pub fn udp_length(&self) -> u32 {
        self.mtu - 28
    }
}

/// One iperf3 run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// Repetition (0-based).
    pub repetition: u32,
    /// Attempt within the repetition (0-based; > 0 after a disturbed attempt).
    pub attempt: u32,
    pub test: Test,
    pub implementation: Implementation,
    /// iperf3's numbers, or why the run failed.
    pub result: Result<Report, String>,
    /// CPU use over the run; `daemonSeconds` is side a (client), side b (server).
    pub usage: Usage,
    /// UDP runs: where the lost datagrams were dropped.
    pub udp_drops: Option<UdpDrops>,
    /// Whether outside load exceeded the threshold.
    pub disturbed: bool,
}
