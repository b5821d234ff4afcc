//! Files the clusters write: logs appended to, their last lines, and private files (keys,
//! kubeconfigs) readable by their owner only.

use std::path::Path;

use crate::error::{Error, io};

/// Writes `contents` to `path` (created or truncated) readable by its owner only: private keys
/// and configurations holding them.
pub fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?
        .write_all(contents)
}

/// [`write_private`], its failure named after the file.
pub(crate) fn write_private_file(path: &Path, contents: &[u8]) -> Result<(), Error> {
    write_private(path, contents).map_err(io(format!("cannot write {}", path.display())))
}

/// Opens `path` for appending (created if missing).
pub(crate) fn append(path: &Path) -> Result<std::fs::File, Error> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io(format!("cannot open {}", path.display())))
}

/// The last 25 lines of `path` (empty when it cannot be read).
pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(25)..].join("\n")
}
