//! kubetun lab and netns test support: builds clusters as network namespaces.
//!
//! - [`netns`]: namespace, veth and process fixtures that clean up on drop.
//! - [`topology`]: lab topologies (YAML), with the seed Europe/Rome/Milan topology built in.
//! - [`lab`]: the lab itself (`kubetun-lab up | status | down`), run with the controller's
//!   IPAM and planner against real gateways.
//! - [`table`]: the per-cluster remap table in the seed document's format.
//! - [`iperf`]: bounded iperf3 runs between namespaces and their JSON reports.
//! - [`multinode`]: a cluster with several nodes, the route agent run in-process on each.

pub mod iperf;
pub mod lab;
pub mod multinode;
pub mod netns;
pub mod table;
pub mod topology;
