//! Services in a lab without API servers: the exporters' offers and the client's imports are
//! computed by the controller's own pure services core (offer, merge, desired), as the
//! clusters' services loops would compute them, and served as they would be: DNS by the
//! stand-in server from a table file, the ClusterSetIP by the kube-proxy stand-in's rules.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{Namespace, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubetun_controller::operator::services::desired::{AddressViews, Source, desired_imports};
use kubetun_controller::operator::services::dns::{DnsService, DnsTable};
use kubetun_controller::operator::services::offer::{ExportRequest, offer};
use kubetun_controller::planner::admission::Answers;
use kubetun_controller::planner::policy;
use kubetun_controller::planner::{ExportEndpoints, PolicyPlan};
use kubetun_controller::plumbing::exports::Exports;
use kubetun_crds::mcs::ServiceImportType;
use kubetun_crds::{ClientIdentitySpec, ClusterRef, ExportPolicySpec, ExportedServiceSpec};

use super::{objects, proxy, standins};

/// Where the in-process imports' ClusterSetIPs start in the client's service range.
const CLUSTER_IP_OFFSET: u32 = 100;
/// The name of the lab's ExportPolicy (in the demo Service's namespace).
pub(super) const POLICY_NAME: &str = "frontend";
use crate::error::LabError;
use crate::service_demo::ServiceDemo;
use crate::state::ClusterState;

/// What the exporters offer, and where the client's imports are published.
pub(super) struct InProcess {
    /// Offers by exporting cluster ID.
    offers: BTreeMap<String, ExportedServiceSpec>,
    /// The consumers annotation of each exporter's ServiceExport (by cluster ID); absent:
    /// every linked cluster.
    consumers: BTreeMap<String, Vec<String>>,
    /// The ExportPolicy guarding each exporter's Service (by cluster ID).
    policies: BTreeMap<String, ExportPolicySpec>,
    /// The `app` label of each pod (by pod namespace); a pod without one has no labels.
    labels: BTreeMap<String, String>,
    /// The client's service range; the imports' ClusterSetIPs are taken from
    /// [`CLUSTER_IP_OFFSET`] on.
    service_range: Ipv4Net,
    /// The DNS stand-in's table.
    pub(super) table_file: PathBuf,
}

impl InProcess {
    pub(super) fn new(service_range: Ipv4Net, table_file: PathBuf) -> Self {
        Self {
            offers: BTreeMap::new(),
            consumers: BTreeMap::new(),
            policies: BTreeMap::new(),
            labels: BTreeMap::new(),
            service_range,
            table_file,
        }
    }

    /// `exporter` exports the demo Service, with its backend as endpoint or none.
    pub(super) fn export(
        &mut self,
        demo: &ServiceDemo,
        exporter: &ClusterState,
        with_endpoints: bool,
    ) -> Result<(), LabError> {
        let created = self.offers.get(&exporter.id).map_or_else(
            || Time(k8s_openapi::jiff::Timestamp::now()),
            |o| o.export_created.clone(),
        );
        let request = ExportRequest {
            namespace: demo.namespace.clone(),
            name: demo.name.clone(),
            created: Some(created),
            ..ExportRequest::default()
        };
        let slice = objects::backend_slice(demo, objects::backend_address(exporter)?);
        let slices = if with_endpoints { vec![&slice] } else { vec![] };
        let cluster = ClusterRef {
            id: exporter.id.clone(),
            name: exporter.name.clone(),
        };
        let offered = offer(
            &cluster,
            &request,
            Some(&objects::backend_service(demo)),
            &slices,
        )
        .map_err(|invalid| LabError::Internal(invalid.message))?;
        let offered = ExportedServiceSpec {
            consumers: self.consumers.get(&exporter.id).cloned(),
            client_selectors: Vec::new(),
            ..offered
        };
        self.offers.insert(exporter.id.clone(), offered);
        Ok(())
    }

    /// Sets (or with `None` removes) the consumers annotation of `exporter`'s ServiceExport,
    /// as `kubectl annotate` would; its offer follows.
    pub(super) fn set_consumers(
        &mut self,
        exporter: &ClusterState,
        consumers: Option<Vec<String>>,
    ) {
        match consumers {
            Some(consumers) => self.consumers.insert(exporter.id.clone(), consumers),
            None => self.consumers.remove(&exporter.id),
        };
        if let Some(offer) = self.offers.get_mut(&exporter.id) {
            offer.consumers = self.consumers.get(&exporter.id).cloned();
        }
    }

    /// Guards `exporter`'s Service with `policy` (`None`: no policy), as `kubectl apply` of an
    /// ExportPolicy would.
    pub(super) fn set_policy(&mut self, exporter: &ClusterState, policy: Option<ExportPolicySpec>) {
        match policy {
            Some(policy) => self.policies.insert(exporter.id.clone(), policy),
            None => self.policies.remove(&exporter.id),
        };
    }

    /// Sets (`None`: removes) the `app` label of the pod in namespace `pod`.
    pub(super) fn set_label(&mut self, pod: &str, app: Option<&str>) {
        match app {
            Some(app) => self.labels.insert(pod.to_owned(), app.to_owned()),
            None => self.labels.remove(pod),
        };
    }

    /// `exporter`'s offer with its policy's selectors, and the policy's plan.
    fn guarded(&self, exporter: &ClusterState) -> Option<(ExportedServiceSpec, Vec<PolicyPlan>)> {
        let mut offer = self.offers.get(&exporter.id)?.clone();
        let Some(spec) = self.policies.get(&exporter.id) else {
            return Some((offer, Vec::new()));
        };
        let name = format!("{}/{POLICY_NAME}", offer.namespace);
        let plan = match policy::plan(&name, spec, &offer) {
            Ok((plan, selectors)) => {
                offer.client_selectors = selectors;
                plan
            }
            Err(_) => policy::closed(&name, &offer),
        };
        Some((offer, vec![plan]))
    }

    /// What `exporter`'s gateway admits for its offer and the answers of the `clusters` its
    /// policy asks, as the controllers compute them.
    pub(super) fn exports_of(&self, exporter: &ClusterState, clusters: &[ClusterState]) -> Exports {
        let Some((offer, plans)) = self.guarded(exporter) else {
            return Exports::default();
        };
        let mut endpoints = ExportEndpoints::of_offer(&offer);
        endpoints.policies = plans;
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(offer.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_owned(),
                    offer.namespace.clone(),
                )])),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let mut answers = Answers::new();
        for cluster in clusters.iter().filter(|c| c.id != exporter.id) {
            if !offer
                .client_selectors
                .iter()
                .any(|s| s.clusters.contains(&cluster.id))
            {
                continue;
            }
            let pods: Vec<Pod> = cluster
                .pods
                .iter()
                .map(|pod| self.pod(&offer.namespace, &pod.namespace, pod.address))
                .collect();
            let selections = policy::select(
                &cluster.id,
                &offer.client_selectors,
                std::slice::from_ref(&namespace),
                &pods,
            );
            answers.insert(
                cluster.id.clone(),
                ClientIdentitySpec {
                    cluster: cluster.id.clone(),
                    exporter: exporter.id.clone(),
                    selections,
                },
            );
        }
        Exports {
            endpoints: vec![endpoints],
            answers,
        }
    }

    /// The Pod a lab pod namespace stands for, in the Service's namespace, with its label.
    fn pod(&self, namespace: &str, name: &str, address: Ipv4Addr) -> Pod {
        let labels = self
            .labels
            .get(name)
            .map(|app| BTreeMap::from([("app".to_owned(), app.clone())]));
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels,
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some("Running".to_owned()),
                pod_ip: Some(address.to_string()),
                ..PodStatus::default()
            }),
        }
    }

    /// `exporter` no longer exports it.
    pub(super) fn unexport(&mut self, exporter: &ClusterState) {
        self.offers.remove(&exporter.id);
    }

    /// Computes `client`'s imports from every offer of a cluster it is linked to, writes the
    /// DNS table and programs the ClusterSetIPs in the client's node namespace.
    pub(super) fn publish(&self, client: &ClusterState) -> Result<(), LabError> {
        let views: Vec<(&ExportedServiceSpec, AddressViews)> = self
            .offers
            .values()
            .filter(|offer| ExportEndpoints::of_offer(offer).offered_to(&client.id))
            .filter_map(|offer| {
                let te = client
                    .tunnel_endpoints
                    .iter()
                    .find(|te| te.cluster.id == offer.cluster.id)?;
                Some((offer, AddressViews::of_peer(te)))
            })
            .collect();
        let sources: Vec<Source<'_>> = views
            .iter()
            .map(|(offer, views)| Source { offer, views })
            .collect();
        let mut table = DnsTable::new();
        let mut ports = Vec::new();
        for (index, import) in desired_imports(&sources).iter().enumerate() {
            let offset = CLUSTER_IP_OFFSET + index as u32;
            let ip = Ipv4Addr::from(u32::from(self.service_range.network()) + offset);
            if import.merged.type_ == ServiceImportType::ClusterSetIP {
                let specs: Vec<proxy::PortSpec> = import
                    .merged
                    .ports
                    .iter()
                    .map(|p| proxy::PortSpec {
                        name: p.name.clone(),
                        protocol: p.protocol.clone(),
                        port: p.port,
                    })
                    .collect();
                let slices: Vec<_> = import.slices.iter().collect();
                ports.extend(proxy::proxied(ip, &specs, &slices));
            }
            let id = (import.namespace.clone(), import.name.clone());
            table.insert(id, DnsService::of_import(import, vec![IpAddr::V4(ip)]));
        }
        standins::write_dns_table(&self.table_file, &table)?;
        let rules = proxy::ruleset(&ports, self.service_range);
        proxy::apply(&client.namespace, &rules).map_err(LabError::Host)
    }
}
