//! iperf3 runs between network namespaces: a one-off server, a bounded client (`-t`), and the
//! parsed JSON report (`-J`).

use std::fs::File;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::netns::{Netns, NetnsError, NsChild};

/// The iperf3 control port (default 5201).
pub const DEFAULT_PORT: u16 = 5201;

/// Why an iperf3 run produced no result.
#[derive(Debug, thiserror::Error)]
pub enum IperfError {
    /// iperf3 could not be started or exited unsuccessfully without a JSON error.
    #[error(transparent)]
    Command(#[from] NetnsError),
    /// iperf3 reported an error in its JSON output.
    #[error("iperf3: {0}")]
    Reported(String),
    /// The output is not the JSON report expected.
    #[error("iperf3 output is not a JSON report: {0}")]
    Json(serde_json::Error),
    /// A server log could not be written.
    #[error("iperf3 server log {path}: {error}")]
    Log {
        /// The log file.
        path: String,
        /// The OS error.
        error: std::io::Error,
    },
    /// The report lacks a field every complete run has.
    #[error("iperf3 report lacks {0}")]
    Incomplete(&'static str),
}

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// TCP with this many parallel streams.
    Tcp {
        /// Parallel streams (`-P`).
        streams: u32,
    },
    /// UDP at the offered bitrate (`-b`, 0 = as fast as possible) with datagrams of
    /// `length` bytes (`-l`).
    Udp {
        /// Offered bitrate in bits/s; 0 means unlimited.
        bitrate: u64,
        /// Datagram payload length.
        length: u32,
    },
}

/// One client run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSpec {
    /// Server address.
    pub server: String,
    /// Server port.
    pub port: u16,
    /// What to measure.
    pub mode: Mode,
    /// Measured seconds (`-t`).
    pub seconds: u32,
    /// Seconds of warm-up left out of the result (`-O`).
    pub omit: u32,
}

impl ClientSpec {
    /// The iperf3 command line (without the program name).
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "-c".to_owned(),
            self.server.clone(),
            "-p".to_owned(),
            self.port.to_string(),
            "-t".to_owned(),
            self.seconds.to_string(),
            "-J".to_owned(),
        ];
        if self.omit > 0 {
            args.extend(["-O".to_owned(), self.omit.to_string()]);
        }
        match self.mode {
            Mode::Tcp { streams } => {
                if streams > 1 {
                    args.extend(["-P".to_owned(), streams.to_string()]);
                }
            }
            Mode::Udp { bitrate, length } => {
                args.extend([
                    "-u".to_owned(),
                    "-b".to_owned(),
                    bitrate.to_string(),
                    "-l".to_owned(),
                    length.to_string(),
                ]);
            }
        }
        args
    }

    /// An upper bound on how long the run takes, for timeouts.
    pub fn deadline(&self) -> Duration {
        Duration::from_secs(u64::from(self.seconds + self.omit) + 10)
    }
}

/// The numbers of one run, from the client's JSON report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Goodput at the receiver, bits/s.
    pub received_bps: f64,
    /// Rate at the sender, bits/s.
    pub sent_bps: f64,
    /// TCP retransmissions (TCP only).
    pub retransmits: Option<u64>,
    /// Datagrams lost, percent (UDP only).
    pub lost_percent: Option<f64>,
    /// The server address as the client connected to it.
    pub remote_host: String,
    /// The client's own address.
    pub local_host: String,
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    start: Option<RawStart>,
    #[serde(default)]
    end: Option<RawEnd>,
}

#[derive(Deserialize)]
struct RawStart {
    #[serde(default)]
    connected: Vec<RawConnection>,
}

#[derive(Deserialize)]
struct RawConnection {
    local_host: String,
    remote_host: String,
}

#[derive(Deserialize)]
struct RawEnd {
    sum_sent: Option<RawSum>,
    sum_received: Option<RawSum>,
}

#[derive(Deserialize)]
struct RawSum {
    bits_per_second: f64,
    #[serde(default)]
    retransmits: Option<u64>,
    #[serde(default)]
    lost_percent: Option<f64>,
}

/// Parses a client's `-J` report.
pub fn parse_report(json: &str) -> Result<Report, IperfError> {
    let raw: Raw = serde_json::from_str(json).map_err(IperfError::Json)?;
    if let Some(error) = raw.error {
        return Err(IperfError::Reported(error));
    }
    let connection = raw
        .start
        .and_then(|s| s.connected.into_iter().next())
        .ok_or(IperfError::Incomplete("start.connected"))?;
    let end = raw.end.ok_or(IperfError::Incomplete("end"))?;
    let sent = end.sum_sent.ok_or(IperfError::Incomplete("end.sum_sent"))?;
    let received = end
        .sum_received
        .ok_or(IperfError::Incomplete("end.sum_received"))?;
    Ok(Report {
        received_bps: received.bits_per_second,
        sent_bps: sent.bits_per_second,
        retransmits: sent.retransmits,
        lost_percent: received.lost_percent,
        remote_host: connection.remote_host,
        local_host: connection.local_host,
    })
}

/// The address the server saw the client connect from, from a server's `-J` report.
pub fn parse_server_peer(json: &str) -> Result<String, IperfError> {
    let raw: Raw = serde_json::from_str(json).map_err(IperfError::Json)?;
    if let Some(error) = raw.error {
        return Err(IperfError::Reported(error));
    }
    raw.start
        .and_then(|s| s.connected.into_iter().next())
        .map(|c| c.remote_host)
        .ok_or(IperfError::Incomplete("start.connected"))
}

/// A one-off iperf3 server (`-s -1 -J`) in a namespace; its JSON report goes to a file.
#[derive(Debug)]
pub struct Server {
    child: NsChild,
}

impl Server {
    /// Starts a server bound to `bind` on `port`, writing its report to `log`.
    pub fn start(ns: &Netns, bind: &str, port: u16, log: &Path) -> Result<Self, IperfError> {
        let file = File::create(log).map_err(|error| IperfError::Log {
            path: log.display().to_string(),
            error,
        })?;
        let mut cmd = ns.command("iperf3");
        cmd.args(["-s", "-1", "-J", "-B", bind, "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(Stdio::null());
        Ok(Self {
            child: NsChild::spawn(&mut cmd)?,
        })
    }

    /// The server's PID (for CPU accounting).
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Waits up to `timeout` for the server to exit after its one test, then stops it.
    pub fn finish(mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.child.is_running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.stop();
    }
}

/// Runs a client in `ns`; retries while the server is not listening yet (up to 3 s).
pub fn run_client(ns: &Netns, spec: &ClientSpec) -> Result<Report, IperfError> {
    let args = spec.args();
    let mut argv: Vec<&str> = vec!["timeout", "-s", "KILL"];
    let limit = spec.deadline().as_secs().to_string();
    argv.push(&limit);
    argv.push("iperf3");
    argv.extend(args.iter().map(String::as_str));
    let retry_until = Instant::now() + Duration::from_secs(3);
    loop {
        // iperf3 -J prints its JSON report (also of an error) on stdout and exits non-zero on
        // error, so read stdout either way.
        let out = ns
            .command(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .output()
            .map_err(|source| NetnsError::Spawn {
                command: argv.join(" "),
                source,
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let result = if stdout.trim().is_empty() {
            Err(IperfError::Command(NetnsError::Command {
                command: argv.join(" "),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            }))
        } else {
            parse_report(&stdout)
        };
        match result {
            Err(IperfError::Reported(message))
                if message.contains("Connection refused") && Instant::now() < retry_until =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = r#"{"start":{"connected":[{"socket":5,"local_host":"10.70.0.11","local_port":40000,"remote_host":"10.68.0.11","remote_port":5201}]},
        "intervals":[],
        "end":{"sum_sent":{"bits_per_second":2.5e9,"retransmits":12,"sender":true},
               "sum_received":{"bits_per_second":2.4e9,"sender":true}}}"#;

    const UDP: &str = r#"{"start":{"connected":[{"local_host":"10.99.1.1","remote_host":"10.99.1.2"}]},
        "end":{"sum":{"bits_per_second":1.0},
               "sum_sent":{"bits_per_second":1.3e9,"lost_percent":0},
               "sum_received":{"bits_per_second":4.8e8,"lost_percent":62.8}}}"#;

    #[test]
    fn parses_tcp_reports() {
        let report = parse_report(TCP).unwrap();
        assert_eq!(report.received_bps, 2.4e9);
        assert_eq!(report.sent_bps, 2.5e9);
        assert_eq!(report.retransmits, Some(12));
        assert_eq!(report.lost_percent, None);
        assert_eq!(report.remote_host, "10.68.0.11");
        assert_eq!(report.local_host, "10.70.0.11");
    }

    #[test]
    fn parses_udp_reports() {
        let report = parse_report(UDP).unwrap();
        assert_eq!(report.received_bps, 4.8e8);
        assert_eq!(report.lost_percent, Some(62.8));
        assert_eq!(report.retransmits, None);
    }

    #[test]
    fn surfaces_reported_errors() {
        let err = parse_report(
            r#"{"start":{},"error":"unable to connect to server: Connection refused"}"#,
        );
        assert!(
            matches!(&err, Err(IperfError::Reported(m)) if m.contains("Connection refused")),
            "{err:?}"
        );
        let err = parse_report(r#"{"start":{"connected":[]}}"#);
        assert!(matches!(err, Err(IperfError::Incomplete(_))), "{err:?}");
    }

    #[test]
    fn server_report_names_the_client_as_seen_by_the_server() {
        let json =
            r#"{"start":{"connected":[{"local_host":"10.70.0.11","remote_host":"10.201.0.11"}]}}"#;
        assert_eq!(parse_server_peer(json).unwrap(), "10.201.0.11");
    }

    #[test]
    fn client_arguments() {
        let mut spec = ClientSpec {
            server: "10.99.1.2".into(),
            port: DEFAULT_PORT,
            mode: Mode::Tcp { streams: 4 },
            seconds: 10,
            omit: 1,
        };
        assert_eq!(
            spec.args().join(" "),
            "-c 10.99.1.2 -p 5201 -t 10 -J -O 1 -P 4"
        );
        spec.mode = Mode::Udp {
            bitrate: 0,
            length: 1372,
        };
        spec.omit = 0;
        assert_eq!(
            spec.args().join(" "),
            "-c 10.99.1.2 -p 5201 -t 10 -J -u -b 0 -l 1372"
        );
        assert_eq!(spec.deadline(), Duration::from_secs(20));
    }
}
