//! [`LeafWatches`]: watches of each shortcut's leaves that trigger a reconcile when a
//! NetworkConfig or TunnelEndpoint there changes in a way that can change the outcome.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::StreamExt as _;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kubetun_crds::ShortcutConnection;

use super::objects::key_of;
use crate::connector::Connector;

/// Watches of each shortcut's leaves (NetworkConfigs and TunnelEndpoints in kubetun's
/// namespace there) that ask for a reconcile of the shortcut when something that decides its
/// outcome changes. One set of watch tasks per shortcut, started by its first successful
/// connection to both leaves and stopped when it is deleted or a kubeconfig Secret changes.
#[derive(Debug, Default)]
pub struct LeafWatches {
    trigger: Mutex<Option<tokio::sync::mpsc::UnboundedSender<ObjectRef<ShortcutConnection>>>>,
    running: Mutex<HashMap<String, WatchTasks>>,
}

/// The spec generation a shortcut's leaf watches were started for, and their tasks.
type WatchTasks = (Option<i64>, Vec<tokio::task::JoinHandle<()>>);

impl LeafWatches {
    /// Watches that send the shortcuts to reconcile into the returned stream.
    pub fn new() -> (
        Self,
        tokio_stream::wrappers::UnboundedReceiverStream<ObjectRef<ShortcutConnection>>,
    ) {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let watches = Self {
            trigger: Mutex::new(Some(sender)),
            running: Mutex::default(),
        };
        (
            watches,
            tokio_stream::wrappers::UnboundedReceiverStream::new(receiver),
        )
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, WatchTasks>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Number of shortcuts whose leaves are watched.
    pub fn len(&self) -> usize {
        self.running().len()
    }

    /// Whether no leaves are watched.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts watching the leaves of `shortcut` through `connector`'s clients, unless they
    /// are watched already for this generation of its spec. Without a trigger (tests that
    /// call [`reconcile`] directly) this does nothing.
    pub(super) fn ensure(&self, shortcut: &ShortcutConnection, connector: &Connector) {
        let Some(trigger) = self
            .trigger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
        else {
            return;
        };
        let key = key_of(shortcut);
        let generation = shortcut.metadata.generation;
        let mut running = self.running();
        if running
            .get(&key)
            .is_some_and(|(g, tasks)| *g == generation && tasks.iter().all(|t| !t.is_finished()))
        {
            return;
        }
        if let Some((_, old)) = running.remove(&key) {
            old.iter().for_each(tokio::task::JoinHandle::abort);
        }
        let target = ObjectRef::from_obj(shortcut);
        let mut tasks = Vec::new();
        for handle in [connector.local(), connector.remote()] {
            let configs: Api<kubetun_crds::NetworkConfig> =
                Api::namespaced(handle.client.clone(), &handle.namespace);
            let config = watcher::Config::default().labels(&format!(
                "{}={}",
                kubetun_crds::contract::link::MANAGED_BY_LABEL,
                kubetun_crds::contract::link::MANAGED_BY_CONNECTOR
            ));
            tasks.push(tokio::spawn(forward_changes(
                watcher(configs, config),
                config_fingerprint,
                trigger.clone(),
                target.clone(),
            )));
            let tunnels: Api<kubetun_crds::TunnelEndpoint> =
                Api::namespaced(handle.client.clone(), &handle.namespace);
            tasks.push(tokio::spawn(forward_changes(
                watcher(tunnels, watcher::Config::default()),
                tunnel_fingerprint,
                trigger.clone(),
                target.clone(),
            )));
        }
        running.insert(key, (generation, tasks));
    }

    /// Stops watching the leaves of shortcut `key` (`namespace/name`).
    pub fn stop(&self, key: &str) {
        if let Some((_, tasks)) = self.running().remove(key) {
            tasks.iter().for_each(tokio::task::JoinHandle::abort);
        }
    }
}

impl Drop for LeafWatches {
    fn drop(&mut self) {
        for (_, tasks) in self.running().values() {
            tasks.iter().for_each(tokio::task::JoinHandle::abort);
        }
    }
}

/// What of a leaf's NetworkConfig can change a shortcut's outcome.
fn config_fingerprint(nc: &kubetun_crds::NetworkConfig) -> String {
    let status = nc.status.as_ref();
    format!(
        "{:?} {:?} {:?} {:?}",
        nc.metadata.generation,
        status.map(|s| s.processed),
        status.and_then(|s| s.observed_generation),
        status.map(|s| {
            s.conditions
                .iter()
                .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
                .collect::<Vec<_>>()
        }),
    )
}

/// What of a leaf's TunnelEndpoint can change a shortcut's outcome: not the counters and
/// latency the gateway sync refreshes all the time, but the state and the path (direct or
/// through the hub).
fn tunnel_fingerprint(te: &kubetun_crds::TunnelEndpoint) -> String {
    let status = te.status.as_ref();
    let connection = status.and_then(|s| s.connection.as_ref());
    format!(
        "{:?} {:?} {:?} {:?}",
        te.metadata.generation,
        status.and_then(|s| s.observed_generation),
        connection.map(|c| c.status),
        connection.map(|c| c.path_switches),
    )
}

/// Sends `target` whenever an object of `events` appears, goes, or changes its fingerprint
/// (and once per complete (re)list, which also covers what a broken watch missed).
async fn forward_changes<K>(
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    fingerprint: fn(&K) -> String,
    trigger: tokio::sync::mpsc::UnboundedSender<ObjectRef<ShortcutConnection>>,
    target: ObjectRef<ShortcutConnection>,
) where
    K: kube::Resource + Send,
{
    use kube::runtime::WatchStreamExt as _;
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut listing: HashMap<String, String> = HashMap::new();
    let events = events.default_backoff();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        let changed = match event {
            Ok(watcher::Event::Apply(obj)) => {
                let print = fingerprint(&obj);
                seen.insert(obj.name_any(), print.clone()) != Some(print)
            }
            Ok(watcher::Event::Delete(obj)) => seen.remove(&obj.name_any()).is_some(),
            Ok(watcher::Event::Init) => {
                listing.clear();
                false
            }
            Ok(watcher::Event::InitApply(obj)) => {
                listing.insert(obj.name_any(), fingerprint(&obj));
                false
            }
            Ok(watcher::Event::InitDone) => {
                let changed = listing != seen;
                seen = std::mem::take(&mut listing);
                changed
            }
            // Backed off and retried by the stream; the leaf's reachability shows up in the
            // shortcut's status through its reconciles.
            Err(_) => false,
        };
        if changed && trigger.send(target.clone()).is_err() {
            return;
        }
    }
}
