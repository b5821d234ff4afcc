//! The API side of install and uninstall: server-side apply of the manifests' objects,
//! pruning what another set of components installed, waiting for readiness, and removing
//! everything again.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kubetun_crds::contract::cluster_info::DEFAULT_NAMESPACE;
use serde_json::{Value, json};

use super::api_error;
use super::manifests::{self, AGENT, Components, GATEWAY};
use crate::Error;

/// Field manager of everything `kubetun install` applies.
pub const FIELD_MANAGER: &str = "kubetun";

/// API resources by `(apiVersion, kind)`, found by discovery once each.
#[derive(Default)]
struct Resources(HashMap<(String, String), (ApiResource, ApiCapabilities)>);

impl Resources {
    async fn api(
        &mut self,
        client: &kube::Client,
        object: &Value,
    ) -> Result<Api<DynamicObject>, Error> {
        let (api_version, kind, namespace, _) = manifests::identity(object);
        let key = (api_version.clone(), kind.clone());
        if !self.0.contains_key(&key) {
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
            let gvk = GroupVersionKind::gvk(group, version, &kind);
            let found = kube::discovery::pinned_kind(client, &gvk)
                .await
                .map_err(api_error(format!("find the API of {kind} ({api_version})")))?;
            self.0.insert(key.clone(), found);
        }
        let (resource, caps) = &self.0[&key];
        Ok(match caps.scope {
            Scope::Namespaced => Api::namespaced_with(client.clone(), &namespace, resource),
            Scope::Cluster => Api::all_with(client.clone(), resource),
        })
    }
}

fn describe(object: &Value) -> String {
    let (_, kind, namespace, name) = manifests::identity(object);
    if namespace.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {namespace}/{name}")
    }
}

/// Server-side applies `objects` in order (field manager `kubetun`, conflicts forced: the
/// manifests own their fields, also after a `kubectl apply -k deploy/`).
pub async fn apply_all(
    client: &kube::Client,
    objects: &[Value],
    report: impl Fn(String),
) -> Result<(), Error> {
    let mut resources = Resources::default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for object in objects {
        let api = resources.api(client, object).await?;
        let (_, _, _, name) = manifests::identity(object);
        api.patch(&name, &params, &Patch::Apply(object))
            .await
            .map_err(api_error(format!("apply {}", describe(object))))?;
        report(format!("applied {}", describe(object)));
    }
    Ok(())
}

/// Every object any set of components installs (the Service of the plain install, which
/// `--ha` drops, for instance).
fn every_possible_object() -> Result<Vec<Value>, Error> {
    let mut all = Vec::new();
    let mut seen = BTreeSet::new();
    for ha in [false, true] {
        for hub_forwarding in [false, true] {
            for object in manifests::render(Components { ha, hub_forwarding })
                .map_err(|e| Error::Usage(e.to_string()))?
            {
                if seen.insert(manifests::identity(&object)) {
                    all.push(object);
                }
            }
        }
    }
    Ok(all)
}

/// The Multi-Cluster Services API's CRDs present in the cluster that `kubetun install` did
/// not apply (another implementation's, or `kubectl apply`'s): kubetun uses them as they are
/// and never replaces or deletes them.
pub async fn foreign_mcs_crds(client: &kube::Client) -> Result<BTreeSet<String>, Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut foreign = BTreeSet::new();
    for crd in kubetun_crds::mcs::mcs_crds() {
        let name = crd.metadata.name.unwrap_or_default();
        let Some(present) = crds
            .get_opt(&name)
            .await
            .map_err(api_error(format!("read CustomResourceDefinition {name}")))?
        else {
            continue;
        };
        let ours = present
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|m| m.manager.as_deref() == Some(FIELD_MANAGER));
        if !ours {
            foreign.insert(name);
        }
    }
    Ok(foreign)
}

/// Whether `object` is one of `foreign` CRDs.
pub fn is_foreign(object: &Value, foreign: &BTreeSet<String>) -> bool {
    let (_, kind, _, name) = manifests::identity(object);
    kind == "CustomResourceDefinition" && foreign.contains(&name)
}

/// Deletes the objects another set of components installed that this one has not.
pub async fn prune(
    client: &kube::Client,
    objects: &[Value],
    report: impl Fn(String),
) -> Result<(), Error> {
    let wanted: BTreeSet<_> = objects.iter().map(manifests::identity).collect();
    let foreign = foreign_mcs_crds(client).await?;
    let mut resources = Resources::default();
    for object in every_possible_object()?
        .into_iter()
        .filter(|o| !is_foreign(o, &foreign))
    {
        if wanted.contains(&manifests::identity(&object)) {
            continue;
        }
        let api = resources.api(client, &object).await?;
        let (_, _, _, name) = manifests::identity(&object);
        if api
            .delete(&name, &DeleteParams::default())
            .await
            .map_err(api_error(format!("delete {}", describe(&object))))
            .map(|_| true)
            .or_else(not_found)?
        {
            report(format!(
                "deleted {} (not part of this install)",
                describe(&object)
            ));
        }
    }
    Ok(())
}

/// A 404 is `Ok(false)`.
fn not_found(error: Error) -> Result<bool, Error> {
    match &error {
        Error::Api { error: e, .. } if matches!(**e, kube::Error::Api(ref s) if s.code == 404) => {
            Ok(false)
        }
        _ => Err(error),
    }
}

/// Waits with progress until the gateway Deployment and the agent DaemonSet are Ready.
pub async fn wait_ready(client: &kube::Client, timeout: Duration) -> Result<(), Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), DEFAULT_NAMESPACE);
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), DEFAULT_NAMESPACE);
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        let deployment = deployments
            .get_opt(GATEWAY)
            .await
            .map_err(api_error("read the gateway Deployment"))?;
        let daemonset = daemonsets
            .get_opt(AGENT)
            .await
            .map_err(api_error("read the agent DaemonSet"))?;
        let (gateway_ready, gateway_text) = deployment.map_or((false, "missing".to_owned()), |d| {
            let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let status = d.status.unwrap_or_default();
            let current = status.observed_generation >= d.metadata.generation;
            let ready = status.ready_replicas.unwrap_or(0);
            let updated = status.updated_replicas.unwrap_or(0);
            (
                current && ready >= wanted && updated >= wanted,
                format!("{ready}/{wanted} replicas ready, {updated} updated"),
            )
        });
        let (agent_ready, agent_text) = daemonset.map_or((false, "missing".to_owned()), |d| {
            let status = d.status.unwrap_or_default();
            let current = status.observed_generation >= d.metadata.generation;
            (
                current
                    && status.number_ready >= status.desired_number_scheduled
                    && status.updated_number_scheduled.unwrap_or(0)
                        >= status.desired_number_scheduled,
                format!(
                    "{}/{} nodes ready",
                    status.number_ready, status.desired_number_scheduled
                ),
            )
        });
        let line =
            format!("gateway Deployment: {gateway_text}; route agent DaemonSet: {agent_text}");
        if gateway_ready && agent_ready {
            println!("✓ ready: {line}");
            return Ok(());
        }
        if line != last {
            println!("… waiting: {line}");
            last = line.clone();
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!(
                    "kubetun to be Ready ({line}); the objects are applied, check `kubectl -n \
                     {DEFAULT_NAMESPACE} get pods` and the nodes' kubelets"
                ),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The API resources of kubetun's own kinds, from the CRDs of the manifests.
fn kubetun_kinds() -> Result<Vec<(ApiResource, bool)>, Error> {
    let objects =
        manifests::render(Components::default()).map_err(|e| Error::Usage(e.to_string()))?;
    Ok(objects
        .iter()
        .filter(|o| manifests::identity(o).1 == "CustomResourceDefinition")
        .filter_map(|crd| {
            let group = crd.pointer("/spec/group")?.as_str()?.to_owned();
            let version = crd
                .pointer("/spec/versions")?
                .as_array()?
                .iter()
                .find(|v| v.get("storage") == Some(&Value::Bool(true)))?
                .get("name")?
                .as_str()?
                .to_owned();
            let namespaced = crd.pointer("/spec/scope")?.as_str()? == "Namespaced";
            Some((
                ApiResource {
                    api_version: format!("{group}/{version}"),
                    group,
                    version,
                    kind: crd.pointer("/spec/names/kind")?.as_str()?.to_owned(),
                    plural: crd.pointer("/spec/names/plural")?.as_str()?.to_owned(),
                },
                namespaced,
            ))
        })
        .collect())
}

/// Lists `resource` everywhere; a kind that is not served (CRDs gone) lists nothing.
async fn list_all(
    client: &kube::Client,
    resource: &ApiResource,
) -> Result<Vec<DynamicObject>, Error> {
    match Api::<DynamicObject>::all_with(client.clone(), resource)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(api_error(format!("list {}", resource.plural))(e)),
    }
}

/// Removes everything kubetun created: refuses while links exist unless `force`.
pub async fn uninstall(client: &kube::Client, force: bool, timeout: Duration) -> Result<(), Error> {
    let kinds = kubetun_kinds()?;
    let mut links = Vec::new();
    for (resource, _) in &kinds {
        if matches!(
            resource.kind.as_str(),
            "NetworkConfig" | "ShortcutConnection"
        ) {
            for object in list_all(client, resource).await? {
                links.push(format!(
                    "{} {}/{}",
                    resource.kind,
                    object.metadata.namespace.unwrap_or_default(),
                    object.metadata.name.unwrap_or_default()
                ));
            }
        }
    }
    if !links.is_empty() && !force {
        return Err(Error::Usage(format!(
            "refusing to uninstall while links exist: {}; take them down first (`kubetun network \
             disconnect`, `kubetun shortcut delete`), or pass --force (peers then keep this \
             cluster's NetworkConfigs until they disconnect)",
            links.join(", ")
        )));
    }
    let mut resources = Resources::default();
    let all = every_possible_object()?;
    // The workloads first, so no controller writes while the rest goes.
    for object in all.iter().filter(|o| {
        matches!(
            manifests::identity(o).1.as_str(),
            "Deployment" | "DaemonSet"
        )
    }) {
        delete(client, &mut resources, object).await?;
    }
    // kubetun's objects, finalizers dropped (their controller is gone).
    for (resource, namespaced) in &kinds {
        for object in list_all(client, resource).await? {
            let name = object.metadata.name.clone().unwrap_or_default();
            let namespace = object.metadata.namespace.clone().unwrap_or_default();
            let api: Api<DynamicObject> = if *namespaced {
                Api::namespaced_with(client.clone(), &namespace, resource)
            } else {
                Api::all_with(client.clone(), resource)
            };
            let gone = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 404);
            let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
            if object
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
                && let Err(e) = api.patch(&name, &PatchParams::default(), &unfinalize).await
                && !gone(&e)
            {
                return Err(api_error(format!(
                    "remove the finalizers of {} {name}",
                    resource.kind
                ))(e));
            }
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => println!("deleted {} {namespace}/{name}", resource.kind),
                Err(e) if gone(&e) => {}
                Err(e) => return Err(api_error(format!("delete {} {name}", resource.kind))(e)),
            }
        }
    }
    // What the controller made in its namespace: the key Secret, leaves' kubeconfig
    // Secrets, the cluster info ConfigMap, the gateway Lease (contents never printed).
    for (api_version, kind) in [
        ("v1", "Secret"),
        ("v1", "ConfigMap"),
        ("coordination.k8s.io/v1", "Lease"),
    ] {
        let probe = json!({"apiVersion": api_version, "kind": kind, "metadata": {"namespace": DEFAULT_NAMESPACE}});
        let api = resources.api(client, &probe).await?;
        let names: Vec<String> = match api.list_metadata(&ListParams::default()).await {
            Ok(list) => list
                .items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect(),
            Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
            Err(e) => return Err(api_error(format!("list {kind}s"))(e)),
        };
        for name in names {
            let object = json!({"apiVersion": api_version, "kind": kind,
                "metadata": {"namespace": DEFAULT_NAMESPACE, "name": name}});
            delete(client, &mut resources, &object).await?;
        }
    }
    // The manifests' objects, the namespace and the CRDs last; MCS API CRDs kubetun install
    // did not apply stay (other implementations may use them).
    let foreign = foreign_mcs_crds(client).await?;
    for object in all.iter().rev() {
        if is_foreign(object, &foreign) {
            println!(
                "kept {} (not installed by kubetun install)",
                describe(object)
            );
            continue;
        }
        delete(client, &mut resources, object).await?;
    }
    // Wait for them to be gone (a CRD goes once its objects are gone); a namespace is
    // removed by the namespace controller.
    let deadline = Instant::now() + timeout;
    for object in all.iter().filter(|o| !is_foreign(o, &foreign)) {
        let (_, kind, _, name) = manifests::identity(object);
        let api = resources.api(client, object).await?;
        loop {
            match api.get_opt(&name).await {
                Ok(None) => break,
                Ok(Some(_)) if kind == "Namespace" => {
                    println!(
                        "Namespace {name} is terminating (the namespace controller removes it)"
                    );
                    break;
                }
                Ok(Some(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                Ok(Some(_)) => {
                    return Err(Error::Timeout {
                        what: format!("{} to be deleted", describe(object)),
                        timeout,
                    });
                }
                Err(e) => return Err(api_error(format!("read {}", describe(object)))(e)),
            }
        }
    }
    println!("uninstalled kubetun");
    Ok(())
}

async fn delete(
    client: &kube::Client,
    resources: &mut Resources,
    object: &Value,
) -> Result<(), Error> {
    let api = resources.api(client, object).await?;
    let (_, _, _, name) = manifests::identity(object);
    if api
        .delete(&name, &DeleteParams::background())
        .await
        .map_err(api_error(format!("delete {}", describe(object))))
        .map(|_| true)
        .or_else(not_found)?
    {
        println!("deleted {}", describe(object));
    }
    Ok(())
}
