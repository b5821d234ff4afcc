//! Shared fixtures of the network controller scenarios: an in-memory API server that serves
//! cluster-scoped NetworkIds with atomic creates, Network builders and a reconcile driver.

use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use kube_fake_client::{ClientBuilder, Error as FakeError, interceptor};
use kubetun_controller::operator::isolation::{Context, NetworkOptions, reconcile_network};
use kubetun_controller::plumbing::runtime::ApiHealth;
use kubetun_crds::contract::network::FINALIZER;
use kubetun_crds::{Network, NetworkId, NetworkPeering, NetworkRef, NetworkSpec};

pub const NS: &str = "kubetun";

/// Namespace of the fake API server under which cluster-scoped NetworkIds are kept.
///
/// The fake registers every custom resource as namespaced, so requests for NetworkIds (the
/// only cluster-scoped objects these scenarios touch) are served by interceptors from this
/// reserved namespace. Its create holds a lock across check and insert: the fake checks for
/// the name and stores under two separate locks, and create-as-lock relies on an atomic create.
pub const CLUSTER_SCOPE: &str = "cluster-scope";

/// One injected failure: given the object name, the error to answer with, if any.
pub type Fault = Box<dyn Fn(&str) -> Option<FakeError> + Send + Sync>;

/// Injected NetworkId failures.
#[derive(Default)]
pub struct Faults {
    /// Refuse the create with this error (nothing is stored).
    pub refuse_create: Option<Fault>,
    /// Store the object, then answer with this error (a lost response).
    pub lose_create_response: Option<Fault>,
    /// Fail a GET with this error.
    pub fail_get: Option<Fault>,
}

fn strip_scope(mut value: serde_json::Value) -> serde_json::Value {
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("namespace");
    }
    value
}

fn network_id_interceptors(faults: Faults) -> interceptor::Funcs {
    let lock = Arc::new(Mutex::new(()));
    let Faults {
        refuse_create,
        lose_create_response,
        fail_get,
    } = faults;
    interceptor::Funcs::new()
        .create(move |ctx| {
            if ctx.object.get("kind").and_then(|k| k.as_str()) != Some("NetworkID") {
                return Ok(None);
            }
            let mut nid: NetworkId = serde_json::from_value(ctx.object.clone())?;
            let name = nid.name_any();
            if let Some(err) = refuse_create.as_ref().and_then(|f| f(&name)) {
                return Err(err);
            }
            nid.metadata.namespace = Some(CLUSTER_SCOPE.to_owned());
            let created = {
                let _atomic = lock.lock().unwrap();
                ctx.client.create(CLUSTER_SCOPE, &nid, ctx.params)?
            };
            if let Some(err) = lose_create_response.as_ref().and_then(|f| f(&name)) {
                return Err(err);
            }
            Ok(Some(strip_scope(serde_json::to_value(created)?)))
        })
        .get(move |ctx| {
            if !ctx.namespace.is_empty() {
                return Ok(None);
            }
            if let Some(err) = fail_get.as_ref().and_then(|f| f(ctx.name)) {
                return Err(err);
            }
            let nid: NetworkId = ctx.client.get(CLUSTER_SCOPE, ctx.name)?;
            Ok(Some(strip_scope(serde_json::to_value(nid)?)))
        })
        .list(|ctx| {
            if ctx.namespace.is_some() {
                return Ok(None);
            }
            let all: Vec<NetworkId> = ctx
                .client
                .list(Some(CLUSTER_SCOPE), &ListParams::default())?;
            all.into_iter()
                .map(|nid| Ok(strip_scope(serde_json::to_value(nid)?)))
                .collect::<Result<Vec<_>, FakeError>>()
                .map(Some)
        })
        .delete(|ctx| {
            if !ctx.namespace.is_empty() {
                return Ok(None);
            }
            let deleted: NetworkId = ctx.client.delete(CLUSTER_SCOPE, ctx.name)?;
            Ok(Some(strip_scope(serde_json::to_value(deleted)?)))
        })
}

/// A fake API server holding `networks` and the claims `ids`.
pub async fn fake_api(networks: Vec<Network>, ids: Vec<NetworkId>) -> Client {
    fake_api_with(networks, ids, Faults::default()).await
}

/// Like [`fake_api`], with injected NetworkId failures.
pub async fn fake_api_with(networks: Vec<Network>, ids: Vec<NetworkId>, faults: Faults) -> Client {
    let ids: Vec<NetworkId> = ids
        .into_iter()
        .map(|mut nid| {
            nid.metadata.namespace = Some(CLUSTER_SCOPE.to_owned());
            nid
        })
        .collect();
    ClientBuilder::new()
        .with_resource::<Network>()
        .with_resource::<NetworkId>()
        .with_status_subresource::<Network>()
        .with_objects(networks)
        .with_objects(ids)
        .with_interceptor_funcs(network_id_interceptors(faults))
        .build()
        .await
        .unwrap()
}

pub fn options(min: u32, max: u32) -> NetworkOptions {
    NetworkOptions {
        min_vni: min,
        max_vni: max,
        max_attempts: 64,
    }
}

pub fn context(client: &Client, opts: NetworkOptions) -> Arc<Context> {
    Arc::new(Context::new(client.clone(), &opts, ApiHealth::new(client.clone())).unwrap())
}

pub fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

/// A Network that already carries the finalizer (so one reconcile does the work).
pub fn network(name: &str, uid: &str) -> Network {
    let mut n = Network::new(name, NetworkSpec::default());
    n.metadata.namespace = Some(NS.to_owned());
    n.metadata.uid = Some(uid.to_owned());
    n.metadata.generation = Some(1);
    n.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
    n
}

pub fn with_prefixes(mut n: Network, prefixes: &[&str]) -> Network {
    n.spec.prefixes = prefixes.iter().map(|p| (*p).to_owned()).collect();
    n
}

pub fn peering_to(mut n: Network, peering: &str, target: &str) -> Network {
    n.spec.peerings.push(NetworkPeering {
        name: peering.to_owned(),
        network_ref: NetworkRef {
            name: target.to_owned(),
            namespace: None,
        },
        prefixes: Vec::new(),
    });
    n
}

/// A Network being deleted (deletionTimestamp set, finalizer still on).
pub fn deleting(mut n: Network) -> Network {
    n.metadata.deletion_timestamp = Some(Time(at(1_700_000_000)));
    n
}

/// Reads the Network from the API and reconciles it once.
pub async fn reconcile(
    client: &Client,
    ctx: &Arc<Context>,
    name: &str,
) -> Result<Action, kubetun_controller::operator::isolation::NetworkError> {
    let current = networks(client).get(name).await.unwrap();
    reconcile_network(Arc::new(current), ctx.clone()).await
}

pub fn networks(client: &Client) -> Api<Network> {
    Api::namespaced(client.clone(), NS)
}

pub fn network_ids(client: &Client) -> Api<NetworkId> {
    Api::all(client.clone())
}

/// `(id, claimer uid)` of every stored NetworkId, sorted by ID.
pub async fn claims(client: &Client) -> Vec<(u32, String)> {
    let mut all: Vec<(u32, String)> = network_ids(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|nid| (nid.name_any().parse().unwrap(), nid.spec.claim_ref.uid))
        .collect();
    all.sort();
    all
}

pub async fn status_id(client: &Client, name: &str) -> Option<String> {
    networks(client)
        .get(name)
        .await
        .unwrap()
        .status
        .and_then(|s| s.id)
}
