//! The lab's error ([`LabError`]), on the ground floor: what the lab's steps and commands
//! return. It wraps only failures of the ground floor beside it (a bad prefix from
//! [`crate::naming`], the state file from [`crate::state`], the in-process route agent from
//! [`crate::route_agent`]) and of the crates below; none of those uses it.

use std::path::PathBuf;

use kubetun_controller::planner::PlanError;
use kubetun_controller::plumbing::gateway_client::GatewayClientError;
use kubetun_testenv::netns::NetnsError;

use crate::naming::PrefixError;
use crate::route_agent::AgentError;
use crate::state::StateError;

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
        error: Box<AgentError>,
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
