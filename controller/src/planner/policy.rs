//! Pure: ExportPolicies, from the exporter's spec to the sources its gateway admits.
//!
//! - Exporter, per policy of an exported Service: [`plan`] checks it against the Service's
//!   offer and gives what the gateway guards ([`PolicyPlan`]: the endpoints of the ports it
//!   names) and the selectors the offer asks the client clusters about
//!   ([`ClientSelector`], keyed by a digest of the two label selectors).
//! - Client, per exporter: [`select`] answers the selectors naming this cluster with the
//!   addresses of its matching pods (running or pending with an address, not terminating,
//!   not on the host network), and nothing else about them.
//! - Exporter, per linked cluster: [`source_policies`] maps that cluster's answer into this
//!   cluster's views of its pod CIDRs, drops and counts an
//!   address outside the CIDRs it announced, and gives the gateway one
//!   [`SourcePolicy`](gateway_api::SourcePolicy) per policy of the Services exported to it.
//!   A policy that does not name the cluster, or whose answer is missing, guards its
//!   endpoints with no source: policies admit only what they select.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt as _;
use kube::core::{Selector, SelectorExt as _};
use kubetun_crds::{
    ClientIdentitySpec, ClientSelector, ExportPolicySpec, ExportedServiceSpec, IdentitySelection,
    TunnelEndpointSpec,
};

use super::digest::fnv1a64;
use super::endpoints::{ExportEndpoints, PolicyPlan};
use crate::gateway_api;

/// The key of a pair of selectors: a digest of their JSON (stable across releases).
pub fn selector_key(
    namespace_selector: Option<&LabelSelector>,
    pod_selector: Option<&LabelSelector>,
) -> String {
    let json = serde_json::to_vec(&(namespace_selector, pod_selector)).unwrap_or_default();
    format!("{:016x}", fnv1a64(&json))
}

/// The plan of policy `name` (`namespace/name`) of the Service `offer` exports, and the
/// selectors it adds to the offer; a readable error for a port the Service does not have
/// or a selector that cannot be parsed.
pub fn plan(
    name: &str,
    spec: &ExportPolicySpec,
    offer: &ExportedServiceSpec,
) -> Result<(PolicyPlan, Vec<ClientSelector>), String> {
    let mut port_names = BTreeSet::new();
    for port in &spec.ports {
        let matching: Vec<_> = offer.ports.iter().filter(|p| p.port == *port).collect();
        if matching.is_empty() {
            let known: Vec<String> = offer.ports.iter().map(|p| p.port.to_string()).collect();
            return Err(format!(
                "port {port} is not a port of Service {} (its ports: {})",
                offer.name,
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ));
        }
        port_names.extend(matching.into_iter().map(|p| p.name.clone()));
    }
    let endpoints = if spec.ports.is_empty() {
        ExportEndpoints::of_offer(offer).endpoints
    } else {
        ExportEndpoints::of_ports(offer, |port| port_names.contains(&port.name)).endpoints
    };
    let mut selectors = Vec::new();
    let mut from = Vec::new();
    for (index, peer) in spec.from.iter().enumerate() {
        for (what, selector) in [
            ("namespaceSelector", &peer.namespace_selector),
            ("podSelector", &peer.pod_selector),
        ] {
            if let Some(selector) = selector {
                Selector::try_from(selector.clone())
                    .map_err(|e| format!("from[{index}].{what}: {e}"))?;
            }
        }
        let key = selector_key(peer.namespace_selector.as_ref(), peer.pod_selector.as_ref());
        from.push((peer.clusters.clone(), key.clone()));
        selectors.push(ClientSelector {
            key,
            clusters: peer.clusters.clone(),
            namespace_selector: peer.namespace_selector.clone(),
            pod_selector: peer.pod_selector.clone(),
        });
    }
    let plan = PolicyPlan {
        name: name.to_owned(),
        endpoints,
        from,
    };
    Ok((plan, selectors))
}

/// What an invalid policy `name` of `offer`'s Service guards: every endpoint, with no
/// source (it fails closed).
pub fn closed(name: &str, offer: &ExportedServiceSpec) -> PolicyPlan {
    PolicyPlan {
        name: name.to_owned(),
        endpoints: ExportEndpoints::of_offer(offer).endpoints,
        from: Vec::new(),
    }
}

/// The answer of cluster `own` to the selectors `asked` (every selector of one exporter's
/// offers): per selector naming `own`, the sorted addresses of its matching pods. Selectors
/// that cannot be parsed match nothing.
pub fn select(
    own: &str,
    asked: &[ClientSelector],
    namespaces: &[Namespace],
    pods: &[Pod],
) -> Vec<IdentitySelection> {
    let labels_of: BTreeMap<String, BTreeMap<String, String>> = namespaces
        .iter()
        .map(|ns| (ns.name_any(), ns.labels().clone()))
        .collect();
    let mut answers: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    for selector in asked.iter().filter(|s| s.clusters.iter().any(|c| c == own)) {
        let addresses = answers.entry(selector.key.clone()).or_default();
        let (Some(namespace_selector), Some(pod_selector)) = (
            parse(selector.namespace_selector.as_ref()),
            parse(selector.pod_selector.as_ref()),
        ) else {
            continue;
        };
        for pod in pods.iter().filter(|pod| selectable(pod)) {
            let namespace = pod.namespace().unwrap_or_default();
            let Some(namespace_labels) = labels_of.get(&namespace) else {
                continue;
            };
            if namespace_selector.matches(namespace_labels) && pod_selector.matches(pod.labels()) {
                addresses.extend(pod_addresses(pod));
            }
        }
    }
    answers
        .into_iter()
        .map(|(key, addresses)| IdentitySelection {
            key,
            addresses: addresses.iter().map(IpAddr::to_string).collect(),
        })
        .collect()
}

/// A selector, absent meaning every object; `None` if it cannot be parsed.
fn parse(selector: Option<&LabelSelector>) -> Option<Selector> {
    match selector {
        None => Some(Selector::default()),
        Some(selector) => Selector::try_from(selector.clone()).ok(),
    }
}

/// Whether a pod's addresses identify it: not terminating, not finished, not on the host's
/// network (its address would be the node's).
fn selectable(pod: &Pod) -> bool {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.host_network)
        .unwrap_or(false);
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none()
        && !host_network
        && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// A pod's addresses (`podIPs`, else `podIP`).
fn pod_addresses(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let listed = status.pod_ips.iter().flatten().map(|ip| ip.ip.as_str());
    let addresses: Vec<IpAddr> = listed
        .chain(status.pod_ip.as_deref())
        .filter_map(|ip| ip.trim().parse().ok())
        .collect();
    let mut addresses = addresses;
    addresses.sort();
    addresses.dedup();
    addresses
}

/// What [`source_policies`] found of one policy in one cluster's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyTally {
    /// `namespace/name`.
    pub policy: String,
    /// The cluster.
    pub cluster: String,
    /// Addresses selected (before mapping into views).
    pub selected: u32,
    /// Addresses outside the cluster's announced CIDRs, dropped.
    pub rejected: u32,
    /// Whether the policy names the cluster but its answer has no selection for it yet.
    pub unanswered: bool,
}

/// The source policies of the cluster of `te` for `plans` (every policy of the Services
/// exported to it), from its `answer`; and per policy naming it, what was found.
pub fn source_policies(
    te: &TunnelEndpointSpec,
    plans: &[&PolicyPlan],
    answer: Option<&ClientIdentitySpec>,
) -> (Vec<gateway_api::SourcePolicy>, Vec<PolicyTally>) {
    let cluster = te.cluster.id.as_str();
    let routes = routes_of(te);
    let selections: BTreeMap<&str, &IdentitySelection> = answer
        .filter(|a| a.cluster == cluster)
        .map(|a| a.selections.iter().map(|s| (s.key.as_str(), s)).collect())
        .unwrap_or_default();
    let mut policies = Vec::with_capacity(plans.len());
    let mut tallies = Vec::new();
    for plan in plans {
        let mut sources = BTreeSet::new();
        let mut tally = PolicyTally {
            policy: plan.name.clone(),
            cluster: cluster.to_owned(),
            ..PolicyTally::default()
        };
        let keys: BTreeSet<&str> = plan
            .from
            .iter()
            .filter(|(clusters, _)| clusters.iter().any(|c| c == cluster))
            .map(|(_, key)| key.as_str())
            .collect();
        let mut seen = BTreeSet::new();
        for key in &keys {
            let Some(selection) = selections.get(key) else {
                tally.unanswered = true;
                continue;
            };
            for address in &selection.addresses {
                let Ok(address) = address.trim().parse::<IpAddr>() else {
                    tally.rejected += 1;
                    continue;
                };
                if !seen.insert(address) {
                    continue;
                }
                let views = views_of(&routes, address);
                if views.is_empty() {
                    tally.rejected += 1;
                    continue;
                }
                tally.selected += 1;
                sources.extend(views);
            }
        }
        if !keys.is_empty() {
            tallies.push(tally);
        }
        policies.push(gateway_api::SourcePolicy {
            name: plan.name.clone(),
            endpoints: plan.endpoints.clone(),
            sources: sources.iter().map(IpAddr::to_string).collect(),
        });
    }
    (policies, tallies)
}

/// The cluster's pod CIDRs, real → view. Its fallback and hub-only routes carry it at the
/// same views (the hub's operator gives them the views a shortcut has), so these are every
/// address its pods' packets can have here.
fn routes_of(te: &TunnelEndpointSpec) -> Vec<(IpNet, IpNet)> {
    te.remote_pod_cidrs
        .iter()
        .filter_map(|m| Some((m.real.parse().ok()?, m.view.parse().ok()?)))
        .collect()
}

/// `address` (real) in every view of a route whose real prefix holds it.
fn views_of(routes: &[(IpNet, IpNet)], address: IpAddr) -> BTreeSet<IpAddr> {
    routes
        .iter()
        .filter(|(real, _)| real.contains(&address))
        .filter_map(|(real, view)| remap(address, *real, *view))
        .collect()
}

/// `address` moved from prefix `real` to `view` (same length), keeping the host bits.
fn remap(address: IpAddr, real: IpNet, view: IpNet) -> Option<IpAddr> {
    match (address, real.network(), view.network()) {
        (IpAddr::V4(a), IpAddr::V4(r), IpAddr::V4(v)) => {
            let host = u32::from(a) - u32::from(r);
            Some(IpAddr::V4((u32::from(v) | host).into()))
        }
        (IpAddr::V6(a), IpAddr::V6(r), IpAddr::V6(v)) => {
            let host = u128::from(a) - u128::from(r);
            Some(IpAddr::V6((u128::from(v) | host).into()))
        }
        _ => None,
    }
    .filter(|_| real.prefix_len() == view.prefix_len())
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
