//! Scale benchmarks: how far one gateway and one hub controller go.
//!
//! - [`gateway`]: one `kubetun-gateway` with many simulated WireGuard peers (apply time,
//!   handshakes, memory, one busy peer's throughput among idle ones).
//! - [`hub`]: one `kubetun-controller` on a real API server with many remote clusters linked
//!   to it (convergence time, memory, API requests, reconcile latency of one change).
//! - [`services`]: one hub `kubetun-controller` importing the exported Services of many
//!   linked clusters (convergence time, memory, API requests per Service, one change).
//!
//! `kubetun-scale` runs them at full size; `benches/tests/e2e/scale.rs` at a reduced size.

pub mod gateway;
pub mod hub;
pub mod services;

use std::time::Duration;

/// A scale run could not be set up or carried out.
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    /// A network namespace or process fixture failed.
    #[error(transparent)]
    Netns(#[from] kubetun_testenv::netns::NetnsError),
    /// An I/O step failed.
    #[error("{what}: {source}")]
    Io {
        /// The step.
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// The gateway's control API failed.
    #[error("gateway control API: {0}")]
    Gateway(String),
    /// A Kubernetes API request failed.
    #[error("kubernetes API ({what}): {source}")]
    Kube {
        /// The request.
        what: String,
        /// The cause (boxed: `kube::Error` is large).
        source: Box<kube::Error>,
    },
    /// The test API server could not be started.
    #[error("test API server: {0}")]
    Testenv(Box<kubetun_testenv::Error>),
    /// More objects than the address plan of the run has room for.
    #[error("at most {most} {what}")]
    TooMany {
        /// What was counted.
        what: &'static str,
        /// The limit.
        most: u32,
    },
    /// Anything else that stops the run, described.
    #[error("{0}")]
    Setup(String),
    /// The run did not reach its goal in time.
    #[error("timed out after {after:?}: {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        after: Duration,
    },
}

impl From<kubetun_testenv::Error> for ScaleError {
    fn from(error: kubetun_testenv::Error) -> Self {
        Self::Testenv(Box::new(error))
    }
}

impl ScaleError {
    fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Io { what, source }
    }

    fn gateway(error: impl std::fmt::Display) -> Self {
        Self::Gateway(error.to_string())
    }

    fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let what = what.into();
        move |source| Self::Kube {
            what,
            source: Box::new(source),
        }
    }
}

/// Prints the last lines of a controller's log (after a failed run).
fn print_log_tail(path: &std::path::Path) {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(20).collect();
    eprintln!(
        "controller log (last lines, newest first):\n{}",
        tail.join("\n")
    );
}

/// Resident memory of a process from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    /// `VmRSS`, KiB.
    pub rss_kib: u64,
    /// `VmHWM` (peak RSS), KiB.
    pub peak_kib: u64,
}

/// Reads `VmRSS` and `VmHWM` of `pid`.
pub fn read_memory(pid: u32) -> Result<Memory, ScaleError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(ScaleError::io("read /proc/<pid>/status"))?;
    Ok(parse_memory(&status))
}

fn parse_memory(status: &str) -> Memory {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss_kib: field("VmRSS:"),
        peak_kib: field("VmHWM:"),
    }
}

/// Raises the soft limit of open files to at least `wanted` (up to the hard limit): every
/// simulated peer holds a socket.
pub fn raise_fd_limit(wanted: u64) -> Result<(), ScaleError> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) =
        getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| ScaleError::io("getrlimit")(e.into()))?;
    if soft >= wanted {
        return Ok(());
    }
    if hard < wanted {
        return Err(ScaleError::Setup(format!(
            "the open-files hard limit {hard} is below the {wanted} this run needs"
        )));
    }
    setrlimit(Resource::RLIMIT_NOFILE, wanted, hard)
        .map_err(|e| ScaleError::io("setrlimit")(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_fields_are_read_from_proc_status() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        let memory = parse_memory(status);
        assert_eq!((memory.rss_kib, memory.peak_kib), (1024, 2048));
        let own = read_memory(std::process::id()).unwrap();
        assert!(own.rss_kib > 0 && own.peak_kib >= own.rss_kib);
    }
}
