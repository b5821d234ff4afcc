//! What `/metrics`, `/healthz` and `/readyz` serve: the process's [`Metrics`] registry and
//! [`serve_http`].

use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use prometheus_client::registry::Registry;

use crate::operator::ha::HaMetrics;
use crate::operator::network_config::context::Context;
use crate::operator::services;

/// The metrics `/metrics` serves: registered at start, the reconcilers' once they run.
#[derive(Debug)]
pub struct Metrics {
    /// Everything registered so far.
    pub registry: Arc<RwLock<Registry>>,
    /// Leader gauge and takeover counter.
    pub ha: HaMetrics,
    /// The DNS server's counters.
    pub dns: services::dns_server::DnsMetrics,
    /// The services sync's counters.
    pub services: services::metrics::ServiceMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Self {
            registry: Arc::default(),
            ha: HaMetrics::default(),
            dns: services::dns_server::DnsMetrics::default(),
            services: services::metrics::ServiceMetrics::default(),
        };
        {
            let mut registry = metrics.registry();
            metrics.ha.register(&mut registry);
            metrics.dns.register(&mut registry);
            metrics.services.register(&mut registry);
        }
        metrics
    }
}

impl Metrics {
    /// The registry, for registering more.
    pub fn registry(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.registry
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers the NetworkConfig controller's metrics and the API server's health.
    pub fn register_controller(&self, ctx: &Context) {
        let mut registry = self.registry();
        ctx.metrics.register(&mut registry);
        ctx.health.register(&mut registry);
    }
}

/// `/metrics` (OpenMetrics text), `/healthz` (the process runs) and `/readyz` (the gateway,
/// if any, answered the last sync).
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    registry: Arc<RwLock<Registry>>,
    ctx: Arc<OnceLock<Arc<Context>>>,
) -> std::io::Result<()> {
    use axum::http::{StatusCode, header};
    use axum::routing::get;

    let metrics = move || {
        let registry = registry.clone();
        async move {
            let mut body = String::new();
            let encoded = {
                let registry = registry.read().unwrap_or_else(PoisonError::into_inner);
                prometheus_client::encoding::text::encode(&mut body, &registry)
            };
            match encoded {
                Ok(()) => (
                    StatusCode::OK,
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    body,
                ),
                Err(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    [(header::CONTENT_TYPE, "text/plain")],
                    "cannot encode metrics".to_owned(),
                ),
            }
        }
    };
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                // A standby replica (no context yet) is ready: it runs as it should.
                let ready = ctx
                    .get()
                    .is_none_or(|ctx| ctx.gateway.is_none() || ctx.gateway_status().is_some());
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "gateway unreachable")
                    }
                }
            }),
        );
    axum::serve(listener, app).await
}
