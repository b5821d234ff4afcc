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

use prometheus_client::encoding::NoLabelSet;
use prometheus_client::registry::Unit;

use crate::device::Device;
use kubetun_gateway_core::conncheck::{RTT_BUCKETS_US, RttHistogram};

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

        let probed: Vec<_> = report
            .peers
            .iter()
            .filter_map(|p| Some(([("peer", p.config.display_name())], p.conncheck.as_ref()?)))
            .collect();
        let probe_counter = |field: fn(&crate::device::ConnCheckReport) -> u64| {
            probed
                .iter()
                .map(|(labels, c)| (labels.clone(), field(c)))
                .collect::<Vec<_>>()
        };
        encode_peer_counters(
            &mut encoder,
            "kubetun_peer_probes_sent",
            "Connectivity probes (PINGs) sent to the peer",
            &probe_counter(|c| c.reading.probes_sent),
        )?;
        encode_peer_counters(
            &mut encoder,
            "kubetun_peer_probes_lost",
            "Connectivity probes not answered within their interval",
            &probe_counter(|c| c.reading.probes_lost),
        )?;
        let backed_up: Vec<_> = report
            .peers
            .iter()
            .filter_map(|p| Some(([("peer", p.config.display_name())], p.path?)))
            .collect();
        encode_peer_counters(
            &mut encoder,
            "kubetun_peer_path_switches",
            "Switches of the views other peers back up for this peer, to their fallback routes and back",
            &backed_up
                .iter()
                .map(|(labels, path)| (labels.clone(), path.switches()))
                .collect::<Vec<_>>(),
        )?;
        let mut failed_over = encoder.encode_descriptor(
            "kubetun_peer_failed_over",
            "1 while the views other peers back up for this peer go through them (it is unreachable)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (labels, path) in &backed_up {
            ConstGauge::new(i64::from(path.failed_over()))
                .encode(failed_over.encode_family(labels)?)?;
        }

        let mut rtt = encoder.encode_descriptor(
            "kubetun_peer_rtt",
            "Round-trip time of connectivity probes through the tunnel",
            Some(&Unit::Seconds),
            prometheus_client::metrics::MetricType::Histogram,
        )?;
        for (labels, conncheck) in &probed {
            let histogram = &conncheck.reading.histogram;
            let buckets = rtt_buckets(histogram);
            rtt.encode_family(labels)?.encode_histogram::<NoLabelSet>(
                histogram.sum_us as f64 / 1e6,
                histogram.count(),
                &buckets,
                None,
            )?;
        }

        let mut latency = encoder.encode_descriptor(
            "kubetun_peer_latency_seconds",
            "Round-trip time: smoothed probe RTT with the connectivity check on, else the last handshake's",
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

        gauge(
            &mut encoder,
            "kubetun_remap_rules",
            "Routes in the active remap table",
            report.remap_rules,
        )?;
        gauge(
            &mut encoder,
            "kubetun_peers",
            "Configured peers",
            report.peers.len(),
        )?;
        gauge(
            &mut encoder,
            "kubetun_host_config_errors",
            "Host configuration items (MTU, addresses, routes) failing and being retried",
            report.host_errors.len(),
        )?;
        gauge(
            &mut encoder,
            "kubetun_gateway_active",
            "1 while this gateway carries traffic, 0 on standby (another replica holds the lease)",
            usize::from(report.active),
        )?;
        let promotions = encoder.encode_descriptor(
            "kubetun_gateway_promotions",
            "How often this replica became the active gateway (failovers to it)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        ConstCounter::new(report.promotions).encode(promotions)?;

        let mut admission_drops = encoder.encode_descriptor(
            "kubetun_admission_drops",
            "Packets of (or, flow_table_full, towards) a remote cluster refused by its admission, by cluster and reason",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for admission in &report.admissions {
            for (reason, count) in &admission.drops {
                let labels = [("cluster", admission.cluster.as_str()), ("reason", *reason)];
                ConstCounter::new(*count).encode(admission_drops.encode_family(&labels)?)?;
            }
        }
        let mut policy_drops = encoder.encode_descriptor(
            "kubetun_policy_drops",
            "Packets of a remote cluster refused at an exported endpoint because no policy guarding it selects their source, by cluster and policy",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for admission in &report.admissions {
            for policy in &admission.policies {
                let labels = [
                    ("cluster", admission.cluster.as_str()),
                    ("policy", policy.name.as_str()),
                ];
                ConstCounter::new(policy.drops).encode(policy_drops.encode_family(&labels)?)?;
            }
        }
        gauge(
            &mut encoder,
            "kubetun_flow_table_capacity",
            "Slots of the flow table (connections opened towards remote clusters)",
            report.flow_table.capacity,
        )?;
        gauge(
            &mut encoder,
            "kubetun_flow_table_in_use",
            "Slots of the flow table holding a live flow",
            report.flow_table.in_use,
        )?;
        let full = encoder.encode_descriptor(
            "kubetun_flow_table_full",
            "New outbound flows that found the flow table full (dropped towards an exported cluster, sent unrecorded towards an open one)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        ConstCounter::new(report.flow_table.full).encode(full)?;
        Ok(())
    }
}

/// One unlabelled gauge.
fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: usize,
) -> Result<(), std::fmt::Error> {
    let metric = encoder.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(metric)
}

/// `(upper bound in seconds, count)` per bucket, not cumulative (the encoder sums them up),
/// the overflow bucket last with an infinite bound.
fn rtt_buckets(histogram: &RttHistogram) -> Vec<(f64, u64)> {
    RTT_BUCKETS_US
        .iter()
        .map(|us| *us as f64 / 1e6)
        .chain(std::iter::once(f64::INFINITY))
        .zip(histogram.counts.iter().copied())
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_buckets_span_50us_to_1s_plus_overflow() {
        let mut histogram = RttHistogram::default();
        for us in [40, 50, 51, 900, 2_000_000] {
            histogram.observe(us);
        }
        let buckets = rtt_buckets(&histogram);
        assert_eq!(buckets.len(), RTT_BUCKETS_US.len() + 1);
        assert_eq!(buckets[0], (0.000_05, 2), "40 and 50 µs");
        assert_eq!(buckets[1], (0.000_1, 1), "51 µs");
        assert_eq!(buckets[4], (0.001, 1), "900 µs");
        assert_eq!(buckets[13], (1.0, 0));
        assert_eq!(buckets[14], (f64::INFINITY, 1), "2 s overflows");
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), histogram.count());
    }
}
