//! The termination signal the controllers stop on. kube-runtime's `shutdown_on_signal` logs
//! a "press ctrl+c" hint per controller, and the binary runs several; they await this
//! instead, and the binary says once how to stop it.

/// Resolves when SIGTERM or SIGINT arrives. Every caller gets its own registration (tokio
/// delivers a signal to all of them), so it is safe in any runtime and any number of times.
pub async fn signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            // Without a SIGTERM handler only ctrl+c stops the process.
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
