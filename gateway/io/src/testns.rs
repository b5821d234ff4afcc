//! Test support: runs a test body on its own thread inside a fresh, private network
//! namespace with only the loopback interface up, so tests can bind and route freely without
//! touching the host's networking. Skips (returns `None`) when namespaces are not available.

use std::process::Command;

/// Runs `work` in a private network namespace; `None` when one cannot be created (not root).
pub fn in_private_netns<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    std::thread::spawn(move || {
        // SAFETY: unshare(CLONE_NEWNET) moves only the calling thread, a fresh one that
        // shares nothing network-related with the rest of the test process, into a new
        // namespace.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        if rc != 0 {
            eprintln!(
                "skipped: cannot create a network namespace ({})",
                std::io::Error::last_os_error()
            );
            return None;
        }
        // A child forked from this thread inherits its namespace.
        let up = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status();
        if !matches!(up, Ok(status) if status.success()) {
            eprintln!("skipped: cannot bring the loopback interface up");
            return None;
        }
        Some(work())
    })
    .join()
    .expect("test thread panicked")
}

/// Runs `ip <args>` in the current thread's namespace, panicking on failure.
pub fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip");
    assert!(status.success(), "ip {} failed", args.join(" "));
}

/// A current-thread tokio runtime with IO and timers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}
