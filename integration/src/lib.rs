//! kubetun lab and netns test support: builds clusters as network namespaces.
//!
//! - [`netns`]: namespace, veth and process fixtures that clean up on drop.
//! - [`topology`]: lab topologies (YAML), with the seed Europe/Rome/Milan topology built in.
//! - [`lab`]: the lab itself (`kubetun-lab up | status | down`), run with the controller's
//!   IPAM and planner against real gateways.
//! - [`table`]: the per-cluster remap table in the seed document's format.
//! - [`iperf`]: bounded iperf3 runs between namespaces and their JSON reports.
//! - [`multinode`]: a cluster with several nodes, the route agent run in-process on each.
//! - [`service_demo`]: the Service a topology exports across its clusters.
//! - [`image`]: the kubetun image built from this build's binaries with buildah and podman.
//! - [`nodes`]: the lab on real nodes (`kubetun-lab up --nodes`): kubetun installed as pods.

pub mod ha;
pub mod image;
pub mod iperf;
pub mod lab;
pub mod multinode;
pub mod netns;
pub mod nodes;
pub mod service_demo;
pub mod table;
pub mod topology;

/// Writes `contents` to `path` (created or truncated) readable by its owner only: private keys
/// and configurations holding them.
pub fn write_private(path: &std::path::Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?
        .write_all(contents)
}
