//! What the allocation tests share: a global allocator that forwards to the system's and
//! reports every allocation (and deallocation) to hooks the test binary chooses (a global
//! window with traces, or a count per thread).

use std::alloc::{GlobalAlloc, Layout, System};

/// The system allocator with a hook on every allocation (`alloc`, `alloc_zeroed`, `realloc`)
/// and every deallocation. The hooks must not allocate, or must guard against re-entry.
pub struct CountingAllocator {
    on_allocation: fn(),
    on_deallocation: fn(),
}

impl CountingAllocator {
    /// Forwards to the system allocator, calling the hooks first.
    pub const fn new(on_allocation: fn(), on_deallocation: fn()) -> Self {
        Self {
            on_allocation,
            on_deallocation,
        }
    }
}

// SAFETY: every method forwards to the system allocator with the caller's arguments unchanged,
// so the `GlobalAlloc` contract is the system allocator's; the hooks run before and touch
// no memory the allocator hands out.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        (self.on_allocation)();
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        (self.on_allocation)();
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        (self.on_allocation)();
        // SAFETY: forwarded unchanged; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        (self.on_deallocation)();
        // SAFETY: forwarded unchanged; the caller upholds `dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}
