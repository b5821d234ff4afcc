//! Who may talk to the control sockets: a peer-credential (`SO_PEERCRED`) check on every
//! connection accepted on the UAPI and gRPC sockets.
//!
//! The sockets are created mode 0600, so the kernel already refuses other users at
//! `connect(2)`; this check is the second line that still holds when the file mode is loosened
//! (a mounted directory, a `chmod` by hand) or a connected descriptor is handed to another
//! process. Accepted: root, the user the gateway runs as, and the uids given with
//! `--allow-uid`. Anyone else is disconnected before a single byte is read, and logged.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::net::{UnixListener, UnixStream};

/// The uids admitted on the control sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPolicy {
    owner: u32,
    extra: Vec<u32>,
}

/// A connection from a user the policy does not admit.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The peer's credentials could not be read.
    #[error("cannot read the peer credentials: {0}")]
    Credentials(#[from] io::Error),
    /// The peer runs as a uid that is not admitted.
    #[error("uid {uid} (pid {pid:?}) is not allowed on the control socket")]
    Uid {
        /// The peer's uid.
        uid: u32,
        /// The peer's pid, when the kernel reports it.
        pid: Option<i32>,
    },
}

impl PeerPolicy {
    /// Admits root and `owner`.
    pub fn new(owner: u32) -> Self {
        Self {
            owner,
            extra: Vec::new(),
        }
    }

    /// Admits root and the effective uid of this process.
    pub fn for_this_process() -> Self {
        Self::new(effective_uid())
    }

    /// Also admits `uids`.
    pub fn allowing(mut self, uids: impl IntoIterator<Item = u32>) -> Self {
        self.extra.extend(uids);
        self.extra.sort_unstable();
        self.extra.dedup();
        self
    }

    /// Whether a peer running as `uid` is admitted.
    pub fn permits(&self, uid: u32) -> bool {
        uid == 0 || uid == self.owner || self.extra.binary_search(&uid).is_ok()
    }

    /// Checks the credentials of a connected peer.
    pub fn admit(&self, stream: &UnixStream) -> Result<(), Refusal> {
        let cred = stream.peer_cred()?;
        if self.permits(cred.uid()) {
            Ok(())
        } else {
            Err(Refusal::Uid {
                uid: cred.uid(),
                pid: cred.pid(),
            })
        }
    }

    /// The accepted connections of `listener` that pass the check, as the incoming stream of
    /// a tonic server; refused ones are closed and logged, accept errors passed on.
    pub fn incoming(&self, listener: UnixListener) -> Admitted {
        Admitted {
            listener,
            policy: self.clone(),
        }
    }
}

/// The effective uid of this process.
fn effective_uid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions, touches no memory and cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::geteuid()
    }
}

/// Connections of a listener that pass a [`PeerPolicy`]; see [`PeerPolicy::incoming`].
#[derive(Debug)]
pub struct Admitted {
    listener: UnixListener,
    policy: PeerPolicy,
}

impl Stream for Admitted {
    type Item = io::Result<UnixStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            match this.listener.poll_accept(cx) {
                Poll::Ready(Ok((stream, _))) => match this.policy.admit(&stream) {
                    Ok(()) => return Poll::Ready(Some(Ok(stream))),
                    Err(refusal) => {
                        tracing::warn!(%refusal, "control connection refused");
                    }
                },
                Poll::Ready(Err(error)) => return Poll::Ready(Some(Err(error))),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[test]
    fn root_the_owner_and_configured_uids_are_admitted_nobody_else() {
        let policy = PeerPolicy::new(1000).allowing([2000, 1500, 2000]);
        for uid in [0, 1000, 1500, 2000] {
            assert!(policy.permits(uid), "uid {uid}");
        }
        for uid in [1, 999, 1001, 1999, 65534, u32::MAX] {
            assert!(!policy.permits(uid), "uid {uid}");
        }
        assert!(!PeerPolicy::new(1000).permits(2000), "extras are opt-in");
    }

    #[test]
    fn this_process_is_its_own_owner() {
        let policy = PeerPolicy::for_this_process();
        let own = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
        assert!(policy.permits(own.expect("/proc/self")));
    }

    #[tokio::test]
    async fn a_connection_from_this_process_is_admitted_by_its_credentials() {
        let (a, _b) = UnixStream::pair().expect("socket pair");
        PeerPolicy::for_this_process()
            .admit(&a)
            .expect("own uid admitted");
    }

    #[tokio::test]
    async fn incoming_passes_admitted_connections_through() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("control.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let mut incoming = PeerPolicy::for_this_process().incoming(listener);
        let mut client = UnixStream::connect(&path).await.expect("connect");
        let mut server = incoming
            .next()
            .await
            .expect("a connection")
            .expect("accepted");
        client.write_all(b"ping").await.expect("write");
        let mut buf = [0; 4];
        server.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"ping");
    }
}
