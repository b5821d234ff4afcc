//! NetworkConfigs and TunnelEndpoints, the two objects of a link: written by the connector
//! (the CLI and the hub's operator) and the controller, read by the route agent, the CLI's
//! status and diagnosis, and the lab.

/// Label telling whether a NetworkConfig is ours (`local`) or a peer's (`remote`).
pub const ROLE_LABEL: &str = "net.kubetun.io/role";
/// Label naming the peer cluster id of a NetworkConfig.
pub const PEER_LABEL: &str = "net.kubetun.io/peer";
/// [`ROLE_LABEL`] value of the NetworkConfig this cluster sends to a peer.
pub const ROLE_LOCAL: &str = "local";
/// [`ROLE_LABEL`] value of the NetworkConfig a peer sent to this cluster.
pub const ROLE_REMOTE: &str = "remote";
/// Prefix of the annotations the hub's ShortcutConnection operator puts on the hub's `from-`
/// NetworkConfig of a leaf whose traffic the hub may forward to other leaves: one per
/// ShortcutConnection that allows it, `transit.net.kubetun.io/<its uid>: "true"`, so each
/// grant is added and withdrawn on its own and the last one gone ends the transit.
pub const TRANSIT_ANNOTATION_PREFIX: &str = "transit.net.kubetun.io/";
/// Annotation on the NetworkConfigs of a link a hub manages: `namespace/name` of the
/// ShortcutConnection on the hub.
pub const SHORTCUT_ANNOTATION: &str = "net.kubetun.io/shortcut";
/// Annotation naming the hub (its cluster id) next to [`SHORTCUT_ANNOTATION`].
pub const HUB_ANNOTATION: &str = "net.kubetun.io/hub";
/// Label marking every object the connector creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// [`MANAGED_BY_LABEL`] value of the connector.
pub const MANAGED_BY_CONNECTOR: &str = "kubetun-connector";
/// Finalizer on peers' NetworkConfigs: their views are released before they go.
pub const FINALIZER: &str = "net.kubetun.io/ipam";

/// Condition type on a remote NetworkConfig: its CIDRs have been mapped.
pub const PROCESSED: &str = "Processed";
/// Condition type on a TunnelEndpoint: the gateway accepted the state that contains it.
pub const APPLIED: &str = "Applied";
/// Condition type on a TunnelEndpoint: the gateway reports a working tunnel.
pub const CONNECTED: &str = "Connected";

/// Condition (and Event) reasons on NetworkConfigs and TunnelEndpoints, in `UpperCamelCase`
/// as the API conventions require.
pub mod reason {
    /// Every CIDR has a view.
    pub const PROCESSED: &str = "Processed";
    /// A CIDR does not parse or has host bits set.
    pub const INVALID_CIDR: &str = "InvalidCIDR";
    /// A CIDR needed a remap and no pool has room.
    pub const POOL_EXHAUSTED: &str = "PoolExhausted";
    /// The NetworkConfig is addressed to another cluster.
    pub const WRONG_DESTINATION: &str = "WrongDestination";
    /// The public key is not a base64 X25519 key.
    pub const INVALID_PUBLIC_KEY: &str = "InvalidPublicKey";
    /// Labels and spec disagree about who sent the NetworkConfig.
    pub const INVALID_SOURCE: &str = "InvalidSource";
    /// The spec is unusable for another reason.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A NetworkConfig lacks the role/peer labels (or has an unknown role): not processed.
    pub const MISSING_LABELS: &str = "MissingLabels";
    /// A labelled NetworkConfig does not have the name its labels call for.
    pub const INVALID_NAME: &str = "InvalidName";
    /// A TunnelEndpoint that no NetworkConfig owns (made by hand): removed (Event reason).
    pub const NOT_MANAGED: &str = "NotManaged";
    /// The gateway accepted the state.
    pub const APPLIED: &str = "Applied";
    /// The gateway does not run the desired state (yet).
    pub const PENDING: &str = "Pending";
    /// The gateway refused the state.
    pub const REJECTED: &str = "Rejected";
    /// The gateway cannot be reached.
    pub const GATEWAY_UNAVAILABLE: &str = "GatewayUnavailable";
    /// The tunnel is up.
    pub const CONNECTED: &str = "Connected";
    /// Waiting for the first handshake.
    pub const CONNECTING: &str = "Connecting";
    /// Handshakes fail or the peer is unreachable.
    pub const CONNECTION_ERROR: &str = "ConnectionError";
}
