//! `kubetun-scale`: how far one gateway and one hub controller go.
//!
//! - `kubetun-scale gateway --peers 1000`: one `kubetun-gateway` in a network namespace with
//!   that many simulated WireGuard peers (apply time, handshakes, RSS, one busy peer's
//!   throughput among idle ones against the same peer alone). Needs root.
//! - `kubetun-scale hub --remotes 500`: one hub `kubetun-controller` on a real API server
//!   with that many remote clusters linked (convergence time, RSS, API requests, latency of
//!   one remote's change). Needs etcd and kube-apiserver (`KUBEBUILDER_ASSETS`).
//!
//! - `kubetun-scale services --clusters 50 --services 20`: one hub `kubetun-controller`
//!   importing that many exported Services (convergence, RSS, API requests per Service, one
//!   endpoint change). Needs etcd and kube-apiserver.
//!
//! Prints the figures with the budgets; `--json FILE` writes them as JSON too; the exit code
//! is 1 when a budget is missed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kubetun_benches::scale::gateway::{self, GatewayScaleConfig, GatewayScaleReport};
use kubetun_benches::scale::hub::{self, HubScaleConfig, HubScaleReport};
use kubetun_benches::scale::services::{self, ServicesScaleConfig, ServicesScaleReport};

#[derive(Debug, Parser)]
#[command(
    name = "kubetun-scale",
    version,
    about = "gateway and hub scale benches"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
    /// Also write the figures as JSON to this file.
    #[arg(long, global = true)]
    json: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One gateway, many simulated WireGuard peers (root).
    Gateway {
        /// Peers in the full state.
        #[arg(long, default_value_t = 1000)]
        peers: usize,
        /// Seconds of each throughput measurement.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// The gateway executable (default: next to this one).
        #[arg(long)]
        gateway: Option<PathBuf>,
        /// Rounds of (busy peer alone, busy peer among all).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Write the gateway's info-level log here (each Apply's plan and host sync times).
        #[arg(long)]
        gateway_log: Option<PathBuf>,
    },
    /// One hub controller on a real API server, many remote clusters.
    Hub {
        /// Remote clusters.
        #[arg(long, default_value_t = 500)]
        remotes: usize,
        /// The controller executable (default: next to this one).
        #[arg(long)]
        controller: Option<PathBuf>,
        /// Seconds of the steady-state window.
        #[arg(long, default_value_t = 10.0)]
        steady_seconds: f64,
        /// Remotes written at once.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Give up on convergence after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Keep the controller's log in this file.
        #[arg(long)]
        controller_log: Option<PathBuf>,
        /// The controller's log filter (`RUST_LOG`).
        #[arg(long, default_value = "warn")]
        log_level: String,
    },
    /// One hub controller importing the exported Services of many clusters.
    Services {
        /// Clusters linked to the hub.
        #[arg(long, default_value_t = 50)]
        clusters: usize,
        /// Services each cluster exports.
        #[arg(long, default_value_t = 20)]
        services: usize,
        /// Endpoints of each Service.
        #[arg(long, default_value_t = 3)]
        endpoints: usize,
        /// The controller executable (default: next to this one).
        #[arg(long)]
        controller: Option<PathBuf>,
        /// Give up on convergence after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
}

/// The budgets of the full-size runs.
mod budget {
    pub const APPLY_MS: f64 = 100.0;
    pub const HANDSHAKES_MS: f64 = 2000.0;
    pub const GATEWAY_RSS_KIB: u64 = 200 * 1024;
    pub const BUSY_RATIO: f64 = 0.9;
    pub const CONVERGE_S: f64 = 60.0;
    pub const CONTROLLER_RSS_KIB: u64 = 512 * 1024;
    pub const CHANGE_MS: f64 = 1000.0;
    pub const SERVICES_CONVERGE_S: f64 = 60.0;
    pub const SERVICES_RSS_KIB: u64 = 256 * 1024;
    pub const SERVICE_CHANGE_MS: f64 = 2000.0;
}

fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

fn check(ok: bool) -> &'static str {
    if ok { "ok" } else { "MISSED" }
}

fn list(values: &[f64], unit: &str) -> String {
    let items: Vec<String> = values.iter().map(|v| format!("{v:.0}")).collect();
    format!("{} {unit}", items.join(", "))
}

fn print_gateway(r: &GatewayScaleReport) -> bool {
    let worst = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let handshakes: Vec<f64> = r
        .all_handshakes_ms
        .iter()
        .map(|h| h.unwrap_or(f64::INFINITY))
        .collect();
    let apply_ok = worst(&r.apply_all_peers_ms) <= budget::APPLY_MS;
    let hs_ok = worst(&handshakes) <= budget::HANDSHAKES_MS;
    let rss_ok = r.rss_peak_kib <= budget::GATEWAY_RSS_KIB;
    let ratio_ok = r.busy_ratio >= budget::BUSY_RATIO;
    println!(
        "| gateway, {} peers, {} rounds | measured (per round) | budget |",
        r.peers, r.rounds
    );
    println!("|---|---|---|");
    println!(
        "| Apply, busy peer only | {} | |",
        list(&r.apply_one_peer_ms, "ms")
    );
    println!(
        "| Apply, all peers | {} | ≤ {} ms {} |",
        list(&r.apply_all_peers_ms, "ms"),
        budget::APPLY_MS,
        check(apply_ok)
    );
    println!(
        "| Apply, all peers, one endpoint changed | {:.1} ms | |",
        r.apply_one_changed_ms
    );
    println!(
        "| all handshakes after the Apply | {} (fewest done: {} of {}; {} cookie replies, {} shed) | ≤ {} ms {} |",
        list(&handshakes, "ms"),
        r.handshaken_peers,
        r.peers,
        r.under_load_drops,
        r.handshake_queue_drops,
        budget::HANDSHAKES_MS,
        check(hs_ok)
    );
    println!(
        "| gateway RSS: busy peer only / all peers / peak | {:.1} / {:.1} / {:.1} MiB | ≤ 200 MiB {} |",
        r.rss_one_peer_kib as f64 / 1024.0,
        r.rss_all_peers_kib as f64 / 1024.0,
        r.rss_peak_kib as f64 / 1024.0,
        check(rss_ok)
    );
    println!(
        "| busy peer alone | {} | |",
        list(&r.busy_alone_mbps, "Mbit/s")
    );
    println!(
        "| busy peer with {} idle peers | {} (median ratio {:.2}) | ≥ {} × {} |",
        r.peers - 1,
        list(&r.busy_with_idle_mbps, "Mbit/s"),
        r.busy_ratio,
        budget::BUSY_RATIO,
        check(ratio_ok)
    );
    apply_ok && hs_ok && rss_ok && ratio_ok
}

fn print_hub(r: &HubScaleReport) -> bool {
    let converge_ok = r.converged_s <= budget::CONVERGE_S;
    let rss_ok = r.controller_peak_kib <= budget::CONTROLLER_RSS_KIB;
    let change_ok = r.change_to_gateway_ms <= budget::CHANGE_MS;
    println!(
        "| hub, {} remotes ({} overlapping) | measured | budget |",
        r.remotes, r.overlapping_remotes
    );
    println!("|---|---|---|");
    println!(
        "| converged (bench's writes took {:.1} s) | {:.1} s | ≤ {} s {} |",
        r.writes_s,
        r.converged_s,
        budget::CONVERGE_S,
        check(converge_ok)
    );
    println!("| views remapped by the IPAM | {} | |", r.remapped_views);
    println!(
        "| gateway Applies during convergence | {} | |",
        r.gateway_applies
    );
    println!(
        "| controller RSS after / peak | {:.1} / {:.1} MiB | ≤ 512 MiB {} |",
        r.controller_rss_kib as f64 / 1024.0,
        r.controller_peak_kib as f64 / 1024.0,
        check(rss_ok)
    );
    println!(
        "| API requests of the convergence (controller) | {} ({:.1} per remote; bench's own {} left out) | |",
        r.controller_requests, r.requests_per_remote, r.bench_requests
    );
    println!(
        "| API requests/s while steady | {:.1} | |",
        r.steady_requests_per_s
    );
    println!(
        "| one remote's endpoint changed → gateway runs it | {:.0} ms (TunnelEndpoint: {:.0} ms) | ≤ {} ms {} |",
        r.change_to_gateway_ms,
        r.change_to_tunnel_endpoint_ms,
        budget::CHANGE_MS,
        check(change_ok)
    );
    println!();
    println!("requests of the convergence by kind (bench's included):");
    for (kind, count) in &r.requests_by_kind {
        println!("  {kind}: {count}");
    }
    println!("requests while steady by kind:");
    for (kind, count) in &r.steady_by_kind {
        println!("  {kind}: {count}");
    }
    converge_ok && rss_ok && change_ok
}

fn print_services(r: &ServicesScaleReport) -> bool {
    let converge_ok = r.converged_s <= budget::SERVICES_CONVERGE_S;
    let rss_ok = r.controller_peak_kib <= budget::SERVICES_RSS_KIB;
    let change_ok = r.change_ms <= budget::SERVICE_CHANGE_MS;
    println!(
        "| hub importing {} Services ({} endpoints each) of {} clusters | measured | budget |",
        r.services, r.endpoints, r.clusters
    );
    println!("|---|---|---|");
    println!("| links connected | {:.1} s | |", r.linked_s);
    println!(
        "| credentials written → every Service imported (ClusterSetIP, slices) | {:.1} s | ≤ {} s {} |",
        r.converged_s,
        budget::SERVICES_CONVERGE_S,
        check(converge_ok)
    );
    println!(
        "| controller RSS after / peak | {:.1} / {:.1} MiB | ≤ 256 MiB {} |",
        r.controller_rss_kib as f64 / 1024.0,
        r.controller_peak_kib as f64 / 1024.0,
        check(rss_ok)
    );
    println!(
        "| API requests on the hub (controller) | {} ({:.1} per Service) | |",
        r.hub_requests, r.hub_requests_per_service
    );
    println!(
        "| API requests on the exporters' server | {} | |",
        r.exporter_requests
    );
    println!(
        "| one exporter's endpoint change → the hub's slice | {:.0} ms | ≤ {} ms {} |",
        r.change_ms,
        budget::SERVICE_CHANGE_MS,
        check(change_ok)
    );
    converge_ok && rss_ok && change_ok
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    let (json, met) = match args.command {
        Command::Gateway {
            peers,
            seconds,
            gateway,
            rounds,
            gateway_log,
        } => {
            let config = GatewayScaleConfig {
                peers,
                throughput_seconds: seconds,
                gateway: gateway.unwrap_or_else(|| sibling("kubetun-gateway")),
                handshake_timeout: Duration::from_secs(30),
                rounds,
                gateway_log,
            };
            let report = gateway::run(&config).await.context("gateway scale run")?;
            let met = print_gateway(&report);
            (serde_json::to_string_pretty(&report)?, met)
        }
        Command::Hub {
            remotes,
            controller,
            steady_seconds,
            concurrency,
            timeout,
            controller_log,
            log_level,
        } => {
            let config = HubScaleConfig {
                remotes,
                controller: controller.unwrap_or_else(|| sibling("kubetun-controller")),
                repo_root: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .parent()
                    .map(PathBuf::from)
                    .unwrap_or_default(),
                converge_timeout: Duration::from_secs(timeout),
                steady_seconds,
                concurrency,
                controller_log,
                log_level,
            };
            let report = hub::run(&config).await.context("hub scale run")?;
            let met = print_hub(&report);
            (serde_json::to_string_pretty(&report)?, met)
        }
        Command::Services {
            clusters,
            services,
            endpoints,
            controller,
            timeout,
        } => {
            let config = ServicesScaleConfig {
                clusters,
                services,
                endpoints,
                controller: controller.unwrap_or_else(|| sibling("kubetun-controller")),
                repo_root: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .parent()
                    .map(PathBuf::from)
                    .unwrap_or_default(),
                converge_timeout: Duration::from_secs(timeout),
            };
            let report = services::run(&config).await.context("services scale run")?;
            let met = print_services(&report);
            (serde_json::to_string_pretty(&report)?, met)
        }
    };
    if let Some(path) = args.json {
        std::fs::write(&path, json).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(if met {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
