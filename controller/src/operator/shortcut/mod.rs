//! The ShortcutConnection operator: runs on the hub and links two leaf clusters directly,
//! with the same [`Connector`] the `kubetun network` CLI uses.
//!
//! For each ShortcutConnection it builds a client per leaf (by default from the kubeconfig
//! Secrets the spec names; injectable through [`LeafClients`]), runs one non-blocking
//! [`Connector::sync`] pass and writes, with server-side apply on the status, how each leaf
//! sees the other (every CIDR and its remapped CIDR) and each tunnel's state. A finalizer
//! tears the link down on both leaves when the ShortcutConnection is deleted, then deletes
//! the kubeconfig Secrets `kubetun shortcut create` made for it (their owner reference only
//! helps where a garbage collector runs). A leaf that cannot be reached shows up as a
//! `LeafReachable=False` condition and is retried with exponential backoff.
//!
//! The operator reacts to events, not a timer: besides its own objects and the labelled
//! kubeconfig Secrets, it watches, through each shortcut's leaf clients, the leaves'
//! NetworkConfigs and TunnelEndpoints ([`LeafWatches`]) and reconciles the shortcut when one
//! changes in a way that can change the outcome (processed, rejected, connection state).
//! The requeue intervals are only a safety net. An error that changes the condition is also
//! a Warning Event on the ShortcutConnection.
//!
//! A controller that is not the hub runs [`run_not_hub`] instead: every ShortcutConnection
//! there gets `Ready=False` (`NotHub`) and an Event saying it belongs on the hub.
//!
//! [`Connector`]: crate::connector::Connector
//! [`Connector::sync`]: crate::connector::Connector::sync

pub mod error;
mod intervals;
mod leaf;
mod not_hub;
mod objects;
mod reconcile;
mod status;
mod watch;

pub use error::ShortcutError;
pub use intervals::Intervals;
pub use leaf::{LeafClients, LeafError, SecretKubeconfigs};
pub use not_hub::{
    NotHub, NotHubContext, explain as explain_not_hub, not_hub_message, run_not_hub,
};
pub use objects::FIELD_MANAGER;
pub use reconcile::{Context, Operator, reconcile, run};
pub use status::status_from;
pub use watch::LeafWatches;
