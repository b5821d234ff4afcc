//! Turns for the tests of one test binary that run processes: tests of one group may run at
//! once (as libtest runs them), tests of different groups never do. A group is what used to
//! be a test binary of its own, so merging binaries into one harness keeps how they ran:
//! each group as if alone on the machine (its namespaces, ports and cores; some tests measure
//! time), its own tests side by side.

use std::sync::{Condvar, Mutex, PoisonError};

#[derive(Debug)]
struct Holders {
    group: Option<&'static str>,
    count: usize,
}

static HOLDERS: Mutex<Holders> = Mutex::new(Holders {
    group: None,
    count: 0,
});
static RELEASED: Condvar = Condvar::new();

/// A test's turn; the next group's can start when the last turn of this one is dropped (also
/// when the test panics).
#[derive(Debug)]
#[must_use = "the turn ends when the guard is dropped"]
pub struct Turn {
    _private: (),
}

/// Waits until no test of another group runs, then takes a turn for `group` (a test module's
/// `module_path!()`, or a name its tests share).
pub fn turn(group: &'static str) -> Turn {
    let mut holders = HOLDERS.lock().unwrap_or_else(PoisonError::into_inner);
    while holders.group.is_some_and(|held| held != group) {
        holders = RELEASED
            .wait(holders)
            .unwrap_or_else(PoisonError::into_inner);
    }
    holders.group = Some(group);
    holders.count += 1;
    Turn { _private: () }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut holders = HOLDERS.lock().unwrap_or_else(PoisonError::into_inner);
        holders.count -= 1;
        if holders.count == 0 {
            holders.group = None;
            RELEASED.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_group_runs_alone_and_its_own_tests_together() {
        static IN_A: AtomicUsize = AtomicUsize::new(0);
        static IN_B: AtomicUsize = AtomicUsize::new(0);
        static OVERLAPS: AtomicUsize = AtomicUsize::new(0);
        static A_TOGETHER: AtomicUsize = AtomicUsize::new(0);
        let run = |group: &'static str, mine: &'static AtomicUsize, other: &'static AtomicUsize| {
            let _turn = turn(group);
            let now = mine.fetch_add(1, Ordering::SeqCst) + 1;
            if group == "a" && now > 1 {
                A_TOGETHER.fetch_add(1, Ordering::SeqCst);
            }
            for _ in 0..20 {
                if other.load(Ordering::SeqCst) > 0 {
                    OVERLAPS.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            mine.fetch_sub(1, Ordering::SeqCst);
        };
        std::thread::scope(|scope| {
            let a_first = turn("a");
            for _ in 0..3 {
                scope.spawn(|| run("a", &IN_A, &IN_B));
                scope.spawn(|| run("b", &IN_B, &IN_A));
            }
            // Another test of group "a" joins at once while "a" holds a turn.
            std::thread::sleep(Duration::from_millis(5));
            drop(a_first);
        });
        assert_eq!(
            OVERLAPS.load(Ordering::SeqCst),
            0,
            "groups a and b overlapped"
        );
        assert!(
            A_TOGETHER.load(Ordering::SeqCst) > 0,
            "tests of one group never ran together"
        );
    }
}
