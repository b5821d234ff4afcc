//! The device: one TUN interface, its UDP sockets, and the peers, driven by data-path tasks
//! that read an immutable [`Snapshot`]. [`Device::apply`] is the single entry point for
//! configuration changes (gRPC and UAPI alike): it validates a [`DesiredState`], builds the
//! next snapshot (keeping the sessions of peers whose keys did not change), swaps it in, and
//! then brings the host configuration (MTU, addresses, routes) in line.

pub mod datapath;
mod error;
pub mod handshake;
pub mod handshake_queue;
mod host;
pub mod net;
pub mod probe;
mod report;
mod resolve;
mod retired;
pub mod shared;
pub mod spin;
pub mod workers;

#[cfg(test)]
mod admission_netns_tests;

pub use self::error::{ApplyError, DeviceError};
pub use self::report::{
    AdmissionReport, ConnCheckReport, DeviceReport, FlowTableReport, PeerReport, PolicyReport,
};

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use ipnet::IpNet;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::net::Sockets;
use self::shared::Shared;
use crate::io_options::IoOptions;
use kubetun_gateway_core::admission::flows::FlowTable;
use kubetun_gateway_core::role::{Role, Transition};
use kubetun_gateway_core::snapshot::Snapshot;
use kubetun_gateway_core::state::DesiredState;

/// TUN transmit queue length; the kernel default of 500 drops bursts under TCP load.
pub const TUN_TX_QUEUE_LEN: u32 = 5000;

/// The result of an [`Device::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// The generation now active.
    pub generation: u64,
    /// Whether anything changed.
    pub changed: bool,
    /// What of the host configuration (MTU, addresses, routes) could not be applied; the
    /// device retries it every [`HOST_RETRY`] until it succeeds.
    pub host_errors: Vec<String>,
}

/// How often host configuration that failed is tried again.
pub const HOST_RETRY: Duration = Duration::from_secs(2);

/// Host configuration applied so far, and the UDP reader tasks of the current sockets.
#[derive(Debug, Default)]
struct Control {
    readers: Vec<JoinHandle<()>>,
    addresses: Vec<IpNet>,
    routes: Vec<IpNet>,
    mtu: u16,
    /// The snapshots the last swaps replaced, kept to reuse their tables' memory.
    retired: retired::Retired,
}

/// A running gateway device.
#[derive(Debug)]
pub struct Device {
    name: String,
    shared: Arc<Shared>,
    control: tokio::sync::Mutex<Control>,
    tasks: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    /// The failures of the last host sync; empty when the host matches the state. Outside
    /// [`Control`] so that status readers need not wait for an apply; written only with
    /// `control` held.
    host_errors: parking_lot::Mutex<Vec<String>>,
    changes: watch::Sender<u64>,
}

impl Device {
    /// Creates the TUN device `name`, binds UDP sockets on a kernel-chosen port, and starts the
    /// data-path tasks with an empty configuration and every I/O technique on. Must run
    /// inside a tokio runtime.
    pub fn create(name: &str) -> Result<Arc<Device>, DeviceError> {
        Self::create_with(name, IoOptions::default())
    }

    /// Like [`Device::create`], with the I/O techniques of `io`.
    pub fn create_with(name: &str, io: IoOptions) -> Result<Arc<Device>, DeviceError> {
        let initial = DesiredState::default();
        let queues = io.queues();
        let tun_error = |source| DeviceError::Tun {
            name: name.to_owned(),
            source,
        };
        let tun = tun_rs::DeviceBuilder::new()
            .name(name)
            .mtu(initial.interface.mtu)
            .with(|builder| {
                builder
                    .tx_queue_len(TUN_TX_QUEUE_LEN)
                    .offload(io.tun_offload);
                if queues > 1 {
                    builder.multi_queue(true);
                }
            })
            .build_async()
            .map_err(tun_error)?;
        // Every further queue is one more descriptor attached to the same interface, with
        // the same flags and offloads.
        let mut tun_queues = Vec::with_capacity(queues);
        for _ in 1..queues {
            tun_queues.push(Arc::new(tun.try_clone().map_err(tun_error)?));
        }
        tracing::info!(
            tun_offload = tun.tcp_gso(),
            tun_udp_offload = tun.udp_gso(),
            batch = io.batch(),
            queues,
            "TUN device created"
        );
        tun_queues.insert(0, Arc::new(tun));
        let sockets = Sockets::bind(0, 0, &io).map_err(DeviceError::Bind)?;
        let snapshot = Snapshot::initial(initial.clone());
        let (handshakes, handshake_queue) = handshake_queue::HandshakeQueue::new();
        let shared = Arc::new(Shared {
            snapshot: Arc::new(ArcSwap::from_pointee(snapshot)),
            sockets: ArcSwap::from_pointee(sockets),
            io,
            drops: Default::default(),
            handshakes,
            stopped: watch::channel(false).0,
            tun_queues,
            role: Role::default(),
            replan: tokio::sync::Notify::new(),
            activity: Arc::default(),
            workers: workers::CryptoWorkers::new(io.crypto_workers())
                .map_err(DeviceError::Worker)?,
            flows: FlowTable::new(io.flow_table_size()),
        });
        handshake::spawn_worker(Arc::downgrade(&shared), handshake_queue)
            .map_err(DeviceError::Worker)?;
        let device = Arc::new(Device {
            name: name.to_owned(),
            shared: Arc::clone(&shared),
            control: tokio::sync::Mutex::new(Control {
                mtu: initial.interface.mtu,
                ..Control::default()
            }),
            tasks: parking_lot::Mutex::new(
                (0..queues)
                    .map(|queue| tokio::spawn(datapath::tun_loop(Arc::clone(&shared), queue)))
                    .chain([
                        tokio::spawn(datapath::timer_loop(Arc::clone(&shared))),
                        tokio::spawn(resolve::reresolve_loop(Arc::clone(&shared))),
                        tokio::spawn(probe::prober_loop(Arc::clone(&shared))),
                    ])
                    .collect(),
            ),
            changes: watch::channel(0).0,
            host_errors: parking_lot::Mutex::default(),
        });
        if let Ok(mut control) = device.control.try_lock() {
            control.readers = spawn_readers(&shared, &shared.sockets.load());
        }
        let retry = tokio::spawn(host_retry_loop(Arc::downgrade(&device)));
        let replan = tokio::spawn(replan_loop(Arc::downgrade(&device)));
        device.tasks.lock().extend([retry, replan]);
        let spin = shared.io.spin_window;
        if !spin.is_zero() {
            if spin::runtime_supports_spinning() {
                let spinner = tokio::spawn(spin::spin_loop(Arc::clone(&shared.activity), spin));
                device.tasks.lock().push(spinner);
            } else {
                tracing::debug!("no spin window: the runtime has several threads");
            }
        }
        Ok(device)
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.load_full()
    }

    /// Drop counters.
    pub fn drops(&self) -> &kubetun_gateway_core::drops::Drops {
        &self.shared.drops
    }

    /// A receiver notified with the generation after every applied change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Completes when the data path stopped by itself (the TUN device failed or was deleted).
    pub async fn stopped(&self) {
        let mut stopped = self.shared.stopped.subscribe();
        let _ = stopped.wait_for(|stopped| *stopped).await;
    }

    /// Whether the device can carry traffic: it has a private key (sockets are always bound).
    pub fn is_ready(&self) -> bool {
        let snapshot = self.shared.snapshot.load();
        snapshot.identity.is_some()
    }

    /// Validates `next` and makes it the active state. Applying the state already active
    /// changes nothing. On error the previous state stays active.
    pub async fn apply(&self, next: DesiredState) -> Result<ApplyOutcome, ApplyError> {
        self.update(|_| Ok(next.clone())).await
    }

    /// Like [`Device::apply`], with the next state derived from the active one by `change`;
    /// concurrent updates are serialized, so none is lost (a UAPI `set` is a read-modify-write).
    ///
    /// Endpoint names are looked up without the control lock (a lookup may take up to its
    /// timeout, and other updates, `get`s and status calls must not wait for it). If another
    /// update landed meanwhile, `change` runs again on the new state; after a few such races
    /// the lookup happens under the lock, so an update cannot starve.
    pub async fn update(
        &self,
        change: impl Fn(&DesiredState) -> Result<DesiredState, ApplyError>,
    ) -> Result<ApplyOutcome, ApplyError> {
        const OPTIMISTIC_ATTEMPTS: usize = 3;
        let mut attempt = 0;
        let (mut control, current, next, resolved) = loop {
            attempt += 1;
            let mut control = self.control.lock().await;
            let current = self.shared.snapshot.load_full();
            let next = change(&current.state)?;
            next.validate()?;
            if current.state == next {
                if !self.host_errors.lock().is_empty() {
                    self.sync_host(&mut control, &next).await;
                }
                return Ok(ApplyOutcome {
                    generation: current.generation,
                    changed: false,
                    host_errors: self.host_errors.lock().clone(),
                });
            }
            if !resolve::has_names(&next) || attempt > OPTIMISTIC_ATTEMPTS {
                let resolved = resolve::resolve_endpoints(&next).await?;
                break (control, current, next, resolved);
            }
            drop(control);
            let resolved = resolve::resolve_endpoints(&next).await?;
            let control = self.control.lock().await;
            if Arc::ptr_eq(&self.shared.snapshot.load_full(), &current) {
                break (control, current, next, resolved);
            }
        };
        let port = next.interface.listen_port;
        let fwmark = next.interface.fwmark;
        let current_sockets = self.shared.sockets.load_full();
        let new_sockets = if port == 0 || port == current_sockets.port {
            if fwmark != current.state.interface.fwmark
                && let Err(error) = current_sockets.set_fwmark(fwmark)
            {
                tracing::warn!(%error, "cannot set fwmark");
            }
            None
        } else {
            Some(Arc::new(
                Sockets::bind(port, fwmark, &self.shared.io)
                    .map_err(|source| ApplyError::Bind { port, source })?,
            ))
        };
        // The plan runs while the host sync waits on `ip`.
        let started = std::time::Instant::now();
        let planning = plan_off_runtime(&current, &next, resolved);
        let syncing = async {
            self.sync_host(&mut control, &next).await;
            started.elapsed()
        };
        let ((snapshot, planned), synced) = tokio::join!(planning, syncing);
        let snapshot = match snapshot {
            Ok(snapshot) => snapshot,
            Err(error) => {
                // The state is refused: the host goes back to the one still running.
                self.sync_host(&mut control, &current.state).await;
                return Err(error);
            }
        };
        let generation = snapshot.generation;
        let table_reused = control
            .retired
            .swap(&self.shared.snapshot, current, snapshot);
        if let Some(sockets) = new_sockets {
            // The old sockets close once their readers are gone and no send holds them.
            self.shared.sockets.store(Arc::clone(&sockets));
            for reader in control.readers.drain(..) {
                reader.abort();
            }
            control.readers = spawn_readers(&self.shared, &sockets);
        }
        // Off the control path: with many peers the initiations cost seconds of DH.
        tokio::spawn(datapath::initiate_sessions(
            Arc::clone(&self.shared),
            self.shared.snapshot.load_full(),
            datapath::Initiate::ProbedWithoutSession,
        ));
        tracing::info!(
            generation,
            version = %next.version,
            peers = next.peers.len(),
            listen_port = self.shared.sockets.load().port,
            table_reused,
            plan_ms = planned.as_secs_f64() * 1e3,
            host_ms = synced.as_secs_f64() * 1e3,
            "applied desired state"
        );
        self.changes.send_replace(generation);
        Ok(ApplyOutcome {
            generation,
            changed: true,
            host_errors: self.host_errors.lock().clone(),
        })
    }

    /// Brings MTU, addresses and routes in line with `state`. Failures do not fail the
    /// apply (the data path already runs the new state): they are recorded, reported in the
    /// apply's answer, the status and the metrics, and retried every [`HOST_RETRY`].
    async fn sync_host(&self, control: &mut Control, state: &DesiredState) {
        let iface = &state.interface;
        let mut errors = Vec::new();
        if control.mtu != iface.mtu {
            match self.shared.tun().set_mtu(iface.mtu) {
                Ok(()) => control.mtu = iface.mtu,
                Err(error) => errors.push(format!("cannot set MTU {}: {error}", iface.mtu)),
            }
        }
        if control.addresses != iface.addresses
            && let Err(error) =
                host::sync_addresses(&self.name, &mut control.addresses, &iface.addresses).await
        {
            errors.push(format!("cannot set interface addresses: {error}"));
        }
        let routes: Vec<IpNet> = if iface.manage_routes {
            let mut views: Vec<IpNet> = state
                .peers
                .iter()
                .flat_map(|p| p.routes.iter().map(|r| r.view))
                .collect();
            views.sort();
            views.dedup();
            views
        } else {
            Vec::new()
        };
        if control.routes != routes
            && let Err(error) = host::sync_routes(&self.name, &mut control.routes, routes).await
        {
            errors.push(format!("cannot install view routes: {error}"));
        }
        // Logged when the failures change, not on every retry.
        let mut host_errors = self.host_errors.lock();
        if errors != *host_errors {
            if errors.is_empty() {
                tracing::info!("host configuration applied after earlier failures");
            }
            for error in &errors {
                tracing::warn!(%error, "host configuration failed; retrying");
            }
        }
        *host_errors = errors;
    }

    /// Stops every task; the TUN device disappears and the sockets close once the last
    /// reference to them is dropped.
    pub async fn shutdown(&self) {
        let mut handles: Vec<JoinHandle<()>> = self.tasks.lock().drain(..).collect();
        handles.append(&mut self.control.lock().await.readers);
        for handle in &handles {
            handle.abort();
        }
        for handle in handles {
            let _ = handle.await;
        }
    }

    /// Puts the gateway under its controller's lease: active for `active_for` from now (a
    /// renewal), or on standby at once with zero (see [`kubetun_gateway_core::role`]). A promotion initiates a
    /// handshake with every peer, so that the remotes' endpoints move to this replica.
    pub fn hold(&self, active_for: Duration) -> Transition {
        let transition = self.shared.role.hold(active_for, crate::clock::mono_us());
        if transition.promoted() {
            tracing::info!(
                active_for_ms = active_for.as_millis(),
                "active: this replica holds the gateway lease; initiating with every peer"
            );
            tokio::spawn(datapath::initiate_sessions(
                Arc::clone(&self.shared),
                self.shared.snapshot.load_full(),
                datapath::Initiate::All,
            ));
        } else if transition.was_active && !transition.active {
            tracing::info!("standby: another replica carries the traffic");
        }
        transition
    }

    /// Plans the running state again, so that the fallback paths follow the peers'
    /// [`kubetun_gateway_core::path::PathState`]s. Nothing else changes: same peers, sessions, endpoints.
    async fn replan(&self) {
        let control = self.control.lock().await;
        let current = self.shared.snapshot.load_full();
        // Only new peers take their endpoints from here, and there are none.
        let resolved = vec![None; current.state.peers.len()];
        match plan_off_runtime(&current, &current.state, resolved).await.0 {
            Ok(snapshot) => {
                let generation = snapshot.generation;
                control
                    .retired
                    .swap(&self.shared.snapshot, current, snapshot);
                self.changes.send_replace(generation);
                tracing::debug!(generation, "snapshot planned again for a fallback switch");
            }
            Err(error) => tracing::warn!(%error, "cannot plan the fallback switch"),
        }
    }

    /// A reading of the whole device for status reports.
    pub fn report(&self) -> DeviceReport {
        let snapshot = self.snapshot();
        let now_us = crate::clock::mono_us();
        // During a rotation: the new public key, which a tunnel must use and have completed
        // a handshake with to count as moved.
        let rotating_to = snapshot
            .identity
            .as_ref()
            .filter(|i| i.previous.is_some())
            .map(|i| i.public_key());
        DeviceReport {
            interface_name: self.name.clone(),
            version: snapshot.state.version.clone(),
            generation: snapshot.generation,
            private_key: snapshot.state.interface.private_key,
            listen_port: Some(self.shared.sockets.load().port),
            fwmark: snapshot.state.interface.fwmark,
            peers: snapshot
                .slots()
                .map(|(_, slot)| {
                    PeerReport::new(slot, snapshot.state.interface.conncheck, rotating_to)
                })
                .collect(),
            drops: self.shared.drops.snapshot(),
            remap_rules: snapshot.remap.len(),
            host_errors: self.host_errors.lock().clone(),
            active: self.shared.role.is_active(now_us),
            active_remaining: self.shared.role.remaining(now_us),
            promotions: self.shared.role.promotions(),
            admissions: snapshot
                .admissions
                .clusters()
                .iter()
                .map(|cluster| AdmissionReport {
                    cluster: cluster.name.clone(),
                    isolation: cluster.isolation,
                    endpoints: cluster.endpoints,
                    drops: cluster.drops.snapshot(),
                    policies: cluster
                        .policies
                        .iter()
                        .map(|policy| PolicyReport {
                            name: policy.name.clone(),
                            sources: policy.sources,
                            drops: policy.drops.load(std::sync::atomic::Ordering::Relaxed),
                        })
                        .collect(),
                })
                .collect(),
            flow_table: FlowTableReport {
                capacity: self.shared.flows.capacity(),
                in_use: self.shared.flows.in_use(crate::clock::now()),
                full: self.shared.flows.full(),
            },
        }
    }
}

/// Plans the snapshot that implements `next` after `current` on a blocking thread; with the
/// time it took. The plan (tables and peers) takes milliseconds, tens of them with 1000 new
/// peers, and the async workers carry the data path.
async fn plan_off_runtime(
    current: &Arc<Snapshot>,
    next: &DesiredState,
    resolved: Vec<Option<SocketAddr>>,
) -> (Result<Snapshot, ApplyError>, Duration) {
    let (current, next) = (Arc::clone(current), next.clone());
    tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let snapshot = kubetun_gateway_core::plan::next_snapshot(
            &current,
            &next,
            &resolved,
            crate::clock::now(),
        )
        .map_err(ApplyError::from);
        (snapshot, started.elapsed())
    })
    .await
    .unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic()))
}

/// Plans the snapshot again whenever a fallback path switched (see [`kubetun_gateway_core::path`]).
async fn replan_loop(device: Weak<Device>) {
    loop {
        let Some(shared) = device.upgrade().map(|d| Arc::clone(&d.shared)) else {
            return;
        };
        shared.replan.notified().await;
        drop(shared);
        let Some(device) = device.upgrade() else {
            return;
        };
        device.replan().await;
    }
}

/// Tries failed host configuration again until it succeeds (a route whose device or
/// address was missing, an `ip` that failed), also when no further apply comes.
async fn host_retry_loop(device: Weak<Device>) {
    let mut interval = tokio::time::interval(HOST_RETRY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(device) = device.upgrade() else {
            return;
        };
        // Checked before taking the control lock, which an apply may hold for a while.
        if device.host_errors.lock().is_empty() {
            continue;
        }
        let mut control = device.control.lock().await;
        let state = device.shared.snapshot.load().state.clone();
        device.sync_host(&mut control, &state).await;
    }
}

fn spawn_readers(shared: &Arc<Shared>, sockets: &Sockets) -> Vec<JoinHandle<()>> {
    sockets
        .queues()
        .map(|(queue, socket)| {
            tokio::spawn(datapath::udp_loop(
                Arc::clone(shared),
                Arc::clone(socket),
                queue,
            ))
        })
        .collect()
}
