//! The importing half of the services loop: ServiceImports, their derived Services and
//! EndpointSlices written from the desired imports, what no longer should be removed, and the
//! table the DNS server answers from.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt as _;

use k8s_openapi::api::core::v1::{Service, ServicePort as KubePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource as _, ResourceExt as _};
use kubetun_crds::contract::services::{DERIVED_FOR_LABEL, MANAGED_BY, MANAGED_LABEL};
use kubetun_crds::mcs::v1beta1::{ServiceImport, ServiceImportSpec, ServiceImportStatus};
use kubetun_crds::mcs::{ClusterStatus, ServiceImportType};

use super::desired::{DesiredImport, derived_service_name};

use super::dns::{DnsService, DnsTable};
use super::sync::Pass;
use super::writes::{FIELD_MANAGER, apply_changed, delete, hash, key};
use crate::plumbing::runtime;

/// Imports written at once (their requests overlap; the API server orders nothing across
/// them).
const CONCURRENT_WRITES: usize = 16;

impl Pass {
    /// ServiceImports, derived Services and EndpointSlices as `imports` says; the rest of
    /// kubetun's goes.
    pub(super) async fn import(&mut self, imports: &[DesiredImport]) -> Result<(), kube::Error> {
        // Namespace sameness: a Service is imported where its namespace exists (created
        // later, the namespace's watch event imports it).
        let namespaces: Vec<String> = self
            .local
            .namespaces
            .state()
            .iter()
            .map(|n| n.name_any())
            .collect();
        let imports: Vec<&DesiredImport> = imports
            .iter()
            .filter(|i| namespaces.contains(&i.namespace))
            .collect();
        // Written several at once; one failing import does not hold up the others.
        let owners: HashMap<(String, String), OwnerReference> = self
            .local
            .imports
            .state()
            .iter()
            .filter_map(|i| {
                let id = (i.namespace().unwrap_or_default(), i.name_any());
                Some((id, i.controller_owner_ref(&())?))
            })
            .collect();
        let writer = Writer {
            client: self.ctx.client.clone(),
            written: &self.written,
            cluster_ips: &self.cluster_ips,
            owners: &owners,
        };
        // Collected first: a closure inside the stream's type would not be `Send` for every
        // lifetime (the loop runs in a spawned task).
        let writes: Vec<_> = imports.iter().map(|import| writer.import(import)).collect();
        let results: Vec<Result<Written, kube::Error>> = futures::stream::iter(writes)
            .buffer_unordered(CONCURRENT_WRITES)
            .collect()
            .await;
        let mut first_error = None;
        for result in results {
            match result {
                Ok(out) => {
                    self.written.extend(out.written);
                    if let Some((id, ips)) = out.cluster_ips {
                        self.cluster_ips.insert(id, ips);
                    }
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        for import in &imports {
            let dropped_key = format!("dropped/{}/{}", import.namespace, import.name);
            let digest = hash(&import.dropped);
            if self.written.insert(dropped_key, digest) != Some(digest) {
                for (cluster, dropped) in &import.dropped {
                    self.metrics.dropped_endpoints.inc_by(*dropped as u64);
                    tracing::warn!(service = %format!("{}/{}", import.namespace, import.name), %cluster, dropped, "services: endpoint addresses outside the exporter's CIDRs were not imported");
                }
            }
        }
        // DNS first: a name stops answering before its objects go, and a failed delete keeps
        // no stale name.
        self.dns.store(Arc::new(self.dns_table(&imports)));
        self.remove_stale(&imports).await?;
        self.metrics.imports.set(imports.len() as i64);
        let endpoints: usize = imports
            .iter()
            .flat_map(|i| &i.slices)
            .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
            .sum();
        self.metrics.imported_endpoints.set(endpoints as i64);
        first_error.map_or(Ok(()), Err)
    }

    /// What DNS answers: every import with its ClusterSetIP and ready endpoints.
    fn dns_table(&self, imports: &[&DesiredImport]) -> DnsTable {
        imports
            .iter()
            .map(|import| {
                let id = (import.namespace.clone(), import.name.clone());
                let ips = self
                    .cluster_ips
                    .get(&id)
                    .into_iter()
                    .flatten()
                    .filter_map(|ip| ip.parse().ok())
                    .collect();
                (id, DnsService::of_import(import, ips))
            })
            .collect()
    }
}

/// What one import's writes need to know, shared by the imports written concurrently.
struct Writer<'a> {
    client: kube::Client,
    /// What was last written (see [`Pass::written`]).
    written: &'a HashMap<String, u64>,
    /// The derived Services' ClusterIPs known so far.
    cluster_ips: &'a HashMap<(String, String), Vec<String>>,
    /// Owner references of the ServiceImports that exist.
    owners: &'a HashMap<(String, String), OwnerReference>,
}

/// What one import's writes changed, merged into the [`Pass`] afterwards.
#[derive(Default)]
struct Written {
    written: Vec<(String, u64)>,
    cluster_ips: Option<((String, String), Vec<String>)>,
}

impl Writer<'_> {
    /// Server-side applies `object` unless it is what was last written; records the write.
    async fn apply<K>(
        &self,
        api: &Api<K>,
        name: &str,
        object: &K,
        out: &mut Written,
    ) -> Result<(), kube::Error>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        out.written
            .extend(apply_changed(api, name, object, self.written).await?);
        Ok(())
    }

    /// One import's ServiceImport, derived Service and EndpointSlices.
    async fn import(&self, import: &DesiredImport) -> Result<Written, kube::Error> {
        let mut out = Written::default();
        let client = &self.client;
        let api: Api<ServiceImport> = Api::namespaced(client.clone(), &import.namespace);
        let derived_name = derived_service_name(&import.name);
        let headless = import.merged.type_ == ServiceImportType::Headless;
        let mut object = ServiceImport::new(
            &import.name,
            ServiceImportSpec {
                ports: import.merged.ports.clone(),
                ips: Vec::new(),
                type_: import.merged.type_,
                // As on the Service: `None` spelled out, its settings only with ClientIP.
                session_affinity: Some(
                    import
                        .merged
                        .session_affinity
                        .clone()
                        .unwrap_or_else(|| "None".to_owned()),
                ),
                session_affinity_config: import.merged.session_affinity_config.clone(),
                ip_families: import.merged.ip_families.clone(),
                internal_traffic_policy: import.merged.internal_traffic_policy.clone(),
                traffic_distribution: import.merged.traffic_distribution.clone(),
            },
        );
        let mut labels = import.labels.clone();
        labels.insert(MANAGED_LABEL.to_owned(), MANAGED_BY.to_owned());
        object.metadata.labels = Some(labels);
        object.metadata.annotations =
            (!import.annotations.is_empty()).then(|| import.annotations.clone());
        let id = (import.namespace.clone(), import.name.clone());
        // The derived Service first (its ClusterIP is the ClusterSetIP); it is owned by the
        // ServiceImport, which is created first when new.
        let owner = match self.owners.get(&id) {
            Some(owner) => owner.clone(),
            None => api
                .patch(
                    &import.name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&object),
                )
                .await?
                .controller_owner_ref(&())
                .expect("a ServiceImport from the API has a uid"),
        };
        let derived = derived_service(import, &derived_name, headless, &owner);
        let derived_key = key::<Service>(&import.namespace, &derived_name);
        let digest = hash(&serde_json::to_string(&derived).unwrap_or_default());
        let mut ips = self.cluster_ips.get(&id).cloned();
        if self.written.get(&derived_key) != Some(&digest) || ips.is_none() {
            let services: Api<Service> = Api::namespaced(client.clone(), &import.namespace);
            let applied = services
                .patch(
                    &derived_name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&derived),
                )
                .await?;
            let assigned: Vec<String> = applied
                .spec
                .and_then(|s| s.cluster_ips.or(s.cluster_ip.map(|ip| vec![ip])))
                .unwrap_or_default()
                .into_iter()
                .filter(|ip| ip != "None")
                .collect();
            out.cluster_ips = Some((id.clone(), assigned.clone()));
            out.written.push((derived_key, digest));
            ips = Some(assigned);
        }
        if !headless {
            object.spec.ips = ips.unwrap_or_default();
        }
        self.apply(&api, &import.name, &object, &mut out).await?;
        let status = ServiceImportStatus {
            clusters: import
                .merged
                .clusters
                .iter()
                .map(|c| ClusterStatus { cluster: c.clone() })
                .collect(),
            conditions: Vec::new(),
        };
        let status_key = format!("ServiceImport/status/{}/{}", import.namespace, import.name);
        let digest = hash(&import.merged.clusters);
        if self.written.get(&status_key) != Some(&digest) {
            runtime::apply_status(&api, &import.name, FIELD_MANAGER, &status).await?;
            out.written.push((status_key, digest));
        }
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &import.namespace);
        for slice in &import.slices {
            let mut slice = slice.clone();
            slice.metadata.owner_references = Some(vec![owner.clone()]);
            let name = slice.name_any();
            self.apply(&slices, &name, &slice, &mut out).await?;
        }
        Ok(out)
    }
}

impl Pass {
    /// What kubetun imported before and no longer should.
    async fn remove_stale(&mut self, imports: &[&DesiredImport]) -> Result<(), kube::Error> {
        let client = self.ctx.client.clone();
        let wanted_slices: HashSet<(String, String)> = imports
            .iter()
            .flat_map(|i| i.slices.iter().map(|s| (i.namespace.clone(), s.name_any())))
            .collect();
        for stale in self.local.imported_slices.state() {
            let id = (stale.namespace().unwrap_or_default(), stale.name_any());
            if !wanted_slices.contains(&id) {
                delete(
                    &Api::<EndpointSlice>::namespaced(client.clone(), &id.0),
                    &id.1,
                )
                .await?;
                self.written.remove(&key::<EndpointSlice>(&id.0, &id.1));
            }
        }
        for stale in self.local.imports.state() {
            let (namespace, name) = (stale.namespace().unwrap_or_default(), stale.name_any());
            if !imports
                .iter()
                .any(|i| i.namespace == namespace && i.name == name)
            {
                // The garbage collector would remove the derived Service with its owner; done
                // here too, so nothing waits for it.
                delete(
                    &Api::<ServiceImport>::namespaced(client.clone(), &namespace),
                    &name,
                )
                .await?;
                delete(
                    &Api::<Service>::namespaced(client.clone(), &namespace),
                    &derived_service_name(&name),
                )
                .await?;
                self.written
                    .retain(|k, _| !k.contains(&format!("/{namespace}/{name}")));
                self.written
                    .remove(&key::<ServiceImport>(&namespace, &name));
            }
        }
        Ok(())
    }
}

/// The derived selector-less Service of an import, owned by its ServiceImport.
fn derived_service(
    import: &DesiredImport,
    name: &str,
    headless: bool,
    owner: &OwnerReference,
) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(import.namespace.clone()),
            labels: Some(BTreeMap::from([
                (DERIVED_FOR_LABEL.to_owned(), import.name.clone()),
                (MANAGED_LABEL.to_owned(), MANAGED_BY.to_owned()),
            ])),
            owner_references: Some(vec![owner.clone()]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            cluster_ip: headless.then(|| "None".to_owned()),
            ports: Some(
                import
                    .merged
                    .ports
                    .iter()
                    .map(|p| KubePort {
                        name: p.name.clone(),
                        protocol: Some(p.protocol.clone()),
                        app_protocol: p.app_protocol.clone(),
                        port: p.port,
                        ..KubePort::default()
                    })
                    .collect(),
            ),
            // Only values every API server accepts reach the derived Service: an exporter's
            // offer (a newer Kubernetes, or a hostile peer) must not make its write fail.
            session_affinity: import
                .merged
                .session_affinity
                .clone()
                .filter(|a| a == "ClientIP"),
            session_affinity_config: import
                .merged
                .session_affinity_config
                .as_ref()
                .filter(|_| import.merged.session_affinity.as_deref() == Some("ClientIP"))
                .map(|c| k8s_openapi::api::core::v1::SessionAffinityConfig {
                    client_ip: c.client_ip.as_ref().map(|ip| {
                        k8s_openapi::api::core::v1::ClientIPConfig {
                            timeout_seconds: ip.timeout_seconds,
                        }
                    }),
                }),
            // The hint reaches kube-proxy; the internal traffic policy does not: remote
            // endpoints are on no node of this cluster, so `Local` would serve nothing.
            traffic_distribution: import
                .merged
                .traffic_distribution
                .clone()
                .filter(|d| d == "PreferClose"),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use kubetun_crds::mcs::{ClientIpConfig, SessionAffinityConfig};

    use super::*;
    use crate::operator::services::merge::Merged;

    fn import(affinity: &str, distribution: &str) -> DesiredImport {
        DesiredImport {
            namespace: "shop".into(),
            name: "web".into(),
            merged: Merged {
                type_: ServiceImportType::ClusterSetIP,
                ports: Vec::new(),
                session_affinity: Some(affinity.into()),
                session_affinity_config: Some(SessionAffinityConfig {
                    client_ip: Some(ClientIpConfig {
                        timeout_seconds: Some(10),
                    }),
                }),
                internal_traffic_policy: Some("Local".into()),
                traffic_distribution: Some(distribution.into()),
                ip_families: vec!["IPv4".into()],
                clusters: vec!["milan".into()],
                serving: vec!["milan".into()],
                conflicts: Vec::new(),
                winner: "milan".into(),
            },
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            slices: Vec::new(),
            dropped: BTreeMap::new(),
        }
    }

    #[test]
    fn the_derived_service_takes_only_what_every_api_server_accepts() {
        let owner = OwnerReference::default();
        let spec = derived_service(&import("ClientIP", "PreferClose"), "mcs-web", false, &owner)
            .spec
            .unwrap();
        assert_eq!(spec.session_affinity.as_deref(), Some("ClientIP"));
        assert_eq!(
            spec.session_affinity_config
                .and_then(|c| c.client_ip?.timeout_seconds),
            Some(10)
        );
        assert_eq!(spec.traffic_distribution.as_deref(), Some("PreferClose"));
        // `Local` would serve nothing: no remote endpoint is on a node here.
        assert_eq!(spec.internal_traffic_policy, None);
        let spec = derived_service(&import("Sticky", "Anywhere"), "mcs-web", false, &owner)
            .spec
            .unwrap();
        assert_eq!(spec.session_affinity, None);
        assert_eq!(spec.session_affinity_config, None);
        assert_eq!(spec.traffic_distribution, None);
    }
}
