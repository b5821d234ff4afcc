//! Why the device could not be created ([`DeviceError`]) or a desired state not applied
//! ([`ApplyError`]): the ground floor of the device's modules.

use kubetun_gateway_core::state::StateError;

/// Why the device could not be created.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The TUN device could not be created.
    #[error("creating TUN device {name}: {source}")]
    Tun {
        name: String,
        source: std::io::Error,
    },
    /// The UDP sockets could not be bound.
    #[error("binding UDP sockets: {0}")]
    Bind(std::io::Error),
    /// The handshake worker thread could not be started.
    #[error("starting the handshake worker: {0}")]
    Worker(std::io::Error),
}

/// Why a desired state was not applied. The previous state stays active in every case.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The state is invalid (including routes the remap table rejects, and too many peers).
    #[error(transparent)]
    Invalid(#[from] StateError),
    /// An endpoint name did not resolve.
    #[error("peer {peer}: cannot resolve endpoint {endpoint}: {reason}")]
    Resolve {
        peer: String,
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// The listen port could not be bound.
    #[error("cannot listen on UDP port {port}: {source}")]
    Bind { port: u16, source: std::io::Error },
}
