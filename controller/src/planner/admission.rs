//! Pure: the gateway's admissions, what each linked cluster may open towards this one.
//!
//! One [`Admission`](gateway_api::Admission) per TunnelEndpoint: the cluster's id, the
//! isolation resolved into its spec, the views of its pod and external CIDRs (the views its
//! direct, fallback and hub-only routes carry alike) and, in `exported` mode, the local
//! endpoints of every Service this cluster exports to it ([`ExportEndpoints`]: what one
//! offer lets its consumers open, computed from the offer by [`ExportEndpoints::of_offer`]).

use std::cmp::Ordering;

use std::collections::BTreeMap;

use kubetun_crds::{
    ClientIdentitySpec, ExportedEndpointPort, ExportedServiceSpec, Isolation, TunnelEndpointSpec,
};

use super::policy::{PolicyPlan, PolicyTally, source_policies};
use crate::gateway_api::{self, AdmittedEndpoint, Protocol};

/// What one exported Service lets the clusters it is offered to open: the real addresses of
/// its endpoints with the ports they listen on (an EndpointSlice's target ports: what an
/// importer's kube-proxy sends to after translating the ClusterSetIP, and so what reaches the
/// gateway).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExportEndpoints {
    /// The cluster ids it is offered to; `None`: every linked cluster.
    pub consumers: Option<Vec<String>>,
    /// Its endpoints, sorted and without duplicates.
    pub endpoints: Vec<AdmittedEndpoint>,
    /// Its ExportPolicies (valid ones), sorted by name; empty: open to every pod of the
    /// clusters it is offered to.
    pub policies: Vec<PolicyPlan>,
}

impl ExportEndpoints {
    /// The endpoints of `offer`: every address of every endpoint of its slices (ready or
    /// not: readiness comes and goes, and a connection to a terminating endpoint may still
    /// be served) with every port of its slice. A slice without ports, a port out of range
    /// and a protocol other than TCP, UDP and SCTP admit nothing (fail closed).
    pub fn of_offer(offer: &ExportedServiceSpec) -> Self {
        Self::of_ports(offer, |_| true)
    }

    /// [`ExportEndpoints::of_offer`] for the slice ports `wanted` keeps only.
    pub fn of_ports(
        offer: &ExportedServiceSpec,
        wanted: impl Fn(&ExportedEndpointPort) -> bool,
    ) -> Self {
        let mut endpoints = Vec::new();
        for slice in &offer.slices {
            for port in slice.ports.iter().filter(|port| wanted(port)) {
                let Some(protocol) = protocol(&port.protocol) else {
                    continue;
                };
                let Ok(number) = u32::try_from(port.port) else {
                    continue;
                };
                if !(1..=65_535).contains(&number) {
                    continue;
                }
                for endpoint in &slice.endpoints {
                    for address in &endpoint.addresses {
                        let Ok(address) = address.trim().parse::<std::net::IpAddr>() else {
                            continue;
                        };
                        endpoints.push(AdmittedEndpoint {
                            address: address.to_string(),
                            protocol: protocol as i32,
                            port: number,
                        });
                    }
                }
            }
        }
        sort_endpoints(&mut endpoints);
        Self {
            consumers: offer.consumers.clone(),
            endpoints,
            policies: Vec::new(),
        }
    }

    /// Whether it is offered to `cluster`.
    pub fn offered_to(&self, cluster: &str) -> bool {
        self.consumers
            .as_ref()
            .is_none_or(|consumers| consumers.iter().any(|c| c == cluster))
    }
}

/// The gateway's protocol of an EndpointSlice port's protocol name.
fn protocol(name: &str) -> Option<Protocol> {
    match name {
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        "SCTP" => Some(Protocol::Sctp),
        _ => None,
    }
}

fn compare(a: &AdmittedEndpoint, b: &AdmittedEndpoint) -> Ordering {
    (&a.address, a.protocol, a.port).cmp(&(&b.address, b.protocol, b.port))
}

/// Sorts `endpoints` by address, protocol and port and drops duplicates.
fn sort_endpoints(endpoints: &mut Vec<AdmittedEndpoint>) {
    endpoints.sort_by(compare);
    endpoints.dedup_by(|a, b| compare(a, b) == Ordering::Equal);
}

/// The isolation towards a peer: the link's own setting (what this cluster wrote into its
/// `to-` NetworkConfig), else `cluster_default`.
pub fn link_isolation(own: Option<Isolation>, cluster_default: Isolation) -> Isolation {
    own.unwrap_or(cluster_default)
}

/// The clusters' answers to this cluster's selectors, by cluster id.
pub type Answers = BTreeMap<String, ClientIdentitySpec>;

/// One admission per TunnelEndpoint in `endpoints` (sorted by cluster id by the caller), and
/// per exported cluster and policy naming it what its answer gave.
pub fn admissions(
    endpoints: &[&TunnelEndpointSpec],
    exports: &[ExportEndpoints],
    answers: &Answers,
) -> (Vec<gateway_api::Admission>, Vec<PolicyTally>) {
    let mut tallies = Vec::new();
    let admissions = endpoints
        .iter()
        .map(|te| {
            let mut views: Vec<String> = te
                .remote_pod_cidrs
                .iter()
                .chain(&te.remote_external_cidrs)
                .map(|m| m.view.clone())
                .chain(
                    te.fallback
                        .iter()
                        .flat_map(|f| f.routes.iter().map(|m| m.view.clone())),
                )
                .collect();
            views.sort();
            views.dedup();
            let (isolation, endpoints, policies) = match te.isolation {
                Isolation::Open => (gateway_api::Isolation::Open, Vec::new(), Vec::new()),
                Isolation::Exported => {
                    let offered: Vec<&ExportEndpoints> = exports
                        .iter()
                        .filter(|export| export.offered_to(&te.cluster.id))
                        .collect();
                    let mut admitted: Vec<AdmittedEndpoint> = offered
                        .iter()
                        .flat_map(|export| export.endpoints.iter().cloned())
                        .collect();
                    sort_endpoints(&mut admitted);
                    let mut plans: Vec<&PolicyPlan> =
                        offered.iter().flat_map(|e| e.policies.iter()).collect();
                    plans.sort_by(|a, b| a.name.cmp(&b.name));
                    plans.dedup_by(|a, b| a.name == b.name);
                    let (policies, found) =
                        source_policies(te, &plans, answers.get(&te.cluster.id));
                    tallies.extend(found);
                    (gateway_api::Isolation::Exported, admitted, policies)
                }
            };
            gateway_api::Admission {
                cluster: te.cluster.id.clone(),
                isolation: isolation as i32,
                views,
                endpoints,
                policies,
            }
        })
        .collect();
    (admissions, tallies)
}
