//! Pure: the ServiceImport of one Service from every cluster's offer of it, with the conflicts
//! KEP-1645 names. The oldest export (then the smaller cluster id) wins every property that
//! must agree; ports are the union, a port defined differently by two clusters is taken from
//! the older one. A cluster whose type (ClusterSetIP vs Headless) differs from the winner's
//! contributes no ports and no endpoints: its endpoints would be served with the wrong
//! semantics. A conflict is a property of the set, not of one export: every constituent
//! export reports it (the KEP asks for the conflicting one and recommends all; the MCS
//! conformance suite checks all), the winner included.

use std::collections::{BTreeMap, BTreeSet};

use kubetun_crds::ExportedServiceSpec;
use kubetun_crds::mcs::{ServiceImportType, ServicePort, SessionAffinityConfig};

/// What two clusters disagree on, as the `Conflict` condition's reason names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConflictKind {
    /// ClusterSetIP vs Headless.
    Type,
    /// Port sets that are not identical, or a port of the same name with a different
    /// number, protocol or application protocol.
    Port,
    /// `None` vs `ClientIP`.
    SessionAffinity,
    /// Different ClientIP timeouts.
    SessionAffinityConfig,
    /// `Cluster` vs `Local`.
    InternalTrafficPolicy,
    /// Different `trafficDistribution`s.
    TrafficDistribution,
    /// Different `exportedLabels`.
    Labels,
    /// Different `exportedAnnotations`.
    Annotations,
}

impl ConflictKind {
    /// The condition reason (`TypeConflict`, …), as the MCS API names it.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Type => "TypeConflict",
            Self::Port => "PortConflict",
            Self::SessionAffinity => "SessionAffinityConflict",
            Self::SessionAffinityConfig => "SessionAffinityConfigConflict",
            Self::InternalTrafficPolicy => "InternalTrafficPolicyConflict",
            Self::TrafficDistribution => "TrafficDistributionConflict",
            Self::Labels => "LabelsConflict",
            Self::Annotations => "AnnotationsConflict",
        }
    }
}

/// A disagreement between one export and the export that won.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Conflict {
    /// What differs.
    pub kind: ConflictKind,
    /// In words: what each side has and what was taken from which cluster.
    pub message: String,
}

/// The import of one Service, merged from its offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    /// ClusterSetIP or Headless (the winner's).
    pub type_: ServiceImportType,
    /// The union of the ports, sorted by name then number.
    pub ports: Vec<ServicePort>,
    /// The winner's affinity.
    pub session_affinity: Option<String>,
    /// The winner's affinity settings.
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// The winner's internal traffic policy.
    pub internal_traffic_policy: Option<String>,
    /// The winner's traffic distribution.
    pub traffic_distribution: Option<String>,
    /// The union of the IP families of the clusters that agree on the type.
    pub ip_families: Vec<String>,
    /// Every exporting cluster id, sorted.
    pub clusters: Vec<String>,
    /// The clusters whose endpoints the import serves (those that agree on the type).
    pub serving: Vec<String>,
    /// The set's conflicts, sorted by kind (empty: none); every exporting cluster reports
    /// them.
    pub conflicts: Vec<Conflict>,
    /// The winning cluster.
    pub winner: String,
}

impl Merged {
    /// The `Conflict` condition's reason: the kinds, comma-separated as the MCS API
    /// allows (`None`: no conflict).
    pub fn conflict_reason(&self) -> Option<String> {
        let kinds: BTreeSet<ConflictKind> = self.conflicts.iter().map(|c| c.kind).collect();
        (!kinds.is_empty()).then(|| {
            kinds
                .iter()
                .map(|k| k.reason())
                .collect::<Vec<_>>()
                .join(",")
        })
    }
}

/// Merges the offers of one Service (any order; empty gives `None`).
pub fn merge(offers: &[&ExportedServiceSpec]) -> Option<Merged> {
    let mut ordered: Vec<&ExportedServiceSpec> = offers.to_vec();
    ordered.sort_by(|a, b| {
        (a.export_created.0, &a.cluster.id).cmp(&(b.export_created.0, &b.cluster.id))
    });
    let winner = *ordered.first()?;
    let w = &winner.cluster.id;
    let mut merged = Merged {
        type_: winner.type_,
        ports: Vec::new(),
        session_affinity: winner.session_affinity.clone(),
        // Only ClientIP affinity has settings, and only valid ones are kept (the API server
        // would refuse a derived Service with others): a broken offer gets the default.
        session_affinity_config: winner
            .session_affinity_config
            .clone()
            .filter(|_| affinity(winner) == "ClientIP")
            .filter(|_| (1..=86_400).contains(&timeout(winner))),
        internal_traffic_policy: winner.internal_traffic_policy.clone(),
        traffic_distribution: winner.traffic_distribution.clone(),
        ip_families: Vec::new(),
        clusters: ordered.iter().map(|o| o.cluster.id.clone()).collect(),
        serving: Vec::new(),
        conflicts: Vec::new(),
        winner: w.clone(),
    };
    merged.clusters.sort();
    merged.clusters.dedup();
    let mut conflict = |kind, message| merged.conflicts.push(Conflict { kind, message });
    // Ports by name; the first (oldest) definition of a name stays.
    let mut ports: BTreeMap<String, (ServicePort, String)> = BTreeMap::new();
    let mut serving = Vec::new();
    for offer in &ordered {
        let id = &offer.cluster.id;
        if offer.type_ != winner.type_ {
            conflict(
                ConflictKind::Type,
                format!(
                    "{id} exports it as {}, {w} (the oldest export) as {}: {id}'s endpoints are \
                     not imported",
                    offer.type_, winner.type_
                ),
            );
            continue;
        }
        serving.push(*offer);
        if affinity(offer) != affinity(winner) {
            conflict(
                ConflictKind::SessionAffinity,
                format!(
                    "{id} has session affinity {}, {w} (the oldest export) {}, which is used",
                    affinity(offer),
                    affinity(winner)
                ),
            );
        } else if timeout(offer) != timeout(winner) {
            conflict(
                ConflictKind::SessionAffinityConfig,
                format!(
                    "{id} keeps ClientIP affinity for {}s, {w} (the oldest export) for {}s, \
                     which is used",
                    timeout(offer),
                    timeout(winner)
                ),
            );
        }
        if traffic_policy(offer) != traffic_policy(winner) {
            conflict(
                ConflictKind::InternalTrafficPolicy,
                format!(
                    "{id} has internal traffic policy {}, {w} (the oldest export) {}, which is \
                     used",
                    traffic_policy(offer),
                    traffic_policy(winner)
                ),
            );
        }
        if offer.traffic_distribution != winner.traffic_distribution {
            conflict(
                ConflictKind::TrafficDistribution,
                format!(
                    "{id} has traffic distribution {}, {w} (the oldest export) {}, which is used",
                    offer.traffic_distribution.as_deref().unwrap_or("(none)"),
                    winner.traffic_distribution.as_deref().unwrap_or("(none)")
                ),
            );
        }
        for (kind, what, mine, kept) in [
            (
                ConflictKind::Labels,
                "labels",
                &offer.labels,
                &winner.labels,
            ),
            (
                ConflictKind::Annotations,
                "annotations",
                &offer.annotations,
                &winner.annotations,
            ),
        ] {
            if mine != kept {
                conflict(
                    kind,
                    format!(
                        "{id} exports the {what} {}, {w} (the oldest export) {}, which are used",
                        pairs(mine),
                        pairs(kept)
                    ),
                );
            }
        }
        let mut redefined = false;
        for port in &offer.ports {
            let key = port.name.clone().unwrap_or_default();
            match ports.get(&key) {
                None => {
                    ports.insert(key, (port.clone(), id.clone()));
                }
                // Kubernetes keeps a Service's port names unique; a repeat within one offer
                // (only a broken or hostile exporter sends one) is ignored.
                Some((kept, from)) if kept != port && from != id => {
                    redefined = true;
                    conflict(
                        ConflictKind::Port,
                        format!(
                            "port {key:?} is {} in {id} and {} in {from} (older), which is used",
                            describe(port),
                            describe(kept)
                        ),
                    );
                }
                Some(_) => {}
            }
        }
        if !redefined && port_set(offer) != port_set(winner) {
            conflict(
                ConflictKind::Port,
                format!(
                    "{id} exports the ports {}, {w} (the oldest export) {}: the import has the \
                     union",
                    port_list(offer),
                    port_list(winner)
                ),
            );
        }
    }
    for offer in &serving {
        for family in &offer.ip_families {
            if !merged.ip_families.contains(family) {
                merged.ip_families.push(family.clone());
            }
        }
    }
    merged.serving = serving.iter().map(|o| o.cluster.id.clone()).collect();
    merged.ip_families.sort();
    merged.serving.sort();
    merged.conflicts.sort();
    merged.conflicts.dedup();
    merged.ports = ports.into_values().map(|(port, _)| port).collect();
    merged
        .ports
        .sort_by(|a, b| (&a.name, a.port).cmp(&(&b.name, b.port)));
    Some(merged)
}

fn affinity(offer: &ExportedServiceSpec) -> &str {
    offer.session_affinity.as_deref().unwrap_or("None")
}

/// The ClientIP timeout, Kubernetes' default when not set.
fn timeout(offer: &ExportedServiceSpec) -> i32 {
    offer
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds)
        .unwrap_or(10_800)
}

/// The internal traffic policy, the API server's default when not set.
fn traffic_policy(offer: &ExportedServiceSpec) -> &str {
    offer
        .internal_traffic_policy
        .as_deref()
        .unwrap_or("Cluster")
}

fn port_set(offer: &ExportedServiceSpec) -> BTreeSet<&ServicePort> {
    offer.ports.iter().collect()
}

fn port_list(offer: &ExportedServiceSpec) -> String {
    let ports: Vec<String> = port_set(offer)
        .into_iter()
        .map(|p| match &p.name {
            Some(name) => format!("{name} {}", describe(p)),
            None => describe(p),
        })
        .collect();
    if ports.is_empty() {
        "(none)".to_owned()
    } else {
        ports.join(", ")
    }
}

fn pairs(map: &BTreeMap<String, String>) -> String {
    if map.is_empty() {
        return "(none)".to_owned();
    }
    map.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe(port: &ServicePort) -> String {
    match &port.app_protocol {
        Some(app) => format!("{}/{} ({app})", port.port, port.protocol),
        None => format!("{}/{}", port.port, port.protocol),
    }
}

#[cfg(test)]
mod tests;
