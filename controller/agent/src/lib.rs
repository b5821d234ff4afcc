//! `kubetun-agent`, the route agent: on every node, policy routes that send traffic for remote
//! clusters to the node running the gateway, and the return path back on the gateway node.
//!
//! Layout:
//! - [`plan`] (pure): TunnelEndpoints + node facts + gateway location -> [`plan::DesiredState`].
//! - [`diff`](mod@diff) (pure): kernel state tagged as ours + desired state -> ordered [`diff::Change`]s.
//! - [`netlink`] (IO): reads the tagged kernel state and applies changes through rtnetlink.
//! - [`source`] (IO): TunnelEndpoints, Nodes and the gateway's location from the API.
//! - [`apply`] (IO): [`converge`] the kernel on a desired state, [`cleanup`] everything.
//! - [`daemon`]: the `kubetun-agent` process: flags, passes, watch loop, uninstall.
//!
//! Its own crate and binary so that only the agent links rtnetlink; it shares the
//! controller's core (`kubetun-controller`: kubeconfig clients, watches, API health).
//!
//! Everything the agent puts in the kernel is tagged: routes live in their own table with their
//! own protocol number, rules sit at one priority and point at that table, and the overlay
//! device has a fixed name. The tagged kernel state is the agent's only record: on every pass
//! (and so on every start) whatever is tagged but not desired is removed.

pub mod apply;
pub mod daemon;
pub mod diff;
pub mod netlink;
pub mod plan;
pub mod source;

pub use apply::{cleanup, converge};
pub use daemon::{AgentArgs, run};
