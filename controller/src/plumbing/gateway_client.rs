//! Client of the gateway control API (tonic over the gateway's Unix socket).
//!
//! The channel connects lazily and reconnects on the next call after the gateway went away,
//! so one [`GatewayClient`] lives as long as the controller; callers only decide when to
//! retry.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::gateway_api::gateway_client::GatewayClient as RawClient;
use crate::gateway_api::{
    ApplyRequest, ApplyResponse, DesiredState, HoldRequest, HoldResponse, StatusRequest,
    StatusResponse, WatchRequest,
};

pub use crate::socket_paths::{DEFAULT_INTERFACE, grpc_socket_path};

/// A call to the gateway failed.
#[derive(Debug, thiserror::Error)]
pub enum GatewayClientError {
    /// The gateway refused the state as invalid; the previous state stays active.
    #[error("gateway at {socket} rejected the state: {message}")]
    Rejected {
        /// Socket path.
        socket: PathBuf,
        /// The gateway's explanation.
        message: String,
    },
    /// The gateway could not be reached (not running, socket missing, permissions).
    #[error("gateway at {socket} is unavailable: {message}")]
    Unavailable {
        /// Socket path.
        socket: PathBuf,
        /// What failed.
        message: String,
    },
    /// Any other RPC failure.
    #[error("gateway at {socket}: {status}")]
    Rpc {
        /// Socket path.
        socket: PathBuf,
        /// The gRPC status.
        status: Box<tonic::Status>,
    },
}

impl GatewayClientError {
    /// True when the gateway refused the content (retrying the same state is useless).
    pub fn is_rejection(&self) -> bool {
        matches!(self, Self::Rejected { .. })
    }
}

/// Largest gRPC message the client sends or accepts, the gateway's own limit: tonic's 4 MiB
/// default holds the state (or status) of only about 27 000 peers.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// A handle on one gateway's control API. Cheap to clone.
#[derive(Debug, Clone)]
pub struct GatewayClient {
    socket: PathBuf,
    inner: RawClient<Channel>,
}

impl GatewayClient {
    /// A client for the gateway listening on `socket`. Connects on first use.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self::with_timeout(socket, Duration::from_secs(10))
    }

    /// Like [`GatewayClient::new`], with a per-call deadline other than 10 s (a debug-built
    /// gateway needs longer for tens of thousands of peers).
    pub fn with_timeout(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        let socket = socket.into();
        let path = socket.clone();
        // The URI is required by tonic but unused: the connector always dials the socket.
        let channel = Endpoint::from_static("http://kubetun-gateway.local")
            .connect_timeout(Duration::from_secs(2))
            .timeout(timeout)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { UnixStream::connect(path).await.map(TokioIo::new) }
            }));
        Self {
            socket,
            // Status replies and Apply requests grow with the peers; tonic's 4 MiB default
            // stops at about 27 000.
            inner: RawClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        }
    }

    /// The socket this client dials.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Replaces the gateway's desired state.
    pub async fn apply(&self, state: DesiredState) -> Result<ApplyResponse, GatewayClientError> {
        self.inner
            .clone()
            .apply(ApplyRequest { state: Some(state) })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| self.classify(status))
    }

    /// Puts the gateway under the lease: active for `active_for` from when it receives the
    /// call, or on standby at once with zero. Fails after `deadline`: a hold that arrives
    /// late would extend activity past what the lease allows.
    pub async fn hold(
        &self,
        active_for: Duration,
        deadline: Duration,
    ) -> Result<HoldResponse, GatewayClientError> {
        let mut request = tonic::Request::new(HoldRequest {
            active_for_ms: u32::try_from(active_for.as_millis()).unwrap_or(u32::MAX),
        });
        request.set_timeout(deadline);
        self.inner
            .clone()
            .hold(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| self.classify(status))
    }

    /// A snapshot of the gateway's status.
    pub async fn status(&self) -> Result<StatusResponse, GatewayClientError> {
        self.inner
            .clone()
            .status(StatusRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| self.classify(status))
    }

    /// A stream of status updates, every `interval` and on every applied change.
    pub async fn watch(
        &self,
        interval: Duration,
    ) -> Result<tonic::Streaming<StatusResponse>, GatewayClientError> {
        let interval_ms = u32::try_from(interval.as_millis()).unwrap_or(u32::MAX);
        self.inner
            .clone()
            .watch(WatchRequest { interval_ms })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| self.classify(status))
    }

    /// Turns a gRPC status into an error naming the socket. Transport failures (no socket,
    /// refused, reset) are recognised by an IO error in the source chain, not by message.
    pub fn classify(&self, status: tonic::Status) -> GatewayClientError {
        let socket = self.socket.clone();
        match status.code() {
            tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => {
                GatewayClientError::Rejected {
                    socket,
                    message: status.message().to_owned(),
                }
            }
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => {
                GatewayClientError::Unavailable {
                    socket,
                    message: innermost_cause(&status),
                }
            }
            _ if caused_by_io(&status) => GatewayClientError::Unavailable {
                socket,
                message: innermost_cause(&status),
            },
            _ => GatewayClientError::Rpc {
                socket,
                status: Box::new(status),
            },
        }
    }
}

/// True when an IO error is somewhere in the source chain.
fn caused_by_io(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return true;
        }
        source = cause.source();
    }
    false
}

/// The most specific cause of a transport failure (e.g. "No such file or directory").
fn innermost_cause(status: &tonic::Status) -> String {
    let mut message = status.message().to_owned();
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(cause) = source {
        message = cause.to_string();
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_socket_is_unavailable_with_the_os_reason() {
        let dir = tempfile::tempdir().unwrap();
        let client = GatewayClient::new(dir.path().join("absent.sock"));
        let error = client.status().await.unwrap_err();
        assert!(
            matches!(error, GatewayClientError::Unavailable { .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("absent.sock"), "{error}");
        assert!(!error.is_rejection());
    }
}
