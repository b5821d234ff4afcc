//! Watch-fed caches of what the reconcilers read on every pass: the namespace's
//! NetworkConfigs and TunnelEndpoints, and every Network (for the ACLs).
//!
//! Read directly, a new remote cost the hub ~22 API requests: each of the ~5 reconciles it
//! causes read both NetworkConfigs and the TunnelEndpoint and listed every Network, and each
//! gateway sync pass listed every TunnelEndpoint. A cache may lag behind the API server, which
//! is safe here: the watches feeding the caches are the reconcilers' triggers and update the
//! cache before the reconcile they trigger runs, so a reconcile that read an old object is
//! followed by one that reads the new one. What the caller has just written, it passes on
//! itself (see [`super::tunnel_endpoint::ensure`]).
//!
//! [`super::run`] feeds the caches from its watches ([`Cache::feed`]). Until a store has its
//! first complete list, and where nothing feeds it ([`super::sync_once`], fake API servers),
//! reads go to the API server.

use std::sync::{Arc, PoisonError, RwLock};

use futures::FutureExt as _;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kubetun_crds::{Network, NetworkConfig, TunnelEndpoint};

/// The stores [`super::run`] feeds from its watches.
#[derive(Debug, Clone)]
pub struct Stores {
    /// NetworkConfigs of the namespace (the NetworkConfig controller's own store).
    pub network_configs: Store<NetworkConfig>,
    /// TunnelEndpoints of the namespace.
    pub tunnel_endpoints: Store<TunnelEndpoint>,
    /// Networks of every namespace.
    pub networks: Store<Network>,
}

/// Reads of NetworkConfigs, TunnelEndpoints and Networks: from the [`Stores`] while they are
/// fed and complete, from the API server otherwise.
pub struct Cache {
    client: kube::Client,
    namespace: String,
    stores: RwLock<Option<Arc<Stores>>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("namespace", &self.namespace)
            .field("fed", &self.current().is_some())
            .finish_non_exhaustive()
    }
}

/// Serves reads from its [`Stores`] until dropped (when the watches that feed them stop).
#[must_use = "the stores are used only while this lives"]
pub struct Feeding<'a> {
    cache: &'a Cache,
    stores: Arc<Stores>,
}

impl std::fmt::Debug for Feeding<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feeding").finish_non_exhaustive()
    }
}

impl Drop for Feeding<'_> {
    fn drop(&mut self) {
        // A store nobody feeds any more only ages. A newer feeding (the reconcilers were
        // restarted before this one was dropped) stays.
        let mut current = self
            .cache
            .stores
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if current
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &self.stores))
        {
            *current = None;
        }
    }
}

impl Cache {
    /// Reads of `namespace`'s objects through `client` until [`Self::feed`] is called.
    pub fn new(client: kube::Client, namespace: String) -> Self {
        Self {
            client,
            namespace,
            stores: RwLock::new(None),
        }
    }

    /// Serves reads from `stores` (once each has its first complete list) while the returned
    /// guard lives; the caller keeps their watches running as long.
    pub fn feed(&self, stores: Stores) -> Feeding<'_> {
        let stores = Arc::new(stores);
        *self.stores.write().unwrap_or_else(PoisonError::into_inner) = Some(stores.clone());
        Feeding {
            cache: self,
            stores,
        }
    }

    fn current(&self) -> Option<Arc<Stores>> {
        self.stores
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The store `pick` chooses, if it is fed and has had its first complete list.
    fn ready<K>(&self, pick: fn(&Stores) -> &Store<K>) -> Option<Store<K>>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        let store = pick(&*self.current()?).clone();
        store.wait_until_ready().now_or_never()?.ok()?;
        Some(store)
    }

    /// NetworkConfig `name` of the namespace.
    pub async fn network_config(
        &self,
        name: &str,
    ) -> Result<Option<Arc<NetworkConfig>>, kube::Error> {
        self.get(|s| &s.network_configs, name).await
    }

    /// TunnelEndpoint `name` of the namespace.
    pub async fn tunnel_endpoint(
        &self,
        name: &str,
    ) -> Result<Option<Arc<TunnelEndpoint>>, kube::Error> {
        self.get(|s| &s.tunnel_endpoints, name).await
    }

    /// Object `name` of the namespace from the store `pick` chooses, or from the API.
    async fn get<K>(
        &self,
        pick: fn(&Stores) -> &Store<K>,
        name: &str,
    ) -> Result<Option<Arc<K>>, kube::Error>
    where
        K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + 'static,
    {
        if let Some(store) = self.ready(pick) {
            return Ok(store.get(&ObjectRef::new(name).within(&self.namespace)));
        }
        let api: Api<K> = Api::namespaced(self.client.clone(), &self.namespace);
        Ok(api.get_opt(name).await?.map(Arc::new))
    }

    /// True only when the cache is fed and holds no TunnelEndpoint `name` (false: unknown).
    pub fn lacks_tunnel_endpoint(&self, name: &str) -> bool {
        self.ready(|s| &s.tunnel_endpoints).is_some_and(|store| {
            store
                .get(&ObjectRef::new(name).within(&self.namespace))
                .is_none()
        })
    }

    /// Every TunnelEndpoint of the namespace.
    pub async fn tunnel_endpoints(&self) -> Result<Vec<TunnelEndpoint>, kube::Error> {
        if let Some(store) = self.ready(|s| &s.tunnel_endpoints) {
            return Ok(store.state().iter().map(|te| (**te).clone()).collect());
        }
        let api: Api<TunnelEndpoint> = Api::namespaced(self.client.clone(), &self.namespace);
        Ok(api.list(&ListParams::default()).await?.items)
    }

    /// Every Network; `None` when the Network API is not installed.
    pub async fn networks(&self) -> Result<Option<Vec<Arc<Network>>>, kube::Error> {
        if let Some(store) = self.ready(|s| &s.networks) {
            return Ok(Some(store.state()));
        }
        let api: Api<Network> = Api::all(self.client.clone());
        match api.list(&ListParams::default()).await {
            Ok(list) => Ok(Some(list.items.into_iter().map(Arc::new).collect())),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt as _;
    use kube::api::PostParams;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;
    use kube_fake_client::ClientBuilder;

    const NAMESPACE: &str = "kubetun";

    fn endpoint(name: &str) -> TunnelEndpoint {
        let mut te = super::super::tunnel_endpoint::tests::endpoint_named(name);
        te.metadata.namespace = Some(NAMESPACE.into());
        te
    }

    fn stores(tunnel_endpoints: Store<TunnelEndpoint>) -> Stores {
        Stores {
            network_configs: store().0,
            tunnel_endpoints,
            networks: store().0,
        }
    }

    async fn names(cache: &Cache) -> Vec<String> {
        let endpoints = cache.tunnel_endpoints().await.expect("read");
        endpoints.iter().map(|te| te.name_any()).collect()
    }

    #[tokio::test]
    async fn reads_the_store_only_while_it_is_fed_and_complete() {
        let client = ClientBuilder::new()
            .with_resource::<TunnelEndpoint>()
            .build()
            .await
            .expect("fake API server");
        let api: Api<TunnelEndpoint> = Api::namespaced(client.clone(), NAMESPACE);
        api.create(&PostParams::default(), &endpoint("rome"))
            .await
            .expect("create");
        let cache = Cache::new(client, NAMESPACE.into());
        assert_eq!(names(&cache).await, ["rome"], "not fed: the API");
        assert!(!cache.lacks_tunnel_endpoint("rome"));

        let (reader, mut writer) = store();
        let feeding = cache.feed(stores(reader));
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(endpoint("milan")));
        assert_eq!(
            names(&cache).await,
            ["rome"],
            "first list incomplete: the API"
        );
        assert!(!cache.lacks_tunnel_endpoint("rome"));

        writer.apply_watcher_event(&Event::InitDone);
        assert_eq!(names(&cache).await, ["milan"], "the store");
        assert!(cache.tunnel_endpoint("rome").await.expect("read").is_none());
        assert!(cache.lacks_tunnel_endpoint("rome"));
        assert!(!cache.lacks_tunnel_endpoint("milan"));

        // Restarted reconcilers feed the cache before the old guard is dropped.
        let (reader, mut writer) = store();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        let newer = cache.feed(stores(reader));
        drop(feeding);
        assert!(names(&cache).await.is_empty(), "the newer store stays");
        drop(newer);
        assert_eq!(names(&cache).await, ["rome"], "no longer fed: the API");
    }
}
