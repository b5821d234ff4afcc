//! The lab: a topology's clusters as network namespaces, each with a real `kubetun-gateway`
//! configured over its gRPC socket with state computed by the controller's own IPAM and
//! planner, proven by ping and iperf3 across remapped addresses.
//!
//! - [`up`] builds the topology (cleaning a previous lab first), links the clusters (first
//!   `links`, then `shortcuts`, re-applying both ends), runs the checks and prints the remap
//!   table of every cluster. The lab stays up afterwards, also when a check failed, so it can
//!   be inspected; [`UpReport::passed`] says whether everything passed.
//! - [`status`] reports, per cluster and peer, the CIDRs and views, the addresses and the link
//!   state read from each gateway.
//! - [`move_gateway`] moves the gateway of a multi-node cluster to another node: the old
//!   process stops, the underlay endpoint moves along, a new process starts with the same key
//!   and is re-applied the same state over gRPC, the route agents re-converge, and the
//!   cluster's links are checked again.
//! - [`cut_or_heal`] cuts or heals the direct path between two clusters; with `transit`
//!   in the topology, a cut shortcut's traffic goes through the hub at the same addresses
//!   (`up` checks the switch both ways).
//! - [`down`] removes everything recorded in the state file, also after a crash.
//!
//! In a multi-node cluster the route agent's logic (plan, then converge) runs in-process on
//! every node after every apply and move, fed the cluster's TunnelEndpoints: what the
//! `kubetun-agent` DaemonSet does on each watch event, without an API server.

pub mod apiserver;
pub mod checks;
pub mod fabric;
pub mod install;
pub mod named;
pub mod naming;
pub mod plan;
pub mod services;
pub mod state;

mod agents;
mod connectivity;
mod gateway_move;
mod keys;
mod layout;
mod linking;
mod status;
mod teardown;
mod transit;
mod up;

use std::io::Write;
use std::path::PathBuf;

use kubetun_controller::planner::PlanError;
use kubetun_controller::plumbing::gateway_client::GatewayClientError;
use serde::Serialize;

use crate::multinode::MultiNodeError;
use crate::netns::{self, NetnsError};
use crate::table::ClusterTable;
use crate::topology::Topology;
use checks::Check;
use naming::PrefixError;
use state::StateError;

pub use agents::converge_agents;
pub use gateway_move::move_gateway;
pub use status::{ClusterStatus, LabStatus, PeerStatus, render_status, status};
pub use teardown::{DownOnDrop, down};
pub use transit::cut_or_heal;
pub use up::{preflight, up};

/// Where the user's lab keeps its state, sockets and logs.
pub const DEFAULT_STATE_DIR: &str = "/run/kubetun-lab";

/// Why the lab could not be built, inspected or removed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A precondition of the host is missing (root, /dev/net/tun, a tool).
    #[error("{0}")]
    Host(String),
    /// The naming prefix is invalid.
    #[error(transparent)]
    Prefix(#[from] PrefixError),
    /// A namespace, link or process operation failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The state file could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// A file could not be created.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// The controller's planner refused a NetworkConfig or TunnelEndpoint.
    #[error("{cluster}: {error}")]
    Plan {
        /// The cluster whose state was being computed.
        cluster: String,
        /// The planner's error.
        error: Box<PlanError>,
    },
    /// A gateway failed to start or rejected its state.
    #[error("gateway of {cluster}: {message}")]
    Gateway {
        cluster: String,
        /// What happened.
        message: String,
    },
    /// The gRPC call to a gateway failed.
    #[error("gateway of {cluster}: {error}")]
    Rpc {
        cluster: String,
        /// The client's error.
        error: Box<GatewayClientError>,
    },
    /// The async runtime for the gRPC clients could not start.
    #[error("cannot start the gRPC client runtime: {0}")]
    Runtime(std::io::Error),
    /// No lab is up (no state file).
    #[error("no lab is up (no state in {0})")]
    NotUp(PathBuf),
    /// The request does not fit the lab (unknown cluster or node, a single-node cluster).
    #[error("{0}")]
    Usage(String),
    /// The route agent failed on a node.
    #[error("route agent on {node}: {error}")]
    Agent {
        /// The node's namespace.
        node: String,
        /// What failed.
        error: Box<MultiNodeError>,
    },
    /// The gateway key file could not be read back.
    #[error("{path}: not a gateway key ({message})")]
    Key {
        /// The key file.
        path: PathBuf,
        /// Why it was refused.
        message: String,
    },
    /// A bug: the lab's own bookkeeping is inconsistent.
    #[error("internal error: {0}")]
    Internal(String),
}

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

/// What [`up`] found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpReport {
    /// Every check, in the order run.
    pub checks: Vec<Check>,
    /// The remap table of every cluster.
    pub tables: Vec<ClusterTable>,
}

impl UpReport {
    /// True when every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    /// The checks that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| !c.passed)
    }
}

fn report_check(out: &mut dyn Write, check: &Check) {
    let mark = if check.passed { "ok  " } else { "FAIL" };
    say(
        out,
        &format!("    [{mark}] {} — {}", check.description, check.detail),
    );
}

fn say(out: &mut dyn Write, line: &str) {
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The `kubetun-gateway` next to the running executable, else on `PATH`.
pub fn default_gateway_binary() -> PathBuf {
    netns::sibling_binary("kubetun-gateway")
}
