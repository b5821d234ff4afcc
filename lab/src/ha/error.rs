//! The HA lab's error, below the lab and its ping train and relay.

/// Why the HA lab failed.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    #[error("API server: {0}")]
    Testenv(#[from] kubetun_testenv::Error),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Netns(#[from] kubetun_testenv::netns::NetnsError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Step(String),
}
