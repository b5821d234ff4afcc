//! The environments kubetun's tests and the lab run in, with no kubetun code in them: real
//! Kubernetes API servers (etcd plus kube-apiserver on loopback, with real TLS and RBAC
//! authorization, started the way controller-runtime's envtest does) and network namespaces.
//!
//! - [`Assets`]: where the binaries are: `KUBEBUILDER_ASSETS` (the directory
//!   `setup-envtest` fills), else `/usr/local/kubebuilder/bin` (envtest's default), else `PATH`.
//! - [`TestCluster`]: one cluster (its own etcd, API server, CA, admin credentials and
//!   kubeconfig). Several side by side are several clusters. The API server can be stopped,
//!   killed and started again on the same port, certificates and data, as a real control
//!   plane restarts. Dropping the cluster stops its processes; a watchdog stops them when the
//!   owning process dies without dropping it (a panicking or killed test leaves nothing).
//! - [`netns`]: named network namespaces, veth pairs and processes in them, removed on drop.
//! - [`iperf`]: bounded iperf3 runs between namespaces and their JSON reports.
//! - [`bin_path`]: the workspace's programs, built next to the running test.
//! - [`mcs`]: the MCS API's upstream conformance suite, run and its report read.
//! - [`turn`]: turns for the groups of tests of one binary that run processes, so that
//!   merged test binaries run as they did apart.
//! - [`cluster_or_skip`]: the entry point for tests: a started cluster, or `None` with the
//!   reason printed; under `CI=true` a missing binary is a failure, never a skip.
//! - [`write_private`]: a file readable by its owner only (keys, kubeconfigs).
//!
//! What such a server lacks (no controller-manager: no garbage collection, no default
//! ServiceAccount per namespace; etcd 3.4: no streaming lists) is the code's problem to cope
//! with, not something this crate papers over. A test that needs Deployments, pods and their
//! EndpointSlices starts kube-controller-manager and `fake-kubelet` beside the API server
//! ([`TestCluster::start_workloads`]).
//!
//! The ground floor is `error` and `files`; `cluster`, `pki`, `workloads` and
//! `binaries` stand on it; this file only names what the crate offers.

mod binaries;
mod cluster;
mod error;
mod files;
pub mod iperf;
pub mod mcs;
pub mod netns;
mod pki;
mod turns;
mod workloads;

pub use binaries::{Assets, DEFAULT_ASSETS_DIR, bin_path, sibling_binary, workspace_program};
pub use cluster::{
    Lifetime, SERVICE_CIDR, TestCluster, client_for, cluster_or_skip, clusters_or_skip,
    install_tls_provider, required, stop_dir,
};
pub use error::Error;
pub use files::write_private;
pub use pki::ADMIN_USER;
pub use turns::{Turn, turn};
pub use workloads::{Workloads, fake_kubelet};
