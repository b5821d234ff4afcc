//! Pure: what one exported Service lets the clusters it is offered to open
//! ([`ExportEndpoints`], from its offer) and who of them its policies let in ([`PolicyPlan`]).
//! The ground [`super::admission`] and [`super::policy`] both stand on.

use std::cmp::Ordering;

use kubetun_crds::{ExportedEndpointPort, ExportedServiceSpec};

use crate::gateway_api::{AdmittedEndpoint, Protocol};

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
pub(super) fn sort_endpoints(endpoints: &mut Vec<AdmittedEndpoint>) {
    endpoints.sort_by(compare);
    endpoints.dedup_by(|a, b| compare(a, b) == Ordering::Equal);
}

/// What one policy guards: the endpoints of the ports it names, opened only to the pods its
/// selectors match in the clusters they name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicyPlan {
    /// `namespace/name`.
    pub name: String,
    /// The guarded endpoints (the Service's, or those of the named ports).
    pub endpoints: Vec<AdmittedEndpoint>,
    /// The client clusters and the key of the selector each entry asks them about.
    pub from: Vec<(Vec<String>, String)>,
}

impl PolicyPlan {
    /// Whether some entry asks `cluster`.
    pub fn names(&self, cluster: &str) -> bool {
        self.from
            .iter()
            .any(|(clusters, _)| clusters.iter().any(|c| c == cluster))
    }
}
