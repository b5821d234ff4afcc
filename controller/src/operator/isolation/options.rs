//! The allocator's settings ([`NetworkOptions`]).

use super::ids;

/// Allocator settings (`--min-vni`, `--max-vni`, attempt budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkOptions {
    /// Smallest ID handed out.
    pub min_vni: u32,
    /// Largest ID handed out.
    pub max_vni: u32,
    /// Creates tried per allocation before giving up until the next reconcile.
    pub max_attempts: u32,
}

impl Default for NetworkOptions {
    /// ironcore-net's defaults: IDs 200..=16777215.
    fn default() -> Self {
        Self {
            min_vni: 200,
            max_vni: ids::MAX_ID,
            max_attempts: 64,
        }
    }
}
