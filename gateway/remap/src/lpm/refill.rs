//! Copying a successor map into the memory of a retired one, writing only what differs so
//! readers' cached lines of unchanged entries survive the swap.

use std::sync::Arc;

use super::{Hashed, Key, Level, Payload, PrefixMap, Repr};

/// Storage a freshly built value can be copied into.
pub(crate) trait Refill {
    /// Makes `self` equal to `fresh`, keeping `self`'s buffers wherever their shapes match and
    /// writing only the elements that differ, so a reader's cached copies of the unchanged
    /// elements stay valid.
    fn refill(&mut self, fresh: &Self);
}

impl<T: Copy + PartialEq> Refill for Box<[T]> {
    fn refill(&mut self, fresh: &Self) {
        if self.len() != fresh.len() {
            self.clone_from(fresh);
            return;
        }
        for (old, new) in self.iter_mut().zip(fresh.iter()) {
            // Reading leaves a reader's copy of the line valid; only a write invalidates it.
            if old != new {
                *old = *new;
            }
        }
    }
}

impl<T: Refill + Clone> Refill for Option<T> {
    fn refill(&mut self, fresh: &Self) {
        match (self.as_mut(), fresh) {
            (Some(old), Some(fresh)) => old.refill(fresh),
            (_, fresh) => self.clone_from(fresh),
        }
    }
}

impl<A: Key, V: Payload> Refill for PrefixMap<A, V> {
    fn refill(&mut self, fresh: &Self) {
        match (&mut self.repr, &fresh.repr) {
            (Repr::Linear(old), Repr::Linear(fresh)) => old.refill(fresh),
            (Repr::Hashed(old), Repr::Hashed(fresh)) => old.refill(fresh),
            (_, fresh) => self.repr = fresh.clone(),
        }
    }
}

impl<A: Key, V: Payload> Refill for Hashed<A, V> {
    fn refill(&mut self, fresh: &Self) {
        if self.levels.len() == fresh.levels.len() {
            for (old, fresh) in self.levels.iter_mut().zip(&fresh.levels) {
                old.refill(fresh);
            }
        } else {
            self.levels.clone_from(&fresh.levels);
        }
        self.values.refill(&fresh.values);
        if !Arc::ptr_eq(&self.numbering, &fresh.numbering) {
            self.numbering = Arc::clone(&fresh.numbering);
        }
    }
}

impl<A: Key, V: Payload> Refill for Level<A, V> {
    fn refill(&mut self, fresh: &Self) {
        // Every lookup reads the root level's header: leave its line alone when it holds.
        if (self.seed, self.len, self.mask, self.shift)
            != (fresh.seed, fresh.len, fresh.mask, fresh.shift)
        {
            (self.seed, self.len, self.mask, self.shift) =
                (fresh.seed, fresh.len, fresh.mask, fresh.shift);
        }
        self.slots.refill(&fresh.slots);
    }
}

/// Replaces `value` only if it differs, so an unchanged field's cache line stays valid in
/// other cores' caches.
pub(crate) fn set_if_changed<T: PartialEq + Clone>(value: &mut T, fresh: &T) {
    if value != fresh {
        value.clone_from(fresh);
    }
}
