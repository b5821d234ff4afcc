//! The Service a lab topology exports across clusters (`service:` in its YAML): served by the
//! first external endpoint of each exporting cluster, fetched by name from a pod of the
//! client cluster.

use serde::{Deserialize, Serialize};

use crate::topology::Topology;

/// The Service port clients call.
pub const SERVICE_PORT: u16 = 80;
/// The port the backends listen on (the Service's target port).
pub const TARGET_PORT: u16 = 8080;

/// A Service exported by some clusters and fetched by name from another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceDemo {
    /// The Service's name.
    #[serde(default = "default_name")]
    pub name: String,
    /// The Service's namespace, created in every cluster (an import needs it: namespace
    /// sameness).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The clusters whose first external endpoint serves it (HTTP on [`TARGET_PORT`]).
    pub exporters: Vec<String>,
    /// The single-node cluster whose first pod fetches it by its `clusterset.local` name.
    pub client: String,
}

fn default_name() -> String {
    "web".to_owned()
}

fn default_namespace() -> String {
    "demo".to_owned()
}

impl ServiceDemo {
    /// `<name>.<namespace>.svc.clusterset.local`.
    pub fn host(&self) -> String {
        format!("{}.{}.svc.clusterset.local", self.name, self.namespace)
    }

    /// Checks the demo against `topology`; the error says what is wrong.
    pub fn validate(&self, topology: &Topology) -> Result<(), String> {
        for (what, value) in [("name", &self.name), ("namespace", &self.namespace)] {
            if !is_dns_label(value) {
                return Err(format!(
                    "{what} {value:?} is not a DNS label (lowercase letters, digits and '-', at \
                     most 63 characters)"
                ));
            }
        }
        let client = topology
            .cluster(&self.client)
            .ok_or_else(|| format!("client {:?} is not a cluster", self.client))?;
        if client.pods == 0 || client.is_multi_node() {
            return Err(format!(
                "client {} must be a single-node cluster with a pod",
                client.name
            ));
        }
        if self.exporters.is_empty() {
            return Err("no exporters".to_owned());
        }
        for (index, name) in self.exporters.iter().enumerate() {
            let exporter = topology
                .cluster(name)
                .ok_or_else(|| format!("exporter {name:?} is not a cluster"))?;
            if exporter.external_cidr.is_none() || exporter.externals == 0 {
                return Err(format!(
                    "exporter {name} has no external endpoint to serve the Service"
                ));
            }
            if exporter.id() == client.id() {
                return Err(format!("{name} is both exporter and client"));
            }
            if self.exporters[..index]
                .iter()
                .any(|other| other.eq_ignore_ascii_case(name))
            {
                return Err(format!("exporter {name} is listed twice"));
            }
            let linked = topology.all_links().any(|(_, link)| {
                let ends = [&link.0, &link.1];
                ends.iter().any(|e| e.eq_ignore_ascii_case(name))
                    && ends.iter().any(|e| e.eq_ignore_ascii_case(&self.client))
            });
            if !linked {
                return Err(format!(
                    "exporter {name} is not linked to the client {} (link, shortcut or hub-only)",
                    client.name
                ));
            }
        }
        Ok(())
    }
}

fn is_dns_label(value: &str) -> bool {
    (1..=63).contains(&value.len())
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !value.starts_with('-')
        && !value.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_demo_is_valid_and_bad_demos_say_why() {
        let seed = Topology::seed();
        let demo = seed.service.clone().expect("the seed exports a Service");
        assert_eq!(demo.host(), "web.demo.svc.clusterset.local");
        let cases = [
            (
                ServiceDemo {
                    client: "Lisbon".into(),
                    ..demo.clone()
                },
                "is not a cluster",
            ),
            (
                ServiceDemo {
                    exporters: vec![],
                    ..demo.clone()
                },
                "no exporters",
            ),
            (
                ServiceDemo {
                    exporters: vec!["Rome".into()],
                    ..demo.clone()
                },
                "both exporter",
            ),
            (
                ServiceDemo {
                    exporters: vec!["Milan".into(), "milan".into()],
                    ..demo.clone()
                },
                "listed twice",
            ),
            (
                ServiceDemo {
                    name: "Web".into(),
                    ..demo.clone()
                },
                "not a DNS label",
            ),
        ];
        for (bad, expected) in cases {
            let mut topology = seed.clone();
            topology.service = Some(bad);
            let message = topology.validate().unwrap_err().to_string();
            assert!(message.contains(expected), "{message}");
        }
    }
}
