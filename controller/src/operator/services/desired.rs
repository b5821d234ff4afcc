//! Pure: what an importing cluster should hold for the Services its linked clusters (and it)
//! export: per Service a ServiceImport, a derived selector-less Service whose ClusterIP is the
//! ClusterSetIP (kube-proxy load-balances it), and EndpointSlices in *this* cluster's views of
//! each exporter's addresses. An address outside the exporter's announced CIDRs has no view
//! here and is dropped: a cluster can offer endpoints only inside its own network.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubetun_crds::contract::services::{
    KUBE_SERVICE_NAME_LABEL, MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL, SOURCE_CLUSTER_LABEL,
};
use kubetun_crds::{CidrMapping, ExportedServiceSpec, TunnelEndpointSpec};

use super::merge::{Merged, merge};

/// How this cluster sees one exporter's addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressViews {
    /// `None`: this cluster itself (addresses as they are).
    routes: Option<Vec<(IpNet, IpNet)>>,
}

impl AddressViews {
    /// This cluster's own addresses.
    pub fn local() -> Self {
        Self { routes: None }
    }

    /// A linked cluster, through its TunnelEndpoint here: its pod and external CIDRs (real)
    /// and this cluster's views of them, whatever path carries them (direct, shortcut, hub).
    pub fn of_peer(te: &TunnelEndpointSpec) -> Self {
        let parse = |m: &CidrMapping| Some((m.real.parse().ok()?, m.view.parse().ok()?));
        let routes = te
            .remote_pod_cidrs
            .iter()
            .chain(&te.remote_external_cidrs)
            .filter_map(parse)
            .collect();
        Self {
            routes: Some(routes),
        }
    }

    /// This cluster's view of `address`, `None` when it lies outside every CIDR the exporter
    /// announced (longest real prefix wins).
    pub fn view(&self, address: IpAddr) -> Option<IpAddr> {
        let Some(routes) = &self.routes else {
            return Some(address);
        };
        let (real, view) = routes
            .iter()
            .filter(|(real, _)| real.contains(&address))
            .max_by_key(|(real, _)| real.prefix_len())?;
        Some(match (address, real.network(), view.network()) {
            (IpAddr::V4(a), IpAddr::V4(r), IpAddr::V4(v)) => IpAddr::from(
                std::net::Ipv4Addr::from((u32::from(a) - u32::from(r)) | u32::from(v)),
            ),
            (IpAddr::V6(a), IpAddr::V6(r), IpAddr::V6(v)) => IpAddr::from(
                std::net::Ipv6Addr::from((u128::from(a) - u128::from(r)) | u128::from(v)),
            ),
            _ => return None,
        })
    }
}

/// One exporter's offer and how this cluster sees its addresses.
#[derive(Debug, Clone)]
pub struct Source<'a> {
    /// The offer.
    pub offer: &'a ExportedServiceSpec,
    /// The views of the exporter's addresses here.
    pub views: &'a AddressViews,
}

/// Everything this cluster should hold for one imported Service.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredImport {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's (and the ServiceImport's) name.
    pub name: String,
    /// The merge of the offers.
    pub merged: Merged,
    /// The ServiceExport labels and annotations of the oldest export.
    pub labels: BTreeMap<String, String>,
    /// See `labels`.
    pub annotations: BTreeMap<String, String>,
    /// The EndpointSlices, named and labelled (owner references are added by the writer).
    pub slices: Vec<EndpointSlice>,
    /// Addresses dropped because they lie outside their exporter's CIDRs, per cluster.
    pub dropped: BTreeMap<String, usize>,
}

/// The derived Service's name: `mcs-<name>` hashed down to 63 characters when longer.
pub fn derived_service_name(name: &str) -> String {
    let full = format!("mcs-{name}");
    if full.len() <= 63 {
        return full;
    }
    format!("{}-{:08x}", full[..54].trim_end_matches('-'), fnv(name))
}

/// Imports of every Service in `sources` (grouped by namespace and name).
pub fn desired_imports(sources: &[Source<'_>]) -> Vec<DesiredImport> {
    let mut by_service: BTreeMap<(&str, &str), Vec<&Source<'_>>> = BTreeMap::new();
    for source in sources {
        by_service
            .entry((&source.offer.namespace, &source.offer.name))
            .or_default()
            .push(source);
    }
    by_service
        .into_iter()
        .filter_map(|((namespace, name), sources)| {
            let offers: Vec<&ExportedServiceSpec> = sources.iter().map(|s| s.offer).collect();
            let merged = merge(&offers)?;
            let winner = offers
                .iter()
                .find(|o| o.cluster.id == merged.winner)
                .copied()?;
            let mut import = DesiredImport {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                labels: winner.labels.clone(),
                annotations: winner.annotations.clone(),
                merged,
                slices: Vec::new(),
                dropped: BTreeMap::new(),
            };
            for source in sources {
                if import.merged.serving.contains(&source.offer.cluster.id) {
                    add_slices(&mut import, source);
                }
            }
            Some(import)
        })
        .collect()
}

/// The exporter's slices in this cluster's views, named `<derived>-<cluster>-<n>`. A slice
/// keeps only the ports this exporter's Service defines as the import does: a port that lost
/// a conflict (same name, another number or protocol) is served by the clusters that define
/// it as imported, never by the one whose endpoints listen for something else (the MCS
/// conformance suite's `StrictPortConflict`).
fn add_slices(import: &mut DesiredImport, source: &Source<'_>) {
    let cluster = &source.offer.cluster.id;
    let derived = derived_service_name(&import.name);
    let agreeing: Vec<&Option<String>> = source
        .offer
        .ports
        .iter()
        .filter(|p| import.merged.ports.contains(p))
        .map(|p| &p.name)
        .collect();
    for (index, slice) in source.offer.slices.iter().enumerate() {
        let mut dropped = 0;
        let endpoints: Vec<Endpoint> = slice
            .endpoints
            .iter()
            .filter_map(|e| {
                let addresses: Vec<String> = e
                    .addresses
                    .iter()
                    .filter_map(|a| {
                        let view = a.parse().ok().and_then(|a| source.views.view(a));
                        dropped += usize::from(view.is_none());
                        view.map(|v| v.to_string())
                    })
                    .collect();
                (!addresses.is_empty()).then(|| Endpoint {
                    addresses,
                    conditions: Some(EndpointConditions {
                        ready: Some(e.ready),
                        serving: Some(e.serving),
                        terminating: Some(e.terminating),
                    }),
                    // The name DNS gives the endpoint comes from its address in its own
                    // cluster, so it is the same in every cluster whatever its view here.
                    hostname: e
                        .hostname
                        .clone()
                        .or_else(|| e.addresses.first().and_then(|a| dashed(a))),
                    ..Endpoint::default()
                })
            })
            .collect();
        if dropped > 0 {
            *import.dropped.entry(cluster.clone()).or_default() += dropped;
        }
        let name = slice_name(&derived, cluster, index);
        import.slices.push(EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(import.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (SERVICE_NAME_LABEL.to_owned(), import.name.clone()),
                    (SOURCE_CLUSTER_LABEL.to_owned(), cluster.clone()),
                    (KUBE_SERVICE_NAME_LABEL.to_owned(), derived.clone()),
                    (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            address_type: slice.address_type.clone(),
            endpoints: Some(endpoints),
            ports: Some(
                slice
                    .ports
                    .iter()
                    .filter(|p| agreeing.contains(&&p.name))
                    .map(|p| EndpointPort {
                        name: p.name.clone(),
                        protocol: Some(p.protocol.clone()),
                        port: Some(p.port),
                        app_protocol: p.app_protocol.clone(),
                    })
                    .collect(),
            ),
        });
    }
}

/// `10-244-1-5` for `10.244.1.5` (an IPv6 address likewise), when that is a DNS label.
fn dashed(address: &str) -> Option<String> {
    let address: IpAddr = address.parse().ok()?;
    let label = endpoint_hostname(None, address);
    (label.len() <= 63 && !label.starts_with('-') && !label.ends_with('-')).then_some(label)
}

/// `<derived>-<cluster>-<n>`, hashed down to 253 characters (a cluster id has at most 63).
fn slice_name(derived: &str, cluster: &str, index: usize) -> String {
    let name = format!("{derived}-{cluster}-{index}");
    if name.len() <= 253 {
        name
    } else {
        format!("{}-{:08x}", &name[..240], fnv(&name))
    }
}

/// A short stable hash for names (FNV-1a, 32 bits).
fn fnv(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// The hostname DNS gives an endpoint: its own, else its address with dashes.
pub fn endpoint_hostname(hostname: Option<&str>, address: IpAddr) -> String {
    match hostname {
        Some(h) if !h.is_empty() => h.to_ascii_lowercase(),
        _ => address.to_string().replace(['.', ':'], "-"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kubetun_crds::mcs::{ServiceImportType, ServicePort};
    use kubetun_crds::{ClusterRef, ExportedEndpoint, ExportedEndpointPort, ExportedSlice};

    use super::*;

    fn offer(cluster: &str, second: i64, ports: &[(&str, i32)]) -> ExportedServiceSpec {
        ExportedServiceSpec {
            cluster: ClusterRef {
                id: cluster.into(),
                name: cluster.into(),
            },
            namespace: "shop".into(),
            name: "web".into(),
            export_created: Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap()),
            type_: ServiceImportType::ClusterSetIP,
            ports: ports
                .iter()
                .map(|(name, port)| ServicePort {
                    name: Some((*name).into()),
                    protocol: "TCP".into(),
                    app_protocol: None,
                    port: *port,
                })
                .collect(),
            session_affinity: None,
            session_affinity_config: None,
            ip_families: vec!["IPv4".into()],
            internal_traffic_policy: None,
            traffic_distribution: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            // Every endpoint listens on 42, whatever the Service's port is.
            slices: vec![ExportedSlice {
                address_type: "IPv4".into(),
                ports: ports
                    .iter()
                    .map(|(name, _)| ExportedEndpointPort {
                        name: Some((*name).into()),
                        protocol: "TCP".into(),
                        port: 42,
                        app_protocol: None,
                    })
                    .collect(),
                endpoints: vec![ExportedEndpoint {
                    addresses: vec![format!("10.0.0.{second}")],
                    ready: true,
                    serving: true,
                    ..ExportedEndpoint::default()
                }],
            }],
            consumers: None,
            client_selectors: Vec::new(),
        }
    }

    fn slice_ports(import: &DesiredImport, cluster: &str) -> Vec<String> {
        import
            .slices
            .iter()
            .filter(|s| s.metadata.labels.as_ref().unwrap()[SOURCE_CLUSTER_LABEL] == cluster)
            .flat_map(|s| s.ports.iter().flatten())
            .filter_map(|p| p.name.clone())
            .collect()
    }

    #[test]
    fn a_port_that_lost_its_conflict_is_served_only_by_the_clusters_that_define_it_so() {
        let local = AddressViews::local();
        // milan (older) exposes tcp as 42, rome as 4242, both with endpoints listening on 42.
        let milan = offer("milan", 1, &[("tcp", 42)]);
        let rome = offer("rome", 2, &[("tcp", 4242), ("metrics", 9090)]);
        let sources = [
            Source {
                offer: &milan,
                views: &local,
            },
            Source {
                offer: &rome,
                views: &local,
            },
        ];
        let imports = desired_imports(&sources);
        let import = &imports[0];
        assert_eq!(slice_ports(import, "milan"), ["tcp"]);
        let endpoint = &import.slices[0].endpoints.as_ref().unwrap()[0];
        assert_eq!(endpoint.hostname.as_deref(), Some("10-0-0-1"));
        assert_eq!(
            slice_ports(import, "rome"),
            ["metrics"],
            "rome's endpoints must not serve tcp 42, which it does not expose"
        );
    }
}
