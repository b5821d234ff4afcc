//! Pure: what the exporting cluster offers of one exported Service (its [`ExportedServiceSpec`]),
//! read from the ServiceExport, the Service and its EndpointSlices, or why it offers nothing
//! (the `Valid=False` reason and message).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
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
}

/// The offer of `request` from `cluster`, given the Service (if any) and its EndpointSlices
/// (those labelled `kubernetes.io/service-name` with its name, in any order).
pub fn offer(
    cluster: &ClusterRef,
    request: &ExportRequest,
    service: Option<&Service>,
    slices: &[&EndpointSlice],
) -> Result<ExportedServiceSpec, Invalid> {
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
    Ok(ExportedServiceSpec {
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
        labels: request.labels.clone(),
        annotations: request.annotations.clone(),
        slices: exported_slices,
    })
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
