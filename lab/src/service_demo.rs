//! The Service a lab topology exports across clusters (`service:` in its YAML): served by the
//! first external endpoint of each exporting cluster, fetched by name from a pod of the
//! client cluster.

use serde::{Deserialize, Serialize};

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

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
