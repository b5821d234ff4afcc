//! The gRPC control server (`kubetun.gateway.v1.Gateway` plus gRPC health) on a Unix socket.
//! `Apply` feeds the same [`Device::apply`] as the UAPI; `Status` and `Watch` report the
//! device with [`crate::status`].

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::clock::unix_ms;
use crate::device::{ApplyError, Device};
use crate::peercred::PeerPolicy;
use crate::proto;
use crate::proto::gateway_server::{Gateway, GatewayServer};
use crate::status::status_response;
use crate::unix_socket::SocketFile;

/// Largest gRPC message either side decodes. tonic's default of 4 MiB holds the state of about
/// 27 000 peers; this holds well over a million. Only admitted local clients can send.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;
/// Default Watch interval when the request leaves it 0.
const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_millis(1000);
/// Smallest Watch interval honoured.
const MIN_WATCH_INTERVAL: Duration = Duration::from_millis(100);
/// Longest hold accepted: leases are renewed every few seconds at most, and a hold far in
/// the future would keep a lost replica active long after another took over.
const MAX_HOLD_MS: u32 = 600_000;

/// The `Gateway` service implementation.
#[derive(Debug, Clone)]
pub struct GatewayService {
    device: Arc<Device>,
}

impl GatewayService {
    /// A service for `device`.
    pub fn new(device: Arc<Device>) -> Self {
        Self { device }
    }

    fn status(&self) -> proto::StatusResponse {
        status_response(&self.device.report(), unix_ms())
    }
}

/// Maps an apply failure to a gRPC status: problems with the request are INVALID_ARGUMENT,
/// problems of the host (the port is taken) FAILED_PRECONDITION.
fn apply_status(error: ApplyError) -> Status {
    match error {
        ApplyError::Bind { .. } => Status::failed_precondition(error.to_string()),
        ApplyError::Invalid(_) | ApplyError::Resolve { .. } => {
            Status::invalid_argument(error.to_string())
        }
    }
}

#[tonic::async_trait]
impl Gateway for GatewayService {
    async fn apply(
        &self,
        request: Request<proto::ApplyRequest>,
    ) -> Result<Response<proto::ApplyResponse>, Status> {
        let desired = request
            .into_inner()
            .state
            .ok_or_else(|| Status::invalid_argument("state is required"))?;
        let outcome = self
            .device
            .update(|current| Ok(crate::state::from_proto(desired.clone(), current)?))
            .await
            .map_err(apply_status)?;
        Ok(Response::new(proto::ApplyResponse {
            generation: outcome.generation,
            changed: outcome.changed,
            host_errors: outcome.host_errors,
        }))
    }

    async fn status(
        &self,
        _request: Request<proto::StatusRequest>,
    ) -> Result<Response<proto::StatusResponse>, Status> {
        Ok(Response::new(self.status()))
    }

    async fn hold(
        &self,
        request: Request<proto::HoldRequest>,
    ) -> Result<Response<proto::HoldResponse>, Status> {
        let active_for_ms = request.into_inner().active_for_ms;
        if active_for_ms > MAX_HOLD_MS {
            return Err(Status::invalid_argument(format!(
                "active_for_ms must be at most {MAX_HOLD_MS}"
            )));
        }
        let transition = self
            .device
            .hold(Duration::from_millis(u64::from(active_for_ms)));
        Ok(Response::new(proto::HoldResponse {
            was_active: transition.was_active,
            active: transition.active,
        }))
    }

    type WatchStream =
        Pin<Box<dyn Stream<Item = Result<proto::StatusResponse, Status>> + Send + 'static>>;

    async fn watch(
        &self,
        request: Request<proto::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let interval = match request.into_inner().interval_ms {
            0 => DEFAULT_WATCH_INTERVAL,
            ms => Duration::from_millis(u64::from(ms)).max(MIN_WATCH_INTERVAL),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let service = self.clone();
        let mut changes = self.device.subscribe();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    changed = changes.changed() => if changed.is_err() { return },
                }
                if tx.send(Ok(service.status())).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Binds the control socket at `path` (mode 0600, a stale file replaced).
pub async fn bind(path: &Path) -> std::io::Result<(UnixListener, SocketFile)> {
    SocketFile::bind(path).await
}

/// Serves the `Gateway` service and gRPC health on `listener` to peers `policy` admits until
/// the task is cancelled; the socket file is removed then.
pub async fn serve(
    listener: UnixListener,
    file: SocketFile,
    device: Arc<Device>,
    policy: PeerPolicy,
) -> std::io::Result<()> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<GatewayServer<GatewayService>>().await;
    tracing::info!(path = %file.path().display(), "gRPC control API listening");
    let result = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(
            GatewayServer::new(GatewayService::new(device))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming(policy.incoming(listener))
        .await;
    drop(file);
    result.map_err(std::io::Error::other)
}
