//! ShortcutConnections and their kubeconfig Secrets: written by `kubetun shortcut` and the
//! hub's operator, read by both, the route agent and the lab.

/// Finalizer that keeps a ShortcutConnection until the link is removed from both leaves.
pub const FINALIZER: &str = "net.kubetun.io/shortcut-cleanup";
/// Key of the kubeconfig in a leaf's Secret unless the spec names another.
pub const DEFAULT_SECRET_KEY: &str = "kubeconfig";
/// Label on the kubeconfig Secrets `kubetun shortcut create` makes, naming the shortcut; the
/// operator watches Secrets with this label and retries the shortcut when one changes.
pub const SHORTCUT_LABEL: &str = "net.kubetun.io/shortcut";

/// Condition type: both tunnels are connected.
pub const READY: &str = "Ready";
/// Condition type: the hub reaches both leaves.
pub const LEAF_REACHABLE: &str = "LeafReachable";

/// Condition reasons of a ShortcutConnection.
pub mod reason {
    /// Both leaves answered.
    pub const REACHABLE: &str = "Reachable";
    /// The kubeconfig Secret or its key does not exist.
    pub const KUBECONFIG_MISSING: &str = "KubeconfigMissing";
    /// The kubeconfig does not parse or has no usable context.
    pub const KUBECONFIG_INVALID: &str = "KubeconfigInvalid";
    /// A leaf's API server does not answer or refuses the credentials.
    pub const LEAF_UNREACHABLE: &str = "LeafUnreachable";
    /// kubetun is not running on a leaf (no cluster info).
    pub const KUBETUN_MISSING: &str = "KubetunMissing";
    /// Both leaves are the same cluster, or an object is in the way.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A leaf refused the other's NetworkConfig.
    pub const REJECTED: &str = "Rejected";
    /// Waiting for the leaves to process each other's NetworkConfig.
    pub const PROCESSING: &str = "Processing";
    /// Waiting for the tunnels.
    pub const CONNECTING: &str = "Connecting";
    /// A tunnel reports an error.
    pub const CONNECTION_ERROR: &str = "ConnectionError";
    /// Both tunnels are up.
    pub const CONNECTED: &str = "Connected";
    /// The link is being removed.
    pub const DELETING: &str = "Deleting";
    /// This cluster's controller is not a hub: nothing here acts on the ShortcutConnection.
    pub const NOT_HUB: &str = "NotHub";
}
