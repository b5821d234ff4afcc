//! Prometheus metrics and health endpoints, served by axum: `/metrics` (OpenMetrics text,
//! read from the device at scrape time), `/healthz` (the process runs) and `/readyz` (the
//! device has a private key and bound sockets).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::device::Device;

/// Reads the device on every scrape, so counters live only in the data path's atomics.
#[derive(Debug)]
struct DeviceCollector {
    device: Arc<Device>,
}

type PeerLabel = [(&'static str, String); 1];

fn encode_peer_counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(PeerLabel, u64)],
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (labels, value) in values {
        ConstCounter::new(*value).encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for DeviceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let report = self.device.report();
        let per_peer = |field: fn(&crate::device::PeerReport) -> u64| {
            report
                .peers
                .iter()
                .map(|p| ([("peer", p.config.display_name())], field(p)))
                .collect::<Vec<_>>()
        };
        encode_peer_counters(
            &mut encoder,
            "kubetun_peer_rx_bytes",
            "Bytes received from the peer",
            &per_peer(|p| p.rx_bytes),
        )?;
        encode_peer_counters(
            &mut encoder,
            "kubetun_peer_tx_bytes",
            "Bytes sent to the peer",
            &per_peer(|p| p.tx_bytes),
        )?;
        encode_peer_counters(
            &mut encoder,
            "kubetun_peer_rx_packets",
            "Datagrams received from the peer",
            &per_peer(|p| p.rx_packets),
        )?;
        encode_peer_counters(
            &mut encoder,
            "kubetun_peer_tx_packets",
            "Datagrams sent to the peer",
            &per_peer(|p| p.tx_packets),
        )?;
        encode_peer_counters(
            &mut encoder,
            "kubetun_handshakes",
            "Completed WireGuard handshakes",
            &per_peer(|p| p.handshakes),
        )?;

        let mut latency = encoder.encode_descriptor(
            "kubetun_peer_latency_seconds",
            "Round-trip time of the last handshake",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for peer in &report.peers {
            if let Some(us) = peer.latency_us {
                let labels: PeerLabel = [("peer", peer.config.display_name())];
                ConstGauge::new(us as f64 / 1e6).encode(latency.encode_family(&labels)?)?;
            }
        }

        let mut drops = encoder.encode_descriptor(
            "kubetun_drops",
            "Packets and datagrams dropped, by reason",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (reason, count) in &report.drops {
            let labels = [("reason", *reason)];
            ConstCounter::new(*count).encode(drops.encode_family(&labels)?)?;
        }

        let rules = encoder.encode_descriptor(
            "kubetun_remap_rules",
            "Routes in the active remap table",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(report.remap_rules as i64).encode(rules)?;

        let peers = encoder.encode_descriptor(
            "kubetun_peers",
            "Configured peers",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(report.peers.len() as i64).encode(peers)?;
        Ok(())
    }
}

/// Builds the registry: the device collector plus build information.
fn registry(device: Arc<Device>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(DeviceCollector { device }));
    let info = prometheus_client::metrics::info::Info::new([
        ("version", env!("CARGO_PKG_VERSION")),
        ("implementation", "kubetun-gateway"),
    ]);
    registry.register("kubetun_build", "Build information", info);
    registry
}

#[derive(Debug, Clone)]
struct AppState {
    device: Arc<Device>,
    registry: Arc<Registry>,
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
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
            "encoding failed".to_owned(),
        ),
    }
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.device.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no private key or sockets\n",
        )
    }
}

/// The HTTP routes.
pub fn router(device: Arc<Device>) -> Router {
    let state = AppState {
        registry: Arc::new(registry(Arc::clone(&device))),
        device,
    };
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves the routes on `addr` until the task is cancelled.
pub async fn serve(addr: SocketAddr, device: Arc<Device>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "metrics listening");
    axum::serve(listener, router(device)).await
}
