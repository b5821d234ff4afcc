//! The board between the services operator and the gateway sync: what this cluster exports,
//! as the endpoints each offer lets its consumers open ([`ExportEndpoints`], with the
//! policies guarding them), and the linked clusters' answers to those policies. The services
//! operator [`publish`](ExportBoard::publish)es after every pass that computed its offers; the
//! gateway sync reads the [`current`](ExportBoard::current) exports into the admissions and
//! wakes on [`changed`](ExportBoard::changed), so an export appearing or going reaches the
//! gateway without either side naming the other.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::planner::ExportEndpoints;
use crate::planner::admission::Answers;

/// What the services operator publishes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exports {
    /// One per offer, sorted by offer name.
    pub endpoints: Vec<ExportEndpoints>,
    /// Each linked cluster's answer to this cluster's policies.
    pub answers: Answers,
}

/// This cluster's exports, shared. Unknown until the first publish (the services operator
/// has not computed its offers yet); [`ExportBoard::publish`] with an empty list when
/// services across clusters are off.
#[derive(Debug)]
pub struct ExportBoard {
    current: Mutex<Option<Arc<Exports>>>,
    changed: Notify,
    created: Instant,
}

impl Default for ExportBoard {
    fn default() -> Self {
        Self {
            current: Mutex::default(),
            changed: Notify::new(),
            created: Instant::now(),
        }
    }
}

impl ExportBoard {
    /// How long ago the board was made (with the controller's context): how long the
    /// exports have been unknown when [`Self::current`] is `None`.
    pub fn age(&self) -> Duration {
        self.created.elapsed()
    }

    /// Replaces the exports (sorted by the caller, so an unchanged world is an unchanged
    /// list); wakes the waiters of [`Self::changed`] and returns true when they differ from
    /// the last ones.
    pub fn publish(&self, exports: Exports) -> bool {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_deref() == Some(&exports) {
            return false;
        }
        *current = Some(Arc::new(exports));
        drop(current);
        self.changed.notify_one();
        true
    }

    /// The exports as last published; `None` before the first publish.
    pub fn current(&self) -> Option<Arc<Exports>> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Resolves after a publish changed the exports (one made while nobody waits is
    /// remembered).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_is_remembered_and_an_unchanged_list_wakes_nobody() {
        let board = ExportBoard::default();
        assert!(
            board.current().is_none(),
            "unknown before the first publish"
        );
        assert!(board.publish(Exports::default()));
        assert_eq!(board.current().as_deref(), Some(&Exports::default()));
        // The change made while nobody waited is remembered.
        tokio::time::timeout(std::time::Duration::from_millis(100), board.changed())
            .await
            .expect("remembered");
        assert!(!board.publish(Exports::default()), "unchanged");
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), board.changed())
                .await
                .is_err(),
            "an unchanged list wakes nobody"
        );
    }
}
