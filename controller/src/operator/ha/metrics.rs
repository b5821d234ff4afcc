//! The election's metrics (`kubetun_controller_gateway_*`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Cheap to clone: the clones count into the same metrics.
#[derive(Debug, Clone, Default)]
pub struct HaMetrics {
    leader: Gauge,
    takeovers: Counter,
}

impl HaMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("kubetun_controller");
        sub.register(
            "gateway_leader",
            "1 while this replica holds the gateway lease (its gateway carries the traffic)",
            self.leader.clone(),
        );
        sub.register(
            "gateway_takeovers",
            "How often this replica acquired the gateway lease (failovers to it)",
            self.takeovers.clone(),
        );
    }

    pub fn set_leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn promoted(&self) {
        self.takeovers.inc();
    }
}
