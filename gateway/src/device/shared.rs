//! What the device's tasks share: the snapshot, the sockets, the TUN queues, the drop
//! counters, the flow table and the handshake queue. Below every shell (data path, handshake worker,
//! prober, resolver), which all take it from here.

use std::sync::Arc;

use arc_swap::{ArcSwap, Cache};

use super::handshake_queue::HandshakeQueue;
use super::net::Sockets;
use super::spin::Activity;
use crate::io_options::IoOptions;
use kubetun_gateway_core::admission::flows::FlowTable;
use kubetun_gateway_core::drops::{DeviceDrop, Drops};
use kubetun_gateway_core::role::Role;
use kubetun_gateway_core::snapshot::Snapshot;

/// What the data-path tasks share.
pub struct Shared {
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    /// Kept out of the snapshot so that a task's cached snapshot never keeps an old port
    /// bound after a listen-port change.
    pub sockets: ArcSwap<Sockets>,
    /// The I/O techniques in use.
    pub io: IoOptions,
    pub drops: Drops,
    /// Handshake messages for the handshake worker.
    pub handshakes: HandshakeQueue,
    /// Set once a TUN reader has stopped (the interface was deleted or failed).
    pub stopped: tokio::sync::watch::Sender<bool>,
    /// Every queue of the TUN device, at least one: one per [`IoOptions::queues`], each
    /// read by its own egress task.
    pub tun_queues: Vec<Arc<tun_rs::AsyncDevice>>,
    /// Whether this replica carries traffic now (see [`kubetun_gateway_core::role`]).
    pub role: Role,
    /// Woken when a peer's fallback path switched: the snapshot must be planned again.
    pub replan: tokio::sync::Notify,
    /// Batches read, for the spin window ([`super::spin`]).
    pub activity: Arc<Activity>,
    /// The threads a peer's long run is sealed and opened on beside its task.
    pub workers: super::workers::CryptoWorkers,
    /// The flows this cluster opened towards remote clusters: outside the snapshot, so
    /// applies keep them.
    pub flows: FlowTable,
}

impl Shared {
    /// Whether this replica is on standby at `now_us`; if so, the `count()` packets or
    /// datagrams just read are counted as `standby` drops (the caller discards them). The
    /// count is taken only then: the active data path pays one atomic load per batch.
    #[inline]
    pub fn drops_on_standby(&self, now_us: u64, count: impl FnOnce() -> usize) -> bool {
        if self.role.is_active(now_us) {
            return false;
        }
        self.drops.device_many(DeviceDrop::Standby, count() as u64);
        true
    }

    /// The TUN device's first queue, which also serves device-wide calls (MTU).
    pub fn tun(&self) -> &Arc<tun_rs::AsyncDevice> {
        &self.tun_queues[0]
    }

    /// TUN queue `queue`; queues beyond the device's wrap around.
    pub fn tun_queue(&self, queue: usize) -> &Arc<tun_rs::AsyncDevice> {
        &self.tun_queues[queue % self.tun_queues.len()]
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("drops", &self.drops)
            .finish_non_exhaustive()
    }
}

/// A task's lock-free cached view of the current snapshot.
pub type SnapshotCache = Cache<Arc<ArcSwap<Snapshot>>, Arc<Snapshot>>;
