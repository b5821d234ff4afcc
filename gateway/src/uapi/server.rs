//! The UAPI socket server: accepts connections on `/var/run/wireguard/<ifname>.sock` and
//! answers `get`/`set` requests against the device, one request after another per connection.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::{EADDRINUSE, EINVAL, EIO, Request, UapiError, format_errno, format_get, parse_request};
use crate::device::{ApplyError, Device};
use crate::peercred::PeerPolicy;
use crate::status::uapi_view;
use crate::unix_socket::SocketFile;

/// The directory the `wg` tool looks in.
pub const SOCKET_DIR: &str = "/var/run/wireguard";
/// Largest request accepted (a `set` for thousands of peers fits easily).
const MAX_REQUEST_BYTES: usize = 16 << 20;

/// The socket path for interface `ifname` under `dir`.
pub fn socket_path(dir: &Path, ifname: &str) -> PathBuf {
    dir.join(format!("{ifname}.sock"))
}

/// A bound UAPI listener; the socket file is removed when it is dropped.
#[derive(Debug)]
pub struct UapiServer {
    listener: UnixListener,
    file: SocketFile,
}

impl UapiServer {
    /// Binds the socket at `path` (mode 0600), replacing a stale one.
    pub async fn bind(path: &Path) -> io::Result<UapiServer> {
        let (listener, file) = SocketFile::bind(path).await?;
        Ok(UapiServer { listener, file })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Serves connections from peers `policy` admits until the task is cancelled.
    pub async fn serve(self, device: Arc<Device>, policy: PeerPolicy) {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    if let Err(refusal) = policy.admit(&stream) {
                        tracing::warn!(%refusal, "UAPI connection refused");
                        continue;
                    }
                    tokio::spawn(serve_connection(stream, Arc::clone(&device)));
                }
                Err(error) => {
                    tracing::warn!(%error, "UAPI accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }
}

async fn serve_connection(stream: UnixStream, device: Arc<Device>) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut request = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        let read = match reader.read_line(&mut line).await {
            Ok(read) => read,
            Err(error) => {
                tracing::debug!(%error, "UAPI connection read failed");
                return;
            }
        };
        let at_end = read == 0;
        let blank = line == "\n";
        if !at_end {
            request.push_str(&line);
        }
        if request.len() > MAX_REQUEST_BYTES {
            let _ = write.write_all(format_errno(EINVAL).as_bytes()).await;
            return;
        }
        if (blank || at_end) && !request.trim().is_empty() {
            let reply = handle(&request, &device).await;
            if write.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
            request.clear();
        }
        if at_end {
            return;
        }
    }
}

/// Answers one request.
pub async fn handle(request: &str, device: &Device) -> String {
    match parse_request(request) {
        Ok(Request::Get) => format_get(&uapi_view(&device.report())),
        Ok(Request::Set(command)) => {
            match device.update(|current| Ok(command.apply_to(current))).await {
                Ok(_) => format_errno(0),
                Err(error) => {
                    tracing::warn!(%error, "UAPI set rejected");
                    format_errno(apply_errno(&error))
                }
            }
        }
        Err(UapiError { errno, message }) => {
            tracing::warn!(%message, "invalid UAPI request");
            format_errno(errno)
        }
    }
}

fn apply_errno(error: &ApplyError) -> i32 {
    match error {
        ApplyError::Bind { source, .. } if source.kind() == io::ErrorKind::AddrInUse => EADDRINUSE,
        ApplyError::Bind { .. } => EIO,
        ApplyError::Invalid(_)
        | ApplyError::Remap(_)
        | ApplyError::Resolve { .. }
        | ApplyError::TooManyPeers => EINVAL,
    }
}
