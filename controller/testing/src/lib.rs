//! Test support for the controller's programs (its own crate, so that the production
//! library carries no test code): an in-process gateway control API on a Unix socket, and the
//! cluster info, gateway settings and links tests build on.
//!
//! [`FakeGateway`] implements the `Gateway` service without a data plane: it records every
//! Apply, reports every applied peer `CONNECTED`, and can be stopped and restarted on the same
//! socket to exercise re-apply after a gateway restart. Not part of the stable API.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::Stream;
use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use kubetun_controller::gateway_api::gateway_server::{Gateway, GatewayServer};
use kubetun_controller::gateway_api::{
    ApplyRequest, ApplyResponse, ConnectionState, DesiredState, HoldRequest, HoldResponse,
    PeerStatus, StatusRequest, StatusResponse, WatchRequest,
};

#[derive(Debug, Default)]
struct State {
    current: Option<DesiredState>,
    generation: u64,
    history: Vec<DesiredState>,
    reject_with: Option<String>,
    /// The `active_for_ms` of every Hold, in order.
    holds: Vec<u32>,
}

#[derive(Debug, Clone)]
struct Service {
    state: Arc<Mutex<State>>,
    changes: watch::Sender<u64>,
    /// Flips to `false` when the server stops: open watch streams end, so the connections
    /// close as they would when a gateway process exits.
    running: watch::Receiver<bool>,
}

impl Service {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn status(&self) -> StatusResponse {
        let state = self.lock();
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let peers = state
            .current
            .iter()
            .flat_map(|s| &s.peers)
            .map(|peer| PeerStatus {
                public_key: peer.public_key.clone(),
                name: peer.name.clone(),
                endpoint: peer.endpoint.clone(),
                last_handshake_unix_ms: now_ms,
                latency_us: 250,
                state: ConnectionState::Connected as i32,
                routes: peer.routes.clone(),
                acl: peer.acl.clone(),
                ..PeerStatus::default()
            })
            .collect();
        StatusResponse {
            version: state
                .current
                .as_ref()
                .map(|s| s.version.clone())
                .unwrap_or_default(),
            generation: state.generation,
            interface_name: "fake0".to_owned(),
            public_key: String::new(),
            listen_port: state
                .current
                .as_ref()
                .and_then(|s| s.interface.as_ref())
                .map_or(0, |i| i.listen_port),
            peers,
            drops: Default::default(),
            host_errors: Vec::new(),
            active: state.holds.last().is_none_or(|ms| *ms > 0),
            leased: !state.holds.is_empty(),
            ..StatusResponse::default()
        }
    }
}

#[tonic::async_trait]
impl Gateway for Service {
    async fn apply(
        &self,
        request: Request<ApplyRequest>,
    ) -> Result<Response<ApplyResponse>, Status> {
        let desired = request.into_inner().state.unwrap_or_default();
        let generation = {
            let mut state = self.lock();
            if let Some(message) = state.reject_with.clone() {
                return Err(Status::invalid_argument(message));
            }
            state.history.push(desired.clone());
            let changed = state.current.as_ref() != Some(&desired);
            if changed {
                state.generation += 1;
                state.current = Some(desired);
            }
            (state.generation, changed)
        };
        self.changes.send_replace(generation.0);
        Ok(Response::new(ApplyResponse {
            generation: generation.0,
            changed: generation.1,
            host_errors: Vec::new(),
        }))
    }

    async fn hold(&self, request: Request<HoldRequest>) -> Result<Response<HoldResponse>, Status> {
        let active_for_ms = request.into_inner().active_for_ms;
        let mut state = self.lock();
        let was_active = state.holds.last().is_none_or(|ms| *ms > 0);
        state.holds.push(active_for_ms);
        Ok(Response::new(HoldResponse {
            was_active,
            active: active_for_ms > 0,
        }))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(Service::status(self)))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<StatusResponse, Status>> + Send + 'static>>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let interval = match request.into_inner().interval_ms {
            0 => Duration::from_secs(1),
            ms => Duration::from_millis(u64::from(ms)),
        };
        let service = self.clone();
        let mut changes = self.changes.subscribe();
        let mut running = self.running.clone();
        let stream = async_stream(move |tx| async move {
            let mut ticker = tokio::time::interval(interval);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    changed = changes.changed() => if changed.is_err() { return },
                    _ = running.wait_for(|running| !running) => return,
                }
                if tx.send(Ok(service.status())).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(stream))
    }
}

/// A stream fed by a spawned producer through a small channel.
fn async_stream<F, Fut>(
    producer: F,
) -> Pin<Box<dyn Stream<Item = Result<StatusResponse, Status>> + Send>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<StatusResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(producer(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// An in-process gateway control API. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeGateway {
    socket: PathBuf,
    service: Service,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
    _dir: Option<tempfile::TempDir>,
}

impl FakeGateway {
    /// Starts on a socket in a fresh temporary directory.
    pub async fn start() -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut gateway = Self::start_at(dir.path().join("gateway.sock")).await?;
        gateway._dir = Some(dir);
        Ok(gateway)
    }

    /// Starts on `socket` (a stale socket file is replaced). Starts empty, like a freshly
    /// started gateway.
    pub async fn start_at(socket: impl Into<PathBuf>) -> std::io::Result<Self> {
        let socket = socket.into();
        let (changes, _) = watch::channel(0);
        let (_, running) = watch::channel(false);
        let service = Service {
            state: Arc::default(),
            changes,
            running,
        };
        let mut gateway = Self {
            socket,
            service,
            shutdown: None,
            server: None,
            _dir: None,
        };
        gateway.serve()?;
        Ok(gateway)
    }

    fn serve(&mut self) -> std::io::Result<()> {
        match std::fs::remove_file(&self.socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(&self.socket)?;
        let (shutdown, stopped) = oneshot::channel::<()>();
        let (running, running_rx) = watch::channel(true);
        self.service.running = running_rx;
        let service = GatewayServer::new(self.service.clone())
            .max_decoding_message_size(
                kubetun_controller::plumbing::gateway_client::MAX_MESSAGE_BYTES,
            )
            .max_encoding_message_size(
                kubetun_controller::plumbing::gateway_client::MAX_MESSAGE_BYTES,
            );
        self.server = Some(tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                    running.send_replace(false);
                })
                .await;
            if let Err(error) = result {
                tracing::warn!(%error, "fake gateway stopped with an error");
            }
        }));
        self.shutdown = Some(shutdown);
        Ok(())
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops serving (open watch streams end) and forgets the applied state, like a gateway
    /// process that exited. The recorded history is kept.
    pub async fn stop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(mut server) = self.server.take() {
            // Graceful first (open streams end, connections close); a server that does not
            // finish in time is cut off.
            if tokio::time::timeout(Duration::from_secs(2), &mut server)
                .await
                .is_err()
            {
                server.abort();
                let _ = server.await;
            }
        }
        let mut state = self.service.lock();
        state.current = None;
        state.generation = 0;
        drop(state);
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Serves again on the same socket after [`Self::stop`].
    pub async fn restart(&mut self) -> std::io::Result<()> {
        self.stop().await;
        self.serve()
    }

    /// The state the gateway runs now.
    pub fn current(&self) -> Option<DesiredState> {
        self.service.lock().current.clone()
    }

    /// Every Apply received, oldest first.
    pub fn applied(&self) -> Vec<DesiredState> {
        self.service.lock().history.clone()
    }

    /// Makes every following Apply fail with INVALID_ARGUMENT and `message` (`None`: accept).
    pub fn reject_with(&self, message: Option<&str>) {
        self.service.lock().reject_with = message.map(str::to_owned);
    }
}

impl Drop for FakeGateway {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// A test cluster's info: `id` as id and name, the given CIDRs, the service CIDR
/// 10.96.0.0/12 and an endpoint `<id>.gateway.example:51820`. Panics on a malformed CIDR.
#[allow(clippy::unwrap_used)]
pub fn cluster_info(
    id: &str,
    pod: &str,
    external: &str,
    key: &kubetun_controller::keys::GatewayKey,
) -> kubetun_controller::plumbing::cluster_info::ClusterInfo {
    kubetun_controller::plumbing::cluster_info::ClusterInfo {
        cluster: kubetun_crds::ClusterRef {
            id: id.into(),
            name: id.into(),
        },
        pod_cidrs: vec![pod.parse().unwrap()],
        external_cidrs: vec![external.parse().unwrap()],
        service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
        endpoint: kubetun_crds::Endpoint {
            address: format!("{id}.gateway.example"),
            port: 51820,
        },
        public_key: key.public_base64().to_owned(),
        mtu: 1420,
    }
}

/// The gateway settings of a test cluster: its key, port 51820, its own ranges as local
/// prefixes, keepalive 25 s.
pub fn gateway_settings(
    key: &kubetun_controller::keys::GatewayKey,
    info: &kubetun_controller::plumbing::cluster_info::ClusterInfo,
) -> kubetun_controller::planner::GatewaySettings {
    kubetun_controller::planner::GatewaySettings {
        private_key: key.private_base64(),
        public_key: key.public_base64().to_owned(),
        listen_port: 51820,
        mtu: info.mtu,
        local_prefixes: info
            .local_ranges()
            .iter()
            .map(ToString::to_string)
            .collect(),
        persistent_keepalive: 25,
        ..kubetun_controller::planner::GatewaySettings::default()
    }
}

/// What a cluster that remaps none of `info`'s CIDRs (no overlap) reports for its
/// NetworkConfig: processed, every CIDR its own view.
pub fn unremapped_status(
    info: &kubetun_controller::plumbing::cluster_info::ClusterInfo,
) -> kubetun_crds::NetworkConfigStatus {
    let same = |cidrs: &[ipnet::IpNet]| {
        cidrs
            .iter()
            .map(|c| kubetun_crds::CidrMapping {
                real: c.to_string(),
                view: c.to_string(),
            })
            .collect()
    };
    kubetun_crds::NetworkConfigStatus {
        processed: true,
        pod_cidrs: same(&info.pod_cidrs),
        external_cidrs: same(&info.external_cidrs),
        ..kubetun_crds::NetworkConfigStatus::default()
    }
}

/// Writes into `local`'s cluster what the connector writes there to link `remote`, with
/// `remote`'s side simulated: `to-<remote>` (processed by the remote, nothing remapped) and
/// `from-<remote>`. Three requests.
pub async fn link_as_connector(
    configs: &kube::Api<kubetun_crds::NetworkConfig>,
    namespace: &str,
    local: &kubetun_controller::plumbing::cluster_info::ClusterInfo,
    remote: &kubetun_controller::plumbing::cluster_info::ClusterInfo,
) -> Result<(), kube::Error> {
    use kube::api::{Patch, PatchParams};
    use kubetun_controller::planner::{local_config_name, remote_config_name};
    use kubetun_crds::contract::link::{ROLE_LOCAL, ROLE_REMOTE};
    let id = &remote.cluster.id;
    let apply = PatchParams::apply(kubetun_controller::connector::FIELD_MANAGER).force();
    // The status describes the generation of our own NetworkConfig.
    let mut observed_generation = None;
    for (name, role, spec) in [
        (
            local_config_name(id),
            ROLE_LOCAL,
            local.network_config_for(&remote.cluster),
        ),
        (
            remote_config_name(id),
            ROLE_REMOTE,
            remote.network_config_for(&local.cluster),
        ),
    ] {
        let object =
            kubetun_controller::connector::network_config(&name, namespace, role, id, &spec);
        let written = configs.patch(&name, &apply, &Patch::Apply(&object)).await?;
        if role == ROLE_LOCAL {
            observed_generation = written.metadata.generation;
        }
    }
    let status = kubetun_crds::NetworkConfigStatus {
        observed_generation,
        ..unremapped_status(local)
    };
    configs
        .patch_status(
            &local_config_name(id),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await?;
    Ok(())
}
