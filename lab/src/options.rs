//! How to build a lab ([`LabOptions`]) and its defaults: where the state lives and which
//! programs run.

use std::path::PathBuf;

use crate::LabError;
use crate::topology::Topology;

/// Where the user's lab keeps its state, sockets and logs.
pub const DEFAULT_STATE_DIR: &str = "/run/kubetun-lab";

/// How to build a lab.
#[derive(Debug, Clone)]
pub struct LabOptions {
    pub topology: Topology,
    /// Prefix of every name (empty for the user's lab; tests use their own).
    pub prefix: String,
    /// Directory of the state file, sockets and logs.
    pub state_dir: PathBuf,
    /// The `kubetun-gateway` binary.
    pub gateway_binary: PathBuf,
    /// Seconds of each iperf3 check; 0 skips them.
    pub iperf_seconds: u32,
    /// Run a real API server and `kubetun-controller` per cluster and link the clusters with
    /// the `kubetun` CLI, instead of computing the gateway states in-process.
    pub apiserver: bool,
}

/// The `kubetun-gateway` next to the running executable, else on `PATH`.
pub fn default_gateway_binary() -> PathBuf {
    kubetun_testenv::sibling_binary("kubetun-gateway")
}

/// A workspace program the lab runs (`kubetun-lab` itself for its stand-ins, the controller,
/// the CLI), which must be there: a missing one is a host error naming the build command,
/// instead of a stand-in that silently never starts inside its namespace.
pub(crate) fn program(name: &str) -> Result<PathBuf, LabError> {
    kubetun_testenv::workspace_program(name).map_err(|e| LabError::Host(e.to_string()))
}
