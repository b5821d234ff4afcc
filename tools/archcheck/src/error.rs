//! Why the gate could not look at a crate.

use std::path::PathBuf;

/// Why a crate's sources could not be read (the gate fails with the file named).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A source file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A source file does not parse.
    #[error("parsing {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A `mod name;` has no file.
    #[error("{parent}: `mod {name};` has neither {name}.rs nor {name}/mod.rs")]
    MissingModule { parent: PathBuf, name: String },
    /// `cargo metadata` failed or said something unexpected.
    #[error("cargo metadata: {0}")]
    Metadata(String),
}
