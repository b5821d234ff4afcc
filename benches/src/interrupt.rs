//! Stops a harness run cleanly on SIGINT or SIGTERM: the signal sets a flag, the harness
//! finishes the iperf3 run in progress (bounded by `-t`) and returns, and dropping the testbed
//! stops the daemons and deletes the namespaces. Without this a signal would kill the harness
//! before its cleanup ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::signal::unix::{SignalKind, signal};

/// A flag set once SIGINT or SIGTERM arrives. The handlers are installed before it returns.
pub fn stop_on_signal() -> std::io::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let (mut interrupt, mut terminate) = runtime.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    })?;
    let flag = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            runtime.block_on(async {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            });
            flag.store(true, Ordering::SeqCst);
        })?;
    Ok(stop)
}
