//! [`Context`]: what one call into the core works with besides its batch — the snapshot,
//! the drop counters, the time, the flow table and the threads a long run may be shared with — and the
//! start of every per-peer run over a batch (`Context::peer_run`).

use std::sync::{Arc, LazyLock};

use crate::admission::flows::FlowTable;
use crate::clock::Now;
use crate::drops::{DeviceDrop, Drops};
use crate::peer::Peer;
use crate::remap::{DropReason, PeerId};
use crate::snapshot::Snapshot;
use crate::workers::{Alone, Workers};

/// The per-call context of the core's steps ([`crate::egress::Egress`],
/// [`crate::ingress::Ingress`], [`crate::handshake::Handshake`], [`crate::timers`]).
#[derive(Debug)]
pub struct Context<'a, W: Workers = Alone> {
    /// The configuration and runtime state the call works on.
    pub snapshot: &'a Snapshot,
    /// Where the call counts what it drops.
    pub drops: &'a Drops,
    /// The time of the call.
    pub now: Now,
    /// The threads a long run of one peer is sealed or opened on.
    pub workers: &'a W,
    /// The flows this cluster opened towards remote clusters (shared by every task).
    pub flows: &'a FlowTable,
}

/// The flow table of a context made without one: it holds nothing, so a new flow towards
/// an exported cluster is dropped as `flow_table_full` (the shell always passes its own).
static NO_FLOWS: LazyLock<FlowTable> = LazyLock::new(|| FlowTable::new(0));

impl<'a> Context<'a, Alone> {
    /// A context without helper threads.
    pub fn new(snapshot: &'a Snapshot, drops: &'a Drops, now: Now) -> Self {
        Self {
            snapshot,
            drops,
            now,
            workers: &Alone,
            flows: &NO_FLOWS,
        }
    }
}

impl<'a, W: Workers> Context<'a, W> {
    /// This context with `workers` to share long runs with.
    pub fn with_workers<V: Workers>(self, workers: &'a V) -> Context<'a, V> {
        Context {
            snapshot: self.snapshot,
            drops: self.drops,
            now: self.now,
            workers,
            flows: self.flows,
        }
    }

    /// This context with the flow table `flows`.
    pub fn with_flows(self, flows: &'a FlowTable) -> Self {
        Self { flows, ..self }
    }

    /// The run of `entries` from `start` that go to the same peer as `entries[start]`
    /// (`peer_of` tells), which the batch has grouped: its peer, where it ends, and the
    /// peer's runtime when it can be served. When it cannot (the peer is gone, or the
    /// interface has no private key), the run's entries are counted as dropped.
    pub(crate) fn peer_run<T>(
        &self,
        entries: &[T],
        start: usize,
        peer_of: impl Fn(&T) -> PeerId,
    ) -> PeerRun<'a> {
        let id = peer_of(&entries[start]);
        let end = start
            + entries[start..]
                .iter()
                .take_while(|entry| peer_of(entry) == id)
                .count();
        let lost = (end - start) as u64;
        let peer = match self.snapshot.peer(id) {
            None => {
                self.drops.remap_many(DropReason::UnknownPeer, lost);
                None
            }
            Some(slot) => match &slot.runtime {
                None => {
                    self.drops.device_many(DeviceDrop::NoPrivateKey, lost);
                    None
                }
                Some(peer) => Some(peer),
            },
        };
        PeerRun { id, end, peer }
    }
}

/// One peer's run of a batch (see [`Context::peer_run`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerRun<'a> {
    /// The peer.
    pub id: PeerId,
    /// Where its run ends among the batch's entries.
    pub end: usize,
    /// Its runtime; `None` when the run is dropped (and counted).
    pub peer: Option<&'a Arc<Peer>>,
}
