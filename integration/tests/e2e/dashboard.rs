//! `deploy/grafana/kubetun-dashboard.json` against the metrics the code exports: every
//! `kubetun_*` name in a panel's query is a series the gateway or the controller really
//! exposes, and every metric family they export has a panel. The controller's registry is
//! encoded in-process; the gateway's `/metrics` is scraped from a real `kubetun-gateway` in a
//! network namespace of its own (root; under CI=true a missing precondition fails).

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use kubetun_integration::netns::{Netns, bin_path, require_root, run_in, wait_for_path};
use serde_json::Value;

/// `(panel title, query)` of every target in the dashboard (rows' nested panels included).
fn queries() -> Vec<(String, String)> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/kubetun-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(dashboard["uid"].is_string() && dashboard["title"].is_string());
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(panel) = stack.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            stack.extend(nested);
        }
        let title = panel["title"].as_str().unwrap_or_default().to_owned();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("every target has an expr");
            out.push((title.clone(), expr.to_owned()));
        }
    }
    assert!(out.len() > 10, "too few queries: {out:?}");
    out
}

/// The `kubetun_*` identifiers of a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("kubetun_") {
        let start = i + at;
        let preceded =
            start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = expr[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(expr.len(), |n| start + n);
        if !preceded {
            names.push(expr[start..end].to_owned());
        }
        i = end;
    }
    names
}

/// Families (`# TYPE` lines) and the series names they expose in OpenMetrics text.
fn exposed(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut families = BTreeSet::new();
    let mut series = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            families.insert(name.to_owned());
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "info" => &["_info"],
                "summary" => &["_sum", "_count", ""],
                _ => &[""],
            };
            for suffix in suffixes {
                series.insert(format!("{name}{suffix}"));
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            series.insert(line[..end].to_owned());
        }
    }
    (families, series)
}

fn controller_exposition() -> String {
    let metrics = kubetun_controller::operator::network_config::context::Metrics::default();
    // Families with a series each, so the names are exposed whatever the encoder does with
    // empty families.
    metrics.reconciled("networkconfig");
    metrics
        .failures
        .get_or_create(
            &kubetun_controller::operator::network_config::context::FailureLabels {
                controller: "networkconfig",
                error: "api",
            },
        )
        .inc();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let replicas = kubetun_controller::operator::ha::HaMetrics::default();
    replicas.set_leading(true);
    replicas.promoted();
    replicas.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    text
}

/// Checks the queries whose names satisfy `owned` against `series`, and that every family
/// in `families` is queried somewhere.
fn check(
    what: &str,
    owned: impl Fn(&str) -> bool,
    families: &BTreeSet<String>,
    series: &BTreeSet<String>,
) {
    let queries = queries();
    let mut used = BTreeSet::new();
    let mut unknown = Vec::new();
    for (title, expr) in &queries {
        for name in metric_names(expr).into_iter().filter(|n| owned(n)) {
            if !series.contains(&name) {
                unknown.push(format!("{name} (panel {title:?})"));
            }
            used.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "the dashboard queries series the {what} does not export: {unknown:?}\nexported: {series:?}"
    );
    let unused: Vec<&String> = families
        .iter()
        .filter(|family| !used.iter().any(|name| name.starts_with(family.as_str())))
        .collect();
    assert!(
        unused.is_empty(),
        "{what} metrics without a panel in the dashboard: {unused:?}"
    );
}

#[test]
fn metric_names_are_found_in_queries() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    assert_eq!(
        metric_names(
            "sum by (peer) (rate(kubetun_peer_rx_bytes_total{job=~\"x\"}[5m])) / kubetun_peers"
        ),
        ["kubetun_peer_rx_bytes_total", "kubetun_peers"]
    );
    assert!(metric_names("rate(not_kubetun_x[1m])").is_empty());
    let (families, series) = exposed(
        "# TYPE kubetun_drops counter\nkubetun_drops_total{reason=\"acl\"} 1\n\
         # TYPE kubetun_peer_rtt_seconds histogram\n# TYPE kubetun_build info\n",
    );
    assert_eq!(families.len(), 3);
    for name in [
        "kubetun_drops_total",
        "kubetun_peer_rtt_seconds_bucket",
        "kubetun_peer_rtt_seconds_count",
        "kubetun_build_info",
    ] {
        assert!(series.contains(name), "{name}: {series:?}");
    }
}

#[test]
fn controller_panels_query_exported_metrics() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    let (families, series) = exposed(&controller_exposition());
    assert!(
        families.contains("kubetun_controller_reconciliations"),
        "{families:?}"
    );
    check(
        "controller",
        |name| name.starts_with("kubetun_controller_"),
        &families,
        &series,
    );
}

#[test]
fn gateway_panels_query_exported_metrics() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !require_root("gateway_panels_query_exported_metrics") {
        return;
    }
    let ns = Netns::new("kt-dash").expect("namespace");
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("ktdash0.grpc.sock");
    let gateway = bin_path("kubetun-gateway");
    let _process = ns
        .spawn(&[
            gateway.to_str().expect("utf-8 path"),
            "-f",
            "--grpc-socket",
            socket.to_str().expect("utf-8 path"),
            "--metrics-addr",
            "127.0.0.1:9586",
            "ktdash0",
        ])
        .expect("start the gateway");
    assert!(
        wait_for_path(&socket, Duration::from_secs(10)),
        "the gateway did not come up"
    );
    let text = run_in(&ns, || -> std::io::Result<String> {
        let mut stream = TcpStream::connect("127.0.0.1:9586")?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut body = String::new();
        stream.read_to_string(&mut body)?;
        Ok(body)
    })
    .expect("enter the namespace")
    .expect("scrape /metrics");
    let (families, series) = exposed(&text);
    assert!(families.contains("kubetun_peers"), "{text}");
    check(
        "gateway",
        |name| !name.starts_with("kubetun_controller_"),
        &families,
        &series,
    );
}
