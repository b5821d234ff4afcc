//! Networks and NetworkIDs: written by the controller's Network allocator, read by the CLI,
//! the tests and the lab.

/// Finalizer on every Network: its ID is released before the Network goes away.
pub const FINALIZER: &str = "net.kubetun.io/network-id";
/// Label on every `NetworkId` naming the UID of its claimer.
pub const CLAIM_UID_LABEL: &str = "net.kubetun.io/claim-uid";
/// `claimRef.resource` of IDs claimed by Networks.
pub const NETWORKS_RESOURCE: &str = "networks";

/// Condition types on a Network.
pub mod condition {
    /// The Network holds an ID.
    pub const ID_ALLOCATED: &str = "IDAllocated";
    /// Every peering is Ready.
    pub const PEERINGS_READY: &str = "PeeringsReady";
}

/// Condition reasons on a Network.
pub mod reason {
    /// An ID is claimed.
    pub const ALLOCATED: &str = "Allocated";
    /// The ID was released on deletion (Event reason).
    pub const RELEASED: &str = "Released";
    /// Every ID of the range is taken.
    pub const RANGE_EXHAUSTED: &str = "RangeExhausted";
    /// The attempt budget ran out; retried soon.
    pub const ALLOCATION_FAILED: &str = "AllocationFailed";
    /// The requested `spec.id` belongs to another Network.
    pub const ID_TAKEN: &str = "IDTaken";
    /// The requested `spec.id` lies outside `--min-vni..=--max-vni`.
    pub const ID_OUT_OF_RANGE: &str = "IDOutOfRange";
    /// The requested `spec.id` is not canonical decimal.
    pub const INVALID_ID: &str = "InvalidID";
    /// All peerings are Ready (or there are none).
    pub const PEERINGS_READY: &str = "PeeringsReady";
    /// Some peering waits for the other side.
    pub const PEERINGS_PENDING: &str = "PeeringsPending";
    /// Some peering can never become Ready as specified.
    pub const PEERING_ERROR: &str = "PeeringError";
    /// A NetworkID no live Network holds, awaiting collection (Event reason).
    pub const ORPHANED: &str = "Orphaned";
    /// An orphaned NetworkID was deleted (Event reason).
    pub const COLLECTED: &str = "Collected";
}
