//! The clusters of the lab on real nodes, as planned ([`ClusterSpec`], the seed's [`SEED`]) and
//! as up ([`Cluster`]), the options, and the error of every step: the ground floor the
//! steps (`kit`, `checks`, `workloads`) and [`super::up`] share.

use std::path::PathBuf;

/// A step of the lab on real nodes failed.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {message}")]
pub struct NodeLabError {
    /// What was being done.
    pub step: String,
    /// Why it failed.
    pub message: String,
}

impl NodeLabError {
    /// `step` failed because of `message`.
    pub fn step(step: impl Into<String>, message: impl std::fmt::Display) -> Self {
        Self {
            step: step.into(),
            message: message.to_string(),
        }
    }
}

/// The label of the node meant for the gateway (`kubetun install --gateway-node-selector`).
pub const GATEWAY_LABEL: &str = "kubetun.io/gateway=true";

/// The image name the lab builds and imports into every node.
pub const IMAGE: &str = "localhost/kubetun:lab";

/// One cluster of the lab.
#[derive(Debug, Clone, Copy)]
pub struct ClusterSpec {
    /// The cluster id (`kubetun install --cluster-id`).
    pub id: &'static str,
    /// Shown in tables.
    pub name: &'static str,
    /// The first two octets of its pod CIDR (a /16; node k gets `A.B.k.0/24`).
    pub pod_prefix: &'static str,
    /// The hub (runs the ShortcutConnection operator and carries transit traffic).
    pub hub: bool,
}

/// The seed's clusters.
pub const SEED: [ClusterSpec; 4] = [
    ClusterSpec {
        id: "europe",
        name: "Europe",
        pod_prefix: "10.200",
        hub: true,
    },
    ClusterSpec {
        id: "rome",
        name: "Rome",
        pod_prefix: "10.202",
        hub: false,
    },
    ClusterSpec {
        id: "milan",
        name: "Milan",
        pod_prefix: "10.244",
        hub: false,
    },
    ClusterSpec {
        id: "paris",
        name: "Paris",
        pod_prefix: "10.244",
        hub: false,
    },
];

/// How to build the lab on real nodes.
#[derive(Debug, Clone)]
pub struct NodeLabOptions {
    /// `<state dir>/nodes` holds everything.
    pub state_dir: PathBuf,
    /// Where `kubetun`, `kubetun-gateway`, `kubetun-controller` and `kubetun-agent` are.
    pub binaries: PathBuf,
    /// The clusters (the first with `hub` is the hub).
    pub clusters: Vec<ClusterSpec>,
}

/// A cluster that is up.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// What it is.
    pub spec: ClusterSpec,
    /// Its directory (control plane in `cp/`, nodes in `gw/` and `wk/`).
    pub dir: PathBuf,
    /// Its admin kubeconfig (API server on 127.0.0.1).
    pub kubeconfig: PathBuf,
    /// The same, naming the API server as other clusters' pods reach it.
    pub underlay_kubeconfig: PathBuf,
}

impl Cluster {
    /// Its node names: the one meant for the gateway, then the worker.
    pub fn nodes(&self) -> [String; 2] {
        [
            format!("{}-gw", self.spec.id),
            format!("{}-worker", self.spec.id),
        ]
    }
}
