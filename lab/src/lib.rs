//! The kubetun lab (`kubetun-lab`): a topology's clusters as network namespaces, each with a
//! real `kubetun-gateway` configured over its gRPC socket with state computed by the
//! controller's own IPAM and planner (or with real API servers and `kubetun-controller`,
//! `--apiserver`; or on real nodes, `--nodes`), proven by ping and iperf3 across remapped
//! addresses.
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
//!
//! Floors, each using only those below it:
//!
//! - ground: [`error`] (the crate's error), [`state`] (the state file), [`naming`] (names of
//!   namespaces and links), [`plan`] (the gateways' states from the controller's IPAM and
//!   planner), [`topology`] with [`service_demo`], [`table`], `options`, [`named`]
//!   (namespaces by name), [`route_agent`] (the route agent in-process), `keys`;
//! - the fabric: [`fabric`] (namespaces, bridges, gateway processes), [`checks`],
//!   `connectivity`, `output`;
//! - control planes: [`control_plane`], [`dns_link`], [`install`], [`apiserver`], [`services`];
//! - the commands: `agents`, `layout`, `linking`, `transit`, `gateway_move`, `status`,
//!   `teardown`, `up`;
//! - the HA lab (`kubetun-lab ha`): [`ha`], replicated gateways on a real API server;
//! - the lab on real nodes: [`nodes`] with [`image`].
//!
//! This file only declares the modules and names the commands.

pub mod error;
mod keys;
pub mod named;
pub mod naming;
mod options;
pub mod plan;
pub mod route_agent;
pub mod service_demo;
pub mod state;
pub mod table;
pub mod topology;

pub mod checks;
mod connectivity;
pub mod fabric;
mod output;

pub mod apiserver;
pub mod control_plane;
pub mod dns_link;
pub mod install;
pub mod services;

mod agents;
mod gateway_move;
mod layout;
mod linking;
mod status;
mod teardown;
mod transit;
mod up;

pub mod ha;

pub mod image;
pub mod nodes;

pub use agents::converge_agents;
pub use error::LabError;
pub use gateway_move::move_gateway;
pub use options::{DEFAULT_STATE_DIR, LabOptions, default_gateway_binary};
pub use status::{ClusterStatus, LabStatus, PeerStatus, render_status, status};
pub use teardown::{DownOnDrop, down};
pub use transit::cut_or_heal;
pub use up::{UpReport, preflight, up};
