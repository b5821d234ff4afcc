//! The gateway key files: written once at bring-up, read back when a gateway moves.

use std::path::Path;

use kubetun_controller::keys::GatewayKey;

use crate::error::LabError;

/// Writes a gateway's private key to a file only root can read.
pub(super) fn write_key(path: &Path, key: &GatewayKey) -> Result<(), LabError> {
    kubetun_testenv::write_private(path, key.private_base64().as_bytes()).map_err(|error| {
        LabError::Io {
            path: path.to_owned(),
            error,
        }
    })
}

pub(super) fn read_key(path: &Path) -> Result<GatewayKey, LabError> {
    let text = std::fs::read_to_string(path).map_err(|error| LabError::Io {
        path: path.to_owned(),
        error,
    })?;
    GatewayKey::from_private_base64(text.trim()).map_err(|e| LabError::Key {
        path: path.to_owned(),
        message: e.to_string(),
    })
}
