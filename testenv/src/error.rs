//! The crate's error: everything that can go wrong while starting or driving a test cluster
//! (the namespaces and iperf3 runs have their own, [`crate::netns::NetnsError`] and
//! [`crate::iperf::IperfError`]).

use std::time::Duration;

/// Everything that can go wrong while starting or driving a test cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{binary} not found: set KUBEBUILDER_ASSETS to a directory holding etcd and \
         kube-apiserver (as setup-envtest does), install them to /usr/local/kubebuilder/bin \
         (.ci/setup does), or put them on PATH"
    )]
    MissingBinary { binary: &'static str },
    #[error(
        "{path} not found; build it first with `cargo build -p {package}` (the profile of the \
         program that runs it)"
    )]
    MissingProgram {
        path: std::path::PathBuf,
        package: &'static str,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate generation failed: {0}")]
    Pki(#[from] rcgen::Error),
    #[error("{process} did not become ready in {waited:?}; last log lines:\n{log_tail}")]
    NotReady {
        process: &'static str,
        waited: Duration,
        log_tail: String,
    },
    #[error("{process} exited during start-up ({status}); last log lines:\n{log_tail}")]
    Exited {
        process: &'static str,
        status: std::process::ExitStatus,
        log_tail: String,
    },
    #[error("cannot build a client for the test cluster: {0}")]
    Kubeconfig(String),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}
