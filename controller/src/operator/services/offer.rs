//! Pure: what the exporting cluster offers of one exported Service (its [`ExportedServiceSpec`]),
//! read from the ServiceExport, the Service and its EndpointSlices, or why it offers nothing
//! (the `Valid=False` reason and message: no Service, ExternalName, too many endpoints for
//! one object, or an invalid consumers annotation).
//!
//! Consumers: the ServiceExport's [`CONSUMERS_ANNOTATION`] (the MCS API's ServiceExport has
//! no field for it) names the clusters that may import the Service; the offer carries them
//! ([`consumers`]), an importer not named imports nothing of it ([`offered_to`]), and the
//! exporter's gateway admits none of its packets to these endpoints. The offer object itself
//! stays readable to every linked cluster: the read credential covers all ExportedServices
//! of the namespace, so a cluster not named can still read the endpoint addresses. It cannot
//! reach them: the exporter's gateway is what enforces the list.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubetun_crds::contract::services::CONSUMERS_ANNOTATION;
use kubetun_crds::mcs::{ClientIpConfig, ServiceImportType, ServicePort, SessionAffinityConfig};
use kubetun_crds::{
    ClusterRef, ExportedEndpoint, ExportedEndpointPort, ExportedServiceSpec, ExportedSlice,
};

/// Why an export offers nothing (`Valid=False`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// `NoService` or `InvalidServiceType`.
    pub reason: &'static str,
    /// In words.
    pub message: String,
}

/// The largest offer (its JSON): well inside etcd's 1.5 MiB per object, with room for the
/// object's metadata.
pub const MAX_OFFER_BYTES: usize = 1024 * 1024;
/// The most slices an offer carries (the ExportedService schema's limit).
pub const MAX_OFFER_SLICES: usize = 1000;

/// The ServiceExport's facts the offer needs.
#[derive(Debug, Clone, Default)]
pub struct ExportRequest {
    /// Namespace and name (the Service's too).
    pub namespace: String,
    /// See `namespace`.
    pub name: String,
    /// The ServiceExport's creation time.
    pub created: Option<Time>,
    /// `spec.exportedLabels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.exportedAnnotations`.
    pub annotations: BTreeMap<String, String>,
    /// The value of the ServiceExport's [`CONSUMERS_ANNOTATION`], if it has one.
    pub consumers: Option<String>,
}

/// The reason of an invalid consumers annotation.
pub const INVALID_CONSUMERS: &str = "InvalidConsumers";

/// The cluster ids of a [`CONSUMERS_ANNOTATION`] value: trimmed, deduplicated and sorted.
/// An empty entry or one that is not a DNS-1123 label (what a cluster id is) makes the whole
/// list invalid, so that a typo offers the Service to nobody rather than to everybody.
pub fn consumers(value: &str) -> Result<Vec<String>, Invalid> {
    let invalid = |why: String| Invalid {
        reason: INVALID_CONSUMERS,
        message: format!(
            "annotation {CONSUMERS_ANNOTATION}={value:?}: {why}; expected comma-separated \
             cluster ids (e.g. \"rome,paris\"); the Service is offered to nobody until it is \
             fixed"
        ),
    };
    let mut ids = Vec::new();
    for entry in value.split(',') {
        let id = entry.trim();
        if id.is_empty() {
            return Err(invalid("an entry is empty".to_owned()));
        }
        if !is_dns_label(id) {
            return Err(invalid(format!(
                "{id:?} is not a cluster id (a DNS-1123 label: at most 63 lowercase letters, \
                 digits and '-', starting and ending with a letter or digit)"
            )));
        }
        ids.push(id.to_owned());
    }
    ids.sort();
    ids.dedup();
    Ok(ids)
}

fn is_dns_label(id: &str) -> bool {
    let bytes = id.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (1..=63).contains(&bytes.len())
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes.iter().all(|b| alnum(b) || *b == b'-')
}

/// Whether `offer` may be imported by `cluster` (no consumers: by every linked cluster).
pub fn offered_to(offer: &ExportedServiceSpec, cluster: &str) -> bool {
    offer
        .consumers
        .as_ref()
        .is_none_or(|consumers| consumers.iter().any(|c| c == cluster))
}

/// The offer of `request` from `cluster`, given the Service (if any) and its EndpointSlices
/// (those labelled `kubernetes.io/service-name` with its name, in any order).
pub fn offer(
    cluster: &ClusterRef,
    request: &ExportRequest,
    service: Option<&Service>,
    slices: &[&EndpointSlice],
) -> Result<ExportedServiceSpec, Invalid> {
    let consumers = request.consumers.as_deref().map(consumers).transpose()?;
    let Some(service) = service else {
        return Err(Invalid {
            reason: "NoService",
            message: format!(
                "Service {}/{} does not exist: create it, or delete the ServiceExport",
                request.namespace, request.name
            ),
        });
    };
    let spec = service.spec.clone().unwrap_or_default();
    let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
    if kind == "ExternalName" {
        return Err(Invalid {
            reason: "InvalidServiceType",
            message: format!(
                "Service {}/{} is of type ExternalName, which cannot be exported (it has no \
                 endpoints to reach)",
                request.namespace, request.name
            ),
        });
    }
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let ports = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| ServicePort {
            name: p.name.filter(|n| !n.is_empty()),
            protocol: p.protocol.unwrap_or_else(|| "TCP".to_owned()),
            app_protocol: p.app_protocol,
            port: p.port,
        })
        .collect();
    let session_affinity_config = spec
        .session_affinity_config
        .and_then(|c| c.client_ip)
        .map(|c| SessionAffinityConfig {
            client_ip: Some(ClientIpConfig {
                timeout_seconds: c.timeout_seconds,
            }),
        });
    let mut exported_slices: Vec<ExportedSlice> = slices.iter().map(|s| exported(s)).collect();
    exported_slices.retain(|s| !s.endpoints.is_empty());
    // Stable order, so that an unchanged Service gives an unchanged offer.
    exported_slices.sort_by(|a, b| {
        (&a.address_type, &a.ports, &a.endpoints[0].addresses).cmp(&(
            &b.address_type,
            &b.ports,
            &b.endpoints[0].addresses,
        ))
    });
    let endpoints: usize = exported_slices.iter().map(|s| s.endpoints.len()).sum();
    let offered = ExportedServiceSpec {
        cluster: cluster.clone(),
        namespace: request.namespace.clone(),
        name: request.name.clone(),
        export_created: request.created.clone().unwrap_or(Time(Default::default())),
        type_: if headless {
            ServiceImportType::Headless
        } else {
            ServiceImportType::ClusterSetIP
        },
        ports,
        session_affinity: spec.session_affinity.filter(|a| a != "None"),
        session_affinity_config,
        ip_families: spec.ip_families.unwrap_or_default(),
        internal_traffic_policy: spec.internal_traffic_policy,
        traffic_distribution: spec.traffic_distribution,
        labels: request.labels.clone(),
        annotations: request.annotations.clone(),
        slices: exported_slices,
        consumers,
        client_selectors: Vec::new(),
    };
    // The offer is one object: past etcd's object size it could not be written at all.
    let size = serde_json::to_vec(&offered).map_or(usize::MAX, |json| json.len());
    if size > MAX_OFFER_BYTES || offered.slices.len() > MAX_OFFER_SLICES {
        return Err(Invalid {
            reason: "TooManyEndpoints",
            message: format!(
                "Service {}/{} has {endpoints} endpoints in {} EndpointSlices, an offer of {} KiB; \
                 kubetun exports at most {} KiB ({MAX_OFFER_SLICES} slices) per Service, several \
                 thousand endpoints: split the Service, or export a smaller one in front of it",
                request.namespace,
                request.name,
                offered.slices.len(),
                size / 1024,
                MAX_OFFER_BYTES / 1024
            ),
        });
    }
    Ok(offered)
}

/// One EndpointSlice as offered: addresses, conditions and hostnames only (no node names,
/// zones or pod references leave the cluster).
fn exported(slice: &EndpointSlice) -> ExportedSlice {
    let mut ports: Vec<ExportedEndpointPort> = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some(ExportedEndpointPort {
                name: p.name.clone().filter(|n| !n.is_empty()),
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                port: p.port?,
                app_protocol: p.app_protocol.clone(),
            })
        })
        .collect();
    ports.sort();
    let mut endpoints: Vec<ExportedEndpoint> = slice
        .endpoints
        .iter()
        .flatten()
        .filter(|e| !e.addresses.is_empty())
        .map(|e| {
            let conditions = e.conditions.clone().unwrap_or_default();
            // EndpointSlice semantics: an absent `ready` means ready, `serving` follows it.
            let ready = conditions.ready.unwrap_or(true);
            ExportedEndpoint {
                addresses: e.addresses.clone(),
                ready,
                serving: conditions.serving.unwrap_or(ready),
                terminating: conditions.terminating.unwrap_or(false),
                hostname: e.hostname.clone(),
            }
        })
        .collect();
    endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
    ExportedSlice {
        address_type: slice.address_type.clone(),
        ports,
        endpoints,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ServicePort as KubePort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    use super::*;

    fn service() -> Service {
        Service {
            spec: Some(ServiceSpec {
                ports: Some(vec![KubePort {
                    name: Some("http".into()),
                    port: 80,
                    ..KubePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        }
    }

    /// A slice of `count` endpoints from `10.<first>.x.y` on, all but the first ready.
    fn slice(first: u8, count: usize) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: Some(8080),
                ..EndpointPort::default()
            }]),
            endpoints: Some(
                (0..count)
                    .map(|i| Endpoint {
                        addresses: vec![format!("10.{first}.{}.{}", i / 250, i % 250 + 1)],
                        conditions: Some(EndpointConditions {
                            ready: Some(i != 0),
                            ..EndpointConditions::default()
                        }),
                        hostname: Some(format!("pod-{first}-{i}")),
                        ..Endpoint::default()
                    })
                    .collect(),
            ),
            ..EndpointSlice::default()
        }
    }

    fn request() -> ExportRequest {
        ExportRequest {
            namespace: "shop".into(),
            name: "web".into(),
            ..ExportRequest::default()
        }
    }

    fn cluster() -> ClusterRef {
        ClusterRef {
            id: "milan".into(),
            name: "Milan".into(),
        }
    }

    #[test]
    fn an_offer_carries_ports_and_endpoints_without_pod_details() {
        let slices = [slice(1, 3), slice(2, 0)];
        let refs: Vec<&EndpointSlice> = slices.iter().collect();
        let offered = offer(&cluster(), &request(), Some(&service()), &refs).expect("valid");
        assert_eq!(offered.type_, ServiceImportType::ClusterSetIP);
        assert_eq!(offered.ports[0].protocol, "TCP");
        assert_eq!(offered.slices.len(), 1, "the empty slice is left out");
        let endpoints = &offered.slices[0].endpoints;
        assert_eq!(endpoints.len(), 3);
        assert!(!endpoints[0].ready && !endpoints[0].serving);
        assert!(endpoints[1].ready && endpoints[1].serving);
        assert_eq!(offered.slices[0].ports[0].port, 8080);
    }

    #[test]
    fn consumers_are_trimmed_deduplicated_and_sorted_and_offered_to_them_only() {
        let named = ExportRequest {
            consumers: Some(" rome, paris,rome ".into()),
            ..request()
        };
        let offered = offer(&cluster(), &named, Some(&service()), &[]).expect("valid");
        assert_eq!(
            offered.consumers,
            Some(vec!["paris".to_owned(), "rome".to_owned()])
        );
        assert!(offered_to(&offered, "rome"));
        assert!(!offered_to(&offered, "milan"));
        // No annotation: every linked cluster.
        let everyone = offer(&cluster(), &request(), Some(&service()), &[]).expect("valid");
        assert_eq!(everyone.consumers, None);
        assert!(offered_to(&everyone, "milan"));
    }

    #[test]
    fn invalid_consumers_offer_nothing_and_say_why() {
        for (value, part) in [
            ("rome,,paris", "an entry is empty"),
            ("", "an entry is empty"),
            ("Rome", "\"Rome\" is not a cluster id"),
            ("rome,-paris", "\"-paris\" is not a cluster id"),
            ("rome;paris", "\"rome;paris\" is not a cluster id"),
        ] {
            let request = ExportRequest {
                consumers: Some(value.into()),
                ..request()
            };
            let invalid = offer(&cluster(), &request, Some(&service()), &[]).unwrap_err();
            assert_eq!(invalid.reason, INVALID_CONSUMERS, "{value:?}");
            assert!(
                invalid.message.contains(part),
                "{value:?}: {}",
                invalid.message
            );
            assert!(
                invalid.message.contains("net.kubetun.io/consumers"),
                "{}",
                invalid.message
            );
        }
        assert!(consumers(&"a".repeat(64)).is_err());
        assert_eq!(consumers(&"a".repeat(63)).unwrap().len(), 1);
    }

    #[test]
    fn a_service_too_big_for_one_object_is_invalid_and_says_why() {
        // 20 slices of 1000 endpoints (what the EndpointSlice controller makes of 20 000 pods
        // at its largest slices).
        let slices: Vec<EndpointSlice> = (0..20).map(|i| slice(i, 1000)).collect();
        let refs: Vec<&EndpointSlice> = slices.iter().collect();
        let invalid = offer(&cluster(), &request(), Some(&service()), &refs).unwrap_err();
        assert_eq!(invalid.reason, "TooManyEndpoints");
        assert!(
            invalid
                .message
                .contains("shop/web has 20000 endpoints in 20"),
            "{}",
            invalid.message
        );
        // 4000 endpoints fit.
        let refs: Vec<&EndpointSlice> = slices.iter().take(4).collect();
        assert!(offer(&cluster(), &request(), Some(&service()), &refs).is_ok());
    }
}
