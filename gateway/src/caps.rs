//! Capabilities: the gateway keeps only what its data plane and control surfaces use for
//! their whole life and drops everything else at start, before any thread exists (Linux
//! capabilities are per thread; threads inherit them).
//!
//! Kept ([`RUNTIME`]):
//! - `CAP_NET_ADMIN`: creating the TUN device (`TUNSETIFF`), and at any later `Apply` setting
//!   its MTU, addresses and routes (`manage_routes`), `SO_MARK` for a fwmark, and
//!   `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` on a UDP socket rebound for a new listen port;
//! - `CAP_NET_BIND_SERVICE`: an `Apply` may move the listen port below 1024.
//!
//! Everything else leaves the effective, permitted, inheritable, ambient and (when the process
//! may change it) bounding sets, so a compromised gateway cannot regain it, not even by
//! executing a set-uid or file-capability binary.

use std::io;

/// `CAP_SETPCAP`: needed to shrink the bounding set.
const CAP_SETPCAP: u32 = 8;
/// `CAP_NET_BIND_SERVICE`.
pub const CAP_NET_BIND_SERVICE: u32 = 10;
/// `CAP_NET_ADMIN`.
pub const CAP_NET_ADMIN: u32 = 12;
/// What the gateway keeps.
pub const RUNTIME: &[u32] = &[CAP_NET_ADMIN, CAP_NET_BIND_SERVICE];

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets as two 32-bit words.
const VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The capability sets of the calling thread, as 64-bit masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sets {
    /// Effective set.
    pub effective: u64,
    /// Permitted set.
    pub permitted: u64,
    /// Inheritable set.
    pub inheritable: u64,
}

/// The mask of `caps`.
pub fn mask(caps: &[u32]) -> u64 {
    caps.iter().fold(0, |mask, cap| mask | 1 << cap)
}

/// The capability sets of the calling thread.
pub fn current() -> io::Result<Sets> {
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget(2) reads the header and writes two `Data` words (version 3), both valid
    // for the duration of the call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |f: fn(&Data) -> u32| u64::from(f(&data[0])) | u64::from(f(&data[1])) << 32;
    Ok(Sets {
        effective: join(|d| d.effective),
        permitted: join(|d| d.permitted),
        inheritable: join(|d| d.inheritable),
    })
}

/// What the thread keeps when it asks for `wanted`: only what it is permitted now.
pub fn plan(now: Sets, wanted: u64) -> Sets {
    let keep = now.permitted & wanted;
    Sets {
        effective: keep,
        permitted: keep,
        inheritable: 0,
    }
}

/// Highest capability number the kernel knows.
fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// Drops every capability not in `wanted` from the calling thread (call it before starting
/// threads): the bounding set first (when `CAP_SETPCAP` allows it), then the ambient set,
/// then effective, permitted and inheritable. Returns the sets in force afterwards.
pub fn restrict_to(wanted: &[u32]) -> io::Result<Sets> {
    let wanted = mask(wanted);
    let now = current()?;
    if now.effective & mask(&[CAP_SETPCAP]) != 0 {
        for cap in (0..=last_cap().min(63)).filter(|cap| wanted & 1 << cap == 0) {
            // SAFETY: prctl(PR_CAPBSET_DROP, cap) takes plain integers.
            #[allow(unsafe_code)]
            let rc =
                unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    // SAFETY: prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL) takes plain integers.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let next = plan(now, wanted);
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let split = |mask: u64| [mask as u32, (mask >> 32) as u32];
    let (e, p, i) = (
        split(next.effective),
        split(next.permitted),
        split(next.inheritable),
    );
    let data = [0, 1].map(|w| Data {
        effective: e[w],
        permitted: p[w],
        inheritable: i[w],
    });
    // SAFETY: capset(2) reads the header and two `Data` words, valid for the call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    current()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_are_bit_sets_of_capability_numbers() {
        assert_eq!(mask(&[]), 0);
        assert_eq!(mask(RUNTIME), 1 << 12 | 1 << 10);
        assert_eq!(mask(&[40]), 1 << 40);
    }

    #[test]
    fn the_plan_keeps_only_wanted_capabilities_the_thread_already_has() {
        let root = Sets {
            effective: (1 << 41) - 1,
            permitted: (1 << 41) - 1,
            inheritable: 1 << 12,
        };
        let kept = plan(root, mask(RUNTIME));
        assert_eq!(kept.permitted, mask(RUNTIME));
        assert_eq!(kept.effective, mask(RUNTIME));
        assert_eq!(kept.inheritable, 0);

        let unprivileged = Sets {
            effective: 0,
            permitted: 1 << CAP_NET_ADMIN,
            inheritable: 0,
        };
        let kept = plan(unprivileged, mask(RUNTIME));
        assert_eq!(kept.permitted, 1 << CAP_NET_ADMIN, "nothing is gained");
    }

    #[test]
    fn a_thread_restricted_to_the_runtime_set_keeps_exactly_it() {
        // Capabilities are per thread: this one gives them up, the test process keeps its own.
        std::thread::spawn(|| {
            let before = current().expect("capget");
            let after = restrict_to(RUNTIME).expect("restrict");
            assert_eq!(after, plan(before, mask(RUNTIME)));
            assert_eq!(after.permitted & !mask(RUNTIME), 0);
            assert!(restrict_to(&[]).expect("restrict further").permitted == 0);
        })
        .join()
        .expect("thread");
    }
}
