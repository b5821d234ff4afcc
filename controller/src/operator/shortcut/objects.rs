//! What the operator's parts share about the hub's ShortcutConnections: the field manager
//! of the status writes, the key of a shortcut, and the check that the CRD is served.

use kube::ResourceExt as _;
use kubetun_crds::ShortcutConnection;

use super::error::ShortcutError;

/// Field manager of the operator's status writes.
pub const FIELD_MANAGER: &str = "kubetun-shortcut";

/// Fails unless the API server serves ShortcutConnections here (one list of one object).
pub(super) async fn require_crd(
    shortcuts: &kube::Api<ShortcutConnection>,
) -> Result<(), ShortcutError> {
    shortcuts
        .list(&kube::api::ListParams::default().limit(1))
        .await
        .map(drop)
        .map_err(|source| ShortcutError::Hub {
            action: "list ShortcutConnections (is the CRD installed?)".to_owned(),
            source,
        })
}

/// `namespace/name`: the key of a shortcut's backoff and leaf watches.
pub(super) fn key_of(shortcut: &ShortcutConnection) -> String {
    format!(
        "{}/{}",
        shortcut.namespace().unwrap_or_default(),
        shortcut.name_any()
    )
}
