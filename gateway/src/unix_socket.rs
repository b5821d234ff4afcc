//! Unix socket files for the control surfaces: created mode 0600 in a directory created on
//! demand, a stale file from a crashed run replaced, a live one refused, and the file removed
//! when its owner is dropped.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};

/// Removes the socket file on drop.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
}

impl SocketFile {
    /// Binds a listener at `path`.
    pub async fn bind(path: &Path) -> io::Result<(UnixListener, SocketFile)> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        if path.exists() {
            if UnixStream::connect(path).await.is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is in use by a running process", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        let file = SocketFile {
            path: path.to_owned(),
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok((listener, file))
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_file(&self.path)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(%error, path = %self.path.display(), "cannot remove socket file");
        }
    }
}
