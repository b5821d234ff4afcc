//! Metrics of services across clusters (`kubetun_controller_service_*`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// What the services loop reports.
#[derive(Clone, Debug)]
pub struct ServiceMetrics {
    /// Valid ServiceExports of this cluster (offered to its links).
    pub exports: Gauge,
    /// ServiceImports kubetun holds here.
    pub imports: Gauge,
    /// Endpoints in the imported EndpointSlices.
    pub imported_endpoints: Gauge,
    /// Linked clusters whose exports are followed (a credential and a link).
    pub peers: Gauge,
    /// Endpoint addresses not imported because they lie outside their exporter's CIDRs.
    pub dropped_endpoints: Counter,
    /// Seconds one pass took, from the change that woke it to its last write.
    pub pass_seconds: Histogram,
    /// Passes that failed (retried every second).
    pub pass_failures: Counter,
}

impl Default for ServiceMetrics {
    fn default() -> Self {
        Self {
            exports: Gauge::default(),
            imports: Gauge::default(),
            imported_endpoints: Gauge::default(),
            peers: Gauge::default(),
            dropped_endpoints: Counter::default(),
            pass_seconds: Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
            pass_failures: Counter::default(),
        }
    }
}

impl ServiceMetrics {
    /// Registers every metric under `kubetun_controller_service`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("kubetun_controller_service");
        sub.register(
            "exports",
            "Valid ServiceExports of this cluster",
            self.exports.clone(),
        );
        sub.register(
            "imports",
            "ServiceImports kubetun holds here",
            self.imports.clone(),
        );
        sub.register(
            "imported_endpoints",
            "Endpoints in the imported EndpointSlices",
            self.imported_endpoints.clone(),
        );
        sub.register(
            "peers",
            "Linked clusters whose exports are followed",
            self.peers.clone(),
        );
        sub.register(
            "dropped_endpoints",
            "Endpoint addresses not imported: outside their exporter's CIDRs",
            self.dropped_endpoints.clone(),
        );
        sub.register(
            "pass_seconds",
            "Duration of one pass of the services loop (change to last write)",
            self.pass_seconds.clone(),
        );
        sub.register(
            "pass_failures",
            "Passes of the services loop that failed",
            self.pass_failures.clone(),
        );
    }
}
