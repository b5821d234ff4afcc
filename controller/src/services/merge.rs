//! Pure: the ServiceImport of one Service from every cluster's offer of it, with the conflicts
//! KEP-1645 names. The oldest export (then the smaller cluster id) wins every property that
//! must agree; ports are the union, a port defined differently by two clusters is taken from
//! the older one. A cluster whose type (ClusterSetIP vs Headless) differs from the winner's
//! contributes no ports and no endpoints: its endpoints would be served with the wrong
//! semantics.

use std::collections::BTreeMap;

use kubetun_crds::ExportedServiceSpec;
use kubetun_crds::mcs::{ServiceImportType, ServicePort, SessionAffinityConfig};

/// What two clusters disagree on, as the `Conflict` condition's reason names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConflictKind {
    /// ClusterSetIP vs Headless.
    Type,
    /// A port of the same name with a different number, protocol or application protocol.
    Port,
    /// `None` vs `ClientIP`.
    SessionAffinity,
    /// Different ClientIP timeouts.
    SessionAffinityConfig,
}

impl ConflictKind {
    /// The condition reason (`TypeConflict`, …).
    pub fn reason(self) -> &'static str {
        match self {
            Self::Type => "TypeConflict",
            Self::Port => "PortConflict",
            Self::SessionAffinity => "SessionAffinityConflict",
            Self::SessionAffinityConfig => "SessionAffinityConfigConflict",
        }
    }
}

/// One cluster's conflict with the export that won.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// What differs.
    pub kind: ConflictKind,
    /// In words: what this cluster has, what was taken and from which cluster.
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
    /// The union of the IP families of the clusters that agree on the type.
    pub ip_families: Vec<String>,
    /// Every exporting cluster id, sorted.
    pub clusters: Vec<String>,
    /// The clusters whose endpoints the import serves (those that agree on the type).
    pub serving: Vec<String>,
    /// Each cluster's conflicts with the winner (absent: none).
    pub conflicts: BTreeMap<String, Vec<Conflict>>,
    /// The winning cluster.
    pub winner: String,
}

/// Merges the offers of one Service (any order; empty gives `None`).
pub fn merge(offers: &[&ExportedServiceSpec]) -> Option<Merged> {
    let mut ordered: Vec<&ExportedServiceSpec> = offers.to_vec();
    ordered.sort_by(|a, b| {
        (a.export_created.0, &a.cluster.id).cmp(&(b.export_created.0, &b.cluster.id))
    });
    let winner = *ordered.first()?;
    let mut merged = Merged {
        type_: winner.type_,
        ports: Vec::new(),
        session_affinity: winner.session_affinity.clone(),
        session_affinity_config: winner.session_affinity_config.clone(),
        ip_families: Vec::new(),
        clusters: ordered.iter().map(|o| o.cluster.id.clone()).collect(),
        serving: Vec::new(),
        conflicts: BTreeMap::new(),
        winner: winner.cluster.id.clone(),
    };
    merged.clusters.sort();
    merged.clusters.dedup();
    // Ports by name; the first (oldest) definition of a name stays.
    let mut ports: BTreeMap<String, (ServicePort, String)> = BTreeMap::new();
    for offer in &ordered {
        let id = &offer.cluster.id;
        let mut conflicts = Vec::new();
        if offer.type_ != winner.type_ {
            conflicts.push(Conflict {
                kind: ConflictKind::Type,
                message: format!(
                    "{id} exports it as {}, {} (the oldest export) as {}: {id}'s endpoints are \
                     not imported",
                    offer.type_, winner.cluster.id, winner.type_
                ),
            });
            merged.conflicts.insert(id.clone(), conflicts);
            continue;
        }
        merged.serving.push(id.clone());
        for family in &offer.ip_families {
            if !merged.ip_families.contains(family) {
                merged.ip_families.push(family.clone());
            }
        }
        if affinity(offer) != affinity(winner) {
            conflicts.push(Conflict {
                kind: ConflictKind::SessionAffinity,
                message: format!(
                    "{id} has session affinity {}, {} (the oldest export) {}, which is used",
                    affinity(offer),
                    winner.cluster.id,
                    affinity(winner)
                ),
            });
        } else if timeout(offer) != timeout(winner) {
            conflicts.push(Conflict {
                kind: ConflictKind::SessionAffinityConfig,
                message: format!(
                    "{id} keeps ClientIP affinity for {}s, {} (the oldest export) for {}s, \
                     which is used",
                    timeout(offer),
                    winner.cluster.id,
                    timeout(winner)
                ),
            });
        }
        for port in &offer.ports {
            let key = port.name.clone().unwrap_or_default();
            match ports.get(&key) {
                None => {
                    ports.insert(key, (port.clone(), id.clone()));
                }
                // Kubernetes keeps a Service's port names unique; a repeat within one offer
                // (only a broken or hostile exporter sends one) is ignored.
                Some((kept, from)) if kept != port && from != id => conflicts.push(Conflict {
                    kind: ConflictKind::Port,
                    message: format!(
                        "port {:?} is {} in {id} and {} in {from} (older), which is used",
                        key,
                        describe(port),
                        describe(kept)
                    ),
                }),
                Some(_) => {}
            }
        }
        if !conflicts.is_empty() {
            merged.conflicts.insert(id.clone(), conflicts);
        }
    }
    merged.ip_families.sort();
    merged.serving.sort();
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

fn describe(port: &ServicePort) -> String {
    match &port.app_protocol {
        Some(app) => format!("{}/{} ({app})", port.port, port.protocol),
        None => format!("{}/{}", port.port, port.protocol),
    }
}

#[cfg(test)]
mod tests;
