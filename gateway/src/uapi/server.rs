//! The UAPI socket server: accepts connections on `/var/run/wireguard/<ifname>.sock` and
//! answers `get`/`set` requests against the device, one request after another per connection.
//!
//! Framing follows wireguard-go: the operation line must be exactly `get=1` or `set=1`
//! (anything else closes the connection without a reply), a `get` must be followed by one
//! empty line (another byte is answered `errno=-22` and the connection closed), and the lines
//! of a `set` may end in `\r\n`. Unlike wireguard-go every client is bounded: a line longer
//! than [`Limits::max_line`] is answered like wireguard-go's line scanner does (`errno=-5`), a
//! request larger than [`Limits::max_request`] gets `errno=-90`, a request that does not
//! arrive within [`Limits::timeout`] gets `errno=-110`, and a client beyond
//! [`Limits::max_connections`] gets `errno=-11`; each of them is then disconnected. Nothing
//! is buffered beyond one line: a `set` is parsed as it arrives.

use std::future::Future;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::report::uapi_view;
use super::{
    EADDRINUSE, EAGAIN, EINVAL, EIO, EMSGSIZE, ETIMEDOUT, Operation, Request, SetParser,
    format_errno, format_get,
};
use crate::device::{ApplyError, Device};
use crate::peercred::PeerPolicy;
use crate::unix_socket::SocketFile;

/// The directory the `wg` tool looks in.
pub const SOCKET_DIR: &str = "/var/run/wireguard";
/// How often the socket file is checked for deletion.
const WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// Bounds on what one client may make the server hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest line, line ending included (wireguard-go's scanner takes 64 KiB).
    pub max_line: usize,
    /// Largest `set` request (a `set` for 100 000 allowed IPs is about 2.5 MB).
    pub max_request: usize,
    /// Time a request may take from the moment the server waits for it, including an idle
    /// client's wait for its first byte.
    pub timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line: 64 << 10,
            max_request: 32 << 20,
            timeout: Duration::from_secs(30),
            max_connections: 16,
        }
    }
}

/// The socket path for interface `ifname` under `dir`.
pub fn socket_path(dir: &Path, ifname: &str) -> PathBuf {
    dir.join(format!("{ifname}.sock"))
}

/// A bound UAPI listener; the socket file is removed when it is dropped.
#[derive(Debug)]
pub struct UapiServer {
    listener: UnixListener,
    file: SocketFile,
    limits: Limits,
}

impl UapiServer {
    /// Binds the socket at `path` (mode 0600), replacing a stale one.
    pub async fn bind(path: &Path) -> io::Result<UapiServer> {
        let (listener, file) = SocketFile::bind(path).await?;
        Ok(UapiServer {
            listener,
            file,
            limits: Limits::default(),
        })
    }

    /// Replaces the default limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Serves connections from peers `policy` admits. Returns when the socket file is
    /// deleted or replaced (wireguard-go shuts down then too: it is how a userspace
    /// interface is told to go away), with the reason.
    pub async fn serve(self, device: Arc<Device>, policy: PeerPolicy) -> String {
        let handler = move |request| {
            let device = Arc::clone(&device);
            async move { handle(request, &device).await }
        };
        self.serve_with(handler, policy).await
    }

    /// [`UapiServer::serve`] with any request handler (tests serve without a device).
    pub async fn serve_with<F, Fut>(self, handler: F, policy: PeerPolicy) -> String
    where
        F: Fn(Request) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = String> + Send,
    {
        let identity = std::fs::metadata(self.path())
            .map(|m| (m.dev(), m.ino()))
            .ok();
        let slots = Arc::new(Semaphore::new(self.limits.max_connections));
        let mut watch = tokio::time::interval(WATCH_INTERVAL);
        watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => accepted,
                _ = watch.tick() => {
                    // lstat, like wireguard-go: a symlink put in its place is not our socket.
                    let now = std::fs::symlink_metadata(self.path()).map(|m| (m.dev(), m.ino())).ok();
                    if now != identity {
                        return format!("the UAPI socket {} was deleted or replaced", self.path().display());
                    }
                    continue;
                }
            };
            match accepted {
                Ok((stream, _)) => {
                    if let Err(refusal) = policy.admit(&stream) {
                        tracing::warn!(%refusal, "UAPI connection refused");
                        continue;
                    }
                    let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                        tracing::warn!(
                            limit = self.limits.max_connections,
                            "UAPI connection refused: too many connections"
                        );
                        // Never waits on the client: a full socket buffer just loses the reply.
                        let _ = stream.try_write(format_errno(EAGAIN).as_bytes());
                        continue;
                    };
                    let limits = self.limits;
                    let handler = handler.clone();
                    tokio::spawn(async move {
                        let (read, write) = stream.into_split();
                        converse(read, write, limits, handler).await;
                        drop(slot);
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, "UAPI accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// How reading one line ended.
#[derive(Debug, PartialEq, Eq)]
enum LineEnd {
    /// A full line, `\n` included, is in the buffer.
    Complete,
    /// The stream ended; the buffer holds what came after the last `\n`.
    Eof,
    /// The line exceeds the limit; nothing more of it was read.
    TooLong,
}

/// Reads one line into `out`, holding at most `max` bytes of it.
async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    out: &mut Vec<u8>,
    max: usize,
) -> io::Result<LineEnd> {
    out.clear();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(LineEnd::Eof);
        }
        let (take, complete) = match available.iter().position(|b| *b == b'\n') {
            Some(end) => (end + 1, true),
            None => (available.len(), false),
        };
        if out.len() + take > max {
            return Ok(LineEnd::TooLong);
        }
        out.extend_from_slice(&available[..take]);
        reader.consume(take);
        if complete {
            return Ok(LineEnd::Complete);
        }
    }
}

/// Why a conversation stops after the current reply.
enum Stop {
    /// The client went away, or a read failed: close without a reply.
    Silently,
    /// Answer with this errno, then close.
    With(i32),
}

/// Serves one connection: requests one after another until the client closes, breaks the
/// protocol, or exceeds `limits`.
pub async fn converse<R, W, F, Fut>(read: R, mut write: W, limits: Limits, handler: F)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    F: Fn(Request) -> Fut,
    Fut: Future<Output = String>,
{
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        let deadline = Instant::now() + limits.timeout;
        let outcome =
            tokio::time::timeout_at(deadline, request(&mut reader, &mut line, &limits)).await;
        let (reply, stop) = match outcome {
            Err(_elapsed) => {
                tracing::debug!("UAPI request timed out");
                (format_errno(ETIMEDOUT), true)
            }
            Ok(Err(Stop::Silently)) => return,
            Ok(Err(Stop::With(errno))) => (format_errno(errno), true),
            Ok(Ok((Ok(request), at_end))) => (handler(request).await, at_end),
            Ok(Ok((Err(error), at_end))) => {
                tracing::warn!(errno = error.errno, reason = %error.message, "invalid UAPI request");
                (format_errno(error.errno), at_end)
            }
        };
        // The reply has the rest of the time; a client that does not read it is dropped.
        let deadline = deadline.max(Instant::now() + Duration::from_secs(1));
        let sent = tokio::time::timeout_at(deadline, async {
            write.write_all(reply.as_bytes()).await?;
            write.flush().await
        })
        .await;
        if stop || !matches!(sent, Ok(Ok(()))) {
            return;
        }
    }
}

/// Reads one request. `Ok` carries the parsed request or the protocol error to answer, and
/// whether the stream ended with it.
async fn request<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    limits: &Limits,
) -> Result<(Result<Request, super::UapiError>, bool), Stop> {
    // An operation line is 6 bytes; a longer one is no operation either way.
    let end = read_line(reader, line, 64)
        .await
        .map_err(|_| Stop::Silently)?;
    let operation = match end {
        LineEnd::Complete => Operation::parse(line),
        LineEnd::Eof | LineEnd::TooLong => None,
    };
    let Some(operation) = operation else {
        if !line.is_empty() {
            tracing::debug!(bytes = line.len(), "unknown UAPI operation; closing");
        }
        return Err(Stop::Silently);
    };
    match operation {
        Operation::Get => {
            let mut next = [0u8; 1];
            match tokio::io::AsyncReadExt::read(reader, &mut next).await {
                Ok(1) if next[0] == b'\n' => Ok((Ok(Request::Get), false)),
                Ok(1) => {
                    tracing::warn!("UAPI get with trailing characters");
                    Err(Stop::With(EINVAL))
                }
                _ => Err(Stop::Silently),
            }
        }
        Operation::Set => {
            let mut parser = SetParser::default();
            let mut first_error = None;
            let mut total = 0usize;
            loop {
                let end = read_line(reader, line, limits.max_line)
                    .await
                    .map_err(|_| Stop::Silently)?;
                if end == LineEnd::TooLong {
                    tracing::warn!(limit = limits.max_line, "UAPI set line too long");
                    return Err(Stop::With(EIO));
                }
                total += line.len();
                if total > limits.max_request {
                    tracing::warn!(limit = limits.max_request, "UAPI set request too large");
                    return Err(Stop::With(EMSGSIZE));
                }
                let at_end = end == LineEnd::Eof;
                let text = line.strip_suffix(b"\n").unwrap_or(line);
                let text = text.strip_suffix(b"\r").unwrap_or(text);
                if text.is_empty() {
                    let parsed = match first_error {
                        Some(error) => Err(error),
                        None => Ok(Request::Set(parser.finish())),
                    };
                    return Ok((parsed, at_end));
                }
                // After the first error the rest of the request is read and ignored, so the
                // next request starts at a request boundary.
                if first_error.is_none()
                    && let Err(error) = parser.line(text)
                {
                    first_error = Some(error);
                }
                if at_end {
                    let parsed = match first_error {
                        Some(error) => Err(error),
                        None => Ok(Request::Set(parser.finish())),
                    };
                    return Ok((parsed, true));
                }
            }
        }
    }
}

/// Answers one request.
pub async fn handle(request: Request, device: &Device) -> String {
    match request {
        Request::Get => format_get(&uapi_view(&device.report())),
        Request::Set(command) => {
            match device.update(|current| Ok(command.apply_to(current))).await {
                Ok(_) => format_errno(0),
                Err(error) => {
                    tracing::warn!(%error, "UAPI set rejected");
                    format_errno(apply_errno(&error))
                }
            }
        }
    }
}

fn apply_errno(error: &ApplyError) -> i32 {
    match error {
        ApplyError::Bind { source, .. } if source.kind() == io::ErrorKind::AddrInUse => EADDRINUSE,
        ApplyError::Bind { .. } => EIO,
        ApplyError::Invalid(_) | ApplyError::Resolve { .. } => EINVAL,
    }
}

#[cfg(test)]
mod tests;
