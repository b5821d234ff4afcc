//! Snapshots a swap replaced: freed off the data path, and the latest kept as spares whose
//! remap-table memory the next swap reuses.
//!
//! A new remap table in new memory costs the readers a cache miss on every route the traffic
//! touches. [`Retired::swap`] instead copies the new table into a spare the readers used a
//! swap or two ago ([`RemapTable::refill`](kubetun_remap::RemapTable::refill)), so only the
//! lines of changed routes are cold. A spare is reused only once no data-path task holds it
//! (each holds the snapshot of its last batch while it waits for the next one), and is never
//! written while published.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use kubetun_gateway_core::snapshot::Snapshot;

/// How long a replaced snapshot is kept after a swap. The data-path tasks drop their cached
/// reference at their next batch; holding the last one past that makes its (for large tables,
/// millisecond-long) free happen here rather than in a data-path task.
const RETIRE_AFTER: Duration = Duration::from_millis(250);

/// How many replaced snapshots are kept as spares. The newest is sometimes still held by a
/// data-path task; the one before it almost never is.
const SPARES: usize = 2;

/// The spares, newest first. Shared with the task that strips them to their tables.
#[derive(Debug, Default)]
pub(super) struct Retired {
    spares: Arc<parking_lot::Mutex<VecDeque<Arc<Snapshot>>>>,
}

impl Retired {
    /// Publishes `next` in place of `current` (the snapshot `published` holds), its remap
    /// table moved into the memory of the newest free spare if there is one; `current`
    /// becomes the newest spare. Returns whether a spare's table was reused. Must run inside
    /// a tokio runtime (frees happen on spawned tasks).
    pub(super) fn swap(
        &self,
        published: &ArcSwap<Snapshot>,
        current: Arc<Snapshot>,
        mut next: Snapshot,
    ) -> bool {
        let mut spares = self.spares.lock();
        let free = spares
            .iter()
            .position(|spare| Arc::strong_count(spare) == 1);
        let mut reused = false;
        // Once used, a spare holds only the fresh build's memory: retire it.
        if let Some(mut used) = free.and_then(|index| spares.remove(index)) {
            if let Some(spare) = Arc::get_mut(&mut used) {
                spare.remap.refill(&next.remap);
                std::mem::swap(&mut next.remap, &mut spare.remap);
                reused = true;
            }
            retire(used);
        }
        published.store(Arc::new(next));
        spares.push_front(current);
        if spares.len() > SPARES
            && let Some(oldest) = spares.pop_back()
        {
            retire(oldest);
        }
        drop(spares);
        self.strip_later();
        reused
    }

    /// After [`RETIRE_AFTER`], drops everything of the spares but their remap tables (the
    /// peers' sessions, the identity, the state with its key), so a removed peer's session
    /// does not outlive its removal by more than that. A spare a data-path task still holds
    /// then is skipped; the next swaps retire it anyway.
    fn strip_later(&self) {
        let spares = Arc::clone(&self.spares);
        tokio::spawn(async move {
            tokio::time::sleep(RETIRE_AFTER).await;
            let stripped: Vec<Snapshot> = spares
                .lock()
                .iter_mut()
                .filter_map(Arc::get_mut)
                .map(Snapshot::keep_only_remap)
                .collect();
            // Freed here, outside the lock.
            drop(stripped);
        });
    }
}

/// Drops `snapshot` after [`RETIRE_AFTER`], by when the data-path tasks have let go of it.
pub(super) fn retire(snapshot: Arc<Snapshot>) {
    tokio::spawn(async move {
        tokio::time::sleep(RETIRE_AFTER).await;
        drop(snapshot);
    });
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use kubetun_gateway_core::state::DesiredState;
    use kubetun_remap::{Route, TableBuilder};

    /// A snapshot of generation `generation` whose table has one route per generation.
    fn snapshot(generation: u64) -> Snapshot {
        let mut builder = TableBuilder::new();
        let routes: Vec<Route> = (0..=generation)
            .map(|i| Route::unmapped(format!("10.{i}.0.0/16").parse().expect("prefix")))
            .collect();
        builder.add_peer(0, &routes, None).expect("valid routes");
        Snapshot {
            generation,
            state: DesiredState::default(),
            identity: None,
            peers: Vec::new(),
            by_index: Default::default(),
            by_key: HashMap::new(),
            by_endpoint: HashMap::new(),
            remap: builder.build().expect("valid table"),
            admissions: Default::default(),
        }
    }

    #[tokio::test]
    async fn the_newest_spare_no_reader_holds_is_refilled() {
        let published = ArcSwap::from_pointee(snapshot(0));
        let retired = Retired::default();
        let swap = |generation| {
            let current = published.load_full();
            retired.swap(&published, current, snapshot(generation))
        };
        assert!(!swap(1), "no spare yet");
        let reader = published.load_full();
        assert!(swap(2), "generation 0 is free");
        assert!(!swap(3), "the only spare, generation 1, is still read");
        // Spares: generation 2 (free), generation 1 (read). Hold 2 and let go of 1.
        let newest = Arc::clone(&retired.spares.lock()[0]);
        drop(reader);
        assert!(swap(4), "the older spare is used when the newest is held");
        assert_eq!(retired.spares.lock().len(), SPARES);
        assert!(Arc::ptr_eq(&retired.spares.lock()[1], &newest));
        let table = published.load_full();
        assert_eq!(table.generation, 4);
        assert_eq!(table.remap.len(), 5, "the refilled table is generation 4's");
    }
}
