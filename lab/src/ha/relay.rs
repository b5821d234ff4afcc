//! The API-server relay of a lab node: its processes reach the API server on the node's own
//! loopback, so cutting the node off cuts its control plane too.

use super::error::HaError;
use kubetun_testenv::netns::run_in_named;

/// Forwards connections to `127.0.0.1:port` inside a node's namespace to the API server on
/// the host's loopback. The listener is opened inside the namespace; the upstream
/// connections are made from the relay's own thread, which stays in the host's namespace.
pub(super) struct Relay {
    ns: String,
    port: u16,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    pub(super) fn start(ns: &str, port: u16) -> Result<Self, HaError> {
        let mut relay = Self {
            ns: ns.to_owned(),
            port,
            stop: None,
            thread: None,
        };
        relay.resume_checked()?;
        Ok(relay)
    }

    fn resume_checked(&mut self) -> Result<(), HaError> {
        let port = self.port;
        let listener = run_in_named(&self.ns, move || {
            std::net::TcpListener::bind(("127.0.0.1", port))
        })??;
        listener.set_nonblocking(true)?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let thread = std::thread::Builder::new()
            .name(format!("relay-{}", self.ns))
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    let mut connections = tokio::task::JoinSet::new();
                    loop {
                        tokio::select! {
                            _ = stopped.changed() => break,
                            accepted = listener.accept() => {
                                let Ok((mut inbound, _)) = accepted else { continue };
                                connections.spawn(async move {
                                    if let Ok(mut upstream) =
                                        tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                                    {
                                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut upstream).await;
                                    }
                                });
                            }
                        }
                    }
                    // Dropping the set aborts every relayed connection: a cut is a cut.
                    connections.abort_all();
                });
            })?;
        self.stop = Some(stop);
        self.thread = Some(thread);
        Ok(())
    }

    /// Closes the listener and every relayed connection.
    pub(super) fn cut(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    pub(super) fn resume(&mut self) {
        if self.stop.is_none()
            && let Err(error) = self.resume_checked()
        {
            tracing::warn!(%error, ns = self.ns, "cannot reopen the API relay");
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}
