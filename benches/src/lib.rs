//! The iperf3 throughput harness: kubetun-gateway, wireguard-go and boringtun-cli carrying
//! the same tunnel between two network namespaces, plain veth as the ceiling, measured in one
//! interleaved run with CPU accounting and outside-load detection.
//!
//! - [`testbed`]: the namespaces, daemons and `wg setconf` configuration.
//! - [`harness`]: the measurement loop.
//! - [`model`]: the run configuration and the record of one run, shared by the loop and
//!   the report.
//! - [`stats`]: the median of the runs' numbers.
//! - [`cpu`]: CPU time of daemons, harness and everything else, from `/proc`.
//! - [`report`]: medians, ranges, ratios, the markdown section and the results file.
//! - [`implementations`]: the compared implementations and where their executables are.
//! - [`machine`]: what a result was measured on.
//! - [`interrupt`]: a clean stop on SIGINT/SIGTERM.
//! - [`scale`]: one gateway with many peers and one hub controller with many remote clusters
//!   (`kubetun-scale`).
//!
//! The criterion micro-benchmarks live in `benches/`.

pub mod cpu;
pub mod harness;
pub mod implementations;
pub mod interrupt;
pub mod latency;
pub mod machine;
pub mod model;
pub mod report;
pub mod scale;
pub mod stats;
pub mod testbed;
pub mod udp_drops;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use implementations::{Binaries, Implementation, find_on_path, install_boringtun};

/// The harness's directory next to the build's profile directories (`target/kubetun-bench`),
/// found from the running executable (a binary in `target/<profile>/` or a test in
/// `target/<profile>/deps/`).
pub fn default_work_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.pop();
    dir.join("kubetun-bench")
}

/// Where `cargo install` puts boringtun-cli for the harness (`<work dir>/tools`).
pub fn tools_dir(work_dir: &Path) -> PathBuf {
    work_dir.join("tools")
}

/// The `kubetun-gateway` built alongside the running executable, else on `PATH`.
pub fn sibling_gateway() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?.to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join("kubetun-gateway");
    if path.is_file() {
        Some(path)
    } else {
        find_on_path("kubetun-gateway")
    }
}

/// Finds the executable of every requested implementation: an explicit path wins, then the
/// usual places; boringtun-cli is installed into `tools` when `install_timeout` is given.
/// Returns the binaries and the implementations left out with the reason.
pub fn locate_binaries(
    requested: &[Implementation],
    explicit: Binaries,
    tools: &Path,
    install_timeout: Option<Duration>,
    out: &mut dyn Write,
) -> (Binaries, Vec<(Implementation, String)>) {
    let installed = tools.join("bin").join("boringtun-cli");
    let mut binaries = Binaries {
        kubetun: explicit.kubetun.or_else(sibling_gateway),
        wireguard_go: explicit
            .wireguard_go
            .or_else(|| find_on_path("wireguard-go")),
        boringtun_cli: explicit.boringtun_cli.or_else(|| {
            installed
                .is_file()
                .then(|| installed.clone())
                .or_else(|| find_on_path("boringtun-cli"))
        }),
        kubetun_baseline: explicit.kubetun_baseline,
    };
    if requested.contains(&Implementation::BoringtunCli)
        && binaries.boringtun_cli.is_none()
        && let Some(timeout) = install_timeout
    {
        let _ = writeln!(
            out,
            "installing boringtun-cli into {} (at most {} s)",
            tools.display(),
            timeout.as_secs()
        );
        match install_boringtun(tools, timeout) {
            Ok(path) => binaries.boringtun_cli = Some(path),
            Err(e) => {
                let _ = writeln!(out, "{e}");
            }
        }
    }
    let left_out = requested
        .iter()
        .filter(|i| i.is_tunnel() && binaries.of(**i).is_none())
        .map(|i| {
            let reason = match i {
                Implementation::Kubetun
                | Implementation::KubetunBusyPoll
                | Implementation::KubetunMq => {
                    "kubetun-gateway not found: build it (cargo build --release -p kubetun-gateway)"
                }
                Implementation::KubetunBaseline => {
                    "kubetun-baseline needs --kubetun-baseline <another kubetun-gateway build>"
                }
                Implementation::WireguardGo => {
                    "wireguard-go not found: install it (apt-get install wireguard-go)"
                }
                _ => "boringtun-cli not found: pass --install-boringtun to install it with cargo",
            };
            (*i, reason.to_owned())
        })
        .collect();
    (binaries, left_out)
}
